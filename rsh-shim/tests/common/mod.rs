//! What both integration tests of the shim share.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Writes the executable script `path` (`body` as its text) from a child process. A script
/// this process wrote and then ran could fail with "Text file busy": another test thread's
/// fork, made while the file was open for writing, keeps the descriptor until its own exec.
/// A child's descriptors are gone when it exits, and no thread here holds one.
pub fn write_script(path: &Path, body: &str) {
    let mut child = Command::new("/bin/sh")
        .args(["-c", "cat >\"$0\" && chmod 755 \"$0\""])
        .arg(path)
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(body.as_bytes()).expect("write script");
    drop(stdin);
    assert!(child.wait().expect("wait").success(), "wrote {path:?}");
}
