//! "Owner return through logind" (Policies section, lab, root): the owner of a private
//! workstation comes back and the adaptive job there gets its `vacate` notice, through a
//! real logind (elogind in the host, the owner's Wayland session's idle hint cleared with
//! logind's own call) beside today's utmp path (a real utmp login of the owner, idle 0) in
//! the same run, on the same job.

use std::{
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use bench::stats::summarize;
use tests::{
    bin,
    labtier::{lab_file_with, LabOptions, LabWithBroker, FRONT_END, TEST_TIMING},
    logind::{self, DesktopSession},
    wait_until, Broker,
};

/// The private workstation.
const PRIVATE: &str = "node03";
/// The away time of the policy (the paper's, shortened so that a repetition takes seconds).
const AWAY_S: u64 = 2;

/// `vacate` events for node03 seen so far by the job's watcher.
fn vacates(events: &Path) -> usize {
    let text = std::fs::read_to_string(events).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["event"] == "vacate" && e["host"] == PRIVATE)
        .count()
}

/// Whether the job's process runs on node03.
fn running(env: &LabWithBroker, marker: &str) -> bool {
    env.lab
        .exec(PRIVATE, &["pgrep", "-f", marker])
        .is_ok_and(|o| o.status.success())
}

/// An adaptive job that watches its pool into `events` and takes a host again each time it
/// loses one.
fn holder(env: &LabWithBroker, events: &Path, marker: &str) -> anyhow::Result<Child> {
    let app = format!(
        "'{jel}' watch --json > '{events}' & \
         while :; do rsh anyLinux 'sleep 1000 # {marker}'; sleep 0.05; done",
        jel = bin("rb-jel").display(),
        events = events.display()
    );
    Ok(Command::new(bin("agent"))
        .arg("--broker")
        .arg(env.broker.tcp_addr().to_string())
        .arg("--secret-file")
        .arg(env.broker.secret())
        .args(["--grace-s", "1", "--rsl", "&(adaptive=yes)", "--"])
        .args(["sh", "-c", &app])
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .env_remove("RB_JEL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// Milliseconds from `back()` to the next `vacate` for node03 in the job's stream.
fn one(
    env: &LabWithBroker,
    events: &Path,
    path: &str,
    back: impl FnOnce() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let before = vacates(events);
    let t0 = Instant::now();
    back()?;
    let seen = wait_until(Duration::from_secs(15), || {
        (vacates(events) > before).then(|| t0.elapsed())
    });
    let seen = seen.ok_or_else(|| {
        anyhow::anyhow!(
            "no vacate for {PRIVATE} within 15 s of the owner's return through {path}\n{:?}\n{}",
            env.broker.host(PRIVATE),
            env.broker.log()
        )
    })?;
    Ok(seen.as_secs_f64() * 1e3)
}

pub fn run(reps: usize) -> anyhow::Result<()> {
    println!("### Owner return through logind (lab)\n");
    println!(
        "Real namespaced hosts: node03 is the private workstation of the lab user, with a \
         real logind in it (Debian's elogind and a dbus-daemon of its own) and the owner's \
         Wayland session registered through PAM; node02 is the front end. An adaptive job \
         (agent in the root namespace, jobs over ssh) holds node03 while its owner is away \
         (the paper policy with an away time of {AWAY_S} s) and watches its JEL pool. Time \
         from the owner's return to the job's `vacate` notice for node03 in its stream \
         (polled every 20 ms): through logind (the session's `SetIdleHint(false)`, as a \
         desktop calls it; `rb-hostd` sees logind's `PropertiesChanged`) and, in the same \
         run on the same job, through utmp (a real utmp login of the owner, idle 0, \
         `lab::FakeLogin`; the daemon's 250 ms activity poll). Median of {reps} (min–max). \
         Goal: ≤ 1 s.\n"
    );
    let lab = lab::Lab::up(&lab::LabSpec {
        hosts: 2,
        ..lab::LabSpec::default()
    })
    .map_err(|e| anyhow::anyhow!("lab up: {e}"))?;
    logind::start(&lab, PRIVATE).map_err(|e| anyhow::anyhow!(e))?;
    let session = DesktopSession::open(&lab, PRIVATE).map_err(|e| anyhow::anyhow!(e))?;
    session
        .set_idle(&lab, PRIVATE, true)
        .map_err(|e| anyhow::anyhow!(e))?;
    let owner = lab.user().name.clone();
    let mut opts = LabOptions::new(&[(PRIVATE, owner.as_str())], TEST_TIMING);
    opts.unmanaged = vec![FRONT_END.into()];
    let file = lab.dir().join("away.toml");
    std::fs::write(&file, logind::away_policy(AWAY_S))?;
    let text = lab_file_with(&lab, &opts).replacen(
        "[broker]\n",
        &format!("[broker]\npolicy = \"{}\"\n", file.display()),
        1,
    );
    let broker = Broker::start(&text);
    broker.wait_all_up(Duration::from_secs(30));
    let env = LabWithBroker { broker, lab };
    let dir = tempfile::tempdir()?;
    let events = dir.path().join("events");
    let marker = format!("rbbenchlogind{}", std::process::id());
    let mut job = holder(&env, &events, &marker)?;
    // Held again: granted anew (not the vacated allocation, whose process may outlive its
    // `vacate` by the grace) and the process running.
    let held = |env: &LabWithBroker| {
        wait_until(Duration::from_secs(30), || {
            let host = env.broker.host(PRIVATE)?;
            (host.alloc_state == "held" && running(env, &marker)).then_some(())
        })
        .ok_or_else(|| anyhow::anyhow!("the job never ran on {PRIVATE}\n{}", env.broker.log()))
    };
    let (mut through_logind, mut through_utmp) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        held(&env)?;
        through_logind.push(one(&env, &events, "logind", || {
            session
                .set_idle(&env.lab, PRIVATE, false)
                .map_err(|e| anyhow::anyhow!(e))
        })?);
        session
            .set_idle(&env.lab, PRIVATE, true)
            .map_err(|e| anyhow::anyhow!(e))?;
        held(&env)?;
        let mut login = None;
        through_utmp.push(one(&env, &events, "utmp", || {
            login = Some(
                env.lab
                    .fake_login(PRIVATE, &owner, "rbtty-owner", Duration::ZERO)?,
            );
            Ok(())
        })?);
        if let Some(login) = login {
            login.end()?;
        }
    }
    let _ = env.lab.stop_spawned(&mut job);
    session.close(&env.lab);
    let show = |v: &[f64]| summarize(v).map_or("-".into(), |s| s.show("ms", 0));
    println!("| owner returns → `vacate` for node03 in the job's stream | median (min–max, n) |");
    println!("|---|---|");
    println!(
        "| through logind (`SetIdleHint(false)`, signal) | {} |",
        show(&through_logind)
    );
    println!(
        "| through utmp (login, idle 0; baseline) | {} |",
        show(&through_utmp)
    );
    println!();
    let LabWithBroker { broker, lab } = env;
    drop(broker);
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))?;
    Ok(())
}
