//! Tier 3, the owner on today's desktops: a real logind (elogind and a dbus-daemon of the
//! host's own) in the private workstation node03 of the lab user, whose graphical (Wayland)
//! session is registered through PAM and marked idle, active or locked with logind's own
//! calls, as a desktop does. The broker manages node03 only (node02 is the front end),
//! with a policy that is the shipped paper's with an away time of [`AWAY_S`] seconds.
//!
//! - owner active in logind → an adaptive job's request waits, whatever utmp and the
//!   device times say (both read as days idle here);
//! - owner idle past the away time → granted;
//! - owner active again → the job's pool gets `vacate` for node03 and its process there is
//!   gone, through logind's signal;
//! - logind unreachable and the console unknown → never granted, and `rb status` says why.
//!
//! Root only; each test prints why it is skipped otherwise.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use tests::{
    bin,
    labtier::{lab_file_with, skip_unless_root, LabOptions, LabWithBroker, FRONT_END, TEST_TIMING},
    logind::{self, DesktopSession},
    wait_until, Broker,
};

/// The private workstation.
const PRIVATE: &str = "node03";
/// The away time of the test policy, in seconds.
const AWAY_S: u64 = 3;

/// A lab of node02 (front end) and node03 (the lab user's private machine); `prepare` runs
/// on the lab before the broker starts (and so before node03's daemon first reports), and
/// may give a program to start instead of `rb-hostd`.
fn lab_with_broker(prepare: impl FnOnce(&lab::Lab) -> Option<PathBuf>) -> LabWithBroker {
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 2,
        ..lab::LabSpec::default()
    })
    .unwrap_or_else(|e| panic!("lab up: {e}"));
    let hostd = prepare(&lab);
    let owner = lab.user().name.clone();
    let mut opts = LabOptions::new(&[(PRIVATE, owner.as_str())], TEST_TIMING);
    opts.unmanaged = vec![FRONT_END.into()];
    let file = lab.dir().join("away.toml");
    std::fs::write(&file, logind::away_policy(AWAY_S)).expect("policy file");
    let mut text = lab_file_with(&lab, &opts).replacen(
        "[broker]\n",
        &format!("[broker]\npolicy = \"{}\"\n", file.display()),
        1,
    );
    if let Some(hostd) = hostd {
        let default = format!("hostd_path = \"{}\"", bin("rb-hostd").display());
        text = text.replacen(
            &default,
            &format!("hostd_path = \"{}\"", hostd.display()),
            1,
        );
    }
    let broker = Broker::start(&text);
    broker.wait_all_up(Duration::from_secs(30));
    LabWithBroker { broker, lab }
}

/// An adaptive job (agent in the root namespace) whose app watches its JEL pool into
/// `events` and runs one remote `sleep` marked `marker` on any host.
fn adaptive_job(env: &LabWithBroker, events: &Path, marker: &str) -> Child {
    let script = format!(
        "'{jel}' watch --json > '{events}' & rsh anyLinux 'sleep 300 # {marker}'; wait",
        jel = bin("rb-jel").display(),
        events = events.display()
    );
    Command::new(bin("agent"))
        .arg("--broker")
        .arg(env.broker.tcp_addr().to_string())
        .arg("--secret-file")
        .arg(env.broker.secret())
        .args(["--grace-s", "1", "--rsl", "&(adaptive=yes)", "--"])
        .args(["sh", "-c", &script])
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .env_remove("RB_JEL")
        .spawn()
        .expect("agent")
}

/// How many processes on `host` carry `marker` in their command line.
fn count(env: &LabWithBroker, host: &str, marker: &str) -> usize {
    let out = env.lab.exec(host, &["pgrep", "-f", marker]).expect("pgrep");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// A running job's request is queued (nothing granted for it yet).
fn queued(env: &LabWithBroker) -> bool {
    env.broker
        .jobs()
        .iter()
        .any(|j| j["state"] == "running" && j["queued"].as_array().is_some_and(|r| !r.is_empty()))
}

/// `rb status`'s note on node03 once it contains `words`.
fn note_with(env: &LabWithBroker, words: &str) -> Option<String> {
    wait_until(Duration::from_secs(20), || {
        let note = env.broker.host(PRIVATE)?.policy_note?;
        note.contains(words).then_some(note)
    })
}

fn events(file: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

#[test]
fn owner_in_logind_active_never_lent_idle_lent_back_vacates() {
    let name = "owner_in_logind_active_never_lent_idle_lent_back_vacates";
    if skip_unless_root(name) {
        return;
    }
    let mut session = None;
    let env = lab_with_broker(|lab| {
        logind::start(lab, PRIVATE).unwrap_or_else(|e| panic!("{e}"));
        session = Some(DesktopSession::open(lab, PRIVATE).unwrap_or_else(|e| panic!("{e}")));
        None
    });
    let session = session.expect("opened");
    let owner = env.lab.user().name.clone();
    // The daemon reports the owner's session, with logind as its source.
    let host = env
        .broker
        .wait_host(PRIVATE, Duration::from_secs(20), "logind session", |h| {
            h.logind
                .iter()
                .flatten()
                .any(|s| s.user == owner && s.kind == "wayland" && s.idle_s == Some(0))
        });
    assert!(
        host.console_idle_s.is_some_and(|s| s > 60),
        "the device times read idle here, which is why logind matters: {host:?}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events");
    let marker = format!("rblogindmarker{}", std::process::id());
    let mut job = adaptive_job(&env, &file, &marker);
    // Owner active: the request waits, and rb status says why.
    assert!(
        wait_until(Duration::from_secs(20), || queued(&env).then_some(())).is_some(),
        "the job's request never queued\n{:#?}\n{}",
        env.broker.jobs(),
        env.broker.log()
    );
    let note = note_with(&env, "owner active (logind").unwrap_or_else(|| {
        panic!(
            "no logind note on {PRIVATE}: {:?}",
            env.broker.host(PRIVATE)
        )
    });
    assert!(note.contains("wayland"), "{note}");
    assert_eq!(
        count(&env, PRIVATE, &marker),
        0,
        "lent while its owner is active"
    );
    assert!(
        env.broker.held_hosts().is_empty(),
        "{:?}",
        env.broker.held_hosts()
    );
    // Owner idle (the desktop says so): granted once idle for the away time.
    session
        .set_idle(&env.lab, PRIVATE, true)
        .expect("idle hint");
    let granted = wait_until(Duration::from_secs(30), || {
        (count(&env, PRIVATE, &marker) >= 1).then_some(())
    });
    assert!(
        granted.is_some(),
        "not lent with its owner idle\n{:?}\n{}",
        env.broker.host(PRIVATE),
        env.broker.log()
    );
    // Owner back: vacate in the pool, then the process gone.
    let t0 = Instant::now();
    session
        .set_idle(&env.lab, PRIVATE, false)
        .expect("idle hint off");
    let gone = wait_until(Duration::from_secs(15), || {
        (count(&env, PRIVATE, &marker) == 0).then(|| t0.elapsed())
    });
    let vacate = wait_until(Duration::from_secs(15), || {
        events(&file)
            .into_iter()
            .find(|e| e["event"] == "vacate" && e["host"] == PRIVATE)
    });
    let _ = job.kill();
    let _ = job.wait();
    session.close(&env.lab);
    let gone = gone.unwrap_or_else(|| {
        panic!(
            "the job's process survived its owner's return to {PRIVATE}\n{}",
            env.broker.log()
        )
    });
    eprintln!("owner back in logind → process gone on {PRIVATE} after {gone:?}");
    assert!(
        vacate.is_some(),
        "no vacate for {PRIVATE}: {:?}",
        events(&file)
    );
}

#[test]
fn logind_unreachable_and_console_unknown_is_never_lent() {
    let name = "logind_unreachable_and_console_unknown_is_never_lent";
    if skip_unless_root(name) {
        return;
    }
    // No system bus in node03, and no input device the daemon can read.
    let env = lab_with_broker(|lab| {
        let path = lab.dir().join("rb-hostd-no-console");
        let text = format!(
            "#!/bin/sh\nexec '{}' --input-device '/nonexistent-rb-input/*' \"$@\"\n",
            bin("rb-hostd").display()
        );
        std::fs::write(&path, text).expect("wrapper");
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(&path, mode).expect("chmod");
        Some(path)
    });
    let host = env
        .broker
        .wait_host(PRIVATE, Duration::from_secs(20), "a report", |h| {
            h.last_report_age_s.is_some()
        });
    assert_eq!(host.console_idle_s, None, "{host:?}");
    assert!(
        host.logind.is_none() && host.logind_error.is_some(),
        "{host:?}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events");
    let marker = format!("rbnologindmarker{}", std::process::id());
    let mut job = adaptive_job(&env, &file, &marker);
    assert!(
        wait_until(Duration::from_secs(20), || queued(&env).then_some(())).is_some(),
        "the job's request never queued\n{:#?}",
        env.broker.jobs()
    );
    let note = note_with(&env, "idle unknown");
    let lent = count(&env, PRIVATE, &marker);
    let held = env.broker.held_hosts();
    let _ = job.kill();
    let _ = job.wait();
    let note = note.unwrap_or_else(|| panic!("no note: {:?}", env.broker.host(PRIVATE)));
    assert!(note.contains("no readable source"), "{note}");
    assert_eq!(
        lent, 0,
        "lent with nothing readable that could show its owner"
    );
    assert!(held.is_empty(), "{held:?}");
}
