//! How well a run used its hosts, measured over a replayed decision trace: host-seconds in
//! all, and host-seconds a host was free (up, not drained, held by no job) while some
//! request waited — the paper's utilization experiment's "idle". Between two
//! inputs the allocator's state does not change, so integrating the state after each input
//! up to the next one is exact for what the trace recorded.
//!
//! Cost: O(1) per input, plus a walk over the hosts after an input that leaves a request
//! waiting.

use crate::Allocator;

/// Host-seconds of a replayed run.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// Every host of the lab, up or not, over the run.
    pub host_s: f64,
    /// Hosts held by a job (granted, or being taken back).
    pub held_host_s: f64,
    /// Free hosts while at least one request waited.
    pub idle_while_wanted_host_s: f64,
    /// Seconds during which at least one request waited.
    pub wanted_s: f64,
}

impl Usage {
    /// `idle_while_wanted_host_s / host_s` (0 for an empty run).
    pub fn idle_fraction(&self) -> f64 {
        if self.host_s > 0.0 {
            self.idle_while_wanted_host_s / self.host_s
        } else {
            0.0
        }
    }
}

/// The state integrated from one input to the next.
#[derive(Debug, Clone, Copy)]
struct Sample {
    t_us: u64,
    hosts: usize,
    held: usize,
    /// Free hosts, when a request waits; `None` when none waits.
    idle_wanted: Option<usize>,
}

/// Accumulates [`Usage`] as a replay goes.
#[derive(Debug, Default)]
pub(crate) struct UsageMeter {
    last: Option<Sample>,
    usage: Usage,
}

impl UsageMeter {
    /// The allocator's state right after the input at `t_us`.
    pub(crate) fn sample(&mut self, t_us: u64, alloc: &Allocator) {
        let idle_wanted = (!alloc.queue.is_empty()).then(|| free_hosts(alloc));
        self.advance(Sample {
            t_us,
            hosts: alloc.hosts.len(),
            held: alloc.by_host.len(),
            idle_wanted,
        });
    }

    fn advance(&mut self, next: Sample) {
        if let Some(prev) = self.last {
            let dt = next.t_us.saturating_sub(prev.t_us) as f64 / 1e6;
            self.usage.host_s += prev.hosts as f64 * dt;
            self.usage.held_host_s += prev.held as f64 * dt;
            if let Some(idle) = prev.idle_wanted {
                self.usage.wanted_s += dt;
                self.usage.idle_while_wanted_host_s += idle as f64 * dt;
            }
        }
        self.last = Some(next);
    }

    pub(crate) fn usage(&self) -> Usage {
        self.usage
    }
}

/// Hosts up, open to grants (not drained, no lease ending), held by no job.
fn free_hosts(alloc: &Allocator) -> usize {
    alloc
        .hosts
        .values()
        .filter(|h| h.up && !alloc.closed(&h.name) && !alloc.by_host.contains_key(&h.name))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t_s: u64, held: usize, idle_wanted: Option<usize>) -> Sample {
        Sample {
            t_us: t_s * 1_000_000,
            hosts: 4,
            held,
            idle_wanted,
        }
    }

    #[test]
    fn host_seconds_are_integrated_from_each_state_to_the_next() {
        let mut m = UsageMeter::default();
        m.advance(at(0, 2, None)); // 10 s: nobody waits, 2 of 4 hosts held
        m.advance(at(10, 3, Some(1))); // 5 s: a request waits, one host free
        m.advance(at(15, 4, Some(0))); // 5 s: it waits, none free (being reclaimed)
        m.advance(at(20, 0, None));
        let u = m.usage();
        assert_eq!(u.host_s, 80.0);
        assert_eq!(u.held_host_s, 20.0 + 15.0 + 20.0);
        assert_eq!(u.wanted_s, 10.0);
        assert_eq!(u.idle_while_wanted_host_s, 5.0);
        assert_eq!(u.idle_fraction(), 5.0 / 80.0);
    }

    #[test]
    fn an_empty_run_is_not_idle() {
        assert_eq!(UsageMeter::default().usage().idle_fraction(), 0.0);
    }
}
