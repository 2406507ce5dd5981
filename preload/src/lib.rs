//! `librb_preload.so`: the compatibility library the agent preloads (`LD_PRELOAD`) into
//! module jobs (`agent --preload auto|on|off`), for parallel systems that cannot be changed:
//!
//! - [`names`]: symbolic host names (`anyLinux`, `anyHost`, `any<Label>`) resolve, to a
//!   placeholder loopback address, so that programs which look a host name up before they
//!   run the remote shell still reach the `rsh` shim with it (PVM's `add anyLinux`,
//!   `lamgrow anyLinux`). Every other name goes to the C library's resolver untouched.
//! - [`hint`]: the lookup of a symbolic name tells the job's agent at once, so a module
//!   job's request starts before the program's `rsh` (`proto::agent`, `resolved`).
//! - [`lam`]: LAM/MPI 7.1's `nsend` never hands an uninitialized body pointer to `writev`,
//!   which made `MPI_Init` fail at random with errno 14 in processes a job's `lamd` starts.
//!
//! Each interposed function finds the real one with `dlsym(RTLD_NEXT, …)` and changes only
//! the case it is there for. The shim takes the library out of `LD_PRELOAD` before it execs
//! the real remote shell; the subagent puts it back for module jobs' remote commands when
//! the same path exists on that host (`rb-subagent --preload`).

use std::{ffi::CStr, ptr::NonNull, sync::OnceLock};

pub mod hint;
pub mod lam;
pub mod names;

/// The next definition of `symbol` after this library (normally the C library's).
pub(crate) fn next(symbol: &CStr, cache: &OnceLock<usize>) -> Option<NonNull<libc::c_void>> {
    let addr = *cache.get_or_init(|| {
        // SAFETY: dlsym with a valid NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_NEXT, symbol.as_ptr()) as usize }
    });
    NonNull::new(addr as *mut libc::c_void)
}
