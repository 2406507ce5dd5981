//! Tests of the I/O side on real directories (the decision itself: `verdict`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::*;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).expect("stat").mode() & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, Permissions::from_mode(mode)).expect("chmod");
}

fn is_root() -> bool {
    euid() == 0
}

#[test]
fn ensure_dir_creates_mode_0700_whatever_the_umask() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("d");
    ensure_dir(&dir).expect("created");
    assert_eq!(mode(&dir), 0o700);
    ensure_dir(&dir).expect("an existing private directory is fine");
}

#[test]
fn ensure_dir_tightens_our_own_open_directory() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("d");
    std::fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o777);
    ensure_dir(&dir).expect("ours: tightened");
    assert_eq!(mode(&dir), 0o700);
}

#[test]
fn ensure_dir_refuses_a_symlink_and_leaves_its_target_alone() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let target = tmp.path().join("target");
    std::fs::create_dir(&target).expect("mkdir");
    chmod(&target, 0o755);
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let err = ensure_dir(&link).expect_err("a symlink is refused");
    assert!(matches!(err, Error::Symlink { .. }), "{err}");
    assert!(
        err.to_string().contains(&link.display().to_string()),
        "{err}"
    );
    assert_eq!(mode(&target), 0o755, "the target was not touched");
}

#[test]
fn ensure_dir_refuses_a_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("f");
    std::fs::write(&file, "").expect("write");
    let err = ensure_dir(&file).expect_err("a file is refused");
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
}

#[test]
fn ensure_dir_refuses_a_directory_another_uid_made_and_names_the_owner() {
    if !is_root() {
        eprintln!("skipped: needs root to give a directory to another uid");
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("rb-victim");
    std::fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o777);
    std::os::unix::fs::chown(&dir, Some(4791), Some(4791)).expect("chown");
    let err = ensure_dir(&dir).expect_err("another uid's directory is refused");
    let text = err.to_string();
    assert!(matches!(err, Error::NotOurs { .. }), "{text}");
    assert!(
        text.contains("uid 4791") && text.contains("rb-victim"),
        "{text}"
    );
    assert!(text.contains("help:"), "{text}");
    assert_eq!(mode(&dir), 0o777, "someone else's directory is not changed");
}

#[test]
fn create_private_outside_the_root_makes_missing_parents_private() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("a/b/c");
    create_private(&dir).expect("created");
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&tmp.path().join("a")), 0o700);
}

#[test]
fn check_configured_refuses_group_or_other_write_and_changes_nothing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    check_configured(&tmp.path().join("missing")).expect("missing: created later");
    let dir = tmp.path().join("state");
    std::fs::create_dir(&dir).expect("mkdir");
    chmod(&dir, 0o755);
    check_configured(&dir).expect("0755 and ours: fine");
    chmod(&dir, 0o777);
    let err = check_configured(&dir).expect_err("0777 refused");
    assert!(matches!(err, Error::Writable { mode: 0o777, .. }), "{err}");
    assert!(err.to_string().contains("chmod go-w"), "{err}");
    assert_eq!(mode(&dir), 0o777, "a configured directory is never changed");
}

#[test]
fn runtime_root_prefers_a_private_xdg_runtime_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    chmod(tmp.path(), 0o700);
    assert_eq!(
        runtime_root_from(Some(tmp.path().to_path_buf())),
        tmp.path().join("rb")
    );
    let fallback = PathBuf::from(format!("/tmp/rb-{}", euid()));
    assert_eq!(runtime_root_from(None), fallback);
    assert_eq!(runtime_root_from(Some("run/user".into())), fallback);
    assert_eq!(runtime_root_from(Some(tmp.path().join("none"))), fallback);
    chmod(tmp.path(), 0o777);
    assert_eq!(
        runtime_root_from(Some(tmp.path().to_path_buf())),
        fallback,
        "an XDG_RUNTIME_DIR others can write is not used"
    );
}

/// Another local user's directory, or a symlink, where `/tmp/rb-<uid>` would be: one
/// `mkdir` by them took a host out of the lab (every daemon restart exited 1). The name is
/// still refused, and the root falls back to a directory under our home.
#[test]
fn a_planted_tmp_root_falls_back_to_home_and_is_never_used() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).expect("home");
    let target = tmp.path().join("elsewhere");
    std::fs::create_dir(&target).expect("target");
    let planted = tmp.path().join("rb-planted");
    std::os::unix::fs::symlink(&target, &planted).expect("symlink");
    let root = tmp_or_fallback(planted.clone(), Some(home.clone()));
    assert!(
        root.starts_with(home.join(".local/state/rb")),
        "{}",
        root.display()
    );
    assert!(refusal(&planted).is_some_and(|e| matches!(e, Error::Symlink { .. })));
    ensure_root_dir(&root).expect("the fallback is created, parents too");
    assert_eq!(mode(&root), 0o700);
    assert_eq!(std::fs::read_dir(&target).expect("target").count(), 0);

    // Absent, or ours: the name in /tmp is used as before.
    let absent = tmp.path().join("rb-absent");
    assert_eq!(tmp_or_fallback(absent.clone(), Some(home.clone())), absent);
    // Without a home there is no fallback: the refusal stays the error it was.
    assert_eq!(tmp_or_fallback(planted.clone(), None), planted);

    if is_root() {
        // Another user's 0777 directory.
        let theirs = tmp.path().join("rb-theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        chmod(&theirs, 0o777);
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).expect("chown");
        let root = tmp_or_fallback(theirs.clone(), Some(home.clone()));
        assert!(root.starts_with(&home), "{}", root.display());
    }
}
