//! Tier 2: no peer can stall the broker. An authenticated agent connection that floods
//! requests and never reads what it is sent must not slow other jobs' grants, `rb status`
//! or the broker's memory: its outbox fills, and the broker cuts it. Through the real
//! control socket, with the real broker and virtual hosts; no root needed.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};

use proto::msg::ToBroker;
use tests::{local_lab, raw_agent::RawAgent, wait_until, Broker};

/// The flooding agent's outbox (`RB_AGENT_OUTBOX`): small enough that the test ends
/// soon, large enough that the flood lasts over many probes.
const OUTBOX: &str = "2000";

/// How long a read from the broker may take before the test calls the broker stalled.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Resident set size of a process, in KiB (`VmRSS`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS");
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number")
}

/// Writes `allocate` requests for a name no host has as fast as the broker takes them,
/// never reading, until the broker closes the connection; returns how many were written.
fn flood(mut agent: RawAgent, limit: u64, done: &AtomicBool) -> (u64, bool) {
    // The writing is the test's load, not the broker's: it yields the CPU to the broker
    // and the prober (this thread only; Linux takes a thread id for the process).
    // SAFETY: plain syscalls on this thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
    let mut written = 0;
    let mut cut = false;
    while written < limit {
        let ask = ToBroker::Allocate {
            req: written + 1,
            symbolic: "anyNoSuchLabel".into(),
        };
        if agent.send(&ask).is_err() {
            cut = true;
            break;
        }
        written += 1;
    }
    done.store(true, Ordering::SeqCst);
    (written, cut)
}

/// Rounds of quiet probing and flooding, interleaved: the machine's other load changes
/// from one second to the next (a grant's median moved between 1.6 and 18 ms from one quiet
/// stretch to the next at a load average of 10 on 2 CPUs), so quiet grants measured only
/// before the flood compared a different load, not the flood. Interleaved, both sets are
/// drawn from the same stretches of load.
const ROUNDS: usize = 5;
/// Quiet grants per round (with `rb status` every tenth, as during the flood).
const QUIET_PER_ROUND: usize = 30;

/// One probe's figures, kept across rounds.
#[derive(Default)]
struct Samples {
    quiet: Vec<Duration>,
    busy: Vec<Duration>,
    statuses_during: usize,
}

/// The broker's answer to an agent that floods and never reads: it is cut (logged), and
/// meanwhile another job's grants take at most four times their quiet time (medians over
/// [`ROUNDS`] interleaved quiet and flooded stretches), `rb status` answers and the
/// broker's RSS stays within a bound. The outbox is made small ([`OUTBOX`]) so that the
/// unread answers fill it within seconds; the flood does not stop on its own before the
/// broker cuts it.
#[test]
fn an_agent_that_floods_and_never_reads_is_cut_without_stalling_anyone() {
    let broker = Broker::start_env(&local_lab(2), &[("RB_AGENT_OUTBOX", OUTBOX)]);
    broker.wait_all_up(Duration::from_secs(20));
    let register = |name: &str| {
        RawAgent::register(&broker.socket(), name, ANSWER_WITHIN).expect("a registered agent")
    };
    let mut prober = register("prober");
    let mut req = 0;
    let mut probe = |prober: &mut RawAgent| {
        req += 1;
        prober
            .grant(req, "anyLinux", ANSWER_WITHIN)
            .expect("the broker answers")
            .expect("granted within the answer's time")
    };
    let mut s = Samples::default();
    // The RSS before any flood, and its peak from then on.
    let mut rss_before = 0;
    let mut rss_peak = 0;
    for round in 0..ROUNDS {
        // The quiet grants are measured as the busy ones are: with `rb status` every tenth
        // and the broker's RSS read after each (both take CPU the grants compete with).
        let mut quiet = 0;
        while quiet < QUIET_PER_ROUND {
            s.quiet.push(probe(&mut prober));
            quiet += 1;
            if quiet % 10 == 0 {
                assert!(broker.status().is_some(), "rb status answers");
            }
            let rss = rss_kib(broker.pid());
            match round {
                0 => rss_before = rss_before.max(rss),
                _ => rss_peak = rss_peak.max(rss),
            }
        }
        let flooder = register(&format!("flooder{round}"));
        let done = Arc::new(AtomicBool::new(false));
        let flooding = {
            let done = done.clone();
            std::thread::spawn(move || flood(flooder, 2_000_000, &done))
        };
        let mut busy = 0;
        while !done.load(Ordering::SeqCst) {
            s.busy.push(probe(&mut prober));
            busy += 1;
            if busy % 10 == 0 {
                assert!(
                    broker.status().is_some(),
                    "rb status answers during the flood"
                );
                s.statuses_during += 1;
            }
            rss_peak = rss_peak.max(rss_kib(broker.pid()));
            assert!(busy < 100_000, "the flood never ended");
        }
        let (written, cut) = flooding.join().expect("flooder");
        eprintln!(
            "round {round}: flood of {written} requests, cut: {cut}, {busy} grants during it"
        );
        assert!(
            cut,
            "the broker never cut the flooding agent ({written} requests)"
        );
    }
    let (quiet, busy) = (median(s.quiet.clone()), median(s.busy.clone()));
    eprintln!(
        "grants: quiet {quiet:?} (median of {}), during the floods {busy:?} (median of {}); \
         rb status answered {} times; RSS {rss_before} -> {rss_peak} KiB",
        s.quiet.len(),
        s.busy.len(),
        s.statuses_during
    );
    assert!(
        s.busy.len() >= 10 * ROUNDS && s.statuses_during >= ROUNDS,
        "too short floods to measure: {} grants, {} statuses",
        s.busy.len(),
        s.statuses_during
    );
    let logged = wait_until(Duration::from_secs(10), || {
        let cuts = broker.log().matches("agent connection cut").count();
        (cuts >= ROUNDS).then_some(())
    });
    assert!(logged.is_some(), "each cut is logged:\n{}", broker.log());
    // A stall (the core awaiting the flooder) holds each grant until the cut, hundreds of
    // milliseconds at least; the flooder's own CPU on this 2-core machine slows grants
    // too, up to 2.05× in a full test run (5.2 against 2.5 ms): the bound is between.
    assert!(
        busy <= 4 * quiet,
        "grants took {busy:?} during the floods against {quiet:?} quiet"
    );
    assert!(
        rss_peak < rss_before + 64 * 1024,
        "the broker grew from {rss_before} to {rss_peak} KiB"
    );
    assert!(
        broker.status().is_some(),
        "rb status answers after the cuts"
    );
}
