//! Instance names (`anyLinux-1`, `anyPublic-3`; `proto::symbolic`): which host each
//! instance of the job is bound to. Pure state, no I/O: the agent core asks what a call
//! means and turns the answer into outputs.
//!
//! # Model
//! One binding per instance name (compared case-insensitively), going
//! `Pending → Bound → Lost → (removed)`:
//! - the first call asks the broker (`Pending`); calls for the same instance that arrive
//!   meanwhile wait for that one answer, so concurrent first calls bind one host;
//! - the grant binds the instance (`Bound`): later calls reach that host, and the job keeps
//!   it between calls (it is not given back when a command ends);
//! - a reclaim of that host makes it `Lost`: the next call is told so (the shim exits 255)
//!   and removes the binding, so the call after it asks for a new host;
//! - a refusal, or a broker that reads the name as a label (a label named `linux-1`),
//!   removes the binding; waiting calls get the refusal, or ask on their own.

use std::collections::HashMap;

/// What a call for an instance name means. `W` is the waiting caller (its reply channel).
#[derive(Debug, PartialEq, Eq)]
pub enum Call<W> {
    /// The first call: ask the broker, then [`Instances::asked`].
    Ask(W),
    /// Another call is asking for this instance; this one waits for its answer.
    Waits,
    /// Bound: reach allocation `alloc` again.
    Reach { alloc: u64, caller: W },
    /// The instance's host was taken back: tell the caller (the binding is gone now).
    Lost { host: String, caller: W },
}

#[derive(Debug)]
enum Binding<W> {
    Pending { req: u64, waiting: Vec<W> },
    Bound { alloc: u64 },
    Lost { host: String },
}

/// The job's instance bindings.
#[derive(Debug)]
pub struct Instances<W> {
    bindings: HashMap<String, Binding<W>>,
}

impl<W> Default for Instances<W> {
    fn default() -> Self {
        Self {
            bindings: HashMap::new(),
        }
    }
}

/// The binding key of `name` when it has an instance suffix (`anyLinux-1` → `anylinux-1`);
/// `None` for other names. Whether it is an instance is the broker's call (a label may be
/// named `linux-1`): see [`Instances::granted`].
pub fn key(name: &str) -> Option<String> {
    proto::symbolic::split_instance(name).map(|_| name.to_ascii_lowercase())
}

impl<W> Instances<W> {
    /// A call for instance `key` by `caller`.
    pub fn call(&mut self, key: &str, caller: W) -> Call<W> {
        let (binding, call) = match self.bindings.remove(key) {
            None => return Call::Ask(caller),
            Some(Binding::Lost { host }) => return Call::Lost { host, caller },
            Some(Binding::Pending { req, mut waiting }) => {
                waiting.push(caller);
                (Binding::Pending { req, waiting }, Call::Waits)
            }
            Some(Binding::Bound { alloc }) => {
                (Binding::Bound { alloc }, Call::Reach { alloc, caller })
            }
        };
        self.bindings.insert(key.to_string(), binding);
        call
    }

    /// The first call's request `req` went to the broker.
    pub fn asked(&mut self, key: &str, req: u64) {
        self.bindings.insert(
            key.to_string(),
            Binding::Pending {
                req,
                waiting: Vec::new(),
            },
        );
    }

    /// Request `req` of `key` was granted `alloc`; `bound` when the broker read the name as
    /// an instance. Returns the calls that waited for it.
    pub fn granted(&mut self, key: &str, alloc: u64, bound: bool) -> Vec<W> {
        let waiting = self.take_waiting(key);
        if bound {
            self.bindings
                .insert(key.to_string(), Binding::Bound { alloc });
        }
        waiting
    }

    /// The request of `key` was refused or withdrawn: the binding goes; returns the calls
    /// that waited for it.
    pub fn refused(&mut self, key: &str) -> Vec<W> {
        self.take_waiting(key)
    }

    /// The calls waiting for `key`'s request (to pass `queued` on).
    pub fn waiting(&self, key: &str) -> &[W] {
        match self.bindings.get(key) {
            Some(Binding::Pending { waiting, .. }) => waiting,
            _ => &[],
        }
    }

    /// The call that asked for `key` went away: the first waiting call takes its place
    /// (the request stays at the broker), or `None` when nobody waits.
    pub fn promote(&mut self, key: &str) -> Option<W> {
        match self.bindings.get_mut(key) {
            Some(Binding::Pending { waiting, .. }) if !waiting.is_empty() => {
                Some(waiting.remove(0))
            }
            _ => None,
        }
    }

    /// Drops waiting calls for which `gone` holds (their shim went away).
    pub fn forget_waiting(&mut self, gone: impl Fn(&W) -> bool) {
        for b in self.bindings.values_mut() {
            if let Binding::Pending { waiting, .. } = b {
                waiting.retain(|w| !gone(w));
            }
        }
    }

    /// The broker takes back `alloc` (on `host`): the instance bound to it is lost.
    pub fn taken_back(&mut self, alloc: u64, host: &str) {
        for b in self.bindings.values_mut() {
            if matches!(b, Binding::Bound { alloc: a } if *a == alloc) {
                *b = Binding::Lost {
                    host: host.to_string(),
                };
            }
        }
    }

    /// The job gave `alloc` back on its own: an instance bound to it is unbound.
    pub fn given_back(&mut self, alloc: u64) {
        self.bindings
            .retain(|_, b| !matches!(b, Binding::Bound { alloc: a } if *a == alloc));
    }

    /// The request id `key` waits on, if pending.
    pub fn pending_request(&self, key: &str) -> Option<u64> {
        match self.bindings.get(key) {
            Some(Binding::Pending { req, .. }) => Some(*req),
            _ => None,
        }
    }

    fn take_waiting(&mut self, key: &str) -> Vec<W> {
        match self.bindings.remove(key) {
            Some(Binding::Pending { waiting, .. }) => waiting,
            Some(other) => {
                self.bindings.insert(key.to_string(), other);
                Vec::new()
            }
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_with_a_number_suffix_have_a_key() {
        assert_eq!(key("anyLinux-1").as_deref(), Some("anylinux-1"));
        assert_eq!(key("ANYLINUX-1").as_deref(), Some("anylinux-1"));
        assert_eq!(key("anyLinux"), None);
        assert_eq!(key("node03-1"), None);
    }

    #[test]
    fn concurrent_first_calls_share_one_request_and_one_host() {
        let mut i = Instances::default();
        assert_eq!(i.call("anylinux-1", 'a'), Call::Ask('a'));
        i.asked("anylinux-1", 7);
        assert_eq!(i.call("anylinux-1", 'b'), Call::Waits);
        assert_eq!(i.call("anylinux-1", 'c'), Call::Waits);
        assert_eq!(i.waiting("anylinux-1"), ['b', 'c']);
        assert_eq!(
            i.call("anylinux-2", 'd'),
            Call::Ask('d'),
            "another instance"
        );
        assert_eq!(i.granted("anylinux-1", 3, true), vec!['b', 'c']);
        assert_eq!(
            i.call("anylinux-1", 'e'),
            Call::Reach {
                alloc: 3,
                caller: 'e'
            }
        );
    }

    #[test]
    fn a_taken_back_host_is_reported_once_then_the_instance_binds_anew() {
        let mut i = Instances::default();
        i.asked("anylinux-1", 1);
        i.granted("anylinux-1", 3, true);
        i.taken_back(3, "node03");
        assert_eq!(
            i.call("anylinux-1", 'a'),
            Call::Lost {
                host: "node03".into(),
                caller: 'a'
            }
        );
        assert_eq!(i.call("anylinux-1", 'b'), Call::Ask('b'));
    }

    #[test]
    fn a_label_reading_or_a_refusal_unbinds_and_hands_back_the_waiting_calls() {
        let mut i = Instances::default();
        i.asked("anygpu-1", 1);
        assert_eq!(i.call("anygpu-1", 'b'), Call::Waits);
        assert_eq!(i.granted("anygpu-1", 4, false), vec!['b']);
        assert_eq!(i.call("anygpu-1", 'c'), Call::Ask('c'), "not bound");
        i.asked("anygpu-1", 2);
        assert_eq!(i.call("anygpu-1", 'd'), Call::Waits);
        assert_eq!(i.refused("anygpu-1"), vec!['d']);
        assert_eq!(i.pending_request("anygpu-1"), None);
    }

    #[test]
    fn a_waiting_call_takes_over_when_the_asking_one_goes() {
        let mut i = Instances::default();
        i.asked("anylinux-1", 1);
        assert_eq!(i.promote("anylinux-1"), None);
        i.call("anylinux-1", 'b');
        i.call("anylinux-1", 'c');
        i.forget_waiting(|w| *w == 'c');
        assert_eq!(i.promote("anylinux-1"), Some('b'));
        assert_eq!(i.pending_request("anylinux-1"), Some(1));
        i.granted("anylinux-1", 5, true);
        i.given_back(5);
        assert_eq!(i.call("anylinux-1", 'e'), Call::Ask('e'));
    }
}
