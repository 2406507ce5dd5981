//! Explaining the policy on one host, for people: `rb policy explain HOST [--job ID]` (each
//! hook's value and the inputs it read) and `rb status`'s `policy_note` (why a free host is
//! not startable now). Read-only over the cached inputs (`inputs`), refreshed first.

use std::{sync::Arc, time::Instant};

use policies::{
    facts::{JobFacts, UserFacts},
    value::{JobValue, UserValue},
    Answer, Explanation, Hook, Scope,
};
use serde_json::{json, Value};

use super::{inputs::HostEntry, AllocError, Allocator, JobId};

impl Allocator {
    /// Each hook's value on `host` for `job` (default: a hypothetical new non-adaptive job
    /// with no hosts, id 0) and, when the host is held, its holder; with the inputs each
    /// hook read, and every `host` field as the policy sees it (`host_facts`: `held_for_s`,
    /// `job_load`, `other_load`, ...). An error names what is unknown.
    pub fn explain(
        &mut self,
        host: &str,
        job: Option<JobId>,
        now: Instant,
    ) -> Result<Value, String> {
        if !self.inputs.hosts.contains_key(host) {
            return Err(AllocError::UnknownHost { host: host.into() }.to_string());
        }
        self.refresh(now);
        if self.by_host.contains_key(host) {
            // `held_for_s` as of now, even when the policy never reads it (`held`).
            self.rebuild_host(host);
        }
        if let Some(id) = job {
            if !self.inputs.jobs.contains_key(&id) {
                return Err(format!(
                    "job {id} is not running\nhelp: `rb jobs` lists the running jobs"
                ));
            }
        }
        let hypothetical = JobValue::new(&JobFacts {
            count: 1,
            ..JobFacts::default()
        });
        let nobody = UserValue::new(&UserFacts::default());
        let entry = &self.inputs.hosts[host];
        let job_value = match job {
            Some(id) => &self.inputs.jobs[&id].1,
            None => &hypothetical,
        };
        let user = job
            .and_then(|id| self.jobs.get(&id))
            .and_then(|j| self.inputs.users.get(&j.info.user))
            .map_or(&nobody, |u| u.as_ref());
        let mut scope = Scope::new().host(&entry.value).job(job_value).user(user);
        if let Some((_, lab)) = &self.inputs.lab {
            scope = scope.lab(lab);
        }
        if let Some((_, n)) = &self.inputs.now {
            scope = scope.now(n);
        }
        let holder = self
            .holder(host)
            .and_then(|(id, _)| self.inputs.jobs.get(&id));
        if let Some((_, h)) = holder {
            scope = scope.holder(h);
        }
        let hooks: Vec<Value> = self.policy.explain(scope).iter().map(hook_json).collect();
        let host_facts = serde_json::to_value(&entry.facts).unwrap_or(Value::Null);
        Ok(json!({
            "host": host,
            "host_facts": host_facts,
            "job": job,
            "holder": self.holder(host).map(|h| h.0),
            "policy_path": self.policy.source_path().display().to_string(),
            "policy_sha256": self.policy.sha256(),
            "hooks": hooks,
        }))
    }

    /// Why `host`, free, is not startable now; `None` when it is, for some job, or when it
    /// is held, drained or down (its state says so already).
    pub fn policy_note(&self, host: &str) -> Option<String> {
        self.note_for(host, self.inputs.hosts.get(host)?)
    }

    /// [`Self::policy_note`] for hosts asked in ascending name order, as `rb status` lists
    /// them: the policy's host entries are walked once instead of looked up by name for
    /// each (at 10k hosts, a lookup each was a tenth of the broker's time for the answer).
    pub fn policy_notes(&self) -> PolicyNotes<'_> {
        PolicyNotes {
            alloc: self,
            entries: self.inputs.hosts.iter().peekable(),
        }
    }

    /// [`Self::policy_notes`] for hosts asked in name order from `host` on (an answer built
    /// a part at a time).
    pub fn policy_notes_from(&self, host: &str) -> PolicyNotes<'_> {
        let from = self.inputs.hosts.position_of(host);
        PolicyNotes {
            alloc: self,
            entries: self.inputs.hosts.iter_from(from).peekable(),
        }
    }

    /// `host`'s note, its policy entry given. Most hosts are startable, and their entry
    /// says so before anything else is looked up.
    fn note_for(&self, host: &str, entry: &HostEntry) -> Option<String> {
        if entry.start != Some(false) {
            return None;
        }
        let view = self.host_view(host)?;
        if !view.up || self.by_host.contains_key(host) || self.closed(host) {
            return None;
        }
        let facts = serde_json::to_value(&entry.facts).ok()?;
        // The shipped policies' away time: why a private host is not away, with the source.
        if let Some(why) = entry.facts.not_away_reason(300) {
            return Some(why);
        }
        let read: Vec<String> = self
            .policy
            .fields_read(Hook::Start)
            .into_iter()
            .filter_map(|f| {
                let name = f.strip_prefix("host.")?.split('.').next()?.to_string();
                let v = facts.get(&name).cloned().unwrap_or(Value::Null);
                Some(format!("host.{name} = {v}"))
            })
            .collect();
        Some(format!("policy start is false here ({})", read.join(", ")))
    }
}

/// [`Allocator::policy_note`] for hosts asked in ascending name order
/// ([`Allocator::policy_notes`]); a host asked out of order is looked up, so any order is
/// answered right.
pub struct PolicyNotes<'a> {
    alloc: &'a Allocator,
    entries: std::iter::Peekable<crate::host_map::Iter<'a, Arc<HostEntry>>>,
}

impl<'a> PolicyNotes<'a> {
    /// [`Allocator::policy_note`] of `host`.
    pub fn note(&mut self, host: &str) -> Option<String> {
        while self
            .entries
            .next_if(|(name, _)| name.as_str() < host)
            .is_some()
        {}
        let entry: &'a HostEntry = match self.entries.peek() {
            Some(&(name, entry)) if name.as_str() == host => entry,
            _ => self.alloc.inputs.hosts.get(host)?,
        };
        self.alloc.note_for(host, entry)
    }
}

fn hook_json(e: &Explanation) -> Value {
    let value = e.value.map(|a| match a {
        Answer::Bool(b) => json!(b),
        Answer::Number(n) => json!(n),
    });
    json!({
        "key": e.hook.key(),
        "set": e.set,
        "expression": e.expression,
        "value": value,
        "error": e.error.as_ref().map(|x| x.message.clone()),
        "inputs": e.inputs,
    })
}
