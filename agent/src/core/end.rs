//! The broker lost and back (requests asked again), the broker gone for good (the job is
//! ended), and the end of the job: `NAME-halt` for module jobs, every subagent told to end
//! its process group, a bounded wait for them, `end_job` to the broker, exit.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use proto::msg::{FromBroker, ToBroker};
use tracing::warn;

use super::{AgentCore, Input, Out, Output, Phase, Timer};

/// How long the end of a job waits for subagents to report their processes gone.
pub(super) const END_WAIT: Duration = Duration::from_secs(4);
/// How long the agent tries to get its broker back before ending the job.
pub(super) const RECONNECT_WINDOW: Duration = Duration::from_secs(60);
/// The grace subagents get to end their process groups at the job's end.
pub(super) const END_GRACE_MS: u64 = 1000;

impl AgentCore {
    /// The broker connection failed: get it back within [`RECONNECT_WINDOW`].
    pub(super) fn broker_lost(&mut self, now: Instant, out: &mut Out) {
        warn!("lost the broker; reconnecting");
        out.push(Output::Reconnect {
            until: now + RECONNECT_WINDOW,
        });
    }

    /// The broker is back and knows the job: it learns the hosts in use and every request
    /// still waiting, again.
    pub(super) fn broker_back(&mut self, out: &mut Out) {
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

    /// Every subagent is told to end its process group; the job ends once they are gone or
    /// [`END_WAIT`] has passed.
    fn drain(&mut self, status: i32, now: Instant, out: &mut Out) {
        for a in self.allocs.values_mut() {
            a.reclaiming = true;
            for &sub in &a.subs {
                let msg = FromBroker::Terminate {
                    grace_ms: END_GRACE_MS,
                };
                out.push(Output::ToSub { sub, msg });
            }
        }
        if self.no_subagents() {
            return self.finish(status, out);
        }
        self.phase = Phase::Draining { status };
        out.push(Output::SetTimer {
            timer: Timer::EndWait,
            at: now + END_WAIT,
        });
    }

    fn finish(&mut self, status: i32, out: &mut Out) {
        self.phase = Phase::Ended;
        self.tell_broker(ToBroker::EndJob { status }, out);
        out.push(Output::Exit { status });
    }

    fn no_subagents(&self) -> bool {
        self.allocs.values().all(|a| a.subs.is_empty())
    }

    /// Inputs while the job ends: the halt's outcome, subagents leaving, the end's timers.
    /// New shim and subagent connections are closed unanswered; the rest is ignored.
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
                if let (Phase::Draining { status }, true) = (phase, self.no_subagents()) {
                    self.finish(status, out);
                }
            }
            (Input::Timer(Timer::EndWait), Phase::Draining { status }) => self.finish(status, out),
            (Input::ShimAllocate { shim, .. } | Input::ShimAttach { shim, .. }, _) => {
                out.push(Output::CloseShim { shim })
            }
            (Input::SubConnected { sub, .. }, _) => out.push(Output::CloseSub { sub }),
            _ => {}
        }
    }
}
