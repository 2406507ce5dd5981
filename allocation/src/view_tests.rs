//! Tests of the allocator's views: why a request waits, a host's allocation state, job rows;
//! and that hosts known from the lab file (never reported) can be drained.

use std::time::{Duration, Instant};

use super::super::host::tests::{session, view};
use super::*;
use crate::{AllocConfig, AllocError, Effect, HostView, JobInfo};

fn info(adaptive: bool) -> JobInfo {
    JobInfo {
        user: "alice".into(),
        cwd: "/".into(),
        argv: vec!["app".into()],
        spec: None,
        adaptive,
    }
}

/// An allocator that knows `views`, checked after every step by the callers.
fn allocator(views: Vec<HostView>, now: Instant) -> Allocator {
    let mut a = Allocator::new();
    for v in views {
        a.host_changed(v, now);
    }
    a
}

/// The reason last reported for `req` in `fx`.
fn reason(fx: &[Effect], req: RequestId) -> String {
    fx.iter()
        .rev()
        .find_map(|e| match e {
            Effect::Queued { req: r, reason, .. } if *r == req => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Queued for {req}: {fx:?}"))
}

/// A view of a host the lab file names but whose daemon never reported.
fn unreported(name: &str) -> HostView {
    HostView {
        up: false,
        reported: false,
        labels: vec![].into(),
        load1: None,
        cpus: None,
        users: None,
        ..view(name)
    }
}

#[test]
fn hosts_known_from_the_lab_file_can_be_drained_before_any_report_or_job() {
    let now = Instant::now();
    let mut a = allocator(vec![unreported("node02"), unreported("node03")], now);
    assert!(a.drain("node03").is_ok());
    assert_eq!(a.host_alloc("node03").alloc_state, "drained");
    assert!(a.resume("node03", now).is_ok());
    assert!(a
        .release_host("node02", Duration::ZERO, now)
        .is_err_and(|e| matches!(e, AllocError::NotHeld { .. })));
    assert!(matches!(
        a.drain("node09"),
        Err(AllocError::UnknownHost { .. })
    ));
    a.check_invariants().expect("invariants");
}

#[test]
fn a_request_says_why_it_waits() {
    let now = Instant::now();
    let mut ws = view("ws");
    ws.owner = Some("bob".into());
    ws.users = Some(vec![session(Some(5))]);
    let mut down = view("down");
    down.up = false;
    let mut a = allocator(vec![view("n1"), ws, down], now);
    let holder = a.register_job(info(false), now).0;
    a.request(holder, "anyHost", now);
    a.drain("n1").expect("drain");
    let j = a.register_job(info(false), now).0;
    let (req, fx) = a.request(j, "anyHost", now);
    let why = reason(&fx, req);
    assert_eq!(
        why, "3 matching host(s): 1 owner active, 1 drained, 1 down",
        "a drained host counts as drained even while held"
    );
    assert_eq!(a.wait_reason(0).code(), "mixed");
    let (gpu, fx) = a.request(j, "anyGpu", now);
    assert!(
        matches!(fx[0], Effect::Refused { .. }),
        "every host reported: refused, {fx:?}"
    );
    a.host_changed(unreported("late"), now);
    let (gpu2, fx) = a.request(j, "anyGpu", now);
    assert_ne!(gpu, gpu2);
    assert_eq!(
        reason(&fx, gpu2),
        "no host matches yet (1 host(s) have not reported their labels)"
    );
    a.check_invariants().expect("invariants");
}

#[test]
fn reason_names_the_reclaim_and_a_single_cause_gets_its_code() {
    let now = Instant::now();
    let mut a = allocator(vec![view("n1"), view("n2")], now);
    let adaptive = a.register_job(info(true), now).0;
    a.request(adaptive, "anyHost", now);
    let rigid = a.register_job(info(false), now).0;
    a.request(rigid, "anyHost", now);
    let (req, fx) = a.request(rigid, "anyHost", now);
    assert_eq!(
        reason(&fx, req),
        format!("taking n1 back from job {adaptive} for it")
    );
    assert_eq!(a.wait_reason(0).code(), "reclaiming");
    assert_eq!(a.host_alloc("n1").alloc_state, "reserved");
    assert_eq!(a.host_alloc("n1").held_by, Some(adaptive));
    let (next, fx) = a.request(rigid, "anyHost", now);
    assert_eq!(
        reason(&fx, next),
        "2 matching host(s): 1 held by jobs, 1 reserved for earlier requests"
    );
    let mut b = allocator(vec![view("m1")], now);
    let j = b.register_job(info(false), now).0;
    b.request(j, "anyHost", now);
    b.request(j, "anyHost", now);
    assert_eq!(b.wait_reason(0).code(), "all_held");
    a.check_invariants().expect("invariants");
}

#[test]
fn host_alloc_states() {
    let now = Instant::now();
    let mut a = allocator(vec![view("n1"), view("n2"), view("n3")], now);
    let j = a.register_job(info(false), now).0;
    a.request(j, "anyHost", now);
    a.request(j, "anyHost", now);
    let state = |a: &Allocator, h: &str| (a.host_alloc(h).alloc_state, a.host_alloc(h).held_by);
    assert_eq!(state(&a, "n1"), ("held", Some(j)));
    assert_eq!(state(&a, "n3"), ("free", None));
    a.release_host("n2", Duration::from_secs(5), now)
        .expect("release");
    assert_eq!(state(&a, "n2"), ("releasing", Some(j)));
    a.drain("n1").expect("drain");
    a.drain("n3").expect("drain");
    assert_eq!(state(&a, "n1"), ("draining", Some(j)));
    assert_eq!(state(&a, "n3"), ("drained", None));
    assert!(a.host_alloc("n1").drained && !a.host_alloc("n2").drained);
}

#[test]
fn job_rows_carry_start_end_and_each_waiting_request() {
    let t0 = Instant::now();
    let mut a = allocator(vec![view("n1")], t0);
    let j = a.register_job(info(false), t0).0;
    a.request(j, "anyHost", t0);
    let t1 = t0 + Duration::from_secs(3);
    let (req, _) = a.request(j, "anyLinux", t1);
    let t2 = t1 + Duration::from_millis(4_250);
    let row = &a.jobs(t2)[0];
    assert_eq!(row.started_ago, Some(Duration::from_millis(7_250)));
    assert_eq!(row.ended_ago, None);
    assert_eq!(row.queued, ["anyLinux"]);
    let w = &row.waiting[0];
    assert_eq!((w.req, w.position, w.age_s), (req, 1, 4.3));
    assert_eq!(w.reason_code, "all_held");
    a.end_job(j, t2);
    let row = &a.jobs(t2 + Duration::from_secs(1))[0];
    assert_eq!(row.ended_ago, Some(Duration::from_secs(1)));
    assert!(row.waiting.is_empty());
}

/// The decision "a restored request is not granted" is the allocator's (the job
/// desk used to grant it and give it back); it never starts a reclaim either.
#[test]
fn restored_request_is_never_granted_and_never_reclaims() {
    let now = Instant::now();
    let mut a = allocator(vec![view("n1")], now);
    let adaptive = a.register_job(info(true), now).0;
    let (_, fx) = a.request(adaptive, "anyHost", now);
    let alloc = match fx[0] {
        Effect::Granted { alloc, .. } => alloc,
        ref other => panic!("{other:?}"),
    };
    let rigid = a.register_job(info(false), now).0;
    let (req, fx) = a.request(rigid, "anyHost", now);
    assert!(fx.iter().any(|e| matches!(e, Effect::Reclaim { .. })));
    let mut snap = a.snapshot();
    snap.allocations[0].releasing = None;
    let (mut b, dropped) = Allocator::restore(snap, AllocConfig::default(), now);
    assert!(dropped.is_empty());
    let fx = b.host_changed(view("n1"), now);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Reclaim { .. })),
        "no reclaim for a request nobody waits for: {fx:?}"
    );
    let fx = b.give_back(alloc, now);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Granted { .. })),
        "{fx:?}"
    );
    assert_eq!(b.host_alloc("n1").alloc_state, "free");
    assert!(
        b.jobs(now)[1].waiting.is_empty(),
        "request {req} left the queue"
    );
    b.check_invariants().expect("invariants");
}

/// A resumed agent re-sends the requests that still wait: the restored copies leave the
/// queue (else `rb jobs` shows each twice), and only that job hears of its reclaims again.
#[test]
fn a_resumed_job_keeps_one_copy_of_each_request_and_hears_only_its_own_reclaims() {
    let now = Instant::now();
    let mut a = allocator(vec![view("n1")], now);
    let adaptive = a.register_job(info(true), now).0;
    let (_, fx) = a.request(adaptive, "anyHost", now);
    assert!(matches!(fx[0], Effect::Granted { .. }), "{fx:?}");
    let rigid = a.register_job(info(false), now).0;
    let (_, fx) = a.request(rigid, "anyHost", now);
    assert!(fx.iter().any(|e| matches!(e, Effect::Reclaim { .. })));
    let (mut b, dropped) = Allocator::restore(a.snapshot(), AllocConfig::default(), now);
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(b.jobs(now)[1].waiting.len(), 1, "restored request queued");

    let fx = b.resumed(rigid, now);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Reclaim { .. })),
        "the rigid job holds nothing being taken back: {fx:?}"
    );
    assert!(b.jobs(now)[1].waiting.is_empty(), "restored copy dropped");
    let (_, _) = b.request(rigid, "anyHost", now);
    assert_eq!(b.jobs(now)[1].waiting.len(), 1, "the re-sent request, once");

    let fx = b.resumed(adaptive, now);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Reclaim { job, .. } if *job == adaptive)),
        "the adaptive job is told again: {fx:?}"
    );
    b.check_invariants().expect("invariants");
}
