//! The "Policies" section: the allocator's grant decision and a
//! policy reload with each shipped policy file at 1k and 10k simulated hosts, in-process
//! and pure (the `Allocator` fed realistic `HostView`s), beside the compiled policy's; the
//! broker's footprint with the paper policy; and, in the lab (root), owner return → the
//! adaptive process gone, and the paper's Figure 7 (reclaiming N hosts at once).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{
        atomic::{AtomicU64, Ordering as AtomicOrdering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::LoadRun;
use bench::stats::{summarize, Summary};
use broker::alloc::{Allocator, Effect, HostView, JobId, JobInfo};
use policies::Policy;
use proto::report::UserSession;
use tests::{
    labtier::{lab_file_with, LabOptions, LabWithBroker, TEST_TIMING},
    wait_until, Broker,
};

/// Options of the section.
pub struct Options {
    /// Simulated host counts of the in-process measurements.
    pub hosts: Vec<usize>,
    /// Grants timed per policy and host count.
    pub grants: usize,
    /// Repetitions of "Owner return through logind" (at least 10).
    pub owner_logind_reps: usize,
    /// Repetitions of the lab rows.
    pub lab_reps: usize,
    /// Remote shells of the owner-return rows (`rsh`, `ssh`).
    pub transports: Vec<String>,
    /// `grant`, `reload`, `footprint`, `paired`, `profile`, `core`, `sessions`, `scale`,
    /// `owner`, `figure7`, `owner-logind`; empty = all.
    pub parts: Vec<String>,
    /// An `rb-broker` built from [`BEFORE_POLICY_FILES`] (policy compiled in): the
    /// footprint's baseline rows run it (`bench.sh` builds it).
    pub broker_before: Option<PathBuf>,
    /// Another `rb-broker` whose footprint rows (the paper policy, quiet and changing
    /// reports) run beside today's, named by `.0` (e.g. the commit it was built from).
    pub broker_compared: Option<(String, PathBuf)>,
    /// Rounds of the footprint rows (each row once per round, pooled).
    pub footprint_rounds: usize,
    /// Another `rb-corecost` whose rows run beside today's in the `core` part.
    pub corecost_compared: Option<(String, PathBuf)>,
}

/// The commit whose broker footprint is the baseline before policy files (11 % of a core
/// and 213 MiB at 10k hosts: BENCHMARKS.md of 2026-11-22, the allocation policy compiled
/// in), on the machine of the day.
pub const BEFORE_POLICY_FILES: &str = "ba708db";

impl Options {
    fn wants(&self, part: &str) -> bool {
        self.parts.is_empty() || self.parts.iter().any(|p| p == part)
    }
}

/// The compiled policy the allocator had before policy files (commit 7e31f5e^,
/// `HostView::owner_away` and `choice_order`): a private host to any job while its owner is
/// away, quiet hosts first, then least `load1` per CPU, then public. Written as a file whose
/// every hook reads only `host`, so the allocator answers each grant-time question from the
/// values cached when the host reported, as the compiled predicates did: no expression is
/// evaluated during a grant.
const COMPILED: &str = r#"
start = '!host.private || owner_away'
rank = '(owner_away ? 1000000.0 : 0.0) - 10.0 * load_per_cpu - (host.private ? 1.0 : 0.0)'
[let]
owner_away = 'host.keyboard_idle_s != null && host.keyboard_idle_s >= 300'
load_per_cpu = 'host.load1 == null ? 10000.0 : host.load1 / double(host.cpus > 0 ? host.cpus : 1)'
"#;

/// Unix time the allocator is told: Tuesday 2025-11-25 12:00 UTC (office hours, for
/// `nights-and-weekends`).
const NOON_TUESDAY: i64 = 1_764_072_000;

pub fn run(opts: &Options) -> anyhow::Result<()> {
    println!("## Policies (allocation policy files)\n");
    if opts.wants("grant") {
        grant_latency(opts)?;
    }
    if opts.wants("reload") {
        reload(opts)?;
    }
    if opts.wants("footprint") {
        footprint(opts)?;
    }
    if opts.wants("paired") {
        paired(opts)?;
    }
    if opts.wants("profile") {
        if let Some(&n) = opts.hosts.iter().max() {
            crate::profile::run(n, opts.broker_compared.as_ref())?;
        }
    }
    if opts.wants("core") {
        crate::core_cost::run(opts.corecost_compared.as_ref())?;
    }
    if opts.wants("sessions") {
        crate::sessions::run(opts.broker_compared.as_ref())?;
    }
    if opts.wants("scale") {
        crate::scale::run(opts.broker_compared.as_ref())?;
    }
    lab_rows(opts)?;
    Ok(())
}

/// The policies measured: the compiled baseline first, then the shipped files.
fn policies() -> anyhow::Result<Vec<(&'static str, Arc<Policy>)>> {
    let mut out = vec![(
        "compiled (baseline)",
        Arc::new(Policy::from_text(Path::new("compiled.toml"), COMPILED)?),
    )];
    for (name, _) in policies::SHIPPED {
        let p = Policy::shipped(name).ok_or_else(|| anyhow::anyhow!("no policy {name}"))?;
        out.push((name, Arc::new(p)));
    }
    Ok(out)
}

/// Host `i` of a simulated lab: a third are private workstations whose owner is logged in
/// (idle 0–20 min, so about three in four are away), the rest public with no session and an
/// idle console; load
/// 0–2 on 1–8 CPUs; one in 100 is down; one in 20 also has the `gpu` label.
pub fn host_view(i: usize) -> HostView {
    let private = i.is_multiple_of(3);
    let idle = (i as u64 * 37) % 1200;
    let owner = format!("user{}", i % 50);
    let mut labels = vec!["linux".to_string(), "x86-64".to_string()];
    if i % 20 == 7 {
        labels.push("gpu".into());
    }
    HostView {
        name: format!("node{i:05}"),
        address: format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
        up: i % 100 != 99,
        reported: true,
        labels: labels.into(),
        os: Some("Linux".into()),
        owner: private.then(|| owner.clone()),
        load1: Some((i % 17) as f64 / 8.0),
        load5: Some(0.5),
        load15: Some(0.5),
        mem_avail_mb: Some(4096),
        cpus: Some(1 + (i % 8) as u32),
        users: Some(match private {
            true => vec![UserSession {
                user: owner,
                tty: "pts/0".into(),
                idle_s: Some(idle),
                from: None,
            }],
            false => vec![],
        }),
        // A public host's console known and idle for an hour (an unknown console is never
        // away: the decisions stay those of the reports this bench always meant).
        console_idle_s: Some(if private { idle } else { 3600 }),
        logind: None,
        logind_error: None,
        job_load: None,
    }
}

/// An allocator with `policy`, `n` hosts reported, and one adaptive and one rigid job.
fn lab(policy: &Arc<Policy>, n: usize, t0: Instant) -> (Allocator, JobId, JobId) {
    let mut a = Allocator::new().with_policy(policy.clone());
    a.set_wall_clock(t0, NOON_TUESDAY, 0);
    for i in 0..n {
        a.host_changed(host_view(i), t0);
    }
    let job = |adaptive: bool| JobInfo {
        user: "bench".into(),
        cwd: "/".into(),
        argv: vec!["job".into()],
        spec: None,
        adaptive,
    };
    let (adaptive, _) = a.register_job(job(true), t0);
    let (rigid, _) = a.register_job(job(false), t0);
    (a, adaptive, rigid)
}

/// Times one request of `job` for `anyLinux` at `now`, through the allocator's one entry
/// point as the broker makes it (granted at once, then given back, untimed), in µs; `None`
/// (and a note on stderr) when it was not granted.
fn time_grant(a: &mut Allocator, job: JobId, now: Instant) -> Option<f64> {
    let input = broker::alloc::trace::Input::Allocate {
        job,
        req: 0,
        symbolic: "anyLinux".into(),
    };
    let t = Instant::now();
    let fx = a.handle(input, now).effects;
    let us = t.elapsed().as_secs_f64() * 1e6;
    let alloc = fx.iter().find_map(|e| match e {
        Effect::Granted { alloc, .. } => Some(*alloc),
        _ => None,
    });
    match alloc {
        Some(alloc) => {
            a.give_back(alloc, now);
            Some(us)
        }
        None => {
            eprintln!("rb-bench policy: a request was not granted: {fx:?}");
            None
        }
    }
}

fn show_us(s: Option<Summary>) -> String {
    match s {
        Some(s) if s.median >= 1000.0 => format!(
            "{:.2} ms ({:.2}–{:.2})",
            s.median / 1000.0,
            s.min / 1000.0,
            s.max / 1000.0
        ),
        Some(s) => format!("{:.0} µs ({:.0}–{:.0})", s.median, s.min, s.max),
        None => "-".into(),
    }
}

fn ratio(s: Option<Summary>, base: Option<Summary>) -> String {
    match (s, base) {
        (Some(s), Some(b)) if b.median > 0.0 => format!("{:.2}×", s.median / b.median),
        _ => "-".into(),
    }
}

fn grant_latency(opts: &Options) -> anyhow::Result<()> {
    println!("### Grant decision latency\n");
    println!(
        "The allocator in-process (pure: no I/O, `now` passed in), fed simulated hosts as \
         `host_changed` reports: a third private workstations with their owner logged in \
         (idle 0–20 min, about three in four away), the rest public; load 0–2 on 1–8 CPUs; \
         1 % down; wall clock a Tuesday at noon. One latency = one `allocate` of `anyLinux` through `Allocator::handle` \
         that is granted at once (the host is then given back, untimed); median of {} grants \
         (min–max), the policies' grants interleaved (one of each per round) so that the rest \
         of the machine weighs on all alike. An adaptive job and a rigid (non-adaptive) one. Baseline: the policy the \
         allocator had compiled in before policy files (commit 7e31f5e^: a private host to \
         any job while its owner is away; quiet first, then least load per CPU, then public), \
         run as a file whose every hook reads only `host`, so each grant reads the values \
         cached at report time and evaluates no expression — as the compiled predicates did. \
         Goal: each shipped policy ≤ 1.5× the baseline and ≤ 1 ms per grant at 10k hosts.\n",
        opts.grants
    );
    println!("| policy | hosts | adaptive job | × baseline | rigid job | × baseline |");
    println!("|---|---:|---|---:|---|---:|");
    let policies = policies()?;
    for &n in &opts.hosts {
        // Every policy's allocator at once, and their grants interleaved (one of each policy
        // and job per round), so that whatever else the machine does falls on all alike.
        let t0 = Instant::now();
        let mut labs: Vec<_> = policies
            .iter()
            .map(|(_, policy)| lab(policy, n, t0))
            .collect();
        let mut times = vec![(Vec::new(), Vec::new()); labs.len()];
        for k in 0..opts.grants {
            let now = t0 + Duration::from_millis(k as u64);
            for ((a, adaptive, rigid), (ad, ri)) in labs.iter_mut().zip(&mut times) {
                ad.extend(time_grant(a, *adaptive, now));
                ri.extend(time_grant(a, *rigid, now));
            }
        }
        let base = (summarize(&times[0].0), summarize(&times[0].1));
        for ((name, _), (ad, ri)) in policies.iter().zip(&times) {
            let (ad, ri) = (summarize(ad), summarize(ri));
            println!(
                "| {name} | {n} | {} | {} | {} | {} |",
                show_us(ad),
                ratio(ad, base.0),
                show_us(ri),
                ratio(ri, base.1)
            );
        }
    }
    println!();
    Ok(())
}

fn reload(opts: &Options) -> anyhow::Result<()> {
    println!("### Policy reload\n");
    println!(
        "A reload as the broker runs it, with the allocator holding N simulated hosts (as \
         above), from the paper policy to each shipped one. Off the core (`spawn_blocking`): \
         loading the file (TOML, CEL parse, check against samples), then preparing the new \
         policy's host-only decisions for every host from the allocator's cached values \
         (`HostInputs::prepare`: two evaluations per host, and the free-host order), and \
         bringing that up to the allocator's values once more \
         (`PreparedPolicy::catch_up`: the hosts that reported while it was prepared — hosts \
         report once a second, so N × the preparation's time of them, each with a new load \
         — decided there too). On the core: taking those values twice \
         (`Allocator::policy_inputs`) and `Allocator::set_prepared_policy`, which swaps the \
         prepared decisions in, decides again the hosts that reported during the catch-up \
         (the column \"re-decided\"), asks every held host `vacate` and serves the queue. \
         The core's time is what reports wait behind in its event queue (none is dropped). \
         Median of 5 (min–max). Goal: ≤ 50 ms at 10k hosts (the core's).\n"
    );
    println!("| policy | hosts | load and check (off the core) | prepare and catch up (off the core) | re-decided | core busy |");
    println!("|---|---:|---|---|---:|---|");
    let paper = Arc::new(Policy::shipped("paper").ok_or_else(|| anyhow::anyhow!("paper"))?);
    for &n in &opts.hosts {
        for (name, text) in policies::SHIPPED {
            let path = format!("policies/{name}.toml");
            let loads: Vec<f64> = (0..5)
                .map(|_| {
                    let t = Instant::now();
                    let p = Policy::from_text(Path::new(&path), text);
                    let ms = t.elapsed().as_secs_f64() * 1e3;
                    p.map(|_| ms)
                })
                .collect::<Result<_, _>>()?;
            let new = Arc::new(Policy::from_text(Path::new(&path), text)?);
            let t0 = Instant::now();
            let (mut a, _, _) = lab(&paper, n, t0);
            let (mut preps, mut cores, mut stale) = (Vec::new(), Vec::new(), 0);
            // From paper to the policy (timed), and back (untimed), five times.
            for k in 0..5 {
                let now = t0 + Duration::from_secs(2 * k);
                let t = Instant::now();
                let inputs = a.policy_inputs();
                let taken = t.elapsed();
                let t = Instant::now();
                let prepared = inputs.prepare(new.clone());
                let prep = t.elapsed();
                reports_meanwhile(&mut a, n, prep, (k, 0), now);
                // As `reload` does: the values again (core), the hosts that reported
                // meanwhile decided off the core, then the swap (core).
                let t = Instant::now();
                let inputs = a.policy_inputs();
                let taken_again = t.elapsed();
                let t = Instant::now();
                let prepared = prepared.catch_up(inputs);
                let catch_up = t.elapsed();
                preps.push((prep + catch_up).as_secs_f64() * 1e3);
                stale = reports_meanwhile(&mut a, n, catch_up, (k, 1), now);
                let t = Instant::now();
                let (_, retired) = a.set_prepared_policy(prepared, now);
                cores.push((taken + taken_again + t.elapsed()).as_secs_f64() * 1e3);
                // The broker drops what the swap replaced off its core.
                drop(retired);
                a.set_policy(paper.clone(), now + Duration::from_secs(1));
            }
            let show = |v: &[f64]| summarize(v).map_or("-".into(), |s| s.show("ms", 1));
            println!(
                "| {name} | {n} | {} | {} | {stale} | {} |",
                show(&loads),
                show(&preps),
                show(&cores),
            );
        }
    }
    println!();
    Ok(())
}

/// Feeds the reports that arrive while a policy is prepared for `prep` (each of `n` hosts
/// reports once a second), each with a new load so that its cached values change; returns
/// how many.
fn reports_meanwhile(
    a: &mut Allocator,
    n: usize,
    prep: Duration,
    (round, pass): (u64, u64),
    now: Instant,
) -> usize {
    let count = ((n as f64 * prep.as_secs_f64()).ceil() as usize).min(n);
    for i in 0..count {
        // Each pass its own hosts and loads: every report a change.
        let mut view = host_view((i * 7919 + pass as usize * 104_729) % n);
        view.load1 = Some(3.0 + round as f64 / 8.0 + pass as f64 / 64.0);
        a.host_changed(view, now);
    }
    count
}

fn footprint(opts: &Options) -> anyhow::Result<()> {
    println!("### Broker footprint with a policy file\n");
    println!(
        "As \"Broker under load\" above (`rb-loadgen`, one report per simulated host each \
         second; same columns), with the lab file naming the policy; {} rounds, each row's \
         broker run once per round (so drift falls on every row alike) and its 2 s CPU \
         windows pooled (median, min–max, n). Baselines, in the same run: the broker of commit \
         {BEFORE_POLICY_FILES}, whose footprint issue 15 quotes as today's (11 % of a core \
         and 213 MiB at 10k hosts, on the machine of 2026-11-22; policy compiled in): the \
         figure moves with the machine, so `bench.sh` builds that commit and runs it here, and today's broker with that compiled policy \
         as a host-only file (see \"Grant decision latency\"). Goal: the paper policy within \
         the footprint of that broker, the policy compiled in. The simulated reports repeat each \
         other but for their counter (a quiet lab), except in the rows \"every report \
         changing\" (`rb-loadgen --changing`): there each one's idle times grow by the \
         interval and its load moves, as a real daemon's do, so that every report reaches \
         the allocator. The broker reads its host daemons' reports through io_uring where the \
         kernel allows it (one multishot receive armed on each connection, in a ring whose \
         receives run only when the host daemons' thread enters it, once a turn: one system \
         call a turn); the rows \"host daemons read through epoll\" run the same broker with \
         `RB_HOSTD_READ=epoll`, as it reads where io_uring cannot be used (a task a \
         connection: a readiness event, a task's wake and a `recvfrom` a report). The rows \
         \"reading alone\" are no broker: `rb-readfloor` takes the same connections through \
         the broker's handshake and reads and parses their frames as the broker's host \
         daemons' sessions do through epoll (one thread, 10 ms turns, the broker's framing \
         and decoder), and \"through io_uring\" as they do through io_uring, and does \
         nothing else: what reading the reports costs on this machine, under any broker that \
         reads that way. The simulated daemons send their reports after \
         the first as what changed where the broker offers it (`report_changes`, as real \
         daemons do; 52ad0fe's broker does not); the rows \"reports whole\" \
         (`rb-loadgen --whole-reports`) send them whole, as a daemon from before that.\n",
        opts.footprint_rounds.max(1)
    );
    println!("| broker and policy | hosts | broker CPU | broker RSS | all hosts up after | `rb status --json` | load generator CPU |");
    println!("|---|---:|---|---:|---:|---|---|");
    let dir = tempfile::tempdir()?;
    let compiled = dir.path().join("compiled.toml");
    std::fs::write(&compiled, COMPILED)?;
    let Some(&n) = opts.hosts.iter().max() else {
        return Ok(());
    };
    let with_policy = |setting: &str| {
        crate::manual_lab(n).replacen(
            "[broker]\n",
            &format!("[broker]\npolicy = \"{setting}\"\n"),
            1,
        )
    };
    let before = |name: &str| format!("{BEFORE_POLICY_FILES}, policy compiled in (baseline){name}");
    let mut rows: Vec<FootprintRow> = Vec::new();
    match &opts.broker_before {
        Some(program) => {
            for (name, changing) in [("", false), (", every report changing", true)] {
                rows.push(FootprintRow::new(
                    before(name),
                    Some(program),
                    crate::manual_lab(n),
                    changing,
                ));
            }
        }
        None => rows.push(FootprintRow::new(
            before(": not built, see bench.sh"),
            None,
            String::new(),
            false,
        )),
    }
    if let Some((label, program)) = &opts.broker_compared {
        for (name, changing) in [("", false), (", every report changing", true)] {
            rows.push(FootprintRow::new(
                format!("paper{name} ({label})"),
                Some(program),
                with_policy("paper"),
                changing,
            ));
        }
    }
    let ours = tests::bin("rb-broker");
    let compiled = compiled.display().to_string();
    for (name, setting, changing) in [
        ("compiled policy as a file", compiled.as_str(), false),
        ("paper", "paper", false),
        (PAPER_CHANGING, "paper", true),
    ] {
        rows.push(FootprintRow::new(
            name.into(),
            Some(&ours),
            with_policy(setting),
            changing,
        ));
    }
    rows.push(
        FootprintRow::new(
            format!("{PAPER_CHANGING}, reports whole (`rb-loadgen --whole-reports`)"),
            Some(&ours),
            with_policy("paper"),
            true,
        )
        .whole(),
    );
    for (name, changing) in [(EPOLL_QUIET, false), (EPOLL_CHANGING, true)] {
        let mut row = FootprintRow::new(name.into(), Some(&ours), with_policy("paper"), changing);
        row.env = &[("RB_HOSTD_READ", "epoll")];
        rows.push(row);
    }
    let (as_broker, uring) = (
        crate::ReadFloor::AS_THE_BROKER,
        crate::ReadFloor::THROUGH_URING,
    );
    rows.push(FootprintRow::floor(FLOOR_QUIET, false, as_broker));
    rows.push(FootprintRow::floor(FLOOR_CHANGING, true, as_broker));
    rows.push(FootprintRow::floor(FLOOR_CHANGING_WHOLE, true, as_broker).whole());
    rows.push(FootprintRow::floor(URING_QUIET, false, uring));
    rows.push(FootprintRow::floor(URING_CHANGING, true, uring));
    // Round after round, every row once per round: drift falls on all alike.
    for _ in 0..opts.footprint_rounds.max(1) {
        for row in &mut rows {
            row.measure(n)?;
        }
    }
    for row in &rows {
        let figures = match &row.run {
            Some(run) => run.row(n),
            None => format!("| {n} | - | - | - | - | - |"),
        };
        println!("| {} |{}", row.name, figures.trim_start_matches('|'));
    }
    println!();
    print_footprint_verdict(&rows, opts.broker_before.is_some(), n);
    Ok(())
}

/// The goal (paper, quiet reports, against the baseline broker) and the changing reports'
/// cost against the same broker's; `rows` as `footprint` built them.
fn print_footprint_verdict(rows: &[FootprintRow], baseline_built: bool, hosts: usize) {
    let median = |i: usize| rows.get(i)?.run.as_ref()?.cpu_median();
    let named = |name: &str| {
        let row = rows.iter().find(|r| r.name == name)?;
        row.run.as_ref()?.cpu_median()
    };
    if let (Some(old), Some(quiet), Some(changing)) =
        (median(0), named("paper"), named(PAPER_CHANGING))
    {
        println!(
            "The paper policy, quiet reports: {quiet:.1} % of a core against {old:.1} % for \
             {BEFORE_POLICY_FILES}'s broker ({:.2}×; goal ≤ 1×).",
            quiet / old
        );
        if let Some(old_changing) = median(1).filter(|_| baseline_built) {
            println!(
                "Every report changing: {changing:.1} % against {old_changing:.1} % ({:.2}×). \
                 The broker of {BEFORE_POLICY_FILES} decided nothing when a report arrived (it \
                 rebuilt every host's view when a job asked for a host and, while jobs ran, at \
                 every 250 ms tick; here no job runs); today's decides each \
                 changed report as it arrives (the host's cached `start` and `rank`, its place \
                 in the free-host order, a trace line), so that a grant reads the best few hosts \
                 instead of all of them (\"Grant decision latency\").",
                changing / old_changing
            );
        }
        println!();
    }
    print_floor_verdict(&named, hosts);
}

/// Each broker row against the floor under it: the broker as it reads by default (through
/// io_uring where the kernel allows it) against reading alone that way, and through epoll
/// (`RB_HOSTD_READ=epoll`) against reading alone through epoll; `named` gives a row's CPU.
fn print_floor_verdict(named: &dyn Fn(&str) -> Option<f64>, hosts: usize) {
    let (Some(quiet), Some(changing)) = (named("paper"), named(PAPER_CHANGING)) else {
        return;
    };
    let epoll_floors = named(FLOOR_QUIET).zip(named(FLOOR_CHANGING));
    let uring_floors = named(URING_QUIET).zip(named(URING_CHANGING));
    // Where io_uring cannot be used the broker reads through epoll, and the io_uring rows
    // are empty.
    let Some((floor_quiet, floor_changing)) = uring_floors.or(epoll_floors) else {
        return;
    };
    let way = match uring_floors {
        Some(_) => "through io_uring, as the broker reads by default where the kernel allows it",
        None => "through epoll (io_uring cannot be used here)",
    };
    print!(
        "Above the floor (the rows of `rb-readfloor`: the same connections' frames read \
         and parsed as the broker's host daemons' sessions read them, in the same turns, and \
         nothing more; here {way}): quiet {quiet:.1} % against {floor_quiet:.1} % \
         (+{:.1} %), every report changing {changing:.1} % against {floor_changing:.1} % \
         (+{:.1} %).",
        quiet - floor_quiet,
        changing - floor_changing,
    );
    let epoll_brokers = named(EPOLL_QUIET).zip(named(EPOLL_CHANGING));
    if let (Some((epoll_quiet, epoll_changing)), Some((fq, fc)), Some(_)) =
        (epoll_brokers, epoll_floors, uring_floors)
    {
        print!(
            " The same broker reading through epoll (`RB_HOSTD_READ=epoll`, as it reads where \
             io_uring cannot be used): quiet {epoll_quiet:.1} % against {fq:.1} % (+{:.1} %), \
             changing {epoll_changing:.1} % against {fc:.1} % (+{:.1} %); reading through \
             io_uring takes {:.1} and {:.1} points of a core off the broker's CPU.",
            epoll_quiet - fq,
            epoll_changing - fc,
            epoll_quiet - quiet,
            epoll_changing - changing,
        );
    }
    // The goals are for 10k hosts.
    if hosts == 10_000 {
        print!(
            " Issue 34's goals (≤ 5 % quiet, ≤ 10 % changing) allow the broker {:+.1} % \
             and {:+.1} % of a core above reading alone (a negative margin: a goal below \
             the floor).",
            5.0 - floor_quiet,
            10.0 - floor_changing,
        );
    }
    println!();
    println!();
}

/// The footprint rows the verdict reads.
const PAPER_CHANGING: &str = "paper, every report changing";
const FLOOR_QUIET: &str = "reading alone (`rb-readfloor --parse`): the floor";
const FLOOR_CHANGING_WHOLE: &str =
    "reading alone (`rb-readfloor --parse`), every report changing, reports whole: the floor";
const FLOOR_CHANGING: &str =
    "reading alone (`rb-readfloor --parse`), every report changing: the floor";
const URING_QUIET: &str = "reading alone through io_uring (`rb-readfloor --parse --uring`)";
const EPOLL_QUIET: &str = "paper, host daemons read through epoll (`RB_HOSTD_READ=epoll`)";
const EPOLL_CHANGING: &str =
    "paper, every report changing, host daemons read through epoll (`RB_HOSTD_READ=epoll`)";
const URING_CHANGING: &str =
    "reading alone through io_uring (`rb-readfloor --parse --uring`), every report changing";

/// CPU windows per round of the paired rows.
const PAIRED_WINDOWS: usize = 10;

/// Today's broker and `--broker-compared`'s, both at once, each under its own `rb-loadgen`
/// with half the hosts, their CPU read over the same 2 s windows: what slows the machine
/// down (other work, a busy host of this virtual machine) slows both alike, so that the
/// ratio shows a change of a few percent that the footprint rows' run-after-run figures
/// (±10 % from one minute to the next here) cannot.
fn paired(opts: &Options) -> anyhow::Result<()> {
    let Some((label, compared)) = &opts.broker_compared else {
        return Ok(());
    };
    let Some(&n) = opts.hosts.iter().max() else {
        return Ok(());
    };
    let each = n / 2;
    let rounds = opts.footprint_rounds.max(1);
    println!("### The same load on two brokers at once ({label} and today's)\n");
    println!(
        "The paper policy; `{label}`'s broker and today's run side by side, each under its own \
         `rb-loadgen` of {each} simulated hosts (one report per host each second), for \
         {rounds} rounds (which broker starts first alternates); once every host is up, both \
         brokers' CPU is read over the same {PAIRED_WINDOWS} windows of 2 s a round. CPU \
         share of one core, median (min–max, n); the ratio is today's over {label}'s, window \
         by window, and in the last column the CPU time of all windows over all of theirs \
         (then round by round): /proc counts CPU in 10 ms ticks, a few a window at 5 % of a \
         core, so that small changes show there and not in the windows' median. In the row \"a job taking hosts\" each broker also has a job whose loop \
         calls `rsh anyLinux true` through the shim: each call is a grant, its remote shell \
         fails at once (the hosts' addresses are 127.1.x.y, where nothing listens) and the \
         host goes back 6 s later (a subagent may still attach late), so the job holds \
         hundreds of hosts and takes tens a second; the calls each broker served in the \
         windows are given beside its CPU.\n"
    );
    println!(
        "| reports | {label} CPU | today's CPU | today / {label} | all windows' CPU, today / \
         {label} (by round) |"
    );
    println!("|---|---|---|---|---|");
    let ours = tests::bin("rb-broker");
    let paper = |lab: String| lab.replacen("[broker]\n", "[broker]\npolicy = \"paper\"\n", 1);
    let lab = paper(crate::manual_lab(each));
    let churn_lab = paper(crate::manual_lab_with_addresses(each));
    for (name, changing, churn) in [
        ("every report changing", true, false),
        ("repeating (quiet)", false, false),
        ("repeating (quiet), a job taking hosts", false, true),
    ] {
        let lab = if churn { &churn_lab } else { &lab };
        let mut windows: Vec<(f64, f64)> = Vec::new();
        let mut by_round: Vec<f64> = Vec::new();
        let mut calls = (0, 0);
        for round in 0..rounds {
            // Which broker starts first alternates, as it might favour one.
            let first_ours = round % 2 == 1;
            let load = Load {
                each,
                changing,
                churn,
            };
            let measured = paired_round(compared, &ours, lab, &load, first_ours)?;
            by_round.extend(total_ratio(&measured.windows));
            windows.extend(measured.windows);
            calls = (calls.0 + measured.calls.0, calls.1 + measured.calls.1);
        }
        let (theirs, mine): (Vec<f64>, Vec<f64>) = windows.iter().copied().unzip();
        let ratio: Vec<f64> = windows
            .iter()
            .filter(|(t, _)| *t > 0.0)
            .map(|(t, u)| u / t)
            .collect();
        let show = |v: &[f64], calls: u64| {
            let cpu = summarize(v).map_or("-".into(), |s| s.show("%", 2));
            match churn {
                true => format!("{cpu}; {calls} calls"),
                false => cpu,
            }
        };
        let ratio = summarize(&ratio).map_or("-".into(), |s| {
            format!("{:.3} ({:.3}–{:.3}, n={})", s.median, s.min, s.max, s.n)
        });
        let total = total_ratio(&windows).map_or("-".into(), |r| format!("{r:.3}"));
        let rounds: Vec<String> = by_round.iter().map(|r| format!("{r:.3}")).collect();
        println!(
            "| {name}, {each} hosts each | {} | {} | {ratio} | {total} ({}) |",
            show(&theirs, calls.0),
            show(&mine, calls.1),
            rounds.join(", ")
        );
    }
    println!();
    Ok(())
}

/// Today's CPU time over the compared broker's, all `windows` (compared, today's) summed.
fn total_ratio(windows: &[(f64, f64)]) -> Option<f64> {
    let (theirs, mine) = windows
        .iter()
        .fold((0.0, 0.0), |(t, m), (wt, wm)| (t + wt, m + wm));
    (theirs > 0.0).then(|| mine / theirs)
}

/// The load of a paired round: simulated hosts per broker, whether every report changes,
/// and whether a job takes hosts meanwhile.
struct Load {
    each: usize,
    changing: bool,
    churn: bool,
}

/// What a paired round measured: the (compared, ours) CPU shares of each window, percent of
/// one core, and the calls each broker's job made during the windows.
struct Paired {
    windows: Vec<(f64, f64)>,
    calls: (u64, u64),
}

/// The loop of the job that takes hosts: a call per line of output.
const TAKING_HOSTS: &str = "while :; do rsh anyLinux true 2>/dev/null; echo; done";

/// A job of `broker` looping over [`TAKING_HOSTS`], and the count of its calls so far.
fn taking_hosts(broker: &Broker) -> anyhow::Result<(std::process::Child, Arc<AtomicU64>)> {
    let mut job = broker
        .agent(&["sh", "-c", TAKING_HOSTS])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let calls = Arc::new(AtomicU64::new(0));
    let counter = calls.clone();
    let out = job.stdout.take().expect("piped");
    std::thread::spawn(move || {
        use std::io::BufRead;
        for _ in std::io::BufReader::new(out).lines() {
            counter.fetch_add(1, AtomicOrdering::Relaxed);
        }
    });
    Ok((job, calls))
}

/// One round of the paired rows: `compared` and `ours` over `lab`, each under the `load`
/// (none measured when not every host came up within 40 s).
fn paired_round(
    compared: &Path,
    ours: &Path,
    lab: &str,
    load: &Load,
    first_ours: bool,
) -> anyhow::Result<Paired> {
    let order = if first_ours {
        [ours, compared]
    } else {
        [compared, ours]
    };
    let brokers = order.map(|p| Broker::start_program(p, lab));
    let mut gens = Vec::new();
    for b in &brokers {
        gens.push(crate::spawn_loadgen(b, load.each, load.changing, 90)?);
    }
    let up = brokers
        .iter()
        .all(|b| crate::all_up_within(b, load.each, Duration::from_secs(40)).is_some());
    let mut jobs = Vec::new();
    if up && load.churn {
        for b in &brokers {
            jobs.push(taking_hosts(b)?);
        }
        std::thread::sleep(Duration::from_secs(3)); // the jobs reach their pace
    }
    let [a, b] = brokers.each_ref().map(|b| b.child.id());
    let (them, us) = if first_ours { (b, a) } else { (a, b) };
    if !up {
        eprintln!("rb-bench paired: not every host up within 40 s: a round not measured");
    }
    let wanted = if up { PAIRED_WINDOWS } else { 0 };
    let calls_now = || -> Vec<u64> {
        jobs.iter()
            .map(|(_, c)| c.load(AtomicOrdering::Relaxed))
            .collect()
    };
    let calls_before = calls_now();
    let mut windows = Vec::new();
    for _ in 0..wanted {
        let before = [them, us].map(bench::procstat::cpu_seconds);
        std::thread::sleep(Duration::from_secs(2));
        let after = [them, us].map(bench::procstat::cpu_seconds);
        if let ([Some(t0), Some(u0)], [Some(t1), Some(u1)]) = (before, after) {
            windows.push(((t1 - t0) / 2.0 * 100.0, (u1 - u0) / 2.0 * 100.0));
        }
    }
    let served: Vec<u64> = calls_now()
        .iter()
        .zip(&calls_before)
        .map(|(after, before)| after - before)
        .collect();
    let calls = match served.as_slice() {
        [first, second] if first_ours => (*second, *first),
        [first, second] => (*first, *second),
        _ => (0, 0),
    };
    for (mut job, _) in jobs {
        let _ = job.kill();
        let _ = job.wait();
    }
    for mut g in gens {
        let _ = g.kill();
        let _ = g.wait();
    }
    Ok(Paired { windows, calls })
}

/// One row of the footprint table: a broker executable (`None`: not built) with its lab
/// file, the load's kind, and its runs pooled.
struct FootprintRow {
    name: String,
    program: Option<PathBuf>,
    lab: String,
    changing: bool,
    /// The reports sent whole even where the broker takes what changed (`rb-loadgen
    /// --whole-reports`, as a daemon from before `report_changes`).
    whole: bool,
    /// Not a broker: `rb-readfloor`, reading as this says.
    floor: Option<crate::ReadFloor>,
    /// Variables the broker runs with (this workspace's broker only).
    env: &'static [(&'static str, &'static str)],
    run: Option<LoadRun>,
}

impl FootprintRow {
    fn new(name: String, program: Option<&PathBuf>, lab: String, changing: bool) -> Self {
        FootprintRow {
            name,
            program: program.cloned(),
            lab,
            changing,
            whole: false,
            floor: None,
            env: &[],
            run: None,
        }
    }

    /// What this row's simulated daemons send.
    fn reports(&self) -> crate::Reports {
        crate::Reports {
            changing: self.changing,
            whole: self.whole,
        }
    }

    /// This row with its reports sent whole.
    fn whole(self) -> Self {
        FootprintRow {
            whole: true,
            ..self
        }
    }

    /// `rb-readfloor` under the same load: the reports read as `how` says, no more.
    fn floor(name: &str, changing: bool, how: crate::ReadFloor) -> Self {
        FootprintRow {
            floor: Some(how),
            ..FootprintRow::new(name.into(), None, String::new(), changing)
        }
    }

    /// One more run of this row's broker under `n` simulated hosts, pooled.
    fn measure(&mut self, n: usize) -> anyhow::Result<()> {
        let run = match (&self.program, self.floor) {
            (_, Some(how)) => LoadRun::measure_floor(n, self.reports(), how)?,
            (Some(_), None) if !self.env.is_empty() => {
                LoadRun::measure_reports(Broker::start_env(&self.lab, self.env), n, self.reports())?
            }
            (Some(program), None) => LoadRun::measure_reports(
                Broker::start_program(program, &self.lab),
                n,
                self.reports(),
            )?,
            (None, None) => return Ok(()),
        };
        self.run.get_or_insert_with(LoadRun::default).pool(run);
        Ok(())
    }
}

// ---- Lab rows (root): owner return, and the paper's Figure 7 ----

/// The lab user's own machine (not managed): jobs are started there, as in the agent tables.
pub(crate) const FRONT_END: &str = "node02";
/// The private host of the owner-return rows.
const PRIVATE: &str = "node03";
/// Its owner.
const OWNER: &str = "alice";
/// The broker's reclaim grace in the lab rows (`reclaim_grace_s`).
pub(crate) const GRACE_S: f64 = 1.0;
/// A holder's process, by its command line.
const HOLDER_MARK: &str = "sleep 1000";

/// A broker over `lab` (node02 unmanaged), jobs over `transport`, the paper policy named in
/// the lab file, grace [`GRACE_S`], `owners` as given.
pub(crate) fn lab_broker(lab: lab::Lab, transport: &str, owners: &[(&str, &str)]) -> LabWithBroker {
    let mut opts = LabOptions::new(owners, TEST_TIMING);
    opts.rsh = true;
    opts.job_shell = Some(vec![transport.to_string()]);
    opts.unmanaged = vec![FRONT_END.to_string()];
    let text = lab_file_with(&lab, &opts).replacen(
        "[broker]\n",
        &format!("[broker]\npolicy = \"paper\"\nreclaim_grace_s = {GRACE_S}\n"),
        1,
    );
    let broker = Broker::start(&text);
    broker.wait_all_up(Duration::from_secs(30));
    LabWithBroker { broker, lab }
}

/// Whether a live (not zombie) process of the lab user on `host` has `mark` in its command
/// line.
fn live(env: &LabWithBroker, host: &str, mark: &str) -> bool {
    let user = env.lab.user().name.clone();
    let Ok(out) = env
        .lab
        .exec(host, &["ps", "-u", &user, "-o", "stat=,args="])
    else {
        return false;
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| !l.trim_start().starts_with('Z') && l.contains(mark))
}

/// An adaptive job on the front end holding `hosts` hosts: one loop per host running
/// `HOLDER_MARK` there (ending at SIGTERM, or ignoring it), taking a host again each time it
/// loses one.
fn start_holder(
    env: &LabWithBroker,
    hosts: usize,
    ignore_term: bool,
) -> anyhow::Result<std::process::Child> {
    let remote = match ignore_term {
        true => format!("trap \"\" TERM; {HOLDER_MARK}"),
        false => format!("exec {HOLDER_MARK}"),
    };
    let one = format!("while :; do rsh anyLinux '{remote}'; sleep 0.05; done");
    let app = format!("for i in $(seq 1 {hosts}); do ( {one} ) & done; wait");
    Ok(env
        .agent_as_user(
            FRONT_END,
            &["--rsl", "&(adaptive=yes)"],
            &["sh", "-c", &app],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?)
}

/// Ends the holder job and waits until its hosts are free and its processes gone.
fn stop_holder(env: &LabWithBroker, holder: &mut std::process::Child, hosts: &[String]) {
    let _ = env.lab.stop_spawned(holder);
    wait_until(Duration::from_secs(30), || {
        env.broker.held_hosts().is_empty().then_some(())
    });
    wait_until(Duration::from_secs(30), || {
        hosts
            .iter()
            .all(|h| !live(env, h, HOLDER_MARK))
            .then_some(())
    });
}

/// Waits until the holder's process runs on every host of `hosts`.
fn wait_held(env: &LabWithBroker, hosts: &[String]) -> bool {
    wait_until(Duration::from_secs(30), || {
        hosts
            .iter()
            .all(|h| live(env, h, HOLDER_MARK))
            .then_some(())
    })
    .is_some()
}

fn lab_rows(opts: &Options) -> anyhow::Result<()> {
    if !(opts.wants("owner") || opts.wants("figure7") || opts.wants("owner-logind")) {
        return Ok(());
    }
    if !tests::is_root() {
        println!("### Owner return and reclaiming N hosts (lab)\n\nskipped: needs root (network namespaces)\n");
        return Ok(());
    }
    if opts.wants("owner") {
        owner_return(opts)?;
    }
    if opts.wants("figure7") {
        figure_seven(opts)?;
    }
    if opts.wants("owner-logind") {
        crate::owner_logind::run(opts.owner_logind_reps)?;
    }
    Ok(())
}

fn owner_return(opts: &Options) -> anyhow::Result<()> {
    println!("### Owner return (lab)\n");
    println!(
        "Real namespaced hosts: the lab user runs an adaptive job on node02 (not managed) \
         whose process runs on node03, the private workstation of `{OWNER}` (the only host \
         managed; `[broker] policy = \"paper\"`, `reclaim_grace_s = {GRACE_S}`); the process \
         ends at SIGTERM. Then `{OWNER}` logs in on node03 (a real utmp entry and tty, \
         `lab::FakeLogin`, idle 0 s). Time from the login to the job's process gone from \
         node03 (polled every 20 ms), over each remote shell the job uses. Baseline: the \
         login alone becoming visible in `rb status` (the host daemon's immediate report). \
         Median of {} (min–max). Goal: ≤ 1 s + grace.\n",
        opts.lab_reps
    );
    println!("| measurement | median (min–max, n) |");
    println!("|---|---|");
    let spec = lab::LabSpec {
        hosts: 2,
        rsh: true,
        ..lab::LabSpec::default()
    };
    let mut lab = lab::Lab::up(&spec).map_err(|e| anyhow::anyhow!("lab up: {e}"))?;
    let show = |v: &[f64]| summarize(v).map_or("-".into(), |s| s.show("ms", 0));
    let mut visible = Vec::new();
    for transport in &opts.transports {
        let env = lab_broker(lab, transport, &[(PRIVATE, OWNER)]);
        let mut holder = start_holder(&env, 1, false)?;
        let mut gone = Vec::new();
        for _ in 0..opts.lab_reps {
            anyhow::ensure!(
                wait_held(&env, &[PRIVATE.to_string()]),
                "the adaptive job never ran on {PRIVATE}\n{}",
                env.broker.log()
            );
            let t0 = Instant::now();
            let login = env
                .lab
                .fake_login(PRIVATE, OWNER, "rbtty-owner", Duration::ZERO)?;
            let mut seen = None;
            let left = wait_until(Duration::from_secs(10), || {
                if seen.is_none()
                    && env
                        .broker
                        .host(PRIVATE)
                        .is_some_and(|h| h.users.iter().any(|u| u.user == OWNER))
                {
                    seen = Some(t0.elapsed());
                }
                (!live(&env, PRIVATE, HOLDER_MARK)).then(|| t0.elapsed())
            });
            let left = left.ok_or_else(|| {
                anyhow::anyhow!("the job's process survived the owner's login on {PRIVATE}")
            })?;
            gone.push(left.as_secs_f64() * 1e3);
            // The process may be gone before a poll of `rb status` saw the login: the
            // baseline waits on, so that its slow samples are not the ones left out.
            let seen = seen.or_else(|| {
                wait_until(Duration::from_secs(10), || {
                    env.broker
                        .host(PRIVATE)
                        .is_some_and(|h| h.users.iter().any(|u| u.user == OWNER))
                        .then(|| t0.elapsed())
                })
            });
            if let Some(s) = seen {
                visible.push(s.as_secs_f64() * 1e3);
            }
            login.end()?;
            env.broker
                .wait_host(PRIVATE, Duration::from_secs(10), "logout", |h| {
                    h.users.iter().all(|u| u.user != OWNER)
                });
        }
        println!(
            "| owner login → adaptive process gone (job over {transport}) | {} |",
            show(&gone)
        );
        stop_holder(&env, &mut holder, &[PRIVATE.to_string()]);
        let LabWithBroker { broker, lab: l } = env;
        drop(broker);
        lab = l;
    }
    println!(
        "| owner login → visible in `rb status` (baseline) | {} |",
        show(&visible)
    );
    println!();
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))?;
    Ok(())
}

/// Machine counts of Figure 7.
const FIGURE_SEVEN_N: [usize; 5] = [1, 2, 4, 8, 12];
/// Managed hosts of Figure 7's lab.
const FIGURE_SEVEN_HOSTS: usize = 13;

fn figure_seven(opts: &Options) -> anyhow::Result<()> {
    println!("### Reclaiming N hosts at once (the paper's Figure 7, lab)\n");
    println!(
        "{FIGURE_SEVEN_HOSTS} managed lab hosts (node03–node15; node02 is the lab user's \
         front end), jobs over rsh, `[broker] policy = \"paper\"`, `reclaim_grace_s = \
         {GRACE_S}`. An adaptive job holds every host (one `rsh anyLinux 'sleep 1000'` per \
         host, each taken again when lost); a new, non-adaptive job on node02 asks for N \
         hosts at once: `rsh anyLinux-1 true & … rsh anyLinux-N true & wait`, timed by \
         `rb-timeit` inside node02 until every `rsh` has returned (all N granted and run). \
         Baseline: the same command with every host free. The holder's processes end at \
         SIGTERM, or ignore it (then SIGKILL at the grace's end). Median of {} (min–max). \
         Paper: about 1 s per machine, linear. Goal: ≤ grace + 100 ms at N = 12 (reclaims in \
         parallel).\n",
        opts.lab_reps
    );
    let spec = lab::LabSpec {
        hosts: FIGURE_SEVEN_HOSTS + 1,
        rsh: true,
        ..lab::LabSpec::default()
    };
    let lab = lab::Lab::up(&spec).map_err(|e| anyhow::anyhow!("lab up: {e}"))?;
    let env = lab_broker(lab, "rsh", &[]);
    let managed: Vec<String> = env
        .lab
        .hosts()
        .iter()
        .map(|h| h.name.clone())
        .filter(|h| h != FRONT_END)
        .collect();
    let mut rows: Vec<(String, Vec<Option<Summary>>)> = Vec::new();
    let free: Vec<Option<Summary>> = FIGURE_SEVEN_N
        .iter()
        .map(|&n| ask_n(&env, n, opts.lab_reps, None))
        .collect::<anyhow::Result<_>>()?;
    rows.push(("every host free (baseline)".into(), free));
    for (ignore_term, label) in [
        (false, "held; holder ends at SIGTERM"),
        (
            true,
            "held; holder ignores SIGTERM (SIGKILL after the grace)",
        ),
    ] {
        let mut holder = start_holder(&env, managed.len(), ignore_term)?;
        let figures = FIGURE_SEVEN_N
            .iter()
            .map(|&n| ask_n(&env, n, opts.lab_reps, Some(&managed)))
            .collect::<anyhow::Result<_>>();
        stop_holder(&env, &mut holder, &managed);
        rows.push((label.into(), figures?));
    }
    print!("| hosts |");
    for n in FIGURE_SEVEN_N {
        print!(" N = {n} |");
    }
    println!();
    println!("|---|{}", "---|".repeat(FIGURE_SEVEN_N.len()));
    for (label, figures) in &rows {
        print!("| {label} |");
        for s in figures {
            print!(" {} |", show_ms(*s));
        }
        println!();
    }
    print!("| paper (1998) |");
    for n in FIGURE_SEVEN_N {
        print!(" ≈ {n} s |");
    }
    println!("\n");
    print_figure_seven_verdict(&rows);
    let LabWithBroker { broker, lab } = env;
    drop(broker);
    lab.down().map_err(|e| anyhow::anyhow!("lab down: {e}"))?;
    Ok(())
}

/// The goal at the largest N, and each held row over the baseline: every lab host is a
/// namespace on this machine, so the N remote shells of the baseline share its cores.
fn print_figure_seven_verdict(rows: &[(String, Vec<Option<Summary>>)]) {
    let last = FIGURE_SEVEN_N.len() - 1;
    let n = FIGURE_SEVEN_N[last];
    let at_n =
        |row: usize| -> Option<f64> { rows.get(row)?.1.get(last).copied()?.map(|s| s.median) };
    let (Some(base), Some(term), Some(kill)) = (at_n(0), at_n(1), at_n(2)) else {
        return;
    };
    let grace_ms = GRACE_S * 1000.0;
    println!(
        "At N = {n}: the holder ending at SIGTERM, {term:.0} ms in all (goal ≤ grace + 100 ms = \
         {:.0} ms); ignoring it, {kill:.0} ms = grace + {:.0} ms. The baseline — {n} remote \
         shells to free hosts, whose {} namespaced hosts share this machine's {} cores — is \
         {base:.0} ms of that: over the baseline, reclaiming {n} hosts at once adds {:.0} ms \
         when the holder ends at SIGTERM and grace + {:.0} ms when it must be killed.\n",
        grace_ms + 100.0,
        kill - grace_ms,
        FIGURE_SEVEN_HOSTS + 1,
        std::thread::available_parallelism().map_or(1, |p| p.get()),
        term - base,
        kill - grace_ms - base,
    );
}

pub(crate) fn show_ms(s: Option<Summary>) -> String {
    match s {
        Some(s) if s.median >= 1000.0 => format!(
            "{:.3} s ({:.3}–{:.3})",
            s.median / 1000.0,
            s.min / 1000.0,
            s.max / 1000.0
        ),
        Some(s) => format!("{:.1} ms ({:.1}–{:.1})", s.median, s.min, s.max),
        None => "-".into(),
    }
}

/// The ports rsh binds on its side (`rresvport`: 512–1023), and a margin for the calls of
/// other processes meanwhile.
const RESERVED_PORTS: std::ops::RangeInclusive<u16> = 512..=1023;
const RESERVED_MARGIN: usize = 32;

/// Waits until the front end has `needed` reserved ports free (not counted in the
/// figures). Each rsh call keeps one for 60 s after it ends (netkit rsh closes first: its
/// connection sits in TIME-WAIT on the caller's side), so one host can make only about
/// 500 rsh calls a minute; this section makes more, and then rsh fails with `rcmd: socket:
/// All ports in use`.
fn wait_for_reserved_ports(env: &LabWithBroker, needed: usize) -> anyhow::Result<()> {
    let total = RESERVED_PORTS.len();
    let in_use = || -> Option<usize> {
        let out = env.lab.exec(FRONT_END, &["ss", "-Htan"]).ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        Some(
            text.lines()
                .filter_map(|l| {
                    l.split_whitespace()
                        .nth(3)?
                        .rsplit_once(':')?
                        .1
                        .parse()
                        .ok()
                })
                .filter(|port: &u16| RESERVED_PORTS.contains(port))
                .count(),
        )
    };
    let free = wait_until(Duration::from_secs(90), || {
        let used = in_use()?;
        (total.saturating_sub(used) >= needed + RESERVED_MARGIN).then_some(())
    });
    anyhow::ensure!(
        free.is_some(),
        "{FRONT_END} never had {needed} reserved ports free for rsh within 90 s"
    );
    Ok(())
}

/// Times a new non-adaptive job asking for `n` hosts at once (`anyLinux-1..n`), `reps`
/// times; with `held`, each run first waits until the holder runs on every host of it.
fn ask_n(
    env: &LabWithBroker,
    n: usize,
    reps: usize,
    held: Option<&[String]>,
) -> anyhow::Result<Option<Summary>> {
    let script = format!(
        "pids=; for i in $(seq 1 {n}); do rsh anyLinux-$i true & pids=\"$pids $!\"; done; \
         fail=0; for p in $pids; do wait $p || fail=1; done; exit $fail"
    );
    let timeit = tests::bin("rb-timeit").display().to_string();
    let mut times = Vec::new();
    for _ in 0..reps {
        // The rep's n calls, and the holder's n calls taking its hosts back afterwards.
        wait_for_reserved_ports(env, 2 * n)?;
        if let Some(hosts) = held {
            anyhow::ensure!(
                wait_held(env, hosts),
                "the adaptive holder never ran on every host\n{}",
                env.broker.log()
            );
        }
        let out = env
            .agent_as_user(FRONT_END, &[], &[&timeit, "1", "sh", "-c", &script])
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.lines().find_map(|l| l.trim().parse::<f64>().ok()) {
            Some(ms) => times.push(ms),
            None => eprintln!(
                "rb-bench policy: asking for {n} hosts failed: {text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            ),
        }
    }
    Ok(summarize(&times))
}
