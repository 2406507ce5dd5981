//! The host and job facts the allocator fills for the policy beyond the host report:
//! `host.held_for_s` (from its own grant instants), `host.job_load` / `other_load` (from
//! the report), and `share` weighting the fair partition.

use std::{path::Path, sync::Arc, time::Duration};

use policies::Policy;

use super::tests::{granted, hosts, reclaims, Lab};

fn policy(text: &str) -> Arc<Policy> {
    Arc::new(Policy::from_text(Path::new("test.toml"), text).expect("a valid policy"))
}

fn later(lab: &mut Lab, secs: u64) {
    lab.now += Duration::from_secs(secs);
}

/// `host.<field>` as `rb policy explain` shows it.
fn explained(lab: &mut Lab, host: &str, field: &str) -> serde_json::Value {
    let e = lab.a.explain(host, None, lab.now).expect("explain");
    e["host_facts"][field].clone()
}

#[test]
fn held_for_s_counts_from_the_grant_and_is_0_when_free() {
    let mut lab = Lab::new(hosts(&["node01"]));
    let j = lab.job(false);
    assert_eq!(explained(&mut lab, "node01", "held_for_s"), 0);
    let (alloc, _) = lab.take(j, "anyHost");
    later(&mut lab, 42);
    lab.set("node01", |_| {});
    assert_eq!(explained(&mut lab, "node01", "held_for_s"), 42);
    lab.give_back(alloc);
    assert_eq!(explained(&mut lab, "node01", "held_for_s"), 0);
}

#[test]
fn vacate_reads_held_for_s_as_of_each_report() {
    let mut lab = Lab::new(hosts(&["node01"]));
    lab.a
        .set_policy(policy("vacate = 'host.held_for_s >= 60'"), lab.now);
    let j = lab.job(false);
    let (alloc, _) = lab.take(j, "anyHost");
    later(&mut lab, 30);
    assert!(reclaims(&lab.set("node01", |_| {})).is_empty(), "30 s held");
    later(&mut lab, 30);
    let fx = lab.set("node01", |_| {});
    assert_eq!(reclaims(&fx), vec![(j, alloc, "node01".to_string())]);
}

#[test]
fn held_for_s_is_current_in_a_decision_without_a_report_in_between() {
    let mut lab = Lab::new(hosts(&["node01"]));
    lab.a
        .set_policy(policy("may_preempt = 'host.held_for_s >= 60'"), lab.now);
    let holder = lab.job(false);
    let (alloc, _) = lab.take(holder, "anyHost");
    let asker = lab.job(false);
    later(&mut lab, 10);
    let (_, fx) = lab.req(asker, "anyHost");
    assert!(reclaims(&fx).is_empty(), "held 10 s: {fx:?}");
    // No report of node01 since the grant: the next decision round still sees 70 s.
    later(&mut lab, 60);
    let (_, fx) = lab.req(asker, "anyLinux");
    assert_eq!(reclaims(&fx), vec![(holder, alloc, "node01".to_string())]);
    assert!(granted(&fx).is_none());
}

#[test]
fn job_load_comes_from_the_report_and_other_load_is_the_rest_never_below_0() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    lab.a
        .set_policy(policy("start = 'host.other_load < 0.5'"), lab.now);
    lab.set("node01", |v| {
        v.load1 = Some(1.0);
        v.job_load = Some(0.75);
    });
    lab.set("node02", |v| {
        v.load1 = Some(1.0);
        v.job_load = None;
    });
    assert_eq!(explained(&mut lab, "node01", "job_load"), 0.75);
    assert_eq!(explained(&mut lab, "node01", "other_load"), 0.25);
    assert_eq!(explained(&mut lab, "node02", "job_load"), 0.0, "unknown");
    assert_eq!(explained(&mut lab, "node02", "other_load"), 1.0);
    let j = lab.job(false);
    assert_eq!(lab.take(j, "anyHost").1, "node01", "its load is the jobs'");
    let (_, fx) = lab.req(j, "anyHost");
    assert!(granted(&fx).is_none(), "node02 is busy with something else");
    lab.set("node02", |v| v.job_load = Some(3.0));
    assert_eq!(explained(&mut lab, "node02", "other_load"), 0.0);
}
