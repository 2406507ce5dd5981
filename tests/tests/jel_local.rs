//! JEL, local tier: a pool hosted by `jel::host::PoolHost` (the `rb-jel-host`
//! example, until the agent hosts pools) driven by real client processes: `rb-jel` (shell),
//! `jel.py`, the C library. Joins, leaves, deaths within 100 ms of a member's exit,
//! re-election when the winner is killed, `watch --from` resuming with no gap or duplicate,
//! `watch --exec` running its script per event.

use std::{
    io::{BufRead, BufReader, Lines, Write},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use tests::{bin, bin_dir, wait_until};

/// The example that hosts a pool, built once (it needs the jel crate's `tokio` feature).
fn host_program() -> &'static PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let dir = bin_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "jel", "--features", "tokio"]);
        cmd.args(["--example", "rb-jel-host"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        assert!(
            cmd.status().expect("cargo").success(),
            "building rb-jel-host"
        );
        dir.join("examples/rb-jel-host")
    })
}

/// A hosted pool in a temp dir; killed on drop.
struct Pool {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Pool {
    fn start() -> Pool {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("jel.sock");
        let mut child = Command::new(host_program())
            .arg(&path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("rb-jel-host");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let ready = stdout.next().and_then(Result::ok);
        assert_eq!(ready.as_deref(), Some("ready"));
        Pool {
            child,
            stdin,
            stdout,
            path,
            _dir: dir,
        }
    }

    /// A job event (`granted nodeb`, `terminate`…); returns once it is handled.
    fn event(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write");
        if line != "terminate" {
            let ok = self.stdout.next().and_then(Result::ok);
            assert_eq!(ok.as_deref(), Some("ok"), "{line}");
        }
    }

    /// `rb-jel ARGS` in the job.
    fn rb_jel(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin("rb-jel"));
        cmd.args(args).env("RB_JEL", &self.path);
        cmd.env_remove("RB_JEL_MEMBER").env_remove("JEL_MEMBER");
        cmd
    }

    fn run(&self, args: &[&str]) -> Output {
        self.rb_jel(args).output().expect("rb-jel")
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process whose stdout lines we read (killed on drop).
struct Reader {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Reader {
    fn spawn(mut cmd: Command) -> Reader {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Reader { child, lines }
    }

    fn line(&mut self) -> String {
        self.lines.next().expect("a line").expect("read")
    }

    /// The next event (a `--json` line) matching `hit`.
    fn event(&mut self, hit: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        loop {
            let line = self.line();
            let v: serde_json::Value = serde_json::from_str(&line).expect(&line);
            if hit(&v) {
                return v;
            }
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kind(v: &serde_json::Value) -> &str {
    v["event"].as_str().unwrap_or_default()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn outside_a_job_rb_jel_says_so_and_exits_2() {
    let out = Command::new(bin("rb-jel"))
        .arg("members")
        .env_remove("RB_JEL")
        .output()
        .expect("rb-jel");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not inside a ResourceBroker job"), "{err}");
    let gone = Command::new(bin("rb-jel"))
        .args(["result", "master"])
        .env("RB_JEL", "/nonexistent/jel.sock")
        .output()
        .expect("rb-jel");
    assert_eq!(gone.status.code(), Some(2), "{gone:?}");
    assert!(String::from_utf8_lossy(&gone.stderr).contains("not inside a ResourceBroker job"));
}

#[test]
fn a_process_that_cleaned_its_environment_finds_the_pool_in_its_ancestry() {
    let pool = Pool::start();
    // sh is started with RB_JEL; rb-jel, exec'd by `env -i`, has nothing.
    let cleaned = Command::new("sh")
        .args(["-c", r#"env -i "$0" result nobody; echo "status $?""#])
        .arg(bin("rb-jel"))
        .env("RB_JEL", &pool.path)
        .output()
        .expect("sh");
    assert_eq!(stdout(&cleaned), "status 1", "the pool answered: no winner");
    let members = Command::new("sh")
        .args(["-c", r#"env -i "$0" members --json"#])
        .arg(bin("rb-jel"))
        .env("RB_JEL", &pool.path)
        .output()
        .expect("sh");
    assert_eq!(stdout(&members), "[]", "{members:?}");
}

#[test]
fn join_runs_cmd_as_a_member_leaves_on_success_and_dies_within_100_ms_of_its_exit() {
    let pool = Pool::start();
    let mut watch = Reader::spawn(pool.rb_jel(&["watch", "--json"]));
    // CMD is the member: its own rb-jel commands act as it, and it exits with CMD's status.
    let script = r#"test "$JEL_MEMBER" = 1 && "$0" elect master && "$0" members --json"#;
    let out = pool.run(&[
        "join",
        "--name",
        "boss",
        "--",
        "sh",
        "-c",
        script,
        bin("rb-jel").to_str().expect("utf8"),
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let (winner, members) = text.split_once('\n').expect("two lines");
    assert_eq!(winner, "boss");
    let rows: serde_json::Value = serde_json::from_str(members).expect("json");
    assert_eq!(rows[0]["name"], "boss");
    assert_eq!(
        rows.as_array().map(Vec::len),
        Some(1),
        "the member, not a second one"
    );
    let joined = watch.event(|v| kind(v) == "joined");
    assert_eq!(joined["member"]["name"], "boss");
    watch.event(|v| kind(v) == "elected");
    let left = watch.event(|v| kind(v) != "elected");
    assert_eq!(
        (kind(&left), &left["member"]["id"]),
        ("left", &joined["member"]["id"])
    );
    // A member whose CMD is killed: died{exited} within 100 ms.
    let mut member = pool
        .rb_jel(&["join", "--", "sleep", "60"])
        .spawn()
        .expect("join");
    let joined = watch.event(|v| kind(v) == "joined");
    let sleep = wait_until(Duration::from_secs(10), || child_of(member.id())).expect("sleep");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sleep as i32),
        nix::sys::signal::SIGKILL,
    )
    .expect("kill");
    let killed = Instant::now();
    let died = watch.event(|v| kind(v) == "died");
    let latency = killed.elapsed();
    assert_eq!(died["member"]["id"], joined["member"]["id"]);
    assert_eq!(died["reason"], "exited");
    assert!(
        latency < Duration::from_millis(100),
        "died after {latency:?}"
    );
    assert_eq!(
        member.wait().expect("wait").code(),
        Some(128 + 9),
        "CMD's status"
    );
}

/// The pid of `parent`'s first child, from /proc.
fn child_of(parent: u32) -> Option<u32> {
    let path = format!("/proc/{parent}/task/{parent}/children");
    let text = std::fs::read_to_string(path).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// The C test program (`jel/tests/c/member.c`), built against the libjel.so next to the
/// binaries, as users build theirs.
fn c_member() -> &'static PathBuf {
    static PROGRAM: OnceLock<PathBuf> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let dir = bin_dir();
        let jel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../jel");
        let exe = dir.join("jel-member-local-test");
        let status = Command::new("cc")
            .args(["-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .arg(jel.join("tests/c/member.c"))
            .arg("-I")
            .arg(dir)
            .arg("-L")
            .arg(dir)
            .args(["-ljel"])
            .arg(format!("-Wl,-rpath,{}", dir.display()))
            .status()
            .expect("cc");
        assert!(status.success(), "compiling member.c against libjel.so");
        exe
    })
}

fn jel_py(pool: &Pool, args: &[&str]) -> Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../jel/jel.py");
    Command::new("python3")
        .arg(script)
        .args(args)
        .env("RB_JEL", &pool.path)
        .output()
        .expect("python3")
}

#[test]
fn the_winner_killed_gives_shell_c_and_python_the_next_candidate() {
    let pool = Pool::start();
    let mut watch = Reader::spawn(pool.rb_jel(&["watch", "--json"]));
    let rb_jel = bin("rb-jel");
    let script = r#""$0" elect master && exec sleep 60"#;
    let mut first = Reader::spawn(pool.rb_jel(&[
        "join",
        "--name",
        "first",
        "--",
        "sh",
        "-c",
        script,
        rb_jel.to_str().expect("utf8"),
    ]));
    assert_eq!(first.line(), "first");
    let mut cmd = Command::new(c_member());
    cmd.arg("c").env("RB_JEL", &pool.path);
    let mut c = Reader::spawn(cmd);
    let said = c.line();
    assert!(
        said.starts_with("first 1 "),
        "the C member sees the first winner: {said}"
    );
    let c_id: u64 = said
        .rsplit(' ')
        .next()
        .and_then(|id| id.parse().ok())
        .expect("id");
    // rb-jel join itself is killed: its connection closes (its sleep goes too).
    let sleep = wait_until(Duration::from_secs(10), || child_of(first.child.id())).expect("sleep");
    first.child.kill().expect("kill");
    first.child.wait().expect("wait");
    let sleep = nix::unistd::Pid::from_raw(sleep as i32);
    let _ = nix::sys::signal::kill(sleep, nix::sys::signal::SIGKILL); // gone already is fine
    let elected = watch.event(|v| kind(v) == "elected" && v["epoch"] == 2);
    assert_eq!(elected["winner"]["id"], c_id);
    assert_eq!(stdout(&pool.run(&["result", "master"])), "c");
    assert_eq!(stdout(&jel_py(&pool, &["result", "master"])), "c");
    // The C member acts on a signal addressed to it by name, then leaves.
    let out = pool.run(&["signal", "go", "c"]);
    assert!(out.status.success(), "{out:?}");
    assert!(c.line().contains(r#""event":"signal","name":"go""#));
    assert!(c.child.wait().expect("wait").success());
    watch.event(|v| kind(v) == "left" && v["member"]["id"] == c_id);
    let none = pool.run(&["result", "master"]);
    assert_eq!(none.status.code(), Some(1), "no candidate left: no winner");
}

#[test]
fn watch_from_resumes_with_no_gap_and_no_duplicate_as_jel_py_sees_the_stream() {
    let mut pool = Pool::start();
    for host in ["nodeb", "nodec", "noded"] {
        pool.event(&format!("granted {host}"));
        let out = pool.run(&["join", "--", "true"]);
        assert!(out.status.success(), "{out:?}");
    }
    pool.event("reclaim nodeb 1764000005000");
    pool.event("released nodeb");
    // 3 × (granted, joined, left), vacate, host_released.
    let n = 11;
    let mut first = Reader::spawn(pool.rb_jel(&["watch", "--json"]));
    let mut got: Vec<String> = (0..4).map(|_| first.line()).collect();
    drop(first);
    let mut rest = Reader::spawn(pool.rb_jel(&["watch", "--json", "--from", "5"]));
    got.extend((4..n).map(|_| rest.line()));
    let py = jel_py(&pool, &["watch", "--from", "1", "--count", &n.to_string()]);
    assert!(py.status.success(), "{py:?}");
    let want: Vec<&str> = std::str::from_utf8(&py.stdout)
        .expect("utf8")
        .lines()
        .collect();
    assert_eq!(got, want);
    let seqs: Vec<u64> = got
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["seq"]
                .as_u64()
                .expect("seq")
        })
        .collect();
    assert_eq!(seqs, (1..=n as u64).collect::<Vec<_>>());
    pool.event("terminate");
    let closed = rest.event(|v| kind(v) == "terminated");
    assert_eq!(closed["seq"], n as u64 + 2, "closed, then terminated");
    assert!(
        rest.child.wait().expect("wait").success(),
        "watch ends with the stream"
    );
}

/// A watch ended by SIGTERM prints the events already on its connection first, then dies
/// of it: a host's reclaim delivers `vacate` and sends SIGTERM right after, sooner than a
/// loaded host may run the watch to read it (the lab test
/// `a_release_is_vacate_on_the_host_before_sigterm_then_left_or_died_vacated` failed so once
/// in session 27). Made certain here: the watch is stopped, the `vacate` written to its
/// connection, SIGTERM sent, then SIGCONT: the SIGTERM is there before the watch runs again.
#[test]
fn a_watch_ended_by_sigterm_prints_the_events_already_delivered_then_dies_of_it() {
    use nix::sys::signal::{kill, Signal};
    use std::os::unix::process::ExitStatusExt;
    let mut pool = Pool::start();
    pool.event("granted nodeb");
    let mut watch = Reader::spawn(pool.rb_jel(&["watch", "--json"]));
    watch.event(|v| kind(v) == "host_granted");
    let pid = watch.child.id();
    let signal = |sig| kill(nix::unistd::Pid::from_raw(pid as i32), sig).expect("kill");
    signal(Signal::SIGSTOP);
    let stopped = wait_until(Duration::from_secs(10), || {
        tests::proc_stat(pid).filter(|f| f[0] == "T").map(|_| ())
    });
    assert!(stopped.is_some(), "the watch stopped");
    // `ok` comes once the pool's lines are written: the `vacate` is on the connection.
    pool.event("reclaim nodeb 1764000005000");
    signal(Signal::SIGTERM);
    signal(Signal::SIGCONT);
    let vacate = watch.event(|v| kind(v) == "vacate");
    assert_eq!(vacate["host"], "nodeb", "{vacate}");
    assert!(watch.lines.next().is_none(), "nothing after it");
    let status = watch.child.wait().expect("wait");
    assert_eq!(status.signal(), Some(Signal::SIGTERM as i32), "{status:?}");
}

#[test]
fn watch_exec_runs_the_script_once_per_event_with_the_jel_variables() {
    let mut pool = Pool::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("events");
    let script = format!(
        r#"read -r json; echo "$JEL_SEQ $JEL_EVENT m=$JEL_MEMBER h=$JEL_HOST ${{#json}}" >> {}"#,
        log.display()
    );
    let mut watch = pool
        .rb_jel(&["watch", "--exec", &script])
        .spawn()
        .expect("watch");
    pool.event("granted nodeb");
    // Watching once its script ran for the first event: a watch still starting when the
    // job ends finds no pool (the pool host's own test covers one that connected in time).
    let watching = wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&log)
            .ok()
            .filter(|t| t.contains('\n'))
    });
    assert!(
        watching.is_some(),
        "the watch ran its script for host_granted"
    );
    let out = pool.run(&["join", "--name", "w", "--", "true"]);
    assert!(out.status.success(), "{out:?}");
    pool.event("terminate");
    let done = wait_until(Duration::from_secs(10), || watch.try_wait().ok().flatten());
    assert!(done.expect("watch ends with the stream").success());
    let text = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.rsplit_once(' ').expect("length").0.to_string())
        .collect();
    assert_eq!(
        lines,
        [
            "1 host_granted m= h=nodeb",
            "2 joined m=1 h=front",
            "3 left m=1 h=front",
            "4 closed m= h=",
            "5 terminated m= h=",
        ]
    );
    assert!(
        text.lines().all(|l| !l.ends_with(" 0")),
        "the event's JSON on stdin"
    );
}
