//! `rb-lam-add HOST`: adds HOST to this user's running LAM/MPI 7.1 universe as
//! `lamgrow HOST` does, without lamgrow's every-node scan. The `lam-grow` module uses it
//! when present, because the job waits for the host meanwhile: before it boots anything,
//! lamgrow asks every node of the universe whether another lamgrow runs (one remote round
//! per node: with 8 nodes, lamgrow took 17 ms from its start to its remote shell in the
//! test lab, this program 6-8 ms), while this program asks only the node it runs on,
//! where the job's own lamgrows run, and waits there while one does. It enrols under its
//! own name, so a lamgrow the job starts meanwhile is not refused ("already running", before
//! it has looked its host up and so asked for a machine). The boot itself is LAM's
//! (`src/lam_add.c`, built against LAM's headers when they are installed; see `build.rs`).
//!
//! Exit status:
//! - 0: HOST was added;
//! - 1: LAM refused or failed; LAM's own message is on stderr;
//! - 2: usage;
//! - 3: LAM cannot be used from this build (no LAM headers when it was built) or as root
//!   (LAM refuses root): the caller falls back to `lamgrow`, which explains itself;
//! - 4: no lamd of this user runs here (no LAM universe). One that is starting (the
//!   job's lamboot in progress: LAM's session directory without a socket the lamd listens
//!   on -- the socket file appears at its bind, before its listen -- or no directory while
//!   a `lamboot`, `hboot`, `tkill` or `lamd` of this user runs here, as between the boot's
//!   tkill and its lamd) is waited for, up to 10 s, since LAM's attach to a lamd it cannot
//!   reach removes that directory and so ends the starting lamd;
//! - 5: another lamgrow stayed enrolled on this node for 5 s;
//! - 6: HOST is a node of the universe already (LAM refused it: "already a part of the
//!   existing LAM universe"; the same code as `lam-grow`'s, modules/CONTRACT.md).

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;
use std::process::ExitCode;

const EXIT_USAGE: u8 = 2;
const EXIT_UNAVAILABLE: u8 = 3;

fn main() -> ExitCode {
    let host = match parse_args(std::env::args_os().skip(1)) {
        Ok(host) => host,
        Err(msg) => {
            eprintln!("rb-lam-add: {msg}\nusage: rb-lam-add HOST");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    // SAFETY: geteuid only reads the process's credentials.
    if unsafe { libc::geteuid() } == 0 {
        eprintln!("rb-lam-add: LAM refuses to run as root; run it as the job's user");
        return ExitCode::from(EXIT_UNAVAILABLE);
    }
    add(&host)
}

/// The one HOST argument: not empty, not an option, no NUL byte.
fn parse_args(mut args: impl Iterator<Item = OsString>) -> Result<CString, String> {
    let host = args.next().ok_or("no host given")?;
    if let Some(extra) = args.next() {
        return Err(format!("one host only (got {extra:?} too)"));
    }
    let shown = host.to_string_lossy().into_owned();
    if shown.is_empty() || shown.starts_with('-') {
        return Err(format!("{shown:?} is not a host name"));
    }
    CString::new(host.into_vec()).map_err(|_| format!("{shown:?}: a host name has no NUL byte"))
}

#[cfg(have_lam)]
fn add(host: &CString) -> ExitCode {
    extern "C" {
        /// Adds `host` (see `src/lam_add.c`); returns, or exits through LAM's `kexit`, with
        /// the status documented above.
        fn rb_lam_add(host: *const std::ffi::c_char) -> std::ffi::c_int;
    }
    // SAFETY: `host` is a NUL-terminated string that outlives the call; the C side only
    // reads it.
    let status = unsafe { rb_lam_add(host.as_ptr()) };
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}

#[cfg(not(have_lam))]
fn add(_host: &CString) -> ExitCode {
    eprintln!(
        "rb-lam-add: built without LAM/MPI's headers (Debian: lam4-dev), so it cannot add \
         hosts; use lamgrow, or rebuild after installing them"
    );
    ExitCode::from(EXIT_UNAVAILABLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<CString, String> {
        parse_args(args.iter().map(OsString::from))
    }

    #[test]
    fn takes_exactly_one_host_name() {
        assert_eq!(parse(&["node03"]).expect("host").to_str(), Ok("node03"));
        assert!(parse(&[]).expect_err("none").contains("no host"));
        assert!(parse(&["a", "b"])
            .expect_err("two")
            .contains("one host only"));
        assert!(parse(&["-v"])
            .expect_err("option")
            .contains("not a host name"));
        assert!(parse(&[""]).expect_err("empty").contains("not a host name"));
    }
}
