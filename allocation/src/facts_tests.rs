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

/// Adaptive job 1 takes every host, then adaptive job 2 asks for hosts one at a time
/// (each confirmed release is granted to it) until the policy lets it take no more: the
/// hosts each then holds.
fn partition(share: &str, n: usize) -> (usize, usize) {
    let names: Vec<String> = (1..=n).map(|i| format!("node{i:02}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut lab = Lab::new(hosts(&names));
    lab.a
        .set_policy(policy(&format!("share = '{share}'")), lab.now);
    let (first, second) = (lab.job(true), lab.job(true));
    for _ in 0..n {
        lab.take(first, "anyHost");
    }
    for _ in 0..=n {
        let (_, fx) = lab.req(second, "anyHost");
        let Some(&(_, alloc, _)) = reclaims(&fx).first() else {
            break;
        };
        let fx = lab.confirm(alloc);
        assert!(granted(&fx).is_some(), "{fx:?}");
    }
    let held = |j| {
        lab.a
            .jobs(lab.now)
            .iter()
            .find(|r| r.id == j)
            .map_or(0, |r| r.hosts.len())
    };
    (held(first), held(second))
}

#[test]
fn share_weighs_the_fair_partition_among_adaptive_jobs() {
    // (share expression; job 1 is the first job, job 2 the second), hosts, (first, second)
    let table = [
        ("1", 9, (5, 4)),
        ("job.id == 1 ? 2.0 : 1.0", 9, (6, 3)),
        ("job.id == 1 ? 1.0 : 2.0", 9, (3, 6)),
        ("job.id == 1 ? 3 : 1", 8, (6, 2)),
        ("job.id == 1 ? 0.5 : 1.0", 12, (4, 8)),
    ];
    for (share, n, want) in table {
        assert_eq!(partition(share, n), want, "share = '{share}' on {n} hosts");
    }
}

#[test]
fn explain_shows_the_share_of_the_job_and_of_the_holder() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    lab.a
        .set_policy(policy("share = 'job.id == 1 ? 2.0 : 1.0'"), lab.now);
    let (first, second) = (lab.job(true), lab.job(true));
    lab.take(first, "anyHost");
    let e = lab
        .a
        .explain("node01", Some(second), lab.now)
        .expect("explain");
    let hook = |key: &str| {
        e["hooks"]
            .as_array()
            .and_then(|h| h.iter().find(|x| x["key"] == key))
            .cloned()
            .unwrap_or_else(|| panic!("no {key} in {e}"))
    };
    assert_eq!(hook("share")["value"], 1.0, "{e}");
    let inputs = hook("may_preempt")["inputs"].to_string();
    assert!(inputs.contains(r#"["holder.share","2.0"]"#), "{inputs}");
    assert!(inputs.contains(r#"["job.share","1.0"]"#), "{inputs}");
}
