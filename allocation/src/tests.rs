//! Scenario tests of the allocation core (each checks the invariants after every step) and a
//! randomised test with fixed xorshift seeds.

use std::time::{Duration, Instant};

use super::host::tests::{session, view};
use super::*;

const GRACE: Duration = Duration::from_secs(5);

/// An allocator, a clock and helpers that check the invariants after every operation.
pub(super) struct Lab {
    pub(super) a: Allocator,
    pub(super) now: Instant,
    pub(super) views: Vec<HostView>,
}

impl Lab {
    pub(super) fn new(views: Vec<HostView>) -> Lab {
        let mut lab = Lab {
            a: Allocator::new(),
            now: Instant::now(),
            views,
        };
        lab.sync();
        lab
    }

    pub(super) fn check(&self) {
        if let Err(e) = self.a.check_invariants() {
            panic!("invariant broken: {e}\n{:#?}", self.a);
        }
    }

    /// Tells the allocator every host's view, one at a time (as reports arrive).
    pub(super) fn sync(&mut self) -> Vec<Effect> {
        let mut fx = Vec::new();
        for v in self.views.clone() {
            fx.extend(self.a.host_changed(v, self.now));
            self.check();
        }
        fx
    }

    pub(super) fn set(&mut self, host: &str, f: impl FnOnce(&mut HostView)) -> Vec<Effect> {
        let v = self
            .views
            .iter_mut()
            .find(|v| v.name == host)
            .expect("host");
        f(v);
        let fx = self.a.host_changed(v.clone(), self.now);
        self.check();
        fx
    }

    pub(super) fn job(&mut self, adaptive: bool) -> JobId {
        let info = JobInfo {
            user: "alice".into(),
            cwd: "/home/alice".into(),
            argv: vec!["app".into()],
            spec: None,
            adaptive,
        };
        let (id, fx) = self.a.register_job(info, self.now);
        assert_eq!(fx, vec![Effect::Persist]);
        self.check();
        id
    }

    pub(super) fn req(&mut self, job: JobId, name: &str) -> (RequestId, Vec<Effect>) {
        let r = self.a.request(job, name, self.now);
        self.check();
        r
    }

    /// Requests and expects a grant; returns (alloc, host).
    pub(super) fn take(&mut self, job: JobId, name: &str) -> (AllocId, String) {
        let (_, fx) = self.req(job, name);
        granted(&fx).unwrap_or_else(|| panic!("no grant: {fx:?}"))
    }

    pub(super) fn give_back(&mut self, alloc: AllocId) -> Vec<Effect> {
        let fx = self.a.give_back(alloc, self.now);
        self.check();
        fx
    }

    pub(super) fn confirm(&mut self, alloc: AllocId) -> Vec<Effect> {
        let fx = self.a.release_confirmed(alloc, self.now);
        self.check();
        fx
    }

    pub(super) fn tick(&mut self, secs: u64) -> Vec<Effect> {
        self.now += Duration::from_secs(secs);
        let fx = self.a.tick(self.now);
        self.check();
        fx
    }

    pub(super) fn end(&mut self, job: JobId) -> Vec<Effect> {
        let fx = self.a.end_job(job, self.now);
        self.check();
        fx
    }
}

/// A job of user `bob` running `x`: the registration the order and preparation tests use.
pub(crate) fn job_info(adaptive: bool) -> JobInfo {
    JobInfo {
        user: "bob".into(),
        cwd: "/".into(),
        argv: vec!["x".into()],
        spec: None,
        adaptive,
    }
}

pub(super) fn hosts(names: &[&str]) -> Vec<HostView> {
    names.iter().map(|n| view(n)).collect()
}

pub(super) fn granted(fx: &[Effect]) -> Option<(AllocId, String)> {
    fx.iter().find_map(|e| match e {
        Effect::Granted { alloc, host, .. } => Some((*alloc, host.clone())),
        _ => None,
    })
}

pub(super) fn reclaims(fx: &[Effect]) -> Vec<(JobId, AllocId, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Reclaim {
                job, alloc, host, ..
            } => Some((*job, *alloc, host.clone())),
            _ => None,
        })
        .collect()
}

pub(super) fn position(fx: &[Effect], req: RequestId) -> Option<usize> {
    fx.iter().rev().find_map(|e| match e {
        Effect::Queued {
            req: r, position, ..
        } if *r == req => Some(*position),
        _ => None,
    })
}

#[test]
fn quiet_host_beats_less_loaded_busy_one() {
    let mut lab = Lab::new(hosts(&["busy", "quiet"]));
    lab.set("busy", |v| v.users = Some(vec![session(Some(30))]));
    lab.set("quiet", |v| v.load1 = Some(3.0));
    let j = lab.job(false);
    assert_eq!(lab.take(j, "anyHost").1, "quiet");
    assert_eq!(
        lab.take(j, "anyHost").1,
        "busy",
        "a busy public host is still eligible"
    );
}

#[test]
fn least_loaded_then_public_then_name() {
    let mut lab = Lab::new(hosts(&["a", "b", "c", "d"]));
    lab.set("a", |v| v.load1 = Some(2.0));
    lab.set("b", |v| v.load1 = None);
    lab.set("c", |v| v.owner = Some("carol".into()));
    // Adaptive: under the paper only adaptive jobs get (idle) private hosts.
    let j = lab.job(true);
    let order: Vec<String> = (0..4).map(|_| lab.take(j, "anyHost").1).collect();
    assert_eq!(order, ["d", "c", "a", "b"]);
}

#[test]
fn private_host_with_owner_active_or_unknown_is_never_chosen() {
    let mut lab = Lab::new(hosts(&["ws"]));
    lab.set("ws", |v| {
        v.owner = Some("alice".into());
        v.users = Some(vec![session(Some(60))]);
    });
    // Adaptive: under the paper only adaptive jobs get (idle) private hosts.
    let j = lab.job(true);
    let (req, fx) = lab.req(j, "anyHost");
    assert_eq!(granted(&fx), None);
    assert_eq!(position(&fx, req), Some(1));
    let fx = lab.set("ws", |v| v.users = None);
    assert_eq!(granted(&fx), None, "unknown sessions are not idle");
    let fx = lab.set("ws", |v| {
        v.users = Some(vec![session(Some(600))]);
        v.console_idle_s = Some(10);
    });
    assert_eq!(granted(&fx), None, "console used recently");
    let fx = lab.set("ws", |v| v.console_idle_s = Some(900));
    assert_eq!(granted(&fx).map(|g| g.1).as_deref(), Some("ws"));
}

#[test]
fn labels_match_case_insensitively() {
    let mut views = hosts(&["n1", "n2"]);
    views[1].add_label("public");
    let mut lab = Lab::new(views);
    let j = lab.job(false);
    assert_eq!(lab.take(j, "ANYPUBLIC").1, "n2");
    assert_eq!(lab.take(j, "anylinux").1, "n1");
    let (req, fx) = lab.req(j, "anyX86-64");
    assert_eq!(position(&fx, req), Some(1), "all x86_64 hosts are held");
}

/// The MPICH start-up deadlock: 4 idle hosts, 2 of them `public`;
/// `mpiexec -hosts anyLinux,anyHost,anyPublic` asks for the three at once and waits for all.
#[test]
fn broad_names_leave_the_scarce_public_hosts_for_any_public() {
    let mut views = hosts(&["node03", "node04", "node05", "node06"]);
    views[0].add_label("public");
    views[1].add_label("public");
    let mut lab = Lab::new(views);
    let j = lab.job(false);
    let linux = lab.take(j, "anyLinux").1;
    let any = lab.take(j, "anyHost").1;
    let (req, fx) = lab.req(j, "anyPublic");
    let public = granted(&fx).map(|g| g.1);
    assert_eq!(position(&fx, req), None, "anyPublic must not wait: {fx:?}");
    assert_eq!(
        (linux.as_str(), any.as_str(), public.as_deref()),
        ("node05", "node06", Some("node03")),
        "the broad names take the generic hosts"
    );
    let (_, fx) = lab.req(j, "anyPublic");
    assert_eq!(granted(&fx).map(|g| g.1).as_deref(), Some("node04"));
}

#[test]
fn fewest_labels_come_before_load_and_name() {
    let mut views = hosts(&["a", "b"]);
    views[0].add_label("gpu");
    views[1].load1 = Some(3.0);
    let mut lab = Lab::new(views);
    let j = lab.job(false);
    assert_eq!(
        lab.take(j, "anyHost").1,
        "b",
        "b has fewer labels, though loaded"
    );
    assert_eq!(lab.take(j, "anyGpu").1, "a");
}

/// Two hosts freed at once, two requests waiting: the head (broad) must not take the host
/// the second (narrow) one needs when another host would do, even one as specific and
/// first by name.
#[test]
fn a_waiting_request_does_not_lose_its_only_host_to_a_broad_one() {
    let mut views = hosts(&["a-pub", "b-gpu"]);
    views[0].add_label("public");
    views[1].add_label("gpu");
    let mut lab = Lab::new(views);
    let holder = lab.job(false);
    lab.take(holder, "anyPublic");
    lab.take(holder, "anyGpu");
    let waiter = lab.job(false);
    let (broad, _) = lab.req(waiter, "anyLinux");
    let (narrow, fx) = lab.req(waiter, "anyPublic");
    assert_eq!(position(&fx, narrow), Some(2));
    let fx = lab.end(holder);
    let grants: Vec<(RequestId, String)> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Granted { req, host, .. } => Some((*req, host.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        grants,
        vec![(broad, "b-gpu".into()), (narrow, "a-pub".into())],
        "{fx:?}"
    );
}

/// A PVM job on node01 that typed `add anyLinux` was granted node01.
#[test]
fn a_job_is_never_granted_a_host_it_uses_already() {
    let mut lab = Lab::new(hosts(&["node01", "node02", "node03"]));
    let pvm = lab.job(true);
    let fx = lab.a.uses_hosts(pvm, ["node01".to_string()], lab.now);
    lab.check();
    assert!(granted(&fx).is_none());
    assert_eq!(lab.take(pvm, "anyLinux").1, "node02", "not its own node01");
    lab.a.uses_hosts(pvm, ["node03".to_string()], lab.now);
    lab.check();
    let (req, fx) = lab.req(pvm, "anyHost");
    assert_eq!(
        position(&fx, req),
        Some(1),
        "node01 and node03 are in use: {fx:?}"
    );
    let other = lab.job(false);
    assert_eq!(
        lab.take(other, "anyLinux").1,
        "node01",
        "free for other jobs"
    );
    let fx = lab.end(other);
    assert_eq!(
        granted(&fx),
        None,
        "node01 freed, still not for the PVM job: {fx:?}"
    );
}

#[test]
fn a_request_only_hosts_in_use_could_serve_is_refused() {
    let mut lab = Lab::new(hosts(&["ws", "n2"]));
    lab.set("n2", |v| v.add_label("gpu"));
    let j = lab.job(false);
    lab.a.uses_hosts(j, ["ws".to_string()], lab.now);
    let holder = lab.job(false);
    lab.take(holder, "anyGpu");
    let (req, fx) = lab.req(j, "anyGpu");
    assert_eq!(position(&fx, req), Some(1), "n2 may come free: {fx:?}");
    let fx = lab.a.uses_hosts(j, ["n2".to_string()], lab.now);
    lab.check();
    let reason = fx
        .iter()
        .find_map(|e| match e {
            Effect::Refused { req: r, reason, .. } if *r == req => Some(reason.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("refused once n2 is in use too: {fx:?}"));
    assert!(
        reason.contains("(n2) is one this job uses already"),
        "{reason}"
    );
    let (_, fx) = lab.req(j, "anyHost");
    assert!(
        matches!(&fx[0], Effect::Refused { reason, .. } if reason.contains("(n2, ws)")),
        "{fx:?}"
    );
}

#[test]
fn a_host_in_use_is_not_reclaimed_for_its_user() {
    let mut lab = Lab::new(hosts(&["n1", "n2"]));
    let adaptive = lab.job(true);
    lab.take(adaptive, "anyHost");
    lab.take(adaptive, "anyHost");
    let rigid = lab.job(false);
    lab.a.uses_hosts(rigid, ["n2".to_string()], lab.now);
    let (_, fx) = lab.req(rigid, "anyHost");
    let taken: Vec<String> = reclaims(&fx).into_iter().map(|r| r.2).collect();
    assert_eq!(taken, ["n1"], "n2, the newest, is of no use to it: {fx:?}");
}

#[test]
fn the_lab_host_of_an_agent_is_found_by_address_then_name() {
    let mut views = hosts(&["node01", "node02"]);
    views[1].address = "10.0.0.2".into();
    let lab = Lab::new(views);
    let addr = |h: &str| {
        lab.views
            .iter()
            .find(|v| v.name == h)
            .expect("host")
            .address
            .clone()
    };
    let a = &lab.a;
    assert_eq!(a.lab_host(&addr("node02")).as_deref(), Some("node02"));
    assert_eq!(a.lab_host("NODE01").as_deref(), Some("node01"));
    assert_eq!(a.lab_host("node01.lab.example").as_deref(), Some("node01"));
    assert_eq!(a.lab_host("node07"), None);
    let addresses = vec!["127.0.0.1".to_string(), addr("node02")];
    assert_eq!(
        a.lab_host_of("node01", &addresses).as_deref(),
        Some("node02")
    );
    let loopback = vec!["127.0.0.1".to_string()];
    assert_eq!(
        a.lab_host_of("laptop", &loopback),
        None,
        "loopback never counts"
    );
    assert_eq!(a.lab_host_of("node01", &[]).as_deref(), Some("node01"));
}

#[test]
fn impossible_label_is_refused_with_the_labels_that_exist() {
    let mut lab = Lab::new(hosts(&["n1"]));
    let j = lab.job(false);
    let (req, fx) = lab.req(j, "anyGpu");
    let reason = fx
        .iter()
        .find_map(|e| match e {
            Effect::Refused { req: r, reason, .. } if *r == req => Some(reason.clone()),
            _ => None,
        })
        .expect("refused");
    assert!(
        reason.contains("`gpu`") && reason.contains("linux, x86-64"),
        "{reason}"
    );
    let (_, fx) = lab.req(j, "node07");
    assert!(matches!(fx[0], Effect::Refused { .. }), "{fx:?}");
    assert!(lab.a.jobs(lab.now)[0].queued.is_empty());
}

#[test]
fn unknown_label_waits_while_a_host_never_reported() {
    let mut lab = Lab::new(hosts(&["n1", "n2"]));
    lab.set("n2", |v| {
        v.reported = false;
        v.up = false;
        v.labels = Default::default();
    });
    let j = lab.job(false);
    let (req, fx) = lab.req(j, "anyGpu");
    assert_eq!(position(&fx, req), Some(1));
    let fx = lab.set("n2", |v| {
        v.reported = true;
        v.up = true;
        v.labels = vec!["linux".into()].into();
    });
    assert!(
        matches!(&fx[0], Effect::Refused { req: r, .. } if *r == req),
        "refused once every host reported: {fx:?}"
    );
}

#[test]
fn request_of_an_ended_or_unknown_job_is_refused() {
    let mut lab = Lab::new(hosts(&["n1"]));
    let j = lab.job(false);
    lab.end(j);
    let (_, fx) = lab.req(j, "anyHost");
    assert!(matches!(&fx[0], Effect::Refused { reason, .. } if reason.contains("not running")));
    let (_, fx) = lab.req(99, "anyHost");
    assert!(matches!(fx[0], Effect::Refused { .. }));
}

#[test]
fn queue_is_fifo_with_positions_and_served_on_release() {
    let mut lab = Lab::new(hosts(&["n1"]));
    let (j1, j2, j3) = (lab.job(false), lab.job(false), lab.job(false));
    let (a1, _) = lab.take(j1, "anyLinux");
    let (r2, fx) = lab.req(j2, "anyLinux");
    assert_eq!(position(&fx, r2), Some(1));
    let (r3, fx) = lab.req(j3, "anyHost");
    assert_eq!(position(&fx, r3), Some(2));
    assert_eq!(
        position(&fx, r2),
        None,
        "unchanged positions are not re-sent"
    );
    let fx = lab.give_back(a1);
    assert_eq!(fx[0], Effect::Freed { host: "n1".into() });
    assert!(matches!(&fx[1], Effect::Granted { job, req, .. } if *job == j2 && *req == r2));
    assert_eq!(position(&fx, r3), Some(1));
    assert_eq!(fx.last(), Some(&Effect::Persist));
    assert_eq!(lab.a.jobs(lab.now)[2].queued, vec!["anyHost"]);
}

#[test]
fn reclaim_takes_from_the_adaptive_job_holding_most_hosts() {
    let mut lab = Lab::new(hosts(&["a", "b", "c", "d", "e"]));
    let big = lab.job(true);
    let small = lab.job(true);
    let rigid = lab.job(false);
    let mut big_allocs = vec![];
    for _ in 0..3 {
        big_allocs.push(lab.take(big, "anyHost").0);
    }
    lab.take(small, "anyHost");
    lab.take(rigid, "anyHost");
    let newcomer = lab.job(false);
    let (req, fx) = lab.req(newcomer, "anyLinux");
    let newest = big_allocs[2];
    let host = lab.a.allocations_of(big)[2].1.clone();
    assert_eq!(reclaims(&fx), vec![(big, newest, host.clone())]);
    assert_eq!(position(&fx, req), Some(1));
    assert!(fx.contains(&Effect::Reclaim {
        job: big,
        alloc: newest,
        host,
        grace: GRACE
    }));
    let (_, fx) = lab.req(newcomer, "anyLinux");
    assert_eq!(
        reclaims(&fx)[0].0,
        big,
        "2 granted left vs 1 → still the big job"
    );
}

#[test]
fn non_adaptive_holders_and_the_requester_itself_are_never_reclaimed() {
    let mut lab = Lab::new(hosts(&["a", "b"]));
    let rigid = lab.job(false);
    let adaptive = lab.job(true);
    lab.take(rigid, "anyHost");
    lab.take(adaptive, "anyHost");
    let (_, fx) = lab.req(adaptive, "anyHost");
    assert!(reclaims(&fx).is_empty(), "own host / non-adaptive: {fx:?}");
    let other = lab.job(false);
    let (_, fx) = lab.req(other, "anyHost");
    assert_eq!(reclaims(&fx).len(), 1);
    assert_eq!(reclaims(&fx)[0].0, adaptive);
}

#[test]
fn adaptive_jobs_do_not_take_hosts_back_and_forth() {
    let mut lab = Lab::new(hosts(&["a", "b", "c", "d"]));
    let x = lab.job(true);
    let y = lab.job(true);
    for _ in 0..4 {
        lab.take(x, "anyHost");
    }
    let (_, fx) = lab.req(y, "anyHost");
    let (_, alloc, _) = reclaims(&fx)[0].clone();
    let (_, fx) = lab.req(y, "anyHost");
    assert_eq!(
        reclaims(&fx).len(),
        1,
        "x: 3 granted, y: 0 + 1 incoming → fair to take"
    );
    let (_, fx) = lab.req(y, "anyHost");
    assert!(
        reclaims(&fx).is_empty(),
        "x: 2, y: 2 incoming → stop: {fx:?}"
    );
    lab.confirm(alloc);
    let (_, fx) = lab.req(x, "anyHost");
    assert!(reclaims(&fx).is_empty(), "x must not take back: {fx:?}");
}

#[test]
fn reclaim_then_confirm_grants_the_waiting_request() {
    // Paper, Table 2: an adaptive job on n01 and n02; `rsh anyLinux` from n00 gets n01.
    let mut lab = Lab::new(hosts(&["n01", "n02"]));
    let calypso = lab.job(true);
    lab.take(calypso, "anyLinux");
    lab.take(calypso, "anyLinux");
    let shell = lab.job(false);
    let (req, fx) = lab.req(shell, "anyLinux");
    let (_, alloc, host) = reclaims(&fx)[0].clone();
    assert_eq!(host, "n02", "newest allocation");
    assert_eq!(lab.a.holder("n02"), Some((calypso, alloc)));
    assert!(lab.tick(1).is_empty(), "nothing before the deadline");
    let fx = lab.confirm(alloc);
    assert_eq!(fx[0], Effect::Freed { host: "n02".into() });
    assert!(matches!(&fx[1], Effect::Granted { job, req: r, host, .. }
        if *job == shell && *r == req && host == "n02"));
    assert!(
        lab.confirm(alloc).is_empty(),
        "a late second confirmation is ignored"
    );
}

#[test]
fn deadline_forces_the_release() {
    let mut lab = Lab::new(hosts(&["n01"]));
    let adaptive = lab.job(true);
    lab.take(adaptive, "anyHost");
    let other = lab.job(false);
    let (req, fx) = lab.req(other, "anyHost");
    let (_, alloc, _) = reclaims(&fx)[0].clone();
    assert!(lab.tick(4).is_empty());
    let fx = lab.tick(1);
    assert_eq!(
        fx[0],
        Effect::ForceRelease {
            job: adaptive,
            alloc,
            host: "n01".into()
        }
    );
    assert_eq!(fx[1], Effect::Freed { host: "n01".into() });
    assert!(matches!(&fx[2], Effect::Granted { req: r, .. } if *r == req));
    assert!(
        lab.confirm(alloc).is_empty(),
        "confirmation after the force is ignored"
    );
}

/// Where the host's daemon reports the allocations running there, a forced release
/// holds the host until the daemon no longer finds the allocation's processes (or the host
/// is down), and the allocation is no longer live for the daemons' sweep.
#[test]
fn past_the_deadline_the_host_waits_for_its_daemon_to_end_the_processes() {
    let mut lab = Lab::new(hosts(&["n01"]));
    let adaptive = lab.job(true);
    let (alloc, _) = lab.take(adaptive, "anyHost");
    let now = lab.now;
    assert!(lab.a.allocs_running_matters("n01", &[alloc]));
    assert_eq!(lab.a.allocs_running("n01", &[alloc], now), Vec::new());
    assert!(!lab.a.allocs_running_matters("n01", &[alloc]));
    let other = lab.job(false);
    let (req, _) = lab.req(other, "anyHost");
    assert!(lab.tick(4).is_empty());
    let fx = lab.tick(1);
    assert_eq!(
        fx.first(),
        Some(&Effect::ForceRelease {
            job: adaptive,
            alloc,
            host: "n01".into()
        })
    );
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Freed { .. })),
        "{fx:?}"
    );
    assert_eq!(lab.a.ending_allocs(), vec![alloc]);
    assert!(
        !lab.a.live_allocs().0.contains(&alloc),
        "swept where daemons sweep"
    );
    assert!(lab.tick(1).is_empty(), "forced once");
    let fx = lab.a.end_job(adaptive, lab.now);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Freed { .. })),
        "{fx:?}"
    );
    assert!(lab.a.allocs_running("n01", &[alloc], lab.now).is_empty());
    let fx = lab.a.allocs_running("n01", &[], lab.now);
    lab.check();
    assert_eq!(fx[0], Effect::Freed { host: "n01".into() });
    assert!(matches!(&fx[1], Effect::Granted { req: r, .. } if *r == req));
    assert!(lab.a.ending_allocs().is_empty());
}

/// A host that is down runs nothing: what waited for its daemon is over.
#[test]
fn past_the_deadline_a_host_that_goes_down_is_free() {
    let mut lab = Lab::new(hosts(&["n01"]));
    let adaptive = lab.job(true);
    let (alloc, _) = lab.take(adaptive, "anyHost");
    lab.a.allocs_running("n01", &[alloc], lab.now);
    lab.a.release_host("n01", GRACE, lab.now).expect("release");
    lab.tick(GRACE.as_secs() + 1);
    assert_eq!(lab.a.ending_allocs(), vec![alloc]);
    let mut down = hosts(&["n01"]).remove(0);
    down.up = false;
    let fx = lab.a.host_changed(down, lab.now);
    assert_eq!(fx[0], Effect::Freed { host: "n01".into() });
    assert!(lab.a.ending_allocs().is_empty());
}

#[test]
fn cancel_with_reclaim_in_flight_frees_the_host_or_serves_the_next() {
    let mut lab = Lab::new(hosts(&["n01", "n02"]));
    let adaptive = lab.job(true);
    lab.take(adaptive, "anyHost");
    lab.take(adaptive, "anyHost");
    let p = lab.job(false);
    let (r1, fx) = lab.req(p, "anyHost");
    let (_, alloc1, _) = reclaims(&fx)[0].clone();
    let fx = lab.a.cancel(r1);
    lab.check();
    assert_eq!(fx, vec![Effect::Persist]);
    let fx = lab.confirm(alloc1);
    assert_eq!(fx[0], Effect::Freed { host: "n02".into() });
    assert_eq!(granted(&fx), None, "nobody waits: back to free");
    assert_eq!(lab.a.holder("n02"), None);

    let (_, fx) = lab.req(p, "anyHost");
    assert_eq!(granted(&fx).map(|g| g.1).as_deref(), Some("n02"));
    let (r3, fx) = lab.req(p, "anyHost");
    let (_, alloc2, _) = reclaims(&fx)[0].clone();
    let q = lab.job(false);
    let (r4, fx) = lab.req(q, "anyHost");
    assert_eq!(position(&fx, r4), Some(2));
    let fx = lab.a.cancel(r3);
    lab.check();
    assert_eq!(position(&fx, r4), Some(1));
    let fx = lab.confirm(alloc2);
    assert!(
        matches!(&fx[1], Effect::Granted { req, .. } if *req == r4),
        "{fx:?}"
    );
}

#[test]
fn reserved_host_is_first_for_its_request_even_behind_the_queue_head() {
    let mut lab = Lab::new(hosts(&["n1"]));
    let holder = lab.job(true);
    let (alloc, _) = lab.take(holder, "anyHost");
    let head = lab.job(true);
    let (r_head, fx) = lab.req(head, "anyHost");
    assert!(
        reclaims(&fx).is_empty(),
        "adaptive 0 vs 1: not worth a move"
    );
    let rigid = lab.job(false);
    let (r_rigid, fx) = lab.req(rigid, "anyHost");
    assert_eq!(reclaims(&fx).len(), 1);
    assert_eq!(position(&fx, r_rigid), Some(2));
    let fx = lab.confirm(alloc);
    assert!(
        matches!(&fx[1], Effect::Granted { req, .. } if *req == r_rigid),
        "{fx:?}"
    );
    assert_eq!(position(&fx, r_head), None, "the head keeps position 1");
}

#[test]
fn drain_blocks_new_grants_and_resume_serves() {
    let mut lab = Lab::new(hosts(&["n1", "n2"]));
    let j = lab.job(false);
    let (_, held) = lab.take(j, "anyHost");
    lab.a.drain(&held).expect("drain");
    lab.a.drain("n2").expect("drain");
    lab.check();
    assert_eq!(
        lab.a.holder(&held).map(|h| h.0),
        Some(j),
        "existing allocation stays"
    );
    let (req, fx) = lab.req(j, "anyHost");
    assert_eq!(position(&fx, req), Some(1));
    let fx = lab.a.resume("n2", lab.now).expect("resume");
    lab.check();
    assert!(matches!(&fx[0], Effect::Granted { host, .. } if host == "n2"));
    assert_eq!(
        lab.a.drain("nope"),
        Err(AllocError::UnknownHost {
            host: "nope".into()
        })
    );
}

#[test]
fn release_host_reclaims_with_the_admin_grace() {
    let mut lab = Lab::new(hosts(&["n1", "n2"]));
    let rigid = lab.job(false);
    let (alloc, host) = lab.take(rigid, "anyHost");
    let grace = Duration::from_secs(30);
    let fx = lab.a.release_host(&host, grace, lab.now).expect("release");
    lab.check();
    assert_eq!(
        fx,
        vec![
            Effect::Reclaim {
                job: rigid,
                alloc,
                host: host.clone(),
                grace
            },
            Effect::Persist
        ]
    );
    let fx = lab.a.release_host(&host, grace, lab.now).expect("again");
    assert!(
        fx.is_empty(),
        "a later deadline never replaces an earlier one"
    );
    let fx = lab.a.release_host(&host, GRACE, lab.now).expect("sooner");
    assert_eq!(reclaims(&fx).len(), 1);
    assert_eq!(
        lab.tick(5)[0],
        Effect::ForceRelease {
            job: rigid,
            alloc,
            host
        }
    );
    assert!(matches!(
        lab.a.release_host("n2", grace, lab.now),
        Err(AllocError::NotHeld { .. })
    ));
}

#[test]
fn end_job_frees_everything_and_drops_its_requests() {
    let mut lab = Lab::new(hosts(&["n1", "n2"]));
    let j = lab.job(true);
    lab.take(j, "anyHost");
    lab.take(j, "anyHost");
    lab.req(j, "anyHost");
    let other = lab.job(false);
    let (r, _) = lab.req(other, "anyHost");
    let fx = lab.end(j);
    let freed = fx
        .iter()
        .filter(|e| matches!(e, Effect::Freed { .. }))
        .count();
    assert_eq!(freed, 2);
    assert!(
        matches!(fx.iter().find(|e| matches!(e, Effect::Granted { .. })),
        Some(Effect::Granted { req, .. }) if *req == r)
    );
    let row = &lab.a.jobs(lab.now)[0];
    assert_eq!(
        (row.state, row.hosts.len(), row.queued.len()),
        ("ended", 0, 0)
    );
    assert!(lab.end(j).is_empty(), "ending twice is a no-op");
}

#[test]
fn host_down_keeps_its_allocation_and_comes_back_with_it() {
    let mut lab = Lab::new(hosts(&["n1"]));
    let j = lab.job(false);
    let (alloc, _) = lab.take(j, "anyHost");
    lab.set("n1", |v| v.up = false);
    assert_eq!(lab.a.holder("n1"), Some((j, alloc)));
    let other = lab.job(false);
    let (req, _) = lab.req(other, "anyHost");
    let fx = lab.set("n1", |v| v.up = true);
    assert_eq!(granted(&fx), None, "still held by the first job");
    assert!(matches!(lab.give_back(alloc)[1], Effect::Granted { req: r, .. } if r == req));
}

#[test]
fn owner_return_reclaims_adaptive_jobs_only() {
    // Under the paper a rigid job never holds a private host, so the rigid holder here is
    // on a public one whose console is used: left alone.
    let mut lab = Lab::new(hosts(&["ws1", "n2"]));
    lab.set("ws1", |v| v.owner = Some("bob".into()));
    let rigid = lab.job(false);
    let adaptive = lab.job(true);
    assert_eq!(lab.take(rigid, "anyHost").1, "n2");
    let (a1, _) = lab.take(adaptive, "anyHost");
    let fx = lab.set("n2", |v| v.users = Some(vec![session(Some(3))]));
    assert!(reclaims(&fx).is_empty(), "rigid holder left alone");
    let fx = lab.set("ws1", |v| v.console_idle_s = Some(2));
    assert_eq!(reclaims(&fx), vec![(adaptive, a1, "ws1".into())]);
    let fx = lab.set("ws1", |v| v.console_idle_s = Some(3));
    assert!(
        reclaims(&fx).is_empty(),
        "no second reclaim for the same host"
    );
}

#[test]
fn snapshot_and_restore_mid_flight() {
    let mut lab = Lab::new(hosts(&["n1", "n2"]));
    let adaptive = lab.job(true);
    lab.take(adaptive, "anyHost");
    lab.take(adaptive, "anyHost");
    lab.a.drain("n1").expect("drain");
    let waiting = lab.job(false);
    let (req, fx) = lab.req(waiting, "anyLinux");
    let (_, alloc, host) = reclaims(&fx)[0].clone();
    let (other_req, _) = lab.req(waiting, "anyHost");
    let before = lab.a.snapshot();

    let later = lab.now + Duration::from_secs(60);
    let (restored, dropped) = Allocator::restore(before.clone(), AllocConfig::default(), later);
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(restored.snapshot(), before);
    lab.a = restored;
    lab.now = later;
    lab.check();
    assert_eq!(
        lab.a.resend_reclaims(later),
        vec![Effect::Reclaim {
            job: adaptive,
            alloc,
            host: host.clone(),
            grace: GRACE
        }],
        "full grace again after a restore"
    );
    let fx = lab.sync();
    assert_eq!(
        position(&fx, req),
        Some(1),
        "positions re-reported after restore"
    );
    assert_eq!(position(&fx, other_req), Some(2));
    let fx = lab.confirm(alloc);
    assert_eq!(fx[0], Effect::Freed { host: host.clone() });
    assert_eq!(
        granted(&fx),
        None,
        "restored requests wait for nobody (agents re-send theirs): no grant"
    );
    assert!(
        lab.a.jobs(lab.now)[1].queued.is_empty(),
        "they left the queue"
    );
    assert_eq!(lab.a.holder(&host), None, "the host stays free");
    assert!(lab.a.is_drained("n1"));
    assert!(
        lab.a.resumed(waiting, lab.now).is_empty(),
        "nothing to tell an agent with no host being taken back"
    );
    let (next, _) = lab.req(waiting, "anyHost");
    assert!(next > other_req, "ids keep increasing");
    assert!(lab.job(false) > waiting);
}

#[test]
fn restore_drops_contradicting_records() {
    let mut lab = Lab::new(hosts(&["n1"]));
    let j = lab.job(false);
    lab.take(j, "anyHost");
    let mut s = lab.a.snapshot();
    let mut dup = s.allocations[0].clone();
    dup.id = 77;
    s.allocations.push(dup);
    s.requests.push(RequestRecord {
        id: 5,
        job: 42,
        symbolic: "anyHost".into(),
    });
    let (a, dropped) = Allocator::restore(s, AllocConfig::default(), lab.now);
    assert_eq!(dropped.len(), 2, "{dropped:?}");
    assert_eq!(a.check_invariants(), Ok(()));
}

#[test]
fn ended_jobs_are_forgotten_beyond_the_limit() {
    let config = AllocConfig {
        ended_jobs_kept: 2,
        ..AllocConfig::default()
    };
    let mut lab = Lab::new(hosts(&["n1"]));
    lab.a = Allocator::with_config(config);
    let ids: Vec<JobId> = (0..4).map(|_| lab.job(false)).collect();
    for &id in &ids {
        lab.end(id);
    }
    let kept: Vec<JobId> = lab.a.jobs(lab.now).iter().map(|r| r.id).collect();
    assert_eq!(kept, ids[2..]);
}

/// xorshift64*: deterministic randomness without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.below(items.len())].clone())
    }
}

const NAMES: [&str; 5] = ["anyHost", "anyLinux", "anyPublic", "ANYX86-64", "anyGpu"];

fn random_views(rng: &mut Rng) -> Vec<HostView> {
    (0..6)
        .map(|i| {
            let mut v = view(&format!("n{i}"));
            v.up = rng.below(5) > 0;
            v.load1 = Some(rng.below(4) as f64);
            if i % 2 == 0 {
                v.add_label("public");
            } else {
                // The session is the owner's: under the paper another user's session does
                // not keep the owner's machine.
                v.owner = Some("alice".into());
                v.users = Some(vec![session(Some(rng.below(2) as u64 * 600))]);
            }
            v
        })
        .collect()
}

/// Applies one random operation; returns its effects.
fn random_op(lab: &mut Lab, rng: &mut Rng, jobs: &mut Vec<JobId>) -> Vec<Effect> {
    let job = rng.pick(jobs);
    let alloc = rng.pick(&lab.a.allocs.keys().copied().collect::<Vec<_>>());
    let queued = rng.pick(&lab.a.queue.iter().map(|w| w.id).collect::<Vec<_>>());
    let host = format!("n{}", rng.below(6));
    match rng.below(13) {
        0 => {
            let adaptive = rng.below(2) == 0;
            jobs.push(lab.job(adaptive));
            Vec::new()
        }
        1 | 2 => job.map_or_else(Vec::new, |j| lab.req(j, NAMES[rng.below(5)]).1),
        3 => queued.map_or_else(Vec::new, |r| lab.a.cancel(r)),
        4 => alloc.map_or_else(Vec::new, |a| lab.give_back(a)),
        5 => alloc.map_or_else(Vec::new, |a| lab.confirm(a)),
        6 => job.map_or_else(Vec::new, |j| lab.end(j)),
        7 => lab
            .a
            .release_host(&host, GRACE, lab.now)
            .unwrap_or_default(),
        8 => lab.a.drain(&host).unwrap_or_default(),
        9 => lab.a.resume(&host, lab.now).unwrap_or_default(),
        10 => {
            // One host's report arrives.
            let i = rng.below(6);
            let fresh = random_views(rng).swap_remove(i);
            lab.set(&fresh.name.clone(), |v| *v = fresh)
        }
        11 => job.map_or_else(Vec::new, |j| {
            let fx = lab.a.uses_hosts(j, [host], lab.now);
            lab.check();
            fx
        }),
        _ => lab.tick(rng.below(8) as u64),
    }
}

#[test]
fn random_operations_keep_the_invariants() {
    let mut seen = [0usize; 4]; // grants, reclaims, forced releases, refusals
    for seed in [1, 7, 42, 2024, 0x9e37_79b9] {
        let mut rng = Rng(seed);
        let mut lab = Lab::new(random_views(&mut rng));
        let mut jobs = Vec::new();
        for step in 0..2000 {
            let fx = random_op(&mut lab, &mut rng, &mut jobs);
            lab.check();
            for e in &fx {
                match e {
                    Effect::Granted { .. } => seen[0] += 1,
                    Effect::Reclaim { .. } => seen[1] += 1,
                    Effect::ForceRelease { .. } => seen[2] += 1,
                    Effect::Refused { .. } => seen[3] += 1,
                    _ => {}
                }
                if let Effect::Granted { host, job, .. } = e {
                    assert!(!lab.a.uses(*job, host), "seed {seed} step {step}: {e:?}");
                    let v = lab.views.iter().find(|v| &v.name == host).expect("known");
                    assert!(v.up && v.owner_away(), "seed {seed} step {step}: {v:?}");
                    assert!(!lab.a.is_drained(host), "seed {seed} step {step}");
                }
            }
            if step % 97 == 0 {
                let s = lab.a.snapshot();
                let (b, dropped) = Allocator::restore(s.clone(), AllocConfig::default(), lab.now);
                assert!(dropped.is_empty(), "seed {seed}: {dropped:?}");
                assert_eq!(b.snapshot(), s, "seed {seed} step {step}");
            }
        }
    }
    eprintln!("grants, reclaims, forced releases, refusals: {seen:?}");
    assert!(
        seen.iter().all(|&n| n > 10),
        "every path exercised: {seen:?}"
    );
}

/// The allocator's whole soft state, to tell that a call changed nothing.
fn state_of(a: &Allocator, now: Instant) -> crate::trace_state::TraceState {
    a.trace_state(&crate::trace::TraceClock::new(now, 0))
}

#[test]
fn a_repeated_view_of_a_free_host_decides_nothing_and_may_be_skipped() {
    let mut lab = Lab::new(hosts(&["node01", "node02", "node03"]));
    let j = lab.job(false);
    let (_, held) = lab.take(j, "anyHost");
    // A request of another job that waits for the held host, so that serving the queue
    // has work to redo.
    let other = lab.job(false);
    let _ = lab.req(other, &held);
    let free: Vec<HostView> = lab
        .views
        .iter()
        .filter(|v| v.name != held)
        .cloned()
        .collect();
    for v in free {
        assert!(lab.a.same_view_decides_nothing(&v.name), "{}", v.name);
        let before = state_of(&lab.a, lab.now);
        let fx = lab.a.host_changed(v.clone(), lab.now);
        assert!(fx.is_empty(), "{}: {fx:?}", v.name);
        assert_eq!(state_of(&lab.a, lab.now), before, "{}", v.name);
        assert!(lab.a.host_repeated(&v.name, lab.now));
        assert_eq!(state_of(&lab.a, lab.now), before, "{}", v.name);
    }
}

#[test]
fn a_repeated_view_is_not_skipped_for_a_held_down_or_unknown_host() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    let j = lab.job(false);
    let (_, held) = lab.take(j, "anyHost");
    // Held: its `vacate` is asked on every report, and `held_for_s` grows.
    assert!(!lab.a.same_view_decides_nothing(&held));
    assert!(!lab.a.host_repeated(&held, lab.now));
    let other = if held == "node01" { "node02" } else { "node01" };
    lab.set(other, |v| v.up = false);
    assert!(!lab.a.same_view_decides_nothing(other), "down");
    assert!(!lab.a.same_view_decides_nothing("node99"), "unknown");
}

/// An end by the agent's word asks the shell to confirm it to the agent (after its other
/// effects, before the save that records it); an agent that went away is told nothing.
#[test]
fn an_end_by_the_agent_is_confirmed_to_it_an_agent_gone_is_not() {
    let mut lab = Lab::new(hosts(&["node01", "node02"]));
    let ended = lab.job(true);
    let (alloc, _) = lab.take(ended, "anyLinux");
    let fx = lab
        .a
        .handle(trace::Input::End { job: ended }, lab.now)
        .effects;
    lab.check();
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Freed { .. })),
        "{fx:?}"
    );
    assert_eq!(
        &fx[fx.len() - 2..],
        [Effect::ConfirmEnd { job: ended }, Effect::Persist],
        "alloc {alloc}: {fx:?}"
    );
    // Said twice (the agent sends it again after a broker restart): confirmed again.
    let fx = lab
        .a
        .handle(trace::Input::End { job: ended }, lab.now)
        .effects;
    assert_eq!(fx, [Effect::ConfirmEnd { job: ended }]);
    let gone = lab.job(true);
    lab.take(gone, "anyLinux");
    let fx = lab
        .a
        .handle(trace::Input::AgentGone { job: gone }, lab.now)
        .effects;
    lab.check();
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::ConfirmEnd { .. })),
        "{fx:?}"
    );
}

/// One `HostsRepeated` input does what a repeated `Host` input (no field changed) per host
/// does, in order: nothing for a free host, what its view does for a held one (as in a
/// replay under another policy); recorded as one trace line that reads back the same.
#[test]
fn hosts_repeated_is_a_repeated_host_input_for_each_host_in_turn() {
    use crate::{handle::Answer, trace::Input};
    let names: Vec<String> = ["node01", "node02", "node03"].map(String::from).to_vec();
    let build = || {
        let mut lab = Lab::new(hosts(&["node01", "node02", "node03"]));
        let j = lab.job(false);
        let (_, held) = lab.take(j, "anyHost");
        (lab, held)
    };
    let (mut batch, held) = build();
    let (mut each, held_too) = build();
    assert_eq!(held, held_too, "the two labs are the same");
    assert!(!batch.a.same_view_decides_nothing(&held));
    let later = batch.now + Duration::from_secs(5);
    let input = Input::HostsRepeated {
        hosts: names.clone(),
    };
    let text = serde_json::to_string(&input).expect("encodes");
    assert_eq!(
        text,
        r#"{"kind":"hosts_repeated","hosts":["node01","node02","node03"]}"#
    );
    assert_eq!(
        serde_json::from_str::<Input>(&text).expect("decodes"),
        input
    );
    let handled = batch.a.handle(input, later);
    assert!(
        matches!(handled.answer, Answer::Done),
        "{:?}",
        handled.answer
    );
    assert!(handled.recorded());
    let mut effects = Vec::new();
    for host in names {
        let one = Input::Host {
            host,
            changed: Default::default(),
            view: None,
        };
        let h = each.a.handle(one, later);
        assert!(matches!(h.answer, Answer::Done), "{:?}", h.answer);
        effects.extend(h.effects);
    }
    assert_eq!(handled.effects, effects);
    assert_eq!(state_of(&batch.a, later), state_of(&each.a, later));
    let touched = crate::usage::touched_hosts(&handled.input, &handled.effects);
    assert_eq!(touched, ["node01", "node02", "node03"]);
}
