//! The broker's Prometheus metrics: counters and histograms fed by one-line hooks where the
//! broker carries out a grant, a reclaim, a refusal, a report, a reload or a trace write
//! (atomics; nothing here waits), and gauges set from the `rb status` / `rb jobs` rows at
//! each scrape ([`Metrics::encode`]).
//!
//! Cardinality is bounded: labels are fixed vocabularies (host and allocation states, job
//! states, wait reason codes, reclaim kinds); no per-host, per-job or per-request series.
//! Latencies are timed from maps keyed by request id (bounded, pruned) and by host.

use std::{
    collections::HashMap,
    sync::{LazyLock, Mutex},
    time::{Duration, Instant},
};

use allocation::Effect;
use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{exponential_buckets, Histogram},
    },
    registry::Registry,
};
use proto::report::{HostState, HostStatus};

type Labels = Vec<(&'static str, String)>;

/// Host states of `rb status` (`state`).
pub const HOST_STATES: &[&str] = &["up", "down"];
/// Allocation states of `rb status` (`alloc_state`).
pub const ALLOC_STATES: &[&str] = &[
    "free",
    "held",
    "releasing",
    "reserved",
    "draining",
    "drained",
    "leaving",
];
/// Job states of `rb jobs`.
pub const JOB_STATES: &[&str] = &["running", "ended"];

/// Request ids timed at once at most; beyond it the oldest hour is kept.
const TIMED_REQUESTS_MAX: usize = 65_536;

/// Every metric of the broker.
pub struct Metrics {
    registry: Mutex<Registry>,
    hosts: Family<Labels, Gauge>,
    hosts_alloc: Family<Labels, Gauge>,
    owners_active: Gauge,
    pilot_hosts: Gauge,
    jobs: Family<Labels, Gauge>,
    waiting: Family<Labels, Gauge>,
    grants: Counter,
    reclaims: Family<Labels, Counter>,
    vacates: Counter,
    refusals: Family<Labels, Counter>,
    reports: Counter,
    reloads: Family<Labels, Counter>,
    policy_errors: Counter,
    trace_bytes: Counter,
    pilots: Family<Labels, Counter>,
    grant_latency: Histogram,
    wait_time: Histogram,
    reclaim_time: Histogram,
    timers: Mutex<Timers>,
}

/// When each pending request arrived and first queued, and each host's reclaim began.
#[derive(Default)]
struct Timers {
    requested: HashMap<u64, Instant>,
    queued: HashMap<u64, Instant>,
    reclaiming: HashMap<String, Instant>,
}

/// The broker's metrics (one per process: the hooks need no handle threaded through).
pub static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 1 ms … ~9 h.
    exponential_buckets(0.001, 4.0, 13)
}

impl Metrics {
    fn new() -> Self {
        let m = Self {
            registry: Mutex::new(Registry::default()),
            hosts: Family::default(),
            hosts_alloc: Family::default(),
            owners_active: Gauge::default(),
            pilot_hosts: Gauge::default(),
            jobs: Family::default(),
            waiting: Family::default(),
            grants: Counter::default(),
            reclaims: Family::default(),
            vacates: Counter::default(),
            refusals: Family::default(),
            reports: Counter::default(),
            reloads: Family::default(),
            policy_errors: Counter::default(),
            trace_bytes: Counter::default(),
            pilots: Family::default(),
            grant_latency: Histogram::new(seconds_buckets()),
            wait_time: Histogram::new(seconds_buckets()),
            reclaim_time: Histogram::new(seconds_buckets()),
            timers: Mutex::new(Timers::default()),
        };
        m.register();
        m
    }

    fn register(&self) {
        let Ok(mut r) = self.registry.lock() else {
            return;
        };
        r.register(
            "rb_hosts",
            "Hosts of the lab by state (up, down), as rb status shows them",
            self.hosts.clone(),
        );
        r.register("rb_hosts_alloc", "Hosts by allocation state (free, held, releasing, reserved, draining, drained, leaving)", self.hosts_alloc.clone());
        r.register(
            "rb_owners_active",
            "Private hosts (with an owner) where someone is logged in",
            self.owners_active.clone(),
        );
        r.register(
            "rb_overflow_pilot_hosts",
            "Slurm pilot hosts (overflow) connected now",
            self.pilot_hosts.clone(),
        );
        r.register(
            "rb_jobs",
            "Jobs the broker knows by state (running, ended and still listed)",
            self.jobs.clone(),
        );
        r.register(
            "rb_waiting_requests",
            "Requests waiting for a host by reason code",
            self.waiting.clone(),
        );
        r.register("rb_grants", "Hosts granted to jobs", self.grants.clone());
        r.register("rb_reclaims", "Hosts asked back from jobs, by kind (graceful: with a grace period; forced: the grace passed)", self.reclaims.clone());
        r.register(
            "rb_vacates",
            "Hosts that left an allocation (released by the job or taken back)",
            self.vacates.clone(),
        );
        r.register("rb_refusals", "Requests and jobs refused, by reason (request: can never be served; job: registration refused)", self.refusals.clone());
        r.register(
            "rb_reports",
            "Host daemon reports received",
            self.reports.clone(),
        );
        r.register(
            "rb_policy_reloads",
            "Policy reloads by result (ok, error)",
            self.reloads.clone(),
        );
        r.register(
            "rb_policy_evaluation_errors",
            "Policy expressions that failed at run time (their default was used)",
            self.policy_errors.clone(),
        );
        r.register(
            "rb_trace_bytes",
            "Bytes written to the decision trace",
            self.trace_bytes.clone(),
        );
        r.register(
            "rb_overflow_pilots",
            "Slurm pilot jobs by event (submitted, cancelled)",
            self.pilots.clone(),
        );
        r.register(
            "rb_grant_latency_seconds",
            "From a request reaching the broker to its grant",
            self.grant_latency.clone(),
        );
        r.register(
            "rb_wait_seconds",
            "From a request being queued to its grant (requests that waited)",
            self.wait_time.clone(),
        );
        r.register(
            "rb_reclaim_seconds",
            "From asking a job for a host back to the host being free",
            self.reclaim_time.clone(),
        );
    }

    /// A request from an agent reached the broker (allocator id `req`).
    pub fn requested(&self, req: u64) {
        let now = Instant::now();
        if let Ok(mut t) = self.timers.lock() {
            if t.requested.len() >= TIMED_REQUESTS_MAX {
                prune(&mut t.requested, now);
                prune(&mut t.queued, now);
            }
            t.requested.insert(req, now);
        }
    }

    /// The broker carries out `effect` (called once per effect, before it is performed).
    pub fn effect(&self, effect: &Effect) {
        match effect {
            Effect::Granted { req, host, .. } => self.granted(*req, host),
            Effect::Queued { req, .. } => {
                if let Ok(mut t) = self.timers.lock() {
                    t.queued.entry(*req).or_insert_with(Instant::now);
                }
            }
            Effect::Refused { req, .. } => {
                self.refused("request");
                if let Ok(mut t) = self.timers.lock() {
                    t.requested.remove(req);
                    t.queued.remove(req);
                }
            }
            Effect::Reclaim { host, .. } => {
                self.reclaims
                    .get_or_create(&vec![("kind", "graceful".into())])
                    .inc();
                if let Ok(mut t) = self.timers.lock() {
                    t.reclaiming
                        .entry(host.clone())
                        .or_insert_with(Instant::now);
                }
            }
            Effect::ForceRelease { .. } => {
                self.reclaims
                    .get_or_create(&vec![("kind", "forced".into())])
                    .inc();
            }
            Effect::Freed { host } => {
                self.vacates.inc();
                let began = self
                    .timers
                    .lock()
                    .ok()
                    .and_then(|mut t| t.reclaiming.remove(host));
                if let Some(began) = began {
                    self.reclaim_time.observe(began.elapsed().as_secs_f64());
                }
            }
            Effect::PolicyError { .. } => {
                self.policy_errors.inc();
            }
            Effect::SubmitPilot { .. } => self.pilot("submitted"),
            Effect::CancelPilot { .. } => self.pilot("cancelled"),
            Effect::AgentLate { .. } | Effect::ConfirmEnd { .. } | Effect::Persist => {}
        }
    }

    fn granted(&self, req: u64, host: &str) {
        self.grants.inc();
        let (asked, queued) = match self.timers.lock() {
            Ok(mut t) => {
                // A granted host is no longer being taken back.
                t.reclaiming.remove(host);
                (t.requested.remove(&req), t.queued.remove(&req))
            }
            Err(_) => (None, None),
        };
        if let Some(at) = asked {
            self.grant_latency.observe(at.elapsed().as_secs_f64());
        }
        if let Some(at) = queued {
            self.wait_time.observe(at.elapsed().as_secs_f64());
        }
    }

    fn pilot(&self, event: &str) {
        self.pilots
            .get_or_create(&vec![("event", event.into())])
            .inc();
    }

    /// A job was refused (`job`) or a request can never be served (`request`).
    pub fn refused(&self, reason: &'static str) {
        self.refusals
            .get_or_create(&vec![("reason", reason.into())])
            .inc();
    }

    /// A host daemon's report arrived.
    pub fn report(&self) {
        self.reports.inc();
    }

    /// A policy reload finished (`ok`) or was refused (`error`).
    pub fn reload(&self, ok: bool) {
        let result = if ok { "ok" } else { "error" };
        self.reloads
            .get_or_create(&vec![("result", result.into())])
            .inc();
    }

    /// `bytes` were appended to the decision trace.
    pub fn trace_written(&self, bytes: usize) {
        self.trace_bytes.inc_by(bytes as u64);
    }

    /// Sets the gauges from the `rb status` rows and the `rb jobs` rows.
    pub fn set_snapshot(&self, hosts: &[HostStatus], jobs: &[serde_json::Value]) {
        set_counts(
            &self.hosts,
            "state",
            HOST_STATES,
            hosts.iter().map(|h| match h.state {
                HostState::Up => "up",
                HostState::Down => "down",
            }),
        );
        set_counts(
            &self.hosts_alloc,
            "alloc_state",
            ALLOC_STATES,
            hosts.iter().map(|h| h.alloc_state.as_str()),
        );
        let owners = hosts
            .iter()
            .filter(|h| h.owner.is_some() && !h.users.is_empty())
            .count();
        self.owners_active.set(owners as i64);
        let pilots = hosts
            .iter()
            .filter(|h| h.name.starts_with("slurm-"))
            .count();
        self.pilot_hosts.set(pilots as i64);
        set_counts(
            &self.jobs,
            "state",
            JOB_STATES,
            jobs.iter()
                .map(|j| j["state"].as_str().unwrap_or("unknown")),
        );
        let reasons = jobs
            .iter()
            .filter_map(|j| j["waiting"].as_array())
            .flatten()
            .map(|w| w["reason_code"].as_str().unwrap_or("unknown"));
        set_counts(&self.waiting, "reason", WAIT_REASONS, reasons);
    }

    /// The exposition: OpenMetrics text when `openmetrics`, else Prometheus text 0.0.4.
    pub fn encode(&self, openmetrics: bool) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            // Writing into a String cannot fail.
            let _ = encode(&mut out, &r);
        }
        if openmetrics {
            out
        } else {
            openmetrics_to_text_004(&out)
        }
    }
}

/// Wait reason codes of `rb jobs` (`allocation::WaitReason::code`).
pub const WAIT_REASONS: &[&str] = &[
    "reclaiming",
    "no_host_matches",
    "max_hosts",
    "all_held",
    "owner_active",
    "drained",
    "down",
    "reserved",
    "policy",
    "mixed",
];

/// Sets `family` to the count of each value, every known value present (0 when none), any
/// other value counted as `other` (so a newer broker's value cannot add series).
fn set_counts<'a>(
    family: &Family<Labels, Gauge>,
    label: &'static str,
    known: &[&'static str],
    values: impl Iterator<Item = &'a str>,
) {
    let mut counts: HashMap<&str, i64> = known.iter().map(|k| (*k, 0)).collect();
    for v in values {
        let key = if known.contains(&v) { v } else { "other" };
        *counts.entry(key).or_default() += 1;
    }
    family.clear();
    for (k, n) in counts {
        family.get_or_create(&vec![(label, k.to_string())]).set(n);
    }
}

/// Forgets requests timed over an hour ago (their jobs ended while they waited); all of them
/// if that is not enough, so the map stays bounded and pruning stays rare.
fn prune(map: &mut HashMap<u64, Instant>, now: Instant) {
    let hour = Duration::from_secs(3600);
    map.retain(|_, at| now.duration_since(*at) < hour);
    if map.len() >= TIMED_REQUESTS_MAX / 2 {
        map.clear();
    }
}

/// OpenMetrics text → Prometheus text format 0.0.4 (what Debian 12's Prometheus and
/// `promtool check metrics` read): no `# EOF` or `# UNIT`, and a counter's HELP and TYPE
/// name its `_total` sample.
pub fn openmetrics_to_text_004(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_004_names_counters_by_their_total_sample_and_drops_eof() {
        let om = "# HELP rb_grants Hosts granted.\n# TYPE rb_grants counter\nrb_grants_total 3\n# HELP rb_hosts Hosts.\n# TYPE rb_hosts gauge\nrb_hosts{state=\"up\"} 2\n# EOF\n";
        let text = openmetrics_to_text_004(om);
        assert_eq!(
            text,
            "# HELP rb_grants_total Hosts granted.\n# TYPE rb_grants_total counter\nrb_grants_total 3\n# HELP rb_hosts Hosts.\n# TYPE rb_hosts gauge\nrb_hosts{state=\"up\"} 2\n"
        );
    }

    #[test]
    fn unknown_states_are_counted_as_other_and_known_ones_always_present() {
        let family = Family::<Labels, Gauge>::default();
        set_counts(
            &family,
            "state",
            HOST_STATES,
            ["up", "weird", "up"].into_iter(),
        );
        let get = |s: &str| family.get_or_create(&vec![("state", s.to_string())]).get();
        assert_eq!((get("up"), get("down"), get("other")), (2, 0, 1));
    }
}
