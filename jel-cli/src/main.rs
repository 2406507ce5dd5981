//! `rb-jel`: flags → [`jel_cli::run`]; one `match` maps errors to exit codes (see
//! `rb-jel --help` and the crate doc of `jel_cli`).

use clap::Parser;
use jel_cli::{cli::Args, error::EXIT_USAGE, CliError};

fn main() {
    let args = match Args::try_parse() {
        Ok(args) => args,
        // Usage errors exit 64: exit 2 means "not inside a job".
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            std::process::exit(EXIT_USAGE);
        }
        Err(e) => e.exit(),
    };
    match jel_cli::run(args) {
        Ok(code) => std::process::exit(code),
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(141) // as a shell reports SIGPIPE: the reader went away
        }
        Err(e) => {
            eprintln!("rb-jel: {e}");
            std::process::exit(e.exit_code());
        }
    }
}
