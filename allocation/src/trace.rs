//! The decision trace: what changed and what the allocator decided, as JSON lines, for
//! `rb policy replay` (what would another policy have decided?).
//!
//! # Format
//! One JSON object per line: `t_us` (microseconds on the run's monotonic clock,
//! [`TraceClock`]), `unix_ms` (wall time, for people) and exactly one of:
//! - `start`: [`Start`] — the run id and the allocator's whole state ([`TraceState`]). Every
//!   trace file opens with one; it is the only record that lists the whole lab.
//! - `input`: an [`Input`] — one call into the allocator with what it needs to be made
//!   again: a host view as the fields that changed since the last one (`host`), a job's
//!   registration, an allocate request, a give-back, an end, an admin command, a policy
//!   reload, a tick that decided something.
//! - `decision`: a [`Decision`] the input led to — a grant, a refusal, a wait and its reason,
//!   a reclaim, a forced release — with the sha256 of the policy that took it. Decisions
//!   follow their input.
//!
//! # Choice: one entry point, its inputs recorded
//! An [`Input`] is what the allocator is driven by: the shell (`broker::jobs`) and the
//! replay (`rb policy replay`) both call [`Allocator::handle`] with one, and the shell then
//! hands the [`Recorder`] the input as handled (with the ids it got) and the effects it got
//! back. Inputs are what the allocator saw (a host view, not the raw report), so a replay
//! feeds the same values at the same instants through the same mapping and, under the same
//! policy, decides the same. The
//! [`Recorder`] is pure (no I/O, the clock passed in): it turns inputs and effects into
//! lines and decides when a file is full; writing them is the broker's edge.
//!
//! # Rotation
//! [`Recorder::begin`] is called before each entry point: once the current file holds
//! `max_bytes` or more beyond its opening `start` record, it asks for a new file
//! ([`Out::Rotate`]) opened by a `start` record of the state before that call
//! ([`Out::Start`]: handed over as data, serialized by the writer). A file thus holds its
//! opening state, `max_bytes` and at most one call's lines more. After lines were lost (the
//! writer's queue was full, the disk refused them) the next file is started at once with
//! `gap: true`, so a replay restarts from its state instead of replaying an incomplete
//! history.

use std::time::Instant;

use serde::{Deserialize, Serialize};

pub use crate::delta::{apply_delta, host_delta, Delta};
use crate::{
    trace_state::TraceState, AllocId, Allocator, Effect, HostView, JobId, JobInfo, RequestId,
};

/// The clock of one broker run: microseconds since `epoch`, and the wall time then.
#[derive(Debug, Clone, Copy)]
pub struct TraceClock {
    epoch: Instant,
    epoch_unix_ms: i64,
}

impl TraceClock {
    pub fn new(epoch: Instant, epoch_unix_ms: i64) -> Self {
        TraceClock {
            epoch,
            epoch_unix_ms,
        }
    }

    /// Microseconds from the epoch to `t` (0 for an earlier instant).
    pub fn us(&self, t: Instant) -> u64 {
        let d = t.saturating_duration_since(self.epoch);
        u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
    }

    /// The instant `us` microseconds after the epoch.
    pub fn instant(&self, us: u64) -> Instant {
        let d = std::time::Duration::from_micros(us);
        self.epoch.checked_add(d).unwrap_or(self.epoch)
    }

    /// Unix milliseconds `us` microseconds after the epoch.
    pub fn unix_ms(&self, us: u64) -> i64 {
        let ms = i64::try_from(us / 1000).unwrap_or(i64::MAX);
        self.epoch_unix_ms.saturating_add(ms)
    }
}

/// One line of a trace file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Line {
    pub t_us: u64,
    pub unix_ms: i64,
    #[serde(flatten)]
    pub body: Body,
}

/// What a line records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Body {
    Start(Box<Start>),
    Input(Input),
    Decision(Decision),
}

/// The record that opens a trace file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Start {
    /// Identifies one broker run: the files of one run continue each other.
    pub run: String,
    /// Lines were lost before this record: the history since the previous `start` is
    /// incomplete.
    #[serde(default)]
    pub gap: bool,
    pub state: TraceState,
}

/// One call into the allocator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Input {
    /// [`Allocator::host_changed`]; `changed` holds the view's fields that differ from the
    /// host's previous view (all of them for a host seen for the first time). With no field
    /// changed, a report that repeated the last one ([`Allocator::host_repeated`] when the
    /// same view decides nothing). `view`, never recorded, is the whole new view when the
    /// shell has it (then `changed` is only for the trace and may be left empty).
    Host {
        host: String,
        changed: Delta,
        #[serde(skip)]
        view: Option<Box<HostView>>,
    },
    /// An agent registers its job, which got the id `job` (a new one from
    /// [`Allocator::register_job`], or the resumed one). `resume`: the job the agent asks to
    /// take up again after a broker restart (granted to the job's own user within the
    /// resume window; else a new job is registered). `runs_on`: the machine the agent
    /// runs on; for a `module` job that machine, when it is a lab host, is never granted
    /// to it (its front end). Traces that predate these fields recorded a separate
    /// `resumed` or `uses_hosts` input instead.
    Register {
        job: JobId,
        info: JobInfo,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume: Option<JobId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        runs_on: Option<RunsOn>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        module: bool,
    },
    /// [`Allocator::request`], which gave the request id `req`.
    Allocate {
        job: JobId,
        req: RequestId,
        symbolic: String,
    },
    /// [`Allocator::cancel`].
    Cancel { job: JobId, req: RequestId },
    /// [`Allocator::give_back`] of the allocation of `host` (granted for `req`).
    GiveBack {
        job: JobId,
        host: String,
        req: Option<RequestId>,
    },
    /// [`Allocator::release_confirmed`] of the allocation of `host` (granted for `req`).
    Released {
        job: JobId,
        host: String,
        req: Option<RequestId>,
    },
    /// [`Allocator::end_job`]: the agent says its job ended.
    End { job: JobId },
    /// The job's agent is gone (its connection closed or was cut): a running job ends.
    AgentGone { job: JobId },
    /// [`Allocator::resumed`]: the job's agent came back after a broker restart (traces
    /// that predate `Register`'s `resume`).
    Resumed { job: JobId },
    /// [`Allocator::uses_hosts`]: `hosts` as the agent named them (names or addresses;
    /// those that are no lab host are ignored).
    UsesHosts { job: JobId, hosts: Vec<String> },
    /// [`Allocator::release_host`] (`rb release`).
    ReleaseHost { host: String, grace_us: u64 },
    /// [`Allocator::lease_ends`]: Slurm takes a pilot's node back.
    LeaseEnds { host: String, grace_us: u64 },
    /// [`Allocator::drain`].
    Drain { host: String },
    /// [`Allocator::resume`].
    Resume { host: String },
    /// [`Allocator::tick`], recorded only when it decided something.
    Tick,
    /// [`Allocator::set_policy`] (a reload); the new policy's sha256.
    Policy { sha256: String },
    /// [`Allocator::explain`], which refreshes the policy's inputs.
    Explain { host: String, job: Option<JobId> },
    /// [`Allocator::allocs_running`]: `host`'s daemon found processes of `allocs`
    /// (recorded when it changed something).
    AllocsRunning { host: String, allocs: Vec<AllocId> },
    /// Reports that repeated each host's last one, at one instant: for each host in turn,
    /// what [`Input::Host`] with no field changed does. One line for the hosts a batch of
    /// reports repeated (most reports at 10k hosts), not one each.
    HostsRepeated { hosts: Vec<String> },
}

/// The machine an agent runs on, as it said when it registered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunsOn {
    pub hostname: String,
    pub addresses: Vec<String>,
}

/// A decision, with the sha256 of the policy that took it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub policy: String,
    #[serde(flatten)]
    pub what: What,
}

/// What was decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum What {
    Grant {
        job: JobId,
        req: RequestId,
        host: String,
    },
    Refuse {
        job: JobId,
        req: RequestId,
        reason: String,
    },
    Wait {
        job: JobId,
        req: RequestId,
        position: usize,
        reason: String,
    },
    Reclaim {
        job: JobId,
        host: String,
        grace_us: u64,
    },
    Force {
        job: JobId,
        host: String,
    },
}

impl What {
    /// The decision an effect carries; `None` for bookkeeping effects (freed, persist,
    /// policy errors).
    pub fn of(effect: &Effect) -> Option<What> {
        Some(match effect {
            Effect::Granted { job, req, host, .. } => What::Grant {
                job: *job,
                req: *req,
                host: host.clone(),
            },
            Effect::Refused { job, req, reason } => What::Refuse {
                job: *job,
                req: *req,
                reason: reason.clone(),
            },
            Effect::Queued {
                job,
                req,
                position,
                reason,
            } => What::Wait {
                job: *job,
                req: *req,
                position: *position,
                reason: reason.clone(),
            },
            Effect::Reclaim {
                job, host, grace, ..
            } => What::Reclaim {
                job: *job,
                host: host.clone(),
                grace_us: u64::try_from(grace.as_micros()).unwrap_or(u64::MAX),
            },
            Effect::ForceRelease { job, host, .. } => What::Force {
                job: *job,
                host: host.clone(),
            },
            Effect::Freed { .. }
            | Effect::PolicyError { .. }
            | Effect::SubmitPilot { .. }
            | Effect::CancelPilot { .. }
            | Effect::AgentLate { .. }
            | Effect::ConfirmEnd { .. }
            | Effect::Persist => return None,
        })
    }
}

/// The name of trace file number `seq`: `trace-NNNNNN.jsonl`.
pub fn file_name(seq: u64) -> String {
    format!("trace-{seq:06}.jsonl")
}

/// The number of a trace file from its name; `None` for any other file.
pub fn file_seq(name: &str) -> Option<u64> {
    name.strip_prefix("trace-")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

/// What the writer must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Out {
    /// Close the current file and open the next one (then write the lines that follow).
    Rotate,
    /// Append one line (no newline included).
    Line(String),
    /// Append the `start` line that opens a file, not yet serialized: the writer turns it
    /// into text ([`Out::into_text`]), not the thread that decides. A lab's whole state is
    /// tens of MB of JSON (29 MB at 100k hosts, ~85 ms to serialize on this machine), which
    /// stalled every report and grant behind it at each new file.
    Start(Box<Line>),
}

impl Out {
    /// The line to append (no newline included), serialized if it was not yet; `None`
    /// for [`Out::Rotate`].
    pub fn into_text(self) -> Option<String> {
        match self {
            Out::Rotate => None,
            Out::Line(text) => Some(text),
            // Plain data with string keys: serializing cannot fail.
            Out::Start(line) => serde_json::to_string(&line).ok(),
        }
    }
}

/// Turns the allocator's inputs and effects into trace lines (see the module docs).
#[derive(Debug)]
pub struct Recorder {
    clock: TraceClock,
    run: String,
    max_bytes: u64,
    /// Bytes in the current file; `None` before the first `start`.
    bytes: Option<u64>,
    /// A gap was reported: rotate at the next `begin`.
    gap: bool,
}

impl Recorder {
    /// A recorder for run `run`, files of about `max_bytes`.
    pub fn new(clock: TraceClock, run: impl Into<String>, max_bytes: u64) -> Self {
        Recorder {
            clock,
            run: run.into(),
            max_bytes,
            bytes: None,
            gap: false,
        }
    }

    pub fn clock(&self) -> &TraceClock {
        &self.clock
    }

    /// Lines were lost: the next [`begin`](Self::begin) starts a new file marked `gap`.
    pub fn gap(&mut self) {
        self.gap = true;
    }

    /// Call before each allocator entry point: a new file opened by a `start` record of
    /// `alloc` when none was written yet, the current one is full, or lines were lost.
    pub fn begin(&mut self, alloc: &Allocator, now: Instant, out: &mut Vec<Out>) {
        let full = self.bytes.is_none_or(|b| b >= self.max_bytes);
        if !full && !self.gap {
            return;
        }
        if self.bytes.is_some() {
            out.push(Out::Rotate);
        }
        self.bytes = Some(0);
        let start = Start {
            run: self.run.clone(),
            gap: std::mem::take(&mut self.gap),
            state: alloc.trace_state(&self.clock),
        };
        // The limit is for what follows the opening state: counted with it, a state larger
        // than the limit (a lab of some 30k hosts at the default 8 MiB) filled every file at
        // once, and each call opened a new one with the whole state again.
        self.bytes = Some(0);
        let line = self.stamped(now, Body::Start(Box::new(start)));
        out.push(Out::Start(Box::new(line)));
    }

    /// Records one entry point's input and the decisions among its effects.
    pub fn record(
        &mut self,
        alloc: &Allocator,
        input: Input,
        effects: &[Effect],
        now: Instant,
        out: &mut Vec<Out>,
    ) {
        self.line(now, Body::Input(input), out);
        let policy = alloc.policy().sha256();
        for what in effects.iter().filter_map(What::of) {
            let decision = Decision {
                policy: policy.to_string(),
                what,
            };
            self.line(now, Body::Decision(decision), out);
        }
    }

    /// `body` as a line at `now`.
    fn stamped(&self, now: Instant, body: Body) -> Line {
        let t_us = self.clock.us(now);
        Line {
            t_us,
            unix_ms: self.clock.unix_ms(t_us),
            body,
        }
    }

    fn line(&mut self, now: Instant, body: Body, out: &mut Vec<Out>) {
        let line = self.stamped(now, body);
        // Plain data with string keys: serializing cannot fail.
        if let Ok(text) = serde_json::to_string(&line) {
            self.bytes = Some(self.bytes.unwrap_or(0) + text.len() as u64 + 1);
            out.push(Out::Line(text));
        }
    }
}

/// The allocation `job` holds on `host` (granted for `req`), for inputs that name one.
pub(crate) fn find_alloc(
    alloc: &Allocator,
    job: JobId,
    host: &str,
    req: Option<RequestId>,
) -> Option<AllocId> {
    let mine = |a: &&crate::state::Allocation| a.job == job;
    let by_req = req.and_then(|r| {
        alloc
            .allocs
            .iter()
            .find(|(_, a)| mine(a) && a.request == Some(r))
    });
    by_req
        .or_else(|| alloc.allocs.iter().find(|(_, a)| mine(a) && a.host == host))
        .map(|(&id, _)| id)
}

impl Allocator {
    /// The host of allocation `alloc` and the request it was granted for (for
    /// [`Input::GiveBack`] and [`Input::Released`]).
    pub fn alloc_host(&self, alloc: AllocId) -> Option<(String, Option<RequestId>)> {
        self.allocs.get(&alloc).map(|a| (a.host.clone(), a.request))
    }
}

#[cfg(test)]
#[path = "trace_tests.rs"]
pub(crate) mod tests;
