//! The host table: the broker's pure view of every lab host (no I/O, no clocks of its own).
//!
//! Inputs are events with the current [`Instant`]; outputs are [`Effect`]s the core performs
//! (close a connection, restart a daemon). A host is *up* while a daemon connection is open
//! and its last report is younger than `down_after`; otherwise it is *down*, with a reason.
//!
//! The table remembers which hosts changed (a report, a connection, up/down, and every host
//! of the lab file at start); [`HostTable::take_changes`] hands their fresh rows to the core
//! (as the row's two parts, the fixed one borrowed from the record: no row is built), which
//! passes each to the allocator as it happens, so no decision rebuilds every row.
//! A report that repeats the host's last one (only its `seq` and `trigger` differ: at 10k
//! hosts, most reports) changes no row but its age; the table lists such hosts apart
//! ([`HostTable::take_repeated`]), so that the core builds no row for them: the allocator
//! already holds their view. Each host keeps its row's fixed part encoded, made when its changed
//! row is built: `rb status` joins it with a fresh live part ([`HostTable::status_parts`]),
//! building no row. Of that text, the members before the report's moving fields (the
//! load, idle times, free memory: [`Fields::MOVING`]) are kept apart too, while only moving
//! fields change: at 10k hosts whose every report changes, that spares a third of the
//! encoding (its strings escaped again at each report).

use std::{
    cmp::Reverse,
    collections::{BTreeSet, BinaryHeap},
    sync::Arc,
    time::{Duration, Instant},
};

use allocation::HostMap;
use config::HostEntry;
use proto::{
    report::{HostReport, HostState, HostStatus},
    report_changes::{Fields, ReportPatch},
    row_parts::{FixedPart, LivePart},
};

use crate::shared_lists::SharedLists;

/// Identifies one accepted connection.
pub type ConnId = u64;

/// A host a report names: its name, and where the core last said its record is in the
/// table ([`HostTable::row_of`], which the host daemon's session hands over with each
/// report). A row found to hold another connection's record (a host joined before it since)
/// is not taken: the name is looked up then.
///
/// Why: at 10k hosts the lookup of a report's host by name is cache-cold (the hash's slot,
/// then the entry), most of what a repeated report costs the core.
#[derive(Debug, Clone, Copy)]
pub struct HostAt<'a> {
    pub name: &'a str,
    pub row: Option<u32>,
}

impl<'a> From<&'a str> for HostAt<'a> {
    fn from(name: &'a str) -> Self {
        HostAt { name, row: None }
    }
}

impl<'a> From<&'a String> for HostAt<'a> {
    fn from(name: &'a String) -> Self {
        HostAt::from(name.as_str())
    }
}

/// What the core must do after an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Drop this daemon connection (replaced, or silent too long).
    CloseConn { conn: ConnId, reason: String },
    /// Kill and restart the host's daemon through its transport.
    RestartDaemon { host: String, reason: String },
}

#[derive(Debug)]
struct HostRecord {
    entry: HostEntry,
    conn: Option<ConnId>,
    /// Set through [`HostRecord::set_report`] only: `labels` follow it.
    last_report: Option<(Instant, HostReport)>,
    /// The row's labels: the lab file's and the last report's, lower-case, sorted, once each
    /// (made again only when the report's labels change, not at each report; shared by
    /// the hosts with the same, [`LabelLists`]).
    labels: Arc<[String]>,
    down_reason: Option<String>,
    daemon_starts: u32,
    daemon_started_at: Option<Instant>,
    /// The daemon started at `daemon_started_at` connected (it may have disconnected since).
    connected_since_start: bool,
    /// A Slurm pilot's host, joined at run time ([`HostTable::add_pilot`]).
    pilot: bool,
    /// The row's [`FixedPart`] as JSON, as [`HostTable::take_changes`] last built the row
    /// (`rb status` joins it with the live part; [`HostTable::status_parts`]).
    fixed_json: Option<FixedJson>,
    /// How long the start of `fixed_json` is that [`proto::row_parts::write_steady`] wrote,
    /// while nothing it writes changed; `None` once something may have
    /// ([`HostRecord::forget_steady`]). Kept in `fixed_json` itself, not a copy: a string
    /// of its own was one more cold object a report.
    steady_len: Option<usize>,
    /// When the host's entry in [`HostTable::silence_checks`] is due; `None`: it has none
    /// (its entries there with another time are stale).
    silence_check: Option<Instant>,
}

impl HostRecord {
    fn new(entry: HostEntry, lists: &mut LabelLists) -> Self {
        HostRecord {
            labels: lists.get(merged_labels(&entry.labels, &[])),
            entry,
            conn: None,
            last_report: None,
            down_reason: Some("no daemon has reported yet".into()),
            daemon_starts: 0,
            daemon_started_at: None,
            connected_since_start: false,
            pilot: false,
            fixed_json: None,
            steady_len: None,
            silence_check: None,
        }
    }

    /// Something [`proto::row_parts::write_steady`] writes may have changed: the entry,
    /// the labels, a report field outside [`Fields::MOVING`].
    fn forget_steady(&mut self) {
        self.steady_len = None;
    }

    /// The host's last report (`None`: none since the daemon connected, or it went silent).
    fn set_report(&mut self, report: Option<(Instant, HostReport)>, lists: &mut LabelLists) {
        let relabel = labels_of(&self.last_report) != labels_of(&report);
        self.last_report = report;
        self.forget_steady();
        if relabel {
            self.remake_labels(lists);
        }
    }

    /// The row's labels made again from the lab file's and the last report's.
    fn remake_labels(&mut self, lists: &mut LabelLists) {
        self.forget_steady();
        self.labels = lists.get(merged_labels(
            &self.entry.labels,
            labels_of(&self.last_report),
        ));
    }

    /// The row's [`FixedPart`], borrowed from the record (what `status_row(..).fixed_part()`
    /// gives, without building the row).
    fn fixed_part(&self) -> FixedPart<'_> {
        let r = self.last_report.as_ref().map(|(_, r)| r);
        FixedPart {
            name: &self.entry.name,
            address: &self.entry.address,
            hostname: r.map(|r| r.hostname.as_str()),
            cpus: r.and_then(|r| r.cpus),
            load1: r.and_then(|r| r.load.map(|l| l[0])),
            load5: r.and_then(|r| r.load.map(|l| l[1])),
            load15: r.and_then(|r| r.load.map(|l| l[2])),
            cpu_util: r.and_then(|r| r.cpu_util),
            mem_total_kb: r.and_then(|r| r.mem_total_kb),
            mem_available_kb: r.and_then(|r| r.mem_available_kb),
            os: r.and_then(|r| r.os.as_deref()),
            arch: r.and_then(|r| r.arch.as_deref()),
            users: r.and_then(|r| r.users.as_deref()).unwrap_or_default(),
            users_known: r.is_some_and(|r| r.users.is_some()),
            console_idle_s: r.and_then(|r| r.console_idle_s),
            logind: r.and_then(|r| r.logind.as_deref()),
            logind_error: r.and_then(|r| r.logind_error.as_deref()),
            warnings: r.map_or(&[][..], |r| r.warnings.as_slice()),
            managed_procs: r.and_then(|r| r.managed_procs),
            job_load: r.and_then(|r| r.job_load),
            labels: &self.labels,
            owner: self.entry.owner.as_deref(),
        }
    }
}

/// The rows' label lists, one for each distinct list (a lab's hosts share a few), so that
/// keeping each host's made list costs a pointer.
#[derive(Debug, Default)]
struct LabelLists(SharedLists);

impl LabelLists {
    fn get(&mut self, labels: Vec<String>) -> Arc<[String]> {
        self.0.shared(&labels, |list| list.into())
    }
}

/// The labels a report (if any) gives.
fn labels_of(report: &Option<(Instant, HostReport)>) -> &[String] {
    report.as_ref().map_or(&[], |(_, r)| r.labels.as_slice())
}

/// The lab file's `entry` labels and a report's `reported` ones, lower-case, sorted, once
/// each.
fn merged_labels(entry: &[String], reported: &[String]) -> Vec<String> {
    let mut labels: Vec<String> = entry
        .iter()
        .chain(reported)
        .map(|l| l.to_ascii_lowercase())
        .collect();
    labels.sort();
    labels.dedup();
    labels
}

/// A daemon that was started but never reported is restarted after this long.
pub const FIRST_REPORT_GRACE: Duration = Duration::from_secs(10);

/// Every host's latest state.
#[derive(Debug)]
pub struct HostTable {
    hosts: HostMap<HostRecord>,
    label_lists: LabelLists,
    down_after: Duration,
    /// Hosts whose row changed since the last [`take_changes`](Self::take_changes).
    changed: BTreeSet<String>,
    /// Hosts that sent a report repeating their last one since the last
    /// [`take_repeated`](Self::take_repeated), once per such report.
    repeated: Vec<String>,
    /// When [`tick`](Self::tick) must look at which host, earliest first: each host that
    /// may go silent has an entry no later than the time [`silence`] would first find it
    /// silent ([`silent_after`]). A report only ever moves that time later, but for a
    /// host's first one after a daemon start (the start's grace then no longer applies),
    /// so a tick looks at the hosts due, not at every host: at 100k hosts a scan of every
    /// record, four times a second, held reports and grants for milliseconds each time.
    silence_checks: BinaryHeap<Reverse<(Instant, String)>>,
}

impl HostTable {
    pub fn new(entries: &[HostEntry], down_after: Duration) -> Self {
        let mut label_lists = LabelLists::default();
        let hosts = entries
            .iter()
            .map(|e| (e.name.clone(), HostRecord::new(e.clone(), &mut label_lists)))
            .collect::<HostMap<_>>();
        let changed = hosts.keys().map(|h| h.to_string()).collect();
        Self {
            hosts,
            label_lists,
            down_after,
            changed,
            repeated: Vec::new(),
            silence_checks: BinaryHeap::new(),
        }
    }

    /// Gives `host` an entry in [`Self::silence_checks`] at the time it may first go
    /// silent, unless it has one that is due no later.
    fn check_silence(&mut self, host: &str) {
        if let Some(rec) = self.hosts.get_mut(host) {
            queue_silence_check(&mut self.silence_checks, host, rec, self.down_after);
        }
    }

    /// Hands `each` the fresh row of every host that changed since the last call (at first:
    /// every host of the lab file), in name order, as its two parts: the fixed part borrowed
    /// from the host's record (no row is built: at 10k hosts whose every report changes,
    /// building rows only to read them was a tenth of the broker's time) and the table's
    /// live part. Each fixed part is kept encoded for `rb status` ([`Self::status_parts`]).
    pub fn take_changes(&mut self, now: Instant, mut each: impl FnMut(&FixedPart<'_>, LivePart)) {
        for name in std::mem::take(&mut self.changed) {
            if let Some(rec) = self.hosts.get_mut(&name) {
                let last = rec.fixed_json.take().zip(rec.steady_len);
                let part = rec.fixed_part();
                let (json, steady_len) = encode_fixed(&part, last);
                each(&part, table_live(rec, now, self.down_after));
                rec.fixed_json = Some(json);
                rec.steady_len = steady_len;
            }
        }
    }

    /// [`Self::take_changes`]'s rows, read back from the parts as `rb status` writes them
    /// (the tests' look at what the core is handed).
    #[cfg(test)]
    pub fn take_changed_rows(&mut self, now: Instant) -> Vec<HostStatus> {
        let mut rows = Vec::new();
        self.take_changes(now, |fixed, live| {
            let mut text = Vec::new();
            let json = fixed_json(fixed);
            proto::row_parts::write_row(&mut text, &json, &live).expect("a row");
            rows.push(serde_json::from_slice(&text).expect("a row reads back"));
        });
        rows
    }

    /// The hosts whose reports since the last call repeated their previous one (a host once
    /// per such report, in arrival order). Their rows changed only in age: a host up before
    /// such a report is up after it, with the same figures.
    pub fn take_repeated(&mut self) -> Vec<String> {
        std::mem::take(&mut self.repeated)
    }

    /// One host's fresh row (the tests' look at one host; the core takes changed rows).
    #[cfg(test)]
    pub fn row(&self, host: &str, now: Instant) -> Option<HostStatus> {
        self.hosts
            .get(host)
            .map(|rec| status_row(rec, now, self.down_after))
    }

    pub fn contains(&self, host: &str) -> bool {
        self.hosts.contains_key(host)
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// A pilot's daemon (`slurm-<node>`, not in the lab file) is about to connect from
    /// `address`: the host joins the table as a public host labelled `slurm`, or takes the
    /// new address when it was here before (a pilot on the same node again). A host of the
    /// lab file is left as it is.
    pub fn add_pilot(&mut self, host: &str, address: &str) {
        if let Some(rec) = self.hosts.get_mut(host) {
            if rec.pilot && rec.entry.address != address {
                rec.entry.address = address.to_string();
                rec.forget_steady();
                self.changed.insert(host.to_string());
            }
            return;
        }
        let entry = HostEntry {
            name: host.to_string(),
            address: address.to_string(),
            labels: config::pilot::PILOT_LABELS
                .iter()
                .map(|l| l.to_string())
                .collect(),
            owner: None,
        };
        let mut record = HostRecord::new(entry, &mut self.label_lists);
        record.pilot = true;
        record.down_reason = Some("a Slurm pilot's daemon is connecting".into());
        self.hosts.insert(host.to_string(), record);
        self.changed.insert(host.to_string());
    }

    /// A daemon for `host` completed the handshake on `conn`. Replaces any older connection.
    pub fn connected(&mut self, host: &str, conn: ConnId) -> Vec<Effect> {
        let Some(rec) = self.hosts.get_mut(host) else {
            return Vec::new();
        };
        let old = rec.conn.replace(conn);
        rec.connected_since_start = true;
        rec.down_reason = Some("connected, waiting for the first report".into());
        rec.set_report(None, &mut self.label_lists);
        self.changed.insert(host.to_string());
        self.check_silence(host);
        old.filter(|&c| c != conn)
            .map(|c| Effect::CloseConn {
                conn: c,
                reason: "replaced by a newer daemon connection".into(),
            })
            .into_iter()
            .collect()
    }

    /// A report arrived on `conn`. Reports on stale connections are ignored. A report that
    /// repeats the last one of a host that is up goes to [`take_repeated`](Self::take_repeated),
    /// any other to [`take_changes`](Self::take_changes).
    pub fn report<'a>(
        &mut self,
        host: impl Into<HostAt<'a>>,
        conn: ConnId,
        report: HostReport,
        now: Instant,
    ) -> bool {
        let host = host.into();
        let Some(rec) = record_of(&mut self.hosts, host, conn) else {
            return false;
        };
        let host = host.name;
        let repeats = rec.down_reason.is_none()
            && rec
                .last_report
                .as_ref()
                .is_some_and(|(_, last)| repeats(last, &report));
        rec.set_report(Some((now, report)), &mut self.label_lists);
        rec.down_reason = None;
        queue_silence_check(&mut self.silence_checks, host, rec, self.down_after);
        self.reported(host, repeats);
        true
    }

    /// A report arrived on `conn` as what changed since the host's last one there: taken
    /// as [`report`](Self::report) takes the report it makes of the last, which it changes
    /// in place (only the fields named are moved in; no whole report is copied or
    /// compared). False, changing nothing, for a stale connection or a host with no report
    /// yet (a connection sends a whole report before any changes: never after one).
    pub fn report_changes<'a>(
        &mut self,
        host: impl Into<HostAt<'a>>,
        conn: ConnId,
        patch: &mut ReportPatch,
        now: Instant,
    ) -> bool {
        // Passed on apart from the host's report (see `core`), as a whole report's is.
        patch.take_allocs_running();
        let host = host.into();
        let Some(rec) = record_of(&mut self.hosts, host, conn) else {
            return false;
        };
        let host = host.name;
        let Some((at, last)) = rec.last_report.as_mut() else {
            return false;
        };
        let differed = patch.apply_to(last);
        *at = now;
        if differed.contains(Fields::LABELS) {
            rec.remake_labels(&mut self.label_lists);
        }
        if !differed
            .without(Fields::MOVING)
            .without(Fields::TRIGGER)
            .is_empty()
        {
            rec.forget_steady();
        }
        // What triggered a report is no part of what it says (as in `repeats`).
        let repeats =
            rec.down_reason.take().is_none() && differed.without(Fields::TRIGGER).is_empty();
        queue_silence_check(&mut self.silence_checks, host, rec, self.down_after);
        self.reported(host, repeats);
        true
    }

    /// A report arrived on `conn` that is the host's last one but for its counter `seq`:
    /// taken as [`report`](Self::report) takes that report again. False, changing nothing,
    /// for a stale connection or a host with no report yet.
    pub fn report_same<'a>(
        &mut self,
        host: impl Into<HostAt<'a>>,
        conn: ConnId,
        seq: u64,
        now: Instant,
    ) -> bool {
        let host = host.into();
        let Some(rec) = record_of(&mut self.hosts, host, conn) else {
            return false;
        };
        let host = host.name;
        let Some((at, last)) = rec.last_report.as_mut() else {
            return false;
        };
        *at = now;
        last.seq = seq;
        let repeats = rec.down_reason.take().is_none();
        queue_silence_check(&mut self.silence_checks, host, rec, self.down_after);
        self.reported(host, repeats);
        true
    }

    /// Where `host`'s record is in the table, for its daemon's session to hand over with
    /// each report ([`HostAt`]); `None` for a host the lab does not have.
    pub fn row_of(&self, host: &str) -> Option<u32> {
        self.hosts
            .index_of(host)
            .and_then(|row| u32::try_from(row).ok())
    }

    /// `host` reported: a report that `repeats` its last one goes to
    /// [`take_repeated`](Self::take_repeated), any other to [`take_changes`](Self::take_changes).
    fn reported(&mut self, host: &str, repeats: bool) {
        if repeats {
            self.repeated.push(host.to_string());
        } else {
            self.changed.insert(host.to_string());
        }
    }

    /// The connection `conn` closed.
    pub fn disconnected(&mut self, host: &str, conn: ConnId, reason: &str) {
        if let Some(rec) = self.hosts.get_mut(host) {
            if rec.conn == Some(conn) {
                rec.conn = None;
                rec.down_reason = Some(format!("daemon disconnected: {reason}"));
                self.changed.insert(host.to_string());
                self.check_silence(host);
            }
        }
    }

    /// The transport (re)started the host's daemon.
    pub fn daemon_started(&mut self, host: &str, now: Instant) {
        if let Some(rec) = self.hosts.get_mut(host) {
            rec.daemon_starts += 1;
            rec.daemon_started_at = Some(now);
            rec.connected_since_start = false;
            self.check_silence(host);
        }
    }

    /// The transport's process for the host's daemon ended.
    pub fn daemon_exited(&mut self, host: &str, how: &str) {
        if let Some(rec) = self.hosts.get_mut(host) {
            rec.daemon_started_at = None;
            if rec.conn.is_none() {
                rec.down_reason = Some(format!("daemon exited: {how}"));
                self.changed.insert(host.to_string());
            }
        }
    }

    /// Periodic check: silent hosts go down and get their daemon restarted (in name
    /// order). Only the hosts whose silence check is due are looked at.
    pub fn tick(&mut self, now: Instant) -> Vec<Effect> {
        let mut due = Vec::new();
        while let Some(Reverse((at, _))) = self.silence_checks.peek() {
            if *at >= now {
                break;
            }
            let Some(Reverse((at, host))) = self.silence_checks.pop() else {
                break;
            };
            match self.hosts.get_mut(&host) {
                Some(rec) if rec.silence_check == Some(at) => {
                    rec.silence_check = None;
                    due.push(host);
                }
                // A stale entry: the host has an earlier one, or none any more.
                _ => {}
            }
        }
        // One live entry a host: no name twice.
        due.sort();
        let effects = self.go_silent(&due, now);
        for host in &due {
            self.check_silence(host);
        }
        effects
    }

    /// Takes down those of `hosts` that are silent at `now`.
    fn go_silent(&mut self, hosts: &[String], now: Instant) -> Vec<Effect> {
        let down_after = self.down_after;
        let mut effects = Vec::new();
        for name in hosts {
            let Some(rec) = self.hosts.get_mut(name) else {
                continue;
            };
            if let Some(reason) = silence(rec, now, down_after) {
                if let Some(conn) = rec.conn.take() {
                    effects.push(Effect::CloseConn {
                        conn,
                        reason: reason.clone(),
                    });
                }
                rec.set_report(None, &mut self.label_lists);
                rec.down_reason = Some(reason.clone());
                rec.daemon_started_at = None;
                self.changed.insert(name.clone());
                // A pilot's daemon is Slurm's to start: no transport restarts it.
                if !rec.pilot {
                    effects.push(Effect::RestartDaemon {
                        host: name.clone(),
                        reason,
                    });
                }
            }
        }
        effects
    }

    /// One status row per host, in name order.
    pub fn status(&self, now: Instant) -> Vec<HostStatus> {
        self.hosts
            .values()
            .map(|rec| status_row(rec, now, self.down_after))
            .collect()
    }

    /// The rows of [`Self::status`] in parts, in name order: each host's fixed part as
    /// the JSON kept since it last changed, and its live part, which `annotate` completes
    /// (the allocator's fields). No row is built but those of hosts changed since the last
    /// [`Self::take_changes`].
    pub fn status_parts(
        &self,
        now: Instant,
        annotate: impl FnMut(&str, &mut LivePart),
    ) -> Vec<StatusPart> {
        let mut parts = Vec::with_capacity(self.hosts.len());
        self.status_parts_from(0, now, annotate, &mut parts, || true);
        parts
    }

    /// [`Self::status_parts`] of the hosts from the `from`th in name order on, appended to
    /// `parts` while `more()` (asked every [`STATUS_PARTS_ASK`] hosts) says so; returns the
    /// index of the first host not taken (the table's length once all are).
    pub fn status_parts_from(
        &self,
        from: usize,
        now: Instant,
        mut annotate: impl FnMut(&str, &mut LivePart),
        parts: &mut Vec<StatusPart>,
        mut more: impl FnMut() -> bool,
    ) -> usize {
        let mut at = from;
        for (name, rec) in self.hosts.iter_from(from) {
            if at > from && (at - from).is_multiple_of(STATUS_PARTS_ASK) && !more() {
                break;
            }
            let fixed_json = match &rec.fixed_json {
                Some(json) if !self.changed.contains(name.as_str()) => Arc::clone(json),
                _ => fixed_json(&rec.fixed_part()),
            };
            let mut live = table_live(rec, now, self.down_after);
            annotate(name, &mut live);
            parts.push(StatusPart { fixed_json, live });
            at += 1;
        }
        at
    }

    /// The name of the `at`th host in name order.
    pub fn name_at(&self, at: usize) -> Option<&str> {
        self.hosts
            .iter_from(at)
            .next()
            .map(|(name, _)| name.as_str())
    }
}

/// How many hosts [`HostTable::status_parts_from`] takes between two questions whether to
/// go on.
pub const STATUS_PARTS_ASK: usize = 256;

/// A row's [`FixedPart`] as a JSON object: the text `serde_json` writes (UTF-8), kept as
/// its bytes, shared by the host's record and the `rb status` answers under way. Bytes, not
/// an `Arc<str>`: while no answer holds it, a changing report rewrites the members that
/// moved at the end of the same buffer (`encode_fixed`), where an `Arc<str>` is made
/// anew, the whole text copied in (at 10k hosts whose every report changes, ~7 cache lines
/// of the last text read and ~9 of the new written, a report).
pub type FixedJson = Arc<Vec<u8>>;

/// A host's status row in two parts ([`proto::row_parts`]).
#[derive(Debug, Clone)]
pub struct StatusPart {
    /// The row's [`FixedPart`] as a JSON object.
    pub fixed_json: FixedJson,
    pub live: LivePart,
}

impl StatusPart {
    /// The whole row, read back from the parts joined as `rb status` gets them (off the
    /// core: at 100k hosts, tens of ms).
    pub fn to_row(&self) -> serde_json::Result<HostStatus> {
        let mut text = Vec::with_capacity(self.fixed_json.len() + 200);
        proto::row_parts::write_row(&mut text, &self.fixed_json, &self.live)?;
        serde_json::from_slice(&text)
    }
}

/// A row's fixed part as JSON ([`encode_fixed`] with nothing kept).
fn fixed_json(part: &FixedPart<'_>) -> FixedJson {
    encode_fixed(part, None).0
}

/// A row's fixed part as JSON, and the length of its start that
/// [`proto::row_parts::write_steady`] wrote (`None` when the part could not be encoded).
/// `last` is the row's last text with that length, while nothing written there changed: its
/// start is kept, and where no `rb status` answer holds the text any more, the members that
/// move are written again in its own buffer (nothing else of it read or copied). Encoding
/// such a part cannot fail (no maps; a NaN is written as `null`); were it to, the row says
/// so instead of its figures.
fn encode_fixed(
    part: &FixedPart<'_>,
    last: Option<(FixedJson, usize)>,
) -> (FixedJson, Option<usize>) {
    let Some((mut json, len)) = last.filter(|(json, len)| *len <= json.len()) else {
        return encode_anew(part, None);
    };
    debug_assert_eq!(
        json[..len],
        *steady_text(part).as_bytes(),
        "a kept steady part went stale"
    );
    if let Some(text) = Arc::get_mut(&mut json) {
        text.truncate(len);
        if proto::row_parts::write_moving(text, part).is_ok() {
            debug_assert!(std::str::from_utf8(text).is_ok(), "JSON is UTF-8");
            return (json, Some(len));
        }
    }
    encode_anew(part, Some(&json[..len]))
}

/// [`encode_fixed`] into a buffer of its own, its start copied from `kept` (the steady
/// start of the row's last text) or written.
fn encode_anew(part: &FixedPart<'_>, kept: Option<&[u8]>) -> (FixedJson, Option<usize>) {
    let mut text = Vec::with_capacity(FIXED_JSON_ROOM);
    let steady = match kept {
        Some(kept) => {
            text.extend_from_slice(kept);
            Ok(())
        }
        None => proto::row_parts::write_steady(&mut text, part),
    };
    let steady_len = text.len();
    match steady.and_then(|()| proto::row_parts::write_moving(&mut text, part)) {
        Ok(()) => {
            debug_assert!(std::str::from_utf8(&text).is_ok(), "JSON is UTF-8");
            (Arc::new(text), Some(steady_len))
        }
        Err(e) => {
            let row = serde_json::json!({ "name": part.name, "address": part.address,
                "encoding_error": e.to_string() });
            (Arc::new(row.to_string().into_bytes()), None)
        }
    }
}

/// [`proto::row_parts::write_steady`]'s text of `part` (debug builds check what is kept).
fn steady_text(part: &FixedPart<'_>) -> String {
    let mut text = Vec::new();
    let _ = proto::row_parts::write_steady(&mut text, part);
    String::from_utf8_lossy(&text).into_owned()
}

/// Room for a fixed part's JSON (a host with a user logged in: about 450 bytes).
const FIXED_JSON_ROOM: usize = 640;

/// The table's live fields of a host's row (the allocator's are left empty).
fn table_live(rec: &HostRecord, now: Instant, down_after: Duration) -> LivePart {
    let age = rec
        .last_report
        .as_ref()
        .map(|(at, _)| now.saturating_duration_since(*at));
    let up = rec.conn.is_some() && age.is_some_and(|a| a <= down_after);
    LivePart {
        state: if up { HostState::Up } else { HostState::Down },
        down_reason: if up {
            None
        } else {
            rec.down_reason.clone().or_else(|| Some("silent".into()))
        },
        last_report_age_s: age.map(|a| (a.as_secs_f64() * 10.0).round() / 10.0),
        daemon_starts: rec.daemon_starts,
        ..LivePart::default()
    }
}

/// Whether `new` says what `last` said: every field but the daemon's counter and what
/// triggered it. Compared field by field, so that a field added to [`HostReport`] does not
/// compile until it is here (a field left out would hide its changes from the allocator).
fn repeats(last: &HostReport, new: &HostReport) -> bool {
    let HostReport {
        hostname,
        seq: _,
        trigger: _,
        cpus,
        load,
        cpu_util,
        mem_total_kb,
        mem_available_kb,
        os,
        arch,
        kernel,
        users,
        console_idle_s,
        managed_procs,
        job_load,
        labels,
        overlaid,
        logind,
        logind_error,
        warnings,
        // Goes to the allocator apart from the host's row (see `core`).
        allocs_running: _,
    } = new;
    // `==` on floats: a NaN never repeats, so it always reaches the allocator.
    last.hostname == *hostname
        && last.cpus == *cpus
        && last.load == *load
        && last.cpu_util == *cpu_util
        && last.mem_total_kb == *mem_total_kb
        && last.mem_available_kb == *mem_available_kb
        && last.os == *os
        && last.arch == *arch
        && last.kernel == *kernel
        && last.users == *users
        && last.console_idle_s == *console_idle_s
        && last.managed_procs == *managed_procs
        && last.job_load == *job_load
        && last.labels == *labels
        && last.overlaid == *overlaid
        && last.logind == *logind
        && last.logind_error == *logind_error
        && last.warnings == *warnings
}

/// The record of `host` while `conn` is its connection: at the row the report gives when
/// that row's record is `conn`'s (connection ids are never reused), else found by name.
fn record_of<'m>(
    hosts: &'m mut HostMap<HostRecord>,
    host: HostAt<'_>,
    conn: ConnId,
) -> Option<&'m mut HostRecord> {
    let at_row = host
        .row
        .map(|row| row as usize)
        .filter(|&row| hosts.get_index(row).is_some_and(|r| r.conn == Some(conn)));
    match at_row {
        Some(row) => hosts.get_index_mut(row),
        None => hosts.get_mut(host.name).filter(|r| r.conn == Some(conn)),
    }
}

/// Why a host counts as silent now, if it does.
/// Gives `host` (`rec`) an entry in `checks` ([`HostTable::silence_checks`]) at the time
/// it may first go silent, unless it has one that is due no later (after a report, the
/// usual case: nothing to do).
fn queue_silence_check(
    checks: &mut BinaryHeap<Reverse<(Instant, String)>>,
    host: &str,
    rec: &mut HostRecord,
    down_after: Duration,
) {
    let Some(due) = silent_after(rec, down_after) else {
        return;
    };
    if rec.silence_check.is_none_or(|queued| due < queued) {
        rec.silence_check = Some(due);
        checks.push(Reverse((due, host.to_string())));
    }
}

/// The time after which [`silence`] finds `rec` silent as long as nothing happens to it:
/// `None` while it cannot (no connection and no daemon started; a connection that has not
/// reported, from a daemon no transport started).
fn silent_after(rec: &HostRecord, down_after: Duration) -> Option<Instant> {
    let grace = down_after.max(FIRST_REPORT_GRACE);
    match (&rec.last_report, rec.conn) {
        (Some((at, _)), Some(_)) => at.checked_add(down_after),
        _ => rec.daemon_started_at?.checked_add(grace),
    }
}

fn silence(rec: &HostRecord, now: Instant, down_after: Duration) -> Option<String> {
    if rec.conn.is_some() {
        let since = match &rec.last_report {
            Some((at, _)) => *at,
            None => rec.daemon_started_at.unwrap_or(now),
        };
        let quiet = now.saturating_duration_since(since);
        let limit = if rec.last_report.is_some() {
            down_after
        } else {
            down_after.max(FIRST_REPORT_GRACE)
        };
        return (quiet > limit).then(|| format!("no report for {:.1} s", quiet.as_secs_f64()));
    }
    let started = rec.daemon_started_at?;
    let waited = now.saturating_duration_since(started);
    (waited > down_after.max(FIRST_REPORT_GRACE)).then(|| match rec.connected_since_start {
        // Its connection closed and the transport has not yet said the process ended.
        true => format!(
            "daemon disconnected and has not exited (started {:.1} s ago)",
            waited.as_secs_f64()
        ),
        false => format!(
            "daemon started {:.1} s ago never connected",
            waited.as_secs_f64()
        ),
    })
}

fn status_row(rec: &HostRecord, now: Instant, down_after: Duration) -> HostStatus {
    // The allocator's fields stay empty: the job desk fills them in (`JobDesk::annotate`);
    // the table does not allocate.
    HostStatus::from_parts(&rec.fixed_part(), table_live(rec, now, down_after))
}

#[cfg(test)]
#[path = "hosts_tests.rs"]
mod tests;
