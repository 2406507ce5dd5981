//! [`Series`]: a [`Timeline`] (each host's states over a replayed trace, `usage`) cut into
//! equal time buckets: host-seconds per state in each bucket, in total and per host — what
//! the utilization chart draws (`rb report`, the status page). Pure: the window and "now"
//! are passed in.
//!
//! # Choices
//! - **Nothing is lost at the edges.** Without a window the buckets span exactly from the
//!   first span's start to the last one's end, so the buckets' host-seconds sum to the
//!   replay's ([`Usage::by_use`](crate::Usage)). With a window, only what falls inside it
//!   counts.
//! - **A live lab is drawn up to now** when asked ([`SeriesOptions::until_unix_ms`]): each
//!   host stays in its state at the trace's last input until then (nothing recorded means
//!   nothing changed).
//! - **Per-host rows are bounded** ([`SeriesOptions::max_host_rows`], by host name); the
//!   total counts every host.

use crate::usage::{ByUse, HostUse, Span, Timeline};

/// What to cut and how finely.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeriesOptions {
    /// How many buckets (at least 1).
    pub buckets: usize,
    /// Draw only from this wall time on (Unix ms); `None`: from the first span.
    pub from_unix_ms: Option<i64>,
    /// Draw up to this wall time, each host staying in its last state until then;
    /// `None`: up to the trace's last input.
    pub until_unix_ms: Option<i64>,
    /// Per-host rows kept at most.
    pub max_host_rows: usize,
}

impl Default for SeriesOptions {
    fn default() -> Self {
        SeriesOptions {
            buckets: 120,
            from_unix_ms: None,
            until_unix_ms: None,
            max_host_rows: 64,
        }
    }
}

/// One host's buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRow {
    pub name: String,
    /// Host-seconds per state in each bucket.
    pub buckets: Vec<ByUse>,
}

impl HostRow {
    /// Host-seconds per state over the whole window.
    pub fn sum(&self) -> ByUse {
        sum(&self.buckets)
    }
}

/// Host-seconds per state in equal time buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Wall time the first bucket begins (Unix ms, fractional).
    pub from_unix_ms: f64,
    /// Width of every bucket, milliseconds (positive).
    pub bucket_ms: f64,
    /// Every host's host-seconds per state, by bucket.
    pub total: Vec<ByUse>,
    /// Per-host rows, by host name (at most [`SeriesOptions::max_host_rows`]).
    pub hosts: Vec<HostRow>,
    /// Hosts counted in `total` but given no row.
    pub hosts_left_out: usize,
}

impl Series {
    /// Host-seconds per state over the whole window.
    pub fn sum(&self) -> ByUse {
        sum(&self.total)
    }

    /// Wall time the last bucket ends (Unix ms).
    pub fn until_unix_ms(&self) -> f64 {
        self.from_unix_ms + self.bucket_ms * self.total.len() as f64
    }

    /// The number of hosts seen at most at once (for the chart's scale): the largest
    /// bucket's host-seconds over its width.
    pub fn peak_hosts(&self) -> f64 {
        let secs = self.bucket_ms / 1000.0;
        self.total
            .iter()
            .map(|b| b.total() / secs)
            .fold(0.0, f64::max)
    }
}

/// Cuts `timeline` into buckets (see the module's choices).
pub fn series(timeline: &Timeline, opts: &SeriesOptions) -> Series {
    let spans = spans_until(timeline, opts.until_unix_ms);
    let (from, until) = window(&spans, opts);
    let n = opts.buckets.max(1);
    let bucket_ms = ((until - from) / n as f64).max(1e-3);
    let grid = (bucket_ms, n, opts.until_unix_ms.is_none());
    let mut total = vec![ByUse::default(); n];
    let mut names: Vec<(&str, usize)> = timeline
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| (h.as_str(), i))
        .collect();
    names.sort_unstable();
    let kept = names.len().min(opts.max_host_rows);
    let mut row_of = vec![None; timeline.hosts.len()];
    for (row, (_, host)) in names.iter().take(kept).enumerate() {
        row_of[*host] = Some(row);
    }
    let mut rows: Vec<HostRow> = names
        .iter()
        .take(kept)
        .map(|(name, _)| HostRow {
            name: name.to_string(),
            buckets: vec![ByUse::default(); n],
        })
        .collect();
    for span in &spans {
        let row = row_of.get(span.host).copied().flatten();
        spread(span, from, grid, |b, secs| {
            total[b].add(span.state, secs);
            if let Some(r) = row {
                rows[r].buckets[b].add(span.state, secs);
            }
        });
    }
    Series {
        from_unix_ms: from,
        bucket_ms,
        total,
        hosts: rows,
        hosts_left_out: names.len() - kept,
    }
}

/// The timeline's spans, plus each host's last state held until `until` when given.
fn spans_until(timeline: &Timeline, until: Option<i64>) -> Vec<Span> {
    let mut spans = timeline.spans.clone();
    let (Some(until), Some(last)) = (until, timeline.last_unix_ms) else {
        return spans;
    };
    let until = until as f64;
    if until <= last {
        return spans;
    }
    for (host, state) in timeline.last.iter().enumerate() {
        if let Some(state) = state {
            spans.push(Span {
                host,
                state: *state,
                from_unix_ms: last,
                seconds: (until - last) / 1000.0,
            });
        }
    }
    spans
}

/// The window drawn: as asked, else exactly the spans' extent.
fn window(spans: &[Span], opts: &SeriesOptions) -> (f64, f64) {
    let first = spans
        .iter()
        .map(|s| s.from_unix_ms)
        .fold(f64::INFINITY, f64::min);
    let last = spans.iter().map(end_ms).fold(f64::NEG_INFINITY, f64::max);
    let from = opts
        .from_unix_ms
        .map(|f| f as f64)
        .or(first.is_finite().then_some(first));
    let until = opts
        .until_unix_ms
        .map(|u| u as f64)
        .or(last.is_finite().then_some(last));
    let from = from.unwrap_or(0.0);
    let until = until.unwrap_or(from).max(from);
    (from, until)
}

fn end_ms(s: &Span) -> f64 {
    s.from_unix_ms + s.seconds * 1000.0
}

/// Calls `add(bucket, seconds)` for each of the `n` buckets `span` overlaps, with the
/// overlap. With `open_end`, the last bucket takes what lies past the window's end (float
/// rounding only, as the window is then the spans' own extent).
fn spread(span: &Span, from: f64, grid: (f64, usize, bool), mut add: impl FnMut(usize, f64)) {
    let (bucket_ms, n, open_end) = grid;
    let (start, end) = ((span.from_unix_ms - from).max(0.0), end_ms(span) - from);
    if end <= start {
        return;
    }
    let first = (start / bucket_ms).floor() as usize;
    for b in first..n {
        let lo = b as f64 * bucket_ms;
        let hi = if open_end && b + 1 == n {
            f64::INFINITY
        } else {
            (b + 1) as f64 * bucket_ms
        };
        let overlap = end.min(hi) - start.max(lo);
        if overlap > 0.0 {
            add(b, overlap / 1000.0);
        }
        if end <= hi {
            break;
        }
    }
}

fn sum(buckets: &[ByUse]) -> ByUse {
    let mut s = ByUse::default();
    for b in buckets {
        for state in HostUse::ALL {
            s.add(state, b.get(state));
        }
    }
    s
}

#[cfg(test)]
#[path = "usage_series_tests.rs"]
mod tests;
