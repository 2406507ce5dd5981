//! `rb-jel join [--name N] -- CMD ARGS`: joins the pool, runs CMD (with `JEL_MEMBER` set to
//! the member's id) and exits with its status: `leave` when CMD exits 0, a plain close (the
//! pool says `died{exited}`) otherwise.
//!
//! The member is this process's connection; CMD's own `rb-jel` commands act as that member
//! through a **relay**: a socket next to `$RB_JEL` (`$RB_JEL.member-ID`, named in CMD's
//! `RB_JEL_MEMBER`) that speaks JEL and passes each request on over the member's connection
//! (`join`, `leave` and `watch` are refused there: they need a connection of their own).

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::{
        fs::PermissionsExt,
        net::{UnixListener, UnixStream},
        process::ExitStatusExt,
    },
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    sync::{Arc, Mutex},
    thread,
};

use jel::{
    client::find_socket,
    wire::{to_line, Hello, Reply, Request, VERSION},
    Client, JelError, MemberHandle,
};

use crate::{error::connect_error, CliError, ENV_JEL_MEMBER, ENV_MEMBER_RELAY};

/// The member, shared with the relay until CMD ends (then taken out: `None`).
type Shared = Arc<Mutex<Option<MemberHandle>>>;

/// Runs `join`; CMD's exit status as ours.
pub fn run(name: Option<&str>, cmd: &[String]) -> Result<i32, CliError> {
    let pool = find_socket()?;
    let client = Client::connect_to(&pool).map_err(connect_error)?;
    let consistency = client.consistency().to_string();
    let member = client.join(name)?;
    let relay = relay_path(&pool, member.id());
    let listener = bind(&relay)?;
    let id = member.id();
    let shared: Shared = Arc::new(Mutex::new(Some(member)));
    let serving = Arc::clone(&shared);
    thread::spawn(move || serve(listener, serving, consistency));
    let status = Command::new(&cmd[0])
        .args(&cmd[1..])
        .env(ENV_JEL_MEMBER, id.to_string())
        .env(ENV_MEMBER_RELAY, &relay)
        .status();
    let _ = std::fs::remove_file(&relay); // nobody else removes it; gone is fine
    let member = shared.lock().unwrap_or_else(|p| p.into_inner()).take();
    let status = match status {
        Ok(status) => status,
        Err(source) => {
            if let Some(member) = member {
                member.leave()?;
            }
            let cmd = cmd.join(" ");
            return Err(CliError::Spawn { cmd, source });
        }
    };
    if status.success() {
        if let Some(member) = member {
            member.leave()?;
        }
    }
    Ok(exit_code(status))
}

/// The relay's socket for member `id` of the pool at `pool`.
pub fn relay_path(pool: &Path, id: u64) -> PathBuf {
    let mut path = pool.as_os_str().to_owned();
    path.push(format!(".member-{id}"));
    PathBuf::from(path)
}

/// CMD's status as a shell reports it: its code, or 128+N for signal N.
pub fn exit_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    }
}

fn bind(path: &Path) -> Result<UnixListener, CliError> {
    let relay_error = |source| CliError::Relay {
        path: path.to_path_buf(),
        source,
    };
    // Ids are never reused in a pool: a file there is a leftover of a dead rb-jel.
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(relay_error)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(relay_error)?;
    Ok(listener)
}

/// Serves the relay until the process ends: one thread per connection.
fn serve(listener: UnixListener, member: Shared, consistency: String) {
    let euid = nix::unistd::geteuid().as_raw();
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        if proto::peercred::peer_uid(&stream) != Some(euid) {
            continue; // not ours: closed unanswered
        }
        let (member, consistency) = (Arc::clone(&member), consistency.clone());
        thread::spawn(move || relay(stream, &member, &consistency));
    }
}

/// One relayed connection: the hello, then each request passed on and its reply back.
fn relay(stream: UnixStream, member: &Shared, consistency: &str) {
    let Ok(reader) = stream.try_clone() else {
        return;
    };
    let mut writer = stream;
    let mut lines = BufReader::new(reader).lines();
    let hello_ok = matches!(
        lines.next(),
        Some(Ok(line)) if serde_json::from_str::<Hello>(&line).is_ok_and(|h| h.jel == VERSION)
    );
    let first = match hello_ok {
        true => to_line(&Hello {
            jel: VERSION,
            consistency: Some(consistency.to_string()),
        }),
        false => to_line(&refusal(
            "hello",
            format!("this relay speaks JEL version {VERSION}"),
            "use a JEL client built with this ResourceBroker",
        )),
    };
    if writer.write_all(first.as_bytes()).is_err() || !hello_ok {
        return;
    }
    for line in lines {
        let Ok(line) = line else { return };
        let reply = answer(&line, member);
        if writer.write_all(to_line(&reply).as_bytes()).is_err() {
            return;
        }
    }
}

/// The reply to one relayed request line.
pub(crate) fn answer(line: &str, member: &Shared) -> Reply {
    let request = match serde_json::from_str::<Request>(line) {
        Ok(request) => request,
        Err(e) => {
            return refusal(
                "?",
                format!("cannot read the request: {e}"),
                "send one JSON object per line with an `op` (see PROTOCOL.md, section JEL)",
            )
        }
    };
    let op = request.op();
    if matches!(
        request,
        Request::Join { .. } | Request::Leave | Request::Watch { .. }
    ) {
        return refusal(
            op,
            format!("this is the relay of `rb-jel join` ({ENV_MEMBER_RELAY}): it does not `{op}`"),
            "join, leave or watch on a connection of your own to RB_JEL",
        );
    }
    let mut guard = member.lock().unwrap_or_else(|p| p.into_inner());
    let Some(member) = guard.as_mut() else {
        return refusal(op, "the member has left the pool", "CMD has ended");
    };
    match member.request(&request) {
        Ok(reply) => reply,
        Err(JelError::Refused { op, error, help }) => Reply::Error { op, error, help },
        Err(e) => refusal(op, e.to_string(), "the job's pool may have ended"),
    }
}

fn refusal(op: &str, error: impl Into<String>, help: &str) -> Reply {
    Reply::Error {
        op: op.to_string(),
        error: error.into(),
        help: help.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_relay_sits_next_to_the_pool_socket() {
        let path = relay_path(Path::new("/run/job-1/jel.sock"), 7);
        assert_eq!(path, Path::new("/run/job-1/jel.sock.member-7"));
    }

    #[test]
    fn the_relay_refuses_join_leave_watch_and_after_the_member_left() {
        let none: Shared = Arc::new(Mutex::new(None));
        for line in [r#"{"op":"join"}"#, r#"{"op":"leave"}"#, r#"{"op":"watch"}"#] {
            assert!(matches!(answer(line, &none), Reply::Error { .. }), "{line}");
        }
        let Reply::Error { op, error, .. } = answer(r#"{"op":"elect","name":"m"}"#, &none) else {
            panic!("no refusal");
        };
        assert_eq!(
            (op.as_str(), error.as_str()),
            ("elect", "the member has left the pool")
        );
        assert!(matches!(answer("nope", &none), Reply::Error { op, .. } if op == "?"));
    }

    #[test]
    fn a_signal_is_128_plus_its_number() {
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(exit_code(ExitStatus::from_raw(3 << 8)), 3);
    }
}
