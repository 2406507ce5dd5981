//! Table-driven tests of the four shipped policies' decisions.

use crate::{
    facts::{HostFacts, JobFacts, LabFacts, NowFacts, UserFacts},
    value::{HostValue, JobValue, LabValue, NowValue, UserValue},
    Policy, Scope, SHIPPED,
};

/// A host: private or public, keyboard idle seconds (None: unknown), load1 (None: unknown).
fn host(private: bool, keyboard_idle_s: Option<i64>, load1: Option<f64>) -> HostFacts {
    HostFacts {
        name: "h".into(),
        owner: private.then(|| "ann".into()),
        private,
        up: true,
        cpus: 2,
        load1,
        other_load: load1,
        keyboard_idle_s,
        owner_idle_s: keyboard_idle_s,
        console_idle_s: keyboard_idle_s,
        users: Some(vec![]),
        ..HostFacts::default()
    }
}

fn job(adaptive: bool, hosts_held: i64) -> JobFacts {
    JobFacts {
        id: 1,
        user: "carol".into(),
        adaptive,
        hosts_held,
        count: 1,
        started_s: 1_700_000_000,
        ..JobFacts::default()
    }
}

/// Tuesday noon unless told otherwise.
fn now(weekday: i64, hour: i64) -> NowFacts {
    NowFacts {
        unix: 1_763_985_600,
        hour,
        weekday,
    }
}

/// Everything one decision reads.
struct Case {
    host: HostFacts,
    job: JobFacts,
    holder: JobFacts,
    user: UserFacts,
    now: NowFacts,
}

impl Case {
    fn new(host: HostFacts, job: JobFacts) -> Case {
        Case {
            host,
            job,
            holder: self::job(true, 1),
            user: UserFacts::default(),
            now: now(2, 12),
        }
    }

    /// Runs `f` on the scope of this case; every decision must be free of run-time errors.
    fn with<T>(&self, f: impl FnOnce(Scope<'_>) -> T) -> T {
        let (h, j, hd) = (
            HostValue::new(&self.host),
            JobValue::new(&self.job),
            JobValue::new(&self.holder),
        );
        let (u, l, n) = (
            UserValue::new(&self.user),
            LabValue::new(&LabFacts::default()),
            NowValue::new(&self.now),
        );
        let scope = Scope::new()
            .host(&h)
            .job(&j)
            .holder(&hd)
            .user(&u)
            .lab(&l)
            .now(&n);
        f(scope)
    }
}

fn shipped(name: &str) -> Policy {
    Policy::shipped(name).expect("shipped")
}

fn start(p: &Policy, c: &Case) -> bool {
    c.with(|s| {
        let d = p.start(s);
        assert_eq!(d.error, None);
        d.value
    })
}

fn vacate(p: &Policy, c: &Case) -> bool {
    c.with(|s| {
        let d = p.vacate(s);
        assert_eq!(d.error, None);
        d.value
    })
}

fn rank(p: &Policy, c: &Case) -> f64 {
    c.with(|s| {
        let d = p.rank(s);
        assert_eq!(d.error, None);
        d.value
    })
}

#[test]
fn every_shipped_policy_loads_and_its_summary_names_it() {
    for (name, _) in SHIPPED {
        let p = shipped(name);
        let line = p.summary().to_string();
        assert!(
            line.starts_with(&format!("policies/{name}.toml: ok: sets ")),
            "{line}"
        );
        assert!(!line.contains('\n'));
    }
}

#[test]
fn paper_start_private_hosts_only_to_adaptive_jobs_while_the_owner_is_away() {
    let p = shipped("paper");
    // (private, keyboard idle, adaptive job, startable)
    let table = [
        (false, Some(0), false, true),
        (false, None, false, true),
        (true, Some(600), true, true),
        (true, Some(300), true, true),
        (true, Some(299), true, false),
        (true, Some(600), false, false),
        (true, None, true, false),
    ];
    for (private, idle, adaptive, want) in table {
        let c = Case::new(host(private, idle, Some(0.1)), job(adaptive, 0));
        assert_eq!(start(&p, &c), want, "{private} {idle:?} {adaptive}");
    }
}

#[test]
fn paper_vacate_when_the_owner_is_back_on_a_private_host_of_an_adaptive_job() {
    let p = shipped("paper");
    let table = [
        (true, Some(10), true, true),
        (true, Some(10), false, false),
        (true, None, true, false),
        (true, Some(600), true, false),
        (false, Some(0), true, false),
    ];
    for (private, idle, adaptive, want) in table {
        let c = Case::new(host(private, idle, Some(0.1)), job(adaptive, 1));
        assert_eq!(vacate(&p, &c), want, "{private} {idle:?} {adaptive}");
    }
}

#[test]
fn paper_rank_quiet_then_least_loaded_then_public() {
    let p = shipped("paper");
    let r = |private, idle, load| rank(&p, &Case::new(host(private, idle, load), job(true, 0)));
    // Each row ranks strictly above the next.
    let order = [
        r(false, Some(900), Some(0.0)),
        r(true, Some(900), Some(0.0)),
        r(false, Some(900), Some(1.0)),
        r(false, Some(900), None),
        r(false, Some(10), Some(0.0)),
    ];
    for pair in order.windows(2) {
        assert!(pair[0] > pair[1], "{order:?}");
    }
}

#[test]
fn paper_preemption_evens_out_adaptive_jobs_and_spares_the_rest() {
    let p = shipped("paper");
    // (requester adaptive, requester holds, holder adaptive, holder holds, may preempt)
    let table = [
        (false, 0, true, 1, true),
        (true, 1, true, 3, true),
        (true, 1, true, 2, false),
        (false, 0, false, 5, false),
    ];
    for (ja, jh, ha, hh, want) in table {
        let mut c = Case::new(host(false, Some(900), Some(0.0)), job(ja, jh));
        c.holder = job(ha, hh);
        let got = c.with(|s| p.may_preempt(s));
        assert_eq!((got.value, got.error), (want, None), "{ja} {jh} {ha} {hh}");
    }
    let pr = |hh, started| {
        let mut c = Case::new(host(false, Some(900), Some(0.0)), job(true, 0));
        c.holder = JobFacts {
            started_s: started,
            ..job(true, hh)
        };
        c.with(|s| p.preempt_rank(s).value)
    };
    assert!(pr(5, 1) > pr(3, 2), "most hosts loses first");
    assert!(pr(3, 2) > pr(3, 1), "then the newest");
}

#[test]
fn paper_preemption_weighs_hosts_held_by_share() {
    // (requester holds, requester share, holder holds, holder share, may preempt): the
    // holder, one host fewer, must still hold at least as many per share as the requester
    // with one more.
    let table = [
        (1, 1.0, 3, 1.0, true),
        (1, 1.0, 2, 1.0, false),
        (3, 1.0, 6, 2.0, false),
        (3, 1.0, 9, 2.0, true),
        (2, 1.0, 7, 2.0, true),
        (6, 2.0, 3, 1.0, false),
        (4, 2.0, 3, 1.0, false),
        (2, 2.0, 3, 1.0, true),
        (0, 0.5, 2, 1.0, false),
        (0, 0.5, 3, 1.0, true),
    ];
    for name in ["paper", "nights-and-weekends"] {
        let p = shipped(name);
        for (jh, js, hh, hs, want) in table {
            let mut c = Case::new(
                host(false, Some(900), Some(0.0)),
                JobFacts {
                    share: js,
                    ..job(true, jh)
                },
            );
            c.holder = JobFacts {
                share: hs,
                ..job(true, hh)
            };
            let got = c.with(|s| p.may_preempt(s));
            assert_eq!(
                (got.value, got.error),
                (want, None),
                "{name}: {jh}/{js} from {hh}/{hs}"
            );
        }
    }
    let p = shipped("paper");
    let pr = |hh, share| {
        let mut c = Case::new(host(false, Some(900), Some(0.0)), job(true, 0));
        c.holder = JobFacts {
            share,
            ..job(true, hh)
        };
        c.with(|s| p.preempt_rank(s).value)
    };
    assert!(pr(3, 1.0) > pr(5, 2.0), "most hosts per share loses first");
}

#[test]
fn the_default_partition_is_weighted_by_share_too() {
    let p = Policy::from_text(std::path::Path::new("t.toml"), "start = 'true'\n").expect("ok");
    let mut c = Case::new(host(false, Some(900), Some(0.0)), job(true, 3));
    c.holder = JobFacts {
        share: 2.0,
        ..job(true, 9)
    };
    assert!(
        c.with(|s| p.may_preempt(s).value),
        "9 hosts at share 2 against 3"
    );
    c.holder.hosts_held = 8;
    assert!(
        !c.with(|s| p.may_preempt(s).value),
        "8 hosts at share 2 against 3"
    );
}

#[test]
fn paper_leaves_grace_limit_and_priority_to_the_broker_and_shares_evenly() {
    let p = shipped("paper");
    let c = Case::new(host(false, Some(900), Some(0.0)), job(true, 0));
    c.with(|s| {
        assert_eq!(p.grace_s(s).value, None);
        assert_eq!(p.max_hosts(s).value, None);
        assert_eq!(p.priority(s).value, None);
        assert_eq!(p.share(s).value, 1.0);
    });
}

#[test]
fn desktop_starts_after_15_minutes_idle_with_low_background_load() {
    let p = shipped("desktop");
    // (private, keyboard idle, other load, adaptive, startable)
    let table = [
        (true, Some(901), Some(0.3), false, true),
        (false, Some(901), Some(0.0), true, true),
        (true, Some(900), Some(0.0), true, false),
        (true, Some(3600), Some(0.31), true, false),
        (true, None, Some(0.0), true, false),
        (true, Some(3600), None, true, false),
    ];
    for (private, idle, load, adaptive, want) in table {
        let c = Case::new(host(private, idle, load), job(adaptive, 0));
        assert_eq!(start(&p, &c), want, "{private} {idle:?} {load:?}");
    }
}

#[test]
fn desktop_vacates_on_keyboard_use_with_ten_minutes_grace_and_never_preempts() {
    let p = shipped("desktop");
    for (idle, want) in [(Some(59), true), (Some(60), false), (None, false)] {
        let c = Case::new(host(true, idle, Some(0.0)), job(false, 1));
        assert_eq!(vacate(&p, &c), want, "{idle:?}");
        c.with(|s| {
            assert_eq!(p.grace_s(s).value, Some(600.0));
            assert!(!p.may_preempt(s).value);
        });
    }
}

#[test]
fn nights_and_weekends_gives_private_hosts_to_anyone_outside_office_hours() {
    let p = shipped("nights-and-weekends");
    // (weekday 0 = Sunday, hour, private, keyboard idle, adaptive, startable)
    let table = [
        (2, 12, true, Some(900), false, false),
        (1, 8, true, Some(900), false, false),
        (5, 17, true, Some(900), false, false),
        (2, 18, true, Some(900), false, true),
        (2, 7, true, Some(900), false, true),
        (6, 12, true, Some(900), false, true),
        (0, 12, true, Some(900), false, true),
        (6, 3, true, Some(10), false, false),
        (6, 3, true, None, false, false),
        (2, 12, true, Some(900), true, true),
        (2, 12, false, Some(0), false, true),
    ];
    for (day, hour, private, idle, adaptive, want) in table {
        let mut c = Case::new(host(private, idle, Some(0.0)), job(adaptive, 0));
        c.now = now(day, hour);
        assert_eq!(
            start(&p, &c),
            want,
            "{day} {hour} {private} {idle:?} {adaptive}"
        );
    }
}

#[test]
fn nights_and_weekends_vacates_for_the_owner_and_at_the_start_of_office_hours() {
    let p = shipped("nights-and-weekends");
    // (weekday, hour, private, keyboard idle, adaptive, vacate)
    let table = [
        (1, 8, true, Some(900), false, true),
        (1, 8, true, Some(900), true, false),
        (0, 12, true, Some(900), false, false),
        (6, 3, true, Some(10), false, true),
        (6, 3, true, Some(10), true, true),
        (1, 8, false, Some(0), false, false),
    ];
    for (day, hour, private, idle, adaptive, want) in table {
        let mut c = Case::new(host(private, idle, Some(0.0)), job(adaptive, 1));
        c.now = now(day, hour);
        assert_eq!(
            vacate(&p, &c),
            want,
            "{day} {hour} {private} {idle:?} {adaptive}"
        );
    }
}

#[test]
fn dedicated_ignores_owners_and_shares_by_user() {
    let p = shipped("dedicated");
    let busy_private = Case::new(host(true, Some(0), Some(0.5)), job(false, 0));
    assert!(start(&p, &busy_private));
    assert!(!vacate(&p, &busy_private));
    // (user's jobs, user's hosts, share, priority)
    for (jobs, held, share, priority) in [(4, 3, 0.25, -3.0), (1, 5, 1.0, -5.0), (0, 0, 1.0, 0.0)] {
        let mut c = Case::new(host(false, Some(0), Some(0.0)), job(true, 0));
        c.user = UserFacts {
            name: "carol".into(),
            jobs,
            hosts_held: held,
        };
        c.with(|s| {
            assert_eq!(p.share(s).value, share);
            assert_eq!(p.priority(s).value, Some(priority));
        });
    }
}

#[test]
fn dedicated_preempts_only_across_users_and_only_to_narrow_the_gap() {
    let p = shipped("dedicated");
    // (holder's user, holder adaptive, holder holds, requesting user's hosts, may preempt)
    let table = [
        ("dave", true, 5, 3, true),
        ("dave", true, 4, 3, false),
        ("carol", true, 9, 0, false),
        ("dave", false, 9, 0, false),
    ];
    for (who, adaptive, hh, user_held, want) in table {
        let mut c = Case::new(host(false, Some(0), Some(0.0)), job(true, 0));
        c.holder = JobFacts {
            user: who.into(),
            ..job(adaptive, hh)
        };
        c.user.hosts_held = user_held;
        let d = c.with(|s| p.may_preempt(s));
        assert_eq!(
            (d.value, d.error),
            (want, None),
            "{who} {adaptive} {hh} {user_held}"
        );
    }
}

/// The paper and nights-and-weekends on derived facts from logind: the owner's desktop
/// active or idle, a locked screen idle past the away time, a greeter, another user's
/// remote session, someone else at the console, and logind unreadable with the console
/// unknown.
#[test]
fn paper_on_logind_sessions_greeter_remote_locked_and_unknown() {
    use crate::facts::{LoginSession, LOGIND_ACTIVE};
    let desk = |user: &str, idle_s: Option<i64>, locked: bool| LoginSession {
        user: user.into(),
        seat: Some("seat0".into()),
        tty: Some("tty2".into()),
        display: None,
        class: "user".into(),
        kind: "wayland".into(),
        remote: false,
        active: true,
        locked,
        idle_s,
        idle_source: if idle_s == Some(0) {
            LOGIND_ACTIVE
        } else {
            "logind IdleSinceHint"
        }
        .into(),
        person: true,
        local: true,
    };
    let greeter = LoginSession {
        class: "greeter".into(),
        person: false,
        ..desk("gdm", Some(0), false)
    };
    let ssh = |user: &str| LoginSession {
        seat: None,
        tty: Some("pts/0".into()),
        kind: "tty".into(),
        remote: true,
        active: false,
        local: false,
        idle_source: "tty atime".into(),
        ..desk(user, Some(5), false)
    };
    let host = |sessions: Option<Vec<LoginSession>>, console: Option<i64>| {
        HostFacts {
            name: "ws".into(),
            owner: Some("ann".into()),
            up: true,
            cpus: 2,
            load1: Some(0.1),
            users: Some(vec![]),
            console_idle_s: console,
            sessions,
            ..HostFacts::default()
        }
        .derive()
    };
    // (what, facts, lent to an adaptive job)
    let table = [
        (
            "owner's desktop active",
            host(Some(vec![desk("ann", Some(0), false)]), Some(9999)),
            false,
        ),
        (
            "owner's desktop idle 10 min",
            host(Some(vec![desk("ann", Some(600), false)]), Some(9999)),
            true,
        ),
        (
            "locked, idle past the away time",
            host(Some(vec![desk("ann", Some(600), true)]), Some(9999)),
            true,
        ),
        (
            "locked, idle 1 min",
            host(Some(vec![desk("ann", Some(60), true)]), Some(9999)),
            false,
        ),
        ("a greeter only", host(Some(vec![greeter]), None), true),
        (
            "bob's ssh session",
            host(Some(vec![ssh("bob")]), Some(9999)),
            true,
        ),
        (
            "ann's ssh session",
            host(Some(vec![ssh("ann")]), Some(9999)),
            false,
        ),
        (
            "bob at the console",
            host(Some(vec![desk("bob", Some(0), false)]), Some(9999)),
            false,
        ),
        ("logind unread, console unknown", host(None, None), false),
    ];
    for policy in ["paper", "nights-and-weekends"] {
        let p = shipped(policy);
        for (what, facts, lent) in &table {
            let c = Case::new(facts.clone(), job(true, 0));
            assert_eq!(start(&p, &c), *lent, "{policy}: {what}");
            // Unknown is neither away nor back: no new grant, and no vacate on it alone.
            let back = !lent && facts.owner_idle_s.is_some();
            let holder = Case::new(facts.clone(), job(true, 1));
            assert_eq!(vacate(&p, &holder), back, "{policy}: {what}");
        }
    }
}
