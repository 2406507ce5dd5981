//! The reports `rb-loadgen`'s simulated hosts send, also handed to the broker's core
//! directly by `rb-corecost`: the size and shape of a real daemon's (one logged-in user),
//! repeating but for their counter, or changing as a real daemon's do.

use std::time::Duration;

use proto::report::{HostReport, ReportTrigger, UserSession};

/// How the reports of one simulated host look over time.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Idle times grow by the interval and the load moves in 0.01 steps from report to
    /// report; else the reports repeat but for their counter.
    pub changing: bool,
    pub interval: Duration,
}

/// A report the size and shape of a real one (one logged-in user).
pub fn report(name: &str, seq: u64, shape: Shape) -> HostReport {
    // Changing: idle times as they grow between reports, a load that moves in 0.01 steps.
    let (idle_more, load_step) = match shape.changing {
        true => (
            seq * shape.interval.as_secs().max(1),
            (seq % 10) as f64 / 100.0,
        ),
        false => (0, 0.0),
    };
    HostReport {
        hostname: name.to_string(),
        seq,
        trigger: Some(if seq == 1 {
            ReportTrigger::Start
        } else {
            ReportTrigger::Interval
        }),
        cpus: Some(8),
        load: Some([0.42 + load_step, 0.37, 0.30]),
        cpu_util: Some(0.05),
        mem_total_kb: Some(16_000_000),
        mem_available_kb: Some(12_000_000),
        os: Some("linux".into()),
        arch: Some("x86_64".into()),
        kernel: Some("6.1.0".into()),
        users: Some(vec![UserSession {
            user: "alice".into(),
            tty: "pts/0".into(),
            idle_s: Some(1200 + idle_more),
            from: None,
        }]),
        console_idle_s: Some(3600 + idle_more),
        managed_procs: Some(0),
        job_load: Some(0.0),
        labels: vec!["linux".into(), "x86_64".into()],
        overlaid: Vec::new(),
        logind: None,
        logind_error: None,
        warnings: Vec::new(),
        // Simulated daemons run no job processes: they list none, as a real one would.
        allocs_running: Some(Vec::new()),
    }
}
