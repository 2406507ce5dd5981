//! What each host daemon is told of the allocations on its own host: the live ones, by
//! which daemons that serve a machine of their own end leftover processes
//! (`FromBroker::LiveAllocs`), and those past their reclaim deadline, whose processes a
//! daemon that ends allocations ends (`FromBroker::EndAllocs`). The core publishes after
//! every event ([`HostWords::publish`]); a host's daemon hears of it only when that host's
//! allocations changed, and only of its own host's.
//!
//! Why per host: a daemon ends only processes of its own host, and each carries the tag of
//! the allocation it runs under ([`proto::tag`]), an allocation of that host. The word was
//! the whole lab's list, cloned into every daemon's session and sent to each at every
//! grant and give-back: O(hosts × allocations) copied and sent per change, every session
//! woken (at 10k hosts each holding an allocation, ~1.6 GB copied and 10k frames of ~80 KB
//! sent for one grant).
//!
//! A word's `issued_below` is the next allocation id when its host's allocations last
//! changed: a grant elsewhere leaves it. A daemon never touches an allocation at or above
//! it (one it may not have heard of), so an older bound only spares more: every allocation
//! of the host issued below it was live in the word or is over. One granted and ended
//! between two publishes (never in a word) is swept at the host's next change — at the
//! latest when the host is granted again.
//!
//! A publish walks the allocator's allocations beside those it last published, both in id
//! order (integers compared, no host name touched but those of the allocations that came,
//! went or passed their deadline), and changes only those hosts' words.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet, HashMap},
    iter::Peekable,
    sync::{
        atomic::{AtomicU32, Ordering as AtomicOrdering},
        Arc, Mutex, PoisonError,
    },
};

use proto::msg::FromBroker;
use tokio::sync::Notify;

use crate::{hosts::ConnId, jobs::JobDesk};

/// One host daemon's word: its host's live allocations, every id below `issued_below`
/// issued, and those past their deadline (`ending`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostWord {
    pub live: Vec<u64>,
    pub issued_below: u64,
    pub ending: Vec<u64>,
}

impl HostWord {
    pub fn message(&self) -> FromBroker {
        FromBroker::LiveAllocs {
            live: self.live.clone(),
            issued_below: self.issued_below,
        }
    }

    pub fn end_message(&self) -> FromBroker {
        FromBroker::EndAllocs {
            allocs: self.ending.clone(),
        }
    }

    fn is_empty(&self) -> bool {
        self.live.is_empty() && self.ending.is_empty()
    }

    /// Adds `alloc` to the live or the ending ones (each stays ascending).
    fn add(&mut self, alloc: u64, ending: bool) {
        let list = match ending {
            true => &mut self.ending,
            false => &mut self.live,
        };
        if let Err(at) = list.binary_search(&alloc) {
            list.insert(at, alloc);
        }
    }

    fn remove(&mut self, alloc: u64) {
        self.live.retain(|&a| a != alloc);
        self.ending.retain(|&a| a != alloc);
    }
}

/// Where one daemon's session hears of its word: the latest, and a wake-up. Made by the
/// session, kept by the core. (A watch channel would do, but each holds an eight-way
/// notifier of ~0.6 KiB: 6 MiB at 10k daemons.)
#[derive(Debug, Default)]
pub struct WordSlot {
    word: Mutex<Option<HostWord>>,
    changed: Notify,
    /// The host's row in the core's host table, plus one (0: not said), which the session
    /// hands over with each report ([`crate::hosts::HostAt`]).
    row: AtomicU32,
}

impl WordSlot {
    /// Puts `word` in the slot and wakes the session (or, when it is not waiting, has its
    /// next [`Self::next`] return at once).
    pub fn set(&self, word: HostWord) {
        *self.word.lock().unwrap_or_else(PoisonError::into_inner) = Some(word);
        self.changed.notify_one();
    }

    /// The host's row in the core's host table is `row` from now on.
    pub fn set_row(&self, row: Option<u32>) {
        let stored = row.and_then(|r| r.checked_add(1)).unwrap_or(0);
        self.row.store(stored, AtomicOrdering::Relaxed);
    }

    /// The host's row as the core last said ([`Self::set_row`]).
    pub fn row(&self) -> Option<u32> {
        self.row.load(AtomicOrdering::Relaxed).checked_sub(1)
    }

    /// The word in the slot, if one was set.
    pub fn current(&self) -> Option<HostWord> {
        self.word
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The word, once one was set since the last call returned (at once if one was).
    /// Cancel-safe: a wake-up not taken passes to the next call.
    pub async fn next(&self) -> HostWord {
        loop {
            self.changed.notified().await;
            if let Some(word) = self.current() {
                return word;
            }
        }
    }
}

/// The core's end of a session's [`WordSlot`].
pub type WordSender = Arc<WordSlot>;

/// The words of every host, and the connected daemons' sessions they go to.
#[derive(Debug, Default)]
pub struct HostWords {
    /// The last word of each host that has allocations.
    published: HashMap<String, HostWord>,
    /// Every allocation as last published: its host, and whether it is past its deadline.
    known: BTreeMap<u64, (String, bool)>,
    /// Each connected daemon's session: its connection and its word's channel.
    sessions: HashMap<String, (ConnId, WordSender)>,
    /// The allocator's stamp at the last publish (it changes with the allocations).
    stamp: Option<(usize, u64, u64)>,
    /// The next allocation id at the last publish: the bound of a word made now.
    issued_below: u64,
}

impl HostWords {
    /// The host's row in the table moved (a host joined before it): each session is told
    /// its host's row again (`row_of`).
    pub fn rows_moved(&self, row_of: impl Fn(&str) -> Option<u32>) {
        for (host, (_, word)) in &self.sessions {
            word.set_row(row_of(host));
        }
    }

    /// `host`'s daemon connected on `conn`: its session gets the host's word at once.
    pub fn connected(&mut self, host: &str, conn: ConnId, word: WordSender) {
        let current = self.published.get(host).cloned().unwrap_or(HostWord {
            issued_below: self.issued_below,
            ..HostWord::default()
        });
        word.set(current);
        self.sessions.insert(host.to_string(), (conn, word));
    }

    /// The daemon connection `conn` of `host` closed (a newer one stays).
    pub fn disconnected(&mut self, host: &str, conn: ConnId) {
        if self.sessions.get(host).is_some_and(|(c, _)| *c == conn) {
            self.sessions.remove(host);
        }
    }

    /// Tells the daemons of the hosts whose allocations changed since the last call.
    /// O(1) when none did (the allocator's stamp says so); else a walk of the allocations'
    /// ids, and a word for each host that changed.
    pub fn publish(&mut self, desk: &JobDesk) {
        let stamp = desk.live_allocs_stamp();
        if self.stamp == Some(stamp) {
            return;
        }
        self.stamp = Some(stamp);
        let (allocs, issued_below) = desk.allocs_with_hosts();
        self.publish_allocs(allocs, issued_below);
    }

    /// [`Self::publish`] of `allocs` (ascending by id: id, host, past its deadline), with
    /// every id below `issued_below` issued.
    fn publish_allocs<'a>(
        &mut self,
        allocs: impl Iterator<Item = (u64, &'a str, bool)>,
        issued_below: u64,
    ) {
        self.issued_below = issued_below;
        let mut changed = BTreeSet::new();
        for change in changes(self.known.iter().peekable(), allocs.peekable()) {
            let (alloc, host, ending) = match change {
                Change::Gone(alloc) => {
                    let (host, _) = self.known.remove(&alloc).unwrap_or_default();
                    if let Some(word) = self.published.get_mut(&host) {
                        word.remove(alloc);
                    }
                    changed.insert(host);
                    continue;
                }
                Change::Now(alloc, host, ending) => (alloc, host, ending),
            };
            let word = self.published.entry(host.clone()).or_default();
            word.remove(alloc);
            word.add(alloc, ending);
            self.known.insert(alloc, (host.clone(), ending));
            changed.insert(host);
        }
        for host in changed {
            let word = match self.published.get_mut(&host) {
                Some(word) if !word.is_empty() => {
                    word.issued_below = issued_below;
                    word.clone()
                }
                _ => {
                    self.published.remove(&host);
                    HostWord {
                        issued_below,
                        ..HostWord::default()
                    }
                }
            };
            if let Some((_, session)) = self.sessions.get(&host) {
                session.set(word);
            }
        }
    }
}

/// What became of one allocation since the last publish.
enum Change {
    /// Granted, or passed its deadline (or, restored, came back from it), since: its host,
    /// and whether it is past its deadline now.
    Now(u64, String, bool),
    /// Over since.
    Gone(u64),
}

/// The differences between the allocations published (`known`) and `now`, both ascending
/// by id.
fn changes<'k, 'a>(
    mut known: Peekable<impl Iterator<Item = (&'k u64, &'k (String, bool))>>,
    mut now: Peekable<impl Iterator<Item = (u64, &'a str, bool)>>,
) -> Vec<Change> {
    let mut out = Vec::new();
    loop {
        let order = match (known.peek(), now.peek()) {
            (None, None) => return out,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((&k, _)), Some(&(n, _, _))) => k.cmp(&n),
        };
        match order {
            Ordering::Less => {
                let (&alloc, _) = known.next().expect("peeked");
                out.push(Change::Gone(alloc));
            }
            Ordering::Greater => {
                let (alloc, host, ending) = now.next().expect("peeked");
                out.push(Change::Now(alloc, host.to_string(), ending));
            }
            Ordering::Equal => {
                let ((_, (_, was_ending)), (alloc, host, ending)) =
                    (known.next().expect("peeked"), now.next().expect("peeked"));
                if *was_ending != ending {
                    out.push(Change::Now(alloc, host.to_string(), ending));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        future::Future,
        pin::pin,
        task::{Context, Poll, Waker},
    };

    use super::*;

    /// A slot's row is none until the core says one, then the last it said; the rows of
    /// every connected session are said again when they move.
    #[test]
    fn a_sessions_row_is_the_last_the_core_said() {
        let mut words = HostWords::default();
        let slot = connect(&mut words, "node02", 1);
        assert_eq!(slot.row(), None);
        slot.set_row(Some(0));
        assert_eq!(slot.row(), Some(0));
        words.rows_moved(|host| (host == "node02").then_some(4));
        assert_eq!(slot.row(), Some(4));
        slot.set_row(None);
        assert_eq!(slot.row(), None);
        slot.set_row(Some(u32::MAX));
        assert_eq!(slot.row(), None, "a row past what the slot holds is none");
    }

    /// A session for `host` on connection `conn`: its slot.
    fn connect(words: &mut HostWords, host: &str, conn: ConnId) -> WordSender {
        let slot = WordSender::default();
        words.connected(host, conn, slot.clone());
        slot
    }

    fn word(live: &[u64], ending: &[u64], issued_below: u64) -> Option<HostWord> {
        Some(HostWord {
            live: live.to_vec(),
            issued_below,
            ending: ending.to_vec(),
        })
    }

    /// The news in `slot`, once (`None`: none since the last look).
    fn news(slot: &WordSlot) -> Option<Option<HostWord>> {
        let next = pin!(slot.next());
        match next.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(word) => Some(Some(word)),
            Poll::Pending => None,
        }
    }

    #[test]
    fn each_host_hears_of_its_own_allocations_when_they_change_and_only_then() {
        let mut words = HostWords::default();
        words.publish_allocs(std::iter::empty(), 1);
        let a = connect(&mut words, "a", 1);
        let b = connect(&mut words, "b", 2);
        assert_eq!(news(&a), Some(word(&[], &[], 1)));
        assert_eq!(news(&b), Some(word(&[], &[], 1)));

        words.publish_allocs([(1, "a", false)].into_iter(), 2);
        assert_eq!(news(&a), Some(word(&[1], &[], 2)));
        assert_eq!(news(&b), None, "a grant of a is no news to b");

        words.publish_allocs(
            [(1, "a", false), (2, "b", false), (3, "a", false)].into_iter(),
            4,
        );
        assert_eq!(news(&a), Some(word(&[1, 3], &[], 4)));
        assert_eq!(news(&b), Some(word(&[2], &[], 4)));

        // 1 passes its deadline; 2 is over.
        words.publish_allocs([(1, "a", true), (3, "a", false)].into_iter(), 4);
        assert_eq!(news(&a), Some(word(&[3], &[1], 4)));
        assert_eq!(news(&b), Some(word(&[], &[], 4)));

        // A grant of a new host: a and b hear nothing; c, connecting later, gets its word.
        words.publish_allocs(
            [(1, "a", true), (3, "a", false), (4, "c", false)].into_iter(),
            5,
        );
        assert_eq!((news(&a), news(&b)), (None, None));
        let c = connect(&mut words, "c", 3);
        assert_eq!(news(&c), Some(word(&[4], &[], 5)));

        // Everything over: a's word empties, with the bound of that change.
        words.publish_allocs([(4, "c", false)].into_iter(), 7);
        assert_eq!(news(&a), Some(word(&[], &[], 7)));
        assert_eq!((news(&b), news(&c)), (None, None));
    }

    #[test]
    fn a_newer_connection_of_a_host_takes_its_words_and_the_older_ones_close_leaves_it() {
        let mut words = HostWords::default();
        words.publish_allocs([(1, "a", false)].into_iter(), 2);
        let old = connect(&mut words, "a", 1);
        let new = connect(&mut words, "a", 2);
        assert_eq!(news(&old), Some(word(&[1], &[], 2)));
        assert_eq!(news(&new), Some(word(&[1], &[], 2)));
        words.disconnected("a", 1);
        words.publish_allocs(std::iter::empty(), 2);
        assert_eq!(news(&new), Some(word(&[], &[], 2)));
        assert_eq!(news(&old), None, "the older session hears no more");
    }

    /// Words set while the session does not wait: it wakes once, for the latest.
    #[test]
    fn a_session_busy_meanwhile_gets_the_latest_word_once() {
        let slot = WordSlot::default();
        slot.set(word(&[1], &[], 2).expect("a word"));
        slot.set(word(&[1, 2], &[], 3).expect("a word"));
        assert_eq!(news(&slot), Some(word(&[1, 2], &[], 3)));
        assert_eq!(news(&slot), None);
    }
}
