//! Evaluates `start` and `rank` of a policy over 10,000 pre-built hosts, the way the broker
//! would serve one grant without caching: `cargo run --release -p policies --example
//! start_rank_10k [POLICY] [HOSTS]` (POLICY: a shipped name or a path; default paper).
//! Prints the time per host and per pass; not a test, so nothing here asserts a speed.

use std::{path::Path, time::Instant};

use policies::{
    facts::{HostFacts, JobFacts, LabFacts, NowFacts, Session, UserFacts},
    value::{HostValue, JobValue, LabValue, NowValue, UserValue},
    Policy, Scope,
};

fn host(i: usize) -> HostFacts {
    let private = i % 3 == 0;
    let idle = (i as i64 * 37) % 1200;
    HostFacts {
        name: format!("node{i:05}"),
        labels: vec!["linux".into()],
        owner: private.then(|| format!("user{}", i % 50)),
        up: true,
        load1: Some((i % 17) as f64 / 8.0),
        load5: Some(0.5),
        load15: Some(0.5),
        cpus: 1 + (i % 8) as i64,
        mem_avail_mb: Some(4096),
        users: Some(if private {
            vec![Session {
                user: format!("user{}", i % 50),
                tty: "pts/0".into(),
                idle_s: Some(idle),
            }]
        } else {
            vec![]
        }),
        console_idle_s: Some(idle),
        ..HostFacts::default()
    }
    .derive()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "paper".into());
    let Ok(count) = args.next().map_or(Ok(10_000), |n| n.parse::<usize>()) else {
        eprintln!("error: HOSTS must be a number\nhelp: start_rank_10k [POLICY] [HOSTS]");
        std::process::exit(64);
    };
    let loading = Instant::now();
    let policy = match Policy::from_setting(&name, Path::new(".")) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(e.exit_code());
        }
    };

    let load = loading.elapsed();
    let built = Instant::now();
    let hosts: Vec<HostValue> = (0..count).map(|i| HostValue::new(&host(i))).collect();
    let build = built.elapsed();

    let job = JobValue::new(&JobFacts {
        id: 1,
        adaptive: true,
        count: 4,
        ..JobFacts::default()
    });
    let user = UserValue::new(&UserFacts::default());
    let lab = LabValue::new(&LabFacts::default());
    let now = NowValue::new(&NowFacts {
        unix: 1_763_985_600,
        hour: 12,
        weekday: 2,
    });

    let started = Instant::now();
    let (mut startable, mut errors) = (0usize, 0usize);
    let mut best = f64::NEG_INFINITY;
    for h in &hosts {
        let scope = Scope::new()
            .host(h)
            .job(&job)
            .user(&user)
            .lab(&lab)
            .now(&now);
        let s = policy.start(scope);
        errors += usize::from(s.error.is_some());
        if s.value {
            startable += 1;
            let r = policy.rank(scope);
            errors += usize::from(r.error.is_some());
            best = best.max(r.value);
        }
    }
    let pass = started.elapsed();
    println!(
        "{}: loaded and checked in {load:?}; {count} hosts, built in {:?} ({:.2} µs/host); start+rank pass {:?} ({:.2} µs/host); \
         {startable} startable, best rank {best}, {errors} run-time errors",
        policy.source_path().display(),
        build,
        build.as_secs_f64() * 1e6 / count as f64,
        pass,
        pass.as_secs_f64() * 1e6 / count as f64,
    );
}
