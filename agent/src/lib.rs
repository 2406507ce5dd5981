//! The agent layer: `agent` wraps a job on the submitting machine; `rb-subagent` guards the
//! job's processes on each machine the job reaches.
//!
//! # Layout
//! - [`ancestry`]: which process descends from which (`/proc/PID/stat`).
//! - [`cli`]: flags and the job spec → [`cli::AgentConfig`].
//! - [`core`]: the agent core: every decision about the job, pure ([`core::AgentCore`]).
//! - [`link`]: finding the broker (or starting an embedded one), authenticating, registering.
//! - [`instances`]: which host each instance name (`anyLinux-1`) of the job is bound to.
//! - [`jobenv`]: the job's private dir, the shim first in `PATH`, launcher variables.
//! - [`jobkey`]: the job's own key, which its subagents prove (not the lab secret).
//! - [`listeners`]: the shim socket and the subagent port.
//! - [`module`]: finding and running a job's `NAME-grow|shrink|halt` programs.
//! - [`program`]: whether the app can start at all (exit 127/126 as shells do).
//! - [`run`]: the agent's shell: starts the job, feeds what happens to [`core::AgentCore`]
//!   and performs what it decides.
//! - [`simple_command`]: remote commands that need no shell (exec'd directly).
//! - [`subagent`]: the subagent: runs the remote command as its own process group with the
//!   caller's stdio, and a guardian process that reports to the agent and ends the group on
//!   reclaim or when the agent disappears.
//! - [`subjel`]: the subagent's JEL socket for its command, relayed over its agent link.
//! - [`jelrelay`]: the agent's side of that relay: which pool connection is which
//!   subagent's (pure).
//! - [`whereami`]: the machine the agent runs on, for the registration.
//! - [`jobguard`]: the job's guardian on the front end: outlives the agent and ends what
//!   is left of the job on this machine when the agent is gone, however it ended.
//! - [`watch`]: what a guardian watches and ends: a process group, tagged processes and a
//!   part of the process tree.
//! - [`proctree`]: the process tree (`/proc`), and making a process a child subreaper.
//! - [`reaper`]: the agent as its job's subreaper: reaping what the job abandons, ending
//!   everything below the agent at the job's end.
//! - [`mux`]: closing the job's ssh master connections (one per granted host).

pub mod ancestry;
pub mod cli;
pub mod core;
pub mod instances;
pub mod jelrelay;
pub mod jobenv;
pub mod jobguard;
pub mod jobkey;
pub mod launcher;
pub mod link;
pub mod listeners;
pub mod module;
pub mod mux;
pub mod proctree;
pub mod program;
pub mod reaper;
pub mod run;
pub mod simple_command;
pub mod subagent;
pub mod subagent_cli;
pub mod subjel;
pub mod watch;
pub mod whereami;
