//! The sweep's second net: processes below a subagent of this lab, remembered. The tag
//! (`RB_SUBAGENT_TAG`) is lost by a process that clears or overwrites its environment
//! (`env -i`, OpenSSH's process title); the subagent's guardian, a child subreaper, still
//! has such a process below it, and ends it itself. Should the guardian be SIGKILLed, what it
//! had adopted goes to init and only this record is left: at each sweep the daemon notes
//! every process below a subagent of its lab (known by its command line, `rb-subagent …
//! --alloc N … --lab-mark MARK`: the front and the guardian share it) with that subagent's
//! allocation, and keeps the note (pid and start time) for as long as the process lives,
//! wherever it is reparented. The sweep then ends those of allocations that are over as it
//! ends tagged ones.
//!
//! [`Lineage::update`] is pure; [`read`] is the edge.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use crate::sweep::{start_time, Scope, Tagged};

/// One process as the sweep reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub start: u64,
    /// The allocation, when the process is a subagent of this lab.
    pub subagent_of: Option<u64>,
}

/// The processes noted below subagents: (pid, start time) → allocation.
#[derive(Debug, Default)]
pub struct Lineage {
    noted: BTreeMap<(i32, u64), u64>,
}

impl Lineage {
    /// Notes the processes of `table` below a subagent, forgets those gone, and returns
    /// every noted process (the subagents themselves not included) but those of `own_alloc`
    /// (the allocation this daemon itself runs under, if any).
    pub fn update(&mut self, table: &[Proc], own_alloc: Option<u64>) -> Vec<Tagged> {
        let present: BTreeSet<(i32, u64)> = table.iter().map(|p| (p.pid, p.start)).collect();
        self.noted.retain(|key, _| present.contains(key));
        let mut alloc_of: BTreeMap<i32, u64> = table
            .iter()
            .filter_map(|p| Some((p.pid, p.subagent_of?)))
            .collect();
        loop {
            let before = alloc_of.len();
            for p in table {
                if let Some(&alloc) = alloc_of.get(&p.ppid) {
                    alloc_of.entry(p.pid).or_insert(alloc);
                }
            }
            if alloc_of.len() == before {
                break;
            }
        }
        for p in table.iter().filter(|p| p.subagent_of.is_none()) {
            if let Some(&alloc) = alloc_of.get(&p.pid) {
                self.noted.entry((p.pid, p.start)).or_insert(alloc);
            }
        }
        self.noted
            .iter()
            .filter(|(_, alloc)| Some(**alloc) != own_alloc)
            .map(|(&(pid, start), &alloc)| Tagged { pid, start, alloc })
            .collect()
    }
}

/// This uid's processes under `scope.proc_root` (this process excepted), each marked when
/// it is a subagent of the lab `scope.lab_mark`.
pub fn read(scope: &Scope) -> Vec<Proc> {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir(scope.proc_root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse::<i32>().ok()?, e)))
        .filter(|(pid, e)| *pid != me && e.metadata().is_ok_and(|m| m.uid() == uid))
        .filter_map(|(pid, e)| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            Some(Proc {
                pid,
                ppid,
                start: start_time(&stat)?,
                subagent_of: subagent_alloc(&cmdline, scope.lab_mark),
            })
        })
        .collect()
}

/// The allocation of a subagent of the lab `lab_mark`, from its command line (`\0`
/// separated): `rb-subagent … --alloc N … --lab-mark MARK …`.
pub fn subagent_alloc(cmdline: &[u8], lab_mark: &str) -> Option<u64> {
    let words: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let program = Path::new(std::str::from_utf8(words.first()?).ok()?);
    if program.file_name()? != "rb-subagent" {
        return None;
    }
    let value = |flag: &[u8]| {
        let at = words.iter().position(|w| *w == flag)?;
        std::str::from_utf8(words.get(at + 1)?).ok()
    };
    (value(b"--lab-mark")? == lab_mark).then_some(())?;
    value(b"--alloc")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32, subagent_of: Option<u64>) -> Proc {
        Proc {
            pid,
            ppid,
            start: pid as u64 * 7,
            subagent_of,
        }
    }

    fn pids(found: &[Tagged]) -> Vec<(i32, u64)> {
        found.iter().map(|t| (t.pid, t.alloc)).collect()
    }

    #[test]
    fn what_was_below_a_subagent_stays_noted_after_it_is_reparented() {
        let mut lineage = Lineage::default();
        // Guardian 10 of allocation 4: the command 11, a daemon 12 it abandoned (adopted by
        // the guardian), and 13 below 12. 20 is unrelated.
        let first = vec![p(10, 1, Some(4)), p(11, 10, None), p(12, 10, None)];
        let first = [first, vec![p(13, 12, None), p(20, 1, None)]].concat();
        assert_eq!(
            pids(&lineage.update(&first, None)),
            vec![(11, 4), (12, 4), (13, 4)]
        );
        // The guardian is SIGKILLed: 12 goes to init; the command has ended.
        let later = vec![p(12, 1, None), p(13, 12, None), p(20, 1, None)];
        assert_eq!(pids(&lineage.update(&later, None)), vec![(12, 4), (13, 4)]);
        // A pid used again by a younger process is not the noted one.
        let reused = vec![Proc {
            start: 1,
            ..p(12, 1, None)
        }];
        assert!(lineage.update(&reused, None).is_empty());
    }

    #[test]
    fn the_daemons_own_allocation_is_left_alone() {
        let mut lineage = Lineage::default();
        let table = vec![
            p(10, 1, Some(4)),
            p(11, 10, None),
            p(30, 1, Some(5)),
            p(31, 30, None),
        ];
        assert_eq!(pids(&lineage.update(&table, Some(4))), vec![(31, 5)]);
    }

    #[test]
    fn subagents_of_this_lab_are_known_by_their_command_line() {
        let line = |words: &[&str]| words.join("\0").into_bytes();
        let sub = line(&[
            "/opt/rb/rb-subagent",
            "--agent",
            "10.0.0.1:4000",
            "--alloc",
            "17",
            "--lab-mark",
            "beef",
            "-c",
            "--alloc 9",
        ]);
        assert_eq!(subagent_alloc(&sub, "beef"), Some(17));
        assert_eq!(subagent_alloc(&sub, "cafe"), None, "another lab's");
        let other = line(&["/bin/sh", "--alloc", "17", "--lab-mark", "beef"]);
        assert_eq!(subagent_alloc(&other, "beef"), None);
        let guard = line(&["rb-subagent", "guard-job", "--pgid", "5", "--tag", "t"]);
        assert_eq!(subagent_alloc(&guard, "beef"), None);
        assert_eq!(subagent_alloc(b"", "beef"), None);
    }
}
