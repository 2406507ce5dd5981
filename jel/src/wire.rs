//! The JEL wire protocol: newline-delimited JSON over a Unix socket (see PROTOCOL.md, "JEL").
//!
//! A connection starts with one [`Hello`] line each way (client first); the version is
//! [`VERSION`]. Then the client sends [`Request`]s (`{"op": …}`) and reads, in order, one
//! [`Reply`] (`{"reply": …}`) per request; a connection that sent `watch` then reads
//! [`Event`]s (`{"seq": N, "event": …}`) until it closes. This module owns the types and
//! their JSON form only; what they mean is the pool's business ([`crate::pool`]).

use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks; carried by the first line each way.
pub const VERSION: u32 = 1;

/// A member's id: unique in its pool, never reused, from 1.
pub type MemberId = u64;

/// A process of the job that joined the pool. Two members may share a name; the id tells
/// them apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: MemberId,
    /// The name given at join, or `null`.
    pub name: Option<String>,
    /// The lab name of the host the member runs on.
    pub host: String,
    pub pid: u32,
}

impl Member {
    /// How people see a member (an election winner, say): its name, or its id when it has none.
    pub fn label(&self) -> String {
        match &self.name {
            Some(name) => name.clone(),
            None => self.id.to_string(),
        }
    }
}

/// Why a member died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeathReason {
    /// Its connection closed without `leave` (the process exited or closed it).
    Exited,
    /// The job's agent killed it (a shrink, a hand-back, the job's end).
    Killed,
    /// Its host crashed or was cut off, and it is certainly gone.
    HostLost,
    /// Its host was taken back (after a `vacate`) and it did not leave in time.
    Vacated,
}

/// One election's state, as `snapshot` carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElectionState {
    pub name: String,
    pub winner: Option<Member>,
    pub epoch: u64,
}

/// One event of a pool's stream: `{"seq": N, "event": "<kind>", …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    #[serde(flatten)]
    pub kind: EventKind,
}

/// The kinds of events (the `event` field) and their fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    Joined {
        member: Member,
    },
    Left {
        member: Member,
    },
    Died {
        member: Member,
        reason: DeathReason,
    },
    /// `host` is being taken back: its members must be gone by `deadline` (Unix time in
    /// milliseconds), when the ones left are killed.
    Vacate {
        host: String,
        members: Vec<Member>,
        deadline: u64,
    },
    HostGranted {
        host: String,
    },
    HostReleased {
        host: String,
    },
    /// `winner` is `null` when the last winner is gone and nobody stands; `epoch` grows with
    /// every `elected` event of that name (a fencing number).
    Elected {
        name: String,
        winner: Option<Member>,
        epoch: u64,
    },
    /// Sent by `from` to the members `to` (every member when `to` is empty).
    Signal {
        name: String,
        from: Member,
        to: Vec<MemberId>,
        payload: serde_json::Value,
    },
    /// The pool accepts no more joins.
    Closed,
    /// The job is ending; nothing follows.
    Terminated,
    /// Replaces the events a watcher asked for when they were compacted away: the state as of
    /// `seq` (this event's); the stream goes on with `seq + 1`.
    Snapshot {
        members: Vec<Member>,
        elections: Vec<ElectionState>,
        closed: bool,
    },
}

/// The first line of a connection, both ways: `{"jel": 1}` from the client; the server adds
/// the pool's consistency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub jel: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
}

/// A client's request (`{"op": …}`), after the hello.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Become a member; `pid` defaults to the connecting process's.
    Join {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        pid: Option<u32>,
    },
    Leave,
    /// Turn this connection into a stream of events with `seq >= from` (default 1).
    Watch {
        #[serde(default)]
        from: Option<u64>,
    },
    /// Stand as a candidate; the reply names the winner.
    Elect {
        name: String,
    },
    /// The winner of `name`, if any.
    Result {
        name: String,
    },
    Signal {
        name: String,
        #[serde(default)]
        to: Vec<MemberId>,
        #[serde(default)]
        payload: serde_json::Value,
    },
    Members,
}

impl Request {
    /// The `op` as written on the wire.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Join { .. } => "join",
            Request::Leave => "leave",
            Request::Watch { .. } => "watch",
            Request::Elect { .. } => "elect",
            Request::Result { .. } => "result",
            Request::Signal { .. } => "signal",
            Request::Members => "members",
        }
    }
}

/// One row of `members`: a member and the seq of its `joined` event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRow {
    pub id: MemberId,
    pub name: Option<String>,
    pub host: String,
    pub pid: u32,
    pub seq: u64,
}

/// The server's answer to one request (`{"reply": …}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    Join {
        member: Member,
        seq: u64,
    },
    Leave {
        seq: u64,
    },
    /// Events from `from` follow (or a `snapshot` when `from` was compacted away).
    Watch {
        from: u64,
        head: u64,
    },
    Elect {
        name: String,
        winner: Option<Member>,
        epoch: u64,
    },
    Result {
        name: String,
        winner: Option<Member>,
        epoch: u64,
    },
    Signal {
        seq: u64,
    },
    Members {
        seq: u64,
        members: Vec<MemberRow>,
    },
    /// The request was refused; `error` says why, `help` what to do.
    Error {
        op: String,
        error: String,
        help: String,
    },
}

/// One line to a client: a reply, an event or a hello.
pub fn to_line<T: Serialize>(value: &T) -> String {
    let mut line = serde_json::to_string(value).expect("wire types always serialize");
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn alice() -> Member {
        Member {
            id: 3,
            name: Some("alice".into()),
            host: "nodeb".into(),
            pid: 4242,
        }
    }

    #[test]
    fn events_have_the_fields_the_issue_names() {
        let died = Event {
            seq: 7,
            kind: EventKind::Died {
                member: alice(),
                reason: DeathReason::HostLost,
            },
        };
        assert_eq!(
            serde_json::to_value(&died).expect("json"),
            json!({"seq": 7, "event": "died", "reason": "host_lost",
                   "member": {"id": 3, "name": "alice", "host": "nodeb", "pid": 4242}})
        );
        let closed = Event {
            seq: 8,
            kind: EventKind::Closed,
        };
        assert_eq!(
            to_line(&closed),
            "{\"seq\":8,\"event\":\"closed\"}\n".to_string()
        );
        let granted: Event =
            serde_json::from_str(r#"{"seq":1,"event":"host_granted","host":"nodec"}"#)
                .expect("parse");
        assert_eq!(
            granted.kind,
            EventKind::HostGranted {
                host: "nodec".into()
            }
        );
    }

    #[test]
    fn every_event_kind_reads_back_as_written() {
        let kinds = [
            EventKind::Joined { member: alice() },
            EventKind::Left { member: alice() },
            EventKind::Vacate {
                host: "nodeb".into(),
                members: vec![alice()],
                deadline: 1_764_000_005_000,
            },
            EventKind::HostGranted { host: "b".into() },
            EventKind::HostReleased { host: "b".into() },
            EventKind::Elected {
                name: "m".into(),
                winner: None,
                epoch: 2,
            },
            EventKind::Signal {
                name: "go".into(),
                from: alice(),
                to: vec![1, 2],
                payload: json!({"k": [1, "two"]}),
            },
            EventKind::Terminated,
            EventKind::Snapshot {
                members: vec![alice()],
                elections: vec![ElectionState {
                    name: "m".into(),
                    winner: Some(alice()),
                    epoch: 1,
                }],
                closed: true,
            },
        ];
        for (seq, kind) in kinds.into_iter().enumerate() {
            let event = Event {
                seq: seq as u64 + 1,
                kind,
            };
            let line = to_line(&event);
            assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
            assert_eq!(serde_json::from_str::<Event>(&line).expect(&line), event);
        }
    }

    #[test]
    fn requests_parse_with_defaults_and_refuse_unknown_fields() {
        let join: Request = serde_json::from_str(r#"{"op":"join"}"#).expect("join");
        assert_eq!(
            join,
            Request::Join {
                name: None,
                pid: None
            }
        );
        let watch: Request = serde_json::from_str(r#"{"op":"watch","from":5}"#).expect("watch");
        assert_eq!(watch, Request::Watch { from: Some(5) });
        assert!(serde_json::from_str::<Request>(r#"{"op":"join","x":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"op":"dance"}"#).is_err());
    }

    #[test]
    fn a_winner_is_shown_by_name_or_else_by_id() {
        let mut m = alice();
        assert_eq!(m.label(), "alice");
        m.name = None;
        assert_eq!(m.label(), "3");
    }
}
