//! Replaying recorded traces: the same policy decides the same; another one differs where
//! it should.

use std::{path::Path, sync::Arc};

use policies::Policy;

use super::*;
use crate::{
    host::tests::view,
    trace::tests::{granted, Traced},
};

/// A day in a three-host lab: an adaptive job takes every host, a plain job takes one back
/// from it, a private host's owner returns, jobs give hosts back and end.
fn a_day(max_bytes: u64) -> Traced {
    let mut t = Traced::new(max_bytes);
    for h in ["node01", "node02", "node03"] {
        t.host(view(h));
    }
    let mut ws = view("ws01");
    ws.owner = Some("alice".into());
    ws.console_idle_s = Some(3600);
    t.host(ws.clone());
    let adaptive = t.job(true);
    let mut held = Vec::new();
    for _ in 0..4 {
        t.advance(0.1);
        let (_, fx) = t.request(adaptive, "anyHost");
        held.extend(granted(&fx));
    }
    assert_eq!(held.len(), 4, "{held:?}");
    t.advance(1.0);
    let plain = t.job(false);
    let (_, fx) = t.request(plain, "anyLinux");
    let reclaimed = fx.iter().find_map(|e| match e {
        Effect::Reclaim { alloc, .. } => Some(*alloc),
        _ => None,
    });
    t.advance(0.7);
    let fx = t.confirm(reclaimed.expect("a reclaim for the plain job"));
    assert!(granted(&fx).is_some(), "{fx:?}");
    t.advance(2.0);
    ws.console_idle_s = Some(3);
    let fx = t.host(ws);
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Reclaim { .. })),
        "owner back: {fx:?}"
    );
    for _ in 0..30 {
        t.advance(0.25);
        t.tick();
    }
    t.advance(1.0);
    let (_, fx) = t.request(plain, "anyLinux");
    if let Some((alloc, _)) = granted(&fx) {
        t.advance(0.5);
        t.give_back(alloc);
    }
    t.advance(3.0);
    t.end(adaptive);
    t.advance(0.5);
    t.end(plain);
    t
}

fn replay(lines: &[String], policy: Arc<Policy>) -> Outcome {
    let mut r = Replay::new(policy);
    for (i, l) in lines.iter().enumerate() {
        r.feed(l)
            .unwrap_or_else(|e| panic!("line {}: {e}\n{l}", i + 1));
    }
    r.finish()
}

fn policy(text: &str) -> Arc<Policy> {
    Arc::new(Policy::from_text(Path::new("what-if.toml"), text).expect("a valid policy"))
}

#[test]
fn the_same_policy_decides_the_same() {
    let t = a_day(u64::MAX);
    let out = replay(&t.lines(), t.a.policy().clone());
    assert_eq!(out.differences, Vec::new());
    assert!(out.decisions >= 8, "{out:?}");
    assert_eq!(out.skipped, 0);
}

#[test]
fn the_same_policy_decides_the_same_across_rotated_files() {
    let t = a_day(1_500);
    let files = t.files();
    assert!(files.len() > 3, "{} files", files.len());
    let whole = replay(&t.lines(), t.a.policy().clone());
    assert_eq!(whole.differences, Vec::new());
    // The newest files alone (older ones rotated away) replay from their own start record.
    let tail: Vec<String> = files[files.len() / 2..].concat();
    let out = replay(&tail, t.a.policy().clone());
    assert_eq!(out.differences, Vec::new());
}

#[test]
fn a_policy_that_refuses_node03_differs_on_its_grants() {
    let t = a_day(u64::MAX);
    let out = replay(&t.lines(), policy("start = 'host.name != \"node03\"'"));
    assert!(!out.differences.is_empty(), "{out:?}");
    let first = &out.differences[0];
    assert_eq!(first.recorded, "grant node03", "{first:?}");
    assert_eq!(first.host.as_deref(), Some("node03"));
    assert_eq!(first.job, 1);
    // The job's third request takes the next host the policy allows: the private ws01
    // (the one-line file has no owner rule).
    assert_eq!(first.replayed, "grant ws01", "{first:?}");
    assert!(
        !out.differences
            .iter()
            .any(|d| d.replayed.starts_with("grant node03")),
        "{out:#?}"
    );
    assert!(out.differences.len() <= out.decisions);
}

#[test]
fn a_bad_line_or_an_input_before_any_start_is_an_error() {
    let mut r = Replay::new(policy("start = 'true'"));
    let err = r.feed("{not json").expect_err("bad json");
    assert!(err.contains("not a decision-trace line"), "{err}");
    let input = r#"{"t_us":5,"unix_ms":0,"input":{"kind":"tick"}}"#;
    let err = r.feed(input).expect_err("no start");
    assert!(err.contains("before any `start`"), "{err}");
}

#[test]
fn an_owner_back_reclaim_is_kept_by_the_paper_and_dropped_by_a_policy_without_vacate() {
    let t = a_day(u64::MAX);
    let out = replay(&t.lines(), policy("vacate = 'false'"));
    let ws: Vec<&Difference> = out
        .differences
        .iter()
        .filter(|d| d.host.as_deref() == Some("ws01"))
        .collect();
    assert!(
        ws.iter()
            .any(|d| d.recorded == "reclaim ws01 from job 1" && d.replayed == "none"),
        "{out:#?}"
    );
}

/// Traces written before `Allocator::handle` took the front-end rule, resumes and lost
/// agents recorded them as separate inputs (`uses_hosts` after a module job's `register`,
/// `resumed`, `end` for an agent gone): such a trace still replays, the same policy deciding
/// the same; and a `register` without the new fields is written as before.
#[test]
fn a_trace_in_the_older_form_still_replays() {
    let mut t = Traced::new(u64::MAX);
    for h in ["node01", "node02", "node03"] {
        t.host(view(h));
    }
    let module = t.job(true);
    t.step(Input::UsesHosts {
        job: module,
        hosts: vec!["node01".into()],
    });
    let mut held = Vec::new();
    for _ in 0..3 {
        t.advance(0.2);
        held.extend(granted(&t.request(module, "anyLinux").1));
    }
    let hosts: Vec<&str> = held.iter().map(|(_, h)| h.as_str()).collect();
    assert_eq!(hosts, ["node02", "node03"], "never the front end");
    t.step(Input::Resumed { job: module });
    let plain = t.job(false);
    t.advance(0.5);
    t.step(Input::End { job: module });
    t.advance(0.5);
    let (_, fx) = t.request(plain, "anyLinux");
    assert!(granted(&fx).is_some(), "{fx:?}");
    let lines = t.lines();
    let register = lines
        .iter()
        .find(|l| l.contains(r#""kind":"register""#))
        .expect("a register line");
    for new in ["resume", "runs_on", "module"] {
        assert!(!register.contains(new), "{register}");
    }
    let out = replay(&lines, t.a.policy().clone());
    assert_eq!(out.differences, Vec::new());
    assert_eq!(out.skipped, 0);
    assert!(out.decisions >= 3, "{out:?}");
}
