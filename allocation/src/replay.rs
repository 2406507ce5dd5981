//! [`Replay`]: a decision trace (`trace`) played again through an [`Allocator`] deciding
//! with another policy, and the decisions that would have differed (`rb policy replay`).
//!
//! Each `start` record rebuilds the allocator from the state it lists (unless it continues
//! the run already being replayed without a gap); each input is made again at its recorded
//! instant; the decisions of both sides are collected and compared once the trace ends.
//!
//! # Matching
//! - A request's outcome (grant of a host, or refusal) is keyed by its request id: the
//!   replay numbers requests and jobs in the same order as the broker did.
//! - Reclaims and forced releases are keyed by job, host and how many times that job was
//!   sent off that host before.
//! - A decision present on one side only differs; a request granted different hosts
//!   differs once. `N decisions` counts the keys of both sides.
//!
//! # One mapping
//! Each input goes through [`Allocator::handle`], the entry point the broker drove, with the
//! recorded job and request ids replaced by the replay's.
//!
//! # Inputs that name an allocation
//! A give-back or a confirmed release names the host and the request it was granted for;
//! `handle` applies it to the allocation of that job granted for that request, else to
//! the job's allocation of that host, else ignores it (counted in [`Outcome::skipped`]: the
//! other policy never gave the job that host). A confirmed release is applied only to an
//! allocation being taken back. A reclaim only the replay made is never confirmed:
//! its deadline forces it, checked before each input (an input at `t` first ticks the
//! allocator at `t − 1 s`, so that a deadline the broker's own 250 ms tick met is met there
//! first, as recorded).

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use policies::Policy;

use crate::{
    state::AllocState,
    trace::{Body, Input, Line, Start, TraceClock, What},
    usage::{touched_hosts, Touched, UsageMeter},
    Allocator, Answer, Effect, JobId, RequestId, Timeline, Usage,
};

/// How far behind an input the deadlines of reclaims are checked (see the module docs).
const TICK_LAG: Duration = Duration::from_secs(1);

/// A decision compared across the two sides.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// The outcome of a request: grant or refusal.
    Request(RequestId),
    /// The `n`th reclaim of `host` from `job`.
    Reclaim(JobId, String, usize),
    /// The `n`th forced release of `host` from `job`.
    Force(JobId, String, usize),
}

/// One side's decision under a [`Key`].
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    /// Order of the line (or input) that led to it.
    seq: u64,
    unix_ms: i64,
    job: JobId,
    host: Option<String>,
    text: String,
}

/// The decisions of one side.
#[derive(Debug, Default)]
struct Side {
    decisions: BTreeMap<Key, Seen>,
    /// The last wait reason of each request.
    waits: BTreeMap<RequestId, String>,
    /// Reclaims and forced releases so far, by (kind, job, host).
    counts: BTreeMap<(bool, JobId, String), usize>,
}

impl Side {
    fn note(&mut self, what: What, seq: u64, unix_ms: i64) {
        let seen = |job, host: Option<&str>, text: String| Seen {
            seq,
            unix_ms,
            job,
            host: host.map(String::from),
            text,
        };
        let (key, value) = match what {
            What::Grant { job, req, host } => {
                let text = format!("grant {host}");
                (Key::Request(req), seen(job, Some(&host), text))
            }
            What::Refuse { job, req, reason } => {
                let first = reason.lines().next().unwrap_or_default();
                (
                    Key::Request(req),
                    seen(job, None, format!("refuse: {first}")),
                )
            }
            What::Wait { req, reason, .. } => {
                self.waits.insert(req, reason);
                return;
            }
            What::Reclaim { job, host, .. } => {
                let n = self.count(false, job, &host);
                let text = format!("reclaim {host} from job {job}");
                (
                    Key::Reclaim(job, host.clone(), n),
                    seen(job, Some(&host), text),
                )
            }
            What::Force { job, host } => {
                let n = self.count(true, job, &host);
                let text = format!("force {host} off job {job}");
                (
                    Key::Force(job, host.clone(), n),
                    seen(job, Some(&host), text),
                )
            }
        };
        self.decisions.entry(key).or_insert(value);
    }

    fn count(&mut self, force: bool, job: JobId, host: &str) -> usize {
        let n = self
            .counts
            .entry((force, job, host.to_string()))
            .or_insert(0);
        *n += 1;
        *n
    }

    /// What this side did about `key` when it took no decision there.
    fn absent(&self, key: &Key) -> String {
        match key {
            Key::Request(req) => match self.waits.get(req) {
                Some(reason) => format!("waits ({reason})"),
                None => "no decision".into(),
            },
            Key::Reclaim(..) | Key::Force(..) => "none".into(),
        }
    }
}

/// A decision that would have differed.
#[derive(Debug, Clone, PartialEq)]
pub struct Difference {
    /// Wall time of the earlier of the two decisions (Unix milliseconds).
    pub unix_ms: i64,
    pub host: Option<String>,
    pub job: JobId,
    /// The request, for a grant or a refusal.
    pub req: Option<RequestId>,
    /// What the broker decided (`grant node03`, `waits (…)`, `none`).
    pub recorded: String,
    /// What the replayed policy decides.
    pub replayed: String,
}

/// The result of a replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Decisions compared (grants, refusals, reclaims, forced releases of both sides).
    pub decisions: usize,
    /// Those that would have differed, in trace order.
    pub differences: Vec<Difference>,
    /// Inputs naming an allocation the replay does not have (see the module docs).
    pub skipped: usize,
    /// How the replayed run used its hosts ([`Usage`]).
    pub usage: Usage,
    /// Each host's states over the run (empty unless [`Replay::keep_timeline`]).
    pub timeline: Timeline,
}

/// A trace being replayed under one policy. Feed it every line of every file, oldest first.
#[derive(Debug)]
pub struct Replay {
    policy: Arc<Policy>,
    clock: TraceClock,
    alloc: Option<Allocator>,
    run: Option<String>,
    seq: u64,
    /// Recorded job and request ids → the replay's, and back.
    jobs: IdMap,
    reqs: IdMap,
    recorded: Side,
    replayed: Side,
    skipped: usize,
    usage: UsageMeter,
}

/// Ids of one side mapped to the other's (the same unless lines were lost).
#[derive(Debug, Default)]
struct IdMap {
    to_replay: BTreeMap<u64, u64>,
    to_recorded: BTreeMap<u64, u64>,
}

impl IdMap {
    fn insert(&mut self, recorded: u64, replay: u64) {
        self.to_replay.insert(recorded, replay);
        self.to_recorded.insert(replay, recorded);
    }
    fn replay(&self, recorded: u64) -> u64 {
        self.to_replay.get(&recorded).copied().unwrap_or(recorded)
    }
    fn recorded(&self, replay: u64) -> u64 {
        self.to_recorded.get(&replay).copied().unwrap_or(replay)
    }
}

impl Replay {
    /// A replay deciding with `policy`.
    pub fn new(policy: Arc<Policy>) -> Self {
        Replay {
            policy,
            clock: TraceClock::new(Instant::now(), 0),
            alloc: None,
            run: None,
            seq: 0,
            jobs: IdMap::default(),
            reqs: IdMap::default(),
            recorded: Side::default(),
            replayed: Side::default(),
            skipped: 0,
            usage: UsageMeter::default(),
        }
    }

    /// Keep each host's states over the run too ([`Outcome::timeline`], for the
    /// utilization chart).
    pub fn keep_timeline(&mut self) {
        self.usage.keep_timeline();
    }

    /// One line of a trace file; `Err` says what is wrong with it (the caller adds where).
    pub fn feed(&mut self, text: &str) -> Result<(), String> {
        self.seq += 1;
        let line: Line =
            serde_json::from_str(text).map_err(|e| format!("not a decision-trace line: {e}"))?;
        match line.body {
            Body::Start(start) => {
                self.start(*start);
                if let Some(alloc) = &self.alloc {
                    self.usage
                        .sample(line.t_us, line.unix_ms, alloc, Touched::All);
                }
                Ok(())
            }
            Body::Decision(d) => {
                self.recorded.note(d.what, self.seq, line.unix_ms);
                Ok(())
            }
            Body::Input(input) => self.input(input, line.t_us, line.unix_ms),
        }
    }

    /// The decisions compared and those that differ.
    pub fn finish(self) -> Outcome {
        let (rec, rep) = (&self.recorded, &self.replayed);
        let mut keys: Vec<&Key> = rec.decisions.keys().collect();
        keys.extend(
            rep.decisions
                .keys()
                .filter(|k| !rec.decisions.contains_key(k)),
        );
        let decisions = keys.len();
        let mut differences: Vec<(u64, Difference)> = keys
            .into_iter()
            .filter_map(|k| difference(k, rec, rep))
            .collect();
        differences.sort_by_key(|(seq, _)| *seq);
        Outcome {
            decisions,
            differences: differences.into_iter().map(|(_, d)| d).collect(),
            skipped: self.skipped,
            usage: self.usage.usage(),
            timeline: self.usage.timeline(),
        }
    }

    fn start(&mut self, start: Start) {
        let continues = self.alloc.is_some() && !start.gap && self.run.as_ref() == Some(&start.run);
        if continues {
            return;
        }
        self.usage.new_run();
        let alloc = Allocator::from_trace_state(start.state, self.policy.clone(), &self.clock);
        self.alloc = Some(alloc);
        self.run = Some(start.run);
        self.jobs = IdMap::default();
        self.reqs = IdMap::default();
    }

    fn input(&mut self, input: Input, t_us: u64, unix_ms: i64) -> Result<(), String> {
        let Some(mut alloc) = self.alloc.take() else {
            return Err("an input before any `start` record: a trace file opens with one".into());
        };
        let now = self.clock.instant(t_us);
        let mut ticked = Vec::new();
        if let Some(before) = now.checked_sub(TICK_LAG).filter(|_| t_us > 1_000_000) {
            ticked = alloc.handle(Input::Tick, before).effects;
            self.note_replayed(&ticked, unix_ms);
        }
        let named = touched_hosts(&input, &ticked);
        let applied = self.apply(&mut alloc, input, now);
        let mut touched = touched_hosts(&Input::Tick, applied.iter().flatten());
        touched.extend(named);
        self.usage
            .sample(t_us, unix_ms, &alloc, Touched::Named(&touched));
        self.alloc = Some(alloc);
        let effects = applied?;
        self.note_replayed(&effects, unix_ms);
        Ok(())
    }

    /// Makes one recorded input again, through [`Allocator::handle`] as the broker did.
    fn apply(
        &mut self,
        a: &mut Allocator,
        input: Input,
        now: Instant,
    ) -> Result<Vec<Effect>, String> {
        let created = match &input {
            Input::Register { job, .. } => Some(*job),
            Input::Allocate { req, .. } => Some(*req),
            _ => None,
        };
        let handled = a.handle(self.to_replay(input), now);
        match handled.answer {
            Answer::Job { job, .. } => self.jobs.insert(created.unwrap_or(job), job),
            Answer::Request(req) => self.reqs.insert(created.unwrap_or(req), req),
            Answer::Ignored(_) | Answer::Refused(_) => self.skipped += 1,
            Answer::Invalid(e) => return Err(e),
            Answer::Done
            | Answer::Ended { .. }
            | Answer::Uses(_)
            | Answer::Explained(_)
            | Answer::Retired(_) => {}
        }
        Ok(handled.effects)
    }

    /// `input` with the recorded side's job and request ids replaced by the replay's.
    fn to_replay(&self, input: Input) -> Input {
        let job = |j: JobId| self.jobs.replay(j);
        let req = |r: RequestId| self.reqs.replay(r);
        match input {
            Input::Register {
                job: id,
                info,
                resume,
                runs_on,
                module,
            } => Input::Register {
                job: id,
                info,
                resume: resume.map(job),
                runs_on,
                module,
            },
            Input::Allocate {
                job: j,
                req,
                symbolic,
            } => Input::Allocate {
                job: job(j),
                req,
                symbolic,
            },
            Input::Cancel { job: j, req: r } => Input::Cancel {
                job: job(j),
                req: req(r),
            },
            Input::GiveBack {
                job: j,
                host,
                req: r,
            } => Input::GiveBack {
                job: job(j),
                host,
                req: r.map(req),
            },
            Input::Released {
                job: j,
                host,
                req: r,
            } => Input::Released {
                job: job(j),
                host,
                req: r.map(req),
            },
            Input::End { job: j } => Input::End { job: job(j) },
            Input::AgentGone { job: j } => Input::AgentGone { job: job(j) },
            Input::Resumed { job: j } => Input::Resumed { job: job(j) },
            Input::UsesHosts { job: j, hosts } => Input::UsesHosts { job: job(j), hosts },
            Input::Explain { host, job: j } => Input::Explain {
                host,
                job: j.map(job),
            },
            other @ (Input::Host { .. }
            | Input::HostsRepeated { .. }
            | Input::ReleaseHost { .. }
            | Input::LeaseEnds { .. }
            | Input::Drain { .. }
            | Input::Resume { .. }
            | Input::Tick
            | Input::Policy { .. }
            | Input::AllocsRunning { .. }) => other,
        }
    }

    /// Notes the replay's decisions, with the recorded side's ids.
    fn note_replayed(&mut self, effects: &[Effect], unix_ms: i64) {
        for what in effects.iter().filter_map(What::of) {
            let what = match what {
                What::Grant { job, req, host } => What::Grant {
                    job: self.jobs.recorded(job),
                    req: self.reqs.recorded(req),
                    host,
                },
                What::Refuse { job, req, reason } => What::Refuse {
                    job: self.jobs.recorded(job),
                    req: self.reqs.recorded(req),
                    reason,
                },
                What::Wait {
                    job,
                    req,
                    position,
                    reason,
                } => What::Wait {
                    job: self.jobs.recorded(job),
                    req: self.reqs.recorded(req),
                    position,
                    reason,
                },
                What::Reclaim {
                    job,
                    host,
                    grace_us,
                } => What::Reclaim {
                    job: self.jobs.recorded(job),
                    host,
                    grace_us,
                },
                What::Force { job, host } => What::Force {
                    job: self.jobs.recorded(job),
                    host,
                },
            };
            self.replayed.note(what, self.seq, unix_ms);
        }
    }
}

/// The difference under `key`, with the order it sorts by; `None` when both sides agree.
fn difference(key: &Key, rec: &Side, rep: &Side) -> Option<(u64, Difference)> {
    let (a, b) = (rec.decisions.get(key), rep.decisions.get(key));
    if let (Some(a), Some(b)) = (a, b) {
        if a.text == b.text {
            return None;
        }
    }
    let first = match (a, b) {
        (Some(a), Some(b)) if b.seq < a.seq => b,
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => return None,
    };
    let req = match key {
        Key::Request(r) => Some(*r),
        Key::Reclaim(..) | Key::Force(..) => None,
    };
    let text = |side: Option<&Seen>, whole: &Side| {
        side.map_or_else(|| whole.absent(key), |s| s.text.clone())
    };
    Some((
        first.seq,
        Difference {
            unix_ms: first.unix_ms,
            host: a
                .and_then(|s| s.host.clone())
                .or_else(|| b.and_then(|s| s.host.clone())),
            job: first.job,
            req,
            recorded: text(a, rec),
            replayed: text(b, rep),
        },
    ))
}

impl Allocator {
    /// Whether allocation `alloc` is being taken back.
    pub(crate) fn is_releasing(&self, alloc: u64) -> bool {
        self.allocs
            .get(&alloc)
            .is_some_and(|a| matches!(a.state, AllocState::Releasing { .. }))
    }
}

#[cfg(test)]
#[path = "replay_tests.rs"]
mod tests;
