//! Host and policy changes turned into allocator inputs; what the allocator does with each
//! host added to `rb status` rows.

use super::*;

impl JobDesk {
    /// `host`'s daemon found processes of the allocations `running` on its machine
    /// ([`Allocator::allocs_running`]); a report that changes nothing is not passed on.
    pub fn allocs_running(&mut self, host: &str, running: Vec<u64>, now: Instant) -> Vec<Effect> {
        if !self.alloc.allocs_running_matters(host, &running) {
            return Vec::new();
        }
        let input = Input::AllocsRunning {
            host: host.to_string(),
            allocs: running,
        };
        self.handle(input, now).0
    }

    /// Tells the allocator that one host's row changed (as it happens): the row in the two
    /// parts the table hands over ([`crate::hosts::HostTable::take_changes`]).
    pub fn host_changed(
        &mut self,
        fixed: &FixedPart<'_>,
        live: &LivePart,
        now: Instant,
    ) -> Vec<Effect> {
        let labels = self.label_names.get(fixed.labels);
        let view = host_view(fixed, live, labels);
        // The delta costs a serialization: only when a trace is kept.
        let changed = if self.trace.is_some() {
            host_delta(self.alloc.host_view(&view.name), &view)
        } else {
            Default::default()
        };
        let input = Input::Host {
            host: view.name.clone(),
            changed,
            view: Some(Box::new(view)),
        };
        self.handle(input, now).0
    }

    /// Reports repeated the last one of each of `hosts` (their rows changed only in age, so
    /// the view the allocator holds for each is its view still): one allocator input for
    /// them all, which the trace records as one line. The allocator takes each as a repeated
    /// `Host` input ([`Allocator::host_repeated`] when that view decides nothing, the view
    /// again when it may: a held host), so no row is built for any, and a replay under
    /// another policy (which may hold the hosts, or read the clock) feeds them again.
    pub fn hosts_repeated(&mut self, hosts: Vec<String>, now: Instant) {
        if hosts.is_empty() {
            return;
        }
        let (effects, answer) = self.handle(Input::HostsRepeated { hosts }, now);
        if let Answer::Invalid(why) = answer {
            // Only a host the allocator never saw up could be refused; the table passes a
            // host's first report as a change, so this is a defect, said and survived.
            tracing::warn!(%why, "a repeated report names a host the allocator does not know");
        }
        self.perform(effects, now);
    }

    /// Adds what the allocator does with each host (`alloc_state`, `held_by`, `drained`,
    /// `policy_note`).
    pub fn annotate(&self, rows: &mut [HostStatus], now: Instant) {
        let mut notes = self.alloc.policy_notes();
        for row in rows {
            let mut live = row.live_part();
            self.annotate_live(&row.name, &mut live, &mut notes, now);
            row.set_live(live);
        }
    }

    /// The policy notes of hosts asked in name order ([`Self::annotate_live`]).
    pub fn policy_notes(&self) -> PolicyNotes<'_> {
        self.alloc.policy_notes()
    }

    /// [`Self::policy_notes`] for hosts asked in name order from `host` on.
    pub fn policy_notes_from(&self, host: &str) -> PolicyNotes<'_> {
        self.alloc.policy_notes_from(host)
    }

    /// The allocator's fields of `host`'s status row ([`Self::annotate`]) into `live`;
    /// `notes` from [`Self::policy_notes`], hosts asked in name order (any order is right,
    /// that one is cheapest).
    pub fn annotate_live(
        &self,
        host: &str,
        live: &mut LivePart,
        notes: &mut PolicyNotes<'_>,
        now: Instant,
    ) {
        let a = self.alloc.host_alloc(host);
        live.alloc_state = a.alloc_state.into();
        live.held_by = a.held_by;
        live.drained = a.drained;
        live.policy_note = notes.note(host);
        if let Some(lease) = self.alloc.pilot_lease_of(host) {
            live.slurm_job = lease.slurm_job;
            live.lease_left_s = lease
                .ends
                .map(|end| end.saturating_duration_since(now).as_secs_f64().round());
            live.lease_ending = lease.ending;
        }
    }

    /// What a reload prepares its policy's host decisions from, off the core
    /// ([`Allocator::policy_inputs`]).
    pub fn policy_inputs(&self) -> HostInputs {
        self.alloc.policy_inputs()
    }

    /// Puts a reloaded policy in force ([`Allocator::set_prepared_policy`]): recorded as
    /// the same input as [`Allocator::set_policy`], which a replay calls. Also returns what
    /// the change replaced, to drop off the core.
    pub fn set_policy(
        &mut self,
        prepared: PreparedPolicy,
        now: Instant,
    ) -> (Vec<Effect>, Option<Retired>) {
        let sha256 = prepared.policy().sha256().to_string();
        self.alloc.stage_policy(prepared);
        match self.handle(Input::Policy { sha256 }, now) {
            (effects, Answer::Retired(retired)) => (effects, Some(retired)),
            (effects, _) => (effects, None),
        }
    }

    /// `rb policy explain` ([`Allocator::explain`]).
    pub fn explain(
        &mut self,
        host: &str,
        job: Option<JobId>,
        now: Instant,
    ) -> Result<serde_json::Value, String> {
        let input = Input::Explain {
            host: host.to_string(),
            job,
        };
        match self.handle(input, now).1 {
            Answer::Explained(answer) => answer,
            other => Err(format!("the allocator did not explain: {other:?}")),
        }
    }
}

/// The allocator's view of a host, from the two parts of the host's status row (the
/// core's input is its own type, not the row `rb status` shows) and its labels' name form
/// ([`LabelNames::get`] of `fixed.labels`).
pub fn host_view(fixed: &FixedPart<'_>, live: &LivePart, labels: Arc<[String]>) -> HostView {
    debug_assert!(
        labels[..]
            == fixed
                .labels
                .iter()
                .map(|l| label_name(l))
                .collect::<Vec<_>>(),
        "the labels' name form of the row's"
    );
    HostView {
        up: live.state == proto::report::HostState::Up,
        reported: live.last_report_age_s.is_some(),
        labels,
        mem_avail_mb: fixed.mem_available_kb.map(|kb| kb / 1024),
        users: fixed.users_known.then(|| fixed.users.to_vec()),
        name: fixed.name.to_string(),
        address: fixed.address.to_string(),
        os: fixed.os.map(str::to_string),
        owner: fixed.owner.map(str::to_string),
        load1: fixed.load1,
        load5: fixed.load5,
        load15: fixed.load15,
        cpus: fixed.cpus,
        console_idle_s: fixed.console_idle_s,
        logind: fixed.logind.map(<[_]>::to_vec),
        logind_error: fixed.logind_error.map(str::to_string),
        job_load: fixed.job_load,
    }
}

/// The hosts' label lists in the name form the allocator's views carry
/// ([`label_name`]), one shared list for each distinct list of the rows' labels: a lab's
/// hosts carry a few, so a changing report makes, copies and compares no label (at 10k
/// hosts each label string a host had of its own was a cache miss a report, read cold by
/// the next comparison).
#[derive(Debug, Default)]
pub struct LabelNames(SharedLists);

impl LabelNames {
    /// The name form of `row_labels` (a row's labels), shared with every earlier caller
    /// that passed the same list.
    pub fn get(&mut self, row_labels: &[String]) -> Arc<[String]> {
        self.0.shared(row_labels, |row| {
            row.iter().map(|l| label_name(l)).collect()
        })
    }
}
