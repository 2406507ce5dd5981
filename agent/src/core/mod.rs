//! The agent core: everything the agent decides about its job, as one pure state machine.
//! [`AgentCore::handle`] takes an [`Input`] and the time, changes the job's state and returns
//! the [`Output`]s the shell (`crate::run`) must perform, in order. No sockets, no clock, no
//! spawned tasks, no `/proc`: the shell reads the world into inputs and performs outputs.
//! The core imports no I/O module of the agent: what both need lives here (`module_calls`,
//! `link_loss`) or in a pure module ([`crate::instances`]), and the I/O modules import it.
//!
//! # Layout
//! - `mod.rs` (this file): [`Input`], [`Output`], [`Timer`], [`CoreConfig`], [`AgentCore`]
//!   and the dispatch of inputs by the job's [`Phase`].
//! - `module_calls`: a module's programs, the calls to run them and their outcomes (the
//!   shell's `crate::module` runs them); `in_lineage`.
//! - `link_loss`: how long a subagent goes on without its agent (the guardian in
//!   `crate::subagent` keeps these limits; the core counts on them).
//! - `shims`: shim calls of a plain job: a request per call, instance names bound to one
//!   host ([`crate::instances`] decides which), grants offered to the waiting shims; the
//!   `taken_back` question of a shim whose remote shell exited 0.
//! - `allocs`: the job's allocations: subagents attaching and leaving, reclaims, hand-backs,
//!   launchers that ended without starting a subagent, the hosts file.
//! - `module_job`: module jobs (DESIGN.md flow 6): phase 1 at the broker, `NAME-grow` on a
//!   grant, `NAME-shrink` before the subagents on a reclaim, `NAME-halt` at the end.
//! - `end`: the broker lost and back, the app's exit and the end sequence.
//! - `tests`: scenario tests, microseconds each; `walk_tests`: seeded random walks checked
//!   against a model of what the broker, the shims and the hosts file saw.
//!
//! # Model
//! - An **allocation** is a host the broker granted: `granted → used` (a subagent attached)
//!   `→ reclaiming{deadline}` (the broker wants it back) `→ gone` (removed, with `GiveBack`
//!   or `Released` to the broker). A host without a subagent stays while its launcher (the
//!   shim, then the real remote shell) may still start one.
//! - A **request** is a shim's call waiting for the broker's answer; the shim is known by its
//!   connection id ([`ShimId`]), the shell holds its reply channel.
//! - A **grant** is offered to the waiting shim(s) with [`Output::Offer`]; the shell answers
//!   at once with [`Input::Offered`] (whether any shim was still there to take it), and a
//!   grant nobody took goes back to the broker.
//! - **Timers** are outputs ([`Output::SetTimer`]); the shell feeds each back as
//!   [`Input::Timer`] with the same [`Timer`] at its time. A timer is never cancelled: the
//!   core checks, when it fires, that it still means something.
//! - The job's **phase**: running, halting (module jobs: `NAME-halt` runs), draining
//!   (subagents told to end; waiting for them and for the launchers still running),
//!   confirming (`end_job` told; waiting for the broker's `job_ended`), ended
//!   ([`Output::Exit`] given).
//! - A **launcher** is a process a shim's `Granted` answer went to (the shim, which runs the
//!   remote shell as its child): while it runs it may still start a subagent on that host, so
//!   the job's end waits for it ([`Output::WatchLauncher`] … [`Input::LauncherExited`]).
//! - An allocation the broker **took back** (a `reclaim` while the job held it) is
//!   remembered (the last [`proto::agent::TAKEN_BACK_MEMORY`]), so a shim whose remote shell
//!   exited 0 learns that its command was ended ([`Input::ShimTakenBack`]): over rsh the
//!   remote status is lost.
//!
//! # Choices
//! - **Feedback inputs come first.** [`Output::Offer`] and [`Output::Reconnect`] are answered
//!   by the shell with an input ([`Input::Offered`]; [`Input::BrokerBack`] or
//!   [`Input::BrokerGone`]) before it feeds anything else, and the outputs of that answer are
//!   performed before the rest of the batch: the sequence is the one a blocking call would
//!   give.
//! - **Logs stay here** (`tracing`): they are for people and change nothing; everything a
//!   peer must learn is an output (a note in `rb jobs` is [`Output::ToBroker`]).
//! - **Outside the running phase** shim connections are closed without an answer, a
//!   subagent that attaches is told to end its command at once, broker messages other than
//!   `job_ended` and signals are ignored: the job is ending.
//!
//! # The JEL pool in this core
//! The pure `jel::pool::Pool` (its module doc, "Hosting a pool") becomes one more part of
//! [`AgentCore`], fed from the places below, so that pool events come from one place:
//! The core says what the pool must learn as [`Output::Pool`] ([`PoolEvent`]); the shell
//! hosts the pool (`jel::host::PoolHost`, which owns the sockets and the pool state) and
//! performs each before the next output:
//! - a grant (`Broker(Granted)`, in `allocs::granted`) → `HostGranted`;
//! - a reclaim (`Broker(Reclaim)`, in `allocs::reclaim` and `module_job::module_shrink`) →
//!   `Reclaim` with the deadline, emitted *before* any `ToSub(Terminate)` or `NAME-shrink`;
//! - a host leaving the job (`allocs::remove_alloc`: hand-backs, releases after a reclaim or
//!   a shrink, grants nobody took) → `HostReleased`;
//! - the job's end (`end::exit`) → `Terminate`, after the end sequence, right before
//!   [`Output::Exit`].
//!
//! - a subagent link lost while the host is still the job's (`allocs::sub_gone`) →
//!   [`Timer::LinkLost`] at the subagent's own deadline for ending its processes
//!   ([`link_loss::ENDS_AFTER_LOSS`]), never earlier → `LinkLost` (`host_lost` when no
//!   subagent of the host is attached then).
//!
//! The relay of members on granted hosts (their lines) does not pass through the core: the
//! shell routes it with [`crate::jelrelay::Routes`].

mod allocs;
mod end;
pub mod link_loss;
pub mod module_calls;
mod module_job;
mod shims;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod walk_tests;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    path::PathBuf,
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;
use proto::{
    agent::ShimReply,
    msg::{FromBroker, ToBroker},
};

use self::module_calls::{Call, Outcome, Programs};
use crate::instances::Instances;

pub use self::shims::Caller;
use self::{
    allocs::{Alloc, TakenBack},
    module_job::ModuleJob,
    shims::Offer,
};

/// An allocation's id (the broker's).
pub type AllocId = u64;
/// A request's id (the agent's, per job).
pub type ReqId = u64;
/// A shim connection's id (the shell's, unique while the agent runs).
pub type ShimId = u64;
/// A subagent connection's id (the shell's, unique while the agent runs).
pub type SubId = u64;

/// What a shim needs to launch a granted host's command, besides the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantTemplate {
    /// The `rb-subagent` program (next to `agent`).
    pub subagent_program: PathBuf,
    /// Where subagents reach the agent (`IP:PORT`).
    pub sub_addr: String,
    /// The secret file subagents authenticate with.
    pub secret_file: PathBuf,
    /// The job's preload library, for remote commands too.
    pub preload: Option<PathBuf>,
    /// The lab's mark, for the tag of remote commands (`--lab-mark`).
    pub lab_mark: Option<String>,
    /// The real remote shell, as the broker gave it.
    pub remote_shell: Vec<String>,
    /// Where subagents append their step times (`--step-times`): the agent's own
    /// `RB_STEP_TIMES` (a benchmark's, see the `steptimes` crate); none normally.
    pub step_times: Option<PathBuf>,
}

/// A module job's settings (`module="NAME"`).
#[derive(Debug, Clone)]
pub struct ModuleConfig {
    /// The module's programs as found on the search path.
    pub programs: Programs,
    /// How long a grow or halt may run.
    pub timeout: Duration,
}

/// The core's settings, fixed for the job's life.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// The grace a subagent that attaches to a reclaimed host without a deadline gets.
    pub grace_ms: u64,
    pub grant: GrantTemplate,
    pub module: Option<ModuleConfig>,
    /// The agent's own pid (named in logs as the maker of requests it asks again).
    pub agent_pid: u32,
}

/// Everything that happens to the agent, as the shell reads it.
#[derive(Debug)]
pub enum Input {
    /// The job started (the app runs): say which module programs are missing.
    Started,
    /// A shim asks for a host for `symbolic`. `lineage`: the shim's pid and its ancestors
    /// (`crate::ancestry::lineage`), read as the call arrived; needed by module jobs only.
    ShimAllocate {
        shim: ShimId,
        symbolic: String,
        pid: u32,
        lineage: Vec<u32>,
    },
    /// A shim asks how to reach `host`, one of the job's hosts, under a subagent.
    ShimAttach { shim: ShimId, host: String },
    /// A shim whose remote shell for `alloc` exited 0 asks whether the broker took `alloc`
    /// back from the job (answered in every phase: the job's end does not change it). The
    /// shell answers these from [`AgentCore::taken_back_book`] at once, with the same
    /// answer as this input gives.
    ShimTakenBack { shim: ShimId, alloc: AllocId },
    /// A job process looked a symbolic name up (`librb_preload.so`).
    Resolved { symbolic: String, pid: u32 },
    /// The shim passed a call to this real host through.
    Named { host: String },
    /// Which remote shell a shim call used (`ssh: anyLinux-1: granted node03 (allocation
    /// 2) over ssh`): a job note for `rb jobs`, once per distinct line.
    RouteUsed { line: String },
    /// A subagent of `alloc` has something for people (e.g. its host's runtime directory
    /// was refused): the job's stderr and `rb jobs`, once per distinct line.
    SubNote { alloc: AllocId, text: String },
    /// A shim's connection closed.
    ShimGone { shim: ShimId },
    /// The answer to [`Output::Offer`]: whether any of its shims took the grant.
    Offered { alloc: AllocId, reached: bool },
    /// A subagent for `alloc` attached.
    SubConnected { alloc: AllocId, sub: SubId },
    /// A subagent's connection closed.
    SubGone { alloc: AllocId, sub: SubId },
    /// A message from the broker.
    Broker(FromBroker),
    /// The broker connection failed.
    BrokerLost,
    /// The answer to [`Output::Reconnect`]: the broker is back and resumed the job.
    BrokerBack,
    /// The answer to [`Output::Reconnect`]: the broker did not come back in time, or no
    /// longer knows the job.
    BrokerGone,
    /// A module program finished.
    ModuleDone(Outcome),
    /// The launcher `pid` watched by [`Output::WatchLauncher`] ended.
    LauncherExited { alloc: AllocId, pid: u32 },
    /// A timer set by [`Output::SetTimer`] is due.
    Timer(Timer),
    /// The app ended with this exit code (rsh style: 128+signal when killed).
    AppExited { status: i32 },
    /// The agent received a signal (SIGTERM, SIGINT, SIGHUP).
    Signal(Signal),
}

/// What the shell must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send to the broker.
    ToBroker(ToBroker),
    /// Answer a shim (a `Queued` answer is not its last).
    ReplyShim { shim: ShimId, reply: ShimReply },
    /// Offer a grant to these shims, then answer with [`Input::Offered`] at once.
    Offer {
        alloc: AllocId,
        shims: Vec<ShimId>,
        reply: ShimReply,
    },
    /// Close a shim's connection without an answer.
    CloseShim { shim: ShimId },
    /// Send to a subagent.
    ToSub { sub: SubId, msg: FromBroker },
    /// Close a subagent's connection.
    CloseSub { sub: SubId },
    /// Queue a module program run; its outcome comes back as [`Input::ModuleDone`].
    RunModule(Call),
    /// Skip the module calls that have not started (the job is ending), except halts.
    SkipQueuedModuleCalls,
    /// Report [`Input::LauncherExited`] once process `pid` has ended. Until then the core
    /// counts `pid` as a launcher of `alloc`'s host: the job's end waits for it.
    WatchLauncher { alloc: AllocId, pid: u32 },
    /// Feed [`Input::Timer`] with `timer` at `at`.
    SetTimer { timer: Timer, at: Instant },
    /// Write the job's hosts file: `(host, address, alloc)` per line.
    WriteHosts(Vec<(String, String, AllocId)>),
    /// Send a signal to the app's process group.
    Signal(Signal),
    /// Get the broker back (same job) by `until`, re-registering; then answer with
    /// [`Input::BrokerBack`] or [`Input::BrokerGone`].
    Reconnect { until: Instant },
    /// Tell the job's JEL pool; performed (its events written) before the next output.
    Pool(PoolEvent),
    /// The job is over: exit with `status`.
    Exit { status: i32 },
}

/// A job event for the job's JEL pool (`jel::host::PoolHost`), in the order the pool must
/// see it: a reclaim's `Reclaim` comes before the subagents are told to end that host's
/// processes (or `NAME-shrink` runs), so `vacate` is in the stream before any SIGTERM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolEvent {
    /// The broker granted `host` to the job: `host_granted`.
    HostGranted { host: String },
    /// The broker takes `host` back; what is left on it is killed at `deadline` (the
    /// shell turns it into Unix ms): `vacate`.
    Reclaim { host: String, deadline: Instant },
    /// `host` left the job (released after a reclaim, given back, a grant nobody took):
    /// its members still there died, then `host_released`.
    HostReleased { host: String },
    /// A subagent link of `alloc` on `host` was lost and the subagent's own deadline for
    /// ending its command has passed ([`link_loss::ENDS_AFTER_LOSS`]): the JEL
    /// connections it relayed are ended — `died{host_lost}` for the host's members when
    /// `host_lost` (no subagent of the host is attached), else closed (`died{exited}`).
    LinkLost {
        alloc: AllocId,
        host: String,
        host_lost: bool,
    },
    /// The job ends (right before [`Output::Exit`]): `closed`, `terminated`.
    Terminate,
}

/// A timer's purpose (its id): fed back as it was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    /// A reclaimed host whose launch has not attached a subagent: the grace is over.
    LaunchWindow { alloc: AllocId },
    /// The launcher of `alloc` ended a while ago: a late subagent had its time to attach.
    LateAttach { alloc: AllocId },
    /// A subagent link of `alloc` was lost a while ago: its own deadline for ending its
    /// command has passed.
    LinkLost { alloc: AllocId },
    /// The module's halt has had its time.
    HaltWait,
    /// The end of the job has waited long enough for subagents and launchers.
    EndWait,
    /// The broker has not confirmed the job's end in time: exit anyway.
    EndAck,
}

/// Where the job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    /// `NAME-halt` runs; the app ended with `status`.
    Halting {
        status: i32,
    },
    /// Subagents were told to end; waiting for them and for launchers still running.
    Draining {
        status: i32,
    },
    /// `end_job` is (or is to be) told to the broker; waiting until `until` for its
    /// `job_ended` (the end is saved), reconnecting and telling it again when it is lost.
    Confirming {
        status: i32,
        until: Instant,
    },
    /// [`Output::Exit`] was given.
    Ended,
}

/// The broker connection as the core knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    Live,
    /// Failed and not (yet) back: during the job's end, got back only to tell it the end.
    Lost,
    /// Did not come back in time, or no longer knows the job.
    Gone,
}

/// Collected outputs of one input.
type Out = Vec<Output>;

/// The agent's state.
#[derive(Debug)]
pub struct AgentCore {
    cfg: CoreConfig,
    phase: Phase,
    next_req: ReqId,
    /// Requests waiting for the broker's answer, by request id.
    pending: BTreeMap<ReqId, shims::Pending>,
    /// Grants offered to shims, waiting for [`Input::Offered`].
    offers: HashMap<AllocId, Offer>,
    allocs: BTreeMap<AllocId, Alloc>,
    /// Which host each instance name of the job is bound to.
    instances: Instances<Caller>,
    /// Set for module jobs.
    module: Option<ModuleJob>,
    broker: Link,
    /// Allocations the broker took back, oldest first (at most
    /// [`proto::agent::TAKEN_BACK_MEMORY`]).
    taken_back: VecDeque<TakenBack>,
    /// How many allocations were ever added to `taken_back` (changes with it).
    taken_back_added: u64,
    /// The [`Input::RouteUsed`] lines already noted (at most [`ROUTE_NOTES`]).
    route_notes: HashSet<String>,
    /// The [`Input::SubNote`] lines already noted (at most [`ROUTE_NOTES`]).
    sub_notes: HashSet<String>,
}

/// How many distinct remote-shell lines a job notes for `rb jobs` (the broker keeps the
/// last few; this bounds the agent's memory for a job that names thousands of hosts).
pub const ROUTE_NOTES: usize = 256;
/// The longest subagent note kept (characters).
pub const SUB_NOTE_CHARS: usize = 400;

impl AgentCore {
    pub fn new(cfg: CoreConfig) -> Self {
        let module = cfg.module.clone().map(ModuleJob::new);
        Self {
            cfg,
            phase: Phase::Running,
            next_req: 1,
            pending: BTreeMap::new(),
            offers: HashMap::new(),
            allocs: BTreeMap::new(),
            instances: Instances::default(),
            module,
            broker: Link::Live,
            taken_back: VecDeque::new(),
            taken_back_added: 0,
            route_notes: HashSet::new(),
            sub_notes: HashSet::new(),
        }
    }

    /// The allocations the broker took back (`alloc → (host, why)`), what a shim's
    /// `taken_back` question is answered from, and a number that changes whenever they do.
    /// The shell publishes them after each input, so the shims' listener answers at once
    /// instead of queueing the question behind the job's other events (the host's give-back
    /// among them, right when a remote shell ends).
    pub fn taken_back_book(&self) -> (u64, HashMap<AllocId, (String, String)>) {
        let book = self
            .taken_back
            .iter()
            .map(|t| (t.alloc, (t.host.clone(), t.message.clone())))
            .collect();
        (self.taken_back_added, book)
    }

    /// Changes whenever [`Self::taken_back_book`] does.
    pub fn taken_back_version(&self) -> u64 {
        self.taken_back_added
    }

    /// The job's phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The host of allocation `alloc`, while the job holds it (a subagent's JEL members are
    /// on it).
    pub fn host_of(&self, alloc: AllocId) -> Option<&str> {
        self.allocs.get(&alloc).map(|a| a.host.as_str())
    }

    /// Whether any allocation of the job holds `host` (the host's shared ssh connection
    /// stays while one does).
    pub fn holds_host(&self, host: &str) -> bool {
        self.allocs.values().any(|a| a.host == host)
    }

    /// Whether this is a module job (the shell then reads a shim's lineage).
    pub fn is_module_job(&self) -> bool {
        self.module.is_some()
    }

    /// Handles one input at `now`; the outputs to perform, in order.
    pub fn handle(&mut self, input: Input, now: Instant) -> Vec<Output> {
        let mut out = Vec::new();
        match self.phase {
            Phase::Running => self.running(input, now, &mut out),
            Phase::Halting { .. } | Phase::Draining { .. } | Phase::Confirming { .. } => {
                self.ending(input, now, &mut out)
            }
            Phase::Ended => {}
        }
        out
    }

    fn running(&mut self, input: Input, now: Instant, out: &mut Out) {
        match input {
            Input::Started => self.announce_module(out),
            Input::ShimAllocate {
                shim,
                symbolic,
                pid,
                lineage,
            } if self.module.is_some() => self.phase_one(shim, symbolic, pid, &lineage, now, out),
            Input::ShimAllocate {
                shim,
                symbolic,
                pid,
                ..
            } => self.shim_allocate(symbolic, Caller { shim, pid }, out),
            Input::ShimAttach { shim, host } => self.shim_attach(shim, &host, out),
            Input::ShimTakenBack { shim, alloc } => self.shim_taken_back(shim, alloc, out),
            Input::Resolved { symbolic, pid } => self.resolved(symbolic, pid, now, out),
            Input::Named { host } => self.named(host, out),
            Input::RouteUsed { line } => self.route_used(line, out),
            Input::SubNote { alloc, text } => self.sub_note(alloc, &text, out),
            Input::ShimGone { shim } => self.shim_gone(shim, out),
            Input::Offered { alloc, reached } => self.offered(alloc, reached, out),
            Input::SubConnected { alloc, sub } => self.sub_connected(alloc, sub, now, out),
            Input::SubGone { alloc, sub } => self.sub_gone(alloc, sub, now, out),
            Input::Broker(msg) => self.on_broker(msg, now, out),
            Input::BrokerLost => self.broker_lost(now, out),
            Input::BrokerBack => self.broker_back(out),
            Input::BrokerGone => self.broker_gone(out),
            Input::ModuleDone(outcome) => self.module_done(outcome, now, out),
            Input::LauncherExited { alloc, pid } => self.launcher_exited(alloc, pid, now, out),
            Input::Timer(Timer::LaunchWindow { alloc }) => self.launch_window_over(alloc, out),
            Input::Timer(Timer::LateAttach { alloc }) => self.launcher_gone(alloc, out),
            Input::Timer(Timer::LinkLost { alloc }) => self.link_loss_over(alloc, out),
            Input::Timer(Timer::HaltWait | Timer::EndWait | Timer::EndAck) => {}
            Input::AppExited { status } => self.app_exited(status, now, out),
            Input::Signal(sig) => out.push(Output::Signal(sig)),
        }
    }

    fn on_broker(&mut self, msg: FromBroker, now: Instant, out: &mut Out) {
        match msg {
            FromBroker::Queued {
                req,
                position,
                reason,
            } => self.queued(req, ShimReply::Queued { position, reason }, out),
            FromBroker::Granted {
                req,
                alloc,
                host,
                address,
                instance,
            } => self.granted(req, alloc, host, address, instance.is_some(), out),
            FromBroker::Refused { req, message } => self.refused(req, message, out),
            FromBroker::Reclaim {
                alloc,
                host,
                grace_ms,
            } => self.reclaim(alloc, &host, grace_ms, now, out),
            other => tracing::warn!(?other, "unexpected message from the broker"),
        }
    }

    /// A shim call's remote shell, noted for `rb jobs` the first time its line is seen.
    fn route_used(&mut self, line: String, out: &mut Out) {
        if self.route_notes.len() >= ROUTE_NOTES || !self.route_notes.insert(line.clone()) {
            return;
        }
        tracing::info!("{line}");
        out.push(Output::ToBroker(ToBroker::JobNote { text: line }));
    }

    /// A subagent's note, with its host, on the job's stderr and in `rb jobs` the first time
    /// it is seen (a peer's text: cut to [`SUB_NOTE_CHARS`]; at most [`ROUTE_NOTES`] kept).
    fn sub_note(&mut self, alloc: AllocId, text: &str, out: &mut Out) {
        let host = self.host_of(alloc).unwrap_or("a host").to_string();
        let text: String = text.chars().take(SUB_NOTE_CHARS).collect();
        let line = format!("{host}: {text}");
        if self.sub_notes.len() >= ROUTE_NOTES || !self.sub_notes.insert(line.clone()) {
            return;
        }
        self.note(line, out);
    }

    /// A note people should see: the agent's log and `rb jobs`.
    fn note(&self, text: String, out: &mut Out) {
        tracing::warn!("{text}");
        out.push(Output::ToBroker(ToBroker::JobNote { text }));
    }

    fn tell_broker(&self, msg: ToBroker, out: &mut Out) {
        out.push(Output::ToBroker(msg));
    }
}
