//! `rb-hostd`: the host daemon that runs on every lab machine.
//!
//! # Layout
//! - [`sensors`]: reads the machine (load, CPUs, memory, users, idleness) into a
//!   [`proto::report::HostReport`]; pure parsers plus thin file reads, all paths configurable.
//! - [`daemon`]: connects to the broker, authenticates, sends reports on an interval and at
//!   once on a login or resumed input, reconnects with backoff, exits on its lifeline.
//! - [`jobload`]: `job_load`, the load of this lab's job processes (HTCondor's
//!   `CondorLoadAvg`), from their CPU time, averaged like `load1`.
//! - [`sweep`]: ends leftover processes of allocations the broker no longer has (pure
//!   decision, `/proc` scan at the edge).
//! - [`lineage`]: the processes noted below a subagent of this lab, for the sweep to find
//!   those that lost their tag.

pub mod cli;
pub mod daemon;
pub mod jobload;
pub mod lineage;
pub mod sensors;
pub mod sweep;

/// The login sessions of a report with the source of each idle time, for `rb-hostd
/// --once`: what an admin checks on one machine by hand.
pub fn sessions_summary(r: &proto::report::HostReport) -> String {
    use std::fmt::Write;
    let secs = |s: Option<u64>| s.map_or("unknown".to_string(), |s| format!("{s} s"));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "console idle: {} (input devices)",
        secs(r.console_idle_s)
    );
    match &r.users {
        None => out.push_str("utmp: unreadable\n"),
        Some(us) => {
            let _ = writeln!(out, "utmp: {} session(s)", us.len());
            for u in us {
                let _ = writeln!(
                    out,
                    "  {} {} idle {} (tty atime)",
                    u.user,
                    u.tty,
                    secs(u.idle_s)
                );
            }
        }
    }
    match &r.logind {
        None => {
            let why = r.logind_error.as_deref().unwrap_or("unknown");
            let _ = writeln!(out, "logind: not read: {why}");
        }
        Some(ss) => {
            let _ = writeln!(out, "logind: {} session(s)", ss.len());
            for s in ss {
                let place = [s.seat.as_deref(), s.tty.as_deref(), s.display.as_deref()]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(" ");
                let flags = [
                    (s.active, "active"),
                    (s.locked, "locked"),
                    (s.remote, "remote"),
                    (s.own, "this daemon's own"),
                    (!s.is_person(), "not a person"),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, w)| *w)
                .collect::<Vec<_>>()
                .join(", ");
                let _ = writeln!(
                    out,
                    "  {} {} class={} type={} [{place}] {flags}: idle {} ({})",
                    s.id,
                    s.user,
                    s.class,
                    s.kind,
                    secs(s.idle_s),
                    s.idle_source.describe()
                );
            }
        }
    }
    out
}
