//! Shim calls in a plain (non-module) job: a request per call for `anyLinux`, and for an
//! instance name (`anyLinux-1`) one bound host for the job ([`crate::instances`] decides,
//! this turns its answers into outputs); grants offered to the shims that wait for them;
//! `taken_back` answered from the allocations the broker took back.

use proto::{agent::ShimReply, msg::ToBroker};
use tracing::info;

use super::{AgentCore, AllocId, Out, Output, ReqId, ShimId};
use crate::instances::{self, Call};

/// A shim waiting for a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The shim's connection.
    pub shim: ShimId,
    /// The shim's pid (the launcher: it runs the remote shell as its child).
    pub pid: u32,
}

/// A shim's request the broker has not answered yet.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) caller: Caller,
    pub(super) symbolic: String,
    /// The binding key when `symbolic` looks like an instance name ([`crate::instances`]).
    pub(super) instance: Option<String>,
}

/// A grant offered to shims ([`Output::Offer`]), until [`super::Input::Offered`].
#[derive(Debug)]
pub(super) struct Offer {
    /// The launchers to watch once the grant is taken: the shim that asked, and for a bound
    /// instance every call that waited (the offer's answer does not say which shims took
    /// it; one that did not has gone away, and its watch ends at once).
    launchers: Vec<u32>,
    /// Calls that waited on an instance the broker read as a label: they ask on their own.
    ask_again: Vec<Caller>,
    symbolic: String,
    /// The instance was bound to the grant.
    bound: bool,
}

impl AgentCore {
    /// A shim asks for `symbolic`.
    pub(super) fn shim_allocate(&mut self, symbolic: String, caller: Caller, out: &mut Out) {
        let Some(key) = instances::key(&symbolic) else {
            return self.ask_broker(symbolic, caller, None, out);
        };
        match self.instances.call(&key, caller) {
            Call::Ask(caller) => self.ask_broker(symbolic, caller, Some(key), out),
            Call::Waits => {}
            Call::Reach { alloc, caller } => {
                let reply = match self.allocs.get(&alloc) {
                    Some(a) => self.granted_reply(alloc, a.host.clone(), a.address.clone()),
                    None => ShimReply::Refused {
                        message: format!("allocation {alloc} of {symbolic} is gone"),
                    },
                };
                out.push(Output::ReplyShim {
                    shim: caller.shim,
                    reply,
                });
                self.watch_launcher(alloc, caller.pid, out);
            }
            Call::Lost { host, caller } => {
                info!(%symbolic, %host, "instance call after its host was taken back");
                let message = format!(
                    "the broker took {host}, the host of {symbolic}, back from this job: \
                     whatever ran there for {symbolic} is lost\n\
                     help: the next call with {symbolic} gets a new host"
                );
                let reply = ShimReply::Lost {
                    name: symbolic,
                    host,
                    message,
                };
                out.push(Output::ReplyShim {
                    shim: caller.shim,
                    reply,
                });
            }
        }
    }

    /// A new request for `symbolic` on behalf of `caller`.
    fn ask_broker(
        &mut self,
        symbolic: String,
        caller: Caller,
        instance: Option<String>,
        out: &mut Out,
    ) {
        let req = self.new_request();
        if let Some(key) = &instance {
            self.instances.asked(key, req);
        }
        let request = Pending {
            caller,
            symbolic: symbolic.clone(),
            instance,
        };
        self.pending.insert(req, request);
        self.tell_broker(ToBroker::Allocate { req, symbolic }, out);
    }

    pub(super) fn new_request(&mut self) -> ReqId {
        let req = self.next_req;
        self.next_req += 1;
        req
    }

    /// A shim asks how to reach one of the job's hosts.
    pub(super) fn shim_attach(&mut self, shim: ShimId, host: &str, out: &mut Out) {
        let found = self
            .allocs
            .iter()
            .find(|(_, a)| a.host == host || a.address == host)
            .map(|(id, a)| (*id, a.host.clone(), a.address.clone()));
        let reply = match found {
            Some((alloc, host, address)) => self.granted_reply(alloc, host, address),
            None => ShimReply::Refused {
                message: format!("{host} is not allocated to this job"),
            },
        };
        out.push(Output::ReplyShim { shim, reply });
    }

    /// A shim's remote shell for `alloc` exited 0: was `alloc` taken back (its command ended
    /// by the reclaim: over rsh that status is lost)?
    pub(super) fn shim_taken_back(&mut self, shim: ShimId, alloc: AllocId, out: &mut Out) {
        let reply = match self.taken_back(alloc) {
            Some(t) => ShimReply::TakenBack {
                alloc,
                host: t.host.clone(),
                message: t.message.clone(),
            },
            None => ShimReply::NotTakenBack { alloc },
        };
        out.push(Output::ReplyShim { shim, reply });
    }

    /// A shim's connection closed: its waiting requests are withdrawn. A request other
    /// calls of the same instance wait on stays, answered to the first of them.
    pub(super) fn shim_gone(&mut self, shim: ShimId, out: &mut Out) {
        self.instances.forget_waiting(|c| c.shim == shim);
        let reqs: Vec<ReqId> = self
            .pending
            .iter()
            .filter(|(_, r)| r.caller.shim == shim)
            .map(|(r, _)| *r)
            .collect();
        for req in reqs {
            let next = self
                .pending
                .get(&req)
                .and_then(|r| r.instance.clone())
                .and_then(|key| self.instances.promote(&key));
            if let (Some(next), Some(r)) = (next, self.pending.get_mut(&req)) {
                r.caller = next;
                continue;
            }
            if let Some(key) = self.pending.remove(&req).and_then(|r| r.instance) {
                self.instances.refused(&key);
            }
            self.tell_broker(ToBroker::Cancel { req }, out);
        }
    }

    /// The broker's `queued` for `req`: to its shim and the calls waiting on its instance.
    pub(super) fn queued(&mut self, req: ReqId, reply: ShimReply, out: &mut Out) {
        let Some(r) = self.pending.get(&req) else {
            return;
        };
        out.push(Output::ReplyShim {
            shim: r.caller.shim,
            reply: reply.clone(),
        });
        let Some(key) = &r.instance else { return };
        for c in self.instances.waiting(key) {
            out.push(Output::ReplyShim {
                shim: c.shim,
                reply: reply.clone(),
            });
        }
    }

    /// The broker refused `req`: its shim and the calls waiting on its instance are told.
    pub(super) fn refused(&mut self, req: ReqId, message: String, out: &mut Out) {
        if self.module_refused(req, &message, out) {
            return;
        }
        let Some(r) = self.pending.remove(&req) else {
            return;
        };
        if let Some(key) = &r.instance {
            for c in self.instances.refused(key) {
                let reply = ShimReply::Refused {
                    message: message.clone(),
                };
                out.push(Output::ReplyShim {
                    shim: c.shim,
                    reply,
                });
            }
        }
        out.push(Output::ReplyShim {
            shim: r.caller.shim,
            reply: ShimReply::Refused { message },
        });
    }

    /// Offers `alloc` (just granted for `req`) to the shim that asked, and for a bound
    /// instance to every call that waited. False when no shim waits for it any more.
    pub(super) fn offer_grant(
        &mut self,
        req: ReqId,
        alloc: AllocId,
        bound: bool,
        out: &mut Out,
    ) -> bool {
        let Some(request) = self.pending.remove(&req) else {
            return false;
        };
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return false;
        };
        let mut offer = Offer {
            launchers: vec![request.caller.pid],
            ask_again: Vec::new(),
            symbolic: request.symbolic,
            bound: false,
        };
        let mut shims = vec![request.caller.shim];
        if let Some(key) = &request.instance {
            a.instance = bound;
            let waiting = self.instances.granted(key, alloc, bound);
            if bound {
                info!(instance = %offer.symbolic, alloc, "instance bound");
                shims.extend(waiting.iter().map(|c| c.shim));
                offer.launchers.extend(waiting.iter().map(|c| c.pid));
                offer.bound = true;
            } else {
                offer.ask_again = waiting;
            }
        }
        let (host, address) = (a.host.clone(), a.address.clone());
        let reply = self.granted_reply(alloc, host, address);
        self.offers.insert(alloc, offer);
        out.push(Output::Offer {
            alloc,
            shims,
            reply,
        });
        true
    }

    /// The answer to an offer: a taken grant's launchers are watched (a bound instance's
    /// too: the job's end waits for them, and its host is kept when they end); one nobody
    /// took goes back to the broker.
    pub(super) fn offered(&mut self, alloc: AllocId, reached: bool, out: &mut Out) {
        let Some(offer) = self.offers.remove(&alloc) else {
            return;
        };
        if reached {
            for pid in offer.launchers {
                self.watch_launcher(alloc, pid, out);
            }
        }
        for c in offer.ask_again {
            self.ask_broker(offer.symbolic.clone(), c, None, out);
        }
        if reached {
            return;
        }
        if offer.bound {
            self.instances.given_back(alloc);
        }
        self.give_back_untaken(alloc, out);
    }

    /// What a shim needs to run its command on `host` under a subagent.
    pub(super) fn granted_reply(&self, alloc: AllocId, host: String, address: String) -> ShimReply {
        let g = &self.cfg.grant;
        let mut subagent = vec![
            g.subagent_program.display().to_string(),
            "--agent".into(),
            g.sub_addr.clone(),
            "--alloc".into(),
            alloc.to_string(),
            "--secret-file".into(),
            g.secret_file.display().to_string(),
        ];
        if let Some(lib) = &g.preload {
            subagent.extend(["--preload".into(), lib.display().to_string()]);
        }
        if let Some(mark) = &g.lab_mark {
            subagent.extend(["--lab-mark".into(), mark.clone()]);
        }
        if let Some(file) = &g.step_times {
            subagent.extend(["--step-times".into(), file.display().to_string()]);
        }
        ShimReply::Granted {
            alloc,
            host,
            address,
            remote_shell: g.remote_shell.clone(),
            subagent,
        }
    }

    /// Requests waiting at the broker (to ask again after it restarted), by request id.
    pub(super) fn waiting_requests(&self) -> impl Iterator<Item = (ReqId, String)> + '_ {
        self.pending
            .iter()
            .map(|(req, r)| (*req, r.symbolic.clone()))
    }
}
