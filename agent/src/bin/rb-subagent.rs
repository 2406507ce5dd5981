//! `rb-subagent`: flags → [`agent::subagent::run`]. Started by the `rsh` shim on an
//! allocated host; not meant to be run by hand. Also `rb-subagent local-shell` (the `local`
//! transport's remote shell) and `rb-subagent guard-job` (the job's guardian on the front
//! end, started by the agent: [`agent::jobguard`]).

use agent::subagent_cli::Args;
use clap::Parser;

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("local-shell") {
        std::process::exit(agent::subagent::local_shell(&argv[2..]));
    }
    if argv.get(1).map(String::as_str) == Some(agent::jobguard::SUBCOMMAND) {
        std::process::exit(agent::jobguard::guard_job(&argv[2..]));
    }
    let args = Args::parse();
    if let Some(file) = &args.step_times {
        steptimes::set_file(file);
    }
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
