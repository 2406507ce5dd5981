//! Shim calls for symbolic names in a plain (non-module) job: a request per call for
//! `anyLinux`, and for an instance name (`anyLinux-1`) one bound host for the job
//! ([`crate::instances`] decides, this performs).

use proto::{agent::ShimReply, msg::ToBroker};
use tokio::sync::mpsc;
use tracing::info;

use super::{Agent, PendingRequest};
use crate::instances::{self, Call};

/// A shim waiting for a host.
pub(super) struct Caller {
    /// The shim's connection (to cancel when it goes away).
    pub(super) conn: u64,
    /// The shim's pid (the launcher of the remote shell it becomes).
    pub(super) pid: u32,
    pub(super) reply: mpsc::Sender<ShimReply>,
}

impl Agent {
    /// A shim asks for `symbolic`.
    pub(super) async fn shim_allocate(&mut self, symbolic: String, caller: Caller) {
        let Some(key) = instances::key(&symbolic) else {
            return self.ask_broker(symbolic, caller, None).await;
        };
        match self.instances.call(&key, caller) {
            Call::Ask(caller) => self.ask_broker(symbolic, caller, Some(key)).await,
            Call::Waits => {}
            Call::Reach { alloc, caller } => {
                let answer = match self.allocs.get(&alloc) {
                    Some(a) => {
                        let reply = self.granted_reply(alloc, a.host.clone(), a.address.clone());
                        self.note_launcher(alloc, caller.pid);
                        reply
                    }
                    None => ShimReply::Refused {
                        message: format!("allocation {alloc} of {symbolic} is gone"),
                    },
                };
                let _ = caller.reply.send(answer).await;
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
                let _ = caller.reply.send(reply).await;
            }
        }
    }

    /// Sends a new request for `symbolic` to the broker on behalf of `caller`.
    async fn ask_broker(&mut self, symbolic: String, caller: Caller, instance: Option<String>) {
        let req = self.next_req;
        self.next_req += 1;
        if let Some(key) = &instance {
            self.instances.asked(key, req);
        }
        let request = PendingRequest {
            conn: caller.conn,
            reply: caller.reply,
            symbolic: symbolic.clone(),
            launcher: caller.pid,
            instance,
        };
        self.pending.insert(req, request);
        self.tell_broker(ToBroker::Allocate { req, symbolic }).await;
    }

    /// A shim's connection closed: its waiting requests are withdrawn. A request other
    /// calls of the same instance wait on stays, answered to the first of them.
    pub(super) async fn shim_gone(&mut self, conn: u64) {
        self.instances.forget_waiting(|c| c.conn == conn);
        let reqs: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, r)| r.conn == conn)
            .map(|(r, _)| *r)
            .collect();
        for req in reqs {
            let next = self.pending[&req]
                .instance
                .clone()
                .and_then(|key| self.instances.promote(&key));
            if let (Some(next), Some(r)) = (next, self.pending.get_mut(&req)) {
                r.conn = next.conn;
                r.reply = next.reply;
                r.launcher = next.pid;
                continue;
            }
            if let Some(key) = self.pending.remove(&req).and_then(|r| r.instance) {
                self.instances.refused(&key);
            }
            self.tell_broker(ToBroker::Cancel { req }).await;
        }
    }

    /// Passes a `queued` answer on to the calls that wait on request `req`'s instance.
    pub(super) async fn queued_waiting(&self, req: u64, reply: &ShimReply) {
        let Some(key) = self.pending.get(&req).and_then(|r| r.instance.as_ref()) else {
            return;
        };
        for c in self.instances.waiting(key) {
            let _ = c.reply.send(reply.clone()).await;
        }
    }

    /// Request `request` was granted `alloc`. Binds its instance when the broker read the
    /// name as one and answers every call that waited; otherwise those calls ask on their
    /// own. True when some call got the host.
    pub(super) async fn grant_instance(
        &mut self,
        request: PendingRequest,
        alloc: u64,
        bound: bool,
    ) -> bool {
        let key = request.instance.clone().unwrap_or_default();
        let waiting = self.instances.granted(&key, alloc, bound);
        let Some(a) = self.allocs.get_mut(&alloc) else {
            return false;
        };
        a.instance = bound;
        let (host, address) = (a.host.clone(), a.address.clone());
        let reply = self.granted_reply(alloc, host, address);
        let delivered = request.reply.send(reply.clone()).await.is_ok();
        if !bound {
            if delivered {
                self.watch_launcher(alloc, request.launcher);
            }
            for c in waiting {
                self.ask_broker(request.symbolic.clone(), c, None).await;
            }
            return delivered;
        }
        info!(instance = %request.symbolic, alloc, "instance bound");
        let mut any = delivered;
        if delivered {
            self.note_launcher(alloc, request.launcher);
        }
        for c in waiting {
            let got = c.reply.send(reply.clone()).await.is_ok();
            if got {
                self.note_launcher(alloc, c.pid);
            }
            any |= got;
        }
        if !any {
            self.instances.given_back(alloc);
        }
        any
    }

    /// Request `req` was refused: the calls waiting on its instance get the same answer.
    pub(super) async fn refuse_waiting(&mut self, instance: Option<&str>, message: &str) {
        let Some(key) = instance else { return };
        for c in self.instances.refused(key) {
            let reply = ShimReply::Refused {
                message: message.to_string(),
            };
            let _ = c.reply.send(reply).await;
        }
    }
}
