//! Black-box tests of the built shim invoked as `ssh` (and `scp`, and as `rsh` with ssh's
//! arguments over netkit rsh): pass-through with the arguments unchanged, calls that open no
//! session, granted hosts over ssh and over rsh against a fake agent, refusals before any
//! allocation, `scp` told to use the job's ssh.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::symlink;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use proto::agent::{ShimReply, ShimRequest};

const SHIM: &str = env!("CARGO_BIN_EXE_rsh");

/// Prints its argv, then exits 42.
const ECHO: &str = "#!/bin/sh\nprintf 'ARG:%s\\n' \"$@\"\nexit 42\n";

/// A fake remote shell: prints its argv, then runs its last argument with `sh -c`.
const FAKE_REMOTE_SHELL: &str = "#!/bin/sh\nprintf 'RSH:%s\\n' \"$@\"\nfor last in \"$@\"; do :; done\nexec /bin/sh -c \"$last\"\n";

/// A fake subagent: runs the word after `-c` with `sh -c`.
const FAKE_SUBAGENT: &str = "#!/bin/sh\nwhile [ \"$#\" -gt 0 ] && [ \"$1\" != -c ]; do shift; done\nexec /bin/sh -c \"$2\"\n";

fn script(path: &Path, body: &str) -> PathBuf {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    common::write_script(path, body);
    path.to_path_buf()
}

/// A job-like layout: `bin/{ssh,scp,rsh}` → the shim, `real/` with fake real programs.
struct Layout {
    dir: tempfile::TempDir,
}

impl Layout {
    fn new() -> Layout {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("bin")).expect("mkdir");
        for name in ["ssh", "scp", "rsh"] {
            symlink(SHIM, dir.path().join("bin").join(name)).expect("link");
        }
        Layout { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `bin/NAME ARGS` with PATH = bin:real:/usr/bin:/bin and no RB_* variables.
    fn run(&self, name: &str, args: &[&str], envs: &[(&str, &Path)]) -> Output {
        let path = std::env::join_paths([
            self.path("bin"),
            self.path("real"),
            PathBuf::from("/usr/bin"),
            PathBuf::from("/bin"),
        ])
        .expect("PATH");
        let mut cmd = Command::new(self.path("bin").join(name));
        cmd.args(args).env_clear().env("PATH", path);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.output().expect("run the shim")
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn args_of(out: &Output, prefix: &str) -> Vec<String> {
    text(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(prefix).map(String::from))
        .collect()
}

/// A fake agent on `dir/agent.sock` answering its first connection with `replies` and
/// every `taken_back` with `not_taken_back`; the requests it got come out of the receiver.
fn fake_agent(dir: &Path, replies: Vec<ShimReply>) -> (PathBuf, mpsc::Receiver<ShimRequest>) {
    let socket = dir.join("agent.sock");
    let listener = UnixListener::bind(&socket).expect("bind");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut first = Some(replies);
        while let Ok((stream, _)) = listener.accept() {
            let mut line = String::new();
            BufReader::new(&stream)
                .read_line(&mut line)
                .expect("read request");
            let request: ShimRequest = serde_json::from_str(&line).expect("request is JSON");
            let replies = match &request {
                ShimRequest::TakenBack { alloc, .. } => {
                    vec![ShimReply::NotTakenBack { alloc: *alloc }]
                }
                _ => first.take().unwrap_or_default(),
            };
            for reply in &replies {
                let mut text = serde_json::to_string(reply).expect("encode");
                text.push('\n');
                let _ = (&stream).write_all(text.as_bytes());
            }
            // What a granted call used (for `rb jobs`) is not a question: not recorded.
            if matches!(request, ShimRequest::Used { .. }) {
                continue;
            }
            if tx.send(request).is_err() {
                return;
            }
        }
    });
    (socket, rx)
}

fn granted(remote_shell: &Path, subagent: &Path) -> ShimReply {
    ShimReply::Granted {
        alloc: 7,
        host: "node03".into(),
        address: "10.77.0.3".into(),
        remote_shell: vec![remote_shell.to_string_lossy().into_owned()],
        subagent: vec![subagent.to_string_lossy().into_owned()],
    }
}

#[test]
fn a_real_host_passes_through_to_the_real_ssh_unchanged() {
    let lay = Layout::new();
    script(&lay.path("real/ssh"), ECHO);
    let args = [
        "-o",
        "BatchMode=yes",
        "-x",
        "-p22",
        "bob@node07",
        "ls",
        "-l",
        "",
    ];
    let out = lay.run("ssh", &args, &[]);
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
    assert_eq!(args_of(&out, "ARG:"), args);
    // With RB_VERBOSE: one line naming the remote shell.
    let out = lay.run("ssh", &args, &[("RB_VERBOSE", Path::new("1"))]);
    let want = format!(
        "ssh: node07: pass-through to {}\n",
        lay.path("real/ssh").display()
    );
    assert_eq!(text(&out.stderr), want);
}

#[test]
fn calls_that_open_no_session_never_ask_for_a_host() {
    let lay = Layout::new();
    script(&lay.path("real/ssh"), ECHO);
    // An agent that is not there: asking it would fail the call.
    let gone = lay.path("none.sock");
    for args in [
        vec!["-G", "anyLinux"],
        vec!["-V"],
        vec!["-Q", "cipher"],
        vec!["-O", "check", "anyLinux-1"],
        vec!["-o", "ControlPath=/x", "-O", "exit", "anyLinux"],
    ] {
        let out = lay.run("ssh", &args, &[("RB_AGENT", &gone)]);
        assert_eq!(
            out.status.code(),
            Some(42),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(args_of(&out, "ARG:"), args);
    }
}

#[test]
fn a_symbolic_host_runs_under_the_subagent_over_the_jobs_ssh() {
    let lay = Layout::new();
    let remote = script(&lay.path("remote/ssh"), FAKE_REMOTE_SHELL);
    let sub = script(&lay.path("sub"), FAKE_SUBAGENT);
    let (socket, requests) = fake_agent(lay.dir.path(), vec![granted(&remote, &sub)]);
    let args = [
        "-x",
        "-oBatchMode=yes",
        "-n",
        "bob@anyLinux",
        "-p",
        "2222",
        "echo",
        "hi",
    ];
    let out = lay.run("ssh", &args, &[("RB_AGENT", &socket)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let want = [
        "-o",
        "HostKeyAlias=node03",
        "-n",
        "-l",
        "bob",
        "-p",
        "2222",
        "-x",
        "-o",
        "BatchMode=yes",
        "10.77.0.3",
        &format!("exec '{}' -c 'echo hi'", sub.display()),
    ];
    assert_eq!(args_of(&out, "RSH:"), want);
    assert!(text(&out.stdout).ends_with("hi\n"), "{}", text(&out.stdout));
    let request = requests
        .recv_timeout(Duration::from_secs(10))
        .expect("asked");
    assert!(
        matches!(request, ShimRequest::Allocate { ref symbolic, .. } if symbolic == "anyLinux"),
        "{request:?}"
    );
}

#[test]
fn over_the_jobs_rsh_what_means_something_is_translated_and_the_rest_dropped() {
    let lay = Layout::new();
    let remote = script(&lay.path("remote/rsh"), FAKE_REMOTE_SHELL);
    let sub = script(&lay.path("sub"), FAKE_SUBAGENT);
    let (socket, _requests) = fake_agent(lay.dir.path(), vec![granted(&remote, &sub)]);
    let real = serde_json::to_string(&[remote.display().to_string()]).expect("json");
    // pdsh -R ssh's call, with ansible's options.
    let args = [
        "-2",
        "-a",
        "-x",
        "-C",
        "-o",
        "ControlMaster=auto",
        "-o",
        "ControlPersist=60s",
        "-l",
        "bob",
        "anyLinux-1",
        "echo",
        "hi",
    ];
    let out = lay.run(
        "ssh",
        &args,
        &[("RB_AGENT", &socket), ("RB_REAL_RSH", Path::new(&real))],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let want = [
        "-l",
        "bob",
        "10.77.0.3",
        &format!("exec '{}' -c 'echo hi'", sub.display()),
    ];
    assert_eq!(args_of(&out, "RSH:"), want);
}

#[test]
fn what_cannot_work_fails_at_once_naming_the_option() {
    let lay = Layout::new();
    let gone = lay.path("none.sock");
    let rsh = r#"["rsh"]"#;
    for (args, want) in [
        (
            vec!["-L", "8080:x:80", "anyLinux", "true"],
            "ssh: -L 8080:x:80: the job's remote shell (rsh) forwards no ports\n",
        ),
        (
            vec!["-t", "anyLinux", "top"],
            "ssh: -t: the job's remote shell (rsh) gives no terminal\n",
        ),
        (
            vec!["-N", "anyLinux"],
            "ssh: -N: opens no session: nothing would run on the granted host\n",
        ),
        (
            vec!["anyLinux"],
            "ssh: anyLinux: an interactive login needs a terminal, which the job's remote shell (rsh) does not give; give a command\n",
        ),
        (
            vec!["-s", "anyLinux", "netconf"],
            "ssh: anyLinux: -s netconf: only the sftp subsystem runs on a granted host\n",
        ),
    ] {
        let out = lay.run(
            "ssh",
            &args,
            &[("RB_AGENT", &gone), ("RB_REAL_RSH", Path::new(rsh))],
        );
        assert_eq!(out.status.code(), Some(255), "{args:?}");
        assert_eq!(text(&out.stderr), want, "{args:?}");
    }
}

#[test]
fn the_sftp_subsystem_runs_the_hosts_sftp_server() {
    let lay = Layout::new();
    let remote = script(
        &lay.path("remote/ssh"),
        "#!/bin/sh\nprintf 'RSH:%s\\n' \"$@\"\n",
    );
    let sub = script(&lay.path("sub"), FAKE_SUBAGENT);
    let (socket, _requests) = fake_agent(lay.dir.path(), vec![granted(&remote, &sub)]);
    // How scp (SFTP mode) calls ssh.
    let args = [
        "-x",
        "-oPermitLocalCommand=no",
        "-oClearAllForwardings=yes",
        "-oRemoteCommand=none",
        "-oRequestTTY=no",
        "-oForwardAgent=no",
        "-l",
        "bob",
        "-s",
        "--",
        "anyLinux",
        "sftp",
    ];
    let out = lay.run("ssh", &args, &[("RB_AGENT", &socket)]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let got = args_of(&out, "RSH:");
    assert!(!got.contains(&"-s".to_string()), "{got:?}");
    let remote_command = got.last().expect("a command");
    assert!(
        remote_command.contains("/usr/lib/openssh/sftp-server"),
        "{got:?}"
    );
}

#[test]
fn scp_is_told_to_use_the_jobs_ssh() {
    let lay = Layout::new();
    script(&lay.path("real/scp"), ECHO);
    let out = lay.run("scp", &["-O", "f", "anyLinux-1:"], &[]);
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    let ssh = lay.path("bin/ssh").display().to_string();
    assert_eq!(
        args_of(&out, "ARG:"),
        ["-S", &ssh, "-O", "f", "anyLinux-1:"]
    );
}

/// Hydra's default launcher passes `-x`; with the job's remote shell netkit rsh a real host
/// used to get `rsh -x …` (`invalid option -- 'x'`, and mpiexec waited for ever).
#[test]
fn an_rsh_call_with_ssh_options_over_netkit_rsh_drops_them() {
    let lay = Layout::new();
    let real = script(&lay.path("real/rsh"), ECHO);
    let var = serde_json::to_string(&[real.display().to_string()]).expect("json");
    let proxy = "\"/usr/bin/hydra_pmi_proxy\" --control-port node02:4000 --proxy-id 0";
    let out = lay.run(
        "rsh",
        &["-x", "node03", proxy],
        &[("RB_REAL_RSH", Path::new(&var))],
    );
    assert_eq!(out.status.code(), Some(42), "{}", text(&out.stderr));
    assert_eq!(args_of(&out, "ARG:"), ["node03", proxy]);
    // What it cannot drop is refused at once, exit 255.
    let out = lay.run(
        "rsh",
        &["-t", "node03", "top"],
        &[("RB_REAL_RSH", Path::new(&var))],
    );
    assert_eq!(out.status.code(), Some(255));
    assert_eq!(
        text(&out.stderr),
        "rsh: -t: the job's remote shell (rsh) gives no terminal\n"
    );
}
