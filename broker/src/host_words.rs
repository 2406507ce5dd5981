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

use std::collections::HashMap;

use allocation::HostAllocs;
use proto::msg::FromBroker;
use tokio::sync::watch;

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

    fn holds(&self, allocs: &HostAllocs) -> bool {
        self.live == allocs.live && self.ending == allocs.ending
    }
}

/// Where a daemon's session hears of its word (made by the session, kept by the core).
pub type WordSender = watch::Sender<Option<HostWord>>;

/// The words of every host, and the connected daemons' sessions they go to.
#[derive(Debug, Default)]
pub struct HostWords {
    /// The last word of each host that has allocations.
    published: HashMap<String, HostWord>,
    /// Each connected daemon's session: its connection and its word's channel.
    sessions: HashMap<String, (ConnId, WordSender)>,
    /// The allocator's stamp at the last publish (it changes with the allocations).
    stamp: Option<(usize, u64, u64)>,
    /// The next allocation id at the last publish: the bound of a word made now.
    issued_below: u64,
}

impl HostWords {
    /// `host`'s daemon connected on `conn`: its session gets the host's word at once.
    pub fn connected(&mut self, host: &str, conn: ConnId, word: WordSender) {
        let current = self.published.get(host).cloned().unwrap_or(HostWord {
            issued_below: self.issued_below,
            ..HostWord::default()
        });
        word.send_replace(Some(current));
        self.sessions.insert(host.to_string(), (conn, word));
    }

    /// The daemon connection `conn` of `host` closed (a newer one stays).
    pub fn disconnected(&mut self, host: &str, conn: ConnId) {
        if self.sessions.get(host).is_some_and(|(c, _)| *c == conn) {
            self.sessions.remove(host);
        }
    }

    /// Tells the daemons of the hosts whose allocations changed since the last call.
    /// O(1) when none did; else O(allocations).
    pub fn publish(&mut self, desk: &JobDesk) {
        let stamp = desk.live_allocs_stamp();
        if self.stamp == Some(stamp) {
            return;
        }
        self.stamp = Some(stamp);
        let (by_host, issued_below) = desk.allocs_by_host();
        self.issued_below = issued_below;
        let emptied: Vec<String> = self
            .published
            .keys()
            .filter(|host| !by_host.contains_key(host.as_str()))
            .cloned()
            .collect();
        for host in emptied {
            self.published.remove(&host);
            self.tell(&host, HostWord::default());
        }
        for (host, allocs) in by_host {
            if self.published.get(host).is_some_and(|w| w.holds(&allocs)) {
                continue;
            }
            let word = HostWord {
                live: allocs.live,
                issued_below: 0,
                ending: allocs.ending,
            };
            let told = self.tell(host, word);
            self.published.insert(host.to_string(), told);
        }
    }

    /// Sends `word` (as of now) to `host`'s session, if its daemon is connected; returns it.
    fn tell(&self, host: &str, mut word: HostWord) -> HostWord {
        word.issued_below = self.issued_below;
        if let Some((_, session)) = self.sessions.get(host) {
            session.send_replace(Some(word.clone()));
        }
        word
    }
}
