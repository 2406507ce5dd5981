//! The agent as its job's child subreaper: a process of the job that daemonizes (its parent
//! exits: a double fork, `setsid sh -c 'cmd &'`, OpenSSH's `ControlPersist` master, PVM's
//! pvmd, LAM's lamd) is reparented to the agent instead of init, whatever it did to its
//! session, environment or title. The agent reaps those adopted processes when they end,
//! tells the job's guardian which ones live (so that it can end them should the agent be
//! killed), and at the job's end ends everything below it ([`end_job_processes`]).
//!
//! The agent waits for the children it starts itself by pid (the app and module programs
//! through tokio, the guardian and an embedded broker through std) and must never take
//! their exit status: each is started through [`spawn_own`], which registers its pid under
//! the lock that [`reap_adopted`] holds while it reaps. A child that exits at once is thus
//! registered before the reaper can see its zombie; only unregistered children — adopted
//! ones — are reaped here, each by its own pid (never `waitpid(-1)`).

use std::{
    collections::BTreeSet,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use crate::proctree::{self, Proc};
use crate::watch::{Tree, Watch};

/// Pids of the children the agent started itself.
static OWN: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// How often adopted processes are looked for without a SIGCHLD (one that ends
/// while another ends may be missed by the signal stream's coalescing).
const SWEEP_EVERY: Duration = Duration::from_secs(1);

fn own() -> MutexGuard<'static, BTreeSet<i32>> {
    OWN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Starts a child of the agent's own (`spawn`), registering its pid (`pid` of the result)
/// before [`reap_adopted`] can look at it.
pub fn spawn_own<T>(
    spawn: impl FnOnce() -> std::io::Result<T>,
    pid: impl FnOnce(&T) -> Option<u32>,
) -> std::io::Result<T> {
    let mut own = own();
    let child = spawn()?;
    if let Some(pid) = pid(&child).and_then(|p| i32::try_from(p).ok()) {
        own.insert(pid);
    }
    Ok(child)
}

/// Reaps the adopted children that ended, forgets own children that are gone, and
/// returns the live adopted children (pid, start time).
pub fn reap_adopted() -> Vec<(i32, u64)> {
    let mut own = own();
    let me = std::process::id() as i32;
    let table = proctree::table();
    let children: Vec<Proc> = table.iter().copied().filter(|p| p.ppid == me).collect();
    own.retain(|pid| children.iter().any(|c| c.pid == *pid));
    let mut live = Vec::new();
    for child in children.iter().filter(|c| !own.contains(&c.pid)) {
        if child.zombie {
            let _ = waitpid(Pid::from_raw(child.pid), Some(WaitPidFlag::WNOHANG));
        } else {
            live.push((child.pid, child.start));
        }
    }
    live
}

/// Reaps adopted children as they end (SIGCHLD, and every second), and passes each
/// changed list of the live ones to `report` (the job's guardian).
pub async fn serve(mut report: impl FnMut(&[(i32, u64)])) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut sigchld = match signal(SignalKind::child()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "no SIGCHLD stream: adopted processes are reaped each second");
            None
        }
    };
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    let mut last: Vec<(i32, u64)> = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            Some(()) = async { sigchld.as_mut()?.recv().await } => {}
        }
        let live = reap_adopted();
        if live != last {
            report(&live);
            last = live;
        }
    }
}

/// What is left of the job on this machine at its end: the app's group and tagged
/// processes, and everything below the agent except the children it started itself and
/// ends its own way (the guardian, an embedded broker); the app's subtree included.
pub fn job_watch(app_pgid: i32, tag: &str, app: Option<u32>) -> Watch {
    let mut skip: BTreeSet<i32> = own().clone();
    if let Some(app) = app.and_then(|p| i32::try_from(p).ok()) {
        skip.remove(&app);
    }
    Watch {
        pgid: app_pgid,
        var: crate::jobguard::JOB_TAG_VAR,
        tag: tag.to_string(),
        tree: Tree::Below {
            root: std::process::id() as i32,
            skip,
        },
    }
}

/// How long the front end's JEL members told `terminated` have to end on their own before
/// the job's end ends what is left ([`members_end`]).
pub const MEMBERS_END_WAIT: Duration = Duration::from_secs(2);

/// Waits until each of `pids` has ended, `limit` at most: the JEL members the pool told
/// `terminated` (a watcher prints it, a member saves its work) end on their own before the
/// job's end sends SIGTERM to whatever is left. A member that had ended is not waited for.
pub async fn members_end(pids: &[u32], limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    for &pid in pids {
        if tokio::time::timeout_at(deadline, crate::launcher::exited(pid))
            .await
            .is_err()
        {
            tracing::debug!(pid, "a JEL member did not end after `terminated`");
            return;
        }
    }
}

/// Ends `watch` (SIGTERM, `grace`, SIGKILL) off the runtime's thread, while the reaper
/// ([`serve`]) reaps what ends; returns how many processes were there at the start.
pub async fn end_job_processes(watch: Watch, grace: Duration) -> usize {
    let found = watch.tree.processes().len();
    if !watch.alive() {
        return found;
    }
    let ended = tokio::task::spawn_blocking(move || watch.end(grace)).await;
    if let Err(e) = ended {
        tracing::warn!(error = %e, "ending the job's processes");
    }
    reap_adopted();
    found
}
