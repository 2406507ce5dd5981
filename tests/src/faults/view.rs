//! Pure checks of the broker's answers: `rb status --json` and `rb jobs --json` taken
//! together ([`View`]), no host in two live allocations ([`exclusive`]), running jobs keep
//! their hosts and queued requests across a fault ([`kept`]).

use std::collections::{BTreeMap, BTreeSet};

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
/// job is the host's `held_by`, and no `held_by` names a job that is not running.
pub fn exclusive(view: &View) -> Vec<String> {
    let mut out = Vec::new();
    let mut holder: BTreeMap<String, u64> = BTreeMap::new();
    let running: BTreeSet<u64> = view
        .jobs
        .iter()
        .chain(&view.jobs_before)
        .filter(|j| j["state"] == "running")
        .filter_map(|j| j["id"].as_u64())
        .collect();
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
            if !running.contains(&j) {
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
    fn reclaims_logged_reads_the_hosts_of_reclaiming_lines_only() {
        let log = "2026-11-25T14:45:08.35Z  INFO broker::jobs: reclaiming job=5 alloc=9 host=node05\n\
                   2026-11-25T14:45:08.36Z  INFO broker::jobs: granted job=8 alloc=12 host=node02 instance=Some(1)\n\
                   2026-11-25T14:45:09.00Z  INFO broker::jobs: reclaiming job=2 alloc=3 host=node04\n";
        let hosts: Vec<String> = reclaims_logged(log).into_iter().collect();
        assert_eq!(hosts, ["node04", "node05"]);
    }
}
