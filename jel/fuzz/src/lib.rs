//! Harness of the `jel` fuzz target: arbitrary bytes as the lines a job's processes send its
//! JEL pool, over several connections, with the agent's inputs (hosts granted, reclaimed,
//! lost; ticks; closes) between them, fed to a [`Pool`] through [`Pool::handle_batch`] as
//! the agent's shell feeds it; and every line decoded as each wire type ([`jel::wire`]).
//!
//! The input is lines. A line starting with `#` is the shell's (one batch ends before it):
//! `#jel WORDS` (first line only: the RSL `jel` value), `#N` (a digit: later lines come
//! from connection N, opened when the shell has it closed), `#close`, `#slow` (the shell
//! stops or resumes reporting this connection's flushes), `#tick` (31 s pass),
//! `#grant H`, `#reclaim H`, `#release H`, `#lost H`, `#kill H PID`, `#end` (no more
//! joins), `#terminate`. Any other line is a line the current connection sent.
//!
//! Shared by the cargo-fuzz target (`fuzz_targets/`) and by `tests/tests/fuzz_smoke.rs`
//! (which includes this file). A bug is a panic, a broken [`Pool::check_invariants`], an
//! output to a connection the shell closed, a sent line that is not one JSON line of the
//! wire types, a `seq` that does not grow (by one, for reliable membership) on what one
//! connection receives, and a member id that two `joined` events give.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use jel::{
    pool::{ConnId, Input, Membership, Output, Pool, PoolConfig},
    wire::{to_line, Event, EventKind, Hello, Reply, Request},
};
use serde::{de::DeserializeOwned, Serialize};

/// Hosts of the connections: connection N comes from `HOSTS[N % 3]`.
const HOSTS: [&str; 3] = ["front", "nodea", "nodeb"];

/// The whole input as one run of the pool, then every line decoded alone.
pub fn jel_lines(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n').peekable();
    let rsl = lines
        .peek()
        .and_then(|l| l.strip_prefix("#jel "))
        .map(str::to_string);
    let mut config = match rsl {
        Some(words) => {
            lines.next();
            PoolConfig::from_rsl(&words).unwrap_or_default()
        }
        None => PoolConfig::default(),
    };
    // Small, so that short inputs reach compaction, snapshots and slow watchers.
    config.max_log = 8;
    config.max_buffer = 16;
    let mut shell = Shell::new(config);
    let mut batch = Vec::new();
    for line in lines {
        match line.strip_prefix('#') {
            Some(command) => {
                shell.run(std::mem::take(&mut batch));
                let inputs = shell.command(command);
                shell.run(inputs);
            }
            None => {
                let conn = shell.current;
                batch.extend(shell.open_if_closed(conn));
                batch.push(Input::Line {
                    conn,
                    line: line.to_string(),
                });
            }
        }
    }
    shell.run(batch);
    decode_each_line(data);
}

/// True when every line that is not the shell's is a line of the JEL protocol.
pub fn every_line_is_jel(data: &[u8]) -> bool {
    std::str::from_utf8(data).is_ok_and(|text| {
        text.lines().filter(|l| !l.starts_with('#')).all(|l| {
            decodes::<Hello>(l)
                || decodes::<Request>(l)
                || decodes::<Reply>(l)
                || decodes::<Event>(l)
        })
    })
}

fn decodes<T: DeserializeOwned>(line: &str) -> bool {
    serde_json::from_str::<T>(line).is_ok()
}

/// What the agent's shell knows: the pool, the clock, its open connections.
struct Shell {
    pool: Pool,
    reliable: bool,
    now: Instant,
    current: ConnId,
    open: BTreeSet<ConnId>,
    slow: BTreeSet<ConnId>,
    /// The seq of the last event each open connection received.
    last_seq: BTreeMap<ConnId, u64>,
    /// Member ids by the seq of their `joined`.
    joined: BTreeMap<u64, u64>,
}

impl Shell {
    fn new(config: PoolConfig) -> Shell {
        Shell {
            reliable: config.membership == Membership::Reliable,
            pool: Pool::new(config),
            now: Instant::now(),
            current: 0,
            open: BTreeSet::new(),
            slow: BTreeSet::new(),
            last_seq: BTreeMap::new(),
            joined: BTreeMap::new(),
        }
    }

    fn open_if_closed(&mut self, conn: ConnId) -> Option<Input> {
        if !self.open.insert(conn) {
            return None;
        }
        self.last_seq.remove(&conn);
        let host = HOSTS[conn as usize % HOSTS.len()].to_string();
        let pid = Some(100 + conn as u32);
        Some(Input::Opened { conn, host, pid })
    }

    /// The inputs of one shell line.
    fn command(&mut self, command: &str) -> Vec<Input> {
        let mut words = command.split(' ');
        let verb = words.next().unwrap_or_default();
        let host = words.next().unwrap_or("nodeb").to_string();
        let number = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        if let Ok(n) = verb.parse::<u8>() {
            self.current = ConnId::from(n % 10);
            return self.open_if_closed(self.current).into_iter().collect();
        }
        match verb {
            "close" if self.open.remove(&self.current) => {
                vec![Input::Closed { conn: self.current }]
            }
            "slow" => {
                if !self.slow.remove(&self.current) {
                    self.slow.insert(self.current);
                }
                Vec::new()
            }
            "tick" => {
                self.now += Duration::from_secs(31);
                vec![Input::Tick]
            }
            "grant" => vec![Input::HostGranted { host }],
            "reclaim" => vec![Input::Reclaim {
                host,
                deadline_ms: 1_764_000_005_000,
            }],
            "release" => vec![Input::HostReleased { host }],
            "lost" => vec![Input::HostLost { host }],
            "kill" => vec![Input::Killed { host, pid: number }],
            "end" => vec![Input::Close],
            "terminate" => vec![Input::Terminate],
            _ => Vec::new(),
        }
    }

    /// One batch, then the flushes it caused, checking everything after each.
    fn run(&mut self, inputs: Vec<Input>) {
        let mut inputs = inputs;
        // A flush may let a watcher's held lines go: a few rounds drain them.
        for _ in 0..4 {
            if inputs.is_empty() {
                return;
            }
            let outputs = self.pool.handle_batch(inputs, self.now);
            if let Err(e) = self.pool.check_invariants() {
                panic!("invariant broken: {e}\n{:#?}", self.pool);
            }
            inputs = self.perform(outputs);
        }
    }

    /// Performs the outputs; the flushes to report.
    fn perform(&mut self, outputs: Vec<Output>) -> Vec<Input> {
        let mut flushed = Vec::new();
        for output in outputs {
            match output {
                Output::Send { conn, lines } => {
                    assert!(
                        self.open.contains(&conn),
                        "sent to closed {conn}: {lines:?}"
                    );
                    for line in &lines {
                        self.received(conn, line.as_str());
                    }
                    if !self.slow.contains(&conn) {
                        let lines = lines.len();
                        flushed.push(Input::Flushed { conn, lines });
                    }
                }
                Output::Disconnect { conn, .. } => {
                    assert!(self.open.remove(&conn), "disconnected closed {conn}");
                }
            }
        }
        // The shell forgets a disconnected connection: it reports no flush for it.
        flushed.retain(|f| matches!(f, Input::Flushed { conn, .. } if self.open.contains(conn)));
        flushed
    }

    /// One line written to `conn`: one JSON line of a wire type, events in order.
    fn received(&mut self, conn: ConnId, line: &str) {
        let body = line.strip_suffix('\n');
        let body = body.unwrap_or_else(|| panic!("a line without its newline: {line:?}"));
        assert!(!body.contains('\n'), "two lines in one: {line:?}");
        let Ok(event) = serde_json::from_str::<Event>(body) else {
            assert!(
                decodes::<Hello>(body) || decodes::<Reply>(body),
                "not a line of the protocol: {body}"
            );
            return;
        };
        round_trip(&event);
        if let Some(last) = self.last_seq.insert(conn, event.seq) {
            let gap_ok = !self.reliable || matches!(event.kind, EventKind::Snapshot { .. });
            assert!(
                event.seq > last && (gap_ok || event.seq == last + 1),
                "connection {conn} got seq {} after {last}",
                event.seq
            );
        }
        if let EventKind::Joined { member } = &event.kind {
            let reused = self
                .joined
                .iter()
                .find(|(seq, id)| **seq != event.seq && **id == member.id);
            assert!(reused.is_none(), "member id {} joined twice", member.id);
            self.joined.insert(event.seq, member.id);
        }
    }
}

/// Every line of `data` decoded as each wire type; what decodes encodes and decodes again.
fn decode_each_line(data: &[u8]) {
    for line in data.split(|&b| b == b'\n') {
        let Ok(text) = std::str::from_utf8(line) else {
            continue;
        };
        try_round_trip::<Hello>(text);
        try_round_trip::<Request>(text);
        try_round_trip::<Reply>(text);
        try_round_trip::<Event>(text);
    }
}

fn try_round_trip<T: Serialize + DeserializeOwned>(text: &str) {
    if let Ok(value) = serde_json::from_str::<T>(text) {
        round_trip(&value);
    }
}

fn round_trip<T: Serialize + DeserializeOwned>(value: &T) {
    let line = to_line(value);
    serde_json::from_str::<T>(&line).expect("an encoded line decodes");
}
