//! The free-host order: the hosts a grant can go to, kept sorted as `pick_host` ranks them,
//! so that a grant looks at the best few hosts instead of scanning the lab.
//!
//! A host is in the order while it is up, not drained, not held, and the policy's cached
//! `start` (the host-only value computed when its report arrived) does not rule it out for
//! every job. Its place is `pick_host`'s order when no other queued request competes for
//! it: fewest labels, then the highest cached `rank`, then the name. A free host whose
//! `rank` depends on the job has no place and is kept apart (`unranked`). `rebuild_host`
//! (each report, grant, release, drain, resume and policy change) keeps the order current.
//!
//! A grant for the only queued request then walks the order best first and asks the
//! remaining per-job questions (symbolic name, hosts the job uses, `start` where the cache
//! could not decide it) until the first host that passes: the job-dependent rest of the
//! policy is evaluated on those few hosts only. Hosts kept apart are evaluated in full. With
//! other requests queued, the order also depends on which hosts they could use, and
//! `pick_host` scans every host as before.

use std::{cmp::Reverse, collections::BTreeSet};

use super::{
    inputs::HostEntry,
    state::{Allocator, Waiting},
};

/// A free host's place in the grant order (smaller first): its standing, then its name.
/// The name's first bytes come first as a number (`NamePrefix`): most hosts of a lab stand
/// alike (the same labels, often the same load) and are ordered by name alone, and most
/// names fit, so a comparison rarely reads a name from the heap.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct FreeKey {
    at: Standing,
    prefix: NamePrefix,
    name: String,
}

/// The first 16 bytes of a host name, zero-padded, as a big-endian number: never ordered
/// against the names (names that differ in their first 16 bytes are ordered by the first
/// byte that differs, and a name that another begins with pads at or below it), and equal
/// prefixes leave the order to the names themselves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
struct NamePrefix(u128);

impl NamePrefix {
    fn of(name: &str) -> Self {
        let mut bytes = [0u8; 16];
        let n = name.len().min(16);
        bytes[..n].copy_from_slice(&name.as_bytes()[..n]);
        NamePrefix(u128::from_be_bytes(bytes))
    }
}

/// What orders a free host, its name aside (the tie-break): fewest labels, then the highest
/// cached `rank`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Standing {
    labels: usize,
    rank: Reverse<i64>,
}

impl Standing {
    fn new(labels: usize, rank: f64) -> Self {
        Standing {
            labels,
            rank: Reverse(total_order(rank)),
        }
    }
}

impl FreeKey {
    fn new(labels: usize, rank: f64, name: &str) -> Self {
        FreeKey::at(Standing::new(labels, rank), name)
    }

    fn at(at: Standing, name: &str) -> Self {
        FreeKey {
            at,
            prefix: NamePrefix::of(name),
            name: name.to_string(),
        }
    }
}

/// `f64::total_cmp`'s order as an integer.
fn total_order(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ ((((bits >> 63) as u64) >> 1) as i64)
}

/// The free hosts in grant order, and those whose rank depends on the job. Each host's place
/// is kept by its entry ([`HostEntry::place`]), not here: whoever replaces an entry says
/// where the host was ([`FreeHosts::set`]), so a report costs no lookup of a host's key in a
/// map of its own (at 10k hosts, one cache-cold lookup a changing report less).
#[derive(Debug, Clone, Default)]
pub(crate) struct FreeHosts {
    ranked: BTreeSet<FreeKey>,
    unranked: BTreeSet<String>,
    /// A key to find one in `ranked` by, its name's buffer reused (nothing allocated a
    /// report); holds nothing between calls.
    probe: FreeKey,
}

/// The order and the hosts kept apart: the probe holds nothing.
impl PartialEq for FreeHosts {
    fn eq(&self, other: &Self) -> bool {
        self.ranked == other.ranked && self.unranked == other.unranked
    }
}

impl FreeHosts {
    /// Moves `host` from place `from` (where its entry had put it) to place `to`: `None`
    /// out of the order, `Some(None)` kept apart, `Some(Some(at))` in the order at `at`.
    /// A host whose rank moved keeps its key, and its name with it (nothing allocated: at
    /// 10k hosts whose load moves, a host a report).
    pub(crate) fn set(
        &mut self,
        host: &str,
        from: Option<Option<Standing>>,
        to: Option<Option<Standing>>,
    ) {
        if from == to {
            return;
        }
        let taken = match from {
            Some(Some(at)) => self.take_ranked(host, at),
            Some(None) => {
                let removed = self.unranked.remove(host);
                debug_assert!(removed, "{host} was not kept apart");
                None
            }
            None => None,
        };
        match to {
            Some(Some(at)) => {
                let mut key = taken.unwrap_or_else(|| FreeKey::at(at, host));
                key.at = at;
                self.ranked.insert(key);
            }
            Some(None) => {
                self.unranked.insert(host.to_string());
            }
            None => {}
        }
    }

    /// Takes `host`'s key out of the order, where it stands at `at`.
    fn take_ranked(&mut self, host: &str, at: Standing) -> Option<FreeKey> {
        self.probe.at = at;
        self.probe.prefix = NamePrefix::of(host);
        self.probe.name.clear();
        self.probe.name.push_str(host);
        let taken = self.ranked.take(&self.probe);
        self.probe.name.clear();
        debug_assert!(taken.is_some(), "{host} was not in the order at {at:?}");
        taken
    }

    /// How many hosts are in the order or kept apart.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ranked.len() + self.unranked.len()
    }
}

impl HostEntry {
    /// The host's place in the free-host order: `None` when no grant can go to it (down,
    /// drained, held, or `start` false for every job); `Some(None)` kept apart (its `rank`
    /// depends on the job).
    pub(crate) fn place(&self) -> Option<Option<Standing>> {
        let labels = self.labels?;
        if self.start == Some(false) {
            return None;
        }
        Some(self.rank.map(|r| Standing::new(labels, r)))
    }
}

impl Allocator {
    /// The best eligible host for queue entry `w` (hosts in `reserved` kept for others)
    /// when no other request competes, by walking the free-host order: the same host a scan
    /// of every host would pick.
    pub(crate) fn pick_free(&self, w: &Waiting, reserved: &BTreeSet<String>) -> Option<String> {
        let mut best: Option<FreeKey> = None;
        for host in &self.inputs.free.unranked {
            if self.eligible(w, host, reserved) {
                let labels = self.host_view(host).map_or(0, |v| v.label_count());
                let key = FreeKey::new(labels, self.rank(w.job, host), host);
                if best.as_ref().is_none_or(|b| key < *b) {
                    best = Some(key);
                }
            }
        }
        for key in &self.inputs.free.ranked {
            if best.as_ref().is_some_and(|b| key > b) {
                break;
            }
            if self.eligible(w, &key.name, reserved) {
                best = Some(key.clone());
                break;
            }
        }
        best.map(|k| k.name)
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, path::Path, sync::Arc, time::Instant};

    use policies::Policy;
    use proto_types::report::UserSession;

    use super::*;
    use crate::{tests::job_info, Effect, HostView};

    /// Host `i` of a varied lab: private (owner in, idle 0-20 min) or public, loads, CPUs,
    /// some down, some with the `gpu` label, one with unknown sessions.
    fn view(i: usize) -> HostView {
        let private = i.is_multiple_of(3);
        let idle = (i as u64 * 137) % 1200;
        let mut labels = vec!["linux".to_string()];
        if i % 7 == 2 {
            labels.push("gpu".into());
        }
        HostView {
            name: format!("node{i:03}"),
            address: format!("10.0.0.{i}"),
            up: i % 11 != 5,
            reported: true,
            labels: labels.into(),
            os: Some("Linux".into()),
            owner: private.then(|| "ann".to_string()),
            load1: (i % 13 != 4).then_some((i % 5) as f64 / 4.0),
            load5: None,
            load15: None,
            mem_avail_mb: Some(1024),
            cpus: Some(1 + (i % 4) as u32),
            users: (i != 17).then(|| match private {
                true => vec![UserSession {
                    user: "ann".into(),
                    tty: "pts/0".into(),
                    idle_s: Some(idle),
                    from: None,
                }],
                false => vec![],
            }),
            console_idle_s: Some(3600),
            logind: None,
            logind_error: None,
            job_load: None,
        }
    }

    /// The shipped policies, and one whose `rank` and `start` read the job everywhere.
    fn policies() -> Vec<(String, Arc<Policy>)> {
        let mut out: Vec<(String, Arc<Policy>)> = policies::SHIPPED
            .iter()
            .map(|(n, _)| {
                (
                    n.to_string(),
                    Arc::new(Policy::shipped(n).expect("shipped")),
                )
            })
            .collect();
        let text = "start = 'job.adaptive || !host.private'
\
                    rank = 'double(host.cpus) * (job.adaptive ? 1.0 : -1.0)'
";
        let p = Policy::from_text(Path::new("by-job.toml"), text).expect("loads");
        out.push(("by-job".into(), Arc::new(p)));
        out
    }

    /// For each policy, job and name, with the lab filling up grant by grant (and a host
    /// drained), the free-host order picks what a scan of every host picks.
    #[test]
    fn the_free_host_order_picks_what_the_scan_picks_under_every_shipped_policy() {
        for (name, policy) in policies() {
            let t0 = Instant::now();
            let mut a = Allocator::new().with_policy(policy);
            a.set_wall_clock(t0, 1_764_072_000, 0);
            for i in 0..60 {
                a.host_changed(view(i), t0);
            }
            a.drain("node008").expect("known host");
            let jobs = [
                a.register_job(job_info(true), t0).0,
                a.register_job(job_info(false), t0).0,
            ];
            let mut compared = 0;
            for round in 0..40 {
                for (k, symbolic) in ["anyHost", "anyLinux", "anyGpu"].iter().enumerate() {
                    let j = jobs[(round + k) % 2];
                    let wanted = a.parse_name(symbolic).expect("a symbolic name");
                    a.queue.push(Waiting {
                        id: 1000,
                        job: j,
                        symbolic: symbolic.to_string(),
                        want: wanted.want,
                        instance: None,
                        reserved: None,
                        reported: None,
                        since: t0,
                        restored: false,
                    });
                    let none = BTreeSet::new();
                    let fast = a.pick_free(&a.queue[0], &none);
                    let scan = a.pick_scan(0, &none);
                    a.queue.clear();
                    assert_eq!(fast, scan, "{name}, round {round}, job {j}, {symbolic}");
                    compared += usize::from(scan.is_some());
                }
                // Fill the lab: one more host held.
                let j = jobs[round % 2];
                let (_, fx) = a.request(j, "anyHost", t0);
                if !fx.iter().any(|e| matches!(e, Effect::Granted { .. })) {
                    let cancel: Vec<_> = a.queue.iter().map(|w| w.id).collect();
                    for r in cancel {
                        a.cancel(r);
                    }
                }
            }
            assert!(compared > 20, "{name}: only {compared} picks compared");
        }
    }

    #[test]
    fn the_integer_order_is_total_cmp() {
        let xs = [
            f64::NEG_INFINITY,
            -1e6,
            -1.0,
            -0.0,
            0.0,
            1e-9,
            1.0,
            1e6,
            f64::INFINITY,
            f64::NAN,
        ];
        for a in xs {
            for b in xs {
                assert_eq!(
                    total_order(a).cmp(&total_order(b)),
                    a.total_cmp(&b),
                    "{a} {b}"
                );
            }
        }
    }

    /// However a host moved (in, apart, out, its rank or labels changing in place), the order
    /// is the one its last places give when set afresh: the key moved in place keeps the
    /// order and the places in step.
    #[test]
    fn the_order_after_any_moves_is_the_order_of_the_last_places() {
        let mut moved = FreeHosts::default();
        let mut last: BTreeMap<String, Option<Option<Standing>>> = BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let host = format!("h{}", x % 40);
            let place = match (x >> 8) % 6 {
                0 => None,
                1 => Some(None),
                k => Some(Some(Standing::new(
                    (k % 2) as usize,
                    ((x >> 16) % 5) as f64,
                ))),
            };
            let from = last.get(&host).copied().flatten();
            moved.set(&host, from, place);
            last.insert(host, place);
        }
        let mut afresh = FreeHosts::default();
        for (host, place) in &last {
            afresh.set(host, None, *place);
        }
        assert_eq!(moved, afresh);
        assert_eq!(moved.len(), last.values().filter(|p| p.is_some()).count());
    }

    /// Hosts that stand alike are in name order, whatever the names' lengths and shared
    /// beginnings (the keys compare the names' first 16 bytes as a number first).
    #[test]
    fn hosts_that_stand_alike_are_in_name_order() {
        let stems = [
            "",
            "n",
            "node",
            "node0",
            "lab-pc-",
            "a-very-long-lab-host-name-",
        ];
        let mut names = Vec::new();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let stem = stems[(x % stems.len() as u64) as usize];
            let tail = ((x >> 8) % 1000).to_string();
            // Tails of one to three digits, some cut to share more of their beginning.
            let cut = 1 + ((x >> 20) % tail.len() as u64) as usize;
            names.push(format!("{stem}{}", &tail[..cut]));
        }
        let mut keys: Vec<FreeKey> = names.iter().map(|n| FreeKey::new(1, 0.5, n)).collect();
        keys.sort();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        keys.dedup();
        assert!(keys.iter().map(|k| &k.name).eq(sorted.iter()));
        assert!(
            names.iter().any(|n| n.len() > 16),
            "some names are longer than a prefix"
        );
    }

    #[test]
    fn a_host_moves_between_places_and_leaves() {
        let (two, three) = (Standing::new(1, 2.0), Standing::new(1, 3.0));
        let mut f = FreeHosts::default();
        f.set("a", None, Some(Some(two)));
        f.set("b", None, Some(None));
        f.set("a", Some(Some(two)), Some(Some(three)));
        assert_eq!(f.ranked.len(), 1);
        assert_eq!(f.ranked.first().map(|k| k.at), Some(three));
        f.set("a", Some(Some(three)), Some(None));
        assert!(f.ranked.is_empty());
        assert_eq!(f.unranked.len(), 2);
        f.set("a", Some(None), None);
        f.set("b", Some(None), None);
        assert_eq!(f.len(), 0);
    }
}
