//! Which process descends from which, through the parent field of `/proc/PID/stat` (and
//! the agent's one reading of that line's fields, [`stat_fields`]). A
//! module job's phase-1 request can start at a lookup of the symbolic name (the master
//! pvmd's, `lamgrow`'s); the shim that process then starts, directly or through a helper
//! (PVM's hoster), belongs to the same request.

pub use crate::core::module_calls::in_lineage;

/// How many parents up [`descends_from`] looks at most.
pub const MAX_STEPS: usize = 8;

/// The parent of `pid` per `/proc/PID/stat`, while the process is there.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_parent(&stat)
}

/// The parent field of a `/proc/PID/stat` line.
fn parse_parent(stat: &str) -> Option<u32> {
    stat_fields(stat).nth(1)?.parse().ok()
}

/// The fields of a `/proc/PID/stat` line after `PID (COMM)`, from the state on (`S`, ppid,
/// pgrp, session, tty_nr, tpgid, flags, …). COMM may hold spaces and parentheses, so the
/// split is at its last `)`; a line without one has no fields.
pub fn stat_fields(stat: &str) -> impl Iterator<Item = &str> {
    stat.rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
}

/// Whether `pid` is `ancestor` or descends from it within [`MAX_STEPS`] parents, following
/// `parent`. Init (1) and the kernel's threads (0) are nobody's ancestor here.
pub fn descends_from(pid: u32, ancestor: u32, parent: impl Fn(u32) -> Option<u32>) -> bool {
    in_lineage(&lineage(pid, parent), ancestor)
}

/// `pid` and its ancestors, nearest first: at most [`MAX_STEPS`] parents, stopping before
/// init (1), the kernel (0), a parent that is gone, or a loop. Read once, a lineage answers
/// [`in_lineage`] without `/proc` (the agent core gets it with a shim's call).
pub fn lineage(pid: u32, parent: impl Fn(u32) -> Option<u32>) -> Vec<u32> {
    let mut chain = vec![pid];
    let mut current = pid;
    for _ in 0..MAX_STEPS {
        match parent(current) {
            Some(next) if next > 1 && next != current => {
                chain.push(next);
                current = next;
            }
            _ => break,
        }
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn tree(edges: &[(u32, u32)]) -> impl Fn(u32) -> Option<u32> {
        let parents: HashMap<u32, u32> = edges.iter().copied().collect();
        move |pid| parents.get(&pid).copied()
    }

    #[test]
    fn a_grandchild_descends_a_sibling_does_not() {
        // pvmd 10 → hoster 11 → shim 12; the console 20 is the pvmd's sibling.
        let parent = tree(&[(12, 11), (11, 10), (10, 1), (20, 5), (5, 1)]);
        assert!(descends_from(12, 10, &parent));
        assert!(descends_from(10, 10, &parent));
        assert!(!descends_from(20, 10, &parent));
        assert!(!descends_from(10, 12, &parent));
        assert!(
            !descends_from(12, 1, &parent),
            "init is nobody's ancestor here"
        );
    }

    #[test]
    fn gone_parents_loops_and_deep_trees_end_the_walk() {
        assert!(!descends_from(7, 3, tree(&[])));
        assert!(!descends_from(7, 3, tree(&[(7, 8), (8, 7)])));
        let chain: Vec<(u32, u32)> = (100..120).map(|p| (p + 1, p)).collect();
        assert!(descends_from(119, 111, tree(&chain)));
        assert!(!descends_from(119, 100, tree(&chain)));
    }

    #[test]
    fn the_parent_field_survives_odd_command_names() {
        assert_eq!(parse_parent("42 (a) b (c)) S 17 42 42 0 -1"), Some(17));
        assert_eq!(parse_parent("42 (pvmd) S 1 42"), Some(1));
        assert_eq!(parse_parent("garbage"), None);
        assert_eq!(
            parent_of(std::process::id()),
            Some(std::os::unix::process::parent_id())
        );
    }
}
