//! [`Pool`]: the entry points, connections (hello, requests) and members' lives.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::Arc,
    time::Instant,
};

use super::{
    elect::Election, stream::Watcher, ConnId, DisconnectReason, Input, Line, Logged, Output,
    PoolConfig,
};
use crate::wire::{
    to_line, DeathReason, EventKind, Hello, Member, MemberId, MemberRow, Reply, Request, VERSION,
};

/// Longest member or election name accepted, in bytes.
const MAX_NAME: usize = 256;

/// One job's pool. See the module doc of [`crate::pool`].
#[derive(Debug)]
pub struct Pool {
    pub(super) config: PoolConfig,
    /// The seq of the newest event (0: none yet).
    pub(super) head: u64,
    /// The newest events, oldest first; the last one has seq `head`.
    pub(super) log: VecDeque<Arc<Logged>>,
    pub(super) members: BTreeMap<MemberId, MemberRec>,
    next_id: MemberId,
    pub(super) conns: HashMap<ConnId, Conn>,
    pub(super) watchers: BTreeMap<ConnId, Watcher>,
    pub(super) elections: BTreeMap<String, Election>,
    /// Hosts being reclaimed, with their deadline (Unix ms).
    pub(super) vacating: BTreeMap<String, u64>,
    closed: bool,
    pub(super) terminated: bool,
    /// Lines to send, per connection, gathered over one batch of inputs.
    pub(super) outbox: BTreeMap<ConnId, Vec<Line>>,
    /// Whether some watcher has pending lines (so the flush looks at them).
    pub(super) watchers_pending: bool,
    /// Connections to close at the end of the batch.
    pub(super) closing: Vec<(ConnId, DisconnectReason)>,
}

#[derive(Debug, Clone)]
pub(super) struct MemberRec {
    pub member: Member,
    /// The seq of its `joined`.
    pub seq: u64,
    pub conn: Option<ConnId>,
    /// Joined on the pool's own host ([`Input::OpenedFrontEnd`]): no host event touches it.
    pub front_end: bool,
}

#[derive(Debug, Clone)]
pub(super) struct Conn {
    pub host: String,
    pub pid: Option<u32>,
    pub hello: bool,
    /// Whether it has made a request past its hello (one that has not may be a watcher
    /// that connected just before the end: the host serves it before it closes).
    pub asked: bool,
    pub member: Option<MemberId>,
    /// Opened on the pool's own host ([`Input::OpenedFrontEnd`]).
    pub front_end: bool,
}

/// A refused request: what went wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error}\nhelp: {help}")]
pub(super) struct Refusal {
    pub error: String,
    pub help: String,
}

fn refuse(error: impl Into<String>, help: impl Into<String>) -> Refusal {
    Refusal {
        error: error.into(),
        help: help.into(),
    }
}

impl Pool {
    pub fn new(config: PoolConfig) -> Pool {
        Pool {
            config,
            head: 0,
            log: VecDeque::new(),
            members: BTreeMap::new(),
            next_id: 1,
            conns: HashMap::new(),
            watchers: BTreeMap::new(),
            elections: BTreeMap::new(),
            vacating: BTreeMap::new(),
            closed: false,
            terminated: false,
            outbox: BTreeMap::new(),
            watchers_pending: false,
            closing: Vec::new(),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// The seq of the newest event (0 when none yet).
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The current members, by id.
    pub fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values().map(|r| &r.member)
    }

    /// Whether `conn` is open and has made no request yet (its hello, at most).
    pub fn awaits_first_request(&self, conn: ConnId) -> bool {
        self.conns.get(&conn).is_some_and(|c| !c.asked)
    }

    /// One input; the outputs to perform, in order.
    pub fn handle(&mut self, input: Input, now: Instant) -> Vec<Output> {
        self.handle_batch(std::iter::once(input), now)
    }

    /// Many inputs at once (all the lines read in one go, say): the events they cause go to
    /// each connection in one [`Output::Send`], so the shell writes them in one write.
    pub fn handle_batch(
        &mut self,
        inputs: impl IntoIterator<Item = Input>,
        now: Instant,
    ) -> Vec<Output> {
        for input in inputs {
            self.input(input, now);
        }
        self.flush()
    }

    fn opened(&mut self, conn: ConnId, host: String, pid: Option<u32>, front_end: bool) {
        let c = Conn {
            host,
            pid,
            hello: false,
            asked: false,
            member: None,
            front_end,
        };
        self.conns.insert(conn, c);
    }

    fn input(&mut self, input: Input, now: Instant) {
        match input {
            Input::Opened { conn, host, pid } => self.opened(conn, host, pid, false),
            Input::OpenedFrontEnd { conn, host, pid } => self.opened(conn, host, pid, true),
            Input::Line { conn, line } => self.line(conn, &line, now),
            Input::Flushed { conn, lines } => self.flushed(conn, lines, now),
            Input::Closed { conn } => self.closed_conn(conn),
            Input::HostGranted { host } => {
                self.emit(EventKind::HostGranted { host });
            }
            Input::Reclaim { host, deadline_ms } => self.reclaim(host, deadline_ms),
            Input::HostReleased { host } => self.host_gone(&host, false),
            Input::HostLost { host } => self.host_gone(&host, true),
            Input::Killed { host, pid } => self.killed(&host, pid),
            Input::Close => self.close(),
            Input::Terminate => {
                self.close();
                self.emit(EventKind::Terminated);
                self.terminated = true;
            }
            Input::Tick => self.tick(now),
        }
    }

    /// Queues a line to a connection.
    pub(super) fn send(&mut self, conn: ConnId, line: Line) {
        match self.watchers.get_mut(&conn) {
            Some(w) => {
                w.pending.push(line);
                self.watchers_pending = true;
            }
            None => self.outbox.entry(conn).or_default().push(line),
        }
    }

    fn reply(&mut self, conn: ConnId, reply: &Reply) {
        self.send(conn, Line::Text(to_line(reply)));
    }

    fn line(&mut self, conn: ConnId, line: &str, now: Instant) {
        let Some(c) = self.conns.get(&conn) else {
            return; // closed or cut off meanwhile
        };
        if !c.hello {
            return self.hello(conn, line);
        }
        if let Some(c) = self.conns.get_mut(&conn) {
            c.asked = true;
        }
        if self.watchers.contains_key(&conn) {
            return self.cut_off(conn, DisconnectReason::RequestOnWatch);
        }
        let result = match serde_json::from_str::<Request>(line) {
            Ok(request) => {
                let op = request.op();
                self.request(conn, request, now).map_err(|r| (op, r))
            }
            Err(e) => Err((
                "?",
                refuse(
                    format!("cannot read the request `{}`: {e}", shorten(line)),
                    "send one JSON object per line with an `op` (see PROTOCOL.md, section JEL)",
                ),
            )),
        };
        if let Err((op, r)) = result {
            let reply = Reply::Error {
                op: op.to_string(),
                error: r.error,
                help: r.help,
            };
            self.reply(conn, &reply);
        }
    }

    fn hello(&mut self, conn: ConnId, line: &str) {
        match serde_json::from_str::<Hello>(line) {
            Ok(hello) if hello.jel == VERSION => {
                if let Some(c) = self.conns.get_mut(&conn) {
                    c.hello = true;
                }
                let ours = Hello {
                    jel: VERSION,
                    consistency: Some(self.config.consistency()),
                };
                self.send(conn, Line::Text(to_line(&ours)));
            }
            other => {
                let error = match other {
                    Ok(hello) => format!("this pool speaks JEL version {VERSION}, not {}", hello.jel),
                    Err(e) => format!("the first line must be a hello such as {{\"jel\":{VERSION}}}, not `{}`: {e}", shorten(line)),
                };
                let reply = Reply::Error {
                    op: "hello".into(),
                    error,
                    help: "use a JEL client built with this ResourceBroker".into(),
                };
                self.reply(conn, &reply);
                self.conns.remove(&conn);
                self.closing.push((conn, DisconnectReason::BadHello));
            }
        }
    }

    fn request(&mut self, conn: ConnId, request: Request, now: Instant) -> Result<(), Refusal> {
        if self.watchers.contains_key(&conn) {
            return Err(refuse(
                "this connection watches the stream and takes no more requests",
                "open another connection for requests",
            ));
        }
        match request {
            Request::Join { name, pid } => self.join(conn, name, pid),
            Request::Leave => {
                let id = self.member_of(conn)?;
                let seq = self.remove_member(id, None);
                let reply = Reply::Leave { seq };
                self.reply(conn, &reply);
                Ok(())
            }
            Request::Watch { from } => self.watch(conn, from.unwrap_or(1), now),
            Request::Elect { name } => {
                check_name(&name, "election")?;
                let id = self.member_of(conn)?;
                let (winner, epoch) = self.elect(&name, id);
                self.reply(
                    conn,
                    &Reply::Elect {
                        name,
                        winner,
                        epoch,
                    },
                );
                Ok(())
            }
            Request::Result { name } => {
                let (winner, epoch) = self.election_result(&name);
                self.reply(
                    conn,
                    &Reply::Result {
                        name,
                        winner,
                        epoch,
                    },
                );
                Ok(())
            }
            Request::Signal { name, to, payload } => self.signal(conn, name, to, payload),
            Request::Members => {
                let members = self.member_rows();
                self.reply(
                    conn,
                    &Reply::Members {
                        seq: self.head,
                        members,
                    },
                );
                Ok(())
            }
        }
    }

    fn join(
        &mut self,
        conn: ConnId,
        name: Option<String>,
        pid: Option<u32>,
    ) -> Result<(), Refusal> {
        if let Some(name) = &name {
            check_name(name, "member")?;
        }
        let c = self
            .conns
            .get(&conn)
            .expect("request on a known connection");
        if let Some(id) = c.member {
            return Err(refuse(
                format!("this connection is already member {id}"),
                "open another connection to join again",
            ));
        }
        if self.closed {
            return Err(refuse(
                "the pool is closed: no more joins",
                "the job is ending",
            ));
        }
        let member = Member {
            id: self.next_id,
            name,
            host: c.host.clone(),
            pid: pid.or(c.pid).unwrap_or(0),
        };
        let front_end = c.front_end;
        self.next_id += 1;
        let seq = self.emit(EventKind::Joined {
            member: member.clone(),
        });
        let rec = MemberRec {
            member: member.clone(),
            seq,
            conn: Some(conn),
            front_end,
        };
        self.members.insert(member.id, rec);
        if let Some(c) = self.conns.get_mut(&conn) {
            c.member = Some(member.id);
        }
        self.reply(conn, &Reply::Join { member, seq });
        Ok(())
    }

    fn member_of(&self, conn: ConnId) -> Result<MemberId, Refusal> {
        self.conns
            .get(&conn)
            .and_then(|c| c.member)
            .ok_or_else(|| refuse("this connection is not a member", "send `join` first"))
    }

    fn signal(
        &mut self,
        conn: ConnId,
        name: String,
        to: Vec<MemberId>,
        payload: serde_json::Value,
    ) -> Result<(), Refusal> {
        check_name(&name, "signal")?;
        let id = self.member_of(conn)?;
        if let Some(gone) = to.iter().find(|t| !self.members.contains_key(t)) {
            return Err(refuse(
                format!("no member {gone} in the pool"),
                "`members` lists the current members",
            ));
        }
        let from = self.members[&id].member.clone();
        let seq = self.emit(EventKind::Signal {
            name,
            from,
            to,
            payload,
        });
        self.reply(conn, &Reply::Signal { seq });
        Ok(())
    }

    fn member_rows(&self) -> Vec<MemberRow> {
        let row = |r: &MemberRec| MemberRow {
            id: r.member.id,
            name: r.member.name.clone(),
            host: r.member.host.clone(),
            pid: r.member.pid,
            seq: r.seq,
        };
        self.members.values().map(row).collect()
    }

    /// Removes a member: `left` when `death` is `None`, else `died{death}`; then its elections.
    /// Returns the seq of the `left` or `died` event.
    pub(super) fn remove_member(&mut self, id: MemberId, death: Option<DeathReason>) -> u64 {
        let Some(rec) = self.members.remove(&id) else {
            return self.head;
        };
        if let Some(c) = rec.conn.and_then(|conn| self.conns.get_mut(&conn)) {
            c.member = None;
        }
        let member = rec.member;
        let seq = self.emit(match death {
            None => EventKind::Left { member },
            Some(reason) => EventKind::Died { member, reason },
        });
        self.member_gone_from_elections(id);
        seq
    }

    fn closed_conn(&mut self, conn: ConnId) {
        self.watchers.remove(&conn);
        self.outbox.remove(&conn);
        let Some(c) = self.conns.remove(&conn) else {
            return;
        };
        if let Some(id) = c.member {
            let reason = match self.vacating.contains_key(&c.host) {
                true => DeathReason::Vacated,
                false => DeathReason::Exited,
            };
            self.remove_member(id, Some(reason));
        }
    }

    fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.emit(EventKind::Closed);
        }
    }

    /// Whether `closed` was emitted (no more joins).
    pub(super) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Checks the pool's invariants (tests call it after every step).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.check_stream()?;
        for (id, rec) in &self.members {
            if rec.member.id != *id || *id >= self.next_id || rec.seq > self.head {
                return Err(format!("member {id} is inconsistent: {rec:?}"));
            }
            if let Some(conn) = rec.conn {
                let back = self.conns.get(&conn).and_then(|c| c.member);
                if back.is_some() && back != Some(*id) {
                    return Err(format!("member {id}'s connection {conn} carries {back:?}"));
                }
            }
        }
        for (conn, c) in &self.conns {
            if let Some(id) = c.member {
                let rec = self
                    .members
                    .get(&id)
                    .ok_or(format!("connection {conn} carries dead member {id}"))?;
                if rec.conn != Some(*conn) {
                    return Err(format!(
                        "connection {conn} carries member {id} of {:?}",
                        rec.conn
                    ));
                }
                if self.watchers.contains_key(conn) {
                    return Err(format!("connection {conn} is both member {id} and watcher"));
                }
            }
        }
        self.check_elections()
    }
}

fn check_name(name: &str, what: &str) -> Result<(), Refusal> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(refuse(
            format!(
                "a {what} name must have 1 to {MAX_NAME} bytes, not {}",
                name.len()
            ),
            "pick a shorter name",
        ));
    }
    Ok(())
}

/// The start of a line, for error messages.
fn shorten(line: &str) -> String {
    match line.char_indices().nth(80) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_string(),
    }
}
