//! Another local user must not be able to make our programs use a
//! directory or a socket they control. Each test plays the attacker as root (user B) and
//! runs the victim's real program (user A) as a fresh uid of the 47xx range, which no other
//! test uses and which has no passwd entry, with `XDG_RUNTIME_DIR` unset, so the victim's
//! private root is `/tmp/rb-<uid>`. Needs root; skipped otherwise.

use std::{
    io::Read,
    os::unix::{
        fs::{MetadataExt, PermissionsExt},
        net::UnixListener,
        process::CommandExt,
    },
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use tests::bin;

fn skip_unless_root(test: &str) -> bool {
    if tests::is_root() {
        return false;
    }
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "skipped: {test}: needs root to act as other uids"
    );
    true
}

/// `program ARGS…` as `uid` (gid the same, no supplementary groups), with none of the
/// variables that would point it at a broker, an agent or a runtime directory.
fn as_uid(uid: u32, program: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .uid(uid)
        .gid(uid)
        .env("HOME", "/nonexistent")
        .stdin(Stdio::null());
    for var in [
        "XDG_RUNTIME_DIR",
        "RB_BROKER",
        "RB_LAB",
        "RB_AGENT",
        "RB_HOSTS_FILE",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// A path of the victim's private root that this test owns: removed before and after.
struct Planted(PathBuf);

impl Planted {
    fn new(path: impl Into<PathBuf>) -> Planted {
        let path = path.into();
        remove(&path);
        Planted(path)
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        remove(&self.0);
    }
}

fn remove(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path).expect("remove a planted dir"),
        Ok(_) => std::fs::remove_file(path).expect("remove a planted file"),
        Err(_) => {}
    }
}

/// A directory made by `owner`, mode 0777 (user B's trap).
fn open_dir_of(path: &Path, owner: u32) {
    std::fs::create_dir(path).expect("mkdir");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::os::unix::fs::chown(path, Some(owner), Some(owner)).expect("chown");
}

/// A world-writable scratch directory where the victim's app may leave a marker.
fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    dir
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn agent_refuses_a_runtime_dir_another_user_made_and_runs_nothing() {
    if skip_unless_root("agent_refuses_a_runtime_dir_another_user_made_and_runs_nothing") {
        return;
    }
    let (victim, attacker) = (4710, 4711);
    // Open to all (user B waits to swap `bin/rsh`), then closed (we could not even look).
    for mode in [0o777, 0o700] {
        agent_refuses_the_runtime_dir_of(victim, attacker, mode);
    }
}

fn agent_refuses_the_runtime_dir_of(victim: u32, attacker: u32, mode: u32) {
    let root = Planted::new(format!("/tmp/rb-{victim}"));
    open_dir_of(&root.0, attacker);
    std::fs::set_permissions(&root.0, std::fs::Permissions::from_mode(mode)).expect("chmod");
    let marks = scratch();
    let marker = marks.path().join("ran");
    let script = format!("echo ran > {}", marker.display());
    let out = as_uid(victim, &bin("agent"), &["--", "sh", "-c", &script])
        .output()
        .expect("run agent");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(77), "{err}");
    assert!(
        err.contains(&format!(
            "/tmp/rb-{victim} is owned by uid {attacker}, not by you"
        )),
        "{err}"
    );
    assert!(err.contains("help:"), "{err}");
    assert!(
        !marker.exists(),
        "the app ran in a directory user B controls"
    );
    let left: Vec<_> = std::fs::read_dir(&root.0)
        .expect("read the planted dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the agent wrote into user B's directory: {left:?}"
    );
}

#[test]
fn agent_without_a_passwd_entry_tightens_its_own_open_runtime_dir_and_runs() {
    if skip_unless_root("agent_without_a_passwd_entry_tightens_its_own_open_runtime_dir_and_runs") {
        return;
    }
    let user = 4712;
    let root = Planted::new(format!("/tmp/rb-{user}"));
    open_dir_of(&root.0, user);
    let marks = scratch();
    let marker = marks.path().join("ran");
    let script = format!("echo ran > {}", marker.display());
    let out = as_uid(user, &bin("agent"), &["--", "sh", "-c", &script])
        .output()
        .expect("run agent");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(marker.exists(), "the app ran");
    let meta = std::fs::symlink_metadata(&root.0).expect("stat");
    assert_eq!(
        meta.mode() & 0o7777,
        0o700,
        "our own open directory is tightened"
    );
}

#[test]
fn rb_demo_refuses_a_symlinked_runtime_dir_and_overwrites_nothing() {
    if skip_unless_root("rb_demo_refuses_a_symlinked_runtime_dir_and_overwrites_nothing") {
        return;
    }
    let (victim, attacker) = (4720, 4721);
    // The victim's precious file, in a directory of the victim's.
    let home = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(home.path(), Some(victim), Some(victim)).expect("chown");
    let precious = home.path().join("precious");
    std::fs::write(&precious, "keep me\n").expect("write");
    std::os::unix::fs::chown(&precious, Some(victim), Some(victim)).expect("chown");
    // User B's traps: the private root (and the old fixed log and state paths) as
    // symlinks or directories of theirs.
    let root = Planted::new(format!("/tmp/rb-{victim}"));
    let old_log = Planted::new(format!("/tmp/rb-demo-{victim}.log"));
    let old_dir = Planted::new(format!("/tmp/rb-demo-{victim}"));
    std::os::unix::fs::symlink(home.path(), &root.0).expect("symlink");
    std::os::unix::fs::symlink(&precious, &old_log.0).expect("symlink");
    open_dir_of(&old_dir.0, attacker);
    for link in [&root.0, &old_log.0] {
        std::os::unix::fs::lchown(link, Some(attacker), Some(attacker)).expect("lchown");
    }
    let out = as_uid(victim, &bin("rb"), &["demo", "--hosts", "1"])
        .output()
        .expect("run rb demo");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(77), "the demo ran: {err}");
    assert!(
        err.contains(&format!("/tmp/rb-{victim} is a symbolic link")),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&precious).expect("read"),
        "keep me\n",
        "a symlink made the demo overwrite the victim's file"
    );
    let written: Vec<_> = std::fs::read_dir(home.path())
        .expect("read")
        .chain(std::fs::read_dir(&old_dir.0).expect("read"))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p != &precious)
        .collect();
    assert!(
        written.is_empty(),
        "the demo wrote through user B's paths: {written:?}"
    );
}

/// A unix socket served by root (user B posing as the victim's broker or agent), in a
/// directory everyone can reach; records what clients send.
struct Impostor {
    _dir: tempfile::TempDir,
    path: PathBuf,
    listener: UnixListener,
}

impl Impostor {
    fn new() -> Impostor {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let path = dir.path().join("broker.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        listener.set_nonblocking(true).expect("nonblocking");
        Impostor {
            _dir: dir,
            path,
            listener,
        }
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("a UTF-8 path")
    }

    /// Runs `cmd` and returns its output and every byte it sent to the impostor (a client
    /// that sends something and then waits for the answer is killed after 20 s at most).
    fn hears(&self, mut cmd: Command) -> (Output, Vec<u8>) {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the client");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut heard = Vec::new();
        loop {
            let exited = child.try_wait().expect("wait").is_some();
            match self.listener.accept() {
                Ok((mut conn, _)) => {
                    conn.set_nonblocking(false).expect("blocking");
                    conn.set_read_timeout(Some(Duration::from_secs(2)))
                        .expect("timeout");
                    let mut buf = [0u8; 4096];
                    if let Ok(n) = conn.read(&mut buf) {
                        heard.extend_from_slice(&buf[..n]);
                    }
                }
                Err(_) if exited || !heard.is_empty() || Instant::now() > deadline => break,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        let _ = child.kill();
        (child.wait_with_output().expect("output"), heard)
    }
}

fn assert_refused_unheard(out: &Output, heard: &[u8], uid: u32) {
    let err = stderr(out);
    assert!(
        heard.is_empty(),
        "the client talked to a server of another uid: {}",
        String::from_utf8_lossy(heard)
    );
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!("is served by uid 0, not you (uid {uid})")),
        "{err}"
    );
    assert!(err.contains("someone may be posing as the"), "{err}");
}

#[test]
fn rb_refuses_a_broker_socket_served_by_another_uid() {
    if skip_unless_root("rb_refuses_a_broker_socket_served_by_another_uid") {
        return;
    }
    let impostor = Impostor::new();
    let cmd = as_uid(4730, &bin("rb"), &["--broker", impostor.path(), "status"]);
    let (out, heard) = impostor.hears(cmd);
    assert_refused_unheard(&out, &heard, 4730);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
}

#[test]
fn agent_refuses_a_broker_socket_served_by_another_uid() {
    if skip_unless_root("agent_refuses_a_broker_socket_served_by_another_uid") {
        return;
    }
    let user = 4731;
    let _root = Planted::new(format!("/tmp/rb-{user}"));
    let impostor = Impostor::new();
    let cmd = as_uid(
        user,
        &bin("agent"),
        &["--broker", impostor.path(), "--", "true"],
    );
    let (out, heard) = impostor.hears(cmd);
    assert_refused_unheard(&out, &heard, user);
    assert_eq!(out.status.code(), Some(77), "{}", stderr(&out));
}

#[test]
fn rsh_shim_refuses_an_agent_socket_served_by_another_uid() {
    if skip_unless_root("rsh_shim_refuses_an_agent_socket_served_by_another_uid") {
        return;
    }
    let impostor = Impostor::new();
    let mut cmd = as_uid(4732, &bin("rsh"), &["anyLinux", "id"]);
    cmd.env("RB_AGENT", impostor.path());
    let (out, heard) = impostor.hears(cmd);
    assert_refused_unheard(&out, &heard, 4732);
}

#[test]
fn preload_hint_is_not_sent_to_an_agent_socket_served_by_another_uid() {
    if skip_unless_root("preload_hint_is_not_sent_to_an_agent_socket_served_by_another_uid") {
        return;
    }
    let impostor = Impostor::new();
    let lib = bin("librb_preload.so");
    assert!(lib.exists(), "run `cargo build --workspace` first");
    let mut cmd = as_uid(4733, Path::new("getent"), &["hosts", "anyLinux"]);
    cmd.env("RB_AGENT", impostor.path()).env("LD_PRELOAD", &lib);
    let (out, heard) = impostor.hears(cmd);
    assert!(
        heard.is_empty(),
        "the hint went to a server of another uid: {}",
        String::from_utf8_lossy(&heard)
    );
    assert!(
        out.status.success(),
        "the lookup itself still works: {out:?}"
    );
    // The control: the same lookup as root (the impostor's own uid) is heard.
    let mut cmd = Command::new("getent");
    cmd.args(["hosts", "anyLinux"])
        .env("RB_AGENT", impostor.path())
        .env("LD_PRELOAD", &lib);
    let (_, heard) = impostor.hears(cmd);
    assert!(
        String::from_utf8_lossy(&heard).contains("anyLinux"),
        "the hint reaches an agent of our own uid"
    );
}

/// Runs `cmd` for at most `limit`; `None` when it was still running (then killed).
fn run_for(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let ended = tests::wait_until(limit, || child.try_wait().expect("wait"));
    if ended.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    ended.map(|_| out)
}

/// A lab file whose `broker.state_dir` is `state`; returns its path (in `dir`).
fn lab_file_with_state_dir(dir: &Path, state: &Path) -> PathBuf {
    let secret = dir.join("secret");
    proto::auth::write_new_secret(&secret, false).expect("secret");
    let text = tests::local_lab(1)
        .replace("@STATE@", &state.display().to_string())
        .replace("@SECRET@", &secret.display().to_string());
    let path = dir.join("lab.toml");
    std::fs::write(&path, text).expect("write lab");
    path
}

#[test]
fn a_state_dir_another_user_owns_or_others_can_write_is_refused_by_rb_check_and_rb_broker() {
    if skip_unless_root("a_state_dir_another_user_owns_or_others_can_write_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let lab = lab_file_with_state_dir(dir.path(), &state);
    let lab = lab.to_str().expect("UTF-8");
    std::fs::create_dir(&state).expect("mkdir");
    for (owner, mode, says) in [
        (0, 0o777, "can be written by group or others (mode 0777)"),
        (4740, 0o700, "is owned by uid 4740, not by you"),
    ] {
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode)).expect("chmod");
        std::os::unix::fs::chown(&state, Some(owner), Some(owner)).expect("chown");
        let check = tests::rb(&["check", lab]);
        let err = stderr(&check);
        assert_eq!(check.status.code(), Some(64), "rb check: {err}");
        assert!(
            err.contains("broker.state_dir") && err.contains(says),
            "{err}"
        );
        assert!(err.contains("help:"), "{err}");
        let mut cmd = Command::new(bin("rb-broker"));
        cmd.args(["--lab", lab]).env_remove("RB_LAB");
        let broker = run_for(cmd, Duration::from_secs(10)).expect("rb-broker started anyway");
        let err = stderr(&broker);
        assert_eq!(broker.status.code(), Some(64), "rb-broker: {err}");
        assert!(
            err.contains("broker.state_dir") && err.contains(says),
            "{err}"
        );
        assert!(
            !state.join("broker.sock").exists(),
            "the broker bound its socket there"
        );
    }
}

#[test]
fn rb_hostd_refuses_a_lock_dir_another_user_owns() {
    if skip_unless_root("rb_hostd_refuses_a_lock_dir_another_user_owns") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let locks = dir.path().join("locks");
    open_dir_of(&locks, 4741);
    let secret = dir.path().join("secret");
    proto::auth::write_new_secret(&secret, false).expect("secret");
    let mut cmd = Command::new(bin("rb-hostd"));
    cmd.args(["--broker", "127.0.0.1:9", "--host", "vhost01", "--lock-dir"])
        .arg(&locks)
        .arg("--secret-file")
        .arg(&secret);
    let out = run_for(cmd, Duration::from_secs(10)).expect("rb-hostd kept running");
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("is owned by uid 4741, not by you"), "{err}");
    let lock = locks.join("hostd-vhost01.lock");
    assert!(!lock.exists(), "the lock was taken in user B's directory");
}
