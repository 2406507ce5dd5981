//! Times a policy over many pre-built hosts, the way the broker would use it:
//! `cargo run --release -p policies --example start_rank_10k [POLICY] [HOSTS]` (POLICY: a
//! shipped name or a path; default paper; HOSTS default 10,000). Prints:
//! 1. loading (parse + check) and building the host values (once per report);
//! 2. `start` + `rank` evaluated on every host for one job (no caching);
//! 3. `host_decision` for `start` and `rank` once per host (at report time), then one grant
//!    that walks hosts by cached rank and evaluates only what depends on the job.
//!
//! Not a test: nothing here asserts a speed.

use std::{path::Path, time::Instant};

use policies::{
    facts::{HostFacts, JobFacts, LabFacts, NowFacts, Session, UserFacts},
    value::{HostValue, JobValue, LabValue, NowValue, UserValue},
    Answer, Hook, Policy, Scope,
};

fn host(i: usize) -> HostFacts {
    let private = i % 3 == 0;
    let idle = (i as i64 * 37) % 1200;
    let owner = format!("user{}", i % 50);
    HostFacts {
        name: format!("node{i:05}"),
        labels: vec!["linux".into()].into(),
        owner: private.then(|| owner.clone()),
        up: true,
        load1: Some((i % 17) as f64 / 8.0),
        load5: Some(0.5),
        load15: Some(0.5),
        cpus: 1 + (i % 8) as i64,
        mem_avail_mb: Some(4096),
        users: Some(match private {
            true => vec![Session {
                user: owner.into(),
                tty: "pts/0".into(),
                idle_s: Some(idle),
            }],
            false => vec![],
        }),
        console_idle_s: Some(idle),
        ..HostFacts::default()
    }
    .derive()
}

/// The values one grant reads besides the host.
struct Others {
    job: JobValue,
    user: UserValue,
    lab: LabValue,
    now: NowValue,
}

impl Others {
    fn new() -> Self {
        let job = JobFacts {
            id: 1,
            adaptive: true,
            count: 4,
            ..JobFacts::default()
        };
        let now = NowFacts {
            unix: 1_763_985_600,
            hour: 12,
            weekday: 2,
        };
        Others {
            job: JobValue::new(&job),
            user: UserValue::new(&UserFacts::default()),
            lab: LabValue::new(&LabFacts::default()),
            now: NowValue::new(&now),
        }
    }

    fn scope<'a>(&'a self, host: &'a HostValue) -> Scope<'a> {
        let s = Scope::new().host(host).job(&self.job).user(&self.user);
        s.lab(&self.lab).now(&self.now)
    }
}

/// `start` then `rank` on every host: (startable hosts, run-time errors).
fn full_pass(policy: &Policy, hosts: &[HostValue], o: &Others) -> (usize, usize) {
    let (mut startable, mut errors) = (0, 0);
    for h in hosts {
        let s = policy.start(o.scope(h));
        errors += usize::from(s.error.is_some());
        if s.value {
            startable += 1;
            errors += usize::from(policy.rank(o.scope(h)).error.is_some());
        }
    }
    (startable, errors)
}

type Cached = Vec<(Option<Answer>, Option<Answer>)>;

/// What a host report would compute: `start` and `rank` where they do not need the job.
fn report_time(policy: &Policy, hosts: &[HostValue], now: &NowValue) -> Cached {
    let decide = |hook, h| policy.host_decision(hook, h, Some(now));
    hosts
        .iter()
        .map(|h| (decide(Hook::Start, h), decide(Hook::Rank, h)))
        .collect()
}

/// One grant: hosts by cached rank, best first, `start` evaluated with the job only where
/// the cache could not decide it; then the hosts whose rank needs the job. The best rank.
fn grant(policy: &Policy, hosts: &[HostValue], cached: &Cached, o: &Others) -> f64 {
    let mut ranked: Vec<(f64, usize)> = cached
        .iter()
        .enumerate()
        .filter_map(|(i, (_, r))| r.and_then(Answer::as_number).map(|r| (r, i)))
        .collect();
    // The broker keeps this order up to date as reports arrive; not part of a grant.
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    let may_start = |i: usize| match cached[i].0 {
        Some(a) => a.as_bool() == Some(true),
        None => policy.start(o.scope(&hosts[i])).value,
    };
    let granting = Instant::now();
    let mut best = ranked
        .iter()
        .find(|(_, i)| may_start(*i))
        .map_or(f64::NEG_INFINITY, |(r, _)| *r);
    for i in (0..hosts.len()).filter(|i| cached[*i].1.is_none()) {
        if may_start(i) {
            best = best.max(policy.rank(o.scope(&hosts[i])).value);
        }
    }
    println!("  a grant with the cache: {:?}", granting.elapsed());
    best
}

fn per_host(d: std::time::Duration, n: usize) -> f64 {
    d.as_secs_f64() * 1e6 / n as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "paper".into());
    let Ok(count) = args.next().map_or(Ok(10_000), |n| n.parse::<usize>()) else {
        eprintln!("error: HOSTS must be a number\nhelp: start_rank_10k [POLICY] [HOSTS]");
        std::process::exit(64);
    };
    let t = Instant::now();
    let policy = match Policy::from_setting(&name, Path::new(".")) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(e.exit_code());
        }
    };
    println!(
        "{}: loaded and checked in {:?}",
        policy.source_path().display(),
        t.elapsed()
    );
    let t = Instant::now();
    let hosts: Vec<HostValue> = (0..count).map(|i| HostValue::new(&host(i))).collect();
    println!(
        "  {count} host values: {:.2} µs/host",
        per_host(t.elapsed(), count)
    );
    let o = Others::new();
    let t = Instant::now();
    let (startable, errors) = full_pass(&policy, &hosts, &o);
    println!(
        "  start+rank on every host: {:?} ({:.2} µs/host); {startable} startable, {errors} errors",
        t.elapsed(),
        per_host(t.elapsed(), count)
    );
    let t = Instant::now();
    let cached = report_time(&policy, &hosts, &o.now);
    let decided = cached.iter().filter(|(s, _)| s.is_some()).count();
    println!(
        "  host_decision at report time: {:.2} µs/host; start decided without the job on \
         {decided}/{count}",
        per_host(t.elapsed(), count)
    );
    let best = grant(&policy, &hosts, &cached, &o);
    println!("  best rank {best}");
}
