//! The few libpvm3 calls `rb-pvm-add` makes, found at run time with `dlopen`/`dlsym`.

use std::ffi::{c_char, c_int, CString};

/// PVM's status codes this program acts on or returns (`pvm3.h`).
const PVM_BAD_PARAM: i32 = -2;
pub const PVM_DUP_HOST: i32 = -28;
pub const PVM_ALREADY: i32 = -30;
/// `pvm_setopt` option: automatic error messages on stderr.
const PVM_AUTO_ERR: c_int = 3;

/// Sonames tried in order (Debian's `pvm` package ships `libpvm3.so.3`).
const LIBRARIES: [&str; 2] = ["libpvm3.so.3", "libpvm3.so"];

type NoArgs = unsafe extern "C" fn() -> c_int;
type AddHosts = unsafe extern "C" fn(*mut *mut c_char, c_int, *mut c_int) -> c_int;
type SetOpt = unsafe extern "C" fn(c_int, c_int) -> c_int;
type GetFds = unsafe extern "C" fn(*mut *mut c_int) -> c_int;
type NRecv = unsafe extern "C" fn(c_int, c_int) -> c_int;
type OneInt = unsafe extern "C" fn(c_int) -> c_int;

/// What the pvmd's connection had for an enrolled task ([`Pvm::pvmd_news`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PvmdNews {
    /// The pvmd is gone (halted, killed): libpvm's error.
    Gone,
    /// A message nobody asked for, dropped.
    Message,
    /// Nothing whole yet.
    Nothing,
}

/// libpvm3's entry points.
pub struct Pvm {
    mytid: NoArgs,
    exit: NoArgs,
    addhosts: AddHosts,
    setopt: SetOpt,
    getfds: GetFds,
    nrecv: NRecv,
    freebuf: OneInt,
    /// `pvm_errlist` and `pvm_nerr`, when the library exports them.
    errlist: Option<(*const *const c_char, usize)>,
}

impl Pvm {
    /// Loads libpvm3 (the library stays loaded until the process ends).
    pub fn load() -> Result<Pvm, String> {
        let handle = LIBRARIES
            .iter()
            .find_map(|name| {
                let name = CString::new(*name).ok()?;
                // SAFETY: a valid C string. RTLD_LAZY: libpvm3 pulls in libtirpc and the
                // Kerberos libraries, whose functions it never calls here; binding them
                // up front (RTLD_NOW) cost ~0.25 ms of the ~1.2 ms load on the test machine.
                let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY) };
                (!h.is_null()).then_some(h)
            })
            .ok_or_else(|| format!("cannot load libpvm3 ({})", LIBRARIES.join(", ")))?;
        let symbol = |name: &str| -> Result<*mut libc::c_void, String> {
            let c = CString::new(name).map_err(|e| e.to_string())?;
            // SAFETY: `handle` is a live dlopen handle and `c` a valid C string.
            let p = unsafe { libc::dlsym(handle, c.as_ptr()) };
            match p.is_null() {
                true => Err(format!("libpvm3 has no {name}")),
                false => Ok(p),
            }
        };
        // SAFETY: the symbols are libpvm3's functions with the C signatures of pvm3.h.
        unsafe {
            Ok(Pvm {
                mytid: std::mem::transmute::<*mut libc::c_void, NoArgs>(symbol("pvm_mytid")?),
                exit: std::mem::transmute::<*mut libc::c_void, NoArgs>(symbol("pvm_exit")?),
                addhosts: std::mem::transmute::<*mut libc::c_void, AddHosts>(symbol(
                    "pvm_addhosts",
                )?),
                setopt: std::mem::transmute::<*mut libc::c_void, SetOpt>(symbol("pvm_setopt")?),
                getfds: std::mem::transmute::<*mut libc::c_void, GetFds>(symbol("pvm_getfds")?),
                nrecv: std::mem::transmute::<*mut libc::c_void, NRecv>(symbol("pvm_nrecv")?),
                freebuf: std::mem::transmute::<*mut libc::c_void, OneInt>(symbol("pvm_freebuf")?),
                errlist: match (symbol("pvm_errlist"), symbol("pvm_nerr")) {
                    (Ok(list), Ok(count)) => {
                        // An array (`char *pvm_errlist[]`): the symbol is its first element.
                        let list = list as *const *const c_char;
                        let count = *(count as *const c_int);
                        usize::try_from(count).ok().map(|n| (list, n))
                    }
                    _ => None,
                },
            })
        }
    }

    /// Enrols as a task of the local pvmd; then silences libpvm's own error messages (we
    /// print one line ourselves).
    pub fn enrol(&self) -> Result<(), i32> {
        // SAFETY: pvm_mytid takes no arguments.
        let tid = unsafe { (self.mytid)() };
        if tid < 0 {
            return Err(tid);
        }
        // SAFETY: plain integers.
        unsafe { (self.setopt)(PVM_AUTO_ERR, 0) };
        Ok(())
    }

    /// `pvm_addhosts` for one host: its status (0 when added, else a Pvm* code).
    pub fn add_host(&self, host: &str) -> i32 {
        let Ok(name) = CString::new(host) else {
            return PVM_BAD_PARAM;
        };
        let mut names = [name.as_ptr().cast_mut()];
        let mut info: c_int = 0;
        // SAFETY: one valid C string (libpvm only reads it) and room for one status.
        let added = unsafe { (self.addhosts)(names.as_mut_ptr(), 1, &mut info) };
        match added {
            1 => 0,
            n if n < 0 => n,
            _ => info,
        }
    }

    /// The descriptor of this task's connection to its pvmd (`pvm_getfds`' first), once
    /// enrolled.
    pub fn pvmd_fd(&self) -> Option<c_int> {
        let mut fds: *mut c_int = std::ptr::null_mut();
        // SAFETY: libpvm stores a pointer to its own array of `n` descriptors in `fds`.
        let n = unsafe { (self.getfds)(&mut fds) };
        if n < 1 || fds.is_null() {
            return None;
        }
        // SAFETY: `n` >= 1 descriptors at `fds`.
        Some(unsafe { *fds })
    }

    /// Reads what the pvmd sent this task, when its connection is readable (a message,
    /// unasked for, is dropped).
    pub fn pvmd_news(&self) -> PvmdNews {
        // SAFETY: plain integers: any sender, any tag, without blocking.
        let buf = unsafe { (self.nrecv)(-1, -1) };
        match buf {
            b if b < 0 => PvmdNews::Gone,
            0 => PvmdNews::Nothing,
            b => {
                // SAFETY: a buffer id libpvm just returned.
                unsafe { (self.freebuf)(b) };
                PvmdNews::Message
            }
        }
    }

    /// Leaves the virtual machine (the pvmd forgets this task).
    pub fn leave(&self) {
        // SAFETY: pvm_exit takes no arguments.
        unsafe { (self.exit)() };
    }

    /// PVM's own message for a status code (`pvm_errlist[-code]`, as the console prints
    /// it), or "PVM error CODE" when it has none.
    pub fn describe(&self, code: i32) -> String {
        let index = code.checked_neg().and_then(|i| usize::try_from(i).ok());
        match (index, self.errlist) {
            (Some(i), Some((list, count))) if i < count => {
                // SAFETY: pvm_errlist holds pvm_nerr pointers to static C strings.
                let text = unsafe { *list.add(i) };
                if text.is_null() {
                    return format!("PVM error {code}");
                }
                // SAFETY: non-null, NUL-terminated, static.
                unsafe { std::ffi::CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned()
            }
            _ => format!("PVM error {code}"),
        }
    }
}
