//! Leftovers: the host daemon ends every process of its user that carries a subagent tag
//! ([`proto::tag`]) for an allocation the broker no longer has. The subagent's guardian
//! normally ends its command's processes when the job gives the host back; this is the
//! host-level guarantee for when it cannot (a guardian SIGKILLed, an agent that answered a
//! reclaim without one): a process of an allocation that is over does not survive it, so a
//! host granted to the next job never runs the previous job's processes.
//!
//! - [`Sweeper`] is the pure decision: from the broker's word ([`Live`], from
//!   `FromBroker::LiveAllocs`), the tagged processes found and `now`, which signals to send:
//!   SIGTERM first, SIGKILL once [`SWEEP_GRACE`] has passed. An allocation at or above
//!   `issued_below` is one the daemon has not heard of yet (granted after the broker's last
//!   word): never touched. Without a word from the broker nothing is swept (the `local` and
//!   `manual` transports, where daemons share a machine, never send one).
//! - [`scan`] reads `/proc` — processes of this uid whose tag carries this lab's mark (see
//!   [`proto::tag`]: allocation ids are a broker's own), this process and the tag this
//!   daemon itself runs under excepted — and [`perform`] sends the signals, logging each:
//!   the edge.
//! - [`crate::lineage`] adds the processes that lost their tag but were noted below a
//!   subagent of this lab while it lived.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::{Duration, Instant},
};

use nix::{sys::signal::Signal, unistd::Pid};
use tracing::{info, warn};

/// Time between SIGTERM and SIGKILL for a leftover process (its allocation is already over:
/// the job's own grace period has passed or the job gave the host back).
pub const SWEEP_GRACE: Duration = Duration::from_secs(1);
/// How often the daemon looks for leftovers when nothing prompts it (a process started
/// under an allocation that was over before the daemon last looked).
pub const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The broker's word on which allocations are live.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Live {
    pub live: BTreeSet<u64>,
    /// Every allocation id below this has been issued.
    pub issued_below: u64,
}

impl Live {
    /// Whether an allocation is over: issued, and live no more.
    pub fn is_over(&self, alloc: u64) -> bool {
        alloc < self.issued_below && !self.live.contains(&alloc)
    }
}

/// A process carrying a subagent tag. `start` (its start time, from `/proc/PID/stat`) tells
/// it from a later process that got the same pid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tagged {
    pub pid: i32,
    pub start: u64,
    pub alloc: u64,
}

/// A signal the sweep sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sig {
    Term,
    Kill,
}

/// One signal to one leftover process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kill {
    pub target: Tagged,
    pub signal: Sig,
}

/// The sweep's state: the broker's last word and the processes already sent SIGTERM.
#[derive(Debug)]
pub struct Sweeper {
    live: Option<Live>,
    /// What was below a subagent of this lab, for processes that lost their tag.
    lineage: crate::lineage::Lineage,
    /// The noted processes without a tag already logged (pid, start): each is logged once.
    untagged_logged: BTreeSet<(i32, u64)>,
    /// Allocations whose reclaim deadline passed (`FromBroker::EndAllocs`): their
    /// processes end whatever `live` says, on every transport.
    ending: BTreeSet<u64>,
    /// (pid, start) → when it was sent SIGTERM.
    termed: BTreeMap<(i32, u64), Instant>,
    grace: Duration,
    last: Option<Instant>,
}

impl Default for Sweeper {
    fn default() -> Self {
        Self::new(SWEEP_GRACE)
    }
}

impl Sweeper {
    pub fn new(grace: Duration) -> Self {
        Self {
            live: None,
            lineage: Default::default(),
            untagged_logged: BTreeSet::new(),
            ending: BTreeSet::new(),
            termed: BTreeMap::new(),
            grace,
            last: None,
        }
    }

    /// Takes the broker's latest word; true when it changed (a sweep is due at once).
    pub fn set_live(&mut self, live: Live) -> bool {
        let changed = self.live.as_ref() != Some(&live);
        self.live = Some(live);
        changed
    }

    /// Takes the broker's word on the allocations past their deadline; true when it
    /// changed (a sweep is due at once).
    pub fn set_ending(&mut self, ending: BTreeSet<u64>) -> bool {
        let changed = self.ending != ending;
        self.ending = ending;
        changed
    }

    /// Whether the broker waits for processes of allocations past their deadline to end
    /// (the daemon then looks at every poll, and reports as soon as they are gone).
    pub fn ends_allocs(&self) -> bool {
        !self.ending.is_empty()
    }

    /// Whether a sweep is due at `now`: processes wait for their SIGKILL, allocations past
    /// their deadline wait to end, or [`SWEEP_EVERY`] has passed since the last one. Never
    /// before the broker's first word.
    pub fn due(&self, now: Instant) -> bool {
        let quiet_long = match self.last {
            None => true,
            Some(at) => now.saturating_duration_since(at) >= SWEEP_EVERY,
        };
        let told = self.live.is_some() || !self.ending.is_empty();
        told && (!self.termed.is_empty() || !self.ending.is_empty() || quiet_long)
    }

    /// Whether the process of allocation `alloc` is to end.
    fn is_over(&self, alloc: u64) -> bool {
        self.ending.contains(&alloc) || self.live.as_ref().is_some_and(|l| l.is_over(alloc))
    }

    /// The signals to send now to the tagged processes `found` on the host.
    pub fn plan(&mut self, found: &[Tagged], now: Instant) -> Vec<Kill> {
        if self.live.is_none() && self.ending.is_empty() {
            return Vec::new();
        }
        self.last = Some(now);
        let over: Vec<Tagged> = found
            .iter()
            .filter(|p| self.is_over(p.alloc))
            .copied()
            .collect();
        // Processes gone (or whose pid another process now has) are forgotten.
        self.termed
            .retain(|key, _| over.iter().any(|p| (p.pid, p.start) == *key));
        let mut kills = Vec::new();
        for target in over {
            let signal = match self.termed.get(&(target.pid, target.start)) {
                None => {
                    self.termed.insert((target.pid, target.start), now);
                    Sig::Term
                }
                Some(&at) if now.saturating_duration_since(at) >= self.grace => Sig::Kill,
                Some(_) => continue,
            };
            kills.push(Kill { target, signal });
        }
        kills
    }
}

/// Where to look and what is ours: the lab's mark, and the tag this daemon itself runs
/// under (when a job's remote command started it), never swept.
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    pub proc_root: &'a Path,
    pub lab_mark: &'a str,
    pub own_tag: Option<&'a str>,
}

/// The processes of this uid under `scope.proc_root` tagged with this lab's mark, but this
/// process and those carrying `scope.own_tag`.
pub fn scan(scope: &Scope) -> Vec<Tagged> {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir(scope.proc_root) else {
        return Vec::new();
    };
    let mut found: Vec<Tagged> = entries
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<i32>().ok()?, e)))
        .filter(|(pid, e)| *pid != me && e.metadata().is_ok_and(|m| m.uid() == uid))
        .filter_map(|(pid, e)| {
            let alloc = lab_alloc(scope, &std::fs::read(e.path().join("environ")).ok()?)?;
            let start = start_time(&std::fs::read_to_string(e.path().join("stat")).ok()?)?;
            Some(Tagged { pid, start, alloc })
        })
        .collect();
    found.sort();
    found
}

/// The allocation of a process whose environment block is `environ`, when it carries a
/// tag of this lab (`scope.lab_mark`) other than `scope.own_tag`.
pub fn lab_alloc(scope: &Scope, environ: &[u8]) -> Option<u64> {
    let tag = tag_of(environ)?;
    if scope.own_tag == Some(tag.as_str()) {
        return None;
    }
    let parsed = proto::tag::parse(&tag)?;
    (parsed.lab.as_deref() == Some(scope.lab_mark)).then_some(parsed.alloc)
}

/// The value of the subagent tag in an environment block (`VAR=value\0…`).
pub fn tag_of(environ: &[u8]) -> Option<String> {
    let prefix = format!("{}=", proto::tag::SUBAGENT_TAG_VAR);
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(String::from)
}

/// Field 22 of `/proc/PID/stat` (start time, clock ticks after boot). The command name
/// (field 2, in parentheses) may hold spaces and parentheses: fields are counted after the
/// last `)`.
pub fn start_time(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Sends each signal, if the process is still the one planned for (same start time), and
/// logs it.
pub fn perform(proc_root: &Path, kills: &[Kill]) {
    for kill in kills {
        let Tagged { pid, start, alloc } = kill.target;
        let same = std::fs::read_to_string(proc_root.join(pid.to_string()).join("stat"))
            .ok()
            .and_then(|s| start_time(&s))
            == Some(start);
        if !same {
            continue;
        }
        let (signal, name) = match kill.signal {
            Sig::Term => (Signal::SIGTERM, "SIGTERM"),
            Sig::Kill => (Signal::SIGKILL, "SIGKILL"),
        };
        let comm = std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default();
        warn!(
            pid,
            alloc,
            %comm,
            signal = name,
            "ending a process of an allocation that is over (its job no longer holds this host)"
        );
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
    }
}

/// One sweep at `now`: scan (the tagged processes, and those noted below a subagent of
/// this lab, [`crate::lineage`]), decide, signal. Returns the allocations found (ascending).
pub fn sweep(sweeper: &mut Sweeper, scope: &Scope, now: Instant) -> Vec<u64> {
    let mut found = scan(scope);
    let own_alloc = scope
        .own_tag
        .and_then(proto::tag::parse)
        .map(|tag| tag.alloc);
    let table = crate::lineage::read(scope);
    let mut untagged = BTreeSet::new();
    for noted in sweeper.lineage.update(&table, own_alloc) {
        if !found.iter().any(|t| t.pid == noted.pid) {
            untagged.insert((noted.pid, noted.start));
            if !sweeper.untagged_logged.contains(&(noted.pid, noted.start)) {
                log_untagged(scope.proc_root, &noted);
            }
            found.push(noted);
        }
    }
    sweeper.untagged_logged = untagged;
    found.sort();
    let kills = sweeper.plan(&found, now);
    perform(scope.proc_root, &kills);
    allocs_of(&found)
}

/// Says, once per process, that one below a subagent carries no tag of this lab (it
/// cleared or replaced its environment): it is known only by the note, and ends with its
/// allocation all the same.
fn log_untagged(proc_root: &Path, noted: &Tagged) {
    let comm = std::fs::read_to_string(proc_root.join(noted.pid.to_string()).join("comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_default();
    info!(
        pid = noted.pid,
        alloc = noted.alloc,
        %comm,
        "noted a process below a subagent that carries no tag (its environment was cleared \
         or replaced): it ends with its allocation"
    );
}

/// The allocations of `found`, ascending, each once.
pub fn allocs_of(found: &[Tagged]) -> Vec<u64> {
    let allocs: BTreeSet<u64> = found.iter().map(|p| p.alloc).collect();
    allocs.into_iter().collect()
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
