//! `rb-jel watch [--from SEQ] [--json] [--exec SCRIPT]`: the stream from SEQ, then live,
//! until `terminated`. Printed one event per line (as the stream has it with `--json`), or
//! handed to SCRIPT one event at a time, as Serf's event handlers are.
//!
//! **SIGTERM** ends the watch as it would any process (it dies of it), but only once the
//! events already on its connection are printed: a host's reclaim delivers `vacate` to the
//! host's members and sends SIGTERM right after, sooner than a loaded host may run the
//! watch to read it. SIGTERM is held back (blocked, and waited for on a signalfd beside the
//! connection); commands of `--exec` start with it unblocked (std resets their mask).

use std::{
    io::Write,
    os::fd::AsFd,
    process::{Command, Stdio},
};

use jel::{client::Watcher, wire::EventKind, Event, Member};
use nix::{
    poll::{poll, PollFd, PollFlags, PollTimeout},
    sys::{
        signal::{SigSet, Signal},
        signalfd::{SfdFlags, SignalFd},
    },
};

use crate::{
    error::connect_error,
    query::{connect, print},
    CliError,
};

/// Runs the watch; 0 once the job's stream ended (`terminated`). At SIGTERM, dies of it
/// once the events already received are shown (see the module docs).
pub fn run(from: u64, json: bool, exec: Option<&str>) -> Result<i32, CliError> {
    let mut term = HeldTerm::hold();
    let mut events = connect()?.watch(from)?;
    let show = |event: &Event| -> Result<bool, CliError> {
        let line = serde_json::to_string(event).expect("events always serialize");
        match exec {
            Some(script) => run_script(script, event, &line)?,
            None if json => print(&line)?,
            None => print(&text(event))?,
        }
        Ok(event.kind == EventKind::Terminated)
    };
    loop {
        if let Some(held) = term.as_ref().filter(|_| !events.has_buffered_line()) {
            match held.wait_with(&events) {
                Woken::Events => {}
                Woken::Term => {
                    while readable_now(&events) {
                        match events.next_event() {
                            Ok(event) if !show(&event)? => {}
                            _ => break,
                        }
                    }
                    held.die();
                }
                // Nothing to wait with: SIGTERM as any process has it, reads as before.
                Woken::Neither => {
                    if let Some(held) = term.take() {
                        held.release();
                    }
                }
            }
        }
        let event = events.next_event().map_err(connect_error)?;
        if show(&event)? {
            return Ok(0);
        }
    }
}

/// SIGTERM blocked, and a signalfd that is readable once it is pending.
struct HeldTerm(SignalFd);

impl HeldTerm {
    /// Blocks SIGTERM (`None`, left as it was, when that fails: the watch then dies at
    /// once, as any process does).
    fn hold() -> Option<HeldTerm> {
        let set = term_set();
        set.thread_block().ok()?;
        match SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK) {
            Ok(fd) => Some(HeldTerm(fd)),
            Err(_) => {
                let _ = set.thread_unblock();
                None
            }
        }
    }

    /// Waits until `events` has something to read or SIGTERM is pending.
    fn wait_with(&self, events: &Watcher) -> Woken {
        let readable = PollFlags::POLLIN;
        loop {
            let mut fds = [
                PollFd::new(events.as_fd(), readable),
                PollFd::new(self.0.as_fd(), readable),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return Woken::Neither,
                Ok(_) if fds[1].any().unwrap_or(false) => return Woken::Term,
                Ok(_) => return Woken::Events,
            }
        }
    }

    /// SIGTERM unblocked again (a pending one ends the watch now).
    fn release(self) {
        let _ = term_set().thread_unblock();
    }

    /// Dies of the SIGTERM held back: unblocked, it is delivered at once.
    fn die(&self) -> ! {
        let _ = term_set().thread_unblock();
        let _ = nix::sys::signal::raise(Signal::SIGTERM);
        std::process::exit(128 + Signal::SIGTERM as i32)
    }
}

/// What [`HeldTerm::wait_with`] woke for.
enum Woken {
    Events,
    Term,
    /// `poll` failed.
    Neither,
}

fn term_set() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set
}

/// Whether the next event can be read without waiting (a whole line read already, or the
/// connection has bytes or its end).
fn readable_now(events: &Watcher) -> bool {
    if events.has_buffered_line() {
        return true;
    }
    let mut fds = [PollFd::new(events.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// The `event` field of an event (`joined`, `vacate`…).
pub fn kind_name(event: &Event) -> String {
    let value = serde_json::to_value(event).expect("events always serialize");
    value["event"].as_str().unwrap_or_default().to_string()
}

fn member_text(m: &Member) -> String {
    let name = m.name.as_deref().unwrap_or("-");
    format!("member={} name={name} host={} pid={}", m.id, m.host, m.pid)
}

fn ids(members: impl IntoIterator<Item = u64>, sep: &str) -> String {
    let ids: Vec<String> = members.into_iter().map(|id| id.to_string()).collect();
    ids.join(sep)
}

/// One event for people: `SEQ KIND key=value…`.
pub fn text(event: &Event) -> String {
    let details = match &event.kind {
        EventKind::Joined { member } | EventKind::Left { member } => member_text(member),
        EventKind::Died { member, reason } => {
            let reason = serde_json::to_value(reason).expect("reasons serialize");
            let reason = reason.as_str().unwrap_or_default().to_string();
            format!("{} reason={reason}", member_text(member))
        }
        EventKind::Vacate {
            host,
            members,
            deadline,
        } => format!(
            "host={host} deadline={deadline} members={}",
            ids(members.iter().map(|m| m.id), ",")
        ),
        EventKind::HostGranted { host } | EventKind::HostReleased { host } => {
            format!("host={host}")
        }
        EventKind::Elected {
            name,
            winner,
            epoch,
        } => {
            let winner = winner.as_ref().map_or("-".to_string(), Member::label);
            format!("name={name} winner={winner} epoch={epoch}")
        }
        EventKind::Signal {
            name,
            from,
            to,
            payload,
        } => {
            let to = if to.is_empty() {
                "all".into()
            } else {
                ids(to.iter().copied(), ",")
            };
            format!("name={name} from={} to={to} payload={payload}", from.id)
        }
        EventKind::Snapshot {
            members,
            elections,
            closed,
        } => format!(
            "members={} elections={} closed={closed}",
            ids(members.iter().map(|m| m.id), ","),
            elections.len()
        ),
        EventKind::Closed | EventKind::Terminated => String::new(),
    };
    format!("{} {} {details}", event.seq, kind_name(event))
        .trim_end()
        .to_string()
}

/// JEL_MEMBER and JEL_HOST for an event: its member (the vacated host's members, the
/// signal's sender, the election's winner) and host; empty when it has none.
pub fn member_and_host(event: &Event) -> (String, String) {
    match &event.kind {
        EventKind::Joined { member }
        | EventKind::Left { member }
        | EventKind::Died { member, .. }
        | EventKind::Signal { from: member, .. } => (member.id.to_string(), member.host.clone()),
        EventKind::Vacate { host, members, .. } => {
            (ids(members.iter().map(|m| m.id), " "), host.clone())
        }
        EventKind::HostGranted { host } | EventKind::HostReleased { host } => {
            (String::new(), host.clone())
        }
        EventKind::Elected {
            winner: Some(w), ..
        } => (w.id.to_string(), w.host.clone()),
        _ => (String::new(), String::new()),
    }
}

/// Runs `sh -c SCRIPT` for one event and waits for it; a failing script is reported, and
/// the watch goes on.
fn run_script(script: &str, event: &Event, line: &str) -> Result<(), CliError> {
    let (member, host) = member_and_host(event);
    let spawn_error = |source| CliError::Spawn {
        cmd: script.to_string(),
        source,
    };
    let mut child = Command::new("sh")
        .args(["-c", script])
        .env("JEL_EVENT", kind_name(event))
        .env("JEL_SEQ", event.seq.to_string())
        .env(crate::ENV_JEL_MEMBER, member)
        .env("JEL_HOST", host)
        .stdin(Stdio::piped())
        .spawn()
        .map_err(spawn_error)?;
    if let Some(mut stdin) = child.stdin.take() {
        // A script that does not read its stdin closes it early: not an error.
        let _ = writeln!(stdin, "{line}");
    }
    let status = child.wait().map_err(spawn_error)?;
    if !status.success() {
        eprintln!(
            "rb-jel: the --exec script failed ({status}) for event {}",
            event.seq
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use jel::DeathReason;

    use super::*;

    fn m(id: u64) -> Member {
        Member {
            id,
            name: (id == 1).then(|| "boss".to_string()),
            host: "nodeb".into(),
            pid: 70 + id as u32,
        }
    }

    fn ev(seq: u64, kind: EventKind) -> Event {
        Event { seq, kind }
    }

    #[test]
    fn events_read_as_seq_kind_and_fields() {
        let died = ev(
            7,
            EventKind::Died {
                member: m(2),
                reason: DeathReason::HostLost,
            },
        );
        assert_eq!(
            text(&died),
            "7 died member=2 name=- host=nodeb pid=72 reason=host_lost"
        );
        let elected = ev(
            8,
            EventKind::Elected {
                name: "master".into(),
                winner: Some(m(1)),
                epoch: 3,
            },
        );
        assert_eq!(text(&elected), "8 elected name=master winner=boss epoch=3");
        assert_eq!(text(&ev(9, EventKind::Terminated)), "9 terminated");
    }

    #[test]
    fn a_script_gets_the_member_and_host_of_its_event() {
        let vacate = ev(
            5,
            EventKind::Vacate {
                host: "nodeb".into(),
                members: vec![m(1), m(2)],
                deadline: 9,
            },
        );
        assert_eq!(member_and_host(&vacate), ("1 2".into(), "nodeb".into()));
        let closed = ev(6, EventKind::Closed);
        assert_eq!(member_and_host(&closed), (String::new(), String::new()));
        assert_eq!(kind_name(&vacate), "vacate");
    }
}
