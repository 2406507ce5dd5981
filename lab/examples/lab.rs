//! `cargo run -p lab --example lab -- up|down|status|exec|…`: the `rb lab` commands without
//! the `rb` binary (handy while developing the lab crate itself).

use clap::Parser;

/// The `rb lab` commands, standalone.
#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: lab::cli::LabCommand,
}

fn main() -> anyhow::Result<std::process::ExitCode> {
    lab::cli::run(Cli::parse().cmd).map(std::process::ExitCode::from)
}
