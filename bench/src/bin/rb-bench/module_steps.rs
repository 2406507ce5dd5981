//! Where an `anyLinux` add of the modules section spends its time (`--module-step-times`):
//! the step lines its job's processes wrote (`RB_STEP_TIMES`, the `steptimes` crate) cut
//! into adds by the `rb-timeit` marks the driver runs before each add and after its host
//! joined (or the add failed), and for each step the median over the adds of its first
//! time after the add's mark.

use std::collections::HashSet;

use bench::stats::{summarize, Summary};
use steptimes::{parse_line, Line};

/// The mark `rb-timeit` writes when it starts its program.
const MARK: &str = "timeit.spawn";

/// The steps of one add, in the order they usually come, each found in the add's lines.
const STEPS: [(&str, Find); 12] = [
    (
        "the lookup of the symbolic name: the agent asks the broker",
        Find::First("agent.allocate_sent"),
    ),
    (
        "the grant back at the agent",
        Find::First("agent.broker_granted"),
    ),
    (
        "the agent starts the module's grow program",
        Find::First("agent.module_spawn"),
    ),
    (
        "phase 1: the program's `rsh SYMBOLIC` reaches the shim (refused)",
        Find::Refused(0),
    ),
    ("`rb-pvm-add` starts (PVM)", Find::First("pvmadd.start")),
    (
        "a second `rsh SYMBOLIC` reaches the shim (PVM's console probe)",
        Find::Refused(1),
    ),
    (
        "`rb-pvm-add` enrolled: libpvm3 loaded, `pvm_mytid` (PVM, the job's first add)",
        Find::First("pvmadd.enrolled"),
    ),
    (
        "`rb-pvm-add` handed its host to the job's enrolled task (PVM, later adds)",
        Find::First("pvmadd.asked"),
    ),
    ("the real add's `rsh HOST` reaches the shim", Find::Granted),
    ("the subagent starts on HOST", Find::First("sub.start")),
    (
        "the module's grow program has ended",
        Find::First("agent.module_exit"),
    ),
    ("the host has joined (the mark after the wait)", Find::End),
];

/// How a step is found among an add's lines.
#[derive(Clone, Copy)]
enum Find {
    /// The first line of this step.
    First(&'static str),
    /// The start of the k-th shim (0-based) that was never granted a host.
    Refused(usize),
    /// The start of the first shim that was granted a host.
    Granted,
    /// The add's closing mark.
    End,
}

/// Each step's time after the add's mark (ms) over the adds that had it, and the
/// "Already in progress" answers `rb-pvm-add` got in each add.
pub(crate) struct AddSteps {
    pub(crate) adds: usize,
    pub(crate) steps: Vec<(&'static str, Summary)>,
    pub(crate) busy: Option<Summary>,
}

/// The adds in `text` (step lines), `None` when it holds none.
pub(crate) fn add_steps(text: &str) -> Option<AddSteps> {
    let mut lines: Vec<Line> = text.lines().filter_map(parse_line).collect();
    lines.sort_by_key(|l| l.ns);
    let marks: Vec<u64> = lines
        .iter()
        .filter(|l| l.step == MARK)
        .map(|l| l.ns)
        .collect();
    let adds: Vec<&[Line]> = marks
        .chunks_exact(2)
        .map(|pair| {
            let from = lines.partition_point(|l| l.ns < pair[0]);
            let to = lines.partition_point(|l| l.ns <= pair[1]);
            &lines[from..to]
        })
        .collect();
    if adds.is_empty() {
        return None;
    }
    let granted: Vec<HashSet<Option<u32>>> = adds.iter().map(|add| granted_shims(add)).collect();
    let steps = STEPS
        .iter()
        .filter_map(|&(name, find)| {
            let ms: Vec<f64> = adds
                .iter()
                .zip(&granted)
                .filter_map(|(add, granted)| found(add, granted, find).map(|ns| ms_after(add, ns)))
                .collect();
            summarize(&ms).map(|s| (name, s))
        })
        .collect();
    let busy: Vec<f64> = adds
        .iter()
        .filter(|add| add.iter().any(|l| l.step == "pvmadd.start"))
        .map(|add| add.iter().filter(|l| l.step == "pvmadd.busy").count() as f64)
        .collect();
    Some(AddSteps {
        adds: adds.len(),
        steps,
        busy: summarize(&busy),
    })
}

/// The shims (by pid) that were granted a host in `add`.
fn granted_shims(add: &[Line]) -> HashSet<Option<u32>> {
    add.iter()
        .filter(|l| l.step == "shim.granted")
        .map(|l| l.pid)
        .collect()
}

/// When `find`'s step came in `add` (ns), if it did; `granted` its granted shims.
fn found(add: &[Line], granted: &HashSet<Option<u32>>, find: Find) -> Option<u64> {
    let shims = add.iter().filter(|l| l.step == "shim.start");
    match find {
        Find::First(step) => add.iter().find(|l| l.step == step).map(|l| l.ns),
        Find::Refused(k) => shims
            .filter(|l| !granted.contains(&l.pid))
            .nth(k)
            .map(|l| l.ns),
        Find::Granted => shims
            .filter(|l| granted.contains(&l.pid))
            .map(|l| l.ns)
            .next(),
        Find::End => add.last().map(|l| l.ns),
    }
}

/// Milliseconds from `add`'s opening mark to `ns`.
fn ms_after(add: &[Line], ns: u64) -> f64 {
    let start = add.first().map_or(ns, |l| l.ns);
    ns.saturating_sub(start) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_add_is_cut_by_its_marks_and_each_step_found() {
        let text = "\
timeit.spawn 1000000 pid=9
agent.allocate_sent 3000000 pid=5
agent.broker_granted 3500000 pid=5 alloc=1
shim.start 4000000 pid=7
shim.start 6000000 pid=8
shim.granted 6500000 pid=8 alloc=1
pvmadd.start 4500000 pid=6
pvmadd.busy 5000000 pid=6
pvmadd.busy 5500000 pid=6
timeit.spawn 11000000 pid=10
timeit.spawn 21000000 pid=11
shim.start 22000000 pid=12
timeit.spawn 25000000 pid=13
garbage line
";
        let steps = add_steps(text).expect("two adds");
        assert_eq!(steps.adds, 2);
        let ms = |name: &str| {
            steps
                .steps
                .iter()
                .find(|(n, _)| n.starts_with(name))
                .map(|(_, s)| (s.median, s.n))
        };
        assert_eq!(ms("the lookup"), Some((2.0, 1)));
        assert_eq!(
            ms("phase 1"),
            Some((2.0, 2)),
            "3 ms in the first, 1 in the second"
        );
        assert_eq!(
            ms("the real add"),
            Some((5.0, 1)),
            "the shim that was granted"
        );
        assert_eq!(ms("the host has joined"), Some((7.0, 2)), "10 and 4 ms");
        assert_eq!(ms("a second"), None, "no add had two refused shims");
        let busy = steps.busy.expect("rb-pvm-add ran in one add");
        assert_eq!((busy.median, busy.n), (2.0, 1));
        assert!(
            add_steps("timeit.spawn 1 pid=1\n").is_none(),
            "a mark alone"
        );
    }
}
