//! Benchmark support: process measurements from /proc, statistics, markdown tables.
//!
//! # Layout
//! - [`procstat`]: a process from /proc: CPU time, resident memory, parent, name, argv search.
//! - [`stats`]: medians with min/max.
//! - [`civil`]: log timestamps as Unix time.
//! - [`report_shape`]: the simulated hosts' reports (`rb-loadgen`, `rb-corecost`).
//! - `bin/rb-loadgen`: N simulated host daemons that handshake and report for real.
//! - `bin/rb-bench`: runs every benchmark and prints the BENCHMARKS.md sections.
//! - `bin/rb-jel-probe`: a JEL member that records when it read each event (the JEL
//!   section's lab part runs it on the job's hosts).

pub mod civil;
pub mod procstat;
pub mod report_shape;
pub mod stats;
