//! The utilization chart of a lab: its decision trace replayed (`allocation`'s
//! [`Replay`](allocation::Replay), whose `usage` integration gives each host's states),
//! cut into time buckets ([`allocation::usage_series`]) and drawn as an SVG, for
//! `rb report TRACE_DIR --svg FILE` and the broker's status page. Hand-written SVG text: a
//! few rectangles and paths need no drawing crate.
//!
//! # Layout
//! - [`read`]: a trace directory's files, oldest first, fed to a replay (the files are
//!   read here, the replay is pure); [`TraceError`] says what is wrong with them.
//! - [`live`]: the chart of a running broker's last hours (the status page), and the shipped
//!   policy a trace names by its hash.
//! - [`svg`]: the chart: stacked areas of hosts by state over time (lent, free, owner's own
//!   use, drained, down), axes, legend and title, then one row per host; every number it
//!   draws is also in the document (`data-*` attributes, a `<desc>` with the totals).

pub mod live;
pub mod read;
pub mod svg;

pub use live::{recent_chart, shipped_with_sha, Recent};
pub use read::{
    files_since, recorded_policy, replay_dir, replay_files, replay_files_noting, trace_files,
    TraceError,
};
pub use svg::{message, render, Chart};
