//! The master's task board: which task waits, which worker runs which, which are done.
//! Pure (no I/O, no clock): the master's loop feeds it what its workers and the job's JEL
//! stream say, and it keeps the one promise the example exists to show — every task is
//! counted exactly once, whatever hosts are taken back or die meanwhile.
//!
//! A task given back (its worker's host vacated, its worker died or left) waits again, at
//! the front. If the first worker's answer still arrives later it is taken (the search it
//! reports is complete), and the copy given out again is then ignored when it answers.

use std::collections::VecDeque;

/// A worker, as the master numbers its connections.
pub type WorkerId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running(WorkerId),
    Done,
}

/// The state of every task.
#[derive(Debug)]
pub struct Board {
    states: Vec<State>,
    /// Waiting tasks in the order they are handed out (may hold tasks since done: skipped).
    queue: VecDeque<usize>,
    done: usize,
    handed_out_again: usize,
}

impl Board {
    /// `tasks` tasks, all waiting, handed out in order.
    pub fn new(tasks: usize) -> Board {
        Board {
            states: vec![State::Waiting; tasks],
            queue: (0..tasks).collect(),
            done: 0,
            handed_out_again: 0,
        }
    }

    /// The next waiting task, now run by `worker`.
    pub fn take(&mut self, worker: WorkerId) -> Option<usize> {
        while let Some(task) = self.queue.pop_front() {
            if self.states[task] == State::Waiting {
                self.states[task] = State::Running(worker);
                return Some(task);
            }
        }
        None
    }

    /// `task` is done; true the first time (its answer counts), false after.
    pub fn finish(&mut self, task: usize) -> bool {
        match self.states.get(task) {
            Some(State::Done) | None => false,
            Some(_) => {
                self.states[task] = State::Done;
                self.done += 1;
                true
            }
        }
    }

    /// `worker` will finish nothing more (vacated, died, left, gone): its running task
    /// waits again, first in line. Returns it.
    pub fn give_back(&mut self, worker: WorkerId) -> Option<usize> {
        let task = self
            .states
            .iter()
            .position(|s| *s == State::Running(worker))?;
        self.states[task] = State::Waiting;
        self.queue.push_front(task);
        self.handed_out_again += 1;
        Some(task)
    }

    /// Tasks not yet handed out, or handed back.
    pub fn waiting(&self) -> usize {
        self.states.iter().filter(|s| **s == State::Waiting).count()
    }

    pub fn done(&self) -> usize {
        self.done
    }

    pub fn all_done(&self) -> bool {
        self.done == self.states.len()
    }

    /// How many times a task was handed back to be run again.
    pub fn handed_out_again(&self) -> usize {
        self.handed_out_again
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_go_out_in_order_and_each_is_done_once() {
        let mut b = Board::new(3);
        assert_eq!(b.take(1), Some(0));
        assert_eq!(b.take(2), Some(1));
        assert!(b.finish(0));
        assert!(!b.finish(0), "a second answer does not count");
        assert_eq!(b.take(1), Some(2));
        assert_eq!(b.take(1), None);
        assert!(b.finish(1) && b.finish(2));
        assert!(b.all_done());
        assert_eq!(b.done(), 3);
    }

    #[test]
    fn a_lost_workers_task_goes_out_again_first() {
        let mut b = Board::new(3);
        b.take(1);
        b.take(2);
        assert_eq!(b.give_back(1), Some(0));
        assert_eq!(b.give_back(1), None, "nothing more runs there");
        assert_eq!(b.waiting(), 2);
        assert_eq!(b.take(3), Some(0), "the task given back first");
        assert_eq!(b.handed_out_again(), 1);
    }

    #[test]
    fn a_late_answer_counts_once_and_the_copy_is_then_skipped() {
        let mut b = Board::new(2);
        b.take(1);
        b.give_back(1);
        assert!(b.finish(0), "the vacated worker's answer arrived after all");
        assert_eq!(b.take(2), Some(1), "task 0 is not handed out again");
        assert!(!b.finish(0));
        assert!(b.finish(1));
        assert!(b.all_done());
    }

    #[test]
    fn an_answer_for_an_unknown_task_is_ignored() {
        let mut b = Board::new(1);
        assert!(!b.finish(7));
        assert_eq!(b.done(), 0);
    }
}
