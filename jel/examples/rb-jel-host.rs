//! `rb-jel-host SOCKET [HOST [JEL]]`: hosts a JEL pool on SOCKET, as a job's agent does, and
//! takes the job's events from stdin, one per line; prints `ready` once the socket is bound
//! and `ok` after each event was handled (its lines written). The local tests and the
//! benchmark drive pools with it until the agent hosts them.
//!
//! HOST is the lab name of local members (default `front`); JEL the RSL `jel` value
//! (default `reliable,uniform`). Events:
//! ```text
//! granted HOST | reclaim HOST DEADLINE_UNIX_MS | released HOST | lost HOST
//! killed HOST PID | close | terminate
//! ```
//! EOF on stdin is `terminate`. Exit codes: 0 after `terminate`, 64 bad arguments, 1 the
//! socket could not be bound.

use std::time::Duration;

use jel::{
    host::{HostConfig, HostError, PoolHost},
    pool::{Input, PoolConfig},
};
use std::io::BufRead;

use tokio::sync::mpsc;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(socket), host, jel) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("usage: rb-jel-host SOCKET [HOST [JEL]]");
        std::process::exit(64);
    };
    let pool = match PoolConfig::from_rsl(jel.map_or("", String::as_str)) {
        Ok(pool) => pool,
        Err(e) => {
            eprintln!("rb-jel-host: {e}");
            std::process::exit(64);
        }
    };
    let host = host.map_or("front", String::as_str);
    let config = HostConfig::new(socket, host, pool);
    let (pool, _remote) = match PoolHost::bind(config) {
        Ok(bound) => bound,
        Err(e) => {
            eprintln!("rb-jel-host: {e}");
            std::process::exit(1);
        }
    };
    println!("ready");
    let mut lines = stdin_lines();
    while let Some(line) = lines.recv().await {
        let done = match parse(&line) {
            Ok(None) => break,
            Ok(Some(input)) => perform(&pool, input).await,
            Err(e) => {
                eprintln!("rb-jel-host: {e}");
                continue;
            }
        };
        if let Err(e) = done {
            eprintln!("rb-jel-host: {e}");
            std::process::exit(1);
        }
        println!("ok");
    }
    let end = tokio::time::timeout(Duration::from_secs(10), pool.terminate()).await;
    if !matches!(end, Ok(Ok(_))) {
        eprintln!("rb-jel-host: the pool did not end cleanly");
        std::process::exit(1);
    }
}

/// Stdin's lines, read by a thread of their own (the runtime has no async stdin here).
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// One line of stdin: the event, or `None` for `terminate`.
fn parse(line: &str) -> Result<Option<Input>, String> {
    let number = |s: &str| s.parse().map_err(|_| format!("`{s}` is not a number"));
    let host = |h: &str| h.to_string();
    let input = match line.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["granted", h] => Input::HostGranted { host: host(h) },
        ["reclaim", h, ms] => Input::Reclaim {
            host: host(h),
            deadline_ms: number(ms)?,
        },
        ["released", h] => Input::HostReleased { host: host(h) },
        ["lost", h] => Input::HostLost { host: host(h) },
        ["killed", h, pid] => Input::Killed {
            host: host(h),
            pid: u32::try_from(number(pid)?).map_err(|_| format!("bad pid `{pid}`"))?,
        },
        ["close"] => Input::Close,
        ["terminate"] => return Ok(None),
        _ => return Err(format!("unknown event `{line}`")),
    };
    Ok(Some(input))
}

/// The handle's method for an event, as the agent calls them.
async fn perform(pool: &PoolHost, input: Input) -> Result<(), HostError> {
    match input {
        Input::HostGranted { host } => pool.host_granted(&host).await,
        Input::Reclaim { host, deadline_ms } => pool.reclaim(&host, deadline_ms).await,
        Input::HostReleased { host } => pool.host_released(&host).await,
        Input::HostLost { host } => pool.host_lost(&host).await,
        Input::Killed { host, pid } => pool.killed(&host, pid).await,
        _ => pool.close().await,
    }
}
