//! Tier 2, the command lines: what `rb`, `agent` and `rb-broker` say and which exit code
//! they give for bad input, bad configuration and a missing broker (issue 14, items 4, 9,
//! 16–19). The real binaries; no root needed.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use tests::{bin, rb};

/// A lab file in a temp dir with a secret beside it (mode 0600); `@SECRET@` and `@STATE@`
/// in `text` are replaced.
struct LabFile {
    dir: tempfile::TempDir,
    path: PathBuf,
}

impl LabFile {
    fn new(text: &str) -> LabFile {
        let dir = tempfile::Builder::new()
            .prefix("rb-cli-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let secret = dir.path().join("secret");
        proto::auth::write_new_secret(&secret, false).expect("secret");
        let text = text
            .replace("@SECRET@", &secret.display().to_string())
            .replace("@STATE@", &dir.path().join("state").display().to_string());
        let path = dir.path().join("lab.toml");
        std::fs::write(&path, text).expect("write lab");
        LabFile { dir, path }
    }

    fn secret(&self) -> PathBuf {
        self.dir.path().join("secret")
    }

    fn arg(&self) -> &str {
        self.path.to_str().expect("utf8 path")
    }
}

const HEADER: &str = "[broker]\nlisten = \"10.77.0.1:0\"\ntransport = \"manual\"\nstate_dir = \"@STATE@\"\nsecret_file = \"@SECRET@\"\n";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `rb-broker --lab FILE`, which must refuse the file before it starts anything.
fn broker_refuses(lab: &Path) -> Output {
    Command::new(bin("rb-broker"))
        .arg("--lab")
        .arg(lab)
        .env_remove("RB_LAB")
        .output()
        .expect("run rb-broker")
}

#[test]
fn rb_check_and_the_broker_refuse_an_address_that_reads_as_an_ssh_option() {
    let lab = LabFile::new(&format!(
        "{HEADER}\n[[host]]\nname = \"node02\"\naddress = \"-oProxyCommand=touch /tmp/pwned\"\n"
    ));
    let out = rb(&["check", lab.arg()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    let at = format!("{}:9:11: host[0].address:", lab.arg());
    assert!(err.contains(&at), "no {at} in: {err}");
    assert!(
        err.contains("starts with '-'") && err.contains("\nhelp: "),
        "{err}"
    );
    let out = broker_refuses(&lab.path);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains(&at), "{}", stderr(&out));
}

#[test]
fn rb_check_refuses_symbolic_host_names_and_shared_addresses() {
    let lab = LabFile::new(&format!("{HEADER}\n[[host]]\nname = \"AnyLinux\"\n"));
    let out = rb(&["check", lab.arg()]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("host[0].name: `AnyLinux` is a symbolic name"));
    let lab = LabFile::new(&format!(
        "{HEADER}\n[[host]]\nname = \"node02\"\naddress = \"10.77.0.2\"\n\n[[host]]\nname = \"node03\"\naddress = \"10.77.0.2\"\n"
    ));
    let out = rb(&["check", lab.arg()]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(":13:11: host[1].address:"),
        "{}",
        stderr(&out)
    );
    let out = broker_refuses(&lab.path);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
}

#[test]
fn rb_check_reports_every_unknown_key_not_only_the_first() {
    let lab = LabFile::new(&format!(
        "{HEADER}listen_port = 7700\n\n[[host]]\nname = \"node02\"\nadress = \"10.77.0.2\"\ncolour = \"red\"\n"
    ));
    let out = rb(&["check", lab.arg()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    for key in [
        "6:1: broker.listen_port",
        "10:1: host[0].adress",
        "11:1: host[0].colour",
    ] {
        assert!(err.contains(key), "no `{key}` in: {err}");
    }
    assert_eq!(err.matches("error: ").count(), 3, "{err}");
}

#[test]
fn rb_check_warns_about_a_loopback_listen_with_a_remote_transport() {
    let text = HEADER
        .replace("10.77.0.1:0", "127.0.0.1:0")
        .replace("manual", "ssh");
    let lab = LabFile::new(&format!("{text}\n[[host]]\nname = \"node02\"\n"));
    let out = rb(&["check", lab.arg()]);
    let err = stderr(&out);
    assert!(out.status.success(), "a warning must not fail: {err}");
    assert!(
        err.contains("broker.listen: warning: 127.0.0.1:0 is a loopback address"),
        "{err}"
    );
    assert!(stdout(&out).contains(": ok: 1 hosts"), "{}", stdout(&out));
}

#[test]
fn rb_check_refuses_a_secret_file_the_broker_would_refuse() {
    let lab = LabFile::new(&format!("{HEADER}\n[[host]]\nname = \"node02\"\n"));
    assert!(rb(&["check", lab.arg()]).status.success());
    std::fs::set_permissions(lab.secret(), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = rb(&["check", lab.arg()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("broker.secret_file: secret file"), "{err}");
    assert!(err.contains("help: chmod 600"), "{err}");
    let out = broker_refuses(&lab.path);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    std::fs::remove_file(lab.secret()).expect("rm secret");
    let out = rb(&["check", lab.arg()]);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot read secret file"),
        "{}",
        stderr(&out)
    );
}
