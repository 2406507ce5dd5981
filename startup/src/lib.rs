//! The start-up every ResourceBroker binary shares (`rb`, `rb-broker`, `rb-hostd`, `agent`):
//! its flags parsed, a usage error reported with exit code [`EXIT_USAGE`], and tracing to
//! stderr filtered by `RB_LOG`. A library of its own so that the binaries agree on both
//! (the same four lines were written in each). Also their answers on standard output
//! ([`output`]): a reader that goes away ends them with [`EXIT_READER_GONE`], not a panic.

use std::io::IsTerminal;

pub mod output;

pub use output::{OutputError, EXIT_READER_GONE};

/// Raises this process's open-files limit to its hard limit (what a program that holds
/// thousands of connections needs: the broker, the load generator); returns the limit in
/// force (`None`: unknown). Children inherit it.
pub fn raise_open_files() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// Exit code of bad flags (`EX_USAGE`).
pub const EXIT_USAGE: u8 = 64;

/// The variable that sets the log filter (`RB_LOG=debug`, `RB_LOG=broker=trace`).
pub const LOG_VAR: &str = "RB_LOG";

/// Parses the command line as `P`: on bad flags prints clap's message (what is wrong and
/// the usage) to stderr and exits [`EXIT_USAGE`]; `--help` and `--version` print to stdout
/// and exit 0, as clap does.
pub fn parse<P: clap::Parser>() -> P {
    match P::try_parse() {
        Ok(args) => args,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            std::process::exit(i32::from(EXIT_USAGE));
        }
        Err(e) => e.exit(),
    }
}

/// Logs to stderr (coloured on a terminal only), at `default` (`info`, `warn`) unless
/// [`LOG_VAR`] says otherwise.
pub fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_VAR)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// [`parse`], then [`init_tracing`] at `default_log`: the opening of every binary's `main`.
pub fn start<P: clap::Parser>(default_log: &str) -> P {
    let args = parse();
    init_tracing(default_log);
    args
}
