//! The broker lost and back (requests asked again), the broker gone for good (the job is
//! ended), and the end of the job: `NAME-halt` for module jobs, every subagent told to end
//! its process group, a bounded wait for them and for the launchers still running (a remote
//! shell still starting a command), `end_job` to the broker, a bounded wait for its
//! `job_ended` (the end is saved; a broker lost meanwhile is got back and told again), exit.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use proto::msg::{FromBroker, ToBroker};
use tracing::{info, warn};

use super::{AgentCore, Input, Link, Out, Output, Phase, PoolEvent, Timer};

/// How long the end of a job waits for subagents to report their processes gone and for
/// launchers still running to end.
pub(super) const END_WAIT: Duration = Duration::from_secs(4);
/// How long the agent tries to get its broker back before ending the job.
pub(super) const RECONNECT_WINDOW: Duration = Duration::from_secs(60);
/// The grace subagents get to end their process groups at the job's end.
pub(super) const END_GRACE_MS: u64 = 1000;
/// How long the job's end waits for the broker to confirm it saved the end (broker lost
/// meanwhile: reconnecting included). Past it the agent exits anyway: the broker then ends
/// the job when its agent does not come back after a restart.
pub(super) const END_ACK_WINDOW: Duration = Duration::from_secs(10);

impl AgentCore {
    /// The broker connection failed: get it back within [`RECONNECT_WINDOW`].
    pub(super) fn broker_lost(&mut self, now: Instant, out: &mut Out) {
        warn!("lost the broker; reconnecting");
        self.broker = Link::Lost;
        out.push(Output::Reconnect {
            until: now + RECONNECT_WINDOW,
        });
    }

    /// The broker is back and knows the job: it learns the hosts in use and every request
    /// still waiting, again.
    pub(super) fn broker_back(&mut self, out: &mut Out) {
        self.broker = Link::Live;
        let mut waiting: Vec<(u64, String)> = self.waiting_requests().collect();
        let (module_requests, in_use) = self.module_state_to_resend();
        waiting.extend(module_requests);
        if !in_use.is_empty() {
            self.tell_broker(ToBroker::HostsInUse { hosts: in_use }, out);
        }
        for (req, symbolic) in waiting {
            self.tell_broker(ToBroker::Allocate { req, symbolic }, out);
        }
    }

    /// The broker did not come back: the job cannot go on; the app is told to end.
    pub(super) fn broker_gone(&mut self, out: &mut Out) {
        warn!("the broker did not come back; ending the job");
        self.broker = Link::Gone;
        out.push(Output::Signal(Signal::SIGTERM));
    }

    /// The app ended: the end sequence starts (module jobs: the halt first).
    pub(super) fn app_exited(&mut self, status: i32, now: Instant, out: &mut Out) {
        if self.module_halt(now, out) {
            self.phase = Phase::Halting { status };
        } else {
            self.drain(status, now, out);
        }
    }

    /// Every subagent is told to end its process group, and one that attaches from now on
    /// at once (its host is reclaiming); the job ends once they are gone and every launcher
    /// has ended, or [`END_WAIT`] has passed. Were the broker told first, it could give a
    /// host to another job while this job's command still starts there.
    fn drain(&mut self, status: i32, now: Instant, out: &mut Out) {
        let deadline = now + Duration::from_millis(END_GRACE_MS);
        for a in self.allocs.values_mut() {
            a.reclaiming = true;
            a.deadline = Some(deadline);
            for &sub in &a.subs {
                let msg = FromBroker::Terminate {
                    grace_ms: END_GRACE_MS,
                };
                out.push(Output::ToSub { sub, msg });
            }
        }
        if self.drained() {
            return self.finish(status, now, out);
        }
        self.phase = Phase::Draining { status };
        out.push(Output::SetTimer {
            timer: Timer::EndWait,
            at: now + END_WAIT,
        });
    }

    /// Tells the broker the job ended and waits (within [`END_ACK_WINDOW`]) until it says
    /// the end is saved: an end the broker never saved would bring the job back after its
    /// restart, its hosts held with no agent to end it. Nothing is asked for any more, so
    /// waiting requests are dropped first (a reconnect would ask them again).
    fn finish(&mut self, status: i32, now: Instant, out: &mut Out) {
        self.pending.clear();
        if let Some(m) = &mut self.module {
            m.requests.clear();
        }
        if self.broker == Link::Gone {
            return self.exit(status, out);
        }
        let until = now + END_ACK_WINDOW;
        self.phase = Phase::Confirming { status, until };
        match self.broker {
            Link::Lost => out.push(Output::Reconnect { until }),
            _ => self.tell_end(status, out),
        }
        out.push(Output::SetTimer {
            timer: Timer::EndAck,
            at: until,
        });
    }

    fn tell_end(&mut self, status: i32, out: &mut Out) {
        self.tell_broker(ToBroker::EndJob { status }, out);
        info!("told the broker the job ended; waiting for it to save that");
    }

    /// The job is over: the pool's stream ends (`terminated`), then the agent exits.
    fn exit(&mut self, status: i32, out: &mut Out) {
        self.phase = Phase::Ended;
        out.push(Output::Pool(PoolEvent::Terminate));
        out.push(Output::Exit { status });
    }

    /// No subagent attached and no launcher running on any of the job's hosts.
    fn drained(&self) -> bool {
        self.allocs
            .values()
            .all(|a| a.subs.is_empty() && a.launchers.is_empty())
    }

    /// Inputs while the job ends: the halt's outcome, subagents and launchers leaving, late
    /// subagents, the broker's confirmation or loss, the end's timers, `taken_back`
    /// questions. New shim requests for hosts are closed unanswered; the rest is ignored.
    pub(super) fn ending(&mut self, input: Input, now: Instant, out: &mut Out) {
        match (input, self.phase) {
            (Input::ModuleDone(outcome), Phase::Halting { status }) => {
                let halted = self.halting_module_done(&outcome, out);
                if halted {
                    self.drain(status, now, out);
                }
            }
            (Input::Timer(Timer::HaltWait), Phase::Halting { status }) => {
                warn!("the module's halt did not report back in time");
                self.drain(status, now, out);
            }
            (Input::SubGone { alloc, sub }, phase) => {
                if let Some(a) = self.allocs.get_mut(&alloc) {
                    a.subs.remove(&sub);
                }
                self.drain_step(phase, now, out);
            }
            (Input::LauncherExited { alloc, pid }, phase) => {
                if let Some(a) = self.allocs.get_mut(&alloc) {
                    a.launchers.remove(&pid);
                }
                self.drain_step(phase, now, out);
            }
            // Late: while draining or later its command ends at once (the host is
            // reclaiming); while halting the drain tells it.
            (Input::SubConnected { alloc, sub }, _) => self.sub_connected(alloc, sub, now, out),
            (Input::Timer(Timer::EndWait), Phase::Draining { status }) => {
                warn!("subagents or remote shells of the job still run at its end");
                self.finish(status, now, out)
            }
            (Input::ShimAllocate { shim, .. } | Input::ShimAttach { shim, .. }, _) => {
                out.push(Output::CloseShim { shim })
            }
            (Input::ShimTakenBack { shim, alloc }, _) => self.shim_taken_back(shim, alloc, out),
            (input, Phase::Confirming { status, until }) => {
                self.confirming(input, status, until, out)
            }
            (Input::BrokerLost, _) => self.broker = Link::Lost,
            _ => {}
        }
    }

    /// While draining: the end goes on once nothing of the job runs on its hosts.
    fn drain_step(&mut self, phase: Phase, now: Instant, out: &mut Out) {
        if let (Phase::Draining { status }, true) = (phase, self.drained()) {
            self.finish(status, now, out);
        }
    }

    /// Waiting for the broker's `job_ended`: a lost broker is got back by `until` and told
    /// the end again; past `until` the agent exits anyway.
    fn confirming(&mut self, input: Input, status: i32, until: Instant, out: &mut Out) {
        match input {
            Input::Broker(FromBroker::JobEnded { .. }) => self.exit(status, out),
            Input::BrokerLost => {
                warn!("lost the broker while ending the job; reconnecting");
                self.broker = Link::Lost;
                out.push(Output::Reconnect { until });
            }
            Input::BrokerBack => {
                self.broker = Link::Live;
                self.tell_end(status, out);
            }
            Input::BrokerGone => {
                warn!("the broker did not come back to confirm the job's end");
                self.broker = Link::Gone;
                self.exit(status, out);
            }
            Input::Timer(Timer::EndAck) => {
                warn!("the broker did not confirm the job's end in time");
                self.exit(status, out);
            }
            _ => {}
        }
    }
}
