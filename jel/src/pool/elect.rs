//! Elections: first candidate in wins; the winner stays until it leaves or dies. Uniform
//! elections then promote the earliest remaining candidate; non-uniform ones only announce
//! that there is no winner. Every `elected` event carries the next epoch of its name.

use super::{state::Pool, Elections};
use crate::wire::{ElectionState, EventKind, Member, MemberId};

/// One election's state.
#[derive(Debug, Clone, Default)]
pub(super) struct Election {
    pub winner: Option<MemberId>,
    /// The epoch of the newest `elected` of this name (0: none yet).
    pub epoch: u64,
    /// Members that stood, in the order they did (the winner included); uniform only.
    pub candidates: Vec<MemberId>,
}

impl Pool {
    /// `id` stands in election `name`; the winner and the epoch after it.
    pub(super) fn elect(&mut self, name: &str, id: MemberId) -> (Option<Member>, u64) {
        let uniform = self.config.elections == Elections::Uniform;
        let e = self.elections.entry(name.to_string()).or_default();
        if uniform && !e.candidates.contains(&id) {
            e.candidates.push(id);
        }
        if e.winner.is_none() {
            self.announce(name, Some(id));
        }
        self.election_result(name)
    }

    /// The winner of `name` (if any) and the epoch.
    pub(super) fn election_result(&self, name: &str) -> (Option<Member>, u64) {
        match self.elections.get(name) {
            Some(e) => (self.member(e.winner), e.epoch),
            None => (None, 0),
        }
    }

    fn member(&self, id: Option<MemberId>) -> Option<Member> {
        id.and_then(|id| self.members.get(&id))
            .map(|r| r.member.clone())
    }

    /// Sets the winner of `name` and puts `elected` with the next epoch in the stream.
    fn announce(&mut self, name: &str, winner: Option<MemberId>) {
        let member = self.member(winner);
        let e = self
            .elections
            .get_mut(name)
            .expect("announce an existing election");
        e.winner = winner;
        e.epoch += 1;
        let epoch = e.epoch;
        self.emit(EventKind::Elected {
            name: name.to_string(),
            winner: member,
            epoch,
        });
    }

    /// `id` left or died (already out of `members`): it stands no more; where it won, the
    /// next candidate wins (uniform) or nobody does (non-uniform).
    pub(super) fn member_gone_from_elections(&mut self, id: MemberId) {
        let mut lost = Vec::new();
        for (name, e) in &mut self.elections {
            e.candidates.retain(|c| *c != id);
            if e.winner == Some(id) {
                lost.push((name.clone(), e.candidates.first().copied()));
            }
        }
        for (name, next) in lost {
            self.announce(&name, next);
        }
    }

    /// Every election with its winner, for a `snapshot`.
    pub(super) fn election_states(&self) -> Vec<ElectionState> {
        let state = |(name, e): (&String, &Election)| ElectionState {
            name: name.clone(),
            winner: self.member(e.winner),
            epoch: e.epoch,
        };
        self.elections.iter().map(state).collect()
    }

    pub(super) fn check_elections(&self) -> Result<(), String> {
        for (name, e) in &self.elections {
            let alive = |id: &MemberId| self.members.contains_key(id);
            if !e.winner.iter().chain(&e.candidates).all(alive) {
                return Err(format!(
                    "election {name} names a member that is gone: {e:?}"
                ));
            }
            if e.winner.is_some() && e.epoch == 0 {
                return Err(format!("election {name} has a winner at epoch 0"));
            }
            let uniform = self.config.elections == Elections::Uniform;
            if uniform && e.winner.is_none() && !e.candidates.is_empty() {
                return Err(format!(
                    "uniform election {name} has candidates but no winner"
                ));
            }
            if uniform && e.winner.is_some() && e.winner != e.candidates.first().copied() {
                return Err(format!(
                    "uniform election {name}: the winner is not the first candidate"
                ));
            }
        }
        Ok(())
    }
}
