//! What a guardian watches and ends: a process group, every process of this uid whose
//! environment carries a tag (`VAR=value`), which a process keeps whatever it does to its
//! session (LAM's `hboot` and PVM's pvmd call `setsid`), and a part of the process tree
//! ([`Tree`]), which a process cannot leave even when it clears its environment (`env -i`)
//! or writes its title over it (OpenSSH). Shared by the subagent's guardian on granted
//! hosts ([`crate::subagent::TAG_VAR`], the tree below itself), the job's guardian on the
//! front end ([`crate::jobguard::JOB_TAG_VAR`], the processes the agent had adopted) and the
//! agent at the job's end (the tree below itself).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{killpg, Signal},
    unistd::Pid,
};

use crate::proctree;

/// The longest pause between checks while a watched command is given its grace period.
const END_POLL_MAX: Duration = Duration::from_millis(20);

/// What a guardian watches: the command's process group and every process of this uid
/// whose environment holds `var=tag` (daemons that left the group).
#[derive(Debug, Clone)]
pub struct Watch {
    /// The process group (0: none known).
    pub pgid: i32,
    pub var: &'static str,
    pub tag: String,
    pub tree: Tree,
}

/// The part of the process tree a [`Watch`] covers besides its group and tag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Tree {
    #[default]
    Nothing,
    /// Every live process below `root` (a child subreaper: the watcher itself), except
    /// the subtrees of `skip` (what `root` started itself and ends its own way).
    Below { root: i32, skip: BTreeSet<i32> },
    /// These processes (pid and start time: a pid since reused is not theirs) and
    /// everything below them.
    Roots(Vec<(i32, u64)>),
}

impl Tree {
    /// The live processes this tree covers now.
    pub fn processes(&self) -> Vec<i32> {
        match self {
            Tree::Nothing => Vec::new(),
            Tree::Below { root, skip } => proctree::below(&proctree::table(), *root, skip),
            Tree::Roots(roots) => proctree::subtrees(&proctree::table(), roots, &BTreeSet::new()),
        }
    }
}

impl Watch {
    /// True while any watched process exists.
    pub fn alive(&self) -> bool {
        group_alive(self.pgid)
            || !tagged_processes(self.var, &self.tag).is_empty()
            || !self.tree.processes().is_empty()
    }

    /// SIGTERM to everything watched, up to `grace` for it to go, then SIGKILL what is left.
    pub fn end(&self, grace: Duration) {
        self.signal(Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        // Most commands are gone within a millisecond or two of SIGTERM, and the host is
        // held until we see it: look again soon, then less and less often.
        let mut pause = Duration::from_millis(1);
        while Instant::now() < deadline {
            if !self.alive() {
                return;
            }
            std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
            pause = (pause * 2).min(END_POLL_MAX);
        }
        self.signal(Signal::SIGKILL);
    }

    fn signal(&self, signal: Signal) {
        if self.pgid > 1 {
            let _ = killpg(Pid::from_raw(self.pgid), signal);
        }
        let tagged = tagged_processes(self.var, &self.tag);
        for pid in tagged.into_iter().chain(self.tree.processes()) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
        }
    }
}

/// Pids of this uid's live processes (this one excepted) whose environment holds `var=tag`.
pub fn tagged_processes(var: &str, tag: &str) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let needle = format!("{var}={tag}\0").into_bytes();
    let uid = nix::unistd::getuid().as_raw();
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok().map(|p| (p, e)))
        .filter(|(pid, e)| *pid != me && e.metadata().is_ok_and(|m| m.uid() == uid))
        .filter(|(_, e)| has_tag(&e.path(), &needle))
        .map(|(pid, _)| pid)
        .collect()
}

/// Whether the process is a zombie, gone, or a kernel thread: none has an environment.
fn is_zombie_gone_or_kernel_thread(proc_dir: &std::path::Path) -> bool {
    /// `PF_KTHREAD` in the flags field of `/proc/PID/stat`.
    const KERNEL_THREAD: u64 = 0x0020_0000;
    let Ok(stat) = std::fs::read_to_string(proc_dir.join("stat")) else {
        return true;
    };
    let fields: Vec<&str> = crate::ancestry::stat_fields(&stat).take(7).collect();
    let Some(flags) = fields.get(6).and_then(|f| f.parse::<u64>().ok()) else {
        return true;
    };
    matches!(fields.first(), Some(&("Z" | "X"))) || flags & KERNEL_THREAD != 0
}

/// Whether `/proc/PID/environ` holds `needle`. While a process is in the middle of
/// `execve` its environ may not be readable (nor is it empty): retry a few times so a daemon
/// caught exec'ing is not taken for gone. Processes whose environment we may not read (other
/// users', setuid programs) were not started under us, and zombies and kernel threads have
/// none: those are answered at once (a scan as root meets many of them).
fn has_tag(proc_dir: &std::path::Path, needle: &[u8]) -> bool {
    has_tag_pausing(proc_dir, needle, || {
        std::thread::sleep(Duration::from_millis(2))
    })
}

/// [`has_tag`], calling `pause` between attempts.
fn has_tag_pausing(proc_dir: &std::path::Path, needle: &[u8], mut pause: impl FnMut()) -> bool {
    for _ in 0..5 {
        match std::fs::read(proc_dir.join("environ")) {
            Ok(env) if !env.is_empty() => {
                return env.windows(needle.len()).any(|w| w == needle);
            }
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return false,
            _ if is_zombie_gone_or_kernel_thread(proc_dir) => return false,
            _ => pause(),
        }
    }
    false
}

/// True while any process of the group exists. Groups 0 and 1 (our own group, init's)
/// are never a watched one: a watch that knows no group has 0.
pub fn group_alive(pgid: i32) -> bool {
    pgid > 1 && killpg(Pid::from_raw(pgid), None).is_ok()
}
#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::subagent::TAG_VAR;

    fn proc_dir_with_stat(stat: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("stat"), stat).expect("write stat");
        dir
    }

    #[test]
    fn kernel_threads_zombies_and_vanished_processes_have_no_environment_to_wait_for() {
        // Fields as in proc(5); the flags of a kernel thread carry PF_KTHREAD (0x200000).
        let kthread = proc_dir_with_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0");
        let zombie = proc_dir_with_stat("77 (sh) Z 1 77 77 0 -1 4194304 0 0");
        let user = proc_dir_with_stat("78 (a (b) c) S 1 78 78 0 -1 4194560 0 0");
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(is_zombie_gone_or_kernel_thread(kthread.path()));
        assert!(is_zombie_gone_or_kernel_thread(zombie.path()));
        assert!(is_zombie_gone_or_kernel_thread(empty.path()));
        assert!(!is_zombie_gone_or_kernel_thread(user.path()));
    }

    #[test]
    fn a_kernel_thread_is_answered_at_once_a_live_process_is_retried() {
        // No environ file and a kernel thread's stat: not tagged, and no 5 × 2 ms retries.
        let kthread = proc_dir_with_stat("2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0");
        let mut pauses = 0;
        let tagged = has_tag_pausing(kthread.path(), b"RB_SUBAGENT_TAG=x\0", || pauses += 1);
        assert!(!tagged);
        assert_eq!(pauses, 0);
        // A live process caught without a readable environment is retried.
        let user = proc_dir_with_stat("78 (lamd) S 1 78 78 0 -1 4194560 0 0");
        let tagged = has_tag_pausing(user.path(), b"RB_SUBAGENT_TAG=x\0", || pauses += 1);
        assert!(!tagged);
        assert_eq!(pauses, 5);
    }

    #[test]
    fn a_watch_without_a_group_never_counts_or_signals_our_own() {
        let watch = Watch {
            pgid: 0,
            var: TAG_VAR,
            tag: format!("none.{}", std::process::id()),
            tree: Tree::Nothing,
        };
        assert!(!watch.alive(), "group 0 is the caller's own group");
        watch.end(Duration::from_millis(10));
    }

    #[test]
    fn a_daemon_that_left_the_group_is_still_watched_and_ended() {
        // `setsid` puts the sleep in a new session and group, as LAM's hboot does to lamd.
        let tag = format!("test.{}", std::process::id());
        let mut child = Command::new("setsid")
            .args(["sleep", "30"])
            .env(TAG_VAR, &tag)
            .spawn()
            .expect("setsid");
        let is_sleep = |pid: &i32| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        };
        let found = (0..200).find_map(|_| {
            let pids = tagged_processes(TAG_VAR, &tag);
            if pids.is_empty() || !pids.iter().all(is_sleep) {
                std::thread::sleep(Duration::from_millis(10));
                None
            } else {
                Some(pids)
            }
        });
        assert_eq!(found, Some(vec![child.id() as i32]));
        // A group that no longer exists: only the tag keeps it alive.
        let watch = Watch {
            pgid: i32::MAX - 1,
            var: TAG_VAR,
            tag: tag.clone(),
            tree: Tree::Nothing,
        };
        assert!(watch.alive());
        let ended = std::thread::spawn(move || child.wait());
        watch.end(Duration::from_secs(2));
        ended.join().expect("join").expect("wait");
        assert!(!watch.alive());
        assert!(
            tagged_processes(TAG_VAR, &format!("{tag}9")).is_empty(),
            "tags match exactly"
        );
    }
}
