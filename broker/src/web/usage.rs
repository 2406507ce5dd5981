//! The status page's utilization chart: the broker's own decision trace of the last hours,
//! replayed and drawn as SVG (`usage_report`), served at `/api/usage.svg` and inlined in
//! the page. Built off the runtime's workers (`spawn_blocking`: it reads files and replays
//! them), at most once per [`MAX_AGE`] whoever asks, one build at a time; the core is
//! never asked anything.
//!
//! The replay decides with the shipped policy whose hash the newest trace file records, else
//! with the lab's `[broker] policy` as it is on disk now.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use usage_report::{message, recent_chart, shipped_with_sha, Recent};

/// How old a chart may be before the next request builds a new one.
pub const MAX_AGE: Duration = Duration::from_secs(30);
/// How far back the chart goes.
pub const WINDOW_S: u64 = 6 * 3600;

/// The chart's inputs and the last one built.
pub struct UsageChart {
    /// `STATE_DIR/trace`.
    dir: PathBuf,
    /// `[broker] policy` and the lab file's directory it is relative to.
    setting: (String, PathBuf),
    last: Mutex<Option<(Instant, Arc<str>)>>,
    building: tokio::sync::Mutex<()>,
}

impl UsageChart {
    pub fn new(dir: PathBuf, setting: String, base: PathBuf) -> Self {
        UsageChart {
            dir,
            setting: (setting, base),
            last: Mutex::new(None),
            building: tokio::sync::Mutex::new(()),
        }
    }

    /// The chart, built now if the last one is older than [`MAX_AGE`].
    pub async fn svg(&self) -> Arc<str> {
        if let Some(svg) = self.fresh() {
            return svg;
        }
        let _one_at_a_time = self.building.lock().await;
        if let Some(svg) = self.fresh() {
            return svg;
        }
        let (dir, setting) = (self.dir.clone(), self.setting.clone());
        let svg: Arc<str> = tokio::task::spawn_blocking(move || build(&dir, &setting))
            .await
            .unwrap_or_else(|e| message(&format!("the chart could not be drawn: {e}")))
            .into();
        if let Ok(mut last) = self.last.lock() {
            *last = Some((Instant::now(), svg.clone()));
        }
        svg
    }

    fn fresh(&self) -> Option<Arc<str>> {
        let last = self.last.lock().ok()?;
        let (at, svg) = last.as_ref()?;
        (at.elapsed() < MAX_AGE).then(|| svg.clone())
    }
}

/// Reads and draws the trace (blocking).
fn build(dir: &std::path::Path, (setting, base): &(String, PathBuf)) -> String {
    let recent = Recent {
        window_s: WINDOW_S,
        now: SystemTime::now(),
        utc_offset_s: localtime::utc_offset_now_s(),
    };
    let choose = |sha: Option<&str>| {
        sha.and_then(shipped_with_sha)
            .or_else(|| policies::Policy::from_setting(setting, base).ok())
            .or_else(|| policies::Policy::shipped("paper"))
            .expect("the paper policy is shipped")
    };
    match recent_chart(dir, &recent, choose) {
        Ok(svg) => svg,
        Err(e) => message(&format!(
            "No utilization chart: {}",
            e.to_string().lines().next().unwrap_or_default()
        )),
    }
}
