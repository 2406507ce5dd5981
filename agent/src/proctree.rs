//! The machine's process tree as this user sees it (`/proc/PID/stat`: parent, state, start
//! time), and the subtrees a guardian ends. Unlike an environment tag, a process cannot
//! leave its place in the tree by itself: `setsid`, `env -i`, a new process title (OpenSSH's
//! `setproctitle` writes over `/proc/PID/environ`) and a double fork keep it a descendant of
//! the nearest child subreaper above it. The agent and each subagent's guardian are such
//! subreapers ([`become_subreaper`]), so whatever their job starts stays below them.
//!
//! The walks here are pure functions over a [`Proc`] table read once ([`table`]).

use std::collections::BTreeSet;

/// One process, as [`table`] read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    /// Ended, not yet reaped (`Z`), or being torn down (`X`).
    pub zombie: bool,
    /// Start time in clock ticks since boot: a pid used again later has another.
    pub start: u64,
}

/// Makes this process a child subreaper: orphaned descendants are reparented to it, not
/// to init, and it must reap them.
pub fn become_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

/// This user's processes (the real uid's), from `/proc`.
pub fn table() -> Vec<Proc> {
    use std::os::unix::fs::MetadataExt;
    let uid = nix::unistd::getuid().as_raw();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            if !e.metadata().is_ok_and(|m| m.uid() == uid) {
                return None;
            }
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            parse_stat(pid, &stat)
        })
        .collect()
}

/// The process `pid` from [`table`], while it exists.
pub fn find(table: &[Proc], pid: i32) -> Option<Proc> {
    table.iter().copied().find(|p| p.pid == pid)
}

/// A `/proc/PID/stat` line → [`Proc`] (state, ppid and start time: fields 3, 4 and 22).
fn parse_stat(pid: i32, stat: &str) -> Option<Proc> {
    let fields: Vec<&str> = crate::ancestry::stat_fields(stat).take(20).collect();
    let state = *fields.first()?;
    Some(Proc {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        zombie: matches!(state, "Z" | "X"),
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The live (not zombie) processes at or below `roots`, each root given with its start
/// time (a root whose pid now names a younger process is not ours). `skip` and its subtree
/// are left out.
pub fn subtrees(table: &[Proc], roots: &[(i32, u64)], skip: &BTreeSet<i32>) -> Vec<i32> {
    let present: BTreeSet<i32> = roots
        .iter()
        .filter(|(pid, start)| find(table, *pid).is_some_and(|p| p.start == *start))
        .map(|(pid, _)| *pid)
        .filter(|pid| !skip.contains(pid))
        .collect();
    let mut found = close_downwards(table, present, skip);
    found.retain(|pid| find(table, *pid).is_some_and(|p| !p.zombie));
    found.into_iter().collect()
}

/// The live processes below `root` (not `root` itself), leaving out the subtrees of
/// `skip` (processes `root` started itself and ends its own way).
pub fn below(table: &[Proc], root: i32, skip: &BTreeSet<i32>) -> Vec<i32> {
    let children: BTreeSet<i32> = table
        .iter()
        .filter(|p| p.ppid == root && p.pid != root && !skip.contains(&p.pid))
        .map(|p| p.pid)
        .collect();
    let mut found = close_downwards(table, children, skip);
    found.retain(|pid| find(table, *pid).is_some_and(|p| !p.zombie));
    found.into_iter().collect()
}

/// `set` and every descendant of its members, not entering `skip`.
fn close_downwards(table: &[Proc], mut set: BTreeSet<i32>, skip: &BTreeSet<i32>) -> BTreeSet<i32> {
    loop {
        let before = set.len();
        for p in table {
            if set.contains(&p.ppid) && !skip.contains(&p.pid) && p.pid != p.ppid {
                set.insert(p.pid);
            }
        }
        if set.len() == before {
            return set;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32) -> Proc {
        Proc {
            pid,
            ppid,
            zombie: false,
            start: pid as u64 * 10,
        }
    }

    #[test]
    fn below_a_subreaper_everything_but_what_it_started_itself() {
        // Agent 10: its own guardian 11 (with 12 below), the app 20 → 21 → 22, an adopted
        // daemon 30 → 31, a zombie 40, and someone else's 50.
        let mut table = vec![p(10, 1), p(11, 10), p(12, 11), p(20, 10), p(21, 20)];
        table.extend([p(22, 21), p(30, 10), p(31, 30), p(50, 1), p(51, 50)]);
        table.push(Proc {
            zombie: true,
            ..p(40, 10)
        });
        let skip = BTreeSet::from([11]);
        assert_eq!(below(&table, 10, &skip), vec![20, 21, 22, 30, 31]);
        assert_eq!(below(&table, 10, &BTreeSet::new()).len(), 7);
        assert!(below(&table, 99, &skip).is_empty());
    }

    #[test]
    fn subtrees_of_roots_whose_pid_was_not_reused() {
        let table = vec![p(30, 1), p(31, 30), p(32, 31), p(60, 1), p(61, 60)];
        assert_eq!(
            subtrees(&table, &[(30, 300)], &BTreeSet::new()),
            vec![30, 31, 32]
        );
        // Pid 60 now names a process younger than the one reported.
        assert!(subtrees(&table, &[(60, 1)], &BTreeSet::new()).is_empty());
        assert_eq!(
            subtrees(&table, &[(30, 300)], &BTreeSet::from([31])),
            vec![30]
        );
    }

    #[test]
    fn stat_lines_with_odd_names_parse() {
        let line = "77 (a) b (c)) S 5 77 77 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 123456 0";
        assert_eq!(
            parse_stat(77, line),
            Some(Proc {
                pid: 77,
                ppid: 5,
                zombie: false,
                start: 123456
            })
        );
        assert_eq!(parse_stat(1, "garbage"), None);
        let me = std::process::id() as i32;
        let mine = find(&table(), me).expect("this process is in the table");
        assert_eq!(mine.ppid as u32, std::os::unix::process::parent_id());
    }
}
