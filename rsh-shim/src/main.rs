//! The `rsh` binary: everything happens in the library ([`rsh_shim::run`]); on success the
//! process has become the real remote shell, so reaching the end means an error (exit 1).

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let err = rsh_shim::run(&args, &rsh_shim::Env::from_process());
    rsh_shim::print_error(&err);
    ExitCode::from(1)
}
