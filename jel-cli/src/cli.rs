//! The command line: the commands of `rb-jel` (the book's JEL page, "rb-jel, for scripts").

use clap::{Parser, Subcommand};

const AFTER_HELP: &str = "\
Exit codes: 0 done; 1 refused by the pool, or no winner (result); 2 not inside a
ResourceBroker job (RB_JEL unset or its socket gone); 64 bad usage; 69 the job's pool cannot
be reached; 77 the socket is served by another user. `join` exits with CMD's status
(128+N when CMD died of signal N, 126 not executable, 127 not found).";

/// JEL (Join-Elect-Leave) for the scripts of a ResourceBroker job: join the job's pool,
/// watch who joins, leaves or dies and which hosts come and go, elect a master, signal.
#[derive(Debug, Parser)]
#[command(name = "rb-jel", version, after_help = AFTER_HELP)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Be a member while CMD runs, and exit with its status. CMD gets JEL_MEMBER (the id)
    /// and rb-jel commands run from CMD act as that member. CMD exiting 0 leaves the pool
    /// (`left`); any other end is a death (`died`, reason `exited`).
    Join {
        /// The member's name (names may repeat; the id tells members apart).
        #[arg(long)]
        name: Option<String>,
        /// The command and its arguments.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// Print the events with seq >= SEQ, then live ones, one per line, until the job ends.
    Watch {
        /// The first seq to print (1: the whole stream).
        #[arg(long, value_name = "SEQ", default_value_t = 1)]
        from: u64,
        /// Each event exactly as the stream has it (one JSON object per line).
        #[arg(long)]
        json: bool,
        /// Run SCRIPT (with sh -c) for each event instead of printing it, with JEL_EVENT,
        /// JEL_SEQ, JEL_MEMBER and JEL_HOST set and the event's JSON on stdin.
        #[arg(long, value_name = "SCRIPT", conflicts_with = "json")]
        exec: Option<String>,
    },
    /// List the current members: id, name, host, pid and the seq they joined at.
    Members {
        /// A JSON array of flat objects {id, name, host, pid, seq}.
        #[arg(long)]
        json: bool,
    },
    /// Stand as a candidate in election NAME and print the winner (its name, or its id
    /// when it has none). Outside `rb-jel join`, the caller joins for the call.
    Elect { name: String },
    /// Print the winner of election NAME (its name, or its id); exit 1 when there is none.
    Result { name: String },
    /// Send signal NAME to the members given (ids or names), or to every member.
    Signal {
        name: String,
        /// Addressees: member ids, or names (every member of that name).
        #[arg(value_name = "MEMBER")]
        members: Vec<String>,
        /// A JSON value carried with the signal.
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
    },
}
