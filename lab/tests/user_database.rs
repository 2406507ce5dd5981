//! Lab tier: the hosts keep their users when the machine's user database changes.
//!
//! `useradd`, `passwd`, `vipw` replace `/etc/passwd` by writing a copy and renaming it over
//! the old file. Hosts must keep the lab user through that.
//!
//! This test replaces the machine's real `/etc/passwd` (byte for byte the same content,
//! same owner and mode, atomically by rename, under the shadow-utils lock), so it changes
//! no user of this machine. Labs built by earlier versions of the harness bind-mount their
//! passwd over `/etc/passwd` and would lose it, so the test first waits until no process
//! outside its own process tree has a mount on `/etc/passwd`.

mod common;

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{fchown, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::{ssh, stdout};
use lab::cli::LabCommand;

const PASSWD: &str = "/etc/passwd";
const COPY: &str = "/etc/passwd.rbtest";
/// The lock `lckpwdf(3)` takes; `useradd` and friends hold it while they edit.
const PWD_LOCK: &str = "/etc/.pwd.lock";

#[test]
fn lab_user_survives_passwd_replaced_by_rename() {
    if !common::root_or_skip() {
        return;
    }
    let lab = common::up(1, false);
    let user = lab.user().name.clone();
    assert_eq!(
        stdout(
            "before",
            &lab.exec_as_user("node02", &["id", "-un"]).expect("exec")
        ),
        user
    );

    wait_until_only_we_mount_on_passwd(Duration::from_secs(300));
    let (old_ino, new_ino) = replace_passwd_by_rename();
    assert_ne!(old_ino, new_ino, "{PASSWD} was not replaced");

    // `rb lab exec --user` (this is its code path) and the library call behind it.
    let code = lab::cli::run(LabCommand::Exec {
        lab: Some(lab.dir().to_path_buf()),
        user: true,
        host: "node02".into(),
        argv: vec!["true".into()],
    })
    .expect("`rb lab exec --user node02 true` after /etc/passwd was replaced");
    assert_eq!(code, 0, "`rb lab exec --user node02 true` exit code");
    assert_eq!(
        stdout(
            "exec --user",
            &lab.exec_as_user("node02", &["id", "-un"]).expect("exec")
        ),
        user
    );
    // A login as the lab user (sshd reads the host's passwd at every login).
    assert_eq!(
        stdout("ssh as the lab user", &ssh(&lab, "node02", true, "id -un")),
        user
    );
    common::down(lab);
}

/// Replaces `/etc/passwd` the way `useradd` does: an identical copy (same bytes, owner,
/// mode) written to [`COPY`], synced, then renamed over it, all under [`PWD_LOCK`].
/// Returns the inode numbers before and after.
fn replace_passwd_by_rename() -> (u64, u64) {
    let _lock = take_pwd_lock(Duration::from_secs(30));
    let meta = fs::metadata(PASSWD).expect("stat /etc/passwd");
    let bytes = fs::read(PASSWD).expect("read /etc/passwd");
    if let Err(e) = write_copy(&bytes, &meta) {
        let _ = fs::remove_file(COPY);
        panic!("cannot write {COPY} ({e}); {PASSWD} is untouched");
    }
    fs::rename(COPY, PASSWD).expect("rename the copy over /etc/passwd (the old file stays)");
    let after = fs::metadata(PASSWD).expect("stat the new /etc/passwd");
    assert_eq!(fs::read(PASSWD).expect("read"), bytes, "content changed");
    assert_eq!(
        (after.mode(), after.uid(), after.gid()),
        (meta.mode(), meta.uid(), meta.gid())
    );
    (meta.ino(), after.ino())
}

/// Writes [`COPY`] (replacing a leftover of an interrupted run) and checks it reads back.
fn write_copy(bytes: &[u8], meta: &fs::Metadata) -> std::io::Result<()> {
    match fs::remove_file(COPY) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(COPY)?;
    f.write_all(bytes)?;
    fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
    f.set_permissions(fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    f.sync_all()?;
    if fs::read(COPY)? != bytes {
        return Err(std::io::Error::other("the copy reads back different"));
    }
    Ok(())
}

/// `lckpwdf(3)`: a write lock on [`PWD_LOCK`], polled until `limit`. Held until dropped.
fn take_pwd_lock(limit: Duration) -> fs::File {
    let f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(PWD_LOCK)
        .expect("open /etc/.pwd.lock");
    // SAFETY: flock is plain data; all-zero is a valid value before the fields are set.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::F_WRLCK as libc::c_short;
    lock.l_whence = libc::SEEK_SET as libc::c_short;
    let deadline = Instant::now() + limit;
    loop {
        // SAFETY: the fd is open for the whole call and `lock` outlives it.
        if unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &lock) } == 0 {
            return f;
        }
        assert!(
            Instant::now() < deadline,
            "{PWD_LOCK} held for {limit:?}: is useradd stuck?"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls until no process outside this test's process tree lives in a mount namespace
/// with a mount on `/etc/passwd` (labs of earlier harness versions), so the rename breaks
/// nothing but what this test owns.
fn wait_until_only_we_mount_on_passwd(limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut reported = false;
    loop {
        let others = foreign_passwd_mounters();
        if others.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "after {limit:?}, processes outside this test still have a mount on {PASSWD}: \
             {others:?}\nhelp: these are labs of an earlier harness version; replacing \
             {PASSWD} would break them; run this test when they are gone"
        );
        if !reported {
            eprintln!("waiting for pids {others:?} (mounts on {PASSWD}) to go away");
            reported = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pids outside this process's tree whose mount namespace has a mount on `/etc/passwd`.
fn foreign_passwd_mounters() -> Vec<u32> {
    let mut binds_passwd: HashMap<String, bool> = HashMap::new();
    let mut found = Vec::new();
    for pid in all_pids() {
        let Ok(ns) = fs::read_link(format!("/proc/{pid}/ns/mnt")) else {
            continue;
        };
        let ns = ns.display().to_string();
        let mounted = *binds_passwd
            .entry(ns)
            .or_insert_with(|| has_passwd_mount(pid));
        if mounted && !descends_from_us(pid) {
            found.push(pid);
        }
    }
    found
}

fn all_pids() -> Vec<u32> {
    fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Whether the mount namespace of `pid` has something mounted on `/etc/passwd`
/// (field 5 of mountinfo is the mount point).
fn has_passwd_mount(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .map(|t| t.lines().any(|l| l.split(' ').nth(4) == Some(PASSWD)))
        .unwrap_or(false)
}

fn descends_from_us(mut pid: u32) -> bool {
    let me = std::process::id();
    while pid > 1 {
        if pid == me {
            return true;
        }
        match parent_of(pid) {
            Some(p) => pid = p,
            None => return false,
        }
    }
    false
}

/// The parent pid, from `/proc/PID/stat` (the field after the `)` closing the name).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}
