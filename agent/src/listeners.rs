//! The agent's two listeners and their per-connection tasks:
//! - the job-local unix socket where shims ask for hosts (same uid only, SO_PEERCRED);
//! - the TCP port where subagents on allocated hosts report (the job's own key,
//!   [`crate::jobkey`]; HMAC handshake).
//!
//! Tasks turn traffic into [`Event`]s for the agent's shell and carry its answers back; a
//! shim's `taken_back` question is answered by its task at once from the [`TakenBackBook`]
//! the shell publishes (the question comes when a remote shell ends, just when the host's
//! subagent link and give-back keep the shell busy).

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
};

use proto::{
    agent::{ShimReply, ShimRequest},
    auth::Secret,
    frame::{FrameError, FramedConn},
    handshake::{refuse, server_handshake, ServerAuth},
    msg::{ErrorCode, FromBroker, Hello, ToBroker},
    peercred,
};
use tokio::{
    net::{TcpListener, UnixListener},
    sync::mpsc,
};
use tracing::{debug, warn};

/// What listeners tell the agent's shell (which turns them into the core's inputs).
#[derive(Debug)]
pub enum Event {
    ShimAllocate {
        conn: u64,
        symbolic: String,
        /// The shim's pid (its caller is its parent).
        pid: u32,
        reply: mpsc::Sender<ShimReply>,
    },
    ShimAttach {
        conn: u64,
        host: String,
        reply: mpsc::Sender<ShimReply>,
    },
    /// A job process looked a symbolic name up (`librb_preload.so`).
    Resolved {
        symbolic: String,
        pid: u32,
    },
    /// The shim passed a call to this real host (not the job's) through (a module job
    /// then uses it by name).
    Named {
        host: String,
    },
    /// Which remote shell a shim call used (a `via` line).
    RouteUsed {
        line: String,
    },
    ShimGone {
        conn: u64,
    },
    SubConnected {
        alloc: u64,
        sub: u64,
        tx: mpsc::Sender<FromBroker>,
    },
    SubMessage {
        alloc: u64,
        sub: u64,
        msg: ToBroker,
    },
    SubGone {
        alloc: u64,
        sub: u64,
    },
    /// A module program finished (see [`crate::module`]).
    ModuleDone(crate::module::Outcome),
    /// The process `pid` that was granted `alloc` (shim, then remote shell) ended.
    LauncherExited {
        alloc: u64,
        pid: u32,
    },
}

/// Messages queued for one subagent link (commands and JEL batches).
pub const SUB_QUEUE: usize = 4096;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// The allocations the broker took back from the job (`alloc → (host, why)`), as the core
/// last had them (`AgentCore::taken_back_book`, published by the shell after each input):
/// a `taken_back` question is answered from it at once.
pub type TakenBackBook = Arc<Mutex<HashMap<u64, (String, String)>>>;

/// Serves shims until the listener is dropped.
pub async fn serve_shims(listener: UnixListener, events: mpsc::Sender<Event>, book: TakenBackBook) {
    let uid = nix::unistd::getuid().as_raw();
    while let Ok((stream, _)) = listener.accept().await {
        if peercred::peer_uid(&stream) != Some(uid) {
            warn!("refused a shim connection from another uid");
            continue;
        }
        tokio::spawn(shim_conn(
            FramedConn::new(stream),
            events.clone(),
            book.clone(),
        ));
    }
}

/// The answer to a shim's `taken_back` question about `alloc`.
fn taken_back_reply(book: &TakenBackBook, alloc: u64) -> ShimReply {
    let known = book
        .lock()
        .map(|b| b.get(&alloc).cloned())
        .unwrap_or_else(|poisoned| poisoned.into_inner().get(&alloc).cloned());
    match known {
        Some((host, message)) => ShimReply::TakenBack {
            alloc,
            host,
            message,
        },
        None => ShimReply::NotTakenBack { alloc },
    }
}

async fn shim_conn(
    mut conn: FramedConn<tokio::net::UnixStream>,
    events: mpsc::Sender<Event>,
    book: TakenBackBook,
) {
    let id = next_id();
    let (tx, mut rx) = mpsc::channel(8);
    let event = match conn.recv::<ShimRequest>().await {
        Ok(ShimRequest::Allocate { symbolic, pid }) => Event::ShimAllocate {
            conn: id,
            symbolic,
            pid,
            reply: tx,
        },
        Ok(ShimRequest::Attach { host, .. }) => Event::ShimAttach {
            conn: id,
            host,
            reply: tx,
        },
        Ok(ShimRequest::TakenBack { alloc, .. }) => {
            steptimes::mark("agent.taken_back_asked", Some(alloc));
            let _ = conn.send(&taken_back_reply(&book, alloc)).await;
            return;
        }
        Ok(ShimRequest::Resolved { symbolic, pid }) => {
            let _ = events.send(Event::Resolved { symbolic, pid }).await;
            return;
        }
        Ok(ShimRequest::Named { host, via, .. }) => {
            let _ = events.send(Event::Named { host }).await;
            if let Some(line) = via {
                let _ = events.send(Event::RouteUsed { line }).await;
            }
            return;
        }
        Ok(ShimRequest::Used { via, .. }) => {
            let _ = events.send(Event::RouteUsed { line: via }).await;
            return;
        }
        Err(e) => return debug!(error = %e, "bad shim request"),
    };
    if events.send(event).await.is_err() {
        return;
    }
    loop {
        tokio::select! {
            reply = rx.recv() => {
                let Some(reply) = reply else { break };
                let last = !matches!(reply, ShimReply::Queued { .. });
                if conn.send(&reply).await.is_err() || last {
                    break;
                }
            }
            msg = conn.recv_line() => {
                if matches!(msg, Err(FrameError::Closed) | Err(_)) {
                    let _ = events.send(Event::ShimGone { conn: id }).await;
                    return;
                }
            }
        }
    }
}

/// The allocation a subagent's hello names (its `name` is the allocation id), if any.
pub fn subagent_alloc(hello: &Hello) -> Option<u64> {
    hello.name.parse().ok()
}

/// Serves subagents until the listener is dropped.
pub async fn serve_subagents(
    listener: TcpListener,
    secret: Arc<Secret>,
    events: mpsc::Sender<Event>,
) {
    while let Ok((stream, peer)) = listener.accept().await {
        let _ = stream.set_nodelay(true);
        tokio::spawn(sub_conn(
            FramedConn::new(stream),
            secret.clone(),
            events.clone(),
            peer.to_string(),
        ));
    }
}

async fn sub_conn(
    mut conn: FramedConn<tokio::net::TcpStream>,
    secret: Arc<Secret>,
    events: mpsc::Sender<Event>,
    peer: String,
) {
    let hs = server_handshake(&mut conn, ServerAuth::Secret(&secret));
    let hello = match tokio::time::timeout(std::time::Duration::from_secs(5), hs).await {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return warn!(%peer, error = %e, "subagent refused"),
        Err(_) => return warn!(%peer, "subagent handshake timed out"),
    };
    let Some(alloc) = subagent_alloc(&hello) else {
        return refuse(
            &mut conn,
            ErrorCode::BadMessage,
            "subagent name must be an allocation id",
        )
        .await;
    };
    if conn
        .send(&FromBroker::Welcome {
            report_interval_ms: 2000,
            report_changes: false,
        })
        .await
        .is_err()
    {
        return;
    }
    let sub = next_id();
    // Room for the pool's lines to the subagent's JEL members too: the agent's shell never
    // waits on them (a full queue cuts the connection off, see `crate::run`).
    let (tx, mut rx) = mpsc::channel(SUB_QUEUE);
    if events
        .send(Event::SubConnected { alloc, sub, tx })
        .await
        .is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(cmd) => if conn.send(&cmd).await.is_err() { break },
                None => break,
            },
            msg = conn.recv::<ToBroker>() => match msg {
                Ok(msg) => { let _ = events.send(Event::SubMessage { alloc, sub, msg }).await; }
                Err(_) => break,
            },
        }
    }
    let _ = events.send(Event::SubGone { alloc, sub }).await;
}
