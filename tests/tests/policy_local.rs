//! Tier 2, policies (issue 15): the lab file's `[broker] policy`, `rb check` and `rb-broker`
//! refusing a bad one, and the broker granting by the policy in force. The real binaries
//! on virtual hosts of this machine; no root needed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Duration,
};

use tests::{bin, local_lab, rb, wait_until, Broker};

/// A directory for policy files, outside any broker's.
fn policy_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rb-policy-")
        .tempdir_in("/var/tmp")
        .expect("tempdir")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write policy");
    path
}

/// `local_lab(n)` with `[broker] policy = SETTING`.
fn lab_with_policy(n: usize, setting: &str) -> String {
    local_lab(n).replacen(
        "[broker]\n",
        &format!("[broker]\npolicy = {}\n", toml_string(setting)),
        1,
    )
}

fn toml_string(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A lab file (with its secret) in `dir`, as `rb check` and `rb-broker` read it.
fn lab_file(dir: &Path, text: &str) -> PathBuf {
    let secret = dir.join("secret");
    if !secret.exists() {
        proto::auth::write_new_secret(&secret, false).expect("secret");
    }
    let text = text
        .replace("@STATE@", &dir.join("state").display().to_string())
        .replace("@SECRET@", &secret.display().to_string());
    write(dir, "lab.toml", &text)
}

#[test]
fn rb_check_and_the_broker_refuse_a_bad_policy_with_its_position() {
    let dir = policy_dir();
    let bad = write(dir.path(), "bad.toml", "start = 'host.lod1 > 1.0'\n");
    let lab = lab_file(dir.path(), &lab_with_policy(1, "bad.toml"));
    let out = rb(&["check", lab.to_str().expect("utf8")]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    let at = format!("{}:1:", bad.display());
    assert!(err.contains(&at), "the policy's own FILE:LINE:COL: {err}");
    assert!(err.contains("help:"), "{err}");
    let out = Command::new(bin("rb-broker"))
        .arg("--lab")
        .arg(&lab)
        .output()
        .expect("run rb-broker");
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains(&at), "{}", stderr(&out));
}

#[test]
fn rb_check_loads_a_shipped_policy_by_name() {
    let dir = policy_dir();
    let lab = lab_file(dir.path(), &lab_with_policy(1, "desktop"));
    let out = rb(&["check", lab.to_str().expect("utf8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("policies/desktop.toml: ok"),
        "{}",
        stdout(&out)
    );
    let lab = lab_file(dir.path(), &lab_with_policy(1, "papr"));
    let out = rb(&["check", lab.to_str().expect("utf8")]);
    assert_eq!(
        out.status.code(),
        Some(64),
        "a misspelt name is a missing file"
    );
    assert!(stderr(&out).contains("papr"), "{}", stderr(&out));
}

/// The broker starts with the lab file's policy file and says which it loaded.
#[test]
fn the_broker_runs_with_a_policy_file_from_the_lab_file() {
    let dir = policy_dir();
    let policy = write(dir.path(), "p.toml", "start = 'host.name == \"vhost02\"'\n");
    let broker = Broker::start(&lab_with_policy(2, policy.to_str().expect("utf8")));
    broker.wait_all_up(Duration::from_secs(20));
    let loaded = wait_until(Duration::from_secs(5), || {
        broker.log().contains("policy loaded").then_some(())
    });
    assert!(loaded.is_some(), "{}", broker.log());
}
