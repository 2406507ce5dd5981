//! Scenario tests of the pool core (each checks the invariants after every step) and a
//! seeded random walk that also checks every watcher's view against the pool.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use super::*;
use crate::wire::{DeathReason, EventKind, Member, MemberId};

/// A pool, a clock, and a shell that records what each connection was sent.
struct Lab {
    pool: Pool,
    now: Instant,
    got: HashMap<ConnId, Vec<String>>,
    /// Connections whose shell never reports a flush.
    slow: HashSet<ConnId>,
    gone: HashMap<ConnId, DisconnectReason>,
    next_conn: ConnId,
}

impl Lab {
    fn new(config: PoolConfig) -> Lab {
        Lab {
            pool: Pool::new(config),
            now: Instant::now(),
            got: HashMap::new(),
            slow: HashSet::new(),
            gone: HashMap::new(),
            next_conn: 1,
        }
    }

    fn run(&mut self, inputs: Vec<Input>) -> Vec<Output> {
        let out = self.pool.handle_batch(inputs, self.now);
        self.check();
        let mut flushed = Vec::new();
        for o in &out {
            match o {
                Output::Send { conn, lines } => {
                    assert!(
                        !self.gone.contains_key(conn),
                        "sent to closed {conn}: {lines:?}"
                    );
                    let got = self.got.entry(*conn).or_default();
                    got.extend(lines.iter().map(|l| l.as_str().to_string()));
                    if !self.slow.contains(conn) {
                        flushed.push(Input::Flushed {
                            conn: *conn,
                            lines: lines.len(),
                        });
                    }
                }
                Output::Disconnect { conn, reason } => {
                    self.gone.insert(*conn, *reason);
                }
            }
        }
        let more = self.pool.handle_batch(flushed, self.now);
        assert!(more.is_empty(), "a flush caused {more:?}");
        self.check();
        out
    }

    fn input(&mut self, input: Input) -> Vec<Output> {
        self.run(vec![input])
    }

    fn check(&self) {
        if let Err(e) = self.pool.check_invariants() {
            panic!("invariant broken: {e}\n{:#?}", self.pool);
        }
    }

    fn open(&mut self, host: &str) -> ConnId {
        let conn = self.next_conn;
        self.next_conn += 1;
        let host = host.to_string();
        self.input(Input::Opened {
            conn,
            host,
            pid: Some(1000 + conn as u32),
        });
        let hello = self.say(conn, json!({"jel": 1}));
        assert_eq!(hello["jel"], 1, "{hello}");
        conn
    }

    /// Sends one line; returns the last line the connection got back, parsed.
    fn say(&mut self, conn: ConnId, request: Value) -> Value {
        let line = request.to_string();
        self.input(Input::Line { conn, line });
        let last = self.got[&conn].last().expect("a reply");
        serde_json::from_str(last).expect("json")
    }

    fn join(&mut self, host: &str, name: Option<&str>) -> (ConnId, MemberId) {
        let conn = self.open(host);
        let reply = self.say(conn, json!({"op": "join", "name": name}));
        assert_eq!(reply["reply"], "join", "{reply}");
        (conn, reply["member"]["id"].as_u64().expect("id"))
    }

    fn watcher(&mut self, from: u64) -> ConnId {
        let conn = self.open("front");
        self.input(Input::Line {
            conn,
            line: json!({"op": "watch", "from": from}).to_string(),
        });
        conn
    }

    /// The events a connection got, in order.
    fn events(&self, conn: ConnId) -> Vec<Event> {
        let lines = self.got.get(&conn).map(Vec::as_slice).unwrap_or_default();
        lines
            .iter()
            .filter(|l| l.contains("\"event\""))
            .map(|l| serde_json::from_str(l).expect("event"))
            .collect()
    }

    fn kinds(&self, conn: ConnId) -> Vec<String> {
        let kind = |e: &Event| {
            let v = serde_json::to_value(e).expect("json");
            v["event"].as_str().expect("kind").to_string()
        };
        self.events(conn).iter().map(kind).collect()
    }

    fn close(&mut self, conn: ConnId) -> Vec<Output> {
        self.input(Input::Closed { conn })
    }
}

fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

fn death(e: &Event) -> Option<(MemberId, DeathReason)> {
    match &e.kind {
        EventKind::Died { member, reason } => Some((member.id, *reason)),
        _ => None,
    }
}

fn winner(e: &Event) -> Option<(Option<MemberId>, u64)> {
    match &e.kind {
        EventKind::Elected { winner, epoch, .. } => Some((winner.as_ref().map(|m| m.id), *epoch)),
        _ => None,
    }
}

#[test]
fn every_watcher_sees_the_same_stream_from_seq_1() {
    let mut lab = Lab::new(PoolConfig::default());
    let early = lab.watcher(1);
    lab.input(Input::HostGranted {
        host: "nodeb".into(),
    });
    let (_, a) = lab.join("front", Some("a"));
    let (_, b) = lab.join("nodeb", Some("a"));
    assert_ne!(
        a, b,
        "two members may share a name; the id tells them apart"
    );
    let late = lab.watcher(1);
    assert_eq!(seqs(&lab.events(early)), vec![1, 2, 3]);
    assert_eq!(lab.events(early), lab.events(late));
    assert_eq!(lab.kinds(early), ["host_granted", "joined", "joined"]);
}

#[test]
fn a_reconnecting_watcher_resumes_with_no_gap_and_no_duplicate() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    lab.join("front", None);
    lab.join("front", None);
    let last = lab.events(w).last().expect("events").seq;
    lab.close(w);
    lab.join("nodeb", None);
    lab.join("nodec", None);
    let again = lab.watcher(last + 1);
    lab.join("front", None);
    let mut all = lab.events(w);
    all.extend(lab.events(again));
    assert_eq!(seqs(&all), vec![1, 2, 3, 4, 5]);
}

#[test]
fn a_watcher_behind_the_compaction_point_gets_a_snapshot_not_a_gap() {
    let config = PoolConfig {
        max_log: 3,
        ..PoolConfig::default()
    };
    let mut lab = Lab::new(config);
    let (c, _) = lab.join("front", Some("boss"));
    lab.say(c, json!({"op": "elect", "name": "master"}));
    for _ in 0..4 {
        lab.join("nodeb", None);
    }
    let head = lab.pool.head();
    let w = lab.watcher(1);
    let got = lab.events(w);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[0].seq, head,
        "the snapshot is the state as of the newest seq"
    );
    let EventKind::Snapshot {
        members, elections, ..
    } = &got[0].kind
    else {
        panic!("not a snapshot: {got:?}");
    };
    assert_eq!(members.len(), 5);
    assert_eq!(
        elections[0].winner.as_ref().map(Member::label),
        Some("boss".into())
    );
    lab.join("nodec", None);
    assert_eq!(lab.events(w).last().expect("live").seq, head + 1);
    let recent = lab.watcher(head - 1);
    assert_eq!(seqs(&lab.events(recent)), vec![head - 1, head, head + 1]);
}

#[test]
fn watching_from_the_future_is_refused() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.open("front");
    let reply = lab.say(w, json!({"op": "watch", "from": 5}));
    assert_eq!(reply["reply"], "error", "{reply}");
    assert!(reply["error"]
        .as_str()
        .expect("error")
        .contains("after the newest"));
}

#[test]
fn uniform_election_re_elects_among_the_remaining_candidates_with_a_growing_epoch() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (ca, a) = lab.join("front", Some("a"));
    let (cb, b) = lab.join("nodeb", Some("b"));
    let (cc, c) = lab.join("nodec", Some("c"));
    let r = lab.say(ca, json!({"op": "elect", "name": "m"}));
    assert_eq!(
        (r["winner"]["id"].as_u64(), r["epoch"].as_u64()),
        (Some(a), Some(1))
    );
    let r = lab.say(cb, json!({"op": "elect", "name": "m"}));
    assert_eq!(
        r["winner"]["id"].as_u64(),
        Some(a),
        "the first one in stays"
    );
    lab.say(cc, json!({"op": "elect", "name": "m"}));
    lab.say(ca, json!({"op": "leave"}));
    lab.close(cb);
    let r = lab.say(cc, json!({"op": "result", "name": "m"}));
    assert_eq!(
        (r["winner"]["id"].as_u64(), r["epoch"].as_u64()),
        (Some(c), Some(3))
    );
    lab.close(cc);
    let elected: Vec<_> = lab.events(w).iter().filter_map(winner).collect();
    assert_eq!(
        elected,
        vec![(Some(a), 1), (Some(b), 2), (Some(c), 3), (None, 4)]
    );
}

#[test]
fn leave_replies_the_seq_of_left_even_when_an_elected_follows() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (c, _) = lab.join("front", None);
    lab.say(c, json!({"op": "elect", "name": "m"}));
    let r = lab.say(c, json!({"op": "leave"}));
    let left = lab
        .events(w)
        .into_iter()
        .find(|e| matches!(e.kind, EventKind::Left { .. }));
    assert_eq!(r["seq"].as_u64(), left.map(|e| e.seq), "{r}");
    assert_eq!(lab.kinds(w), ["joined", "elected", "left", "elected"]);
}

#[test]
fn non_uniform_election_announces_no_winner_and_the_next_elect_wins() {
    let config = PoolConfig::from_rsl("reliable,nonuniform").expect("rsl");
    let mut lab = Lab::new(config);
    let w = lab.watcher(1);
    let (ca, a) = lab.join("front", None);
    let (cb, b) = lab.join("front", None);
    lab.say(ca, json!({"op": "elect", "name": "m"}));
    lab.say(cb, json!({"op": "elect", "name": "m"}));
    lab.close(ca);
    let r = lab.say(cb, json!({"op": "result", "name": "m"}));
    assert_eq!(r["winner"], Value::Null);
    lab.say(cb, json!({"op": "elect", "name": "m"}));
    let elected: Vec<_> = lab.events(w).iter().filter_map(winner).collect();
    assert_eq!(elected, vec![(Some(a), 1), (None, 2), (Some(b), 3)]);
}

#[test]
fn a_connection_closed_without_leave_is_died_exited_and_leave_is_left() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (c1, m1) = lab.join("front", None);
    let (c2, _) = lab.join("front", None);
    lab.close(c1);
    lab.say(c2, json!({"op": "leave"}));
    lab.close(c2);
    assert_eq!(lab.kinds(w), ["joined", "joined", "died", "left"]);
    assert_eq!(death(&lab.events(w)[2]), Some((m1, DeathReason::Exited)));
}

#[test]
fn a_lost_host_kills_only_its_members_and_cuts_its_connections() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (_, on_b) = lab.join("nodeb", None);
    let (cb, _) = lab.join("nodeb", None);
    let (_, on_c) = lab.join("nodec", None);
    let out = lab.input(Input::HostLost {
        host: "nodeb".into(),
    });
    assert!(out.contains(&Output::Disconnect {
        conn: cb,
        reason: DisconnectReason::HostGone
    }));
    let deaths: Vec<_> = lab.events(w).iter().filter_map(death).collect();
    assert_eq!(
        deaths,
        vec![
            (on_b, DeathReason::HostLost),
            (on_b + 1, DeathReason::HostLost)
        ]
    );
    assert_eq!(
        lab.pool.members().map(|m| m.id).collect::<Vec<_>>(),
        vec![on_c]
    );
}

#[test]
fn a_reclaim_puts_vacate_first_then_left_or_died_vacated_then_host_released() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (c1, _) = lab.join("nodeb", None);
    let (c2, m2) = lab.join("nodeb", None);
    let (_, m3) = lab.join("nodeb", None);
    lab.join("front", None);
    lab.input(Input::Reclaim {
        host: "nodeb".into(),
        deadline_ms: 1_700_000_005_000,
    });
    let vacate = lab.events(w).last().expect("vacate").clone();
    let EventKind::Vacate {
        host,
        members,
        deadline,
    } = vacate.kind
    else {
        panic!("not vacate: {vacate:?}");
    };
    assert_eq!(
        (host.as_str(), members.len(), deadline),
        ("nodeb", 3, 1_700_000_005_000)
    );
    lab.say(c1, json!({"op": "leave"}));
    lab.close(c2);
    lab.input(Input::HostReleased {
        host: "nodeb".into(),
    });
    let tail: Vec<String> = lab.kinds(w).split_off(4);
    assert_eq!(tail, ["vacate", "left", "died", "died", "host_released"]);
    let deaths: Vec<_> = lab.events(w).iter().filter_map(death).collect();
    assert_eq!(
        deaths,
        vec![(m2, DeathReason::Vacated), (m3, DeathReason::Vacated)]
    );
}

#[test]
fn a_host_handed_back_without_reclaim_kills_its_members() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (_, m) = lab.join("nodeb", None);
    let (_, k) = lab.join("front", None);
    lab.input(Input::Killed {
        host: "front".into(),
        pid: 1000 + k as u32 + 1,
    });
    lab.input(Input::HostReleased {
        host: "nodeb".into(),
    });
    let deaths: Vec<_> = lab.events(w).iter().filter_map(death).collect();
    assert_eq!(
        deaths,
        vec![(k, DeathReason::Killed), (m, DeathReason::Killed)]
    );
}

#[test]
fn host_events_of_a_granted_host_named_as_the_front_end_leave_front_end_members_alone() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    // node02 runs the agent and is granted to the job too: one member on the front end,
    // one started under the grant (through the subagent there).
    let conn = lab.next_conn;
    lab.next_conn += 1;
    lab.input(Input::OpenedFrontEnd {
        conn,
        host: "node02".into(),
        pid: None,
    });
    lab.say(conn, json!({"jel": 1}));
    let reply = lab.say(conn, json!({"op": "join", "name": "fe"}));
    let fe = reply["member"]["id"].as_u64().expect("id");
    assert_eq!(reply["member"]["host"], "node02", "{reply}");
    let (_, granted) = lab.join("node02", Some("granted"));
    lab.input(Input::Reclaim {
        host: "node02".into(),
        deadline_ms: 1,
    });
    lab.input(Input::Killed {
        host: "node02".into(),
        pid: 0,
    });
    lab.input(Input::HostLost {
        host: "node02".into(),
    });
    let vacate = lab.events(w).into_iter().find_map(|e| match e.kind {
        EventKind::Vacate { members, .. } => Some(members),
        _ => None,
    });
    let ids: Vec<MemberId> = vacate.expect("vacate").iter().map(|m| m.id).collect();
    assert_eq!(ids, vec![granted]);
    let deaths: Vec<_> = lab.events(w).iter().filter_map(death).collect();
    assert_eq!(deaths, vec![(granted, DeathReason::HostLost)]);
    let reply = lab.say(conn, json!({"op": "members"}));
    assert!(
        reply.to_string().contains(&format!("\"id\":{fe}")),
        "{reply}"
    );
}

#[test]
fn a_slow_watcher_is_cut_off_and_resumes_by_seq_without_gap() {
    let config = PoolConfig {
        max_buffer: 4,
        ..PoolConfig::default()
    };
    let mut lab = Lab::new(config);
    let w = lab.open("front");
    lab.slow.insert(w);
    lab.say(w, json!({"op": "watch"}));
    for _ in 0..5 {
        lab.join("front", None);
    }
    assert_eq!(lab.gone.get(&w), Some(&DisconnectReason::SlowConsumer));
    let got = lab.events(w);
    let again = lab.watcher(got.last().expect("some").seq + 1);
    let mut all = got;
    all.extend(lab.events(again));
    assert_eq!(seqs(&all), vec![1, 2, 3, 4, 5]);
}

#[test]
fn an_unreliable_pool_drops_events_for_a_slow_watcher_instead() {
    let config = PoolConfig {
        max_buffer: 3,
        ..PoolConfig::from_rsl("unreliable").expect("rsl")
    };
    let mut lab = Lab::new(config);
    let w = lab.open("front");
    lab.slow.insert(w);
    lab.say(w, json!({"op": "watch"}));
    for _ in 0..5 {
        lab.join("front", None);
    }
    assert!(lab.gone.is_empty());
    assert_eq!(
        seqs(&lab.events(w)),
        vec![1, 2],
        "the reply and two events fill 3"
    );
    lab.slow.clear();
    let recon = lab.watcher(2);
    assert_eq!(
        lab.kinds(recon),
        ["snapshot"],
        "no log: a snapshot, never the missed events"
    );
}

#[test]
fn a_stalled_watcher_is_cut_off_on_tick() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.open("front");
    lab.slow.insert(w);
    lab.say(w, json!({"op": "watch"}));
    lab.now += Duration::from_secs(29);
    lab.input(Input::Tick);
    assert!(lab.gone.is_empty());
    lab.now += Duration::from_secs(1);
    lab.input(Input::Tick);
    assert_eq!(lab.gone.get(&w), Some(&DisconnectReason::Stalled));
}

#[test]
fn many_events_in_one_batch_reach_each_watcher_in_one_send() {
    let mut lab = Lab::new(PoolConfig::default());
    let watchers: Vec<ConnId> = (0..3).map(|_| lab.watcher(1)).collect();
    let conns: Vec<ConnId> = (0..50).map(|_| lab.open("front")).collect();
    let joins = conns.iter().map(|&conn| Input::Line {
        conn,
        line: r#"{"op":"join"}"#.into(),
    });
    let out = lab.run(joins.collect());
    for w in watchers {
        let sends: Vec<usize> = out
            .iter()
            .filter_map(|o| match o {
                Output::Send { conn, lines } if *conn == w => Some(lines.len()),
                _ => None,
            })
            .collect();
        assert_eq!(sends, vec![50]);
    }
}

#[test]
fn hello_of_another_version_is_refused_and_requests_need_a_member() {
    let mut lab = Lab::new(PoolConfig::default());
    let conn = 99;
    lab.input(Input::Opened {
        conn,
        host: "front".into(),
        pid: None,
    });
    let reply = lab.say(conn, json!({"jel": 2}));
    assert_eq!(reply["reply"], "error");
    assert_eq!(lab.gone.get(&conn), Some(&DisconnectReason::BadHello));
    let c = lab.open("front");
    for op in ["leave", "elect", "signal"] {
        let r = lab.say(c, json!({"op": op, "name": "x"}));
        assert_eq!(r["error"], "this connection is not a member", "{op}: {r}");
    }
    let r = lab.say(c, json!({"op": "dance"}));
    assert!(
        r["help"].as_str().expect("help").contains("PROTOCOL.md"),
        "{r}"
    );
    let r = lab.say(c, json!({"op": "join", "name": ""}));
    assert_eq!(r["reply"], "error", "{r}");
}

#[test]
fn a_signal_names_its_sender_and_addressees_and_unknown_ones_are_refused() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (ca, a) = lab.join("front", Some("a"));
    let (_, b) = lab.join("front", Some("b"));
    let r = lab.say(
        ca,
        json!({"op": "signal", "name": "go", "to": [b], "payload": {"n": 1}}),
    );
    assert_eq!(r["reply"], "signal");
    let r = lab.say(ca, json!({"op": "signal", "name": "go", "to": [77]}));
    assert_eq!(r["reply"], "error");
    let last = lab.events(w).pop().expect("signal");
    assert_eq!(
        last.kind,
        EventKind::Signal {
            name: "go".into(),
            from: lab.pool.members().find(|m| m.id == a).expect("a").clone(),
            to: vec![b],
            payload: json!({"n": 1}),
        }
    );
}

#[test]
fn terminate_closes_the_pool_and_nothing_follows_terminated() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    let (c, _) = lab.join("front", None);
    lab.input(Input::Terminate);
    let fresh = lab.open("front");
    let r = lab.say(fresh, json!({"op": "join"}));
    assert_eq!(r["reply"], "error");
    lab.close(c);
    assert_eq!(lab.kinds(w), ["joined", "closed", "terminated"]);
}

#[test]
fn rsl_jel_values_parse_and_bad_words_are_named() {
    let c = PoolConfig::from_rsl("").expect("empty");
    assert_eq!(c.consistency(), "reliable,uniform");
    let c = PoolConfig::from_rsl("unreliable, non-uniform").expect("both");
    assert_eq!(c.consistency(), "unreliable,nonuniform");
    let e = PoolConfig::from_rsl("reliable,strict").expect_err("strict");
    assert!(e.to_string().contains("`strict`") && e.to_string().contains("help:"));
}

/// xorshift64*: deterministic randomness without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// Member hosts (watchers connect from "front", which is never lost).
const HOSTS: [&str; 3] = ["nodeb", "nodec", "noded"];

/// The members and winners a watcher knows, from the events it got.
#[derive(Default, Debug, PartialEq)]
struct Replica {
    members: BTreeMap<MemberId, Member>,
    winners: BTreeMap<String, (Option<MemberId>, u64)>,
    seq: u64,
}

impl Replica {
    fn apply(&mut self, e: &Event) {
        assert_eq!(e.seq, self.seq + 1, "gap or duplicate before {e:?}");
        self.seq = e.seq;
        match &e.kind {
            EventKind::Joined { member } => {
                assert!(self.members.insert(member.id, member.clone()).is_none());
            }
            EventKind::Left { member } | EventKind::Died { member, .. } => {
                assert!(self.members.remove(&member.id).is_some(), "{e:?}");
            }
            EventKind::Elected {
                name,
                winner,
                epoch,
            } => {
                let old = self
                    .winners
                    .insert(name.clone(), (winner.as_ref().map(|m| m.id), *epoch));
                assert!(old.map_or(0, |o| o.1) < *epoch, "epoch must grow: {e:?}");
            }
            _ => {}
        }
    }
}

fn random_op(lab: &mut Lab, rng: &mut Rng, conns: &mut Vec<ConnId>) {
    let host = HOSTS[rng.below(3) as usize];
    let pick = |rng: &mut Rng, conns: &Vec<ConnId>| conns[rng.below(conns.len() as u64) as usize];
    match rng.below(13) {
        0..=3 => {
            let (c, _) = lab.join(host, Some(["a", "b"][rng.below(2) as usize]));
            conns.push(c);
        }
        4 | 5 if !conns.is_empty() => {
            let c = pick(rng, conns);
            let name = ["m", "n"][rng.below(2) as usize];
            lab.say(c, json!({"op": "elect", "name": name}));
        }
        6 if !conns.is_empty() => {
            let c = pick(rng, conns);
            lab.say(c, json!({"op": "leave"}));
        }
        7 if !conns.is_empty() => {
            let c = conns.swap_remove(rng.below(conns.len() as u64) as usize);
            lab.close(c);
        }
        8 => {
            let deadline_ms = 1_000;
            lab.input(Input::Reclaim {
                host: host.into(),
                deadline_ms,
            });
        }
        9 => {
            lab.input(Input::HostReleased { host: host.into() });
        }
        10 => {
            lab.input(Input::HostLost { host: host.into() });
        }
        11 if !conns.is_empty() => {
            // The test shell gives connection c the pid 1000 + c.
            let pid = 1000 + pick(rng, conns) as u32;
            lab.input(Input::Killed {
                host: host.into(),
                pid,
            });
        }
        _ => {
            lab.input(Input::HostGranted { host: host.into() });
        }
    }
    conns.retain(|c| !lab.gone.contains_key(c));
}

#[test]
fn random_walks_keep_the_invariants_and_every_watcher_agrees_with_the_pool() {
    for seed in [1, 7, 42, 2024, 0x9e37_79b9] {
        let mut rng = Rng(seed);
        let config = PoolConfig {
            max_log: 20,
            ..PoolConfig::default()
        };
        let mut lab = Lab::new(config);
        let watcher = lab.watcher(1);
        let mut conns = Vec::new();
        for step in 0..400 {
            random_op(&mut lab, &mut rng, &mut conns);
            let mut replica = Replica::default();
            for e in lab.events(watcher) {
                replica.apply(&e);
            }
            let members: BTreeMap<MemberId, Member> =
                lab.pool.members().map(|m| (m.id, m.clone())).collect();
            assert_eq!(replica.members, members, "seed {seed} step {step}");
            assert_eq!(replica.seq, lab.pool.head(), "seed {seed} step {step}");
            for (name, (w, epoch)) in &replica.winners {
                let (winner, e) = lab.pool.election_result(name);
                assert_eq!(
                    (winner.map(|m| m.id), e),
                    (*w, *epoch),
                    "seed {seed} step {step}"
                );
            }
            if step % 50 == 49 {
                let late = lab.watcher(lab.pool.head().saturating_sub(10).max(1));
                assert!(!lab.events(late).is_empty() || lab.pool.head() == 0);
            }
        }
    }
}

/// Not a unit test: `cargo test --release -p jel --lib -- --ignored --nocapture scale` prints
/// how long the core takes for 2000 watchers × 2000 joins (4 million deliveries).
#[test]
#[ignore]
fn scale_2000_watchers_see_2000_joins() {
    let mut pool = Pool::new(PoolConfig::default());
    let now = Instant::now();
    let n: u64 = 2000;
    let hello = |conn| Input::Line {
        conn,
        line: r#"{"jel":1}"#.into(),
    };
    let open = |conn| Input::Opened {
        conn,
        host: "front".into(),
        pid: None,
    };
    let watch = (0..n).flat_map(|c| {
        let line = r#"{"op":"watch"}"#.to_string();
        [open(c), hello(c), Input::Line { conn: c, line }]
    });
    pool.handle_batch(watch.collect::<Vec<_>>(), now);
    let started = Instant::now();
    let mut delivered = 0;
    for chunk in (n..2 * n).collect::<Vec<_>>().chunks(100) {
        let joins = chunk.iter().flat_map(|&c| {
            let line = r#"{"op":"join"}"#.to_string();
            [open(c), hello(c), Input::Line { conn: c, line }]
        });
        let mut flushed = Vec::new();
        for o in pool.handle_batch(joins.collect::<Vec<_>>(), now) {
            if let Output::Send { conn, lines } = o {
                delivered += lines.len();
                flushed.push(Input::Flushed {
                    conn,
                    lines: lines.len(),
                });
            }
        }
        assert!(pool.handle_batch(flushed, now).is_empty());
    }
    println!("{delivered} lines in {:?}", started.elapsed());
}

/// A watch connection takes no requests. Answering each with an error buffered without
/// bound for a client that writes and never reads (fuzz target `jel_lines`): it is cut off
/// at its first request instead, and the stream goes on for everyone else.
#[test]
fn a_request_on_a_watch_connection_cuts_it_off() {
    let mut lab = Lab::new(PoolConfig::default());
    let w = lab.watcher(1);
    lab.slow.insert(w);
    lab.input(Input::Line {
        conn: w,
        line: json!({"op": "members"}).to_string(),
    });
    assert_eq!(lab.gone.get(&w), Some(&DisconnectReason::RequestOnWatch));
    for _ in 0..50 {
        lab.input(Input::Line {
            conn: w,
            line: json!({"op": "members"}).to_string(),
        });
    }
    let other = lab.watcher(1);
    lab.join("front", None);
    assert!(lab
        .events(other)
        .iter()
        .any(|e| matches!(e.kind, EventKind::Joined { .. })));
    lab.pool.check_invariants().expect("invariants");
}

/// Replies to requests a connection sent before `watch` in the same batch are not written
/// yet: they are the first lines of the watcher's buffer (fuzz target `jel_lines`, seed
/// `bad-replies-then-watch`: a hello, 25 bad lines and `watch` in one batch made a watcher
/// holding 27 lines, over the bound of a 16-line buffer; `Lab::run` checks that invariant).
/// More replies than the buffer holds: cut off as a slow consumer. Fewer: they come first,
/// and count toward the buffer.
#[test]
fn replies_queued_before_watch_count_toward_the_watchers_buffer() {
    let config = PoolConfig {
        max_log: 8,
        max_buffer: 16,
        ..PoolConfig::default()
    };
    // One batch: `requests` bad lines, `watch`, then `events` events.
    let requests_then_watch = |lab: &mut Lab, requests: usize, events: usize| {
        let conn = lab.open("front");
        lab.slow.insert(conn);
        let line = |line: String| Input::Line { conn, line };
        let mut batch: Vec<Input> = (0..requests).map(|_| line(String::new())).collect();
        batch.push(line(json!({"op": "watch"}).to_string()));
        batch.extend((0..events).map(|i| Input::HostGranted {
            host: format!("h{i}"),
        }));
        lab.run(batch);
        conn
    };

    // Before the fix: a watcher holding 31 lines, over 16 + 8 + 2 (the invariant).
    let mut lab = Lab::new(config.clone());
    let cut = requests_then_watch(&mut lab, 30, 0);
    assert_eq!(lab.gone.get(&cut), Some(&DisconnectReason::SlowConsumer));
    // Before the fix: 5 + 1 + 11 lines buffered, over 16, and not cut off.
    let mut lab = Lab::new(config.clone());
    let over = requests_then_watch(&mut lab, 5, 11);
    assert_eq!(lab.gone.get(&over), Some(&DisconnectReason::SlowConsumer));

    let mut lab = Lab::new(config);
    let kept = requests_then_watch(&mut lab, 5, 10);
    let got = lab.got[&kept].clone();
    // The hello, the 5 error replies, the watch reply, 10 events: the buffer's 16 lines.
    assert_eq!(got.len(), 1 + 16, "{got:?}");
    assert!(got[1..6].iter().all(|l| l.contains("\"error\"")), "{got:?}");
    assert!(got[6].contains("\"reply\":\"watch\""), "{got:?}");
    assert_eq!(lab.events(kept).len(), 10);
    assert!(!lab.gone.contains_key(&kept));
    // It never flushes, so the next event finds its buffer full.
    lab.input(Input::HostGranted { host: "h".into() });
    assert_eq!(lab.gone.get(&kept), Some(&DisconnectReason::SlowConsumer));
}
