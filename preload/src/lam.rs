//! LAM/MPI 7.1's `nsend`, guarded: a message without a body goes out with a null body
//! pointer (details on [`nsend`]).

use std::{
    ffi::{c_char, c_int},
    ptr::{null_mut, NonNull},
    sync::OnceLock,
};

use crate::next;

/// LAM/MPI 7.1's network message descriptor (`struct nmsg`, `share/include/net.h`): seven
/// `int4` header fields, `NHDSIZE` (8) `int4` of inline data, then the body pointer.
#[repr(C)]
pub struct LamNmsg {
    pub nh_dl_event: i32,
    pub nh_dl_link: i32,
    pub nh_node: i32,
    pub nh_event: i32,
    pub nh_type: i32,
    pub nh_length: i32,
    pub nh_flags: i32,
    pub nh_data: [i32; 8],
    pub nh_msg: *mut c_char,
}

type Nsend = unsafe extern "C" fn(*mut LamNmsg) -> c_int;

/// Interposed `nsend` of LAM/MPI 7.1 (`liblam`): a message without a body is sent with a
/// null body pointer. Nothing else changes; other programs never call it.
///
/// LAM's `lam_linit` (run by `MPI_Init` under `mpirun`) leaves `nh_msg` uninitialized
/// (`LAM_ZERO_ME` is a no-op unless LAM was built with `--with-purify`) and
/// `lam_send_pid_idx` sends that header with `nh_length = 0`. `nsend` hands
/// `{nh_msg, 0}` to `writev(2)`, and Linux checks the address even for length 0: when the
/// stack garbage there is not a user address (often bytes of the environment's text), the
/// write fails with EFAULT and `MPI_Init` aborts with "Unix errno: 14 Bad address". How
/// often depends on the environment the `lamd` (and so the MPI process) inherited: about
/// half of the runs with a login environment, never with the bare one of an `rsh` command.
///
/// # Safety
/// As LAM's function: `nhead` is a valid message descriptor.
#[no_mangle]
pub unsafe extern "C" fn nsend(nhead: *mut LamNmsg) -> c_int {
    static REAL: OnceLock<usize> = OnceLock::new();
    let Some(real) = next(c"nsend", &REAL) else {
        // SAFETY: glibc's errno location is valid for this thread.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    };
    // SAFETY: LAM's nsend has this signature.
    let real = unsafe { std::mem::transmute::<NonNull<libc::c_void>, Nsend>(real) };
    // SAFETY: the caller's contract: nhead is a valid, writable descriptor (or null, which
    // the real function answers).
    unsafe {
        if nhead.is_null() || (*nhead).nh_length != 0 {
            return real(nhead);
        }
        // The caller may reuse the descriptor: give it back its pointer afterwards.
        let body = (*nhead).nh_msg;
        (*nhead).nh_msg = null_mut();
        let rc = real(nhead);
        if (*nhead).nh_msg.is_null() {
            (*nhead).nh_msg = body;
        }
        rc
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nsend_without_lam_fails_cleanly_and_leaves_the_descriptor_alone() {
        let body = 0x6576_6e65_2f3d_454d_u64 as *mut c_char; // text, as LAM's stack garbage
        let mut msg = LamNmsg {
            nh_dl_event: 0,
            nh_dl_link: 0,
            nh_node: 0,
            nh_event: 0,
            nh_type: 2,
            nh_length: 0,
            nh_flags: 0,
            nh_data: [0; 8],
            nh_msg: body,
        };
        // SAFETY: a valid descriptor; no liblam in this process, so there is no next nsend.
        let rc = unsafe { nsend(&mut msg) };
        assert_eq!(rc, -1);
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENOSYS)
        );
        assert_eq!(msg.nh_msg, body);
        assert_eq!(size_of::<LamNmsg>(), 72, "LAM's struct nmsg on LP64");
    }
}
