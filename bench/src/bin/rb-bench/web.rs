//! "Metrics endpoint": the broker's CPU at N simulated hosts with its `[web]` `/metrics`
//! scraped every 15 s (as a Prometheus would) beside the same broker, same load, not
//! scraped: windows alternate within one run, so drift and neighbours hit both alike.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use bench::{procstat, stats::summarize};
use proto::report::HostState;
use tests::{wait_until, Broker};

const SCRAPE_EVERY: Duration = Duration::from_secs(15);
const WINDOW: Duration = Duration::from_secs(30);
const ROUNDS: usize = 3;

pub(crate) fn run(n: usize) -> anyhow::Result<()> {
    println!("### Metrics endpoint\n");
    println!("The broker with `[web] listen` at {n} simulated hosts (`rb-loadgen`, a report per host every second), `GET /metrics` every 15 s (the first at the window's start, as a Prometheus scrape loop would) beside no scrape, in {ROUNDS} alternating pairs of {}-s windows of one run. CPU share of one core over each window, median (min–max); scrape time = the whole HTTP request, as the scraper sees it.\n", WINDOW.as_secs());
    let lab = format!(
        "{}\n[web]\nlisten = \"127.0.0.1:0\"\n",
        crate::manual_lab(n)
    );
    let broker = Broker::start(&lab);
    let up_within = up_deadline(n);
    let total = WINDOW * (2 * ROUNDS as u32) + up_within + Duration::from_secs(30);
    let mut gen = Command::new(tests::bin("rb-loadgen"))
        .args(["--broker", &broker.tcp_addr().to_string()])
        .args(["--hosts", &n.to_string()])
        .args(["--seconds", &total.as_secs().to_string()])
        .arg("--secret-file")
        .arg(broker.secret())
        .stdout(Stdio::null())
        .spawn()?;
    let mut seen_up = 0;
    let up = wait_until(up_within, || {
        let rows = broker.status()?;
        seen_up = rows.iter().filter(|h| h.state == HostState::Up).count();
        (seen_up == n).then_some(())
    });
    let Some(_) = up else {
        let _ = gen.kill();
        let _ = gen.wait();
        anyhow::bail!(
            "not all {n} hosts up within {} s ({seen_up} up at the last look)",
            up_within.as_secs()
        );
    };
    let web = web_addr(&broker)?;
    let pid = broker.child.id();
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let scrapes = Arc::new(Mutex::new(Vec::new()));
    let mut bytes = 0;
    for _ in 0..ROUNDS {
        without.extend(procstat::measure(pid, WINDOW).map(|(s, _)| s * 100.0));
        let stop = Arc::new(AtomicBool::new(false));
        let scraper = {
            let (stop, scrapes) = (stop.clone(), scrapes.clone());
            std::thread::spawn(move || scrape_loop(web, &stop, &scrapes))
        };
        with.extend(procstat::measure(pid, WINDOW).map(|(s, _)| s * 100.0));
        stop.store(true, Ordering::Relaxed);
        bytes = scraper.join().unwrap_or(0);
    }
    let _ = gen.kill();
    let _ = gen.wait();
    let show = |v: &[f64]| summarize(v).map_or("-".into(), |s| s.show("%", 2));
    let scrape_ms = scrapes.lock().map(|s| s.clone()).unwrap_or_default();
    println!("| hosts | /metrics | broker CPU | scrape time | exposition |");
    println!("|---:|---|---|---|---:|");
    println!(
        "| {n} | not scraped (baseline) | {} | - | - |",
        show(&without)
    );
    println!(
        "| {n} | scraped every 15 s | {} | {} | {:.1} KiB |",
        show(&with),
        summarize(&scrape_ms).map_or("-".into(), |s| s.show("ms", 1)),
        bytes as f64 / 1024.0
    );
    if let (Some(a), Some(b)) = (summarize(&without), summarize(&with)) {
        println!(
            "\nDifference of the medians: {:+.2} % of a core (goal: at most +1 %).",
            b.median - a.median
        );
    }
    println!();
    Ok(())
}

/// How long `n` simulated hosts may take to be all up: a minute, and 45 s more per
/// thousand hosts (a debug broker at 10k hosts takes minutes to accept them all).
fn up_deadline(n: usize) -> Duration {
    Duration::from_secs(60 + 45 * (n as u64 / 1000))
}

/// Scrapes `/metrics` now and every [`SCRAPE_EVERY`] until `stop`; each scrape's ms goes
/// to `times`. Returns the last exposition's size.
fn scrape_loop(web: SocketAddr, stop: &AtomicBool, times: &Mutex<Vec<f64>>) -> usize {
    let mut size = 0;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() >= next {
            let t = Instant::now();
            size = get_metrics(web).unwrap_or(0);
            if let Ok(mut v) = times.lock() {
                v.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            next += SCRAPE_EVERY;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    size
}

fn get_metrics(web: SocketAddr) -> std::io::Result<usize> {
    let mut s = TcpStream::connect(web)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {web}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    Ok(out.len())
}

fn web_addr(broker: &Broker) -> anyhow::Result<SocketAddr> {
    let info = std::fs::read_to_string(broker.state_dir().join("broker.json"))?;
    let info: serde_json::Value = serde_json::from_str(&info)?;
    let addr = info["web"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no [web] address in broker.json"))?;
    Ok(addr.parse()?)
}
