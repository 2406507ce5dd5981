//! Tier 2 for modules (`modules/CONTRACT.md`): two-phase growth, shrink on reclaim and halt
//! at job end, with small module scripts against a broker with virtual hosts. The real PVM
//! and LAM modules run in `modules_lab.rs`. No root needed.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use tests::{bin, local_lab, wait_until, Broker};

/// A temp dir with `NAME-grow`, `NAME-shrink`, `NAME-halt` scripts (`None`: left out).
fn module_dir(
    name: &str,
    grow: Option<&str>,
    shrink: Option<&str>,
    halt: Option<&str>,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    for (action, body) in [("grow", grow), ("shrink", shrink), ("halt", halt)] {
        let Some(body) = body else { continue };
        let path = dir.path().join(format!("{name}-{action}"));
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write module");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    dir
}

/// Files the job and the modules share with the test.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.path("log")).unwrap_or_default()
    }
    fn wait_log(&self, needle: &str, what: &str) {
        let seen = wait_until(Duration::from_secs(10), || {
            self.log().contains(needle).then_some(())
        });
        assert!(
            seen.is_some(),
            "{what}: `{needle}` not in the log:\n{}",
            self.log()
        );
    }
    fn stop_job(&self) {
        std::fs::write(self.path("stop"), "").expect("stop");
    }
}

/// The app: one symbolic rsh (its status and stderr logged), then wait for `stop` (or for
/// the scratch directory to go: a failed test leaves no app looping).
const APP: &str = r#"rsh anyLinux true 2>"$SCRATCH/rsh.err"; echo "rsh=$?" >>"$SCRATCH/log";
while [ ! -e "$SCRATCH/stop" ] && [ -d "$SCRATCH" ]; do sleep 0.05; done"#;

fn start_job(
    broker: &Broker,
    module: &str,
    modules: &Path,
    scratch: &Scratch,
    extra: &[&str],
) -> Child {
    start_app(broker, module, modules, scratch, extra, APP)
}

/// [`start_job`] with another app.
fn start_app(
    broker: &Broker,
    module: &str,
    modules: &Path,
    scratch: &Scratch,
    extra: &[&str],
    app: &str,
) -> Child {
    agent_command(broker, scratch)
        .args(["--grace-s", "1", "--rsl"])
        .arg(format!("&(adaptive=yes)(module=\"{module}\")"))
        .args(extra)
        .args(["--", "sh", "-c", app])
        .env("RB_MODULE_PATH", modules)
        .spawn()
        .expect("agent")
}

/// `agent --broker …` for a test job: `$SCRATCH` set, no outer job's variables, output
/// captured.
fn agent_command(broker: &Broker, scratch: &Scratch) -> Command {
    let mut command = Command::new(bin("agent"));
    command
        .arg("--broker")
        .arg(broker.socket())
        .env("SCRATCH", scratch.dir.path())
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn job_row(broker: &Broker) -> Option<serde_json::Value> {
    broker.jobs().into_iter().find(|j| j["state"] == "running")
}

fn held_hosts(broker: &Broker) -> Vec<String> {
    broker.held_hosts()
}

fn wait_note(broker: &Broker, needle: &str) -> String {
    let found = wait_until(Duration::from_secs(10), || {
        let notes = job_row(broker)?["notes"].clone();
        let notes: Vec<String> = serde_json::from_value(notes).ok()?;
        notes.into_iter().find(|n| n.contains(needle))
    });
    found.unwrap_or_else(|| panic!("no note with `{needle}`: {:#?}", job_row(broker)))
}

fn finish(child: Child) -> std::process::Output {
    let out = child.wait_with_output().expect("agent");
    assert_eq!(
        out.status.code(),
        Some(0),
        "agent stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn two_phase_growth_then_shrink_on_reclaim_and_halt_at_job_end() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    // grow: log, then start a remote daemon on the host through the shim (phase 2).
    let modules = module_dir(
        "t",
        Some(
            r#"echo "grow $1 $RB_HOST_ADDRESS" >>"$SCRATCH/log"
rsh "$1" "echo \$\$ >$SCRATCH/daemon.pid; exec sleep 300" </dev/null >/dev/null 2>&1 &"#,
        ),
        Some(r#"echo "shrink $1" >>"$SCRATCH/log""#),
        Some(r#"echo "halt $#" >>"$SCRATCH/log""#),
    );
    let child = start_job(&broker, "t", modules.path(), &scratch, &[]);
    scratch.wait_log("rsh=1", "phase 1 fails fast");
    let err = std::fs::read_to_string(scratch.path("rsh.err")).unwrap_or_default();
    assert!(err.contains("request recorded"), "phase-1 message: {err}");
    scratch.wait_log("grow vhost", "phase 2 runs t-grow HOST");
    let host =
        wait_until(Duration::from_secs(10), || held_hosts(&broker).pop()).expect("a host held");
    assert!(
        scratch.log().contains(&format!("grow {host} ")),
        "{}",
        scratch.log()
    );
    let pid_file = scratch.path("daemon.pid");
    let pid: i32 = wait_until(Duration::from_secs(10), || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    })
    .expect("the daemon started through the shim");
    let alive = |pid: i32| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
    assert!(alive(pid));

    // Reclaim: t-shrink runs; the daemon (still there) ends by the subagent's TERM.
    let out = broker.rb(&["release", &host, "--grace-s", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    scratch.wait_log(&format!("shrink {host}"), "reclaim runs t-shrink HOST");
    let freed = wait_until(Duration::from_secs(10), || {
        held_hosts(&broker).is_empty().then_some(())
    });
    assert!(
        freed.is_some(),
        "host still held: {:?}",
        held_hosts(&broker)
    );
    let gone = wait_until(Duration::from_secs(5), || (!alive(pid)).then_some(()));
    assert!(gone.is_some(), "the daemon outlived the reclaim");

    // Job end: t-halt with no arguments, agent exits with the app's status.
    scratch.stop_job();
    finish(child);
    assert!(scratch.log().contains("halt 0"), "{}", scratch.log());
}

/// A grow that finds the granted host in the job's virtual machine
/// already (exit 6, e.g. PVM's "Duplicate host") used to count as the job having grown:
/// the job held a host it could not use and never grew. The host must go back, the request
/// be served by another host, and `rb jobs` say what happened.
#[test]
fn a_grant_already_in_the_virtual_machine_goes_back_and_the_request_is_served_elsewhere() {
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    let modules = module_dir(
        "d",
        Some(
            r#"if [ ! -e "$SCRATCH/first" ]; then
  echo "$1" >"$SCRATCH/first"; echo "d-grow: $1 is in the virtual machine already" >&2; exit 6
fi
echo "grow $1" >>"$SCRATCH/log""#,
        ),
        Some("exit 0"),
        Some("exit 0"),
    );
    let child = start_job(&broker, "d", modules.path(), &scratch, &[]);
    scratch.wait_log("grow vhost", "the request asked again and grown elsewhere");
    let first = std::fs::read_to_string(scratch.path("first")).expect("first grant");
    let first = first.trim();
    let grown = wait_until(Duration::from_secs(10), || {
        let held = held_hosts(&broker);
        (held.len() == 1).then(|| held[0].clone())
    })
    .unwrap_or_else(|| panic!("one host held: {:?}", held_hosts(&broker)));
    assert_ne!(grown, first, "served elsewhere");
    assert!(
        scratch.log().contains(&format!("grow {grown}")),
        "{}",
        scratch.log()
    );
    let note = wait_note(&broker, "already");
    assert_eq!(
        note,
        format!(
            "d-grow {first}: {first} is in the job's virtual machine already; giving it back; \
             asking again for anyLinux"
        )
    );
    scratch.stop_job();
    finish(child);
}

#[test]
fn a_failing_module_is_noted_and_its_host_given_back_while_the_job_runs_on() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    let modules = module_dir(
        "f",
        Some("echo 'f-grow: the console said no' >&2; exit 1"),
        Some("exit 0"),
        Some("exit 0"),
    );
    let child = start_job(&broker, "f", modules.path(), &scratch, &[]);
    let note = wait_note(&broker, "the console said no");
    assert!(note.starts_with("f-grow vhost01: exit status 1"), "{note}");
    let freed = wait_until(Duration::from_secs(5), || {
        held_hosts(&broker).is_empty().then_some(())
    });
    assert!(freed.is_some(), "a host the job did not take is given back");
    assert!(job_row(&broker).is_some(), "the job still runs");
    scratch.stop_job();
    finish(child);
}

#[test]
fn a_hanging_module_is_killed_at_its_time_limit_and_noted() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    let modules = module_dir(
        "h",
        Some(r#"echo $$ >"$SCRATCH/grow.pid"; exec sleep 300"#),
        Some("exit 0"),
        Some("exit 0"),
    );
    let child = start_job(
        &broker,
        "h",
        modules.path(),
        &scratch,
        &["--module-timeout-s", "1"],
    );
    let note = wait_note(&broker, "timed out");
    assert!(
        note.starts_with("h-grow vhost01: timed out after 1.0 s"),
        "{note}"
    );
    let pid: i32 = std::fs::read_to_string(scratch.path("grow.pid"))
        .expect("grow ran")
        .trim()
        .parse()
        .expect("pid");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "the hanging module was killed"
    );
    let freed = wait_until(Duration::from_secs(5), || {
        held_hosts(&broker).is_empty().then_some(())
    });
    assert!(freed.is_some(), "host given back");
    scratch.stop_job();
    finish(child);
}

#[test]
fn a_missing_module_gives_a_clear_error_and_the_job_still_runs() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    let empty = tempfile::tempdir().expect("tempdir");
    let child = start_job(&broker, "nosuch", empty.path(), &scratch, &[]);
    scratch.wait_log("rsh=1", "the symbolic rsh fails");
    let err = std::fs::read_to_string(scratch.path("rsh.err")).unwrap_or_default();
    assert!(err.contains("nosuch-grow not found in"), "{err}");
    assert!(err.contains("RB_MODULE_PATH"), "says how to fix it: {err}");
    wait_note(&broker, "nosuch-halt not found");
    assert!(held_hosts(&broker).is_empty(), "nothing was requested");
    scratch.stop_job();
    let out = finish(child);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("nosuch-grow not found"), "agent log: {log}");
}

#[test]
fn a_host_freed_later_triggers_growth_by_itself() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    // Another (non-adaptive) job holds the only host until told to stop.
    let holder_stop = scratch.path("holder-stop");
    let mut holder = Command::new(bin("agent"))
        .arg("--broker")
        .arg(broker.socket())
        .args(["--", "rsh", "anyLinux"])
        .arg(format!(
            "while [ ! -e {} ]; do sleep 0.05; done",
            holder_stop.display()
        ))
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .stdin(Stdio::null())
        .spawn()
        .expect("holder");
    let held = wait_until(Duration::from_secs(10), || held_hosts(&broker).pop());
    assert_eq!(held.as_deref(), Some("vhost01"));
    let modules = module_dir(
        "t",
        Some(r#"echo "grow $1" >>"$SCRATCH/log""#),
        Some("exit 0"),
        Some("exit 0"),
    );
    let child = start_job(&broker, "t", modules.path(), &scratch, &[]);
    scratch.wait_log("rsh=1", "phase 1 fails fast even when no host is free");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!scratch.log().contains("grow"), "no host was free yet");
    std::fs::write(&holder_stop, "").expect("stop holder");
    assert!(holder.wait().expect("holder").success());
    scratch.wait_log("grow vhost01", "the freed host is grown onto");
    scratch.stop_job();
    finish(child);
}

/// How many `grow` lines the modules logged.
fn grows(scratch: &Scratch) -> usize {
    scratch
        .log()
        .lines()
        .filter(|l| l.starts_with("grow "))
        .count()
}

#[test]
fn a_lookup_of_a_symbolic_name_starts_the_request_and_the_rsh_after_it_joins_it() {
    let broker = Broker::start(&local_lab(3));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    let modules = module_dir(
        "t",
        Some(r#"echo "grow $1" >>"$SCRATCH/log""#),
        Some("exit 0"),
        Some("exit 0"),
    );
    // First a lookup alone (getent, through librb_preload.so): the job then waits for the
    // grow, which only a request made by the lookup brings. Then one process looks the
    // name up and, once that request has been grown, runs rsh (PVM's master and LAM's
    // lamgrow look up, then start the shim): the same request, no third grow.
    let app = r#"getent hosts anyLinux >"$SCRATCH/getent"
until grep -q '^grow ' "$SCRATCH/log" 2>/dev/null || [ ! -d "$SCRATCH" ]; do sleep 0.01; done
perl -e 'gethostbyname("anyLinux"); select(undef, undef, undef, 0.5);
  exit(system("rsh", "anyLinux", "true") >> 8)' 2>"$SCRATCH/rsh.err"
echo "rsh=$?" >>"$SCRATCH/log"
while [ ! -e "$SCRATCH/stop" ] && [ -d "$SCRATCH" ]; do sleep 0.05; done"#;
    let child = start_app(&broker, "t", modules.path(), &scratch, &[], app);
    scratch.wait_log("grow vhost", "the lookup alone made a request");
    let looked_up = std::fs::read_to_string(scratch.path("getent")).unwrap_or_default();
    assert!(looked_up.starts_with("127.77."), "placeholder: {looked_up}");
    let grown = wait_until(Duration::from_secs(10), || {
        (grows(&scratch) == 2).then_some(())
    });
    assert!(grown.is_some(), "{}", scratch.log());
    scratch.wait_log("rsh=1", "the rsh after the lookup is refused (phase 1)");
    let err = std::fs::read_to_string(scratch.path("rsh.err")).unwrap_or_default();
    assert!(err.contains("request recorded"), "phase-1 message: {err}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        grows(&scratch),
        2,
        "lookup + rsh = one request: {}",
        scratch.log()
    );
    assert_eq!(held_hosts(&broker).len(), 2, "{:?}", held_hosts(&broker));
    scratch.stop_job();
    finish(child);
}

#[test]
fn a_lookup_in_a_job_without_a_module_asks_for_nothing() {
    let broker = Broker::start(&local_lab(1));
    broker.wait_all_up(Duration::from_secs(10));
    let scratch = Scratch::new();
    let child = agent_command(&broker, &scratch)
        .args(["--preload", "on", "--", "sh", "-c"])
        .arg(
            r#"getent hosts anyLinux >"$SCRATCH/getent"; echo "looked up" >>"$SCRATCH/log"
while [ ! -e "$SCRATCH/stop" ] && [ -d "$SCRATCH" ]; do sleep 0.05; done"#,
        )
        .spawn()
        .expect("agent");
    scratch.wait_log("looked up", "the job looked anyLinux up");
    let looked_up = std::fs::read_to_string(scratch.path("getent")).unwrap_or_default();
    assert!(looked_up.starts_with("127.77."), "placeholder: {looked_up}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(job_row(&broker).is_some(), "the job runs");
    assert_eq!(
        held_hosts(&broker),
        Vec::<String>::new(),
        "no module, no request"
    );
    scratch.stop_job();
    finish(child);
}
