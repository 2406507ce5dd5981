//! The trace format round trip, host deltas, the whole-state record and rotation.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::*;
use crate::{host::tests::view, AllocConfig};
use serde_json::Value;

/// An allocator driven through a [`Recorder`], as the broker's shell drives it.
pub(crate) struct Traced {
    pub(crate) a: Allocator,
    pub(crate) rec: Recorder,
    pub(crate) out: Vec<Out>,
    pub(crate) now: Instant,
}

impl Traced {
    pub(crate) fn new(max_bytes: u64) -> Traced {
        let now = Instant::now();
        let mut a = Allocator::with_config(AllocConfig::default());
        a.set_wall_clock(now, 1_700_000_000, 3600);
        Traced {
            a,
            rec: Recorder::new(TraceClock::new(now, 1_700_000_000_000), "run-1", max_bytes),
            out: Vec::new(),
            now,
        }
    }

    pub(crate) fn advance(&mut self, secs: f64) {
        self.now += Duration::from_secs_f64(secs);
    }

    /// One input through [`Allocator::handle`], recorded as the broker records it.
    pub(crate) fn step(&mut self, input: Input) -> crate::Handled {
        self.rec.begin(&self.a, self.now, &mut self.out);
        let handled = self.a.handle(input, self.now);
        if handled.recorded() {
            let input = handled.input.clone();
            self.rec
                .record(&self.a, input, &handled.effects, self.now, &mut self.out);
        }
        handled
    }

    pub(crate) fn host(&mut self, v: HostView) -> Vec<Effect> {
        let changed = host_delta(self.a.host_view(&v.name), &v);
        let input = Input::Host {
            host: v.name.clone(),
            changed,
            view: Some(Box::new(v)),
        };
        self.step(input).effects
    }

    pub(crate) fn job(&mut self, adaptive: bool) -> JobId {
        let info = JobInfo {
            user: "alice".into(),
            cwd: "/".into(),
            argv: vec!["pvm".into()],
            spec: None,
            adaptive,
        };
        let input = Input::Register {
            job: 0,
            info,
            resume: None,
            runs_on: None,
            module: false,
        };
        match self.step(input).answer {
            crate::Answer::Job { job, .. } => job,
            other => panic!("no job registered: {other:?}"),
        }
    }

    pub(crate) fn request(&mut self, job: JobId, symbolic: &str) -> (RequestId, Vec<Effect>) {
        let input = Input::Allocate {
            job,
            req: 0,
            symbolic: symbolic.into(),
        };
        let handled = self.step(input);
        match handled.answer {
            crate::Answer::Request(req) => (req, handled.effects),
            other => panic!("no request id: {other:?}"),
        }
    }

    fn returned(&mut self, alloc: AllocId, confirmed: bool) -> Vec<Effect> {
        let (host, req) = self.a.alloc_host(alloc).unwrap_or_default();
        let job = self.a.holder(&host).map_or(0, |h| h.0);
        let input = match confirmed {
            true => Input::Released { job, host, req },
            false => Input::GiveBack { job, host, req },
        };
        self.step(input).effects
    }

    pub(crate) fn give_back(&mut self, alloc: AllocId) -> Vec<Effect> {
        self.returned(alloc, false)
    }

    pub(crate) fn confirm(&mut self, alloc: AllocId) -> Vec<Effect> {
        self.returned(alloc, true)
    }

    pub(crate) fn end(&mut self, job: JobId) -> Vec<Effect> {
        self.step(Input::End { job }).effects
    }

    /// A tick, recorded only when it decided something (as the broker does).
    pub(crate) fn tick(&mut self) -> Vec<Effect> {
        self.step(Input::Tick).effects
    }

    /// The lines written, per file.
    pub(crate) fn files(&self) -> Vec<Vec<String>> {
        let mut files = vec![Vec::new()];
        for o in &self.out {
            match o.clone().into_text() {
                None => files.push(Vec::new()),
                Some(l) => files.last_mut().expect("one file at least").push(l),
            }
        }
        files
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        self.files().concat()
    }
}

pub(crate) fn granted(fx: &[Effect]) -> Option<(AllocId, String)> {
    fx.iter().find_map(|e| match e {
        Effect::Granted { alloc, host, .. } => Some((*alloc, host.clone())),
        _ => None,
    })
}

fn parse(line: &str) -> Line {
    serde_json::from_str(line).expect("a trace line")
}

#[test]
fn every_record_round_trips_through_json() {
    let mut t = Traced::new(u64::MAX);
    t.host(view("node01"));
    let j = t.job(true);
    t.request(j, "anyHost");
    t.request(j, "anyHost");
    let lines = t.lines();
    assert!(lines.len() >= 6, "{lines:#?}");
    for text in &lines {
        let line = parse(text);
        let again = serde_json::to_string(&line).expect("serialize");
        assert_eq!(&again, text);
    }
    let kinds: Vec<&str> = lines
        .iter()
        .map(|l| match parse(l).body {
            Body::Start(_) => "start",
            Body::Input(_) => "input",
            Body::Decision(_) => "decision",
        })
        .collect();
    assert_eq!(kinds[..3], ["start", "input", "input"]);
    let v: Value = serde_json::from_str(&lines[3]).expect("json");
    assert_eq!(v["input"]["kind"], "allocate", "{v}");
    let v: Value = serde_json::from_str(&lines[4]).expect("json");
    assert_eq!(v["decision"]["kind"], "grant", "{v}");
    assert_eq!(v["decision"]["policy"], t.a.policy().sha256(), "{v}");
    assert_eq!(v["unix_ms"], 1_700_000_000_000i64, "{v}");
}

#[test]
fn a_host_record_holds_only_the_fields_that_changed() {
    let mut t = Traced::new(u64::MAX);
    t.host(view("node01"));
    let mut busy = view("node01");
    busy.load1 = Some(2.5);
    t.host(busy.clone());
    let last = t.lines().pop().expect("a line");
    let Body::Input(Input::Host { host, changed, .. }) = parse(&last).body else {
        panic!("not a host record: {last}");
    };
    assert_eq!(host, "node01");
    let fields = changed.to_map().expect("an object");
    assert_eq!(fields.keys().collect::<Vec<_>>(), ["load1"], "{last}");
    let rebuilt = apply_delta(Some(&view("node01")), "node01", &changed).expect("rebuilt");
    assert_eq!(rebuilt, busy);
    let first = host_delta(None, &busy);
    assert_eq!(apply_delta(None, "node01", &first), Ok(busy));
}

/// The field-by-field delta is what comparing the two views' JSON gives, for every
/// field changed alone and for all of them at once; and its text is that difference's, byte
/// for byte (the keys in order, as the map of that difference writes them).
#[test]
fn the_delta_is_the_json_difference() {
    let by_json = |old: &HostView, new: &HostView| {
        let (Ok(Value::Object(mut n)), Ok(Value::Object(o))) =
            (serde_json::to_value(new), serde_json::to_value(old))
        else {
            panic!("views serialize to objects");
        };
        n.remove("name");
        n.retain(|k, v| o.get(k) != Some(v));
        n
    };
    let old = view("node01");
    let mut changes: Vec<HostView> = Vec::new();
    let mut each = |f: &dyn Fn(&mut HostView)| {
        let mut v = old.clone();
        f(&mut v);
        changes.push(v);
    };
    each(&|v| v.address = "10.9.9.9".into());
    each(&|v| v.up = false);
    each(&|v| v.reported = false);
    each(&|v| v.add_label("gpu"));
    each(&|v| v.os = None);
    each(&|v| v.owner = Some("ann".into()));
    each(&|v| v.load1 = Some(1.5));
    each(&|v| v.load5 = Some(0.5));
    each(&|v| v.load15 = Some(0.25));
    each(&|v| v.mem_avail_mb = Some(512));
    each(&|v| v.cpus = None);
    each(&|v| v.users = None);
    each(&|v| v.console_idle_s = Some(7));
    each(&|v| v.job_load = Some(0.5));
    each(&|v| v.logind = Some(Vec::new()));
    each(&|v| v.logind_error = Some("no bus".into()));
    let all = changes.iter().fold(old.clone(), |mut acc, v| {
        let d = host_delta(Some(&old), v);
        acc = apply_delta(Some(&acc), "node01", &d).expect("applies");
        acc
    });
    changes.push(all);
    changes.push(old.clone());
    for new in &changes {
        let delta = host_delta(Some(&old), new);
        let expected = by_json(&old, new);
        assert_eq!(
            serde_json::to_string(&delta).expect("text"),
            serde_json::to_string(&expected).expect("text"),
            "{new:?}"
        );
        assert_eq!(delta, Delta::from(expected), "{new:?}");
        assert_eq!(delta.is_empty(), *new == old);
    }
}

#[test]
fn the_whole_state_round_trips_mid_reclaim() {
    let mut t = Traced::new(u64::MAX);
    for h in ["n1", "n2"] {
        t.host(view(h));
    }
    let adaptive = t.job(true);
    t.request(adaptive, "anyHost");
    t.request(adaptive, "anyHost");
    let other = t.job(false);
    t.advance(1.5);
    t.request(other, "anyHost");
    let clock = *t.rec.clock();
    let state = t.a.trace_state(&clock);
    let text = serde_json::to_string(&state).expect("serialize");
    let back: TraceState = serde_json::from_str(&text).expect("parse");
    assert_eq!(back, state);
    let mut copy = Allocator::from_trace_state(back, t.a.policy().clone(), &clock);
    assert_eq!(copy.trace_state(&clock), state);
    assert_eq!(copy.check_invariants(), Ok(()));
    // Both decide the same from here: the reclaim's deadline passes.
    let later = t.now + Duration::from_secs(10);
    assert_eq!(copy.tick(later), t.a.tick(later));
}

#[test]
fn files_rotate_once_full_and_each_opens_with_the_whole_state() {
    let mut t = Traced::new(800);
    for i in 0..12 {
        t.host(view(&format!("node{i:02}")));
        t.advance(0.25);
    }
    let files = t.files();
    assert!(files.len() >= 3, "{} files", files.len());
    for (i, f) in files.iter().enumerate() {
        let Body::Start(start) = parse(&f[0]).body else {
            panic!("file {i} does not open with a start record: {}", f[0]);
        };
        assert_eq!(start.run, "run-1");
        assert!(!start.gap);
        if i + 1 < files.len() {
            let bytes: usize = f.iter().map(|l| l.len() + 1).sum();
            let body: usize = f[1..].iter().map(|l| l.len() + 1).sum();
            assert!(
                body >= 800 && bytes > body,
                "file {i}: {bytes} bytes rotated"
            );
        }
    }
    // A later file's state has the hosts recorded before it.
    let Body::Start(start) = parse(&files[2][0]).body else {
        unreachable!()
    };
    assert!(start.state.hosts.len() > 2, "{}", start.state.hosts.len());
}

/// The state that opens a file leaves the recorder as data, not text, and holds the
/// allocator's own host views, not copies: serializing and copying 100k hosts' views on the
/// broker's core (~170 ms at each new file) held every report and grant behind it.
#[test]
fn the_opening_state_is_handed_over_unserialized_and_shares_the_views() {
    // A limit of one byte: the second call opens a new file with node00 in its state.
    let mut t = Traced::new(1);
    t.host(view("node00"));
    t.host(view("node01"));
    let line = t
        .out
        .iter()
        .skip_while(|o| !matches!(o, Out::Rotate))
        .find_map(|o| match o {
            Out::Start(line) => Some(line),
            _ => None,
        })
        .expect("the second file opens with an unserialized start");
    let Body::Start(start) = &line.body else {
        panic!("not a start record: {line:?}");
    };
    let [in_state] = &start.state.hosts[..] else {
        panic!("{} hosts in the state", start.state.hosts.len());
    };
    let held = &t.a.hosts.get("node00").expect("node00's view").view;
    assert!(Arc::ptr_eq(in_state, held), "the state copied the view");
    let text = Out::Start(line.clone()).into_text().expect("a line");
    assert_eq!(parse(&text), **line);
}

/// A lab whose whole state is larger than a file's limit: a new file once the lines after
/// the opening state reach the limit, not at every call (each with the whole state again,
/// which froze a broker of 100k hosts).
#[test]
fn a_state_larger_than_the_limit_does_not_open_a_file_per_call() {
    let mut t = Traced::new(u64::MAX);
    for i in 0..40 {
        t.host(view(&format!("node{i:02}")));
    }
    let limit = 2_000;
    t.rec = Recorder::new(TraceClock::new(t.now, 1_700_000_000_000), "run-1", limit);
    t.out.clear();
    for _ in 0..60 {
        t.advance(1.0);
        t.host(view("node00")); // the same view again: a short line each
    }
    let files = t.files();
    let state_bytes = files[0][0].len() as u64;
    assert!(state_bytes > limit, "{state_bytes} bytes of state");
    assert!((2..=10).contains(&files.len()), "{} files", files.len());
    for (i, f) in files[..files.len() - 1].iter().enumerate() {
        assert!(
            f[0].len() as u64 > limit,
            "file {i} opens with the whole state"
        );
        let body: u64 = f[1..].iter().map(|l| l.len() as u64 + 1).sum();
        assert!(body >= limit, "file {i}: {body} bytes after its state");
    }
}

#[test]
fn after_lost_lines_the_next_file_starts_marked_gap() {
    let mut t = Traced::new(u64::MAX);
    t.host(view("node01"));
    t.rec.gap();
    t.host(view("node02"));
    let files = t.files();
    assert_eq!(files.len(), 2);
    let Body::Start(start) = parse(&files[1][0]).body else {
        panic!("{}", files[1][0]);
    };
    assert!(start.gap);
    assert_eq!(start.state.hosts.len(), 1, "the state before the call");
}
