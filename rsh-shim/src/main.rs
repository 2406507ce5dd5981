//! The `rsh` binary (also `ssh`, `scp` and `sftp` by the name it is invoked under): everything happens in the library ([`rsh_shim::run`]); on success the
//! process has become the real remote shell, or ran a granted host's remote shell as its
//! child and ends as it did ([`rsh_shim::child::Ended::exit`]); an error exits 1, or 255 for
//! an instance whose host was taken back ([`rsh_shim::ShimError::exit_code`]).
//!
//! `no_main`: the C library calls `main` directly, without Rust's runtime set-up (a read
//! of /proc/self/maps for the stack guard, an alternate signal stack, SIGPIPE ignored).
//! A drop-in rsh is one extra exec on every remote-shell call, so its start-up is the
//! pass-through cost; and the real remote shell it becomes inherits the caller's signal
//! dispositions untouched. `std::env::args_os` still works (glibc hands argv to std's
//! initialiser).
#![no_main]

use std::ffi::{c_char, c_int, OsString};

#[no_mangle]
pub extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    steptimes::mark("shim.start", None);
    let args: Vec<OsString> = std::env::args_os().collect();
    match rsh_shim::run(&args, &rsh_shim::Env::from_process()) {
        Ok(ended) => {
            steptimes::mark("shim.exit", None);
            ended.exit()
        }
        Err(err) => {
            let argv0 = args.first().map(OsString::as_os_str).unwrap_or_default();
            let shell = rsh_shim::args::program_name(argv0)
                .filter(|name| ["ssh", "scp", "sftp"].contains(name))
                .unwrap_or("rsh");
            rsh_shim::print_error(&err, shell);
            err.exit_code_as(shell)
        }
    }
}
