//! Scenarios of overflow onto Slurm in the pure core (`overflow.rs`).

use super::tests::{hosts, Lab};
use super::*;

fn submitted(fx: &[Effect]) -> Vec<PilotId> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::SubmitPilot { pilot } => Some(*pilot),
            _ => None,
        })
        .collect()
}

fn cancelled(fx: &[Effect]) -> Vec<String> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::CancelPilot { slurm_id, .. } => Some(slurm_id.clone()),
            _ => None,
        })
        .collect()
}

/// Overflow for alice's jobs: `max_nodes`, idle exit 10 s, warning 20 s.
fn settings(max_nodes: usize) -> OverflowSettings {
    OverflowSettings {
        max_nodes,
        owner: "alice".into(),
        idle_exit: std::time::Duration::from_secs(10),
        warning: std::time::Duration::from_secs(20),
    }
}

/// A one-host lab, full: job 1 holds node02, job 2 waits for `anyHost`.
fn full_lab(max_nodes: usize) -> (Lab, JobId) {
    let mut lab = Lab::new(hosts(&["node02"]));
    lab.a.set_overflow(Some(settings(max_nodes)));
    let holder = lab.job(false);
    lab.take(holder, "anyHost");
    let waiter = lab.job(false);
    let (_, fx) = lab.req(waiter, "anyHost");
    assert!(submitted(&fx).is_empty(), "nothing before a tick: {fx:?}");
    (lab, waiter)
}

/// The pilot's node joins as `slurm-node09`.
fn pilot_joins(lab: &mut Lab) -> Vec<Effect> {
    let mut v = super::host::tests::view("slurm-node09");
    v.add_label("slurm");
    lab.views.push(v);
    lab.set("slurm-node09", |_| {})
}

#[test]
fn a_request_waiting_a_second_asks_for_one_pilot_and_gets_the_node() {
    let (mut lab, _) = full_lab(4);
    assert!(
        submitted(&lab.tick(0)).is_empty(),
        "the default waits about a second"
    );
    let fx = lab.tick(1);
    assert_eq!(submitted(&fx), [1], "{fx:?}");
    assert!(
        submitted(&lab.tick(1)).is_empty(),
        "one pilot per waiting job"
    );
    lab.a.pilot_submitted(1, "4242".into());
    let fx = pilot_joins(&mut lab);
    let got = super::tests::granted(&fx).map(|(_, h)| h);
    assert_eq!(got.as_deref(), Some("slurm-node09"), "{fx:?}");
    assert!(submitted(&lab.tick(1)).is_empty() && cancelled(&lab.tick(1)).is_empty());
    assert_eq!(lab.a.pilot_ids(), ["4242"], "cancelled at shutdown");
}

#[test]
fn a_pilot_nobody_waits_for_any_more_is_cancelled() {
    let (mut lab, waiter) = full_lab(4);
    assert_eq!(submitted(&lab.tick(2)), [1]);
    lab.a.pilot_submitted(1, "77".into());
    lab.end(waiter);
    assert_eq!(cancelled(&lab.tick(1)), ["77"]);
    assert!(cancelled(&lab.tick(1)).is_empty(), "once");
}

#[test]
fn failed_submissions_back_off_and_max_nodes_caps_the_pilots() {
    let (mut lab, _) = full_lab(1);
    assert_eq!(submitted(&lab.tick(2)), [1]);
    lab.a.pilot_failed(1, lab.now);
    assert!(submitted(&lab.tick(0)).is_empty(), "backing off");
    assert_eq!(submitted(&lab.tick(2)), [2], "after the backoff");
    lab.a.pilot_failed(2, lab.now);
    assert!(submitted(&lab.tick(1)).is_empty(), "the backoff doubled");
    assert_eq!(submitted(&lab.tick(2)), [3]);
    lab.a.pilot_submitted(3, "9".into());
    let other = lab.job(false);
    lab.req(other, "anyHost");
    assert!(submitted(&lab.tick(5)).is_empty(), "max_nodes = 1");
}

#[test]
fn without_overflow_nothing_is_asked_and_a_policy_can_say_never() {
    let mut lab = Lab::new(hosts(&["node02"]));
    let holder = lab.job(false);
    lab.take(holder, "anyHost");
    let waiter = lab.job(false);
    lab.req(waiter, "anyHost");
    assert!(submitted(&lab.tick(30)).is_empty());
    lab.a.set_overflow(Some(OverflowSettings {
        max_nodes: 2,
        owner: "alice".into(),
        idle_exit: std::time::Duration::from_secs(10),
        warning: std::time::Duration::from_secs(20),
    }));
    let never =
        policies::Policy::from_text(std::path::Path::new("never.toml"), "overflow = 'false'\n")
            .expect("policy");
    lab.a.set_policy(std::sync::Arc::new(never), lab.now);
    assert!(submitted(&lab.tick(30)).is_empty());
}

#[test]
fn pilots_serve_the_owners_jobs_only() {
    let (mut lab, _) = full_lab(4);
    // Another user's job waits too: it gets no pilot of its own, nor the owner's node.
    let info = JobInfo {
        user: "bob".into(),
        cwd: "/home/bob".into(),
        argv: vec!["app".into()],
        spec: None,
        adaptive: false,
    };
    let (bob, _) = lab.a.register_job(info, lab.now);
    let (_, fx) = lab.req(bob, "anyHost");
    assert!(submitted(&fx).is_empty());
    assert_eq!(
        submitted(&lab.tick(2)),
        [1],
        "one pilot: for alice's job only"
    );
    assert!(submitted(&lab.tick(2)).is_empty(), "none for bob's");
    lab.a.pilot_submitted(1, "5".into());
    let fx = pilot_joins(&mut lab);
    let grants: Vec<JobId> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Granted { job, .. } => Some(*job),
            _ => None,
        })
        .collect();
    assert_eq!(grants.len(), 1, "{fx:?}");
    assert_ne!(grants[0], bob, "alice's job, first in line, got it");
    // Alice's job gives the pilot's host back: bob's job, the only one waiting, does not
    // get it.
    let (alloc, _) = super::tests::granted(&fx).expect("grant");
    let fx = lab.give_back(alloc);
    assert!(
        super::tests::granted(&fx).is_none(),
        "bob never starts on it: {fx:?}"
    );
    assert!(
        submitted(&lab.tick(5)).is_empty(),
        "and no pilot is asked for bob"
    );
}

#[test]
fn a_started_pilot_nobody_uses_for_idle_exit_is_cancelled() {
    let (mut lab, waiter) = full_lab(4);
    assert_eq!(submitted(&lab.tick(2)), [1]);
    lab.a.pilot_submitted(1, "31".into());
    let fx = pilot_joins(&mut lab);
    assert!(super::tests::granted(&fx).is_some(), "{fx:?}");
    assert!(cancelled(&lab.tick(30)).is_empty(), "held: never idle");
    lab.end(waiter);
    assert!(cancelled(&lab.tick(1)).is_empty(), "idle since now");
    assert!(cancelled(&lab.tick(5)).is_empty());
    assert_eq!(cancelled(&lab.tick(5)), ["31"], "idle for idle_exit (10 s)");
    assert!(lab.a.pilot_ids().is_empty());
}

#[test]
fn pilots_found_after_a_restart_are_adopted_or_cancelled() {
    let (mut lab, _) = full_lab(2);
    // Two pilots of the previous run: one's node joins and serves the waiting job; the
    // other, unwanted once the job has its host, is cancelled after the grace.
    lab.a
        .pilots_found(vec!["100".into(), "101".into()], lab.now);
    lab.a.pilots_found(vec!["100".into()], lab.now);
    assert_eq!(lab.a.pilot_ids().len(), 2, "found once each");
    assert!(
        submitted(&lab.tick(2)).is_empty(),
        "the found ones are outstanding"
    );
    let fx = pilot_joins(&mut lab);
    assert!(super::tests::granted(&fx).is_some(), "{fx:?}");
    assert!(cancelled(&lab.tick(1)).is_empty(), "within the grace");
    assert_eq!(cancelled(&lab.tick(10)), ["101"]);
    assert_eq!(lab.a.pilot_ids(), ["100"], "the adopted one stays");
}

/// A job holding a pilot's node (Slurm job 4242) across a broker restart: the core rebuilt
/// from its snapshot, the lab file's hosts known at start, the pilot's node not (its daemon
/// has not reconnected), the pilots `found` in Slurm's queue adopted. Returns the lab, the
/// job, its allocation, the node's name and its view (for its daemon's return).
fn restarted_holding_a_pilots_node(found: &[&str]) -> (Lab, JobId, AllocId, String, HostView) {
    let (mut lab, waiter) = full_lab(1);
    assert_eq!(submitted(&lab.tick(2)), [1]);
    lab.a.pilot_submitted(1, "4242".into());
    let fx = pilot_joins(&mut lab);
    let (alloc, host) = super::tests::granted(&fx).expect("the waiter gets the node");
    lab.a.pilot_lease(&host, "4242", None, false, lab.now);
    let (mut restored, dropped) =
        Allocator::restore(lab.a.snapshot(), AllocConfig::default(), lab.now);
    assert!(dropped.is_empty(), "{dropped:?}");
    restored.set_overflow(Some(settings(1)));
    lab.a = restored;
    let node = lab.views.pop().expect("the pilot's node");
    lab.sync();
    let found = found.iter().map(|s| s.to_string()).collect();
    lab.a.pilots_found(found, lab.now);
    assert_eq!(lab.a.holder(&host), Some((waiter, alloc)), "restored");
    (lab, waiter, alloc, host, node)
}

/// A broker restart while a job holds a pilot's node: the allocation is restored, and the
/// pilots found in Slurm's queue are kept however long the node's daemon takes to come
/// back (the job still runs there; only the node's report is missing), not cancelled after
/// the found pilots' grace as unwanted ones are: which of them is the node's is not known
/// yet (here the other, still queued, is found first). Once the daemon is back and names
/// its job, the queued one is cancelled; when the job lets go, the idle pilot is too.
#[test]
fn found_pilots_are_kept_while_a_restored_job_holds_a_node_whose_daemon_is_not_back() {
    let (mut lab, waiter, _, host, node) = restarted_holding_a_pilots_node(&["4240", "4242"]);
    assert!(
        cancelled(&lab.tick(11)).is_empty(),
        "in use: kept past the found pilots' grace"
    );
    assert!(cancelled(&lab.tick(60)).is_empty(), "however long it takes");

    // The daemon is back and names its job.
    lab.views.push(node);
    lab.set(&host, |_| {});
    lab.a.pilot_lease(&host, "4242", None, false, lab.now);
    let lease = lab.a.pilot_lease_of(&host).expect("the node's pilot");
    assert_eq!(lease.slurm_job.as_deref(), Some("4242"));
    assert_eq!(
        cancelled(&lab.tick(1)),
        ["4240"],
        "the queued one, unwanted"
    );
    assert!(cancelled(&lab.tick(11)).is_empty(), "still in use");
    lab.end(waiter);
    lab.tick(0);
    assert_eq!(cancelled(&lab.tick(10)), ["4242"], "idle exit");
}

/// After a restart, the held pilot's node is known to the core as soon as its daemon
/// connects, but it is up only with its first report: a tick in between (past the found
/// pilots' grace) must not take the node for back and cancel its pilot as unwanted. The
/// race behind the lab test `a_job_keeps_its_pilots_node_when_the_pilots_daemon_is_back_late`
/// (one run in five: a 250 ms tick between the connection and the first report).
#[test]
fn a_found_pilot_is_kept_while_its_held_node_is_known_but_not_up_yet() {
    let (mut lab, waiter, alloc, host, node) = restarted_holding_a_pilots_node(&["4242"]);
    assert!(cancelled(&lab.tick(11)).is_empty(), "its daemon not back");

    // The daemon connects: the node's row comes, down until its first report.
    lab.views.push(node);
    lab.set(&host, |v| v.up = false);
    assert!(
        cancelled(&lab.tick(1)).is_empty(),
        "known but not up: not back yet"
    );
    lab.set(&host, |v| v.up = true);
    assert!(cancelled(&lab.tick(1)).is_empty(), "back: its pilot joined");
    lab.a.pilot_lease(&host, "4242", None, false, lab.now);
    assert_eq!(
        lab.a.holder(&host),
        Some((waiter, alloc)),
        "still the job's"
    );
    assert!(cancelled(&lab.tick(11)).is_empty(), "in use");
}

/// The Slurm job a pilot's daemon names is the pilot its host joins, whatever the guess
/// made when the host came up (the oldest outstanding one).
#[test]
fn a_pilots_host_is_joined_by_its_slurm_job_not_guessed() {
    let (mut lab, _) = full_lab(2);
    lab.a
        .pilots_found(vec!["100".into(), "101".into()], lab.now);
    let fx = pilot_joins(&mut lab);
    assert!(super::tests::granted(&fx).is_some(), "{fx:?}");
    let grace = lab
        .a
        .pilot_lease("slurm-node09", "101", None, false, lab.now);
    assert_eq!(grace, None, "no lease ending yet");
    let lease = lab
        .a
        .pilot_lease_of("slurm-node09")
        .expect("a pilot's host");
    assert_eq!(lease.slurm_job.as_deref(), Some("101"));
    assert!(cancelled(&lab.tick(1)).is_empty(), "within the grace");
    assert_eq!(cancelled(&lab.tick(10)), ["100"], "not the one on the node");
    assert_eq!(lab.a.pilot_ids(), ["101"]);
}

/// Slurm warns that a pilot's lease ends: the holder gets the time Slurm says is left
/// (the warning's when Slurm did not say), the host takes no new grant, and once it goes
/// down a later pilot on the same node is open again.
#[test]
fn a_lease_that_ends_reclaims_the_host_with_slurms_deadline_and_closes_it() {
    let (mut lab, waiter) = full_lab(4);
    assert_eq!(submitted(&lab.tick(2)), [1]);
    lab.a.pilot_submitted(1, "4242".into());
    let fx = pilot_joins(&mut lab);
    let (alloc, host) = super::tests::granted(&fx).expect("the waiter gets the node");
    let left = Duration::from_secs(290);
    assert_eq!(
        lab.a.pilot_lease(&host, "4242", Some(left), false, lab.now),
        None
    );
    let lease = lab.a.pilot_lease_of(&host).expect("lease");
    assert_eq!(lease.ends, Some(lab.now + left));
    assert!(!lease.ending);

    lab.now += Duration::from_secs(260);
    let grace = lab
        .a
        .pilot_lease(&host, "4242", Some(Duration::from_secs(30)), true, lab.now)
        .expect("ending: a grace");
    assert_eq!(grace, Duration::from_secs(30), "Slurm's deadline");
    let fx = lab.a.lease_ends(&host, grace, lab.now).expect("known host");
    lab.check();
    let reclaim = fx.iter().find_map(|e| match e {
        Effect::Reclaim {
            job,
            alloc: a,
            grace,
            ..
        } => Some((*job, *a, *grace)),
        _ => None,
    });
    assert_eq!(reclaim, Some((waiter, alloc, grace)), "{fx:?}");
    assert!(lab.a.pilot_lease_of(&host).expect("lease").ending);
    lab.confirm(alloc);
    let other = lab.job(false);
    let (_, fx) = lab.req(other, "anyHost");
    assert!(
        super::tests::granted(&fx).is_none(),
        "closed to grants: {fx:?}"
    );

    // Slurm did not say: the warning's time.
    assert_eq!(
        lab.a.pilot_lease(&host, "4242", None, true, lab.now),
        Some(Duration::from_secs(20))
    );
    // The node leaves, and a later pilot on it is a new, open lease.
    lab.set(&host, |v| v.up = false);
    lab.set(&host, |v| v.up = true);
    assert!(lab
        .a
        .pilot_lease(&host, "5000", None, false, lab.now)
        .is_none());
    assert!(!lab.a.closed(&host));
}

/// Only a host labelled `slurm` is a pilot's; a lab host's daemon that names a Slurm job
/// changes nothing.
#[test]
fn a_lab_host_naming_a_slurm_job_is_not_a_pilot() {
    let (mut lab, _) = full_lab(4);
    assert_eq!(
        lab.a
            .pilot_lease("node02", "9", Some(Duration::from_secs(1)), true, lab.now),
        None
    );
    assert!(lab.a.pilot_lease_of("node02").is_none());
}

/// `rb jobs`'s note on a waiting request agrees with the decision, which asks the policy
/// with the job's oldest wait: a request the job made just now has the note too.
#[test]
fn every_waiting_request_of_a_job_asking_for_a_pilot_has_the_note() {
    let (mut lab, waiter) = full_lab(4);
    let notes = |lab: &Lab| -> Vec<Option<String>> {
        let rows = lab.a.jobs(lab.now);
        let row = rows
            .iter()
            .find(|r| r.id == waiter)
            .expect("the waiter's row");
        row.waiting.iter().map(|w| w.slurm.clone()).collect()
    };
    assert_eq!(notes(&lab), [None], "the default waits about a second");
    assert_eq!(submitted(&lab.tick(2)), [1]);
    lab.req(waiter, "anyHost");
    let queued = Some("waits for Slurm: 1 pilot(s) queued".to_string());
    assert_eq!(notes(&lab), [queued.clone(), queued], "the new request too");
}

/// A pilot cancelled for idleness hears Slurm's SIGTERM and says its lease ends: the host
/// closes, but the pilot is not adopted again (it would count toward `max_nodes` and be
/// cancelled a second time).
#[test]
fn a_cancelled_pilots_ending_notice_does_not_bring_it_back() {
    let (mut lab, waiter) = full_lab(1);
    assert_eq!(submitted(&lab.tick(2)), [1]);
    lab.a.pilot_submitted(1, "4242".into());
    let fx = pilot_joins(&mut lab);
    let (_, host) = super::tests::granted(&fx).expect("the waiter gets the node");
    lab.a.pilot_lease(&host, "4242", None, false, lab.now);
    lab.end(waiter);
    lab.tick(0);
    assert_eq!(cancelled(&lab.tick(10)), ["4242"], "idle");
    assert!(lab.a.pilot_ids().is_empty());

    let grace = lab
        .a
        .pilot_lease(&host, "4242", None, true, lab.now)
        .expect("ending: a grace");
    assert_eq!(
        grace,
        Duration::from_secs(20),
        "the warning's, Slurm did not say"
    );
    lab.a.lease_ends(&host, grace, lab.now).expect("known host");
    assert!(lab.a.pilot_ids().is_empty(), "not adopted again");
    assert!(cancelled(&lab.tick(20)).is_empty(), "cancelled once");
    let other = lab.job(false);
    let (_, fx) = lab.req(other, "anyHost");
    assert!(
        super::tests::granted(&fx).is_none(),
        "the host is closed: {fx:?}"
    );
    assert_eq!(
        submitted(&lab.tick(2)),
        [2],
        "max_nodes (1) is free for a new pilot"
    );
}

/// The shell ticks fast while a pilot may be due: from the first waiting request of the
/// owner until its pilot is asked for, and not while `max_nodes` pilots exist.
#[test]
fn a_pilot_may_be_due_while_a_job_waits_without_one() {
    let mut lab = Lab::new(hosts(&["node02"]));
    lab.a.set_overflow(Some(OverflowSettings {
        max_nodes: 1,
        owner: "alice".into(),
        idle_exit: Duration::from_secs(10),
        warning: Duration::from_secs(20),
    }));
    let holder = lab.job(false);
    lab.take(holder, "anyHost");
    assert!(!lab.a.pilot_may_be_due(lab.now), "nobody waits");
    let waiter = lab.job(false);
    lab.req(waiter, "anyHost");
    assert!(
        lab.a.pilot_may_be_due(lab.now),
        "a request waits, no pilot yet"
    );
    assert_eq!(submitted(&lab.tick(1)), [1]);
    assert!(!lab.a.pilot_may_be_due(lab.now), "its pilot is asked for");
    let other = lab.job(false);
    lab.req(other, "anyHost");
    assert!(
        !lab.a.pilot_may_be_due(lab.now),
        "max_nodes (1) pilots exist"
    );
}
