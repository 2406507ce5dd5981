//! The remote shell of a granted host as the shim's child: started with the
//! caller's stdio (inherited, nothing copied), SIGTERM, SIGINT and SIGHUP passed on to it, its
//! end awaited; and the shim ending as it did ([`Ended::exit`]).
//!
//! Why a child and not `exec`: over rsh the remote command's status is lost (netkit rsh exits
//! 0 when the subagent ended the command for a reclaim), so the shim must still be there when
//! the remote shell exits to ask its agent whether the host was taken back (`lib.rs`).
//!
//! Signals: one the shim gets is sent on to the child, unless the terminal sent it (the
//! kernel, `SI_KERNEL`: the child, in the same foreground process group, got it too). A
//! signal the caller ignores stays ignored (the child inherits that, as with `exec`).
//! SIGKILL cannot be passed on, and netkit rsh is set-user-ID, which clears a parent-death
//! signal at its exec: a caller that SIGKILLs its rsh leaves the remote shell running until
//! its command ends (the job's end still ends that command, through its subagent).

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::launch::{self, Plan};

/// The signals passed on to the child.
pub const FORWARDED: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// The child's pid once it runs (0 before): read by the signal handler.
static CHILD: AtomicI32 = AtomicI32::new(0);

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this status.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
}

impl Ended {
    fn of(status: ExitStatus) -> Ended {
        match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Code(code),
            (None, Some(sig)) => Ended::Signal(sig),
            (None, None) => Ended::Code(1),
        }
    }

    /// Ends this process as the child ended: the same exit status, or killed by the same
    /// signal (its default action restored first); 128+signal when that does not end us.
    pub fn exit(self) -> ! {
        match self {
            Ended::Code(code) => std::process::exit(code),
            Ended::Signal(sig) => {
                // SAFETY: plain libc calls on this process; no Rust state is involved.
                unsafe {
                    libc::signal(sig, libc::SIG_DFL);
                    let mut set = empty_set();
                    libc::sigaddset(&mut set, sig);
                    libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
                    libc::raise(sig);
                }
                std::process::exit(128 + sig)
            }
        }
    }
}

/// Runs `plan` (environment as [`launch::exec`] sets it) as a child with the caller's stdio,
/// passing [`FORWARDED`] signals on to it, and waits for its end (`alloc`: the grant it
/// runs for, in the step times). `on_spawned` runs once the child runs, before the wait:
/// what need not delay the remote shell's start.
pub fn run(plan: &Plan, depth: u32, alloc: u64, on_spawned: impl FnOnce()) -> io::Result<Ended> {
    let mut cmd = launch::command(plan, depth);
    // Blocked until the child's pid is known, so that a signal in between is passed on
    // rather than lost; the child starts with an empty mask (std resets it).
    let previous = block_forwarded();
    install_handlers();
    steptimes::mark("shim.spawn", Some(alloc));
    let spawned = cmd.spawn();
    steptimes::mark("shim.spawned", Some(alloc));
    if let Ok(child) = &spawned {
        CHILD.store(child.id() as i32, Ordering::SeqCst);
    }
    restore_mask(&previous);
    let mut child = spawned?;
    on_spawned();
    let status = child.wait()?;
    Ok(Ended::of(status))
}

/// Sends `sig` on to the child, unless the terminal's driver sent it (it reached the child,
/// which shares our foreground process group, too).
extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo_t with SA_SIGINFO; kill is async-signal-safe.
    unsafe {
        if !info.is_null() && (*info).si_code == libc::SI_KERNEL {
            return;
        }
        let pid = CHILD.load(Ordering::SeqCst);
        if pid > 0 {
            libc::kill(pid, sig);
        }
    }
}

fn empty_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        set
    }
}

fn block_forwarded() -> libc::sigset_t {
    let mut set = empty_set();
    let mut previous = empty_set();
    // SAFETY: valid sets; this process is single-threaded.
    unsafe {
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        libc::sigprocmask(libc::SIG_BLOCK, &set, &mut previous);
    }
    previous
}

fn restore_mask(previous: &libc::sigset_t) {
    // SAFETY: a set filled by sigprocmask.
    unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, previous, std::ptr::null_mut());
    }
}

/// [`forward`] for each of [`FORWARDED`] the caller does not ignore.
fn install_handlers() {
    for sig in FORWARDED {
        // SAFETY: sigaction with a zeroed, then filled, struct; the handler only calls kill.
        unsafe {
            let mut old = std::mem::zeroed::<libc::sigaction>();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction == libc::SIG_IGN
            {
                continue;
            }
            let mut action = std::mem::zeroed::<libc::sigaction>();
            let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                forward;
            action.sa_sigaction = handler as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}
