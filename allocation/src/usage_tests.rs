//! Tests of the replay's usage integration: host-seconds integrated from state to state, the
//! order in which a host's state is decided, runs kept apart, and a replayed timeline summing
//! to the usage by state.

use super::*;

fn at(t_s: u64, held: usize, idle_wanted: Option<usize>) -> Sample {
    let mut counts = [0; 5];
    counts[HostUse::Lent.index()] = held;
    counts[HostUse::Free.index()] = 3 - held.min(3);
    counts[HostUse::Down.index()] = 4 - held.max(3);
    Sample {
        t_us: t_s * 1_000_000,
        hosts: 4,
        held,
        idle_wanted,
        counts,
    }
}

/// Integrates each sample up to the next one's instant.
fn integrate(samples: &[Sample]) -> Usage {
    let mut m = UsageMeter::default();
    for pair in samples.windows(2) {
        m.advance(pair[0], pair[1].t_us);
    }
    m.usage()
}

#[test]
fn host_seconds_are_integrated_from_each_state_to_the_next() {
    let u = integrate(&[
        at(0, 2, None),     // 10 s: nobody waits, 2 of 4 hosts held
        at(10, 3, Some(1)), // 5 s: a request waits, one host free
        at(15, 4, Some(0)), // 5 s: it waits, none free (being reclaimed)
        at(20, 0, None),
    ]);
    assert_eq!(u.host_s, 80.0);
    assert_eq!(u.held_host_s, 20.0 + 15.0 + 20.0);
    assert_eq!(u.wanted_s, 10.0);
    assert_eq!(u.idle_while_wanted_host_s, 5.0);
    assert_eq!(u.idle_fraction(), 5.0 / 80.0);
    assert_eq!(u.by_use.get(HostUse::Lent), u.held_host_s);
    assert_eq!(u.by_use.total(), u.host_s);
    assert_eq!(u.by_use.get(HostUse::Down), 10.0 + 5.0);
}

#[test]
fn an_empty_run_is_not_idle() {
    assert_eq!(UsageMeter::default().usage().idle_fraction(), 0.0);
}

#[test]
fn a_host_is_in_the_first_state_that_applies() {
    use crate::host::tests::view;
    let mut a = Allocator::new();
    let t = std::time::Instant::now();
    for name in ["a", "b", "c", "d", "e"] {
        let mut v = view(name);
        v.up = name != "b";
        if name == "d" {
            v.owner = Some("alice".into());
            v.console_idle_s = Some(1);
        }
        a.host_changed(v, t);
    }
    a.drain("c").expect("drain");
    let mut m = UsageMeter::default();
    m.keep_timeline();
    m.sample(0, 1_000, &a, Touched::All);
    let (job, _) = a.register_job(crate::tests::job_info(true), t);
    let (_, effects) = a.request(job, "anyHost", t);
    let touched = touched_hosts(&Input::Tick, &effects);
    assert_eq!(touched, ["a"], "{effects:?}");
    m.sample(2_000_000, 3_000, &a, Touched::Named(&touched));
    m.sample(4_000_000, 5_000, &a, Touched::Named(&[]));
    let u = m.usage();
    // 2 s before the grant: a free, b down, c drained, d owner, e free; 2 s after: a lent.
    let want = |s: HostUse| match s {
        HostUse::Lent => 2.0,
        HostUse::Free => 4.0 + 2.0,
        HostUse::Owner | HostUse::Drained | HostUse::Down => 4.0,
    };
    for s in HostUse::ALL {
        assert_eq!(u.by_use.get(s), want(s), "{}", s.name());
    }
    let tl = m.timeline();
    let mut from_spans = ByUse::default();
    for span in &tl.spans {
        from_spans.add(span.state, span.seconds);
    }
    assert_eq!(from_spans, u.by_use);
    assert_eq!(
        (tl.first_unix_ms, tl.last_unix_ms),
        (Some(1_000.0), Some(5_000.0))
    );
    let a_index = tl.hosts.iter().position(|h| h == "a").expect("a");
    assert_eq!(tl.last[a_index], Some(HostUse::Lent));
}

#[test]
fn a_new_run_is_not_joined_to_the_last() {
    let a = Allocator::new();
    let mut m = UsageMeter::default();
    m.sample(0, 0, &a, Touched::All);
    m.sample(5_000_000, 5_000, &a, Touched::All);
    m.new_run();
    m.sample(1_000_000, 60_000, &a, Touched::All);
    m.sample(3_000_000, 62_000, &a, Touched::All);
    // No hosts: nothing; the point is that the gap (and the earlier t_us) adds nothing.
    assert_eq!(m.usage().host_s, 0.0);
}

/// A replayed trace (hosts seen, a grant, a host down and back, the job's end): each
/// host's spans sum to the usage by state, which sums to all host-seconds; and the states
/// kept by touched hosts only match a full walk after every input (`check`).
#[test]
fn a_replayed_timeline_sums_to_the_usage_by_state() {
    use crate::{host::tests::view, trace::tests::Traced, Replay};
    let mut t = Traced::new(u64::MAX);
    for h in ["n1", "n2", "n3"] {
        t.host(view(h));
    }
    let job = t.job(true);
    t.advance(1.0);
    t.request(job, "anyHost");
    t.advance(2.0);
    let mut n3 = view("n3");
    n3.up = false;
    t.host(n3.clone());
    t.advance(3.0);
    n3.up = true;
    t.host(n3);
    t.advance(1.5);
    t.end(job);
    t.advance(1.0);
    t.tick();
    let mut r = Replay::new(t.a.policy().clone());
    r.keep_timeline();
    for l in t.lines() {
        r.feed(&l).expect("a trace line");
    }
    let out = r.finish();
    let (u, tl) = (out.usage, out.timeline);
    let mut from_spans = ByUse::default();
    for span in &tl.spans {
        from_spans.add(span.state, span.seconds);
    }
    for s in HostUse::ALL {
        let (a, b) = (from_spans.get(s), u.by_use.get(s));
        assert!((a - b).abs() < 1e-9, "{}: spans {a}, usage {b}", s.name());
    }
    assert!((u.by_use.total() - u.host_s).abs() < 1e-9, "{u:?}");
    assert!(
        (u.by_use.get(HostUse::Lent) - u.held_host_s).abs() < 1e-9,
        "{u:?}"
    );
    assert!((u.by_use.get(HostUse::Down) - 3.0).abs() < 1e-6, "{u:?}");
    assert!((u.by_use.get(HostUse::Lent) - 6.5).abs() < 1e-6, "{u:?}");
    assert_eq!(tl.hosts.len(), 3);
}
