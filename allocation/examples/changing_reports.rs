//! Times the allocator's side of a host report that changed, the way the broker takes one
//! (`JobDesk::host_changed`): the trace's delta, the one entry point, the trace's line.
//! `cargo run --release -p allocation --example changing_reports [HOSTS] [ROUNDS]` (default
//! 10,000 hosts, 5 rounds): each round every host reports once more, its idle times one
//! second longer and its load moved, as `rb-loadgen --changing` reports (public hosts, one
//! user logged in), under the paper policy. Prints µs per report for each part.
//!
//! Not a test: nothing here asserts a speed.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use allocation::{
    trace::{host_delta, Input, Out},
    Allocator, HostView, Recorder, TraceClock,
};
use proto_types::report::UserSession;

fn view(i: usize, round: u64) -> HostView {
    HostView {
        name: format!("load{i:05}"),
        address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
        up: true,
        reported: true,
        labels: vec!["linux".into(), "x86-64".into()].into(),
        os: Some("linux".into()),
        owner: None,
        load1: Some(0.42 + (round % 10) as f64 / 100.0),
        load5: Some(0.37),
        load15: Some(0.30),
        mem_avail_mb: Some(11_718),
        cpus: Some(8),
        users: Some(vec![UserSession {
            user: "alice".into(),
            tty: "pts/0".into(),
            idle_s: Some(1200 + round),
            from: None,
        }]),
        console_idle_s: Some(3600 + round),
        logind: None,
        logind_error: None,
        job_load: Some(0.0),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let hosts: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(5);
    let policy = Arc::new(policies::Policy::shipped("paper").expect("the paper policy"));
    let t0 = Instant::now();
    let mut a = Allocator::new().with_policy(policy);
    let mut rec = Recorder::new(TraceClock::new(t0, 0), "bench", u64::MAX);
    let mut out: Vec<Out> = Vec::new();
    for i in 0..hosts {
        a.host_changed(view(i, 0), t0);
    }
    let (mut delta, mut handle, mut line) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    let mut bytes = 0;
    for round in 1..=rounds {
        let now = t0 + Duration::from_secs(round);
        for i in 0..hosts {
            let v = view(i, round);
            let t = Instant::now();
            let changed = host_delta(a.host_view(&v.name), &v);
            let input = Input::Host {
                host: v.name.clone(),
                changed,
                view: Some(Box::new(v)),
            };
            let t1 = Instant::now();
            let handled = a.handle(input, now);
            let t2 = Instant::now();
            rec.record(&a, handled.input, &handled.effects, now, &mut out);
            for o in out.drain(..) {
                if let Some(l) = o.into_text() {
                    bytes += l.len();
                }
            }
            let t3 = Instant::now();
            delta += t1 - t;
            handle += t2 - t1;
            line += t3 - t2;
        }
    }
    let n = (hosts as u64 * rounds) as f64;
    let us = |d: Duration| d.as_secs_f64() * 1e6 / n;
    println!(
        "{hosts} hosts, {rounds} rounds: delta {:.2} µs, handle {:.2} µs, trace line {:.2} µs \
         ({:.0} bytes) a report",
        us(delta),
        us(handle),
        us(line),
        bytes as f64 / n
    );
}
