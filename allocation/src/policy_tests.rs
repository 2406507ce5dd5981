//! The allocator under policy files other than the default: the seam
//! ([`Allocator::set_policy`]), `start`, `vacate`, `grace_s`, and run-time errors.

use std::{path::Path, sync::Arc, time::Duration};

use policies::Policy;

use super::host::tests::session;
use super::tests::{granted, hosts, position, reclaims, Lab};
use super::*;

fn policy(text: &str) -> Arc<Policy> {
    Arc::new(Policy::from_text(Path::new("test.toml"), text).expect("a valid policy"))
}

fn grace_of(fx: &[Effect]) -> Vec<Duration> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Reclaim { grace, .. } => Some(*grace),
            _ => None,
        })
        .collect()
}

#[test]
fn a_one_line_start_policy_grants_only_node03() {
    let mut lab = Lab::new(hosts(&["node01", "node02", "node03"]));
    let fx = lab
        .a
        .set_policy(policy(r#"start = 'host.name == "node03"'"#), lab.now);
    assert!(granted(&fx).is_none());
    let j = lab.job(false);
    assert_eq!(lab.take(j, "anyHost").1, "node03");
    let (req, fx) = lab.req(j, "anyHost");
    assert_eq!(granted(&fx), None, "node01 and node02 are not startable");
    assert_eq!(position(&fx, req), Some(1));
}

#[test]
fn set_policy_serves_the_queue_the_new_start_allows() {
    let mut lab = Lab::new(hosts(&["node01"]));
    lab.a.set_policy(policy("start = 'false'"), lab.now);
    let j = lab.job(false);
    let (_, fx) = lab.req(j, "anyHost");
    assert_eq!(granted(&fx), None);
    let fx = lab.a.set_policy(policy("start = 'true'"), lab.now);
    assert_eq!(granted(&fx).map(|g| g.1).as_deref(), Some("node01"));
}

#[test]
fn set_policy_reclaims_hosts_the_new_vacate_sends_away() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    let rigid = lab.job(false);
    let adaptive = lab.job(true);
    let (_, h1) = lab.take(rigid, "anyHost");
    let (a2, h2) = lab.take(adaptive, "anyHost");
    assert_eq!((h1.as_str(), h2.as_str()), ("node01", "node02"));
    let fx = lab
        .a
        .set_policy(policy("vacate = 'job.adaptive'\ngrace_s = 2"), lab.now);
    assert_eq!(reclaims(&fx), vec![(adaptive, a2, "node02".into())]);
    assert_eq!(grace_of(&fx), vec![Duration::from_secs(2)]);
    lab.check();
    let fx = lab.a.set_policy(policy("vacate = 'job.adaptive'"), lab.now);
    assert!(reclaims(&fx).is_empty(), "already being released");
}

#[test]
fn a_non_adaptive_job_never_gets_a_private_host_under_the_paper() {
    let mut lab = Lab::new(hosts(&["ws"]));
    lab.set("ws", |v| v.owner = Some("bob".into()));
    let rigid = lab.job(false);
    let (_, fx) = lab.req(rigid, "anyHost");
    assert_eq!(granted(&fx), None, "an idle private host stays the owner's");
    let adaptive = lab.job(true);
    assert_eq!(lab.take(adaptive, "anyHost").1, "ws");
}

#[test]
fn the_earliest_grace_wins_between_the_lab_and_the_policy() {
    let mut lab = Lab::new(hosts(&["ws"]));
    lab.set("ws", |v| v.owner = Some("bob".into()));
    lab.a.set_policy(
        policy(&format!(
            "{}\ngrace_s = 600",
            "vacate = 'job.adaptive && host.keyboard_idle_s != null && host.keyboard_idle_s < 300'"
        )),
        lab.now,
    );
    let j = lab.job(true);
    lab.take(j, "anyHost");
    let fx = lab.set("ws", |v| v.users = Some(vec![session(Some(1))]));
    let lab_grace = AllocConfig::default().reclaim_grace;
    assert_eq!(grace_of(&fx), vec![lab_grace], "the lab's 5 s ends first");
    let fx = lab
        .a
        .set_policy(policy("vacate = 'true'\ngrace_s = 1"), lab.now);
    assert_eq!(
        grace_of(&fx),
        vec![Duration::from_secs(1)],
        "earlier deadline"
    );
    let fx = lab.set("ws", |v| v.users = Some(vec![session(Some(2))]));
    assert!(grace_of(&fx).is_empty(), "a later deadline is not sent");
}

#[test]
fn admin_release_grace_is_cut_by_the_policy_grace() {
    let mut lab = Lab::new(hosts(&["node01"]));
    lab.a.set_policy(policy("grace_s = 3"), lab.now);
    let j = lab.job(false);
    lab.take(j, "anyHost");
    let fx = lab
        .a
        .release_host("node01", Duration::from_secs(60), lab.now)
        .expect("held");
    assert_eq!(grace_of(&fx), vec![Duration::from_secs(3)]);
}

#[test]
fn a_run_time_error_gives_the_default_and_is_reported_once_per_key_and_host() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    // load1 is null on node02: arithmetic on null fails there, the default (paper) applies.
    let text = "start = 'host.load1 + 1.0 < 100.0'";
    lab.a.set_policy(policy(text), lab.now);
    lab.set("node02", |v| v.load1 = None);
    lab.set("node01", |v| v.up = false);
    let j = lab.job(false);
    let (_, fx) = lab.req(j, "anyHost");
    assert_eq!(granted(&fx).map(|g| g.1).as_deref(), Some("node02"));
    let errors: Vec<_> = fx
        .iter()
        .filter(|e| matches!(e, Effect::PolicyError { key: "start", host, .. } if host == "node02"))
        .collect();
    assert_eq!(errors.len(), 1, "{fx:?}");
    let (_, fx) = lab.req(j, "anyHost");
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::PolicyError { .. })),
        "rate-limited: {fx:?}"
    );
}

#[test]
fn max_hosts_keeps_a_job_waiting_until_it_gives_one_back() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    lab.a.set_policy(policy("max_hosts = 1"), lab.now);
    let j = lab.job(false);
    let (alloc, _) = lab.take(j, "anyHost");
    let (req, fx) = lab.req(j, "anyHost");
    assert_eq!(granted(&fx), None, "at its max_hosts");
    let row = &lab.a.jobs(lab.now)[0];
    assert_eq!(row.waiting[0].reason_code, "max_hosts", "{row:?}");
    let fx = lab.give_back(alloc);
    assert!(
        matches!(fx.iter().find(|e| matches!(e, Effect::Granted { .. })), Some(Effect::Granted { req: r, .. }) if *r == req),
        "{fx:?}"
    );
}

#[test]
fn priority_orders_the_queue_and_the_first_gets_the_freed_host() {
    let mut lab = Lab::new(hosts(&["node01"]));
    lab.a
        .set_policy(policy("priority = 'double(job.id)'"), lab.now);
    let holder = lab.job(false);
    let (alloc, _) = lab.take(holder, "anyHost");
    let early = lab.job(false);
    let late = lab.job(false);
    let (r_early, _) = lab.req(early, "anyHost");
    let (r_late, fx) = lab.req(late, "anyHost");
    assert_eq!(
        position(&fx, r_late),
        Some(1),
        "the higher priority goes first"
    );
    assert_eq!(position(&fx, r_early), Some(2));
    let fx = lab.give_back(alloc);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Granted { req, .. } if *req == r_late)),
        "{fx:?}"
    );
}

#[test]
fn a_repeated_view_is_not_skipped_when_start_reads_the_clock() {
    let mut lab = Lab::new(hosts(&["node01"]));
    assert!(lab.a.same_view_decides_nothing("node01"));
    lab.a.set_policy(policy("start = 'now.hour >= 0'"), lab.now);
    assert!(!lab.a.same_view_decides_nothing("node01"));
    assert!(!lab.a.host_repeated("node01", lab.now));
}

/// A `start` that depends on the job everywhere is cached for no host, so a report is
/// compared on the host fields `start` reads: one that changes only others serves nothing
/// new, one that changes a field it reads serves the queue.
#[test]
fn a_report_changing_a_field_a_job_dependent_start_reads_serves_the_queue() {
    let mut lab = Lab::new(hosts(&["node01"]));
    lab.set("node01", |v| v.load1 = Some(3.0));
    lab.a.set_policy(
        policy("start = 'job.adaptive ? host.load1 < 1.0 : host.load1 < 2.0'"),
        lab.now,
    );
    let rigid = lab.job(false);
    let (req, fx) = lab.req(rigid, "anyHost");
    assert_eq!(position(&fx, req), Some(1), "load 3 starts nothing");
    let fx = lab.set("node01", |v| v.load5 = Some(0.1));
    assert_eq!(granted(&fx), None, "start does not read load5");
    let fx = lab.set("node01", |v| v.load1 = Some(1.5));
    assert_eq!(
        granted(&fx).map(|(_, h)| h),
        Some("node01".to_string()),
        "load1 fell below the rigid job's limit"
    );
}

/// A report that leaves the fields `start` reads as they were keeps its cached `start`
/// without evaluating it, and likewise `rank`; the invariant check (after every step)
/// compares each cached decision with a fresh evaluation.
#[test]
fn decisions_are_reused_only_while_the_fields_they_read_stay_the_same() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    let text = "start = 'host.load1 != null && host.load1 < 1.0'\n\
                rank = 'host.console_idle_s == null ? 0.0 : double(host.console_idle_s)'";
    lab.a.set_policy(policy(text), lab.now);
    for step in 0..20 {
        let host = if step % 2 == 0 { "node01" } else { "node02" };
        lab.set(host, |v| {
            match step % 3 {
                0 => v.load1 = Some(0.5 + (step % 4) as f64 * 0.25),
                1 => v.console_idle_s = Some(step * 10),
                _ => v.mem_avail_mb = Some(step),
            };
        });
    }
    lab.set("node01", |v| v.load1 = Some(5.0));
    lab.set("node02", |v| v.load1 = Some(0.3));
    let j = lab.job(false);
    assert_eq!(
        lab.take(j, "anyHost").1,
        "node02",
        "node01 is not startable"
    );
}

/// `rb status`'s notes through the cursor that walks the policy's entries once
/// ([`Allocator::policy_notes`]) are [`Allocator::policy_note`]'s, whatever the order the
/// hosts are asked in, unknown hosts included.
#[test]
fn policy_notes_in_any_order_are_policy_note_each() {
    let names = ["node01", "node02", "node03", "node04"];
    let mut lab = Lab::new(hosts(&names));
    let start = r#"start = 'host.name != "node02" && host.name != "node04"'"#;
    lab.a.set_policy(policy(start), lab.now);
    let one_by_one = |host: &str| lab.a.policy_note(host);
    assert!(one_by_one("node02").is_some_and(|n| n.contains("start is false")));
    assert_eq!(one_by_one("node01"), None);
    let orders: [&[&str]; 4] = [
        &["node01", "node02", "node03", "node04"],
        &["node00", "node02", "node025", "node04", "node99"],
        &["node04", "node03", "node02", "node01"],
        &["node02", "node02", "node01", "node04"],
    ];
    for order in orders {
        let mut notes = lab.a.policy_notes();
        let walked: Vec<Option<String>> = order.iter().map(|h| notes.note(h)).collect();
        let each: Vec<Option<String>> = order.iter().map(|h| one_by_one(h)).collect();
        assert_eq!(walked, each, "{order:?}");
    }
}
