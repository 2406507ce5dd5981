//! In-process tests of [`run`]: the real core task with a paused tokio clock, driven by the
//! events connections and supervisors send, asserting the messages agents get. No sockets,
//! no daemons: the supervisor set is empty and "daemons" are events.

use std::{collections::HashMap, path::Path, time::Duration};

use config::HostEntry;
use proto::{
    msg::{FromBroker, JobRegistration, Request, Response, ToBroker},
    report::{HostReport, HostStatus, UserSession},
};
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};

use super::{run, Event, EventSender, Reported};
use crate::{
    alloc::{AllocConfig, Allocator, JobId},
    host_words::{HostWord, WordSender},
    hosts::HostTable,
    jobs::JobDesk,
    supervisor::SupervisorSet,
};

/// How long (on the paused clock) a test waits for a message before it fails.
const WAIT: Duration = Duration::from_secs(30);

/// A running core and the sender its events go to.
struct Core {
    events: EventSender,
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<HostStatus>>,
    next_conn: u64,
    /// What each connected host daemon is told of its host's allocations.
    words: HashMap<String, WordSender>,
}

/// A registered job's agent: its id and the messages the broker sends it.
struct Agent {
    job: JobId,
    rx: mpsc::Receiver<FromBroker>,
}

fn entry(name: &str, owner: Option<&str>) -> HostEntry {
    HostEntry {
        name: name.into(),
        address: format!("10.77.0.{}", name.len()),
        labels: vec![],
        owner: owner.map(String::from),
    }
}

/// A report with no sessions and an unknown console: a quiet, idle linux host.
fn idle_report(host: &str) -> HostReport {
    HostReport {
        hostname: host.into(),
        cpus: Some(2),
        load: Some([0.0; 3]),
        users: Some(vec![]),
        // Known and idle for an hour: an unknown console is never away.
        console_idle_s: Some(3600),
        labels: vec!["linux".into()],
        ..HostReport::default()
    }
}

impl Core {
    fn start(hosts: &[HostEntry]) -> Core {
        Core::start_with_queue(hosts, 64)
    }

    /// A core whose event queue holds `capacity` events.
    fn start_with_queue(hosts: &[HostEntry], capacity: usize) -> Core {
        let table = HostTable::new(hosts, Duration::from_secs(6));
        let alloc = Allocator::with_config(AllocConfig::default());
        let desk = JobDesk::new(alloc, vec!["ssh".into()], "ssh", Path::new("/no/secret"));
        let (events, rx) = super::channel(capacity);
        let (stop, stop_rx) = watch::channel(false);
        let supervisors = SupervisorSet::default();
        let task = tokio::spawn(run(table, desk, rx, supervisors, stop_rx));
        Core {
            events,
            stop,
            task,
            next_conn: 1,
            words: HashMap::new(),
        }
    }

    async fn send(&self, event: Event) {
        self.events.send(event).await.expect("core runs");
    }

    /// A daemon for `host` connects and sends `report`; returns its connection.
    async fn report(&mut self, host: &str, report: HostReport) -> u64 {
        let conn = self.next_conn;
        self.next_conn += 1;
        let (close, _closed) = oneshot::channel();
        let word = WordSender::default();
        let host = host.to_string();
        let connected = Event::HostdConnected {
            host: host.clone(),
            conn,
            close,
            word: word.clone(),
        };
        self.words.insert(host.clone(), word);
        self.send(connected).await;
        self.report_on(&host, conn, report).await;
        conn
    }

    /// The row the core told `host`'s session, handed over with its reports as sessions do.
    fn row_of(&self, host: &str) -> Option<u32> {
        self.words.get(host).and_then(|word| word.row())
    }

    /// The daemon of `host` on connection `conn` sends `report`.
    async fn report_on(&self, host: &str, conn: u64, mut report: HostReport) {
        let allocs_running = report.allocs_running.take();
        self.send(Event::Report {
            host: host.to_string(),
            conn,
            row: self.row_of(host),
            report: Reported::Whole(Box::new(report)),
            allocs_running,
        })
        .await;
    }

    /// The daemon of `host` on connection `conn` sends its last report again with the
    /// counter `seq` (what its connection finds without parsing it).
    async fn same_on(&self, host: &str, conn: u64, seq: u64) {
        let same = Event::Report {
            host: host.to_string(),
            conn,
            row: self.row_of(host),
            report: Reported::Same { seq },
            allocs_running: None,
        };
        self.send(same).await;
    }

    async fn register(&self, adaptive: bool) -> Agent {
        let reg = Box::new(JobRegistration {
            user: "alice".into(),
            cwd: "/home/alice".into(),
            argv: vec!["app".into()],
            spec: None,
            adaptive,
            resume: None,
            runs_on: None,
            module: None,
        });
        let (tx, outbox) = crate::outbox::channel(64);
        let mut rx = outbox.messages;
        let (reply, job) = oneshot::channel();
        self.send(Event::AgentRegister { reg, tx, reply }).await;
        let job = job.await.expect("answered").expect("registered");
        assert!(matches!(next(&mut rx).await, FromBroker::Registered { .. }));
        Agent { job, rx }
    }

    async fn allocate(&self, agent: &Agent, req: u64, symbolic: &str) {
        let msg = ToBroker::Allocate {
            req,
            symbolic: symbolic.into(),
        };
        self.send(Event::AgentMessage {
            job: agent.job,
            msg,
            turn: None,
        })
        .await;
    }

    async fn admin(&self, req: Request) -> Result<Response, String> {
        self.settle().await;
        let (reply, answer) = oneshot::channel();
        let actor = crate::authz::Actor::Owner;
        self.send(Event::Admin { actor, req, reply }).await;
        answer.await.expect("answered").map_err(|e| e.to_string())
    }

    /// `rb status` once the events sent before are applied (a request has a queue of its
    /// own: it may be answered before them).
    async fn status(&self) -> Vec<HostStatus> {
        self.settle().await;
        self.status_now().await
    }

    /// `rb status` as the core answers it (in parts, joined into rows as the connection
    /// joins them), events sent before or not.
    async fn status_now(&self) -> Vec<HostStatus> {
        let (reply, parts) = oneshot::channel();
        self.send(Event::StatusParts { reply }).await;
        let parts = parts.await.expect("answered");
        parts
            .iter()
            .map(|part| part.to_row().expect("a row reads back"))
            .collect()
    }

    /// Waits until the core took (and so applied) every event sent so far.
    async fn settle(&self) {
        while self.events.events_waiting() > 0 {
            tokio::task::yield_now().await;
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.expect("core ends cleanly");
    }
}

impl Core {
    /// The next word to `host`'s daemon, or a failure after [`WAIT`].
    async fn next_word(&mut self, host: &str) -> Option<HostWord> {
        let word = &self.words[host];
        let next = tokio::time::timeout(WAIT, word.next()).await;
        Some(next.expect("a word within the wait"))
    }

    /// The last word to `host`'s daemon, and whether it is news since the last look.
    fn word(&self, host: &str) -> (Option<HostWord>, bool) {
        use std::{
            future::Future,
            pin::pin,
            task::{Context, Poll, Waker},
        };
        let slot = &self.words[host];
        match pin!(slot.next()).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(word) => (Some(word), true),
            Poll::Pending => (slot.current(), false),
        }
    }
}

/// The next message to an agent, or a failure after [`WAIT`].
async fn next(rx: &mut mpsc::Receiver<FromBroker>) -> FromBroker {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("a message within the wait")
        .expect("channel open")
}

/// The next message that is not a queue position update.
async fn next_decision(rx: &mut mpsc::Receiver<FromBroker>) -> FromBroker {
    loop {
        match next(rx).await {
            FromBroker::Queued { .. } => continue,
            other => return other,
        }
    }
}

/// A grant decided while another agent registers was thrown away
/// (`let _ = desk.hosts_changed(..)`), and the waiting request was never answered.
#[tokio::test(start_paused = true)]
async fn grant_decided_while_an_agent_registers_is_sent() {
    let mut core = Core::start(&[entry("node02", None)]);
    let mut waiting = core.register(false).await;
    core.allocate(&waiting, 7, "anyHost").await;
    assert!(matches!(
        next(&mut waiting.rx).await,
        FromBroker::Queued { req: 7, .. }
    ));
    core.report("node02", idle_report("node02")).await;
    let _other = core.register(false).await;
    match next_decision(&mut waiting.rx).await {
        FromBroker::Granted { req, host, .. } => assert_eq!((req, host.as_str()), (7, "node02")),
        other => panic!("expected the grant, got {other:?}"),
    }
    core.stop().await;
}

/// A host's daemon learns which allocations of its host are live (to end leftovers of the
/// others) when it connects and as soon as a grant or a give-back changes them, with every
/// id issued so far; the daemons of other hosts hear nothing of it.
#[tokio::test(start_paused = true)]
async fn host_daemons_are_told_each_change_of_their_hosts_allocations_only() {
    let mut core = Core::start(&[entry("node02", None), entry("node03", None)]);
    let mut agent = core.register(false).await;
    core.report("node02", idle_report("node02")).await;
    let word = |live: Vec<u64>, issued_below| {
        Some(HostWord {
            live,
            issued_below,
            ending: vec![],
        })
    };
    assert_eq!(core.next_word("node02").await, word(vec![], 1));
    core.allocate(&agent, 1, "anyHost").await;
    let alloc = match next_decision(&mut agent.rx).await {
        FromBroker::Granted { alloc, .. } => alloc,
        other => panic!("expected a grant, got {other:?}"),
    };
    assert_eq!(core.next_word("node02").await, word(vec![alloc], alloc + 1));
    // node03's daemon connects after the grant: its word bounds the ids issued so far.
    core.report("node03", idle_report("node03")).await;
    assert_eq!(core.next_word("node03").await, word(vec![], alloc + 1));
    core.allocate(&agent, 2, "anyHost").await;
    let other = match next_decision(&mut agent.rx).await {
        FromBroker::Granted { alloc, host, .. } if host == "node03" => alloc,
        other => panic!("expected a grant of node03, got {other:?}"),
    };
    assert_eq!(core.next_word("node03").await, word(vec![other], other + 1));
    let _ = core.status().await; // every word of the grant is out
    assert_eq!(
        core.word("node02"),
        (word(vec![alloc], alloc + 1), false),
        "a grant of another host is no news to node02"
    );
    let msg = ToBroker::GiveBack { alloc };
    core.send(Event::AgentMessage {
        job: agent.job,
        msg,
        turn: None,
    })
    .await;
    let _ = core.status().await; // the give-back is applied
    assert_eq!(core.word("node02"), (word(vec![], other + 1), true));
    assert!(!core.word("node03").1, "node03's allocation stays");
    core.stop().await;
}

/// A job cannot return another job's live allocation; a late (repeated) return of one
/// that is over changes nothing (the fault suite sees those after a broker restart).
#[tokio::test(start_paused = true)]
async fn returns_of_allocations_not_held_by_the_job_change_nothing() {
    let mut core = Core::start(&[entry("node02", None)]);
    let mut holder = core.register(false).await;
    let other = core.register(false).await;
    core.report("node02", idle_report("node02")).await;
    core.allocate(&holder, 1, "anyHost").await;
    let alloc = match next_decision(&mut holder.rx).await {
        FromBroker::Granted { alloc, .. } => alloc,
        other => panic!("expected a grant, got {other:?}"),
    };
    let live = |core: &Core| core.word("node02").0.map(|w| w.live);
    for msg in [ToBroker::Released { alloc }, ToBroker::GiveBack { alloc }] {
        core.send(Event::AgentMessage {
            job: other.job,
            msg,
            turn: None,
        })
        .await;
        let _ = core.status().await;
        assert_eq!(live(&core), Some(vec![alloc]), "another job returned it");
    }
    for _ in 0..2 {
        let msg = ToBroker::Released { alloc };
        core.send(Event::AgentMessage {
            job: holder.job,
            msg,
            turn: None,
        })
        .await;
        let _ = core.status().await;
        assert_eq!(live(&core), Some(vec![]));
    }
    core.stop().await;
}

/// An owner-return reclaim decided while another agent registered was thrown
/// away; the adaptive holder was never warned.
#[tokio::test(start_paused = true)]
async fn owner_return_reclaim_decided_while_an_agent_registers_is_sent() {
    let mut core = Core::start(&[entry("ws1", Some("bob"))]);
    core.report("ws1", idle_report("ws1")).await;
    let mut holder = core.register(true).await;
    core.allocate(&holder, 1, "anyHost").await;
    let alloc = match next_decision(&mut holder.rx).await {
        FromBroker::Granted { alloc, .. } => alloc,
        other => panic!("expected a grant, got {other:?}"),
    };
    let mut back = idle_report("ws1");
    back.users = Some(vec![UserSession {
        user: "bob".into(),
        tty: "pts/0".into(),
        idle_s: Some(2),
        from: None,
    }]);
    core.report("ws1", back).await;
    let _other = core.register(false).await;
    match next_decision(&mut holder.rx).await {
        FromBroker::Reclaim { alloc: a, host, .. } => {
            assert_eq!((a, host.as_str()), (alloc, "ws1"))
        }
        other => panic!("expected the owner-return reclaim, got {other:?}"),
    }
    core.stop().await;
}

/// On a fresh broker (no report, no job) drain and resume know the lab
/// file's hosts, and `rb status` shows the drain.
#[tokio::test(start_paused = true)]
async fn drain_and_resume_work_before_any_report_or_job() {
    let core = Core::start(&[entry("node02", None), entry("node03", None)]);
    let drained = core
        .admin(Request::Drain {
            host: "node03".into(),
        })
        .await;
    assert!(matches!(drained, Ok(Response::Done { .. })), "{drained:?}");
    let rows = core.status().await;
    assert_eq!(
        (rows[1].drained, rows[1].alloc_state.as_str()),
        (true, "drained")
    );
    assert_eq!(
        (rows[0].drained, rows[0].alloc_state.as_str()),
        (false, "free")
    );
    let resumed = core
        .admin(Request::Resume {
            host: "node03".into(),
        })
        .await;
    assert!(matches!(resumed, Ok(Response::Done { .. })), "{resumed:?}");
    let unknown = core
        .admin(Request::Drain {
            host: "node09".into(),
        })
        .await;
    assert!(unknown.is_err_and(|e| e.contains("no host named")));
    core.stop().await;
}

/// A report reaches the allocator as it arrives: a waiting request is granted by the report
/// itself, before the core's clock moves (no tick needed).
#[tokio::test(start_paused = true)]
async fn report_grants_a_waiting_request_without_a_tick() {
    let mut core = Core::start(&[entry("node02", None)]);
    let mut waiting = core.register(false).await;
    core.allocate(&waiting, 3, "anyLinux").await;
    assert!(matches!(
        next(&mut waiting.rx).await,
        FromBroker::Queued { req: 3, .. }
    ));
    let before = tokio::time::Instant::now();
    core.report("node02", idle_report("node02")).await;
    let granted = next_decision(&mut waiting.rx).await;
    assert!(
        matches!(granted, FromBroker::Granted { req: 3, .. }),
        "{granted:?}"
    );
    assert_eq!(
        tokio::time::Instant::now(),
        before,
        "granted without a tick"
    );
    let rows = core.status().await;
    assert_eq!(rows[0].held_by, Some(waiting.job));
    assert_eq!(rows[0].alloc_state, "held");
    core.stop().await;
}

fn policy(text: &str) -> std::sync::Arc<policies::Policy> {
    let p = policies::Policy::from_text(Path::new("test.toml"), text).expect("a valid policy");
    std::sync::Arc::new(p)
}

impl Core {
    async fn set_policy(&self, text: &str) {
        // As `reload` does: the host decisions prepared from the core's inputs, off it.
        self.settle().await;
        let (reply, inputs) = oneshot::channel();
        self.send(Event::PolicyInputs { reply }).await;
        let prepared = Box::new(inputs.await.expect("inputs").prepare(policy(text)));
        let (reply, done) = oneshot::channel();
        self.send(Event::SetPolicy { prepared, reply }).await;
        done.await.expect("policy set");
    }

    async fn explain(&self, host: &str, job: Option<JobId>) -> Result<serde_json::Value, String> {
        self.settle().await;
        let (reply, answer) = oneshot::channel();
        let host = host.to_string();
        self.send(Event::Explain { host, job, reply }).await;
        answer.await.expect("answered")
    }
}

/// A reloaded policy is in force at once: the waiting request the old one
/// refused every host to is granted the host the new one allows, and no other.
#[tokio::test(start_paused = true)]
async fn reload_changes_which_host_is_granted() {
    let mut core = Core::start(&[entry("node02", None), entry("node03", None)]);
    core.report("node02", idle_report("node02")).await;
    core.report("node03", idle_report("node03")).await;
    core.set_policy("start = 'false'").await;
    let mut waiting = core.register(false).await;
    core.allocate(&waiting, 1, "anyHost").await;
    assert!(matches!(
        next(&mut waiting.rx).await,
        FromBroker::Queued { req: 1, .. }
    ));
    core.set_policy(r#"start = 'host.name == "node03"'"#).await;
    match next_decision(&mut waiting.rx).await {
        FromBroker::Granted { req, host, .. } => assert_eq!((req, host.as_str()), (1, "node03")),
        other => panic!("expected node03, got {other:?}"),
    }
    core.allocate(&waiting, 2, "anyHost").await;
    assert!(matches!(
        next(&mut waiting.rx).await,
        FromBroker::Queued { req: 2, .. }
    ));
    core.stop().await;
}

/// `rb policy explain` gives each hook's value and the inputs it read, and
/// `rb status` says why a free host is not startable.
#[tokio::test(start_paused = true)]
async fn explain_and_status_say_why_a_host_is_not_startable() {
    let mut core = Core::start(&[entry("ws1", Some("bob"))]);
    let mut busy = idle_report("ws1");
    busy.users = Some(vec![UserSession {
        user: "bob".into(),
        tty: "pts/0".into(),
        idle_s: Some(12),
        from: None,
    }]);
    core.report("ws1", busy).await;
    let rows = core.status().await;
    assert_eq!(
        rows[0].policy_note.as_deref(),
        Some("owner active 12 s ago (utmp pts/0)")
    );
    let e = core.explain("ws1", None).await.expect("explained");
    let start = e["hooks"]
        .as_array()
        .and_then(|h| h.iter().find(|h| h["key"] == "start"))
        .expect("start explained")
        .clone();
    assert_eq!(start["value"], serde_json::json!(false));
    let inputs = start["inputs"].to_string();
    assert!(
        inputs.contains("host.owner_idle_s") && inputs.contains("12"),
        "{inputs}"
    );
    let unknown = core.explain("ws9", None).await;
    assert!(unknown.is_err_and(|e| e.contains("no host named")));
    let no_job = core.explain("ws1", Some(42)).await;
    assert!(no_job.is_err_and(|e| e.contains("job 42 is not running")));
    core.stop().await;
}

/// Reports that repeat the last one (parsed, or found the same text by the connection)
/// skip the allocator (`HostTable::take_repeated`); the first that differs must still reach it and `rb status`: an owner who was active on her
/// private host goes away, and the adaptive job waiting for it gets it.
#[tokio::test(start_paused = true)]
async fn a_changed_report_after_repeated_ones_reaches_the_allocator_and_the_status() {
    let mut core = Core::start(&[entry("ws", Some("bob"))]);
    let active = HostReport {
        console_idle_s: Some(10),
        ..idle_report("ws")
    };
    let conn = core.report("ws", active.clone()).await;
    let mut agent = core.register(true).await;
    core.allocate(&agent, 1, "anyHost").await;
    assert!(matches!(
        next(&mut agent.rx).await,
        FromBroker::Queued { req: 1, .. }
    ));
    for seq in 2..7 {
        tokio::time::advance(Duration::from_secs(1)).await;
        if seq < 5 {
            let again = HostReport {
                seq,
                ..active.clone()
            };
            core.report_on("ws", conn, again).await;
        } else {
            // Found the same text by its connection: not parsed, not sent whole.
            core.same_on("ws", conn, seq).await;
        }
        let row = core.status().await.remove(0);
        assert_eq!(row.last_report_age_s, Some(0.0), "the repeat is heard");
        assert_eq!(row.console_idle_s, Some(10));
        assert_eq!(row.alloc_state, "free");
    }
    let away = HostReport {
        seq: 7,
        console_idle_s: Some(600),
        ..active
    };
    core.report_on("ws", conn, away).await;
    match next_decision(&mut agent.rx).await {
        FromBroker::Granted { req, host, .. } => assert_eq!((req, host.as_str()), (1, "ws")),
        other => panic!("expected the grant, got {other:?}"),
    }
    let row = core.status().await.remove(0);
    assert_eq!(row.console_idle_s, Some(600));
    assert_eq!(row.held_by, Some(agent.job));
    core.stop().await;
}

/// `rb status` at 10k hosts waited behind the second's burst of reports (0.3 s): requests
/// have a queue of their own now, served before the next batch of reports. Here 200
/// reports are queued before the request (`rb policy explain`, answered at once; a status
/// answer is then built in pieces between batches, `status_answers`); with one queue the
/// answer always saw all 200, now at most one batch.
#[tokio::test(start_paused = true)]
async fn a_request_does_not_wait_behind_queued_reports() {
    let mut core = Core::start_with_queue(&[entry("node02", None)], 256);
    let conn = core.report("node02", idle_report("node02")).await;
    core.settle().await;
    // Queued with no yield to the core (tokio's budget would make the sender yield).
    tokio::task::unconstrained(async {
        for i in 1..=200 {
            let mut report = idle_report("node02");
            report.seq = i;
            report.load = Some([i as f64, 0.0, 0.0]);
            core.report_on("node02", conn, report).await;
        }
    })
    .await;
    // The core may be woken inside its wait with both queues ready and take one batch of
    // reports first (the pick is random: neither queue starves); never more than one.
    let (reply, answer) = oneshot::channel();
    core.send(Event::Explain {
        host: "node02".into(),
        job: None,
        reply,
    })
    .await;
    let explained = answer.await.expect("answered").expect("explained");
    let load = explained["host_facts"]["load1"]
        .as_f64()
        .expect("the first report's load at least");
    assert!(
        load <= super::REPORT_BATCH as f64,
        "answered after more than one batch of the queued reports (load {load})"
    );
    core.stop().await;
}

/// Reports are applied in batches (`REPORT_BATCH`); an agent's message queued right behind
/// them is applied only once the allocator heard of their hosts: the host that just
/// reported is granted at once, not queued for.
#[tokio::test(start_paused = true)]
async fn a_request_queued_behind_reports_sees_their_hosts() {
    let mut core = Core::start(&[entry("node02", None), entry("node03", None)]);
    let mut agent = core.register(false).await;
    let conn = core.report("node02", idle_report("node02")).await;
    for seq in 2..10 {
        let report = HostReport {
            seq,
            ..idle_report("node02")
        };
        core.report_on("node02", conn, report).await;
    }
    core.allocate(&agent, 1, "anyHost").await;
    match next(&mut agent.rx).await {
        FromBroker::Granted { req, host, .. } => assert_eq!((req, host.as_str()), (1, "node02")),
        other => panic!("expected node02 at once, got {other:?}"),
    }
    core.stop().await;
}

/// A turn's events handed over as one run reach the core one by one in their order, and a
/// request among them goes to the requests' queue (served before the next batch), not
/// into the run.
#[tokio::test]
async fn a_run_of_events_is_taken_one_by_one_in_order_and_its_requests_go_apart() {
    let (sender, mut queues) = super::channel(4);
    let started = |host: &str| Event::DaemonStarted { host: host.into() };
    let (reply, _answer) = oneshot::channel();
    let run = vec![
        started("h1"),
        Event::StatusParts { reply },
        started("h2"),
        started("h3"),
    ];
    // From a thread outside any runtime, as the host daemons' turns send.
    std::thread::spawn(move || sender.blocking_send_all(run))
        .join()
        .expect("the sending thread")
        .expect("the core's queues are there");
    let mut hosts = Vec::new();
    while let Some(event) = queues.events.try_recv() {
        match event {
            Event::DaemonStarted { host } => hosts.push(host),
            other => panic!("not in the run: {other:?}"),
        }
    }
    assert_eq!(hosts, ["h1", "h2", "h3"]);
    assert!(matches!(
        queues.requests.try_recv(),
        Ok(Event::StatusParts { .. })
    ));
}

/// A turn of more than [`super::RUN_EVENTS`] events (a connect storm) goes as several runs,
/// each at most that long, so that the queue's room in runs bounds the events it holds; the
/// core still takes them in their order.
#[tokio::test]
async fn a_long_turn_goes_as_runs_of_a_bounded_length_in_order() {
    let (sender, mut queues) = super::channel(8);
    let n = 2 * super::RUN_EVENTS + 3;
    let run: Vec<Event> = (0..n)
        .map(|i| Event::DaemonStarted {
            host: format!("h{i}"),
        })
        .collect();
    let waiting = sender.clone();
    std::thread::spawn(move || sender.blocking_send_all(run))
        .join()
        .expect("the sending thread")
        .expect("the core's queues are there");
    assert_eq!(waiting.events_waiting(), 3, "runs of at most RUN_EVENTS");
    let mut hosts = Vec::new();
    while let Some(Event::DaemonStarted { host }) = queues.events.try_recv() {
        hosts.push(host);
    }
    let expected: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
    assert_eq!(hosts, expected);
}
