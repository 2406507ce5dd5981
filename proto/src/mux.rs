//! Where a job's ssh master connections live. Each host granted to a job over ssh gets one
//! OpenSSH master connection (`ControlMaster`), started by the shim's first call to the
//! host and reused by the later ones; its socket is `JOBDIR/cm/NAME`, NAME derived from
//! the host's lab name by [`socket_name`], so the shim (which starts the master) and the
//! agent (which closes it when the host goes back) find the same path without talking.
//! A call naming another user (`-l USER`) gets its own master in the same host directory:
//! `JOBDIR/cm/HOST/USER`, `JOBDIR/cm/HOST/_` for the caller's own login.
//!
//! A Unix socket's path has at most 107 bytes here, and ssh first binds the master's socket
//! under a temporary name 17 bytes longer (`PATH.` and 16 random characters) before it
//! renames it: [`control_path`] gives no path when that would not fit, and the call then
//! goes without a master (one handshake per call, as without this).

use std::path::{Path, PathBuf};

/// The directory of the job's master sockets, inside the job's private directory.
pub const DIR: &str = "cm";

/// The longest socket path ssh can bind as a master: 104 bytes (the smallest `sun_path`
/// of the systems OpenSSH supports, less its terminating zero) minus the 17 bytes of the
/// temporary name ssh binds first.
pub const MAX_PATH_BYTES: usize = 104 - 17;

/// Host names up to this length are used as they are (when made of safe bytes).
const MAX_PLAIN_NAME: usize = 32;

/// The socket's file name for `host`: the name itself when it is short and made of letters,
/// digits, `.`, `_` and `-` (not starting with `.`), else `h` and a 64-bit FNV-1a hash of
/// the name in hex (lab names are unique, so clashes need two names of one lab to collide).
pub fn socket_name(host: &str) -> String {
    let plain = !host.is_empty()
        && host.len() <= MAX_PLAIN_NAME
        && !host.starts_with('.')
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        return host.to_string();
    }
    let hash = host.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("h{hash:016x}")
}

/// The directory of `host`'s master sockets (one per remote user) in the job's `job_dir`.
pub fn host_dir(job_dir: &Path, host: &str) -> PathBuf {
    job_dir.join(DIR).join(socket_name(host))
}

/// The master socket of `host` (logging in as `user`, `None`: the caller's own login) for
/// the job whose private directory is `job_dir`, when ssh can use it: short enough
/// ([`MAX_PATH_BYTES`]), and free of what ssh's `ControlPath` would expand or split (`%`,
/// whitespace, quotes).
pub fn control_path(job_dir: &Path, host: &str, user: Option<&str>) -> Option<PathBuf> {
    let path = host_dir(job_dir, host).join(user.map_or_else(|| "_".into(), socket_name));
    let text = path.to_str()?;
    let usable = path.is_absolute()
        && text.len() <= MAX_PATH_BYTES
        && !text
            .chars()
            .any(|c| c == '%' || c == '"' || c == '\'' || c.is_whitespace());
    usable.then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_safe_names_are_kept_others_are_hashed() {
        assert_eq!(socket_name("node03"), "node03");
        assert_eq!(socket_name("ws-12.lab_a"), "ws-12.lab_a");
        for odd in ["", ".hidden", "a/b", "../x", "a b", &"x".repeat(33)] {
            let name = socket_name(odd);
            assert!(
                name.starts_with('h') && name.len() == 17,
                "{odd:?} → {name}"
            );
        }
        assert_ne!(socket_name("a/b"), socket_name("a/c"));
        assert_eq!(socket_name("a/b"), socket_name("a/b"));
    }

    #[test]
    fn paths_ssh_cannot_bind_or_would_expand_are_refused() {
        let dir = Path::new("/tmp/rb-4242/job-17-31337");
        assert_eq!(
            control_path(dir, "node03", None),
            Some(PathBuf::from("/tmp/rb-4242/job-17-31337/cm/node03/_"))
        );
        assert_eq!(
            control_path(dir, "node03", Some("bob")),
            Some(PathBuf::from("/tmp/rb-4242/job-17-31337/cm/node03/bob"))
        );
        assert_eq!(host_dir(dir, "node03"), dir.join("cm/node03"));
        let long = Path::new("/tmp").join("d".repeat(80));
        assert_eq!(control_path(&long, "node03", None), None);
        for bad in [
            "/tmp/a%h/job",
            "/tmp/a b/job",
            "/tmp/a\"/job",
            "relative/job",
        ] {
            assert_eq!(control_path(Path::new(bad), "node03", None), None, "{bad}");
        }
        let longest =
            control_path(dir, &"n".repeat(200), Some(&"u".repeat(99))).expect("hashed names fit");
        assert!(longest.to_str().expect("utf-8").len() <= MAX_PATH_BYTES);
    }
}
