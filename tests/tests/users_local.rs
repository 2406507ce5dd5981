//! Per-user identity, end to end with a real broker (run by root, the owner)
//! and a second real uid playing user `bob` (4720: the 47xx range of security_local.rs, no
//! passwd entry, as a credential's user need not have one). Bob holds no lab secret: his
//! `agent` and `rb` reach the broker over TCP with the credential `rb user add bob` made.
//! Needs root; skipped otherwise.

use std::{
    os::unix::{fs::PermissionsExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

use tests::{bin, local_lab, wait_until, Broker};

const BOB_UID: u32 = 4720;

/// Bob's home: a private directory of uid 4720 holding `.config/rb/credential`.
struct Home(tempfile::TempDir);

impl Home {
    /// Copies `credential` in as bob's `~/.config/rb/credential` (0600, his).
    fn with_credential(credential: &Path) -> Home {
        let dir = tempfile::Builder::new()
            .prefix("rb-bob-")
            .tempdir_in("/var/tmp")
            .expect("tempdir");
        let rb = dir.path().join(".config/rb");
        std::fs::create_dir_all(&rb).expect("mkdir");
        let target = rb.join("credential");
        std::fs::copy(credential, &target).expect("copy credential");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        for p in [
            dir.path().to_path_buf(),
            dir.path().join(".config"),
            rb,
            target,
        ] {
            std::os::unix::fs::chown(&p, Some(BOB_UID), Some(BOB_UID)).expect("chown");
        }
        Home(dir)
    }

    /// `program ARGS…` as bob: his uid, his home, nothing pointing at a broker or a job.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(bin(program));
        cmd.args(args)
            .uid(BOB_UID)
            .gid(BOB_UID)
            .env("HOME", self.0.path())
            .stdin(Stdio::null());
        for var in [
            "XDG_RUNTIME_DIR",
            "RB_BROKER",
            "RB_LAB",
            "RB_AGENT",
            "RB_HOSTS_FILE",
            "RB_CREDENTIAL",
            "USER",
            "LOGNAME",
        ] {
            cmd.env_remove(var);
        }
        cmd
    }

    /// `rb --broker ADDR ARGS…` as bob.
    fn rb(&self, broker: &Broker, args: &[&str]) -> Output {
        let addr = broker.tcp_addr().to_string();
        let mut all = vec!["--broker", addr.as_str()];
        all.extend_from_slice(args);
        self.command("rb", &all).output().expect("run rb as bob")
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The running job of `user` holding one host: (job id, host).
fn running_job_of(broker: &Broker, user: &str) -> Option<(u64, String)> {
    broker.jobs().into_iter().find_map(|j| {
        let host = j["hosts"].as_array()?.first()?.as_str()?.to_string();
        let id = j["id"].as_u64()?;
        (j["state"] == "running" && j["user"] == user).then_some((id, host))
    })
}

fn job_state(broker: &Broker, id: u64) -> Option<String> {
    let jobs = broker.jobs();
    let job = jobs.iter().find(|j| j["id"].as_u64() == Some(id))?;
    job["state"].as_str().map(String::from)
}

/// Ends an agent we started (by its pid) and reaps it.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `rb user add bob` by the owner: the credential's path is the last line, mode 0600.
fn add_bob(broker: &Broker) -> PathBuf {
    let out = broker.rb(&["user", "add", "bob"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let path = PathBuf::from(text.lines().last().expect("a last line"));
    assert_eq!(path, broker.state_dir().join("credentials/bob"), "{text}");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    path
}

#[test]
fn a_user_with_a_credential_runs_jobs_as_themselves_and_only_releases_their_own_hosts() {
    if !tests::is_root() {
        eprintln!("skipped: needs root to act as a second uid");
        return;
    }
    let broker = Broker::start(&local_lab(2));
    broker.wait_all_up(Duration::from_secs(10));
    let bob = Home::with_credential(&add_bob(&broker));
    let list = broker.rb(&["user", "list"]);
    assert!(stdout(&list).contains("bob"), "{}", stdout(&list));

    // Bob's job (his credential, claimed name whatever it is) and one of the owner's.
    let script = "rsh anyLinux sleep 60; exec sleep 60";
    let agent_log = broker.dir.path().join("bob-agent.log");
    let agent = bob
        .command("agent", &["--broker", &broker.tcp_addr().to_string()])
        .args(["--grace-s", "1", "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&agent_log).expect("log"))
        .spawn()
        .expect("bob's agent");
    let _bob_agent = Reaped(agent);
    let found = wait_until(Duration::from_secs(15), || running_job_of(&broker, "bob"));
    let Some((bob_job, bob_host)) = found else {
        let err = std::fs::read_to_string(&agent_log).unwrap_or_default();
        panic!(
            "bob's job never ran: {err}\n{:#?}\n{}",
            broker.jobs(),
            broker.log()
        );
    };
    let _owner_agent = Reaped(
        broker
            .agent(&["rsh", "anyLinux", "sleep 60"])
            .stdout(Stdio::null())
            .spawn()
            .expect("owner's agent"),
    );
    let (_, owner_host) = wait_until(Duration::from_secs(15), || running_job_of(&broker, "root"))
        .expect("the owner's job holds the other host");

    // Bob reads the lab, but may not administer it: 77, and why.
    let jobs = bob.rb(&broker, &["jobs", "--json"]);
    assert!(jobs.status.success(), "{}", stderr(&jobs));
    let drain = bob.rb(&broker, &["drain", &owner_host]);
    assert_eq!(drain.status.code(), Some(77), "{}", stderr(&drain));
    assert!(
        stderr(&drain).contains("needs the broker's owner"),
        "{}",
        stderr(&drain)
    );
    let list = bob.rb(&broker, &["user", "list"]);
    assert_eq!(list.status.code(), Some(77), "{}", stderr(&list));
    let theirs = bob.rb(&broker, &["release", &owner_host]);
    assert_eq!(theirs.status.code(), Some(77), "{}", stderr(&theirs));
    assert!(
        stderr(&theirs).contains("user `root`"),
        "{}",
        stderr(&theirs)
    );
    assert!(broker.held_hosts().contains(&owner_host), "still held");

    // His own job's host: released.
    let own = bob.rb(&broker, &["release", &bob_host, "--grace-s", "1"]);
    assert!(own.status.success(), "{}", stderr(&own));
    let freed = wait_until(Duration::from_secs(15), || {
        (!broker.held_hosts().contains(&bob_host)).then_some(())
    });
    assert!(freed.is_some(), "{:#?}", broker.jobs());

    // Revoked: his agent's connection is dropped at once (his job ends) and rb is refused.
    let revoke = broker.rb(&["user", "revoke", "bob"]);
    assert!(revoke.status.success(), "{}", stderr(&revoke));
    let ended = wait_until(Duration::from_secs(10), || {
        job_state(&broker, bob_job).filter(|s| s != "running")
    });
    assert!(
        ended.is_some(),
        "bob's job still runs: {:#?}",
        broker.jobs()
    );
    let after = bob.rb(&broker, &["jobs"]);
    assert_eq!(after.status.code(), Some(77), "{}", stderr(&after));
    assert!(
        stderr(&after).contains("no credential for user `bob`"),
        "{}",
        stderr(&after)
    );

    // The audit log: who did what, refused or not.
    let audit = std::fs::read_to_string(broker.state_dir().join("audit.log")).expect("audit.log");
    let lines: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let has = |who: &str, action: &str, outcome: &str| {
        lines
            .iter()
            .any(|l| l["who"] == who && l["action"] == action && l["outcome"] == outcome)
    };
    assert!(has("root", "user add", "ok"), "{audit}");
    assert!(has("bob", "drain", "refused"), "{audit}");
    assert!(has("bob", "user list", "refused"), "{audit}");
    assert!(has("bob", "release", "refused"), "{audit}");
    assert!(has("bob", "release", "ok"), "{audit}");
    assert!(has("root", "user revoke", "ok"), "{audit}");
    let mode = std::fs::metadata(broker.state_dir().join("audit.log"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn a_credential_others_can_read_is_refused_and_no_credential_means_the_secrets_error() {
    if !tests::is_root() {
        eprintln!("skipped: needs root to act as a second uid");
        return;
    }
    let broker = Broker::start(&local_lab(1));
    let bob = Home::with_credential(&add_bob(&broker));
    let cred = bob.0.path().join(".config/rb/credential");
    std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let out = bob.rb(&broker, &["status"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
    std::fs::remove_file(&cred).expect("rm");
    let out = bob.rb(&broker, &["status"]);
    assert!(
        stderr(&out).contains("rb init"),
        "the lab secret's error: {}",
        stderr(&out)
    );
}
