//! Fuzzing on stable: the seed corpus of every cargo-fuzz target
//! (`*/fuzz/seeds/TARGET/`) and a few hundred proptest cases per target (fixed seed: the
//! same inputs on every run) go through the very harness the fuzz targets call (included
//! below), each input within [`PER_INPUT`]. No panic, no slow input.
//!
//! Seeds named `ok-*` are real frames and lab files: they must also be accepted (every
//! frame decodes, the lab file validates), so the corpus keeps reaching past the decoder
//! as the protocol changes. `./bench.sh` runs the long version (`bench/fuzz/run.sh`: ≥ 1 M
//! inputs per target under libFuzzer).

#[path = "../../agent/fuzz/src/lib.rs"]
mod agent_harness;
#[path = "../../config/fuzz/src/lib.rs"]
mod config_harness;
#[path = "../../jel/fuzz/src/lib.rs"]
mod jel_harness;
#[path = "../../policies/fuzz/src/lib.rs"]
mod policies_harness;
#[path = "../../proto/fuzz/src/lib.rs"]
mod proto_harness;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use proptest::{
    collection::vec,
    prelude::*,
    sample::select,
    test_runner::{Config, RngAlgorithm, TestRng, TestRunner},
};
use proto::{agent::ShimRequest, frame, msg::ToBroker};

/// Slowest an input may be (a debug build on a shared machine; libFuzzer's bound is the same).
const PER_INPUT: Duration = Duration::from_secs(1);
/// Proptest cases per target.
const CASES: u32 = 300;
/// The proptest seed: fixed, so every run replays the same cases.
const SEED: [u8; 32] = *b"resourcebroker-issue17-fuzzsmoke";

/// One fuzz target: where its seeds are, its harness, and what a real input must pass.
struct Target {
    name: &'static str,
    /// Seed directory, from the repository root.
    seeds: &'static str,
    run: fn(&[u8]),
    /// True when a real input (an `ok-*` seed) is accepted.
    accepts: fn(&[u8]) -> bool,
}

/// Every line decodes as `T` (a real session of that listener).
fn every_line<T: serde::de::DeserializeOwned>(data: &[u8]) -> bool {
    std::str::from_utf8(data)
        .is_ok_and(|text| text.lines().all(|line| frame::decode::<T>(line).is_ok()))
}

/// The first line is a shim request (the rest is read and ignored, as by the agent).
fn first_line_is_shim_request(data: &[u8]) -> bool {
    std::str::from_utf8(data).is_ok_and(|text| {
        let first = text.lines().next().unwrap_or_default();
        frame::decode::<ShimRequest>(first).is_ok()
    })
}

fn lab_file_validates(data: &[u8]) -> bool {
    std::str::from_utf8(data).is_ok_and(|text| config::LabConfig::parse(text, None).is_ok())
}

fn policy_file_loads(data: &[u8]) -> bool {
    std::str::from_utf8(data)
        .is_ok_and(|text| policies::Policy::from_text(Path::new("policy.toml"), text).is_ok())
}

fn seeds_of(target: &Target) -> Vec<(String, Vec<u8>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository");
    let dir: PathBuf = root.join(target.seeds);
    let mut seeds: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("seed entry").path();
            let name = path.file_name().expect("a file").to_string_lossy().into();
            (name, std::fs::read(&path).expect("seed readable"))
        })
        .collect();
    seeds.sort();
    seeds
}

/// Runs one input through the harness; the time it took.
fn timed(target: &Target, data: &[u8]) -> Duration {
    let start = Instant::now();
    (target.run)(data);
    start.elapsed()
}

fn replay_seeds(target: &Target) {
    let seeds = seeds_of(target);
    let oks = seeds.iter().filter(|(n, _)| n.starts_with("ok-")).count();
    assert!(
        oks >= 1 && seeds.len() > oks,
        "{}: the seed corpus needs real inputs (ok-*) and bad ones",
        target.name
    );
    for (name, data) in &seeds {
        let took = timed(target, data);
        assert!(took < PER_INPUT, "{}/{name} took {took:?}", target.name);
        if name.starts_with("ok-") {
            assert!(
                (target.accepts)(data),
                "{}/{name} is a real input and must be accepted",
                target.name
            );
        }
    }
}

/// Tokens that matter to the listeners' JSON and the lab file's TOML.
const TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "\n",
    "\r\n",
    "=",
    "#",
    "\\",
    "\\u0000",
    "null",
    "true",
    "-1",
    "0",
    "1e999",
    "-0.0",
    "18446744073709551616",
    "\"t\":\"hello\"",
    "\"t\":\"report\"",
    "\"op\":\"release\"",
    "anyLinux",
    "[[host]]\n",
    "[broker]\n",
    "name = \"",
    "\"\"\"",
    "'''",
    "é",
    "🎉",
    "\u{0}",
];

/// One change to a seed.
#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, &'static str),
    Delete(usize, usize),
    Replace(usize, u8),
    /// Copies `len` bytes from the first position to the second.
    Duplicate(usize, usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), select(TOKENS)).prop_map(|(at, t)| Edit::Insert(at, t)),
        (any::<usize>(), 1usize..64).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Replace(at, b)),
        (any::<usize>(), any::<usize>(), 1usize..256)
            .prop_map(|(from, to, n)| Edit::Duplicate(from, to, n)),
    ]
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for e in edits {
        let at = |p: usize, len: usize| p % (len + 1);
        match *e {
            Edit::Insert(p, t) => {
                let p = at(p, out.len());
                out.splice(p..p, t.bytes());
            }
            Edit::Delete(p, n) => {
                let p = at(p, out.len());
                let end = (p + n).min(out.len());
                out.drain(p..end);
            }
            Edit::Replace(p, b) if !out.is_empty() => {
                let p = p % out.len();
                out[p] = b;
            }
            Edit::Replace(..) => out.push(0),
            Edit::Duplicate(from, to, n) => {
                let from = at(from, out.len());
                let chunk = out[from..(from + n).min(out.len())].to_vec();
                let to = at(to, out.len());
                out.splice(to..to, chunk);
            }
        }
    }
    out
}

/// Random bytes, and seeds with a few edits.
fn input(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    prop_oneof![
        1 => vec(any::<u8>(), 0..512),
        3 => (0..n, vec(edit(), 1..8)).prop_map(move |(i, edits)| apply(&seeds[i], &edits)),
    ]
}

fn run_proptest_cases(target: &Target) {
    let seeds = seeds_of(target).into_iter().map(|(_, d)| d).collect();
    let config = Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    };
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &SEED);
    let mut runner = TestRunner::new_with_rng(config, rng);
    let result = runner.run(&input(seeds), |data| {
        let took = timed(target, &data);
        prop_assert!(took < PER_INPUT, "took {:?}", took);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{}: {e}", target.name);
    }
}

macro_rules! smoke {
    ($($name:ident: $seeds:literal, $run:path, $accepts:expr;)*) => {$(
        mod $name {
            use super::*;

            const TARGET: Target = Target {
                name: stringify!($name),
                seeds: $seeds,
                run: $run,
                accepts: $accepts,
            };

            #[test]
            fn seed_corpus_replays_without_panic_in_bounded_time() {
                replay_seeds(&TARGET);
            }

            #[test]
            fn proptest_cases_run_without_panic_in_bounded_time() {
                run_proptest_cases(&TARGET);
            }
        }
    )*};
}

smoke! {
    broker_tcp: "proto/fuzz/seeds/broker_tcp", proto_harness::broker_tcp, every_line::<ToBroker>;
    control_socket: "proto/fuzz/seeds/control_socket", proto_harness::control_socket,
        every_line::<ToBroker>;
    shim_socket: "agent/fuzz/seeds/shim_socket", agent_harness::shim_socket,
        first_line_is_shim_request;
    subagent: "agent/fuzz/seeds/subagent", agent_harness::subagent, every_line::<ToBroker>;
    lab_file: "config/fuzz/seeds/lab_file", config_harness::lab_file, lab_file_validates;
    policy_file: "policies/fuzz/seeds/policy_file", policies_harness::policy_file,
        policy_file_loads;
    policy_eval: "policies/fuzz/seeds/policy_eval", policies_harness::policy_eval,
        policies_harness::policy_eval_input_is_complete;
    jel_lines: "jel/fuzz/seeds/jel_lines", jel_harness::jel_lines, jel_harness::every_line_is_jel;
}

/// The seed mutator itself: edits land inside the input whatever their positions.
#[test]
fn edits_apply_anywhere_without_panicking() {
    let edits = [
        Edit::Insert(usize::MAX, "x"),
        Edit::Delete(3, 100),
        Edit::Replace(usize::MAX, b'y'),
        Edit::Duplicate(0, usize::MAX, 255),
    ];
    assert_eq!(apply(b"abcdef", &edits), b"yxbyxb".to_vec());
    assert_eq!(apply(b"", &[Edit::Replace(5, b'z')]), vec![0]);
}
