//! The fair partition's weights: each running job's `share` (the policy's hook, default 1),
//! evaluated once per decision round, once `user` and `lab` are current, and put into the
//! job's facts as `job.share` / `holder.share`. The partition itself is `may_preempt` and
//! `preempt_rank` (`policy`: `reclaim_victim`), whose defaults and the shipped policies
//! weigh `hosts_held` by it: a job with share 2 keeps about twice the hosts of a share-1
//! job when hosts are contended.

use std::sync::Arc;

use policies::{value::JobValue, Hook};

use super::{state::Allocator, JobId};

impl Allocator {
    /// Evaluates `share` for every running job and rebuilds the value of each whose share
    /// changed. A value that is not a finite number above 0 (a run-time error) gives 1.
    ///
    /// When `share` reads no variable (the paper's `'1'`), it is evaluated once for all.
    pub(crate) fn refresh_shares(&mut self) {
        let ids: Vec<JobId> = self.inputs.jobs.keys().copied().collect();
        let constant = self.policy.reads(Hook::Share).is_empty();
        let mut same = None;
        for id in ids {
            let share = match same {
                Some(s) => s,
                None => self.share_of(id),
            };
            if constant {
                same = Some(share);
            }
            let Some((facts, value)) = self.inputs.jobs.get_mut(&id) else {
                continue;
            };
            if facts.share != share {
                facts.share = share;
                *value = Arc::new(JobValue::new(facts));
            }
        }
    }

    /// The policy's `share` for `job` (1 when it cannot be evaluated).
    fn share_of(&self, job: JobId) -> f64 {
        let Some(scope) = self.job_scope(job) else {
            return 1.0;
        };
        let d = self.policy.share(scope);
        self.note_error(&d, "-", Some(job));
        Some(d.value)
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or(1.0)
    }
}
