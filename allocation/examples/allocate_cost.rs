//! Times the allocator's side of one `rsh anyLinux` in a small lab: an `allocate` that is
//! granted at once, then the host given back, through the one entry point the broker uses.
//! `cargo run --release -p allocation --example allocate_cost [HOSTS]` (default 1 host,
//! public and idle, paper policy, one running job): prints µs per allocate and per give-back.
//!
//! Not a test: nothing here asserts a speed.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use allocation::{trace::Input, Allocator, Effect, HostView, JobInfo};

fn view(i: usize) -> HostView {
    HostView {
        name: format!("node{i:02}"),
        address: format!("10.77.0.{i}"),
        up: true,
        reported: true,
        labels: vec!["linux".into(), "x86-64".into()].into(),
        os: Some("linux".into()),
        owner: None,
        load1: Some(0.4),
        load5: Some(0.37),
        load15: Some(0.30),
        mem_avail_mb: Some(11_718),
        cpus: Some(2),
        users: Some(vec![]),
        console_idle_s: None,
        logind: None,
        logind_error: None,
        job_load: Some(0.0),
    }
}

fn main() {
    let hosts: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let policy = Arc::new(policies::Policy::shipped("paper").expect("the paper policy"));
    let t0 = Instant::now();
    let mut a = Allocator::new().with_policy(policy);
    for i in 0..hosts {
        a.host_changed(view(i + 3), t0);
    }
    let info = JobInfo {
        user: "rblab".into(),
        cwd: "/home/rblab".into(),
        argv: vec!["sh".into(), "-c".into(), "rsh anyLinux true".into()],
        spec: None,
        adaptive: false,
    };
    let (job, _) = a.register_job(info, t0);
    let (mut allocating, mut giving_back) = (Duration::ZERO, Duration::ZERO);
    let calls = 2000;
    for call in 0..calls {
        let now = t0 + Duration::from_millis(10 * call + 10);
        let symbolic = "anyLinux".to_string();
        let t = Instant::now();
        let handled = a.handle(
            Input::Allocate {
                job,
                req: 0,
                symbolic,
            },
            now,
        );
        allocating += t.elapsed();
        let host = handled
            .effects
            .iter()
            .find_map(|e| match e {
                Effect::Granted { host, .. } => Some(host.clone()),
                _ => None,
            })
            .expect("a free host is granted at once");
        let t = Instant::now();
        a.handle(
            Input::GiveBack {
                job,
                host,
                req: None,
            },
            now,
        );
        giving_back += t.elapsed();
    }
    let per_call = |d: Duration| d.as_secs_f64() * 1e6 / calls as f64;
    println!(
        "{hosts} host(s): allocate {:.1} µs, give back {:.1} µs",
        per_call(allocating),
        per_call(giving_back)
    );
}
