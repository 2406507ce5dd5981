//! Asking the policy: one hook for one job on one host, with the inputs `inputs` cached
//! (host-only `start`/`rank` values straight from the cache), and the run-time errors that
//! gave a hook's default, collected and rate-limited into [`Effect::PolicyError`]s.

use std::{
    collections::BTreeMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use policies::{Answer, Decision, Hook, Scope};

use super::{state::Fx, Allocator, Effect, JobId};

/// A run-time error of one key on one host is reported at most once per this interval.
pub const POLICY_ERROR_EVERY: Duration = Duration::from_secs(60);

/// A run-time error waiting to become an [`Effect::PolicyError`].
#[derive(Debug, Clone)]
struct PendingError {
    key: &'static str,
    host: String,
    job: Option<JobId>,
    message: String,
}

/// Errors met by `&self` decisions (eligibility is asked from read-only paths), collected
/// until the entry point finishes.
#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    pending: Mutex<Vec<PendingError>>,
    last: Mutex<BTreeMap<(&'static str, String), Instant>>,
}

impl Clone for ErrorLog {
    fn clone(&self) -> Self {
        let pending = self.pending.lock().map(|p| p.clone()).unwrap_or_default();
        let last = self.last.lock().map(|l| l.clone()).unwrap_or_default();
        ErrorLog {
            pending: Mutex::new(pending),
            last: Mutex::new(last),
        }
    }
}

impl Allocator {
    /// Evaluates `hook` for `job` on `host` (with `holder` for the preemption hooks); a
    /// run-time error is logged (rate-limited) and the hook's default used. `None` when the
    /// inputs are not known (the job is not running or the host has not been seen).
    pub(crate) fn decide(
        &self,
        hook: Hook,
        job: JobId,
        host: &str,
        holder: Option<JobId>,
    ) -> Option<Answer> {
        let h = self.inputs.hosts.get(host)?;
        let (_, j) = self.inputs.jobs.get(&job)?;
        let user = self.jobs.get(&job).map(|j| j.info.user.as_str());
        let mut scope = Scope::new().host(&h.value).job(j);
        if let Some(u) = user.and_then(|u| self.inputs.users.get(u)) {
            scope = scope.user(u);
        }
        if let Some((_, lab)) = &self.inputs.lab {
            scope = scope.lab(lab);
        }
        if let Some((_, now)) = &self.inputs.now {
            scope = scope.now(now);
        }
        if let Some(holder) = holder {
            scope = scope.holder(&self.inputs.jobs.get(&holder)?.1);
        }
        let d = self.policy.eval(hook, scope);
        self.note_error(&d, host, Some(job));
        d.value
    }

    /// The scope of the hooks that read no host (`share`, `max_hosts`, `priority`).
    pub(crate) fn job_scope(&self, job: JobId) -> Option<Scope<'_>> {
        let (_, j) = self.inputs.jobs.get(&job)?;
        let user = self.jobs.get(&job).map(|j| j.info.user.as_str());
        let mut scope = Scope::new().job(j);
        if let Some(u) = user.and_then(|u| self.inputs.users.get(u)) {
            scope = scope.user(u);
        }
        if let Some((_, lab)) = &self.inputs.lab {
            scope = scope.lab(lab);
        }
        if let Some((_, now)) = &self.inputs.now {
            scope = scope.now(now);
        }
        Some(scope)
    }

    /// `max_hosts` for `job` when it holds (or is being given) that many hosts already:
    /// then its requests wait. `None`: below its limit, or no limit.
    pub(crate) fn at_max_hosts(&self, job: JobId) -> Option<usize> {
        let d = self.policy.max_hosts(self.job_scope(job)?);
        self.note_error(&d, "-", Some(job));
        let max = d.value.filter(|n| n.is_finite() && *n >= 0.0)? as usize;
        let held = self.inputs.jobs.get(&job)?.0.hosts_held as usize;
        (held >= max).then_some(max)
    }

    /// `priority` of `job`'s waiting requests, higher first; 0 when it has none.
    pub(crate) fn priority(&self, job: JobId) -> f64 {
        let Some(scope) = self.job_scope(job) else {
            return 0.0;
        };
        let d = self.policy.priority(scope);
        self.note_error(&d, "-", Some(job));
        d.value.filter(|p| p.is_finite()).unwrap_or(0.0)
    }

    /// `start`: the cached host-only value, else evaluated for `job`; never on a Slurm
    /// pilot's host for another user's job (`overflow.rs`).
    pub(crate) fn starts(&self, job: JobId, host: &str) -> bool {
        if !self.pilot_allows(job, host) {
            return false;
        }
        match self.inputs.hosts.get(host).and_then(|h| h.start) {
            Some(b) => b,
            None => self
                .decide(Hook::Start, job, host, None)
                .and_then(Answer::as_bool)
                .unwrap_or(false),
        }
    }

    /// `rank`: the cached host-only value, else evaluated for `job`.
    pub(crate) fn rank(&self, job: JobId, host: &str) -> f64 {
        match self.inputs.hosts.get(host).and_then(|h| h.rank) {
            Some(r) => r,
            None => self
                .decide(Hook::Rank, job, host, None)
                .and_then(Answer::as_number)
                .unwrap_or(0.0),
        }
    }

    /// The grace for sending `job` off `host`: `base` (the lab's `reclaim_grace_s` or the
    /// admin's `--grace-s`), or the policy's `grace_s` when that ends earlier.
    pub(crate) fn grace_for(&self, job: JobId, host: &str, base: Duration) -> Duration {
        let policy = self
            .decide(Hook::GraceS, job, host, None)
            .and_then(Answer::as_number)
            .filter(|g| g.is_finite() && *g >= 0.0)
            .map(Duration::from_secs_f64);
        policy.map_or(base, |p| p.min(base))
    }

    pub(crate) fn note_error<T>(&self, d: &Decision<T>, host: &str, job: Option<JobId>) {
        let (Some(e), Some(now)) = (&d.error, self.inputs.at) else {
            return;
        };
        let key = e.hook.key();
        let log = &self.inputs.errors;
        let (Ok(mut last), Ok(mut pending)) = (log.last.lock(), log.pending.lock()) else {
            return;
        };
        let slot = (key, host.to_string());
        let due = last
            .get(&slot)
            .is_none_or(|t| now.saturating_duration_since(*t) >= POLICY_ERROR_EVERY);
        if due {
            last.insert(slot, now);
            pending.push(PendingError {
                key,
                host: host.to_string(),
                job,
                message: e.message.clone(),
            });
        }
    }

    /// No policy error waits for [`drain_errors`](Self::drain_errors).
    pub(crate) fn no_pending_errors(&self) -> bool {
        self.inputs
            .errors
            .pending
            .lock()
            .is_ok_and(|p| p.is_empty())
    }

    /// Moves the errors noted since the last call into `fx`.
    pub(crate) fn drain_errors(&self, fx: &mut Fx) {
        let Ok(mut pending) = self.inputs.errors.pending.lock() else {
            return;
        };
        for e in pending.drain(..) {
            fx.out.push(Effect::PolicyError {
                key: e.key,
                host: e.host,
                job: e.job,
                message: e.message,
            });
        }
    }
}
