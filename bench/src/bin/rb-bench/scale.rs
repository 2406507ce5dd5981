//! The policy section's `scale` part: what of issue 34's 100k-host row this machine can
//! measure. A broker whose lab names 100k hosts takes the row's 10k reports a second (every
//! report changing, the paper policy, the decision trace as by default), but from as many
//! simulated daemons as this machine's open-files limit lets one process hold (the rest of
//! the lab stays down), each reporting more often; meanwhile an agent asks for `anyLinux`
//! every [`GRANT_EVERY`] and gives the host back, timed from its request to its grant on
//! the broker's control socket: what a job waits while the broker takes that load. Two
//! connection counts, so that the memory a connected host adds can be read off and carried
//! to 100k.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Context;
use bench::{procstat, stats::summarize};
use tests::{raw_agent::RawAgent, Broker};

/// Hosts the lab file names.
const LAB_HOSTS: usize = 100_000;
/// Reports a second, all daemons together: the row's 10k (100k hosts, one each 10 s).
const REPORTS_PER_S: usize = 10_000;
/// Most simulated daemons: under this machine's hard open-files limit (20000) with room
/// for the broker's other files.
const MOST_CONNECTED: usize = 19_000;
/// How often the probing agent asks for a host.
const GRANT_EVERY: Duration = Duration::from_millis(20);
/// CPU windows sampled while the agent probes (2 s each).
const WINDOWS: usize = 5;
/// How long the broker takes the reports alone before its RSS is read.
const SETTLE: Duration = Duration::from_secs(15);
/// How often `rb status --json` is asked meanwhile, as a dashboard would.
const STATUS_EVERY: Duration = Duration::from_secs(1);
/// How long a grant may take before the probe counts it as not granted.
const GRANT_WITHIN: Duration = Duration::from_secs(5);

pub fn run(compared: Option<&(String, PathBuf)>) -> anyhow::Result<()> {
    // Raised to the hard limit for the broker and `rb-loadgen`, which inherit it.
    let open_files = startup::raise_open_files().context("reading the open-files limit")?;
    let most = usize::try_from(open_files.saturating_sub(1000))
        .unwrap_or(usize::MAX)
        .min(MOST_CONNECTED);
    let counts = [most / 2, most];
    println!("### 100k hosts in the lab, as far as this machine goes\n");
    println!(
        "Issue 34's row \"100k simulated hosts, one report per 10 s each\" needs one \
         broker process holding 100k connections; this machine's hard open-files limit \
         ({}) lets it hold about {MOST_CONNECTED}. What can be measured: a broker whose lab \
         file names {LAB_HOSTS} hosts (`transport = \"manual\"`, the paper policy, the \
         decision trace as by default) takes the row's {REPORTS_PER_S} reports a second, \
         every one changing (`rb-loadgen --changing`), from N simulated daemons each \
         reporting every N/{} s; the other hosts stay down. Meanwhile an agent on the \
         control socket asks for `anyLinux` every {} ms and gives the host back at once, \
         while `rb status --json` is asked every {} s as a dashboard would: the grant \
         column is the agent's wait from request to grant, median, 99th percentile and \
         largest (n grants); the status column each call's time (median, min–max). CPU: \
         {WINDOWS} windows of 2 s (median, min–max). RSS, the reports alone: read {} s after \
         all are up (the pages of the `rb status` answers that watched them come up given \
         back), before the agent and the dashboard start; under the load: the largest of \
         the CPU windows'; peak RSS: VmHWM at the end. Each row once per build, the builds \
         run one after the other.\n",
        open_files,
        REPORTS_PER_S,
        GRANT_EVERY.as_millis(),
        STATUS_EVERY.as_secs(),
        SETTLE.as_secs() + 2
    );
    println!("| broker | connected daemons (of {LAB_HOSTS}) | broker CPU | broker RSS, the reports alone | broker RSS under the load | broker peak RSS | grant: median, p99, max (n) | `rb status --json` ({LAB_HOSTS} rows) | load generator CPU |");
    println!("|---|---:|---|---:|---:|---:|---|---|---|");
    let mut builds = vec![("today's".to_string(), tests::bin("rb-broker"))];
    if let Some((label, path)) = compared {
        builds.insert(0, (label.clone(), path.clone()));
    }
    let mut rss = Vec::new();
    for (label, program) in &builds {
        let mut points = Vec::new();
        for &n in &counts {
            let row = ScaleRow::measure(program, n)?;
            println!("| {label} | {n} | {} |", row.cells());
            points.push((n, row.reports_rss_kb));
        }
        rss.push((label.clone(), points));
    }
    println!();
    for (label, points) in rss {
        if let [(n1, r1), (n2, r2)] = points[..] {
            let per_kb = (r2 as f64 - r1 as f64) / (n2 - n1) as f64;
            let at_all = r2 as f64 + per_kb * (LAB_HOSTS - n2) as f64;
            println!(
                "{label}: each connected daemon adds {per_kb:.1} KiB of RSS under the reports \
                 alone (its session and its host's reported state); carried to all \
                 {LAB_HOSTS} connected, about {:.0} MiB before any answer.",
                at_all / 1024.0
            );
        }
    }
    println!();
    Ok(())
}

/// One broker under the load.
struct ScaleRow {
    cpu: Vec<f64>,
    /// RSS under the reports alone, before the agent and the dashboard start, KiB.
    reports_rss_kb: u64,
    /// RSS during the load (the largest of the CPU windows'), KiB.
    load_rss_kb: u64,
    /// VmHWM at the end (after the `rb status` calls), KiB.
    rss_kb: u64,
    grants_ms: Vec<f64>,
    not_granted: usize,
    status_ms: Vec<f64>,
    gen_cpu: Option<f64>,
    up: bool,
}

impl ScaleRow {
    fn measure(program: &std::path::Path, n: usize) -> anyhow::Result<ScaleRow> {
        let broker = Broker::start_program(
            program,
            &crate::manual_lab(LAB_HOSTS).replacen(
                "[broker]\n",
                "[broker]\npolicy = \"paper\"\n",
                1,
            ),
        );
        let pid = broker.child.id();
        let mut gen = spawn_loadgen(&broker, n)?;
        let up = crate::all_up_within(&broker, n, Duration::from_secs(120)).is_some();
        // The reports alone first, once the allocator has given back the pages of the
        // `rb status` answers that watched the hosts come up (jemalloc's decay: 10 s).
        std::thread::sleep(SETTLE);
        let reports_rss_kb = procstat::measure(pid, Duration::from_secs(2)).map_or(0, |(_, kb)| kb);
        let stop = Arc::new(AtomicBool::new(false));
        let probe = {
            let (socket, stop) = (broker.socket(), stop.clone());
            std::thread::spawn(move || probe_grants(&socket, &stop))
        };
        let dashboard = {
            let (socket, stop) = (broker.socket(), stop.clone());
            std::thread::spawn(move || ask_status(&socket, &stop))
        };
        let gen_cpu = procstat::measure(gen.id(), Duration::from_secs(2)).map(|(s, _)| s * 100.0);
        let (mut cpu, mut load_rss_kb) = (Vec::new(), 0);
        for _ in 0..WINDOWS {
            if let Some((share, kb)) = procstat::measure(pid, Duration::from_secs(2)) {
                cpu.push(share * 100.0);
                load_rss_kb = load_rss_kb.max(kb);
            }
        }
        stop.store(true, Ordering::Relaxed);
        let (grants_ms, not_granted) = probe
            .join()
            .map_err(|_| anyhow::anyhow!("the grant probe panicked"))??;
        let status_ms = dashboard
            .join()
            .map_err(|_| anyhow::anyhow!("the status caller panicked"))?;
        let rss_kb = peak_rss_kb(pid).unwrap_or(0);
        let _ = gen.kill();
        let _ = gen.wait();
        Ok(ScaleRow {
            cpu,
            reports_rss_kb,
            load_rss_kb,
            rss_kb,
            grants_ms,
            not_granted,
            status_ms,
            gen_cpu,
            up,
        })
    }

    /// The row's cells after the first two.
    fn cells(&self) -> String {
        let cpu = summarize(&self.cpu).map_or("-".into(), |s| s.show("%", 1));
        let status = summarize(&self.status_ms).map_or("-".into(), |s| s.show("ms", 0));
        let mut g = self.grants_ms.clone();
        g.sort_by(f64::total_cmp);
        let at = |q: f64| {
            g.get(((g.len() as f64 - 1.0) * q).round() as usize)
                .copied()
        };
        let grants = match (at(0.5), at(0.99), g.last()) {
            (Some(m), Some(p), Some(x)) => format!("{m:.2}, {p:.2}, {x:.1} ms (n={})", g.len()),
            _ => "-".into(),
        };
        let missed = match self.not_granted {
            0 => String::new(),
            k => format!("; {k} not granted within {} s", GRANT_WITHIN.as_secs()),
        };
        format!(
            "{cpu}{} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {grants}{missed} | {status} | {} ",
            if self.up { "" } else { " (not all up)" },
            self.reports_rss_kb as f64 / 1024.0,
            self.load_rss_kb as f64 / 1024.0,
            self.rss_kb as f64 / 1024.0,
            self.gen_cpu.map_or("-".into(), |c| format!("{c:.1} %")),
        )
    }
}

/// `rb-loadgen`: `n` daemons whose reports together come [`REPORTS_PER_S`] a second.
fn spawn_loadgen(broker: &Broker, n: usize) -> anyhow::Result<Child> {
    let interval_ms = (n * 1000 / REPORTS_PER_S).max(1);
    Command::new(tests::bin("rb-loadgen"))
        .args(["--broker", &broker.tcp_addr().to_string()])
        .args(["--hosts", &n.to_string()])
        .args(["--interval-ms", &interval_ms.to_string()])
        .args(["--seconds", "300", "--changing"])
        .arg("--secret-file")
        .arg(broker.secret())
        .stdout(Stdio::null())
        .spawn()
        .context("starting rb-loadgen")
}

/// An agent on `socket` asks for `anyLinux` every [`GRANT_EVERY`] until `stop`, giving each
/// host back once granted: the waits in ms, and the requests not granted in time.
fn probe_grants(socket: &std::path::Path, stop: &AtomicBool) -> anyhow::Result<(Vec<f64>, usize)> {
    let mut agent = RawAgent::register(socket, "rb-bench-grant-probe", GRANT_WITHIN)?;
    let (mut waits, mut missed) = (Vec::new(), 0);
    let mut req = 0;
    while !stop.load(Ordering::Relaxed) {
        req += 1;
        let next = Instant::now() + GRANT_EVERY;
        match agent.grant(req, "anyLinux", GRANT_WITHIN)? {
            Some(took) => waits.push(took.as_secs_f64() * 1000.0),
            None => missed += 1,
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    Ok((waits, missed))
}

/// `rb status --json` every [`STATUS_EVERY`] until `stop`, as a dashboard asks: how long
/// each took, in ms.
fn ask_status(socket: &std::path::Path, stop: &AtomicBool) -> Vec<f64> {
    let socket = socket.display().to_string();
    let mut took = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let next = Instant::now() + STATUS_EVERY;
        let t = Instant::now();
        if tests::rb(&["--broker", &socket, "status", "--json"])
            .status
            .success()
        {
            took.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    took
}

/// The peak resident set (VmHWM) of process `pid`, KiB.
fn peak_rss_kb(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
