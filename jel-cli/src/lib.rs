//! `rb-jel`: JEL for the shell scripts of a ResourceBroker job. Every command talks to the
//! job's pool at `$RB_JEL` (see the `jel` crate and PROTOCOL.md, section "JEL").
//!
//! Who a command acts as:
//! 1. inside `rb-jel join … -- CMD` (`RB_JEL_MEMBER` names the join's relay): as that
//!    member, through the relay, which passes requests on over the member's connection;
//! 2. otherwise `elect` and `signal`, which need a member, join for the call and leave after;
//! 3. `members`, `result` and `watch` need no member.
//!
//! Exit codes ([`CliError::exit_code`]): 0 done; 1 refused by the pool, or no winner
//! (`result`); 2 not inside a job; 64 bad usage; 69 the pool cannot be reached or talked to;
//! 77 the socket is served by another user; `join` exits with CMD's status (128+N for
//! signal N; 126 not executable, 127 not found).
//!
//! # Layout
//! - [`cli`]: the flags (clap).
//! - [`error`]: [`CliError`] and exit codes.
//! - [`query`]: `members`, `elect`, `result`, `signal`.
//! - [`watch`]: `watch`, printed or run through a script per event.
//! - [`join`]: `join -- CMD`, and the relay its CMD's commands go through.

pub mod cli;
pub mod error;
pub mod join;
pub mod query;
pub mod watch;

pub use error::CliError;

/// Names the relay of the `rb-jel join` a process runs under (set for its CMD).
pub const ENV_MEMBER_RELAY: &str = "RB_JEL_MEMBER";
/// The id of the member a `rb-jel join` CMD is (and, for `watch --exec`, the event's).
pub const ENV_JEL_MEMBER: &str = "JEL_MEMBER";

/// Runs one command; its exit code.
pub fn run(args: cli::Args) -> Result<i32, CliError> {
    use cli::Command;
    match args.command {
        Command::Join { name, cmd } => join::run(name.as_deref(), &cmd),
        Command::Watch { from, json, exec } => watch::run(from, json, exec.as_deref()),
        Command::Members { json } => query::members(json),
        Command::Elect { name } => query::elect(&name),
        Command::Result { name } => query::result(&name),
        Command::Signal {
            name,
            members,
            payload,
        } => query::signal(&name, &members, payload.as_deref()),
    }
}
