//! Tier 3, whose sessions count on a private workstation, with a real logind (elogind and a
//! dbus-daemon of the host's own) in node03, whose sshd opens a PAM session for every login
//! as Debian ships it: so the broker's transport, the job's remote commands and people's
//! ssh logins all register with logind there, as on a real desktop. node03's owner is root
//! (the user the broker's transport and the test's jobs run as: their sessions are the
//! owner's own); the lab user is "someone else"; the policy is the shipped paper's with an
//! away time of [`AWAY_S`] seconds. One lab, the cases in turn:
//!
//! 1. someone else's desktop in use at the console → not lent (a local session is the
//!    console, whoever it is); with it gone, a greeter in use and someone else typing in an
//!    ssh login → lent (a greeter is nobody; a remote session counts only for its user);
//! 2. the owner's desktop in use → the job vacates, although the job's own remote commands
//!    (the owner's sessions without a terminal) and the broker's login are there: they are
//!    no person;
//! 3. the owner's screen locked, idle for the away time → lent; unlocked → vacate (the
//!    unlock is the return, before the desktop clears its idle hint);
//! 4. locked again, idle since the unlock for the away time → lent; the owner types in an
//!    ssh login → vacate (the owner's own remote session counts).
//!
//! Root only; the test prints why it is skipped otherwise.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use tests::{
    bin,
    labtier::{lab_file_with, skip_unless_root, LabOptions, LabWithBroker, FRONT_END, TEST_TIMING},
    logind::{self, DesktopSession, Person, RemoteLogin},
    wait_until, Broker,
};

/// The private workstation.
const PRIVATE: &str = "node03";
/// The away time of the test policy, in seconds: above the 8 s steps in which the kernel
/// updates a pty's access time, so a person typing in an ssh login reads as active.
const AWAY_S: u64 = 12;
/// The greeter's account, added to node03 only.
const GREETER: &str = "rbgreeter";
const GREETER_UID: u32 = 64_731;

/// node02 (front end) and node03 (root's private machine, sshd with PAM, logind running).
fn lab_with_broker() -> LabWithBroker {
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 2,
        ..lab::LabSpec::default()
    })
    .unwrap_or_else(|e| panic!("lab up: {e}"));
    logind::use_pam_sshd(&lab, PRIVATE).unwrap_or_else(|e| panic!("{e}"));
    logind::add_user(&lab, PRIVATE, GREETER, GREETER_UID).unwrap_or_else(|e| panic!("{e}"));
    logind::start(&lab, PRIVATE).unwrap_or_else(|e| panic!("{e}"));
    let mut opts = LabOptions::new(&[(PRIVATE, "root")], TEST_TIMING);
    opts.unmanaged = vec![FRONT_END.into()];
    let file = lab.dir().join("away.toml");
    std::fs::write(&file, logind::away_policy(AWAY_S)).expect("policy file");
    let text = lab_file_with(&lab, &opts).replacen(
        "[broker]\n",
        &format!("[broker]\npolicy = \"{}\"\n", file.display()),
        1,
    );
    let broker = Broker::start(&text);
    broker.wait_all_up(Duration::from_secs(30));
    LabWithBroker { broker, lab }
}

/// An adaptive job (agent in the root namespace, as root) whose app watches its JEL pool
/// into `events` and runs one remote `sleep` marked `marker` on any host.
struct Job {
    agent: Child,
    events: PathBuf,
    marker: String,
}

impl Job {
    fn start(env: &LabWithBroker, dir: &Path, n: u32) -> Job {
        let events = dir.join(format!("events{n}"));
        let marker = format!("rbpeoplemarker{}x{n}", std::process::id());
        let script = format!(
            "'{jel}' watch --json > '{events}' & rsh anyLinux 'sleep 300 # {marker}'; wait",
            jel = bin("rb-jel").display(),
            events = events.display()
        );
        let agent = Command::new(bin("agent"))
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
            .expect("agent");
        Job {
            agent,
            events,
            marker,
        }
    }

    /// How many of its processes run on node03.
    fn on_private(&self, env: &LabWithBroker) -> usize {
        let out = env
            .lab
            .exec(PRIVATE, &["pgrep", "-f", &self.marker])
            .expect("pgrep");
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    /// Waits until node03 is granted to it and its process runs there.
    fn wait_lent(&self, env: &LabWithBroker, why: &str) {
        let lent = wait_until(Duration::from_secs(45), || {
            (self.on_private(env) >= 1).then_some(())
        });
        assert!(
            lent.is_some(),
            "{why}: not lent\n{:#?}\n{}",
            env.broker.host(PRIVATE),
            env.broker.log()
        );
    }

    /// Waits until its process on node03 is gone after `cause`, and its pool got `vacate`.
    fn wait_vacated(&self, env: &LabWithBroker, cause: &str) {
        let t0 = Instant::now();
        let gone = wait_until(Duration::from_secs(20), || {
            (self.on_private(env) == 0).then(|| t0.elapsed())
        });
        let gone = gone.unwrap_or_else(|| {
            panic!(
                "{cause}: the job's process survived on {PRIVATE}\n{:#?}\n{}",
                env.broker.host(PRIVATE),
                env.broker.log()
            )
        });
        eprintln!("{cause} → process gone on {PRIVATE} after {gone:?}");
        let vacate = wait_until(Duration::from_secs(15), || {
            events(&self.events)
                .into_iter()
                .find(|e| e["event"] == "vacate" && e["host"] == PRIVATE)
        });
        assert!(
            vacate.is_some(),
            "{cause}: no vacate for {PRIVATE}: {:?}",
            events(&self.events)
        );
    }

    fn end(mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}

fn events(file: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// A running job's request is queued (nothing granted for it yet).
fn queued(env: &LabWithBroker) -> bool {
    env.broker
        .jobs()
        .iter()
        .any(|j| j["state"] == "running" && j["queued"].as_array().is_some_and(|r| !r.is_empty()))
}

#[test]
fn whose_sessions_count_on_the_owners_machine() {
    let name = "whose_sessions_count_on_the_owners_machine";
    if skip_unless_root(name) {
        return;
    }
    let env = lab_with_broker();
    let (lab, broker) = (&env.lab, &env.broker);
    let other = Person::lab_user(lab);
    let greeter_user = Person {
        name: GREETER.into(),
        uid: GREETER_UID,
    };
    let dir = tempfile::tempdir().expect("tempdir");

    // 1. Someone else at the console and typing over ssh: not lent.
    let other_desktop =
        DesktopSession::open_as(lab, PRIVATE, &other, "user").unwrap_or_else(|e| panic!("{e}"));
    let other_ssh = RemoteLogin::open(lab, PRIVATE, true).unwrap_or_else(|e| panic!("{e}"));
    broker.wait_host(PRIVATE, Duration::from_secs(20), "the sessions", |h| {
        let mut ss = h.logind.iter().flatten().collect::<Vec<_>>();
        ss.retain(|s| {
            s.user == other.name && s.kind == "wayland" && s.idle_s == Some(0)
                || s.user == other.name
                    && s.remote
                    && s.tty.is_some()
                    && s.idle_s.is_some_and(|i| i < AWAY_S)
        });
        ss.len() == 2
    });
    let job1 = Job::start(&env, dir.path(), 1);
    let asked = wait_until(Duration::from_secs(20), || {
        (queued(&env) || job1.on_private(&env) > 0).then_some(())
    });
    assert_eq!(
        job1.on_private(&env),
        0,
        "lent while someone else is at its console"
    );
    assert!(
        asked.is_some(),
        "the job's request never queued\n{:#?}\n{}",
        broker.jobs(),
        broker.log()
    );
    let note = wait_until(Duration::from_secs(20), || {
        let note = broker.host(PRIVATE)?.policy_note?;
        note.contains(&other.name).then_some(note)
    });
    let note = note.unwrap_or_else(|| panic!("no note on {PRIVATE}: {:?}", broker.host(PRIVATE)));
    assert!(
        note.contains("someone active (logind local, wayland"),
        "{note}"
    );
    assert_eq!(
        job1.on_private(&env),
        0,
        "lent while someone else is at its console"
    );
    // Someone else's desktop gone, a greeter in its place (in use): lent.
    let greeter = DesktopSession::open_as(lab, PRIVATE, &greeter_user, "greeter")
        .unwrap_or_else(|e| panic!("{e}"));
    other_desktop.close(lab);
    broker.wait_host(PRIVATE, Duration::from_secs(20), "the greeter", |h| {
        let mut ss = h.logind.iter().flatten();
        ss.any(|s| s.user == GREETER && s.class == "greeter" && s.idle_s == Some(0))
    });
    job1.wait_lent(&env, "only a greeter and someone else's ssh login");
    // The job's remote command runs in a session of the owner's without a terminal.
    let host = broker.wait_host(PRIVATE, Duration::from_secs(20), "the job's session", |h| {
        h.logind
            .iter()
            .flatten()
            .any(|s| s.user == "root" && s.remote && s.tty.is_none() && !s.own)
    });
    assert!(
        host.logind.iter().flatten().any(|s| s.own),
        "the host daemon's own login: {host:?}"
    );

    // 2. The owner at the desktop: vacate, whatever the job's sessions say.
    let owner_desktop = DesktopSession::open_as(lab, PRIVATE, &Person::root(), "user")
        .unwrap_or_else(|e| panic!("{e}"));
    job1.wait_vacated(&env, "the owner's desktop in use");
    job1.end();

    // 3. Locked and idle for the away time: lent; unlocked: vacate.
    owner_desktop
        .set_idle(lab, PRIVATE, true)
        .unwrap_or_else(|e| panic!("{e}"));
    owner_desktop
        .set_locked(lab, PRIVATE, true)
        .unwrap_or_else(|e| panic!("{e}"));
    let job2 = Job::start(&env, dir.path(), 2);
    job2.wait_lent(
        &env,
        "the owner's screen locked, no input for the away time",
    );
    let host = broker.host(PRIVATE).expect("node03");
    let session = host
        .logind
        .iter()
        .flatten()
        .find(|s| s.id == owner_desktop.id);
    assert!(session.is_some_and(|s| s.locked && s.idle_hint), "{host:?}");
    owner_desktop
        .set_locked(lab, PRIVATE, false)
        .unwrap_or_else(|e| panic!("{e}"));
    job2.wait_vacated(&env, "the owner unlocked the screen");
    job2.end();

    // 4. Locked again, no input since the unlock: lent; the owner types over ssh: vacate.
    owner_desktop
        .set_locked(lab, PRIVATE, true)
        .unwrap_or_else(|e| panic!("{e}"));
    let job3 = Job::start(&env, dir.path(), 3);
    job3.wait_lent(&env, "the owner's screen locked again");
    let owner_ssh = RemoteLogin::open(lab, PRIVATE, false).unwrap_or_else(|e| panic!("{e}"));
    job3.wait_vacated(&env, "the owner typing in an ssh login");
    job3.end();

    owner_ssh.close();
    other_ssh.close();
    owner_desktop.close(lab);
    greeter.close(lab);
}
