//! Tier 2, the command lines: what `rb`, `agent` and `rb-broker` say and which exit code
//! they give for bad input, bad configuration and a missing broker. The real binaries; no
//! root needed.

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
        "{HEADER}\n[[host]]\nname = \"node02\"\naddress = \"-oProxyCommand=/tmp/pwned\"\n"
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

/// `PROGRAM ARGS` with no broker named in the environment and `HOME` at `home` (so no lab
/// file unless the test writes one).
fn command_in(home: &Path, program: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(bin(program));
    cmd.args(args)
        .env_remove("RB_BROKER")
        .env_remove("RB_LAB")
        .env("HOME", home)
        .stdin(std::process::Stdio::null());
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run")
}

#[test]
fn agent_exits_127_for_a_missing_app_and_126_for_an_unexecutable_one() {
    let home = tempfile::tempdir().expect("tempdir");
    let out = run(command_in(home.path(), "agent", &["/nonexistent"]));
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert!(stderr(&out).contains("/nonexistent: No such file or directory"));
    let out = run(command_in(
        home.path(),
        "agent",
        &["no-such-program-rb", "x"],
    ));
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert!(stderr(&out).contains("no-such-program-rb: command not found"));
    let script = home.path().join("job.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = run(command_in(
        home.path(),
        "agent",
        &[script.to_str().expect("utf8")],
    ));
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bad_broker_value_exits_64_from_agent_and_rb() {
    let home = tempfile::tempdir().expect("tempdir");
    let out = run(command_in(
        home.path(),
        "agent",
        &["--broker", "node01", "true"],
    ));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--broker `node01`"),
        "{}",
        stderr(&out)
    );
    let out = run(command_in(
        home.path(),
        "rb",
        &["--broker", "node01", "status"],
    ));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("help: "), "{}", stderr(&out));
}

#[test]
fn rb_release_refuses_a_nan_negative_or_infinite_grace_period() {
    let home = tempfile::tempdir().expect("tempdir");
    let sock = home.path().join("broker.sock");
    let sock = sock.to_str().expect("utf8");
    for grace in ["NaN", "-1", "inf", "1e9"] {
        let flag = format!("--grace-s={grace}");
        let out = run(command_in(
            home.path(),
            "rb",
            &["release", "node03", &flag, "--broker", sock],
        ));
        assert_eq!(out.status.code(), Some(64), "{grace}: {}", stderr(&out));
        assert!(stderr(&out).contains("--grace-s"), "{}", stderr(&out));
    }
}

#[test]
fn rb_refuses_a_broker_flag_where_it_means_nothing() {
    let home = tempfile::tempdir().expect("tempdir");
    let argv = ["--broker", "/tmp/x.sock", "rsl", "check", "x=1"];
    let out = run(command_in(home.path(), "rb", &argv));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains("--broker means nothing to `rb rsl`"));
    let out = run(command_in(home.path(), "rb", &["rsl", "check", "--help"]));
    assert!(!stdout(&out).contains("--broker"), "{}", stdout(&out));
}

#[test]
fn rb_rsl_exits_64_for_every_kind_of_bad_input() {
    let home = tempfile::tempdir().expect("tempdir");
    for argv in [
        ["rsl", "check", "&(x=1"],
        ["rsl", "check", "@/nonexistent/job.rsl"],
        ["rsl", "spec", "(cuont=4)"],
    ] {
        let out = run(command_in(home.path(), "rb", &argv));
        assert_eq!(out.status.code(), Some(64), "{argv:?}: {}", stderr(&out));
    }
}

#[test]
fn agent_with_rsl_leaves_the_apps_own_trailing_dash_dash_alone() {
    let broker = tests::Broker::start(&tests::local_lab(1));
    let home = tempfile::tempdir().expect("tempdir");
    let sock = broker.socket();
    let argv = [
        "--broker",
        sock.to_str().expect("utf8"),
        "--rsl",
        "&(count=1)",
        "--",
        "sh",
        "-c",
        "printf '%s\\n' \"$@\"",
        "sh",
        "--",
        "(module=\"pvm\")",
    ];
    let out = run(command_in(home.path(), "agent", &argv));
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "--\n(module=\"pvm\")\n");
}

#[test]
fn after_rb_init_the_readme_command_runs_on_an_embedded_broker_and_says_so() {
    let home = tempfile::tempdir().expect("tempdir");
    let user = format!("rbcli{}", std::process::id());
    let mut init = command_in(home.path(), "rb", &["init"]);
    init.env("USER", &user);
    let out = run(init);
    assert!(out.status.success(), "{}", stderr(&out));
    let lab = home.path().join(".config/rb/lab.toml");
    let text = std::fs::read_to_string(&lab).expect("lab file");
    assert!(text.contains("listen = \"127.0.0.1:0\""), "{text}");
    let readme = [
        "sh",
        "-c",
        "rsh anyLinux echo hello from a just-in-time host",
    ];
    let out = run(command_in(home.path(), "agent", &readme));
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert_eq!(stdout(&out), "hello from a just-in-time host\n");
    assert!(
        err.contains(&format!("no broker is running for {}", lab.display()))
            && err.contains("embedded single-machine broker"),
        "{err}"
    );
    // A lab named by --lab or RB_LAB never falls back: the error names it and its start.
    let lab_arg = lab.to_str().expect("utf8");
    let start = format!("rb-broker --lab {lab_arg} &");
    let out = run(command_in(
        home.path(),
        "agent",
        &["--lab", lab_arg, "true"],
    ));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&start), "{}", stderr(&out));
    let mut env_lab = command_in(home.path(), "agent", &["true"]);
    env_lab.env("RB_LAB", lab_arg);
    let out = run(env_lab);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&start), "{}", stderr(&out));
    let out = run(command_in(home.path(), "rb", &["--lab", lab_arg, "status"]));
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains(&start), "{}", stderr(&out));
}

#[test]
fn rb_init_without_user_writes_no_made_up_owner() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut init = command_in(home.path(), "rb", &["init"]);
    init.env_remove("USER");
    let out = run(init);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(home.path().join(".config/rb/lab.toml")).expect("lab file");
    assert!(!text.contains("owner = \"me\""), "{text}");
    let lab = home.path().join(".config/rb/lab.toml");
    let out = rb(&["check", lab.to_str().expect("utf8")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn logs_written_to_files_carry_no_colour_codes() {
    let broker = tests::Broker::start(&tests::local_lab(1));
    broker.wait_all_up(std::time::Duration::from_secs(10));
    let log = broker.log();
    assert!(log.contains("INFO"), "the broker logs at info: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "escape codes in broker.log:\n{log:?}"
    );
    let hostd_log = broker.state_dir().join("logs/hostd-vhost01.log");
    let hostd_log = std::fs::read_to_string(&hostd_log).unwrap_or_default();
    assert!(!hostd_log.contains('\u{1b}'), "{hostd_log:?}");
    let home = tempfile::tempdir().expect("tempdir");
    let sock = broker.socket();
    let mut agent = command_in(
        home.path(),
        "agent",
        &["--broker", sock.to_str().expect("utf8"), "true"],
    );
    agent.env("RB_LOG", "info");
    let out = run(agent);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("INFO"), "{}", stderr(&out));
    assert!(!stderr(&out).contains('\u{1b}'), "{:?}", stderr(&out));
}

#[test]
fn a_permission_error_on_the_socket_says_so_instead_of_asking_if_the_broker_runs() {
    if !tests::is_root() {
        eprintln!("skipped: needs root to act as another uid");
        return;
    }
    use std::os::unix::process::CommandExt;
    let broker = tests::Broker::start(&tests::local_lab(1));
    std::fs::set_permissions(broker.socket(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod");
    let home = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let sock = broker.socket();
    let sock = sock.to_str().expect("utf8");
    for (program, args) in [
        ("rb", vec!["--broker", sock, "status"]),
        ("agent", vec!["--broker", sock, "true"]),
    ] {
        let mut cmd = command_in(home.path(), program, &args);
        cmd.uid(65534).gid(65534);
        let out = run(cmd);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(77), "{program}: {err}");
        assert!(
            err.contains("Permission denied") && err.contains("not yours"),
            "{program}: {err}"
        );
        assert!(!err.contains("is rb-broker running"), "{program}: {err}");
    }
}

#[test]
fn rb_hostd_refuses_a_broker_value_it_could_never_reach() {
    let home = tempfile::tempdir().expect("tempdir");
    let lock = home.path().join("lock");
    let argv = [
        "--broker",
        "nonsense",
        "--host",
        "node02",
        "--lock-dir",
        lock.to_str().expect("utf8"),
    ];
    let mut child = command_in(home.path(), "rb-hostd", &argv)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rb-hostd");
    let status = tests::wait_until(std::time::Duration::from_secs(10), || {
        child.try_wait().ok().flatten()
    });
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        panic!("rb-hostd kept retrying a --broker value it can never reach");
    }
    assert_eq!(status.and_then(|s| s.code()), Some(64));
    let out = child.wait_with_output().expect("stderr");
    assert!(
        stderr(&out).contains("--broker `nonsense`"),
        "{}",
        stderr(&out)
    );
}

/// `rb policy check`: every shipped policy passes with a one-line summary; a misspelt hook
/// and a misspelt field exit 64 naming the file, line, column and key, with a `help:` line.
#[test]
fn rb_policy_check_accepts_the_shipped_policies_and_locates_errors() {
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    for name in ["paper", "desktop", "nights-and-weekends", "dedicated"] {
        let file = shipped.join(format!("{name}.toml"));
        let out = rb(&["policy", "check", file.to_str().expect("utf8")]);
        assert!(out.status.success(), "{name}: {}", stderr(&out));
        let text = stdout(&out);
        assert_eq!(text.lines().count(), 1, "one line: {text}");
        assert!(text.contains(": ok: "), "{text}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        ("start = 'true'\nvacte = 'false'\n", "2:1: key `vacte`"),
        ("start = 'host.lod1 < 1.0'\n", "1:"),
    ];
    for (text, want) in cases {
        let file = dir.path().join("bad.toml");
        std::fs::write(&file, text).expect("write");
        let out = rb(&["policy", "check", file.to_str().expect("utf8")]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{text}: {err}");
        assert!(err.starts_with(&format!("{}:", file.display())), "{err}");
        assert!(err.contains(want), "{text}: want {want} in {err}");
        assert!(err.contains("\nhelp: "), "{err}");
    }
}

#[test]
fn rb_check_reads_overflow_slurm_and_the_broker_refuses_a_bad_one() {
    let lab = LabFile::new(&format!(
        "{HEADER}\n[overflow.slurm]\nmax_nodes = 2\nlease_s = 600\n"
    ));
    let out = rb(&["check", lab.arg()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("overflow: slurm: up to 2 node(s), lease 10 min"),
        "{}",
        stdout(&out)
    );
    let lab = LabFile::new(&format!(
        "{HEADER}\n[overflow.slurm]\nmax_node = 2\nsbatch_args = [\"--time=5\"]\n"
    ));
    let out = rb(&["check", lab.arg()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    let at = format!("{}:8:1: overflow.slurm.max_node:", lab.arg());
    assert!(err.contains(&at), "no {at} in: {err}");
    assert!(err.contains("did you mean `max_nodes`"), "{err}");
    let out = broker_refuses(&lab.path);
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(stderr(&out).contains(&at), "{}", stderr(&out));
    let lab = LabFile::new(&format!(
        "{HEADER}\n[overflow.slurm]\nsbatch_args = [\"--time=5\"]\n"
    ));
    let out = rb(&["check", lab.arg()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains(":8:15: overflow.slurm.sbatch_args: `--time=5` is set by the broker"),
        "{err}"
    );
}

#[test]
fn rb_check_probe_says_when_slurm_cannot_be_asked() {
    // A lab file must name a host (or overflow onto Slurm) to pass `rb check` at all.
    let lab = LabFile::new(&format!("{HEADER}\n[[host]]\nname = \"node02\"\n"));
    let out = rb(&["check", "--probe", lab.arg()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("has no [overflow.slurm]: nothing to ask"));
    let lab = LabFile::new(&format!(
        "{HEADER}\n[overflow.slurm]\nsqueue = [\"/nonexistent/rb-squeue\"]\n"
    ));
    let out = rb(&["check", "--probe", lab.arg()]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains("overflow.slurm: cannot run `/nonexistent/rb-squeue`")
            && err.contains("help: install Slurm's client commands"),
        "{err}"
    );
    // Without --probe nothing is asked: the file itself is fine.
    assert_eq!(rb(&["check", lab.arg()]).status.code(), Some(0));
}

/// The broker's allocator runs with one arena (`broker/src/main.rs`: its peak RSS at 10k
/// hosts, issue 34): jemalloc's own statistics at exit say which options it read.
#[test]
fn the_broker_s_allocator_runs_with_one_arena() {
    let out = Command::new(bin("rb-broker"))
        .arg("--version")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .expect("rb-broker --version");
    assert!(out.status.success(), "{}", stderr(&out));
    let stats = format!("{}{}", stdout(&out), stderr(&out));
    assert!(
        stats.lines().any(|l| l.trim() == "opt.narenas: 1"),
        "jemalloc's statistics name one arena: {stats}"
    );
}
