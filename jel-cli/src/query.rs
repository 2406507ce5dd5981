//! `members`, `elect`, `result` and `signal`: one request each, as the caller (see the crate
//! doc for who that is).

use std::{
    io::{self, Write},
    path::Path,
};

use jel::{
    client::find_socket,
    wire::{MemberId, Reply, Request},
    Client, MemberHandle,
};

use crate::{error::connect_error, CliError, ENV_MEMBER_RELAY};

/// Connects to the job's pool as no member.
pub fn connect() -> Result<Client, CliError> {
    let path = find_socket()?;
    Client::connect_to(&path).map_err(connect_error)
}

/// Prints one line on stdout.
pub fn print(line: &str) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(CliError::Output)
}

/// Who a request that needs a member is made as.
enum Caller {
    /// The member of the `rb-jel join` we run under, through its relay.
    Relay(Client),
    /// A member joined for this call (it leaves after).
    Joined(MemberHandle),
}

impl Caller {
    fn open() -> Result<Caller, CliError> {
        let pool = find_socket()?;
        match std::env::var_os(ENV_MEMBER_RELAY) {
            Some(relay) if !relay.is_empty() => {
                Ok(Caller::Relay(Client::connect_to(Path::new(&relay))?))
            }
            _ => {
                let client = Client::connect_to(&pool).map_err(connect_error)?;
                Ok(Caller::Joined(client.join(None)?))
            }
        }
    }

    fn request(&mut self, request: &Request) -> Result<Reply, CliError> {
        let reply = match self {
            Caller::Relay(client) => client.request(request)?,
            Caller::Joined(member) => member.request(request)?,
        };
        Ok(reply)
    }

    /// Leaves when joined for the call.
    fn done(self) -> Result<(), CliError> {
        if let Caller::Joined(member) = self {
            member.leave()?;
        }
        Ok(())
    }
}

/// `rb-jel members [--json]`.
pub fn members(json: bool) -> Result<i32, CliError> {
    let (_, rows) = connect()?.members()?;
    if json {
        let text = serde_json::to_string(&rows).expect("member rows always serialize");
        print(&text)?;
        return Ok(0);
    }
    print("ID\tNAME\tHOST\tPID\tSEQ")?;
    for r in rows {
        let name = r.name.as_deref().unwrap_or("-");
        print(&format!(
            "{}\t{name}\t{}\t{}\t{}",
            r.id, r.host, r.pid, r.seq
        ))?;
    }
    Ok(0)
}

/// `rb-jel elect NAME`: stands and prints the winner.
pub fn elect(name: &str) -> Result<i32, CliError> {
    let mut caller = Caller::open()?;
    let request = Request::Elect { name: name.into() };
    let winner = match caller.request(&request)? {
        Reply::Elect { winner, .. } => winner,
        _ => return Err(CliError::Unexpected { op: "elect" }),
    };
    caller.done()?;
    match winner {
        Some(w) => print(&w.label()).map(|()| 0),
        None => Err(CliError::NoWinner { name: name.into() }),
    }
}

/// `rb-jel result NAME`: the winner, or exit 1.
pub fn result(name: &str) -> Result<i32, CliError> {
    let election = connect()?.result(name)?;
    match election.winner {
        Some(w) => print(&w.label()).map(|()| 0),
        None => Err(CliError::NoWinner { name: name.into() }),
    }
}

/// `rb-jel signal NAME [MEMBER…] [--payload JSON]`.
pub fn signal(name: &str, to: &[String], payload: Option<&str>) -> Result<i32, CliError> {
    let payload = match payload {
        Some(text) => serde_json::from_str(text).map_err(|source| CliError::Payload {
            text: text.into(),
            source,
        })?,
        None => serde_json::Value::Null,
    };
    let mut caller = Caller::open()?;
    let to = addressees(&mut caller, to)?;
    let request = Request::Signal {
        name: name.into(),
        to,
        payload,
    };
    match caller.request(&request)? {
        Reply::Signal { .. } => {}
        _ => return Err(CliError::Unexpected { op: "signal" }),
    }
    caller.done()?;
    Ok(0)
}

/// Member ids from ids or names (a name: every member that has it).
fn addressees(caller: &mut Caller, given: &[String]) -> Result<Vec<MemberId>, CliError> {
    if given.iter().all(|g| g.parse::<MemberId>().is_ok()) {
        return Ok(given.iter().filter_map(|g| g.parse().ok()).collect());
    }
    let rows = match caller.request(&Request::Members)? {
        Reply::Members { members, .. } => members,
        _ => return Err(CliError::Unexpected { op: "members" }),
    };
    let mut ids = Vec::new();
    for g in given {
        if let Ok(id) = g.parse() {
            ids.push(id);
            continue;
        }
        let named: Vec<MemberId> = rows
            .iter()
            .filter(|r| r.name.as_deref() == Some(g))
            .map(|r| r.id)
            .collect();
        if named.is_empty() {
            return Err(CliError::NoSuchMember { name: g.clone() });
        }
        ids.extend(named);
    }
    Ok(ids)
}
