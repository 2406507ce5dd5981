//! The job desk with agents' messages as the broker's connections hand them in.

use proto::{
    msg::AgentHost,
    report::{HostState, HostStatus},
};

use super::*;

fn status(name: &str, address: &str) -> HostStatus {
    HostStatus {
        name: name.into(),
        address: address.into(),
        state: HostState::Up,
        down_reason: None,
        hostname: Some(name.into()),
        cpus: Some(1),
        load1: Some(0.0),
        load5: None,
        load15: None,
        cpu_util: None,
        mem_total_kb: None,
        mem_available_kb: None,
        os: Some("Linux".into()),
        arch: None,
        users: Vec::new(),
        users_known: true,
        console_idle_s: None,
        logind: None,
        logind_error: None,
        warnings: Vec::new(),
        managed_procs: None,
        job_load: None,
        labels: vec!["linux".into(), "public".into()],
        owner: None,
        last_report_age_s: Some(0.5),
        daemon_starts: 1,
        alloc_state: String::new(),
        held_by: None,
        drained: false,
        policy_note: None,
        slurm_job: None,
        lease_left_s: None,
        lease_ending: false,
    }
}

fn registration(module: Option<&str>) -> JobRegistration {
    JobRegistration {
        user: "alice".into(),
        cwd: "/".into(),
        argv: vec!["pvm".into()],
        spec: None,
        adaptive: true,
        resume: None,
        runs_on: Some(AgentHost {
            hostname: "workstation-1".into(),
            addresses: vec!["127.0.0.1".into(), "10.0.0.1".into()],
        }),
        module: module.map(String::from),
    }
}

/// A job desk over an empty allocator, jobs over ssh.
fn desk() -> JobDesk {
    JobDesk::new(
        Allocator::new(),
        vec!["ssh".into()],
        "ssh",
        std::path::Path::new("/nonexistent/secret"),
    )
}

fn granted_host(effects: &[Effect]) -> Option<String> {
    effects.iter().find_map(|e| match e {
        Effect::Granted { host, .. } => Some(host.clone()),
        _ => None,
    })
}

/// A user releases the hosts of their own jobs only, and drains nothing.
#[tokio::test]
async fn a_user_releases_only_their_own_jobs_hosts() {
    let mut desk = desk();
    let now = Instant::now();
    host_changed(&mut desk, status("node02", "10.0.0.2"), now);
    let (tx, _rx) = crate::outbox::channel(16);
    let mut reg = registration(None);
    reg.user = "bob".into();
    let (job, _) = desk.register(reg, tx, now).expect("registered");
    let allocate = ToBroker::Allocate {
        req: 1,
        symbolic: "anyLinux".into(),
    };
    let effects = desk.agent_message(job, allocate, now);
    assert_eq!(granted_host(&effects).as_deref(), Some("node02"));
    let release = || Request::Release {
        host: "node02".into(),
        grace_ms: Some(0),
    };
    let eve = Actor::User("eve".into());
    let (answer, effects) = desk.admin(&eve, release(), now);
    assert!(matches!(answer, Err(AdminError::Denied(_))), "{answer:?}");
    assert!(effects.is_empty(), "nothing done");
    let drain = Request::Drain {
        host: "node02".into(),
    };
    let bob = Actor::User("bob".into());
    let (answer, _) = desk.admin(&bob, drain, now);
    assert!(matches!(answer, Err(AdminError::Denied(_))), "{answer:?}");
    let (answer, effects) = desk.admin(&bob, release(), now);
    assert!(matches!(answer, Ok(Response::Done { .. })), "{answer:?}");
    assert!(!effects.is_empty(), "the reclaim starts");
}

/// A module job on a lab host, as the broker sees it: the agent runs on node01 (found by its
/// address); a module job is never granted node01, a plain job may be.
#[tokio::test]
async fn a_module_job_is_never_granted_the_host_its_agent_runs_on() {
    let mut desk = desk();
    let now = Instant::now();
    let hosts = [
        status("node01", "10.0.0.1"),
        status("node02", "10.0.0.2"),
        status("node03", "10.0.0.3"),
    ];
    for host in hosts {
        host_changed(&mut desk, host, now);
    }
    let (tx, _rx) = crate::outbox::channel(16);
    let (pvm, _) = desk
        .register(registration(Some("pvm")), tx, now)
        .expect("no store: never refused");
    let allocate = |req| ToBroker::Allocate {
        req,
        symbolic: "anyLinux".into(),
    };
    let effects = desk.agent_message(pvm, allocate(1), now);
    assert_eq!(granted_host(&effects).as_deref(), Some("node02"));
    let in_use = ToBroker::HostsInUse {
        hosts: vec!["10.0.0.3".into(), "not-in-the-lab".into()],
    };
    desk.agent_message(pvm, in_use, now);
    let effects = desk.agent_message(pvm, allocate(2), now);
    assert_eq!(
        granted_host(&effects),
        None,
        "node01 and node03 in use: {effects:?}"
    );
    let (tx, _rx2) = crate::outbox::channel(16);
    let (plain, _) = desk
        .register(registration(None), tx, now)
        .expect("no store: never refused");
    let effects = desk.agent_message(plain, allocate(1), now);
    assert_eq!(granted_host(&effects).as_deref(), Some("node01"));
}

/// Reports that repeated the last one of their hosts go to the allocator as one input, one
/// trace line that names them all, a held host among them (its `vacate` is asked on every
/// report, from the view the allocator holds): no row is built for any.
#[tokio::test]
async fn repeated_hosts_are_one_trace_line_a_held_one_among_them() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("trace");
    let now = Instant::now();
    let clock = allocation::TraceClock::new(now, 0);
    let sink = crate::trace::TraceSink::spawn(dir.clone(), 1 << 20, 2, clock, "r".into())
        .expect("a trace");
    let mut desk = desk().with_trace(sink);
    for n in 2..=4 {
        host_changed(
            &mut desk,
            status(&format!("node0{n}"), &format!("10.0.0.{n}")),
            now,
        );
    }
    let (tx, _rx) = crate::outbox::channel(16);
    let (job, _) = desk
        .register(registration(None), tx, now)
        .expect("registered");
    let allocate = ToBroker::Allocate {
        req: 1,
        symbolic: "anyLinux".into(),
    };
    let held = granted_host(&desk.agent_message(job, allocate, now)).expect("a grant");
    let hosts: Vec<String> = ["node02", "node03", "node04"].map(String::from).to_vec();
    let later = now + std::time::Duration::from_secs(1);
    desk.hosts_repeated(hosts.clone(), later);
    let after = desk.alloc.host_alloc(&held);
    assert_eq!(
        (after.alloc_state, after.held_by),
        ("held", Some(job)),
        "the held host stays held"
    );
    drop(desk); // the writer thread writes what it was given, then ends
    let files = crate::trace::trace_files(&dir).expect("listed");
    let text = std::fs::read_to_string(&files[0].1).expect("read");
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("repeated")).collect();
    let expected = r#""input":{"kind":"hosts_repeated","hosts":["node02","node03","node04"]}"#;
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains(expected), "{}", lines[0]);
    let host_inputs = text.matches(r#""kind":"host","#).count();
    assert_eq!(
        host_inputs, 3,
        "the three first reports, no row after:\n{text}"
    );
}

/// [`JobDesk::host_changed`] with a whole row, as its two parts.
fn host_changed(desk: &mut JobDesk, row: HostStatus, now: Instant) -> Vec<Effect> {
    desk.host_changed(&row.fixed_part(), &row.live_part(), now)
}

/// Hosts whose rows carry the same labels share one list in the allocator's views (a
/// changing report then copies and compares no label); a host whose labels differ has a
/// list of its own, in the name form symbolic names spell (`x86-64` for `x86_64`).
#[test]
fn hosts_with_the_same_labels_share_one_list_in_the_allocators_views() {
    let mut desk = desk();
    let now = Instant::now();
    let mut odd = status("n3", "10.0.0.3");
    odd.labels.push("x86_64".into());
    for row in [status("n1", "10.0.0.1"), status("n2", "10.0.0.2"), odd] {
        host_changed(&mut desk, row, now);
    }
    let labels =
        |desk: &JobDesk, host: &str| Arc::clone(&desk.alloc.host_view(host).expect("known").labels);
    assert!(Arc::ptr_eq(&labels(&desk, "n1"), &labels(&desk, "n2")));
    assert_eq!(
        *labels(&desk, "n1"),
        ["linux".to_string(), "public".to_string()]
    );
    assert_eq!(
        *labels(&desk, "n3"),
        [
            "linux".to_string(),
            "public".to_string(),
            "x86-64".to_string()
        ]
    );
    // The next report of n1 (its load moved) keeps the list it had.
    let before = labels(&desk, "n1");
    let mut again = status("n1", "10.0.0.1");
    again.load1 = Some(0.5);
    host_changed(&mut desk, again, now);
    assert!(Arc::ptr_eq(&before, &labels(&desk, "n1")));
}
