//! Symbolic host names resolve inside module jobs.
//!
//! Debian's PVM 3.4 (`pvm> add anyLinux`, `pvm_addhosts`) and LAM/MPI 7.1 (`lamgrow anyLinux`,
//! boot schemas) call `gethostbyname` on every host name first and give up with "No such host"
//! when it fails. Here the resolver answers for symbolic names with a placeholder loopback
//! address (`proto::symbolic::placeholder_address`, 127.77.X.Y) and the name itself as the
//! official name; the program goes on to run `rsh anyLinux …`, which the shim turns into a
//! request to the broker (in a module job the lookup itself starts the request,
//! [`crate::hint`]). A symbolic name never reaches DNS.
//!
//! Interposed: `gethostbyname`, `gethostbyname2`, `gethostbyname_r`, `gethostbyname2_r`,
//! `getaddrinfo` (IPv4 answers only; an IPv6-only question about a symbolic name gets "no such
//! name"). Nothing here allocates what the caller frees except through the real
//! `getaddrinfo`, so `freeaddrinfo` stays the C library's.

use crate::next;
use std::{
    cell::Cell,
    ffi::{c_char, c_int, CStr},
    mem::{align_of, size_of},
    net::Ipv4Addr,
    ptr::{null_mut, NonNull},
    sync::OnceLock,
};

use libc::{addrinfo, hostent, size_t, AF_INET, AF_INET6, AF_UNSPEC, AI_CANONNAME, AI_NUMERICHOST};

extern "C" {
    /// glibc's per-thread `h_errno`.
    fn __h_errno_location() -> *mut c_int;
}

const HOST_NOT_FOUND: c_int = 1;
const NETDB_INTERNAL: c_int = -1;

/// The placeholder address of `name` when it is a symbolic host name (the job's agent
/// hears of the lookup: [`crate::hint`]).
///
/// # Safety
/// `name` is null or a NUL-terminated string.
unsafe fn symbolic(name: *const c_char) -> Option<(&'static CStr, Ipv4Addr)> {
    if name.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract; the borrow is only used
    // during the call that lent it (the 'static is never stored).
    let cname: &'static CStr = unsafe { CStr::from_ptr(name) };
    let text = cname.to_str().ok()?;
    if !proto::symbolic::is_symbolic(text) {
        return None;
    }
    crate::hint::resolved(text);
    Some((cname, proto::symbolic::placeholder_address(text)))
}

fn set_h_errno(value: c_int) {
    // SAFETY: glibc returns a valid per-thread location.
    unsafe { *__h_errno_location() = value };
}

/// A `hostent` with one IPv4 address and no aliases, and the storage it points into.
#[repr(C)]
struct HostEntry {
    entry: hostent,
    address: [u8; 4],
    addresses: [*mut c_char; 2],
    aliases: [*mut c_char; 1],
    name: [u8; 256],
}

thread_local! {
    /// The static result of `gethostbyname` (one per thread, like the C library's buffer).
    static ENTRY: Cell<*mut HostEntry> = const { Cell::new(null_mut()) };
}

/// Fills `ret` from `name`/`address` using `buf` as storage. `false` when `buf` is too small.
///
/// # Safety
/// `ret` is writable; `buf` is writable for `len` bytes.
unsafe fn fill_hostent(
    ret: *mut hostent,
    buf: *mut c_char,
    len: usize,
    name: &CStr,
    address: Ipv4Addr,
) -> bool {
    let name = name.to_bytes_with_nul();
    let align = align_of::<*mut c_char>();
    let pad = buf.align_offset(align);
    let pointers = 3 * size_of::<*mut c_char>();
    if pad + pointers + 4 + name.len() > len {
        return false;
    }
    // SAFETY: every write below lies inside buf[..len], checked above; the pointer array
    // starts at an aligned offset.
    unsafe {
        let list = buf.add(pad).cast::<*mut c_char>();
        let addr = buf.add(pad + pointers);
        let name_at = addr.add(4);
        std::ptr::copy_nonoverlapping(address.octets().as_ptr(), addr.cast::<u8>(), 4);
        std::ptr::copy_nonoverlapping(name.as_ptr(), name_at.cast::<u8>(), name.len());
        *list = addr;
        *list.add(1) = null_mut();
        *list.add(2) = null_mut();
        *ret = hostent {
            h_name: name_at,
            h_aliases: list.add(2),
            h_addrtype: AF_INET,
            h_length: 4,
            h_addr_list: list,
        };
    }
    true
}

/// `gethostbyname` for a symbolic name: this thread's entry, refilled.
fn static_entry(name: &CStr, address: Ipv4Addr) -> *mut hostent {
    ENTRY.with(|cell| {
        if cell.get().is_null() {
            // Kept for the thread's life, as the C library keeps its static buffer.
            let fresh = Box::new(HostEntry {
                entry: hostent {
                    h_name: null_mut(),
                    h_aliases: null_mut(),
                    h_addrtype: 0,
                    h_length: 0,
                    h_addr_list: null_mut(),
                },
                address: [0; 4],
                addresses: [null_mut(); 2],
                aliases: [null_mut()],
                name: [0; 256],
            });
            cell.set(Box::into_raw(fresh));
        }
        // SAFETY: this thread's live entry; nothing else borrows it during the call.
        let e = unsafe { &mut *cell.get() };
        let bytes = name.to_bytes();
        let n = bytes.len().min(e.name.len() - 1);
        e.name[..n].copy_from_slice(&bytes[..n]);
        e.name[n] = 0;
        e.address = address.octets();
        e.addresses = [e.address.as_mut_ptr().cast(), null_mut()];
        e.aliases = [null_mut()];
        e.entry = hostent {
            h_name: e.name.as_mut_ptr().cast(),
            h_aliases: e.aliases.as_mut_ptr(),
            h_addrtype: AF_INET,
            h_length: 4,
            h_addr_list: e.addresses.as_mut_ptr(),
        };
        &mut e.entry as *mut hostent
    })
}

type ByName = unsafe extern "C" fn(*const c_char) -> *mut hostent;
type ByName2 = unsafe extern "C" fn(*const c_char, c_int) -> *mut hostent;
type ByNameR = unsafe extern "C" fn(
    *const c_char,
    *mut hostent,
    *mut c_char,
    size_t,
    *mut *mut hostent,
    *mut c_int,
) -> c_int;
type ByName2R = unsafe extern "C" fn(
    *const c_char,
    c_int,
    *mut hostent,
    *mut c_char,
    size_t,
    *mut *mut hostent,
    *mut c_int,
) -> c_int;
type AddrInfo = unsafe extern "C" fn(
    *const c_char,
    *const c_char,
    *const addrinfo,
    *mut *mut addrinfo,
) -> c_int;

/// Interposed `gethostbyname(3)`.
///
/// # Safety
/// As the C function: `name` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gethostbyname(name: *const c_char) -> *mut hostent {
    // SAFETY: the caller's contract.
    if let Some((cname, address)) = unsafe { symbolic(name) } {
        return static_entry(cname, address);
    }
    static REAL: OnceLock<usize> = OnceLock::new();
    match next(c"gethostbyname", &REAL) {
        // SAFETY: the C library's gethostbyname has this signature.
        Some(f) => unsafe { std::mem::transmute::<NonNull<libc::c_void>, ByName>(f)(name) },
        None => {
            set_h_errno(NETDB_INTERNAL);
            null_mut()
        }
    }
}

/// Interposed `gethostbyname2(3)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn gethostbyname2(name: *const c_char, af: c_int) -> *mut hostent {
    // SAFETY: the caller's contract.
    if let Some((cname, address)) = unsafe { symbolic(name) } {
        if af == AF_INET {
            return static_entry(cname, address);
        }
        set_h_errno(HOST_NOT_FOUND);
        return null_mut();
    }
    static REAL: OnceLock<usize> = OnceLock::new();
    match next(c"gethostbyname2", &REAL) {
        // SAFETY: the C library's gethostbyname2 has this signature.
        Some(f) => unsafe { std::mem::transmute::<NonNull<libc::c_void>, ByName2>(f)(name, af) },
        None => {
            set_h_errno(NETDB_INTERNAL);
            null_mut()
        }
    }
}

/// The answer of the `_r` variants for a symbolic name.
///
/// # Safety
/// As `gethostbyname_r(3)`.
unsafe fn reentrant_answer(
    cname: &CStr,
    address: Option<Ipv4Addr>,
    ret: *mut hostent,
    buf: *mut c_char,
    buflen: size_t,
    result: *mut *mut hostent,
    h_errnop: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract: ret, buf[..buflen], result and h_errnop are writable.
    unsafe {
        *result = null_mut();
        let Some(address) = address else {
            *h_errnop = HOST_NOT_FOUND;
            return 0;
        };
        if !fill_hostent(ret, buf, buflen, cname, address) {
            *h_errnop = NETDB_INTERNAL;
            return libc::ERANGE;
        }
        *result = ret;
    }
    0
}

/// Interposed `gethostbyname_r(3)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn gethostbyname_r(
    name: *const c_char,
    ret: *mut hostent,
    buf: *mut c_char,
    buflen: size_t,
    result: *mut *mut hostent,
    h_errnop: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        if let Some((cname, address)) = symbolic(name) {
            return reentrant_answer(cname, Some(address), ret, buf, buflen, result, h_errnop);
        }
        static REAL: OnceLock<usize> = OnceLock::new();
        match next(c"gethostbyname_r", &REAL) {
            Some(f) => std::mem::transmute::<NonNull<libc::c_void>, ByNameR>(f)(
                name, ret, buf, buflen, result, h_errnop,
            ),
            None => libc::ENOSYS,
        }
    }
}

/// Interposed `gethostbyname2_r(3)`.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn gethostbyname2_r(
    name: *const c_char,
    af: c_int,
    ret: *mut hostent,
    buf: *mut c_char,
    buflen: size_t,
    result: *mut *mut hostent,
    h_errnop: *mut c_int,
) -> c_int {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        if let Some((cname, address)) = symbolic(name) {
            let address = (af == AF_INET).then_some(address);
            return reentrant_answer(cname, address, ret, buf, buflen, result, h_errnop);
        }
        static REAL: OnceLock<usize> = OnceLock::new();
        match next(c"gethostbyname2_r", &REAL) {
            Some(f) => std::mem::transmute::<NonNull<libc::c_void>, ByName2R>(f)(
                name, af, ret, buf, buflen, result, h_errnop,
            ),
            None => libc::ENOSYS,
        }
    }
}

/// Interposed `getaddrinfo(3)`: a symbolic `node` is answered by the real function for its
/// placeholder address (numeric, so no lookup), with the name as the canonical name.
///
/// # Safety
/// As the C function.
#[no_mangle]
pub unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const addrinfo,
    res: *mut *mut addrinfo,
) -> c_int {
    static REAL: OnceLock<usize> = OnceLock::new();
    let Some(real) = next(c"getaddrinfo", &REAL) else {
        return libc::EAI_SYSTEM;
    };
    // SAFETY: the C library's getaddrinfo has this signature.
    let real = unsafe { std::mem::transmute::<NonNull<libc::c_void>, AddrInfo>(real) };
    // SAFETY: the caller's contract, passed on.
    unsafe {
        let Some((cname, address)) = symbolic(node) else {
            return real(node, service, hints, res);
        };
        let mut h: addrinfo = if hints.is_null() {
            std::mem::zeroed()
        } else {
            *hints
        };
        if h.ai_family == AF_INET6 {
            return libc::EAI_NONAME;
        }
        if h.ai_family != AF_INET {
            h.ai_family = AF_UNSPEC;
        }
        h.ai_flags |= AI_NUMERICHOST;
        let text = std::ffi::CString::new(address.to_string()).unwrap_or_default();
        let rc = real(text.as_ptr(), service, &h, res);
        if rc == 0 && h.ai_flags & AI_CANONNAME != 0 && !(*res).is_null() {
            libc::free((**res).ai_canonname.cast());
            (**res).ai_canonname = libc::strdup(cname.as_ptr());
        }
        rc
    }
}

#[cfg(test)]
mod tests {
    //! The test binary links this library, so the functions below are the process's own
    //! resolver: symbolic names answer here, others reach the C library.
    use super::*;
    use std::ffi::CString;

    fn ipv4_of(entry: &hostent) -> Ipv4Addr {
        assert_eq!(entry.h_addrtype, AF_INET);
        assert_eq!(entry.h_length, 4);
        // SAFETY: a filled hostent with one 4-byte address.
        let bytes = unsafe { std::slice::from_raw_parts((*entry.h_addr_list).cast::<u8>(), 4) };
        // SAFETY: the list ends after one address.
        assert!(unsafe { (*entry.h_addr_list.add(1)).is_null() });
        Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])
    }

    fn name_of(entry: &hostent) -> String {
        // SAFETY: h_name is NUL-terminated.
        unsafe { CStr::from_ptr(entry.h_name) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn gethostbyname_answers_a_symbolic_name_with_its_placeholder() {
        // SAFETY: a valid C string.
        let e = unsafe { gethostbyname(c"anyLinux".as_ptr()) };
        assert!(!e.is_null());
        // SAFETY: non-null result of gethostbyname.
        let e = unsafe { &*e };
        assert_eq!(ipv4_of(e), proto::symbolic::placeholder_address("anyLinux"));
        assert_eq!(name_of(e), "anyLinux");
        // SAFETY: the alias list is a valid empty list.
        assert!(unsafe { (*e.h_aliases).is_null() });
    }

    #[test]
    fn real_names_reach_the_c_library() {
        // SAFETY: a valid C string. A numeric address resolves without any lookup.
        let e = unsafe { gethostbyname(c"127.0.0.1".as_ptr()) };
        assert!(!e.is_null());
        // SAFETY: non-null result.
        assert_eq!(ipv4_of(unsafe { &*e }), Ipv4Addr::LOCALHOST);
    }

    #[test]
    fn gethostbyname2_answers_ipv4_only() {
        // SAFETY: valid C strings.
        unsafe {
            assert!(!gethostbyname2(c"anyHost".as_ptr(), AF_INET).is_null());
            assert!(gethostbyname2(c"anyHost".as_ptr(), AF_INET6).is_null());
            assert_eq!(*__h_errno_location(), HOST_NOT_FOUND);
        }
    }

    #[test]
    fn gethostbyname_r_fills_the_callers_buffer_or_says_erange() {
        let mut entry: hostent = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as c_char; 128];
        let mut result = null_mut();
        let mut herr = 0;
        // SAFETY: every pointer is valid for the sizes given.
        let rc = unsafe {
            gethostbyname_r(
                c"anyPublic".as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                buf.len(),
                &mut result,
                &mut herr,
            )
        };
        assert_eq!(rc, 0);
        assert_eq!(result, &mut entry as *mut hostent);
        assert_eq!(name_of(&entry), "anyPublic");
        assert_eq!(
            ipv4_of(&entry),
            proto::symbolic::placeholder_address("anyPublic")
        );
        // SAFETY: as above, with a buffer too small.
        let rc = unsafe {
            gethostbyname_r(
                c"anyPublic".as_ptr(),
                &mut entry,
                buf.as_mut_ptr(),
                8,
                &mut result,
                &mut herr,
            )
        };
        assert_eq!(rc, libc::ERANGE);
        assert!(result.is_null());
    }

    #[test]
    fn getaddrinfo_answers_with_the_placeholder_and_the_canonical_name() {
        let mut hints: addrinfo = unsafe { std::mem::zeroed() };
        hints.ai_flags = AI_CANONNAME;
        hints.ai_socktype = libc::SOCK_STREAM;
        let mut res = null_mut();
        let node = CString::new("anyLinux").expect("c string");
        // SAFETY: valid pointers; the result is freed with the C library's freeaddrinfo.
        unsafe {
            assert_eq!(
                getaddrinfo(node.as_ptr(), c"514".as_ptr(), &hints, &mut res),
                0
            );
            let ai = &*res;
            assert_eq!(ai.ai_family, AF_INET);
            let sin = &*(ai.ai_addr as *const libc::sockaddr_in);
            assert_eq!(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                proto::symbolic::placeholder_address("anyLinux")
            );
            assert_eq!(u16::from_be(sin.sin_port), 514);
            assert_eq!(CStr::from_ptr(ai.ai_canonname).to_str(), Ok("anyLinux"));
            libc::freeaddrinfo(res);
            hints.ai_family = AF_INET6;
            assert_eq!(
                getaddrinfo(node.as_ptr(), std::ptr::null(), &hints, &mut res),
                libc::EAI_NONAME
            );
        }
    }

    #[test]
    fn std_lookups_of_real_names_still_work() {
        use std::net::ToSocketAddrs;
        let found: Vec<_> = ("127.0.0.1", 80)
            .to_socket_addrs()
            .expect("numeric")
            .collect();
        assert_eq!(found.len(), 1);
        let symbolic: Vec<_> = ("anyLinux", 80)
            .to_socket_addrs()
            .expect("bridged")
            .collect();
        assert!(symbolic[0].ip().is_loopback());
    }
}
