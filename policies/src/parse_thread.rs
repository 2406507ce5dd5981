//! The policy parser's thread: one long-lived thread with a [`STACK`]-byte stack that runs
//! every parse of the process in turn (a policy file's TOML and its CEL expressions), so a
//! load never parses on its caller's stack (a tokio worker has 2 MiB; the CEL parser is
//! recursive and stack-hungry) and does not pay for a new 64 MiB thread each time.
//!
//! The thread starts with the first parse and ends after [`IDLE`] without one (the broker
//! reloads rarely: the stack pages it touched go back), the next parse starting it again. A
//! panic in a parse is caught on the thread: that parse's caller gets an error, the thread
//! serves the next one.

use std::{
    panic::{self, AssertUnwindSafe},
    sync::{
        mpsc::{self, Receiver, RecvTimeoutError, SendError, Sender},
        Mutex, MutexGuard, PoisonError,
    },
    time::Duration,
};

/// Stack of the parser thread: the ANTLR parser's frames are large in debug builds.
pub const STACK: usize = 64 * 1024 * 1024;

/// How long the thread waits for the next parse before it ends.
pub const IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// The running thread's queue; `None` when no thread runs. Jobs are sent with the lock
/// held, and the thread decides to end with it held, so no job is sent to a thread that
/// has decided to end.
static QUEUE: Mutex<Option<Sender<Job>>> = Mutex::new(None);

/// Why a parse did not run to its end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThreadError {
    #[error("the parser thread could not start: {0}")]
    Start(String),
    #[error("the parse panicked (a parser bug)")]
    Panicked,
}

/// Runs `parse` on the parser thread and waits for its result. Blocks: call it from a
/// blocking context, not from a tokio worker.
pub fn run<T: Send + 'static>(
    parse: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ThreadError> {
    let (reply, result) = mpsc::sync_channel(1);
    // A panic in `parse` drops `reply` unsent: `recv` below then fails.
    submit(Box::new(move || {
        let _ = reply.send(parse());
    }))?;
    result.recv().map_err(|_| ThreadError::Panicked)
}

fn queue() -> MutexGuard<'static, Option<Sender<Job>>> {
    QUEUE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Hands `job` to the running thread, starting one when none runs.
fn submit(job: Job) -> Result<(), ThreadError> {
    let mut queue = queue();
    let job = match queue.as_ref() {
        Some(running) => match running.send(job) {
            Ok(()) => return Ok(()),
            // The thread is gone (it cannot end without clearing `queue`, unless a panic
            // outside a job ended it): start another.
            Err(SendError(job)) => job,
        },
        None => job,
    };
    let (sender, jobs) = mpsc::channel();
    std::thread::Builder::new()
        .name("policy-parse".into())
        .stack_size(STACK)
        .spawn(move || serve(jobs))
        .map_err(|e| ThreadError::Start(e.to_string()))?;
    sender
        .send(job)
        .map_err(|_| ThreadError::Start("it ended at once".into()))?;
    *queue = Some(sender);
    Ok(())
}

/// The thread's loop: each job in turn, until [`IDLE`] passes without one.
fn serve(jobs: Receiver<Job>) {
    loop {
        let job = match jobs.recv_timeout(IDLE) {
            Ok(job) => job,
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {
                let mut queue = queue();
                match jobs.try_recv() {
                    Ok(job) => job,
                    Err(_) => {
                        *queue = None;
                        return;
                    }
                }
            }
        };
        // The job reports a panic to its caller itself (its reply is dropped unsent).
        let _ = panic::catch_unwind(AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_run_on_one_large_stack_thread_and_a_panic_is_an_error_not_the_end() {
        let name = || std::thread::current().name().map(str::to_string);
        assert_eq!(run(name), Ok(Some("policy-parse".to_string())));
        // Deeper than a 2 MiB stack holds: 4 MiB of locals, frame by frame.
        fn deep(n: usize) -> usize {
            let pad = std::hint::black_box([1u8; 4096]);
            if n == 0 {
                0
            } else {
                deep(n - 1) + usize::from(pad[n % 4096] > 0)
            }
        }
        assert_eq!(run(|| deep(1024)), Ok(1024));
        assert_eq!(
            run(|| -> u8 { panic!("a parser bug") }),
            Err(ThreadError::Panicked)
        );
        assert_eq!(run(|| 7), Ok(7), "the thread serves the next parse");
    }
}
