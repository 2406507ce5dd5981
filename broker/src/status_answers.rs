//! [`StatusAnswers`]: `rb status` answers (every host's row, in parts) built by the core a
//! piece at a time, between its other events.
//!
//! Why: at 100k hosts one answer took the core 30–90 ms (each host's live part, the
//! allocator's fields and policy note), and every report and grant waited behind it; a
//! dashboard asking every few seconds held grants that long each time. Now the core builds
//! an answer for at most [`STATUS_TURN`] at a time and takes its other events between two
//! pieces. Each piece holds its hosts' rows as they are when it is built, after the request
//! came: what was done before someone asked is in their answer. A host added meanwhile (a
//! Slurm pilot's) starts the answer again, so no host is missed or listed twice.

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::{
    hosts::{HostTable, StatusPart},
    jobs::JobDesk,
};

/// The longest the core builds an answer at a time (about 1500 hosts' rows at 100k hosts
/// on this machine, all of them at 10k).
pub const STATUS_TURN: Duration = Duration::from_millis(1);

/// Who waits for the rows.
pub type StatusReply = oneshot::Sender<Vec<StatusPart>>;

/// The answers asked for and the one being built.
#[derive(Default)]
pub struct StatusAnswers {
    /// Asked since the answer being built started: they get the next.
    asked: Vec<StatusReply>,
    building: Option<Building>,
}

/// An answer being built.
struct Building {
    waiting: Vec<StatusReply>,
    parts: Vec<StatusPart>,
    /// The first host (in name order) whose part is not built yet.
    next: usize,
    /// The table's length when it started.
    hosts: usize,
}

impl StatusAnswers {
    /// Someone asks for every host's row.
    pub fn ask(&mut self, reply: StatusReply) {
        self.asked.push(reply);
    }

    /// Whether an answer is asked for or being built.
    pub fn busy(&self) -> bool {
        self.building.is_some() || !self.asked.is_empty()
    }

    /// Builds the next piece of the answer (starting one for those who asked) for at most
    /// [`STATUS_TURN`], rows as of `now`; sends it once whole.
    pub fn build(&mut self, table: &HostTable, desk: &JobDesk, now: Instant) {
        self.build_for(STATUS_TURN, table, desk, now);
    }

    /// [`Self::build`] for at most `turn` (the table's first few hundred hosts at least).
    fn build_for(&mut self, turn: Duration, table: &HostTable, desk: &JobDesk, now: Instant) {
        let building = match &mut self.building {
            Some(building) => building,
            None if self.asked.is_empty() => return,
            None => self.building.insert(Building {
                waiting: std::mem::take(&mut self.asked),
                parts: Vec::with_capacity(table.len()),
                next: 0,
                hosts: table.len(),
            }),
        };
        if building.hosts != table.len() {
            building.parts.clear();
            building.next = 0;
            building.hosts = table.len();
        }
        let mut notes = match table.name_at(building.next) {
            Some(host) => desk.policy_notes_from(host),
            None => desk.policy_notes(),
        };
        let until = Instant::now() + turn;
        building.next = table.status_parts_from(
            building.next,
            now,
            |host, live| desk.annotate_live(host, live, &mut notes, now),
            &mut building.parts,
            || Instant::now() < until,
        );
        if building.next >= table.len() {
            if let Some(done) = self.building.take() {
                done.send();
            }
        }
    }
}

impl Building {
    fn send(self) {
        let Building {
            mut waiting, parts, ..
        } = self;
        let last = waiting.pop();
        for reply in waiting {
            let _ = reply.send(parts.clone());
        }
        if let Some(reply) = last {
            let _ = reply.send(parts);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::{alloc::Allocator, hosts::STATUS_PARTS_ASK};
    use config::HostEntry;

    fn lab(n: usize) -> (HostTable, JobDesk) {
        let entries: Vec<HostEntry> = (0..n)
            .map(|i| HostEntry {
                name: format!("node{i:05}"),
                address: format!("10.0.{}.{}", i / 256, i % 256),
                labels: Vec::new(),
                owner: None,
            })
            .collect();
        let table = HostTable::new(&entries, Duration::from_secs(30));
        let desk = JobDesk::new(Allocator::new(), Vec::new(), "manual", Path::new("/none"));
        (table, desk)
    }

    /// The names of the rows, in order.
    fn names(parts: &[StatusPart]) -> Vec<String> {
        parts
            .iter()
            .map(|p| {
                let row: serde_json::Value = serde_json::from_slice(&p.fixed_json).expect("json");
                row["name"].as_str().expect("a name").to_string()
            })
            .collect()
    }

    /// With no time to spare, each turn builds the rows of [`STATUS_PARTS_ASK`] hosts; the
    /// answer, once whole, lists every host once, in name order, as one built at once.
    #[test]
    fn an_answer_is_built_a_piece_a_turn_and_lists_every_host_once() {
        let (table, desk) = lab(3 * STATUS_PARTS_ASK + 10);
        let now = Instant::now();
        let mut answers = StatusAnswers::default();
        let (tx, mut rx) = oneshot::channel();
        answers.ask(tx);
        let mut turns = 0;
        while answers.busy() {
            answers.build_for(Duration::ZERO, &table, &desk, now);
            turns += 1;
            assert!(turns <= 4, "more turns than pieces");
        }
        assert_eq!(turns, 4);
        let parts = rx.try_recv().expect("the answer");
        let whole = table.status_parts(now, |_, _| {});
        assert_eq!(names(&parts), names(&whole));
        assert_eq!(parts.len(), 3 * STATUS_PARTS_ASK + 10);
    }

    /// Who asks while an answer is being built gets the next one, built after they asked;
    /// who asked before it started gets it, all of them.
    #[test]
    fn who_asks_during_an_answer_gets_the_next() {
        let (table, desk) = lab(2 * STATUS_PARTS_ASK);
        let now = Instant::now();
        let mut answers = StatusAnswers::default();
        let (first, mut first_rx) = oneshot::channel();
        let (second, mut second_rx) = oneshot::channel();
        answers.ask(first);
        answers.ask(second);
        answers.build_for(Duration::ZERO, &table, &desk, now);
        let (late, mut late_rx) = oneshot::channel();
        answers.ask(late);
        answers.build_for(Duration::ZERO, &table, &desk, now);
        assert_eq!(
            first_rx.try_recv().expect("first").len(),
            2 * STATUS_PARTS_ASK
        );
        assert_eq!(
            second_rx.try_recv().expect("second").len(),
            2 * STATUS_PARTS_ASK
        );
        assert!(
            late_rx.try_recv().is_err(),
            "answered from rows built before it asked"
        );
        assert!(answers.busy());
        while answers.busy() {
            answers.build_for(Duration::ZERO, &table, &desk, now);
        }
        assert_eq!(
            late_rx.try_recv().expect("late").len(),
            2 * STATUS_PARTS_ASK
        );
    }

    /// A host that joins while an answer is built (a Slurm pilot's) is in it, and no host is
    /// listed twice.
    #[test]
    fn a_host_that_joins_during_an_answer_is_in_it_once() {
        let (mut table, desk) = lab(2 * STATUS_PARTS_ASK);
        let now = Instant::now();
        let mut answers = StatusAnswers::default();
        let (tx, mut rx) = oneshot::channel();
        answers.ask(tx);
        answers.build_for(Duration::ZERO, &table, &desk, now);
        table.add_pilot("node00000-pilot", "10.9.9.9");
        while answers.busy() {
            answers.build_for(Duration::ZERO, &table, &desk, now);
        }
        let listed = names(&rx.try_recv().expect("the answer"));
        assert_eq!(listed.len(), 2 * STATUS_PARTS_ASK + 1);
        assert_eq!(listed[1], "node00000-pilot");
        let mut unique = listed.clone();
        unique.dedup();
        assert_eq!(unique, listed);
    }
}
