//! The `rb-subagent` command line (its own `main` parses it; `rb-docgen` renders its man
//! page from it). `local-shell` and `guard-job` are dispatched by hand before clap.

use std::path::PathBuf;

use clap::Parser;

/// Guards one remote command of a ResourceBroker job (started by the rsh shim).
#[derive(Debug, Parser)]
#[command(name = "rb-subagent", version)]
pub struct Args {
    /// The job's agent (IP:port).
    #[arg(long)]
    pub agent: String,
    /// Allocation id this command runs under.
    #[arg(long)]
    pub alloc: u64,
    /// The file holding the key this job's agent accepts (the job's key, see
    /// `agent::jobkey`; the key itself is never on a command line).
    #[arg(long, default_value = "~/.config/rb/secret")]
    pub secret_file: String,
    /// The job's preload library (module jobs): put first in the command's LD_PRELOAD when
    /// this host has it at the same path, else ignored.
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// The lab's public mark (hex), put in the command's tag so that the lab's host daemon
    /// can end what is left of it once the allocation is over.
    #[arg(long)]
    pub lab_mark: Option<String>,
    /// Append the subagent's step times to this file (a benchmark's: the agent passes its
    /// own `RB_STEP_TIMES` on; see `rb-bench --agent-parts steps`).
    #[arg(long, value_name = "FILE")]
    pub step_times: Option<PathBuf>,
    /// The command, as the remote shell would receive it.
    #[arg(short = 'c')]
    pub command: String,
}
