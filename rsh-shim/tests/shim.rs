//! Black-box tests of the built `rsh` binary: pass-through, symbolic and allocated hosts
//! against a fake agent (a unix listener on a thread), errors, the recursion guard, and (run
//! with `--ignored --nocapture`) the pass-through overhead.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::symlink;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use proto::agent::{ShimReply, ShimRequest};

const SHIM: &str = env!("CARGO_BIN_EXE_rsh");
const USAGE: &str = "usage: rsh [-nd] [-l login] host [command]\n";

/// Prints its argv, its pid, RB_SHIM_DEPTH and its stdin (to EOF), then exits 42.
const ECHO: &str = r#"#!/bin/sh
printf 'ARG:%s\n' "$@"
echo "PID:$$"
echo "DEPTH:$RB_SHIM_DEPTH"
echo "STDIN:"
cat
exit 42
"#;

/// A fake remote shell: prints its argv and its parent (the shim that ran it), then runs its
/// last argument with `sh -c`.
const FAKE_REMOTE_SHELL: &str = r#"#!/bin/sh
printf 'RSH:%s\n' "$@"
echo "PID:$PPID"
for last in "$@"; do :; done
exec /bin/sh -c "$last"
"#;

/// A fake subagent: prints its argv, then runs the word after `-c` with `sh -c`.
const FAKE_SUBAGENT: &str = r#"#!/bin/sh
printf 'SUB:%s\n' "$@"
while [ "$#" -gt 0 ] && [ "$1" != -c ]; do shift; done
exec /bin/sh -c "$2"
"#;

fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    common::write_script(&path, body);
    path
}

/// The shim with a clean environment (no RB_* from whoever runs the tests).
fn shim(args: &[&str]) -> Command {
    let mut cmd = Command::new(SHIM);
    cmd.args(args).env_clear().env("PATH", "/usr/bin:/bin");
    cmd
}

fn run(mut cmd: Command, stdin: &[u8]) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn shim");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin).expect("write stdin");
    drop(input);
    child.wait_with_output().expect("wait")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn real_rsh(path: &Path) -> String {
    serde_json::to_string(&[path.to_string_lossy()]).expect("json")
}

#[test]
fn pass_through_relays_argv_stdin_status_and_writes_no_stderr() {
    let dir = tempfile::tempdir().expect("tempdir");
    let echo = script(dir.path(), "real rsh", ECHO);
    let args = [
        "nodeb",
        "-l",
        "alice",
        "/usr/bin/pvmd -s -d0x0 -nnodeb 1 0a4d0001:aca2 4080 2 0a4d0002:0000",
    ];
    let mut cmd = shim(&args);
    cmd.env("RB_REAL_RSH", real_rsh(&echo));
    let out = run(cmd, b"PVM_VMID=3\nlast line without newline");
    assert_eq!(out.status.code(), Some(42));
    assert_eq!(text(&out.stderr), "");
    let stdout = text(&out.stdout);
    let want_args: String = args.iter().map(|a| format!("ARG:{a}\n")).collect();
    assert!(stdout.starts_with(&want_args), "{stdout}");
    assert!(stdout.contains("DEPTH:1\n"), "{stdout}");
    assert!(
        stdout.ends_with("STDIN:\nPVM_VMID=3\nlast line without newline"),
        "{stdout}"
    );
}

#[test]
fn pass_through_keeps_leading_arguments_and_odd_words() {
    let dir = tempfile::tempdir().expect("tempdir");
    let echo = script(dir.path(), "echo", ECHO);
    let var =
        serde_json::to_string(&[echo.to_string_lossy().as_ref(), "-F", "/x/cfg"]).expect("json");
    let args = [
        "-x",
        "bob@node07",
        "-p",
        "2222",
        " PATH=/p:$PATH ; export PATH ; orted",
        "\"env\"",
        "",
    ];
    let mut cmd = shim(&args);
    cmd.env("RB_REAL_RSH", var).env("RB_SHIM_DEPTH", "2");
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(42));
    let stdout = text(&out.stdout);
    let want: String = ["-F", "/x/cfg"]
        .iter()
        .chain(&args)
        .map(|a| format!("ARG:{a}\n"))
        .collect();
    assert!(stdout.starts_with(&want), "{stdout}");
    assert!(stdout.contains("DEPTH:3\n"), "{stdout}");
}

#[test]
fn pass_through_finds_the_real_rsh_in_path_skipping_the_shim() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ours, real) = (dir.path().join("ours"), dir.path().join("real"));
    std::fs::create_dir(&ours).expect("mkdir");
    std::fs::create_dir(&real).expect("mkdir");
    symlink(SHIM, ours.join("rsh")).expect("symlink");
    script(&real, "rsh", ECHO);
    let path = std::env::join_paths([&ours, &real, Path::new("/usr/bin"), Path::new("/bin")])
        .expect("PATH");
    let mut cmd = Command::new(ours.join("rsh"));
    cmd.args(["node07", "echo YES"])
        .env_clear()
        .env("PATH", path);
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("ARG:node07\nARG:echo YES\n"));
}

#[test]
fn hostname_link_passes_the_host_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let echo = script(dir.path(), "echo", ECHO);
    let link = dir.path().join("node03");
    symlink(SHIM, &link).expect("symlink");
    let mut cmd = Command::new(&link);
    cmd.args(["-l", "bob", "ls -l"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    cmd.env("RB_REAL_RSH", real_rsh(&echo));
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("ARG:node03\nARG:-l\nARG:bob\nARG:ls -l\n"));
}

/// A fake agent on a unix socket (a thread that lives as long as the test process).
struct FakeAgent {
    requests: mpsc::Receiver<ShimRequest>,
}

impl FakeAgent {
    /// The first request it got.
    fn join(&self) -> Result<ShimRequest, mpsc::RecvTimeoutError> {
        self.next()
    }

    /// The next request it got (within 10 s).
    fn next(&self) -> Result<ShimRequest, mpsc::RecvTimeoutError> {
        self.requests.recv_timeout(Duration::from_secs(10))
    }
}

/// A fake agent on `dir/agent.sock`: answers the first connection with `replies` (one JSON
/// per line) and waits for the shim to close it; answers every `taken_back` question (which
/// shims of earlier versions asked) with `not_taken_back`.
fn fake_agent(dir: &Path, replies: Vec<ShimReply>) -> (PathBuf, FakeAgent) {
    fake_agent_taken_back(dir, replies, None)
}

/// [`fake_agent`] whose answer to `taken_back` is `taken_back {host, message}` when given.
fn fake_agent_taken_back(
    dir: &Path,
    replies: Vec<ShimReply>,
    taken: Option<(&str, &str)>,
) -> (PathBuf, FakeAgent) {
    let socket = dir.join("agent.sock");
    let listener = UnixListener::bind(&socket).expect("bind");
    let taken = taken.map(|(h, m)| (h.to_string(), m.to_string()));
    let (tx, requests) = mpsc::channel();
    thread::spawn(move || {
        let mut first = Some(replies);
        while let Ok((stream, _)) = listener.accept() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            reader.read_line(&mut line).expect("read request");
            let request: ShimRequest = serde_json::from_str(&line).expect("request is JSON");
            let replies = match (&request, &taken) {
                (ShimRequest::TakenBack { alloc, .. }, Some((host, message))) => {
                    vec![ShimReply::TakenBack {
                        alloc: *alloc,
                        host: host.clone(),
                        message: message.clone(),
                    }]
                }
                (ShimRequest::TakenBack { alloc, .. }, None) => {
                    vec![ShimReply::NotTakenBack { alloc: *alloc }]
                }
                _ => first.take().unwrap_or_default(),
            };
            for reply in &replies {
                let mut text = serde_json::to_string(reply).expect("encode");
                text.push('\n');
                (&stream).write_all(text.as_bytes()).expect("write reply");
            }
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
            // What a granted call used (for `rb jobs`) is not a question: not recorded.
            if matches!(request, ShimRequest::Used { .. }) {
                continue;
            }
            if tx.send(request).is_err() {
                return;
            }
        }
    });
    (socket, FakeAgent { requests })
}

fn granted(remote_shell: &Path, subagent: &Path) -> ShimReply {
    ShimReply::Granted {
        alloc: 7,
        host: "node03".into(),
        address: "10.77.0.3".into(),
        remote_shell: vec![remote_shell.to_string_lossy().into_owned()],
        subagent: vec![
            subagent.to_string_lossy().into_owned(),
            "--alloc".into(),
            "7".into(),
        ],
    }
}

#[test]
fn symbolic_host_is_allocated_and_runs_under_the_subagent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote shell", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub'agent", FAKE_SUBAGENT);
    let replies = vec![
        ShimReply::Queued {
            position: 2,
            reason: None,
        },
        ShimReply::Queued {
            position: 1,
            reason: None,
        },
        granted(&remote, &sub),
    ];
    let (socket, agent) = fake_agent(dir.path(), replies);
    let command = "echo \"hi there\"; cat; exit 3";
    let mut cmd = shim(&["anyLinux", "-l", "bob", "-p", "2222", command]);
    cmd.env("RB_AGENT", &socket);
    let out = run(cmd, b"from stdin\n");
    let request = agent.join().expect("agent thread");
    assert_eq!(
        text(&out.stderr),
        "",
        "stderr is not a tty: no waiting notice"
    );
    assert_eq!(out.status.code(), Some(3));
    let remote_cmd = format!(
        "exec '{}' '--alloc' '7' -c 'echo \"hi there\"; cat; exit 3'",
        sub.display()
    )
    .replace("sub'agent", "sub'\\''agent");
    let stdout = text(&out.stdout);
    let mut lines = stdout.lines();
    let want = ["RSH:-l", "RSH:bob", "RSH:10.77.0.3"];
    assert_eq!(lines.by_ref().take(3).collect::<Vec<_>>(), want);
    assert_eq!(lines.next(), Some(format!("RSH:{remote_cmd}").as_str()));
    let pid_line = lines.next().expect("pid line");
    let want = [
        "SUB:--alloc",
        "SUB:7",
        "SUB:-c",
        "SUB:echo \"hi there\"; cat; exit 3",
        "hi there",
        "from stdin",
    ];
    assert_eq!(lines.collect::<Vec<_>>(), want);
    let ShimRequest::Allocate { symbolic, pid } = request else {
        panic!("not an allocate: {request:?}")
    };
    assert_eq!(symbolic, "anyLinux");
    assert_eq!(
        pid_line,
        format!("PID:{pid}"),
        "the request carries the pid of the remote shell's launcher (the shim, its parent)"
    );
    // The remote shell exited 3: nothing more asked.
    assert!(
        agent.requests.try_recv().is_err(),
        "asked after a non-zero exit"
    );
}

/// The remote shell exits 0 (netkit rsh does when the subagent ended the command
/// for a reclaim): the shim reads the agent's file (`proto::taken_back`), which says the
/// broker took the host back: exit 143 and one line on stderr. No file: the 0 stands,
/// nothing on stderr. The fake agent answers the old `taken_back` question the other way
/// round each time, so a shim that asked it instead of reading the file fails both halves.
#[test]
fn a_host_taken_back_while_the_command_ran_exits_143_with_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub", FAKE_SUBAGENT);
    let why = "reclaimed with 1000 ms of grace while the command ran; it was ended";
    let (socket, agent) = fake_agent(dir.path(), vec![granted(&remote, &sub)]);
    let files = proto::taken_back::dir_beside(&socket).expect("the job's directory");
    proto::taken_back::write(&files, 7, "node03", why).expect("the agent's file");
    let mut cmd = shim(&["anyLinux", "echo ran"]);
    cmd.env("RB_AGENT", &socket);
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        format!("rsh: node03 was taken back by the broker ({why})\n")
    );
    assert!(text(&out.stdout).ends_with("ran\n"));
    assert!(matches!(agent.join(), Ok(ShimRequest::Allocate { .. })));

    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub", FAKE_SUBAGENT);
    let (socket, agent) = fake_agent_taken_back(
        dir.path(),
        vec![granted(&remote, &sub)],
        Some(("node03", why)),
    );
    let mut cmd = shim(&["anyLinux", "echo ran"]);
    cmd.env("RB_AGENT", &socket);
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    assert!(matches!(agent.join(), Ok(ShimRequest::Allocate { .. })));
}

/// The shim waits for a granted host's remote shell: SIGTERM to the shim reaches it (callers
/// that kill their rsh still end the remote command), and a remote shell killed by a signal
/// leaves the shim killed by the same signal, as when the shim exec'd it.
#[test]
fn signals_reach_the_remote_shell_and_its_death_by_signal_is_ours() {
    use std::io::BufRead as _;
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub", FAKE_SUBAGENT);
    let (socket, _agent) = fake_agent(dir.path(), vec![granted(&remote, &sub)]);
    let command = "trap 'echo got TERM; exit 7' TERM; echo ready; i=0; \
                   while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done";
    let mut cmd = shim(&["anyLinux", command]);
    cmd.env("RB_AGENT", &socket)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn shim");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    while line != "ready\n" {
        line.clear();
        assert_ne!(stdout.read_line(&mut line).expect("read"), 0, "no `ready`");
    }
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: a plain kill of our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).expect("read");
    let status = child.wait().expect("wait");
    assert_eq!(rest, "got TERM\n");
    assert_eq!(
        status.code(),
        Some(7),
        "the remote shell's status: {status:?}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub", FAKE_SUBAGENT);
    let (socket, _agent) = fake_agent(dir.path(), vec![granted(&remote, &sub)]);
    let mut cmd = shim(&["anyLinux", "kill -USR1 $$"]);
    cmd.env("RB_AGENT", &socket);
    let out = run(cmd, b"");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGUSR1), "{:?}", out.status);
}

/// Off a terminal, a waiting call says why it waits once, and only when
/// `RB_VERBOSE` is set.
#[test]
fn waiting_call_logs_the_reason_once_off_a_terminal_with_rb_verbose() {
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub", FAKE_SUBAGENT);
    let queued = |position| ShimReply::Queued {
        position,
        reason: Some("1 matching host(s): 1 held by jobs".into()),
    };
    let replies = vec![queued(2), queued(1), granted(&remote, &sub)];
    let (socket, agent) = fake_agent(dir.path(), replies);
    let mut cmd = shim(&["anyLinux", "true"]);
    cmd.env("RB_AGENT", &socket).env("RB_VERBOSE", "1");
    let out = run(cmd, b"");
    agent.join().expect("agent thread");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        "rsh: waiting for a host for anyLinux (position 2): 1 matching host(s): 1 held by jobs\n\
         rsh: anyLinux: granted node03 (allocation 7) over rsh\n"
    );
}

#[test]
fn symbolic_host_with_no_stdin_flag_passes_n() {
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub", FAKE_SUBAGENT);
    let (socket, agent) = fake_agent(dir.path(), vec![granted(&remote, &sub)]);
    let mut cmd = shim(&["anyhost", "-n", "echo $SHELL"]);
    cmd.env("RB_AGENT", &socket).env("SHELL", "/bin/sh");
    let out = run(cmd, b"");
    agent.join().expect("agent thread");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("RSH:-n\nRSH:10.77.0.3\n"), "{stdout}");
    assert!(stdout.ends_with("/bin/sh\n"), "{stdout}");
}

#[test]
fn allocated_real_host_is_attached() {
    let dir = tempfile::tempdir().expect("tempdir");
    let remote = script(dir.path(), "remote", FAKE_REMOTE_SHELL);
    let sub = script(dir.path(), "sub", FAKE_SUBAGENT);
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "node03 10.77.0.3 7\n").expect("write hosts");
    let (socket, agent) = fake_agent(dir.path(), vec![granted(&remote, &sub)]);
    let mut cmd = shim(&["10.77.0.3", "echo ok"]);
    cmd.env("RB_AGENT", &socket).env("RB_HOSTS_FILE", &hosts);
    let out = run(cmd, b"");
    let request = agent.join().expect("agent thread");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).ends_with("SUB:echo ok\nok\n"));
    assert!(
        matches!(request, ShimRequest::Attach { ref host, .. } if host == "10.77.0.3"),
        "{request:?}"
    );
}

#[test]
fn unlisted_host_passes_through_despite_hosts_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let echo = script(dir.path(), "echo", ECHO);
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "node03 10.77.0.3 7\n").expect("write hosts");
    let mut cmd = shim(&["node04", "true"]);
    cmd.env("RB_REAL_RSH", real_rsh(&echo))
        .env("RB_HOSTS_FILE", &hosts);
    cmd.env("RB_AGENT", dir.path().join("no-such.sock"));
    assert_eq!(run(cmd, b"").status.code(), Some(42));
}

#[test]
fn refused_exits_1_with_the_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = ShimReply::Refused {
        message: "no host matches anyFoo".into(),
    };
    let (socket, agent) = fake_agent(dir.path(), vec![refused]);
    let mut cmd = shim(&["anyFoo", "true"]);
    cmd.env("RB_AGENT", &socket);
    let out = run(cmd, b"");
    agent.join().expect("agent thread");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stderr), "rsh: anyFoo: no host matches anyFoo\n");
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn a_lost_instance_exits_255_with_the_message() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lost = ShimReply::Lost {
        name: "anyLinux-1".into(),
        host: "node03".into(),
        message: "the broker took node03 back".into(),
    };
    let (socket, agent) = fake_agent(dir.path(), vec![lost]);
    let mut cmd = shim(&["anyLinux-1", "true"]);
    cmd.env("RB_AGENT", &socket);
    let out = run(cmd, b"");
    agent.join().expect("agent thread");
    assert_eq!(out.status.code(), Some(255));
    assert_eq!(
        text(&out.stderr),
        "rsh: anyLinux-1: the broker took node03 back\n"
    );
}

#[test]
fn a_name_launchers_refuse_is_refused_before_asking_anyone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = shim(&["anyX86_64", "true"]);
    cmd.env("RB_AGENT", dir.path().join("no-such.sock"));
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.starts_with("rsh: anyX86_64: "), "{stderr}");
    assert!(
        stderr.contains("help: a label's `_` reads as `-`"),
        "{stderr}"
    );
    assert!(stderr.contains("use `anyX86-64`"), "{stderr}");
}

#[test]
fn agent_closing_early_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("hangup.sock");
    let listener = UnixListener::bind(&socket).expect("bind");
    let hangup = thread::spawn(move || {
        let (stream, _) = listener.accept().expect("accept");
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).expect("read");
        (&stream)
            .write_all(b"{\"t\":\"queued\",\"position\":1}\n")
            .expect("write");
    });
    let mut cmd = shim(&["anyLinux", "true"]);
    cmd.env("RB_AGENT", &socket);
    let out = run(cmd, b"");
    hangup.join().expect("hangup thread");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("rsh: anyLinux: the agent at $RB_AGENT ("),
        "{stderr}"
    );
    assert!(stderr.contains("closed the connection"), "{stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "no waiting notice when stderr is not a tty: {stderr}"
    );
}

#[test]
fn unreachable_agent_names_rb_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = shim(&["anyLinux", "true"]);
    cmd.env("RB_AGENT", dir.path().join("missing.sock"));
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("rsh: cannot reach the agent at $RB_AGENT ("),
        "{stderr}"
    );
    assert!(stderr.contains("missing.sock"), "{stderr}");
}

#[test]
fn symbolic_host_needs_a_command() {
    let out = run(shim(&["-n", "anyLinux"]), b"");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "rsh: anyLinux: a symbolic host needs a command\n"
    );
}

#[test]
fn without_agent_a_symbolic_call_becomes_a_one_shot_job() {
    let shim_path = Path::new(SHIM).canonicalize().expect("canonical shim path");
    if shim_path.with_file_name("agent").exists() {
        eprintln!("skipped: a real `agent` is built next to the shim");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    script(dir.path(), "agent", ECHO);
    let path =
        std::env::join_paths([dir.path(), Path::new("/usr/bin"), Path::new("/bin")]).expect("PATH");
    let mut cmd = shim(&["anyLinux", "-n", "echo hi"]);
    cmd.env("PATH", path);
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    let want = format!(
        "ARG:--\nARG:{}\nARG:anyLinux\nARG:-n\nARG:echo hi\n",
        shim_path.display()
    );
    assert!(
        text(&out.stdout).starts_with(&want),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn without_agent_and_agent_program_a_symbolic_call_fails() {
    let shim_path = Path::new(SHIM).canonicalize().expect("canonical shim path");
    if shim_path.with_file_name("agent").exists() || Path::new("/usr/bin/agent").exists() {
        eprintln!("skipped: an `agent` program exists");
        return;
    }
    let out = run(shim(&["anyLinux", "echo hi"]), b"");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "rsh: anyLinux is symbolic but no agent is running and `agent` was not found\n"
    );
}

#[test]
fn depth_guard_refuses_at_4() {
    let mut cmd = shim(&["node07", "true"]);
    cmd.env("RB_SHIM_DEPTH", "4")
        .env("RB_REAL_RSH", "[\"/bin/true\"]");
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "rsh: refusing to recurse (RB_SHIM_DEPTH=4): is RB_REAL_RSH pointing at the shim?\n"
    );
}

#[test]
fn real_rsh_pointing_at_the_shim_stops_at_the_guard() {
    let mut cmd = shim(&["node07", "true"]);
    cmd.env("RB_REAL_RSH", real_rsh(Path::new(SHIM)));
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        "rsh: refusing to recurse (RB_SHIM_DEPTH=4): is RB_REAL_RSH pointing at the shim?\n"
    );
}

#[test]
fn usage_errors() {
    let out = run(shim(&[]), b"");
    assert_eq!(
        (out.status.code(), text(&out.stderr)),
        (Some(1), USAGE.to_string())
    );
    let out = run(shim(&["node07", "-z", "true"]), b"");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr),
        format!("rsh: invalid option -- 'z'\n{USAGE}")
    );
    let out = run(shim(&["node07", "-l"]), b"");
    assert_eq!(
        text(&out.stderr),
        format!("rsh: option requires an argument -- 'l'\n{USAGE}")
    );
}

#[test]
fn bad_real_rsh_variable_is_reported() {
    let mut cmd = shim(&["node07", "true"]);
    cmd.env("RB_REAL_RSH", "ssh -F x");
    let out = run(cmd, b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).starts_with("rsh: RB_REAL_RSH is not a non-empty JSON array"));
}

/// Median of `runs` timings of `make()`'s command.
fn median_time(runs: usize, make: impl Fn() -> Command) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let mut cmd = make();
            cmd.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let start = Instant::now();
            let status = cmd.status().expect("run");
            let took = start.elapsed();
            assert!(status.success());
            took
        })
        .collect();
    times.sort();
    times[runs / 2]
}

#[test]
#[ignore = "timing: run with --ignored --nocapture"]
fn pass_through_overhead() {
    const RUNS: usize = 200;
    let direct = median_time(RUNS, || Command::new("/bin/true"));
    let shimmed = median_time(RUNS, || {
        let mut cmd = shim(&["node07", "true"]);
        cmd.env("RB_REAL_RSH", "[\"/bin/true\"]");
        cmd
    });
    println!(
        "pass-through over {RUNS} runs: /bin/true median {direct:?}, rsh node07 true median {shimmed:?}, overhead {:?}",
        shimmed.saturating_sub(direct)
    );
}
