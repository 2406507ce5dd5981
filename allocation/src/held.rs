//! `host.held_for_s`: how long the holder has held a host, from the allocator's own grant
//! instant ([`Allocation::since`](super::state::Allocation)), and keeping that number
//! current in the cached host values.
//!
//! A host's policy value is built once and cached (`inputs`): at its report, its grant and
//! its release. `held_for_s` grows with time while nothing else changes, so a cached value
//! would go stale. The choice here: a value is built with the decision's `now` (a report's
//! rebuild sees the report's `now`, so `vacate` asked at that report reads the exact
//! number), and when the policy in force reads `host.held_for_s` in any hook or let, each
//! decision round (`refresh`) also rebuilds the held hosts whose whole-second value
//! changed. A policy that never reads it pays nothing; one that does pays one value build
//! (about 1.6 µs) per held host per second of time passed, not per evaluation.

use policies::{Hook, Policy};

use super::state::Allocator;

/// The field whose reading turns on the per-round refresh.
const FIELD: &str = "host.held_for_s";

impl Allocator {
    /// Whole seconds from `host`'s grant to the current decision (`inputs.at`); 0 when the
    /// host is free or no decision time is known yet.
    pub(crate) fn held_for_s(&self, host: &str) -> i64 {
        let (Some(id), Some(at)) = (self.by_host.get(host), self.inputs.at) else {
            return 0;
        };
        self.allocs.get(id).map_or(0, |a| {
            i64::try_from(at.saturating_duration_since(a.since).as_secs()).unwrap_or(i64::MAX)
        })
    }

    /// Rebuilds the cached value of every held host whose `held_for_s` lags the current
    /// decision time, when the policy reads it (see the module docs).
    pub(crate) fn refresh_held_for(&mut self) {
        if !self.policy_reads_held_for() {
            return;
        }
        let stale: Vec<String> = self
            .by_host
            .keys()
            .filter(|h| {
                self.inputs
                    .hosts
                    .get(*h)
                    .is_some_and(|e| e.facts.held_for_s != self.held_for_s(h))
            })
            .cloned()
            .collect();
        for host in &stale {
            self.rebuild_host(host);
        }
    }

    /// Whether any hook in force (or a let it uses) reads `host.held_for_s`; worked out
    /// once per policy (by its sha256: the same text reads the same fields).
    fn policy_reads_held_for(&mut self) -> bool {
        match &self.inputs.held_for_read {
            Some((sha, reads)) if sha == self.policy.sha256() => *reads,
            _ => {
                let reads = reads_field(&self.policy, FIELD);
                self.inputs.held_for_read = Some((self.policy.sha256().to_string(), reads));
                reads
            }
        }
    }
}

/// Whether any hook in force reads `field`, directly or through lets.
fn reads_field(policy: &Policy, field: &str) -> bool {
    Hook::ALL
        .into_iter()
        .any(|h| policy.fields_read(h).contains(field))
}
