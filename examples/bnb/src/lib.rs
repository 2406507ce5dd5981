//! `rb-bnb`: branch-and-bound TSP, the Jicos class of adaptive jobs, under ResourceBroker.
//!
//! The process the agent starts stands in the job's pool (JEL) for `master` and, once it
//! wins, splits the search into subtrees and hands them to workers: one in its own process
//! and one per host it is granted (`rsh anyLinux rb-bnb --worker …`, asked for while tasks
//! wait). Workers share every better tour at once (the upper bound that prunes everyone's
//! search). When the job's stream says a host is being vacated, or a worker died or left,
//! that worker's task is handed out again; each task is counted once.
//!
//! Modules: [`tsp`] the problem and the search (pure), [`board`] the task board (pure),
//! [`wire`] the master–worker lines, [`master`] and [`worker`] the processes.

pub mod board;
pub mod master;
pub mod tsp;
pub mod wire;
pub mod worker;

use std::io;

/// Why rb-bnb could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BnbError {
    #[error(transparent)]
    Jel(#[from] jel::JelError),
    #[error("cannot reach the master at any of {addrs}: {source}\nhelp: the master's host must be reachable from the granted hosts (its addresses are given on the worker's command line)")]
    Master { addrs: String, source: io::Error },
    #[error("another process of this job is the master (member {winner})\nhelp: start rb-bnb once per job; workers are started by the master")]
    NotMaster { winner: String },
    #[error("cannot listen for workers: {0}")]
    Listen(io::Error),
    #[error("no worker is left and none can be started\nhelp: give rb-bnb a local worker (--local-workers 1) or a lab with free hosts")]
    NoWorkers,
}

impl BnbError {
    /// The exit code: JEL's own (2 outside a job), 69 when a peer cannot be reached, 1 else.
    pub fn exit_code(&self) -> i32 {
        match self {
            BnbError::Jel(e) => e.exit_code(),
            BnbError::Master { .. } | BnbError::Listen(_) => 69,
            BnbError::NotMaster { .. } | BnbError::NoWorkers => 1,
        }
    }
}
