//! Pure checks of the broker's answers: `rb status --json` and `rb jobs --json` taken
//! together ([`View`]), no host in two live allocations ([`exclusive`]), running jobs keep
//! their hosts and queued requests across a fault ([`kept`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use serde_json::Value;

use crate::labtier::LabWithBroker;

/// `rb status --json` and `rb jobs --json` at one moment.
/// The jobs are asked for before and after the status (`jobs_before`, `jobs`), so that a
/// grant or a job end between the two questions is not taken for an inconsistency.
#[derive(Debug, Clone, Default)]
pub struct View {
    pub status: Vec<Value>,
    pub jobs: Vec<Value>,
    pub jobs_before: Vec<Value>,
}

impl View {
    /// Both lists, or `None` when the broker does not answer.
    pub fn take(env: &LabWithBroker) -> Option<View> {
        let before = env.broker.rb(&["jobs", "--json"]);
        let status = env.broker.rb(&["status", "--json"]);
        let jobs = env.broker.rb(&["jobs", "--json"]);
        if [&before, &status, &jobs]
            .iter()
            .any(|o| !o.status.success())
        {
            return None;
        }
        Some(View {
            status: serde_json::from_slice(&status.stdout).ok()?,
            jobs: serde_json::from_slice(&jobs.stdout).ok()?,
            jobs_before: serde_json::from_slice(&before.stdout).ok()?,
        })
    }

    /// The ids of the jobs running at either question (a job that started or ended
    /// between them counts as running).
    pub fn running_ids(&self) -> BTreeSet<u64> {
        self.jobs
            .iter()
            .chain(&self.jobs_before)
            .filter(|j| j["state"] == "running")
            .filter_map(|j| j["id"].as_u64())
            .collect()
    }

    /// The running job whose command carries `marker`.
    pub fn job(&self, marker: &str) -> Option<&Value> {
        let tag = format!("RBFAULT={marker};");
        self.jobs.iter().find(|j| {
            j["state"] == "running"
                && j["argv"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|w| w.as_str().is_some_and(|w| w.contains(&tag)))
                })
        })
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// No host in two live allocations: a host is in at most one running job's `hosts`, that
/// job is the host's `held_by`, and no `held_by` names a job that is not running — but
/// while the host is being taken back ([`released_by_ended`]: checked by
/// [`released_in_time`]).
pub fn exclusive(view: &View) -> Vec<String> {
    let mut out = Vec::new();
    let mut holder: BTreeMap<String, u64> = BTreeMap::new();
    let running = view.running_ids();
    for job in view.jobs.iter().filter(|j| j["state"] == "running") {
        let id = job["id"].as_u64().unwrap_or(0);
        for host in strings(&job["hosts"]) {
            if let Some(other) = holder.insert(host.clone(), id) {
                out.push(format!("{host} held by jobs {other} and {id}"));
            }
        }
    }
    for row in &view.status {
        let name = row["name"].as_str().unwrap_or("?");
        let held_by = row["held_by"].as_u64();
        if let Some(j) = held_by {
            if !running.contains(&j) && !being_released(row) {
                out.push(format!(
                    "{name} held_by job {j} ({}), which is not running: {}",
                    row["alloc_state"],
                    view.jobs
                        .iter()
                        .find(|x| x["id"].as_u64() == Some(j))
                        .map_or("not in rb jobs".into(), |x| format!(
                            "{} {}",
                            x["state"], x["hosts"]
                        ))
                ));
            }
        }
        if let Some(&j) = holder.get(name) {
            if held_by != Some(j) && holds(&view.jobs_before, j, name) {
                out.push(format!(
                    "{name} is in job {j}'s hosts but status says held_by {held_by:?}"
                ));
            }
        }
    }
    out
}

/// Whether a host's `alloc_state` says it is being taken back from its holder.
fn being_released(row: &Value) -> bool {
    matches!(
        row["alloc_state"].as_str(),
        Some("releasing" | "reserved" | "draining")
    )
}

/// Hosts being taken back from a job that is no longer running: (host, job). The job
/// ended after the grace of a reclaim had passed (the allocation is past its deadline);
/// the broker then waits for the host's daemon to find none of the job's processes left
/// (SIGTERM, a second, SIGKILL) before the host is free. Legitimate, and brief.
pub fn released_by_ended(view: &View) -> BTreeSet<(String, u64)> {
    let running = view.running_ids();
    view.status
        .iter()
        .filter(|row| being_released(row))
        .filter_map(|row| Some((row["name"].as_str()?.to_string(), row["held_by"].as_u64()?)))
        .filter(|(_, job)| !running.contains(job))
        .collect()
}

/// How long a host may stay with a job that is no longer running, being taken back: the
/// host's daemon's sweep (SIGTERM, a second, SIGKILL) and its next report, with room for a
/// daemon restarted meanwhile.
pub const RELEASE_BOUND: Duration = Duration::from_secs(10);

/// Each host of `view` being taken back from a job that is no longer running
/// ([`released_by_ended`]) must be free of it within [`RELEASE_BOUND`]; those that are
/// not, said.
pub fn released_in_time(env: &LabWithBroker, view: &View) -> Vec<String> {
    let pending = released_by_ended(view);
    if pending.is_empty() {
        return Vec::new();
    }
    let mut last = None;
    let cleared = crate::wait_until(RELEASE_BOUND, || {
        let now = View::take(env)?;
        let left: BTreeSet<_> = released_by_ended(&now)
            .intersection(&pending)
            .cloned()
            .collect();
        last = Some(left.clone());
        left.is_empty().then_some(())
    });
    if cleared.is_some() {
        return Vec::new();
    }
    last.unwrap_or(pending)
        .into_iter()
        .map(|(host, job)| {
            format!(
                "{host} still being taken back from ended job {job} {} s later",
                RELEASE_BOUND.as_secs()
            )
        })
        .collect()
}

/// Whether running job `id` lists `host` in `jobs`.
fn holds(jobs: &[Value], id: u64, host: &str) -> bool {
    jobs.iter().any(|j| {
        j["id"].as_u64() == Some(id)
            && j["state"] == "running"
            && strings(&j["hosts"]).iter().any(|h| h == host)
    })
}

/// Every job running before a fault (app not ended since) keeps its hosts but `taken`
/// (released or reclaimed on purpose) and its queued requests (still queued or granted).
pub fn kept(
    before: &View,
    after: &View,
    markers: &[String],
    taken: &BTreeSet<String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for m in markers {
        let Some(b) = before.job(m) else { continue };
        let hosts_b: BTreeSet<String> = strings(&b["hosts"])
            .into_iter()
            .filter(|h| !taken.contains(h))
            .collect();
        let queued_b = strings(&b["queued"]).len();
        let Some(a) = after.job(m) else {
            out.push(format!(
                "job {m} (id {}) running with {hosts_b:?} before, gone after",
                b["id"]
            ));
            continue;
        };
        let hosts_a: BTreeSet<String> = strings(&a["hosts"]).into_iter().collect();
        if !hosts_b.is_subset(&hosts_a) {
            out.push(format!("job {m} held {hosts_b:?}, now {hosts_a:?}"));
        }
        let gained = hosts_a.difference(&hosts_b).count();
        let queued_a = strings(&a["queued"]).len();
        if queued_a + gained < queued_b {
            out.push(format!(
                "job {m} had {queued_b} queued request(s), now {queued_a} queued and {gained} new host(s)"
            ));
        }
    }
    out
}

/// Hosts that are releasing or reserved (being taken back) in `view`.
pub fn being_taken(view: &View) -> BTreeSet<String> {
    view.status
        .iter()
        .filter(|r| {
            r["alloc_state"]
                .as_str()
                .is_some_and(|s| s != "free" && s != "held" && s != "drained")
        })
        .filter_map(|r| r["name"].as_str().map(String::from))
        .collect()
}

/// Hosts held by a running job in `view`.
pub fn held(view: &View) -> Vec<String> {
    view.status
        .iter()
        .filter(|r| r["held_by"].as_u64().is_some())
        .filter_map(|r| r["name"].as_str().map(String::from))
        .collect()
}

/// Hosts the broker's log `log` says it started taking back from a job (`reclaiming … host=H`:
/// a release, the owner back, or the policy's fair share for a waiting job). A host a
/// running job lost across a broker kill is a violation unless one of these lines says the
/// broker decided to take it: the decision may fall between the last view and the kill.
pub fn reclaims_logged(log: &str) -> BTreeSet<String> {
    log.lines()
        .filter(|l| l.contains(" reclaiming "))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("host=")))
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_taken_back_from_an_ended_job_waits_its_release_while_one_held_is_a_violation() {
        use serde_json::json;
        let view = View {
            status: vec![
                json!({"name": "node02", "alloc_state": "releasing", "held_by": 7}),
                json!({"name": "node03", "alloc_state": "releasing", "held_by": 6}),
                json!({"name": "node04", "alloc_state": "held", "held_by": 6}),
            ],
            jobs: vec![
                json!({"id": 6, "state": "ended", "hosts": ["node03", "node04"]}),
                json!({"id": 7, "state": "running", "hosts": ["node02"]}),
            ],
            jobs_before: Vec::new(),
        };
        let violations = exclusive(&view);
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(
            violations[0].starts_with("node04 held_by job 6"),
            "{violations:?}"
        );
        let pending: Vec<_> = released_by_ended(&view).into_iter().collect();
        assert_eq!(pending, [("node03".to_string(), 6)]);
    }

    #[test]
    fn reclaims_logged_reads_the_hosts_of_reclaiming_lines_only() {
        let log = "2026-11-25T14:45:08.35Z  INFO broker::jobs: reclaiming job=5 alloc=9 host=node05\n\
                   2026-11-25T14:45:08.36Z  INFO broker::jobs: granted job=8 alloc=12 host=node02 instance=Some(1)\n\
                   2026-11-25T14:45:09.00Z  INFO broker::jobs: reclaiming job=2 alloc=3 host=node04\n";
        let hosts: Vec<String> = reclaims_logged(log).into_iter().collect();
        assert_eq!(hosts, ["node04", "node05"]);
    }
}
