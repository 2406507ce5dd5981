//! Scenario tests of the agent core: inputs in, outputs checked, time passed in by hand.
//! Each runs in microseconds: no sockets, processes or clocks.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use nix::sys::signal::Signal;
use proto::{
    agent::ShimReply,
    msg::{FromBroker, ToBroker},
};

use super::module_calls::{Action, Call, Outcome, Programs};
use super::*;

const PID: u32 = 4242;

fn template() -> GrantTemplate {
    GrantTemplate {
        subagent_program: PathBuf::from("/bin/rb-subagent"),
        sub_addr: "10.0.0.1:7000".into(),
        secret_file: PathBuf::from("/run/rb/secret"),
        preload: None,
        lab_mark: None,
        remote_shell: vec!["ssh".into()],
        step_times: None,
    }
}

fn programs(grow: bool) -> Programs {
    let path = |action: &str| PathBuf::from(format!("/m/t-{action}"));
    Programs {
        name: "t".into(),
        grow: grow.then(|| path("grow")),
        shrink: Some(path("shrink")),
        halt: Some(path("halt")),
        searched: vec![PathBuf::from("/m")],
    }
}

/// A core and its clock.
struct Job {
    core: AgentCore,
    now: Instant,
}

impl Job {
    fn plain() -> Self {
        Self::with(None)
    }

    fn module() -> Self {
        Self::with(Some(ModuleConfig {
            programs: programs(true),
            timeout: Duration::from_secs(10),
        }))
    }

    fn with(module: Option<ModuleConfig>) -> Self {
        let cfg = CoreConfig {
            grace_ms: 5000,
            grant: template(),
            module,
            agent_pid: 1000,
        };
        Self {
            core: AgentCore::new(cfg),
            now: Instant::now(),
        }
    }

    /// The outputs of `input` but the pool's: the tests of the job's logic leave those to
    /// the pool tests ([`Job::feed_all`]).
    fn feed(&mut self, input: Input) -> Vec<Output> {
        let mut out = self.feed_all(input);
        out.retain(|o| !matches!(o, Output::Pool(_)));
        out
    }

    fn feed_all(&mut self, input: Input) -> Vec<Output> {
        self.core.handle(input, self.now)
    }

    fn later(&mut self, d: Duration) {
        self.now += d;
    }

    fn ask(&mut self, shim: ShimId, symbolic: &str) -> Vec<Output> {
        self.feed(Input::ShimAllocate {
            shim,
            symbolic: symbolic.into(),
            pid: PID,
            lineage: vec![PID],
        })
    }

    fn grant(
        &mut self,
        req: ReqId,
        alloc: AllocId,
        host: &str,
        instance: Option<u32>,
    ) -> Vec<Output> {
        self.feed(Input::Broker(FromBroker::Granted {
            req,
            alloc,
            host: host.into(),
            address: address(host),
            instance,
        }))
    }

    /// A shim asks for `symbolic`, the broker grants `alloc` on `host`, the shim takes it
    /// and a subagent `sub` attaches.
    fn holding(&mut self, alloc: AllocId, host: &str, sub: Option<SubId>) {
        let out = self.ask(alloc * 10, "anyLinux");
        let Some(Output::ToBroker(ToBroker::Allocate { req, .. })) = out.last().cloned() else {
            panic!("no request: {out:?}");
        };
        self.grant(req, alloc, host, None);
        self.feed(Input::Offered {
            alloc,
            reached: true,
        });
        if let Some(sub) = sub {
            assert_eq!(self.feed(Input::SubConnected { alloc, sub }), vec![]);
        }
    }

    fn reclaim(&mut self, alloc: AllocId, host: &str, grace_ms: u64) -> Vec<Output> {
        self.feed(Input::Broker(FromBroker::Reclaim {
            alloc,
            host: host.into(),
            grace_ms,
        }))
    }

    fn module_done(
        &mut self,
        action: Action,
        alloc: Option<AllocId>,
        result: Result<(), String>,
        code: Option<i32>,
    ) -> Vec<Output> {
        self.module_done_saying(action, alloc, result, code, Vec::new())
    }

    /// [`Job::module_done`] of a program that said `said` on stderr.
    fn module_done_saying(
        &mut self,
        action: Action,
        alloc: Option<AllocId>,
        result: Result<(), String>,
        code: Option<i32>,
        said: Vec<String>,
    ) -> Vec<Output> {
        let call = Call {
            action,
            host: alloc.map(|_| ("node03".to_string(), address("node03"))),
            alloc,
            timeout: Duration::from_secs(10),
        };
        self.feed(Input::ModuleDone(Outcome {
            call,
            result,
            elapsed: Duration::from_millis(5),
            code,
            said,
        }))
    }
}

fn address(host: &str) -> String {
    format!("10.0.0.{}", host.len())
}

fn granted_reply(alloc: AllocId, host: &str) -> ShimReply {
    ShimReply::Granted {
        alloc,
        host: host.into(),
        address: address(host),
        remote_shell: vec!["ssh".into()],
        subagent: [
            "/bin/rb-subagent",
            "--agent",
            "10.0.0.1:7000",
            "--alloc",
            &alloc.to_string(),
            "--secret-file",
            "/run/rb/secret",
        ]
        .map(String::from)
        .to_vec(),
    }
}

fn hosts(list: &[(&str, AllocId)]) -> Output {
    Output::WriteHosts(
        list.iter()
            .map(|(h, a)| (h.to_string(), address(h), *a))
            .collect(),
    )
}

fn broker(msg: ToBroker) -> Output {
    Output::ToBroker(msg)
}

fn allocate(req: ReqId, symbolic: &str) -> Output {
    broker(ToBroker::Allocate {
        req,
        symbolic: symbolic.into(),
    })
}

fn terminate(sub: SubId, grace_ms: u64) -> Output {
    Output::ToSub {
        sub,
        msg: FromBroker::Terminate { grace_ms },
    }
}

fn refused(shim: ShimId, message: &str) -> Output {
    Output::ReplyShim {
        shim,
        reply: ShimReply::Refused {
            message: message.into(),
        },
    }
}

#[test]
fn a_grant_is_offered_to_the_shim_and_given_back_when_nobody_takes_it() {
    for (reached, then) in [
        (true, vec![Output::WatchLauncher { alloc: 7, pid: PID }]),
        (
            false,
            vec![hosts(&[]), broker(ToBroker::GiveBack { alloc: 7 })],
        ),
    ] {
        let mut job = Job::plain();
        assert_eq!(job.ask(1, "anyLinux"), vec![allocate(1, "anyLinux")]);
        assert_eq!(
            job.grant(1, 7, "node03", None),
            vec![
                hosts(&[("node03", 7)]),
                Output::Offer {
                    alloc: 7,
                    shims: vec![1],
                    reply: granted_reply(7, "node03"),
                },
            ]
        );
        assert_eq!(
            job.feed(Input::Offered { alloc: 7, reached }),
            then,
            "{reached}"
        );
    }
}

#[test]
fn queued_refused_and_withdrawn_requests_reach_the_shim_or_the_broker() {
    let mut job = Job::plain();
    job.ask(1, "anyLinux");
    job.ask(2, "anyGpu");
    let queued = ShimReply::Queued {
        position: 1,
        reason: None,
    };
    let out = job.feed(Input::Broker(FromBroker::Queued {
        req: 1,
        position: 1,
        reason: None,
    }));
    assert_eq!(
        out,
        vec![Output::ReplyShim {
            shim: 1,
            reply: queued
        }]
    );
    let out = job.feed(Input::Broker(FromBroker::Refused {
        req: 2,
        message: "no such label".into(),
    }));
    assert_eq!(out, vec![refused(2, "no such label")]);
    assert_eq!(
        job.feed(Input::ShimGone { shim: 1 }),
        vec![broker(ToBroker::Cancel { req: 1 })]
    );
    assert_eq!(
        job.grant(1, 7, "node03", None)[1..],
        [hosts(&[]), broker(ToBroker::GiveBack { alloc: 7 })]
    );
}

#[test]
fn a_reclaim_tells_the_subagents_and_confirms_the_release_when_they_are_gone() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    assert_eq!(job.reclaim(7, "node03", 500), vec![terminate(70, 500)]);
    job.later(Duration::from_millis(200));
    // A subagent that attaches meanwhile gets what is left of the grace.
    assert_eq!(
        job.feed(Input::SubConnected { alloc: 7, sub: 71 }),
        vec![terminate(71, 300)]
    );
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 70 }),
        vec![link_lost_timer(7, job.now)]
    );
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 71 }),
        vec![hosts(&[]), broker(ToBroker::Released { alloc: 7 })]
    );
}

/// Sets a job up for [`reclaims_by_the_state_of_the_host`].
type Setup = fn(&mut Job);
/// What a reclaim with 500 ms of grace at `now` gives.
type Want = fn(Instant) -> Vec<Output>;

#[test]
fn reclaims_by_the_state_of_the_host() {
    fn released(_: Instant) -> Vec<Output> {
        vec![hosts(&[]), broker(ToBroker::Released { alloc: 7 })]
    }
    let cases: [(&str, Setup, Want); 4] = [
        (
            "not the job's",
            |_| {},
            |_| vec![broker(ToBroker::Released { alloc: 7 })],
        ),
        (
            // Released even if an orphaned process group still runs there.
            "an instance's host, its subagent gone",
            |j| {
                j.ask(1, "anyLinux-1");
                j.grant(1, 7, "node03", Some(1));
                j.feed(Input::Offered {
                    alloc: 7,
                    reached: true,
                });
                j.feed(Input::SubConnected { alloc: 7, sub: 70 });
                j.feed(Input::SubGone { alloc: 7, sub: 70 });
            },
            released,
        ),
        (
            "subagents attached",
            |j| j.holding(7, "node03", Some(70)),
            |_| vec![terminate(70, 500)],
        ),
        (
            "launch under way",
            |j| j.holding(7, "node03", None),
            |now| {
                vec![Output::SetTimer {
                    timer: Timer::LaunchWindow { alloc: 7 },
                    at: now + Duration::from_millis(500),
                }]
            },
        ),
    ];
    for (what, setup, want) in cases {
        let mut job = Job::plain();
        setup(&mut job);
        assert_eq!(job.reclaim(7, "node03", 500), want(job.now), "{what}");
    }
    // The launch never attached a subagent: released when the grace is over.
    let mut job = Job::plain();
    job.holding(7, "node03", None);
    job.reclaim(7, "node03", 500);
    job.later(Duration::from_millis(500));
    let fired = Input::Timer(Timer::LaunchWindow { alloc: 7 });
    assert_eq!(job.feed(fired), released(job.now));
}

#[test]
fn a_launcher_that_ended_without_a_subagent_gives_its_host_back_after_the_late_attach_time() {
    for attached in [false, true] {
        let mut job = Job::plain();
        job.holding(7, "node03", None);
        assert_eq!(
            job.feed(Input::LauncherExited { alloc: 7, pid: PID }),
            vec![Output::SetTimer {
                timer: Timer::LateAttach { alloc: 7 },
                at: job.now + allocs::LATE_ATTACH,
            }]
        );
        if attached {
            job.feed(Input::SubConnected { alloc: 7, sub: 70 });
        }
        let out = job.feed(Input::Timer(Timer::LateAttach { alloc: 7 }));
        let want = match attached {
            true => vec![],
            false => vec![hosts(&[]), broker(ToBroker::GiveBack { alloc: 7 })],
        };
        assert_eq!(out, want, "attached: {attached}");
    }
}

#[test]
fn instance_names_bind_one_host_reused_until_it_is_taken_back() {
    let mut job = Job::plain();
    assert_eq!(job.ask(1, "anyLinux-1"), vec![allocate(1, "anyLinux-1")]);
    assert_eq!(
        job.ask(2, "anyLinux-1"),
        vec![],
        "waits for the first call's answer"
    );
    let out = job.grant(1, 7, "node03", Some(1));
    assert_eq!(
        out[1],
        Output::Offer {
            alloc: 7,
            shims: vec![1, 2],
            reply: granted_reply(7, "node03"),
        }
    );
    // Both launchers are watched: the job's end waits for them.
    let watch = Output::WatchLauncher { alloc: 7, pid: PID };
    assert_eq!(
        job.feed(Input::Offered {
            alloc: 7,
            reached: true
        }),
        vec![watch.clone(), watch.clone()]
    );
    // Reused without the broker, and kept between commands.
    assert_eq!(
        job.ask(3, "ANYLINUX-1"),
        vec![
            Output::ReplyShim {
                shim: 3,
                reply: granted_reply(7, "node03"),
            },
            watch
        ]
    );
    job.feed(Input::SubConnected { alloc: 7, sub: 70 });
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 70 }),
        vec![link_lost_timer(7, job.now)]
    );
    // Taken back: the next call is told, the one after asks anew.
    assert_eq!(
        job.reclaim(7, "node03", 500),
        vec![hosts(&[]), broker(ToBroker::Released { alloc: 7 })]
    );
    let out = job.ask(4, "anyLinux-1");
    assert!(
        matches!(&out[..], [Output::ReplyShim { shim: 4, reply: ShimReply::Lost { host, .. } }] if host == "node03"),
        "{out:?}"
    );
    assert_eq!(job.ask(5, "anyLinux-1"), vec![allocate(2, "anyLinux-1")]);
}

#[test]
fn an_instance_nobody_took_is_unbound_and_given_back() {
    let mut job = Job::plain();
    job.ask(1, "anyLinux-1");
    job.grant(1, 7, "node03", Some(1));
    assert_eq!(
        job.feed(Input::Offered {
            alloc: 7,
            reached: false
        }),
        vec![hosts(&[]), broker(ToBroker::GiveBack { alloc: 7 })]
    );
    assert_eq!(job.ask(2, "anyLinux-1"), vec![allocate(2, "anyLinux-1")]);
}

#[test]
fn module_phase_one_records_one_request_per_name_and_window_and_refuses_the_shim() {
    let mut job = Job::module();
    let recorded = "request recorded; the t module adds the host granted for it in a moment \
                    (the failure reported for this name is expected)";
    assert_eq!(
        job.ask(1, "anyLinux"),
        vec![refused(1, recorded), allocate(1, "anyLinux")]
    );
    assert_eq!(
        job.ask(2, "anyLinux"),
        vec![refused(2, recorded)],
        "the probe"
    );
    job.later(module_job::REPEAT_WINDOW);
    assert_eq!(job.ask(3, "anyLinux")[1..], [allocate(2, "anyLinux")]);
    // A lookup starts the request; the shim its process starts joins it, whatever the time.
    assert_eq!(
        job.feed(Input::Resolved {
            symbolic: "anyHost".into(),
            pid: 10,
        }),
        vec![allocate(3, "anyHost")]
    );
    job.later(Duration::from_millis(100));
    let out = job.feed(Input::ShimAllocate {
        shim: 4,
        symbolic: "anyHost".into(),
        pid: 12,
        lineage: vec![12, 11, 10],
    });
    assert_eq!(out, vec![refused(4, recorded)]);
}

#[test]
fn module_phase_two_grows_on_a_grant_and_shrinks_before_the_subagents_on_a_reclaim() {
    let mut job = Job::module();
    job.ask(1, "anyLinux");
    let grow = Call {
        action: Action::Grow,
        host: Some(("node03".into(), address("node03"))),
        alloc: Some(7),
        timeout: Duration::from_secs(10),
    };
    assert_eq!(
        job.grant(1, 7, "node03", None),
        vec![hosts(&[("node03", 7)]), Output::RunModule(grow)]
    );
    assert_eq!(
        job.module_done(Action::Grow, Some(7), Ok(()), Some(0)),
        vec![]
    );
    job.feed(Input::SubConnected { alloc: 7, sub: 70 });
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 70 }),
        vec![link_lost_timer(7, job.now)],
        "kept"
    );
    job.feed(Input::SubConnected { alloc: 7, sub: 71 });
    let shrink = Call {
        action: Action::Shrink,
        host: Some(("node03".into(), address("node03"))),
        alloc: Some(7),
        timeout: Duration::from_millis(800),
    };
    assert_eq!(
        job.reclaim(7, "node03", 800),
        vec![Output::RunModule(shrink)]
    );
    job.later(Duration::from_millis(300));
    assert_eq!(
        job.module_done(Action::Shrink, Some(7), Ok(()), Some(0)),
        vec![terminate(71, 500)],
        "the subagents end what the shrink left, by the deadline"
    );
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 71 }),
        vec![hosts(&[]), broker(ToBroker::Released { alloc: 7 })]
    );
}

#[test]
fn what_a_shrink_says_reaches_the_user_before_the_subagents_end_the_rest() {
    let mut job = Job::module();
    job.holding(7, "node03", Some(70));
    job.reclaim(7, "node03", 800);
    let line = "t-shrink: node03 taken back: ended the job's 1 process(es) on LAM node n1";
    assert_eq!(
        job.module_done_saying(Action::Shrink, Some(7), Ok(()), Some(0), vec![line.into()]),
        vec![
            broker(ToBroker::JobNote { text: line.into() }),
            terminate(70, 800)
        ],
    );
}

#[test]
fn a_grow_that_finds_its_host_there_already_gives_it_back_and_asks_again() {
    let mut job = Job::module();
    job.ask(1, "anyLinux");
    job.grant(1, 7, "node03", None);
    let out = job.module_done(Action::Grow, Some(7), Err("dup".into()), Some(6));
    let note = "t-grow node03: node03 is in the job's virtual machine already; giving it \
                back; asking again for anyLinux";
    assert_eq!(
        out,
        vec![
            broker(ToBroker::JobNote { text: note.into() }),
            broker(ToBroker::HostsInUse {
                hosts: vec!["node03".into()]
            }),
            hosts(&[]),
            broker(ToBroker::GiveBack { alloc: 7 }),
            allocate(2, "anyLinux"),
        ]
    );
}

#[test]
fn module_end_halts_then_ends_the_subagents_then_the_job() {
    let mut job = Job::module();
    job.ask(1, "anyLinux");
    job.grant(1, 7, "node03", None);
    job.feed(Input::SubConnected { alloc: 7, sub: 70 });
    let halt = Call {
        action: Action::Halt,
        host: None,
        alloc: None,
        timeout: Duration::from_secs(10),
    };
    assert_eq!(
        job.feed(Input::AppExited { status: 3 }),
        vec![
            Output::SkipQueuedModuleCalls,
            Output::RunModule(halt),
            Output::SetTimer {
                timer: Timer::HaltWait,
                at: job.now + Duration::from_secs(13),
            },
        ]
    );
    let skipped = Err("skipped: the job is ending".to_string());
    assert_eq!(
        job.module_done(Action::Grow, Some(7), skipped, None),
        vec![]
    );
    assert_eq!(
        job.module_done(Action::Halt, None, Ok(()), Some(0)),
        vec![
            terminate(70, end::END_GRACE_MS),
            Output::SetTimer {
                timer: Timer::EndWait,
                at: job.now + end::END_WAIT,
            },
        ]
    );
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 70 }),
        told_end(3, job.now)
    );
    assert_eq!(job.feed(job_ended()), vec![Output::Exit { status: 3 }]);
    assert_eq!(job.core.phase(), Phase::Ended);
}

/// `end_job` told, and the wait for the broker's `job_ended` set from `now`.
fn told_end(status: i32, now: Instant) -> Vec<Output> {
    vec![
        broker(ToBroker::EndJob { status }),
        Output::SetTimer {
            timer: Timer::EndAck,
            at: now + end::END_ACK_WINDOW,
        },
    ]
}

fn job_ended() -> Input {
    Input::Broker(FromBroker::JobEnded { job: 1 })
}

#[test]
fn a_launcher_still_running_holds_the_end_until_it_exits_or_the_end_wait() {
    for exits in [true, false] {
        let mut job = Job::plain();
        job.holding(7, "node03", Some(70));
        assert_eq!(
            job.feed(Input::AppExited { status: 0 }),
            vec![
                terminate(70, end::END_GRACE_MS),
                Output::SetTimer {
                    timer: Timer::EndWait,
                    at: job.now + end::END_WAIT,
                },
            ]
        );
        assert_eq!(
            job.feed(Input::SubGone { alloc: 7, sub: 70 }),
            vec![],
            "the remote shell given node03 still runs"
        );
        let last = match exits {
            true => Input::LauncherExited { alloc: 7, pid: PID },
            false => Input::Timer(Timer::EndWait),
        };
        assert_eq!(job.feed(last), told_end(0, job.now), "exits: {exits}");
    }
}

#[test]
fn a_subagent_attaching_during_the_end_is_told_to_end_at_once_and_waited_for() {
    let mut job = Job::plain();
    job.holding(7, "node03", None);
    job.feed(Input::AppExited { status: 0 });
    job.later(Duration::from_millis(400));
    // Its command started just now: it gets what is left of the end's grace.
    assert_eq!(
        job.feed(Input::SubConnected { alloc: 7, sub: 71 }),
        vec![terminate(71, end::END_GRACE_MS - 400)]
    );
    assert_eq!(
        job.feed(Input::LauncherExited { alloc: 7, pid: PID }),
        vec![],
        "its subagent still runs"
    );
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 71 }),
        told_end(0, job.now)
    );
    // One of a host the job no longer holds: ended at once, and closed.
    assert_eq!(
        job.feed(Input::SubConnected { alloc: 9, sub: 72 }),
        vec![terminate(72, 0), Output::CloseSub { sub: 72 }]
    );
}

#[test]
fn the_end_waits_for_job_ended_and_tells_a_lost_broker_again_within_the_window() {
    let mut job = Job::plain();
    job.ask(1, "anyLinux");
    let start = job.now;
    assert_eq!(job.feed(Input::AppExited { status: 2 }), told_end(2, start));
    assert_eq!(
        job.core.phase(),
        Phase::Confirming {
            status: 2,
            until: start + end::END_ACK_WINDOW
        }
    );
    // Other broker messages change nothing; the loss is reconnected within the window.
    assert_eq!(job.reclaim(7, "node03", 10), vec![]);
    job.later(Duration::from_secs(3));
    assert_eq!(
        job.feed(Input::BrokerLost),
        vec![Output::Reconnect {
            until: start + end::END_ACK_WINDOW
        }]
    );
    // Back: end_job again, and nothing asked again (the request was dropped).
    assert_eq!(
        job.feed(Input::BrokerBack),
        vec![broker(ToBroker::EndJob { status: 2 })]
    );
    assert_eq!(job.feed(job_ended()), vec![Output::Exit { status: 2 }]);
    assert_eq!(job.feed(Input::Timer(Timer::EndAck)), vec![], "ended");

    // No confirmation within the window: exit anyway; a broker that does not come back.
    let mut job = Job::plain();
    job.feed(Input::AppExited { status: 2 });
    assert_eq!(
        job.feed(Input::Timer(Timer::EndAck)),
        vec![Output::Exit { status: 2 }]
    );
    let mut job = Job::plain();
    job.feed(Input::AppExited { status: 2 });
    job.feed(Input::BrokerLost);
    assert_eq!(
        job.feed(Input::BrokerGone),
        vec![Output::Exit { status: 2 }]
    );
}

#[test]
fn a_broker_lost_while_draining_is_got_back_to_tell_the_end_and_one_gone_is_not_told() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    job.feed(Input::LauncherExited { alloc: 7, pid: PID });
    job.feed(Input::AppExited { status: 0 });
    assert_eq!(
        job.feed(Input::BrokerLost),
        vec![],
        "not while subagents end"
    );
    let until = job.now + end::END_ACK_WINDOW;
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 70 }),
        vec![
            Output::Reconnect { until },
            Output::SetTimer {
                timer: Timer::EndAck,
                at: until
            },
        ]
    );
    assert_eq!(
        job.feed(Input::BrokerBack),
        vec![broker(ToBroker::EndJob { status: 0 })]
    );

    let mut job = Job::plain();
    job.feed(Input::BrokerLost);
    job.feed(Input::BrokerGone);
    assert_eq!(
        job.feed(Input::AppExited { status: 143 }),
        vec![Output::Exit { status: 143 }]
    );
}

#[test]
fn app_exit_ends_the_job_at_once_or_after_the_subagents_or_the_end_wait() {
    let mut job = Job::plain();
    assert_eq!(
        job.feed(Input::AppExited { status: 0 }),
        told_end(0, job.now)
    );

    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    let out = job.feed(Input::AppExited { status: 130 });
    assert_eq!(out[0], terminate(70, 1000));
    // While the job ends: new shims are closed, signals and the broker ignored.
    let ending = [
        (job.ask(5, "anyLinux"), vec![Output::CloseShim { shim: 5 }]),
        (job.feed(Input::Signal(Signal::SIGTERM)), vec![]),
        (job.reclaim(7, "node03", 10), vec![]),
    ];
    for (out, want) in ending {
        assert_eq!(out, want);
    }
    assert_eq!(
        job.feed(Input::Timer(Timer::EndWait)),
        told_end(130, job.now)
    );
    assert_eq!(job.feed(Input::Timer(Timer::EndWait)), vec![], "confirming");
}

#[test]
fn a_lost_broker_is_reconnected_and_told_every_waiting_request_again() {
    let mut job = Job::plain();
    job.ask(1, "anyLinux");
    job.ask(2, "anyHost");
    assert_eq!(
        job.feed(Input::BrokerLost),
        vec![Output::Reconnect {
            until: job.now + end::RECONNECT_WINDOW,
        }]
    );
    assert_eq!(
        job.feed(Input::BrokerBack),
        vec![allocate(1, "anyLinux"), allocate(2, "anyHost")]
    );
    assert_eq!(
        job.feed(Input::BrokerGone),
        vec![Output::Signal(Signal::SIGTERM)]
    );

    let mut job = Job::module();
    job.ask(1, "anyLinux");
    job.feed(Input::Named {
        host: "node09".into(),
    });
    assert_eq!(
        job.feed(Input::BrokerBack),
        vec![
            broker(ToBroker::HostsInUse {
                hosts: vec!["node09".into()]
            }),
            allocate(1, "anyLinux"),
        ]
    );
}

#[test]
fn signals_go_to_the_app_while_it_runs() {
    let mut job = Job::plain();
    for sig in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        assert_eq!(job.feed(Input::Signal(sig)), vec![Output::Signal(sig)]);
    }
}

#[test]
fn missing_module_programs_are_noted_at_start_and_phase_one_says_so() {
    let mut job = Job::with(Some(ModuleConfig {
        programs: programs(false),
        timeout: Duration::from_secs(1),
    }));
    let out = job.feed(Input::Started);
    assert!(
        matches!(&out[..], [Output::ToBroker(ToBroker::JobNote { text })] if text.contains("t-grow not found in /m")),
        "{out:?}"
    );
    let out = job.ask(1, "anyLinux");
    assert!(
        matches!(&out[..], [Output::ReplyShim { reply: ShimReply::Refused { message }, .. }] if message.contains("t-grow not found")),
        "no request without a grow program: {out:?}"
    );
}

#[test]
fn attach_answers_for_the_jobs_hosts_only() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    assert_eq!(
        job.feed(Input::ShimAttach {
            shim: 9,
            host: address("node03"),
        }),
        vec![Output::ReplyShim {
            shim: 9,
            reply: granted_reply(7, "node03"),
        }]
    );
    assert_eq!(
        job.feed(Input::ShimAttach {
            shim: 9,
            host: "node05".into(),
        }),
        vec![refused(9, "node05 is not allocated to this job")]
    );
}

/// Subagents prove the job's key, not the lab secret, so they learn the lab's mark (for
/// their commands' tag, which the host daemons sweep by) from the agent's grant.
#[test]
fn a_grant_hands_the_subagent_the_labs_mark() {
    let mut grant = template();
    grant.lab_mark = Some("00ff9a".into());
    let core = AgentCore::new(CoreConfig {
        grace_ms: 5000,
        grant,
        module: None,
        agent_pid: 1000,
    });
    let ShimReply::Granted { subagent, .. } =
        core.granted_reply(3, "node03".into(), "10.0.0.3".into())
    else {
        panic!("not a grant");
    };
    let at = subagent
        .iter()
        .position(|a| a == "--lab-mark")
        .expect("--lab-mark given");
    assert_eq!(subagent[at + 1], "00ff9a");
}

/// The remote shell passes no environment: an agent with `RB_STEP_TIMES` (a benchmark's)
/// tells its subagents the file on their command line, and only then.
#[test]
fn a_grant_hands_the_subagent_the_step_file_only_when_the_agent_has_one() {
    let grant_args = |step_times: Option<&str>| {
        let mut grant = template();
        grant.step_times = step_times.map(PathBuf::from);
        let core = AgentCore::new(CoreConfig {
            grace_ms: 5000,
            grant,
            module: None,
            agent_pid: 1000,
        });
        match core.granted_reply(3, "node03".into(), "10.0.0.3".into()) {
            ShimReply::Granted { subagent, .. } => subagent,
            other => panic!("not a grant: {other:?}"),
        }
    };
    let args = grant_args(Some("/lab/home/steps"));
    let at = args
        .iter()
        .position(|a| a == "--step-times")
        .expect("--step-times given");
    assert_eq!(args[at + 1], "/lab/home/steps");
    assert!(!grant_args(None).iter().any(|a| a == "--step-times"));
}

// The JEL pool's events ([`Output::Pool`]): one place, in the order the pool must see them.

/// The timer a lost subagent link of a host the job keeps sets (JEL's `host_lost`).
fn link_lost_timer(alloc: AllocId, now: Instant) -> Output {
    Output::SetTimer {
        timer: Timer::LinkLost { alloc },
        at: now + super::link_loss::ENDS_AFTER_LOSS,
    }
}

#[test]
fn a_lost_link_of_a_kept_host_ends_its_jel_members_at_the_subagents_deadline() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    job.holding(8, "node04", Some(80));
    // node03 keeps a second subagent; node04 has none left (kept: an instance host).
    job.feed(Input::SubConnected { alloc: 7, sub: 71 });
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 70 }),
        vec![link_lost_timer(7, job.now)]
    );
    job.core.allocs.get_mut(&8).expect("held").instance = true;
    assert_eq!(
        job.feed(Input::SubGone { alloc: 8, sub: 80 }),
        vec![link_lost_timer(8, job.now)]
    );
    job.later(super::link_loss::ENDS_AFTER_LOSS);
    let lost = |alloc, host: &str, host_lost| {
        let host = host.to_string();
        pool(PoolEvent::LinkLost {
            alloc,
            host,
            host_lost,
        })
    };
    let timer = |alloc| Input::Timer(Timer::LinkLost { alloc });
    assert_eq!(job.feed_all(timer(7)), vec![lost(7, "node03", false)]);
    assert_eq!(job.feed_all(timer(8)), vec![lost(8, "node04", true)]);
    // A host no longer the job's: nothing.
    job.core.allocs.remove(&8);
    assert_eq!(job.feed_all(timer(8)), vec![]);
}

fn pool(event: PoolEvent) -> Output {
    Output::Pool(event)
}

fn granted(host: &str) -> Output {
    pool(PoolEvent::HostGranted { host: host.into() })
}

fn released(host: &str) -> Output {
    pool(PoolEvent::HostReleased { host: host.into() })
}

fn vacate(host: &str, deadline: Instant) -> Output {
    let host = host.into();
    pool(PoolEvent::Reclaim { host, deadline })
}

#[test]
fn pool_a_grant_is_announced_first_and_one_nobody_took_is_released_before_the_broker_learns() {
    let mut job = Job::plain();
    job.ask(1, "anyLinux");
    let out = job.feed_all(Input::Broker(FromBroker::Granted {
        req: 1,
        alloc: 7,
        host: "node03".into(),
        address: address("node03"),
        instance: None,
    }));
    assert_eq!(out[0], granted("node03"));
    assert_eq!(
        job.feed_all(Input::Offered {
            alloc: 7,
            reached: false
        }),
        vec![
            released("node03"),
            hosts(&[]),
            broker(ToBroker::GiveBack { alloc: 7 })
        ]
    );
}

#[test]
fn pool_a_reclaim_is_vacate_before_the_subagents_terminate_then_released_once_gone() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    let deadline = job.now + Duration::from_millis(500);
    let out = job.feed_all(Input::Broker(FromBroker::Reclaim {
        alloc: 7,
        host: "node03".into(),
        grace_ms: 500,
    }));
    assert_eq!(out, vec![vacate("node03", deadline), terminate(70, 500)]);
    // The broker asking again changes nothing in the stream: one vacate per reclaim.
    let again = job.feed_all(Input::Broker(FromBroker::Reclaim {
        alloc: 7,
        host: "node03".into(),
        grace_ms: 500,
    }));
    assert_eq!(again, vec![terminate(70, 500)]);
    assert_eq!(
        job.feed_all(Input::SubGone { alloc: 7, sub: 70 }),
        vec![
            released("node03"),
            hosts(&[]),
            broker(ToBroker::Released { alloc: 7 })
        ]
    );
}

#[test]
fn pool_a_reclaimed_host_whose_launch_never_attached_is_vacated_then_released() {
    let mut job = Job::plain();
    job.holding(7, "node03", None);
    let deadline = job.now + Duration::from_millis(500);
    let out = job.feed_all(Input::Broker(FromBroker::Reclaim {
        alloc: 7,
        host: "node03".into(),
        grace_ms: 500,
    }));
    assert_eq!(out[0], vacate("node03", deadline));
    job.later(Duration::from_millis(500));
    let out = job.feed_all(Input::Timer(Timer::LaunchWindow { alloc: 7 }));
    assert_eq!(out[0], released("node03"));
}

#[test]
fn pool_a_module_jobs_reclaim_is_vacate_before_the_shrink() {
    let mut job = Job::module();
    job.ask(1, "anyLinux");
    job.grant(1, 7, "node03", None);
    job.module_done(Action::Grow, Some(7), Ok(()), Some(0));
    let deadline = job.now + Duration::from_millis(800);
    let out = job.feed_all(Input::Broker(FromBroker::Reclaim {
        alloc: 7,
        host: "node03".into(),
        grace_ms: 800,
    }));
    assert_eq!(out[0], vacate("node03", deadline));
    assert!(matches!(&out[1], Output::RunModule(c) if c.action == Action::Shrink));
    let out = job.module_done(Action::Shrink, Some(7), Ok(()), Some(0));
    assert_eq!(
        out,
        vec![hosts(&[]), broker(ToBroker::Released { alloc: 7 })]
    );
}

#[test]
fn pool_the_job_end_terminates_the_pool_after_the_end_sequence_right_before_the_exit() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    let out = job.feed_all(Input::AppExited { status: 0 });
    assert!(!out.iter().any(|o| matches!(o, Output::Pool(_))), "{out:?}");
    let out = job.feed_all(Input::SubGone { alloc: 7, sub: 70 });
    assert_eq!(out, vec![], "the launcher still runs");
    let out = job.feed_all(Input::LauncherExited { alloc: 7, pid: PID });
    assert_eq!(out, told_end(0, job.now), "the broker told first");
    assert_eq!(
        job.feed_all(job_ended()),
        vec![pool(PoolEvent::Terminate), Output::Exit { status: 0 }]
    );
}

/// The answer to a shim whose remote shell for `alloc` exited 0.
fn taken_back_answer(job: &mut Job, shim: ShimId, alloc: AllocId) -> Vec<Output> {
    job.feed(Input::ShimTakenBack { shim, alloc })
}

/// The book the shims' listener answers `taken_back` from says what the core's own answer
/// says, and its version changes with it (the shell republishes only then).
#[test]
fn the_taken_back_book_agrees_with_the_cores_answer() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    let (v0, book) = job.core.taken_back_book();
    assert!(book.is_empty());
    job.reclaim(7, "node03", 1000);
    let (v1, book) = job.core.taken_back_book();
    assert_ne!(v0, v1);
    assert_eq!(job.core.taken_back_version(), v1);
    let out = taken_back_answer(&mut job, 2, 7);
    let [Output::ReplyShim {
        reply: ShimReply::TakenBack { host, message, .. },
        ..
    }] = &out[..]
    else {
        panic!("not taken back: {out:?}");
    };
    assert_eq!(book.get(&7), Some(&(host.clone(), message.clone())));
    assert_eq!(book.len(), 1);
    job.reclaim(7, "node03", 1000);
    assert_eq!(job.core.taken_back_version(), v1, "remembered once");
}

#[test]
fn a_shim_learns_that_its_host_was_taken_back_while_the_command_ran() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    // Not taken back: the command's 0 stands.
    assert_eq!(
        taken_back_answer(&mut job, 1, 7),
        vec![Output::ReplyShim {
            shim: 1,
            reply: ShimReply::NotTakenBack { alloc: 7 }
        }]
    );
    job.reclaim(7, "node03", 1000);
    // Asked while the subagent still ends the command, and after the host is released.
    let out = taken_back_answer(&mut job, 2, 7);
    let [Output::ReplyShim {
        shim: 2,
        reply:
            ShimReply::TakenBack {
                alloc: 7,
                host,
                message,
            },
    }] = &out[..]
    else {
        panic!("not taken back: {out:?}");
    };
    assert_eq!(host, "node03");
    assert!(
        message.contains("reclaimed with 1000 ms of grace"),
        "{message}"
    );
    assert_eq!(
        job.feed(Input::SubGone { alloc: 7, sub: 70 }),
        vec![hosts(&[]), broker(ToBroker::Released { alloc: 7 })]
    );
    assert_eq!(taken_back_answer(&mut job, 3, 7)[0], {
        let Output::ReplyShim { reply, .. } = &out[0] else {
            unreachable!()
        };
        Output::ReplyShim {
            shim: 3,
            reply: reply.clone(),
        }
    });
    // A reclaim told again (a restarted broker) is remembered once.
    job.reclaim(7, "node03", 1000);
    assert_eq!(job.core.taken_back.len(), 1);
}

#[test]
fn hosts_given_back_or_never_held_were_not_taken_back() {
    let mut job = Job::plain();
    // A command that ended by itself: its host goes back, nobody took it.
    job.holding(7, "node03", Some(70));
    job.feed(Input::SubGone { alloc: 7, sub: 70 });
    let not = |shim, alloc| {
        vec![Output::ReplyShim {
            shim,
            reply: ShimReply::NotTakenBack { alloc },
        }]
    };
    assert_eq!(taken_back_answer(&mut job, 1, 7), not(1, 7));
    // A reclaim of an allocation the job no longer holds took nothing from it.
    job.reclaim(7, "node03", 1000);
    assert_eq!(taken_back_answer(&mut job, 2, 7), not(2, 7));
    assert_eq!(taken_back_answer(&mut job, 3, 99), not(3, 99));
}

#[test]
fn taken_back_is_answered_while_the_job_ends_and_the_memory_is_bounded() {
    let mut job = Job::plain();
    job.holding(7, "node03", Some(70));
    job.reclaim(7, "node03", 1000);
    job.feed(Input::AppExited { status: 0 });
    assert!(
        matches!(job.core.phase(), Phase::Draining { .. }),
        "{:?}",
        job.core.phase()
    );
    let out = taken_back_answer(&mut job, 1, 7);
    assert!(
        matches!(
            &out[..],
            [Output::ReplyShim {
                shim: 1,
                reply: ShimReply::TakenBack { alloc: 7, .. }
            }]
        ),
        "{out:?}"
    );
    // The job's own end is not a taking back.
    let mut job = Job::plain();
    job.holding(8, "node04", Some(80));
    job.feed(Input::AppExited { status: 0 });
    assert!(matches!(
        &taken_back_answer(&mut job, 1, 8)[..],
        [Output::ReplyShim {
            reply: ShimReply::NotTakenBack { alloc: 8 },
            ..
        }]
    ));
    // Only the last TAKEN_BACK_MEMORY are kept.
    let mut job = Job::plain();
    let n = proto::agent::TAKEN_BACK_MEMORY as u64 + 2;
    for alloc in 1..=n {
        job.holding(alloc, "node03", Some(alloc * 100));
        job.reclaim(alloc, "node03", 10);
    }
    assert_eq!(job.core.taken_back.len(), proto::agent::TAKEN_BACK_MEMORY);
    assert!(job.core.taken_back(1).is_none() && job.core.taken_back(2).is_none());
    assert!(job.core.taken_back(3).is_some() && job.core.taken_back(n).is_some());
}

#[test]
fn each_remote_shell_line_of_a_shim_is_noted_once_for_rb_jobs() {
    let mut job = Job::plain();
    let line = "ssh: anyLinux-1: granted node03 (allocation 7) over ssh";
    let used = |line: &str| Input::RouteUsed { line: line.into() };
    assert_eq!(
        job.feed(used(line)),
        vec![broker(ToBroker::JobNote { text: line.into() })]
    );
    assert_eq!(
        job.feed(used(line)),
        vec![],
        "the same line again: noted already"
    );
    let other = "ssh: node05: pass-through to /usr/bin/ssh";
    assert_eq!(
        job.feed(used(other)),
        vec![broker(ToBroker::JobNote { text: other.into() })]
    );
    for n in 0..super::ROUTE_NOTES {
        job.feed(used(&format!("ssh: node{n}: pass-through to /usr/bin/ssh")));
    }
    assert_eq!(
        job.feed(used("ssh: one-more: pass-through to /usr/bin/ssh")),
        vec![],
        "bounded"
    );
}

#[test]
fn a_subagents_note_is_said_once_with_its_host_and_cut_to_length() {
    let mut job = Job::plain();
    job.holding(4, "node03", Some(400));
    let note = |text: &str| Input::SubNote {
        alloc: 4,
        text: text.into(),
    };
    let text = "/tmp/rb-1000 is not ours; running from /home/u/.local/state/rb/run-node03 instead";
    assert_eq!(
        job.feed(note(text)),
        vec![broker(ToBroker::JobNote {
            text: format!("node03: {text}")
        })]
    );
    assert_eq!(job.feed(note(text)), vec![], "said once");
    let long = "x".repeat(super::SUB_NOTE_CHARS * 3);
    let out = job.feed(note(&long));
    assert!(
        matches!(&out[..], [Output::ToBroker(ToBroker::JobNote { text })]
            if text.chars().count() == "node03: ".len() + super::SUB_NOTE_CHARS),
        "{out:?}"
    );
}
