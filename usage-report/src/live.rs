//! The chart of a running broker's last hours ([`recent_chart`]): only the trace files that
//! cover the window are read, and each host is drawn in its last recorded state up to now
//! (a live broker records a host only when it changes).

use std::{path::Path, sync::Arc, time::SystemTime};

use allocation::{
    usage_series::{series, SeriesOptions},
    Replay,
};
use policies::Policy;

use crate::{
    read::{files_since, recorded_policy, replay_files_noting, trace_files},
    svg::{render, Chart},
    TraceError,
};

/// What to draw of a live trace.
#[derive(Debug, Clone, Copy)]
pub struct Recent {
    /// How far back, seconds.
    pub window_s: u64,
    /// Now (the chart ends here).
    pub now: SystemTime,
    pub utc_offset_s: i64,
}

/// The chart of `dir`'s last `window_s` up to `now`, replayed under what `choose` picks
/// for the sha256 the newest file records.
pub fn recent_chart(
    dir: &Path,
    recent: &Recent,
    choose: impl FnOnce(Option<&str>) -> Policy,
) -> Result<String, TraceError> {
    let files = trace_files(dir)?;
    let since = recent
        .now
        .checked_sub(std::time::Duration::from_secs(recent.window_s))
        .unwrap_or(SystemTime::UNIX_EPOCH);
    let files = files_since(&files, since);
    let policy = choose(recorded_policy(files).as_deref());
    let mut replay = Replay::new(Arc::new(policy));
    replay.keep_timeline();
    let outcome = replay_files_noting(files, replay, &mut |_| {})?;
    let unix_ms = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    };
    let now_ms = unix_ms(recent.now);
    let first = outcome.timeline.first_unix_ms.unwrap_or(now_ms as f64) as i64;
    let opts = SeriesOptions {
        from_unix_ms: Some(first.max(unix_ms(since)).min(now_ms)),
        until_unix_ms: Some(now_ms),
        ..SeriesOptions::default()
    };
    let s = series(&outcome.timeline, &opts);
    let hours = recent.window_s as f64 / 3600.0;
    let title = format!("Utilization, the last {hours:.0} hours (at most)");
    Ok(render(&Chart {
        title: &title,
        series: &s,
        utc_offset_s: recent.utc_offset_s,
    }))
}

/// The shipped policy whose file has sha256 `sha`.
pub fn shipped_with_sha(sha: &str) -> Option<Policy> {
    policies::SHIPPED
        .iter()
        .filter_map(|(name, _)| Policy::shipped(name))
        .find(|p| p.sha256() == sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_paper_policy_is_found_by_its_hash() {
        let paper = Policy::shipped("paper").expect("shipped");
        let found = shipped_with_sha(paper.sha256()).expect("found");
        assert_eq!(found.sha256(), paper.sha256());
        assert!(shipped_with_sha("0000").is_none());
    }
}
