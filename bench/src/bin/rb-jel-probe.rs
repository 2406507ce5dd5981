//! `rb-jel-probe --out DIR --name NAME`: a JEL member that records when it saw each event,
//! for the lab part of rb-bench's JEL section. A real member of the job's pool, through the
//! same client and socket any job process uses (`jel::Client`, `$RB_JEL`: the agent's on the
//! front end, the subagent's on a granted host).
//!
//! It joins as NAME, watches the stream from its own `joined` on (a connection of its own,
//! as `Member::watch` opens), and appends one line per event to `DIR/NAME.events`:
//! `{"t_ns": <CLOCK_REALTIME when the event was read, Unix ns>, "event": <the event>}`, the
//! first line being `{"me": <its member>, "joined_seq": N}`. Every line is one `write(2)`,
//! made after the time is taken, so the file's order is the stream's.
//!
//! - At a `vacate` that names it, it records the event, leaves the pool (`left`) and exits 0,
//!   as a job's worker hands its work on and goes.
//! - SIGTERM is ignored: the subagent sends it right after it has written the `vacate` to the
//!   members' sockets, and a member that has not been scheduled yet would otherwise die
//!   before reading it (the `vacate` would go unrecorded, not unseen). SIGKILL ends it.
//! - At `terminated` (the job's end) it exits 0. Any failure (the pool gone): exit 1.

use std::{
    fs::File,
    io::Write,
    path::PathBuf,
    process::ExitCode,
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::Context;
use clap::Parser;
use jel::wire::EventKind;

#[derive(Debug, Parser)]
#[command(name = "rb-jel-probe")]
struct Args {
    /// Directory of the events files (shared by the job's hosts).
    #[arg(long)]
    out: PathBuf,
    /// The member's name, also the file's.
    #[arg(long)]
    name: String,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(args) => args,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(64);
        }
        Err(e) => e.exit(),
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rb-jel-probe {}: {e:#}", args.name);
            ExitCode::from(1)
        }
    }
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn run(args: &Args) -> anyhow::Result<()> {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_IGN installs no handler code; nothing else in this process handles SIGTERM.
    unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }.context("ignoring SIGTERM")?;
    let member = jel::Client::connect()?.join(Some(&args.name))?;
    let path = args.out.join(format!("{}.events", args.name));
    let mut file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let me = serde_json::json!({"me": member.info(), "joined_seq": member.joined_seq()});
    file.write_all(format!("{me}\n").as_bytes())?;
    let id = member.id();
    let mut events = member.watch(member.joined_seq())?;
    loop {
        let event = events.next_event()?;
        let t_ns = unix_ns();
        let line = serde_json::json!({"t_ns": t_ns, "event": event});
        file.write_all(format!("{line}\n").as_bytes())?;
        match &event.kind {
            EventKind::Vacate { members, .. } if members.iter().any(|m| m.id == id) => {
                member.leave()?;
                return Ok(());
            }
            EventKind::Terminated => return Ok(()),
            _ => {}
        }
    }
}
