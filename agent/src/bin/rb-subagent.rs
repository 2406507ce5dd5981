//! `rb-subagent`: flags → [`agent::subagent::run`]. Started by the `rsh` shim on an
//! allocated host; not meant to be run by hand. Also `rb-subagent local-shell` (the `local`
//! transport's remote shell) and `rb-subagent guard-job` (the job's guardian on the front
//! end, started by the agent: [`agent::jobguard`]).

use std::path::PathBuf;

use clap::Parser;

/// Guards one remote command of a ResourceBroker job (started by the rsh shim).
#[derive(Debug, Parser)]
#[command(name = "rb-subagent", version)]
struct Args {
    /// The job's agent (IP:port).
    #[arg(long)]
    agent: String,
    /// Allocation id this command runs under.
    #[arg(long)]
    alloc: u64,
    /// The file holding the key this job's agent accepts (the job's key, see
    /// `agent::jobkey`; the key itself is never on a command line).
    #[arg(long, default_value = "~/.config/rb/secret")]
    secret_file: String,
    /// The job's preload library (module jobs): put first in the command's LD_PRELOAD when
    /// this host has it at the same path, else ignored.
    #[arg(long)]
    preload: Option<PathBuf>,
    /// The lab's public mark (hex), put in the command's tag so that the lab's host daemon
    /// can end what is left of it once the allocation is over.
    #[arg(long)]
    lab_mark: Option<String>,
    /// The command, as the remote shell would receive it.
    #[arg(short = 'c')]
    command: String,
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("local-shell") {
        std::process::exit(agent::subagent::local_shell(&argv[2..]));
    }
    if argv.get(1).map(String::as_str) == Some(agent::jobguard::SUBCOMMAND) {
        std::process::exit(agent::jobguard::guard_job(&argv[2..]));
    }
    let args = Args::parse();
    let cfg = agent::subagent::SubagentConfig {
        agent: args.agent,
        alloc: args.alloc,
        secret_file: config::expand_home(&args.secret_file),
        command: args.command,
        preload: args.preload.filter(|p| p.is_file()),
        lab_mark: args.lab_mark,
    };
    std::process::exit(agent::subagent::run(cfg));
}
