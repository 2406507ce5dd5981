//! The `[web]` listener: `/metrics` for Prometheus and a JSON view of the lab, served by
//! hyper (HTTP/1) on the broker's runtime.
//!
//! - `GET /metrics`: every metric of [`metrics`](mod@metrics), in Prometheus text format 0.0.4, or in
//!   OpenMetrics when the `Accept` header asks for `application/openmetrics-text`. Public.
//! - `GET /`: the status page ([`page`]), refreshing itself from `/api/status`. Public.
//! - `GET /api/usage.svg`: the utilization chart of the last hours, from the broker's own
//!   decision trace ([`usage`]); the page shows it too. Public (host states only).
//! - `GET /api/status`: each host's name, state, allocation state and holder, and the
//!   waiting requests (job id, what they ask for, why they wait). Public.
//! - `GET /api/jobs`: the `rb jobs` rows (argv, directory, user, notes): the same right as
//!   `rb jobs`, i.e. `Authorization: Bearer TOKEN` with the token the broker keeps in
//!   `STATE_DIR/web-token` (mode 0600, its owner's), unless the lab file says
//!   `[web] jobs = "public"` (loopback listeners only; `config` refuses it otherwise).
//!
//! The gauges and the JSON come from the same rows `rb status` and `rb jobs` are answered
//! from (an event to the core, answered in turn like theirs); counters are atomics the core
//! bumps. Nothing the core does waits for this listener.

pub mod metrics;
pub mod page;
pub mod usage;

use std::{
    convert::Infallible, io::Read, os::unix::fs::OpenOptionsExt, path::Path, sync::Arc,
    time::Duration,
};

use bytes::Bytes;
use config::JobAccess;
use http_body_util::Full;
use hyper::{
    body::Incoming, header, server::conn::http1, service::service_fn, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use proto::{
    msg::{Request as RbRequest, Response as RbResponse},
    report::{HostState, HostStatus},
};
use tokio::{
    net::TcpListener,
    sync::{oneshot, watch, Semaphore},
};
use tracing::warn;

pub use metrics::METRICS;

use crate::{
    authz::Actor,
    core::{Event, EventSender},
};

/// Connections served at once; more wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 64;
/// How long a client may take to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the rows may take to come from the core.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(20);

/// What every request is answered from.
pub struct WebCtx {
    pub events: EventSender,
    pub jobs: JobAccess,
    /// The bearer token for job details (`None` with `jobs = "public"`).
    pub token: Option<String>,
    /// The utilization chart.
    pub usage: usage::UsageChart,
}

type Reply = Response<Full<Bytes>>;

/// Serves `listener` until `shutdown` fires.
pub async fn serve(listener: TcpListener, ctx: Arc<WebCtx>, mut shutdown: watch::Receiver<bool>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let permit = tokio::select! {
            _ = shutdown.changed() => return,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let stream = tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!(error = %e, "web: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let ctx = ctx.clone();
                async move { Ok::<_, Infallible>(handle(&ctx, &req).await) }
            });
            let _ = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            drop(permit);
        });
    }
}

async fn handle(ctx: &WebCtx, req: &Request<Incoming>) -> Reply {
    if req.method() != hyper::Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served here\n");
    }
    match req.uri().path() {
        "/metrics" => metrics(ctx, req).await,
        "/api/status" => match public_status(&ctx.events).await {
            Some(status) => json(&status),
            None => unavailable(),
        },
        "/" => match public_status(&ctx.events).await {
            Some(status) => respond(
                StatusCode::OK,
                "text/html; charset=utf-8",
                page::render(&status, &ctx.usage.svg().await).into(),
            ),
            None => unavailable(),
        },
        "/api/usage.svg" => respond(
            StatusCode::OK,
            "image/svg+xml",
            Bytes::from(ctx.usage.svg().await.as_bytes().to_vec()),
        ),
        "/api/jobs" => {
            if !allowed(ctx, req) {
                return unauthorized();
            }
            match jobs(&ctx.events).await {
                Some(rows) => json(&serde_json::json!({ "jobs": rows })),
                None => unavailable(),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found; this listener serves /, /metrics, /api/status, /api/usage.svg and /api/jobs\n",
        ),
    }
}

async fn metrics(ctx: &WebCtx, req: &Request<Incoming>) -> Reply {
    let (Some(hosts), Some(jobs)) = (hosts(&ctx.events).await, jobs(&ctx.events).await) else {
        return unavailable();
    };
    METRICS.set_snapshot(&hosts, &jobs);
    let openmetrics = req
        .headers()
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let (body, kind) = if openmetrics {
        (
            METRICS.encode(true),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (
            METRICS.encode(false),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    respond(StatusCode::OK, kind, body.into())
}

/// The `rb status` rows: their parts from the core (as `rb status` gets them, built a
/// piece at a time between other events), made whole rows off it.
async fn hosts(events: &EventSender) -> Option<Vec<HostStatus>> {
    let (reply, rx) = oneshot::channel();
    let ask = async {
        events.send(Event::StatusParts { reply }).await.ok()?;
        rx.await.ok()
    };
    let parts = tokio::time::timeout(SNAPSHOT_TIMEOUT, ask)
        .await
        .ok()
        .flatten()?;
    let rows = tokio::task::spawn_blocking(move || {
        let mut unread = 0;
        let rows: Vec<HostStatus> = parts
            .iter()
            .filter_map(|part| part.to_row().map_err(|_| unread += 1).ok())
            .collect();
        if unread > 0 {
            // A row is written from the broker's own parts: a defect, said and survived.
            tracing::warn!(
                unread,
                "hosts' status rows could not be read back; left out"
            );
        }
        rows
    });
    rows.await.ok()
}

/// The `rb jobs` rows, from the core (asked as the broker's owner).
async fn jobs(events: &EventSender) -> Option<Vec<serde_json::Value>> {
    let (reply, rx) = oneshot::channel();
    let ask = async {
        let event = Event::Admin {
            actor: Actor::Owner,
            req: RbRequest::Jobs,
            reply,
        };
        events.send(event).await.ok()?;
        match rx.await.ok()? {
            Ok(RbResponse::Jobs { jobs }) => Some(jobs),
            _ => None,
        }
    };
    tokio::time::timeout(SNAPSHOT_TIMEOUT, ask)
        .await
        .ok()
        .flatten()
}

/// The public view (`/api/status`, the page): hosts, and the waiting requests by job id
/// with why they wait (no user, command line or directory).
async fn public_status(events: &EventSender) -> Option<serde_json::Value> {
    let hosts = hosts(events).await?;
    let jobs = jobs(events).await?;
    let waiting: Vec<serde_json::Value> = jobs
        .iter()
        .flat_map(|j| {
            let id = j["id"].clone();
            j["waiting"].as_array().into_iter().flatten().map(move |w| {
                serde_json::json!({
                    "job": id,
                    "symbolic": w["symbolic"],
                    "position": w["position"],
                    "reason_code": w["reason_code"],
                    "reason": w["reason"],
                })
            })
        })
        .collect();
    Some(serde_json::json!({ "hosts": public_rows(&hosts), "waiting": waiting }))
}

/// What anyone may see of a host: no sessions, no user names.
fn public_rows(rows: &[HostStatus]) -> Vec<serde_json::Value> {
    rows.iter()
        .map(|h| {
            serde_json::json!({
                "name": h.name,
                "state": match h.state { HostState::Up => "up", HostState::Down => "down" },
                "alloc_state": h.alloc_state,
                "held_by": h.held_by,
                "private": h.owner.is_some(),
                "owner_active": h.owner.is_some() && !h.users.is_empty(),
            })
        })
        .collect()
}

fn allowed(ctx: &WebCtx, req: &Request<Incoming>) -> bool {
    if ctx.jobs == JobAccess::Public {
        return true;
    }
    let Some(token) = &ctx.token else {
        return false;
    };
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| same(given.trim().as_bytes(), token.as_bytes()))
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of `STATE_DIR/web-token`, made (mode 0600) when missing.
pub fn load_or_create_token(state_dir: &Path) -> std::io::Result<String> {
    let path = state_dir.join(config::WEB_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if t.trim().len() >= 32 => return Ok(t.trim().to_string()),
        Ok(_) => std::fs::remove_file(&path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut raw)?;
    let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    std::io::Write::write_all(&mut f, format!("{token}\n").as_bytes())?;
    Ok(token)
}

fn json(value: &serde_json::Value) -> Reply {
    respond(StatusCode::OK, "application/json", value.to_string().into())
}

fn unavailable() -> Reply {
    text(
        StatusCode::SERVICE_UNAVAILABLE,
        "the broker is stopping or busy; try again\n",
    )
}

fn unauthorized() -> Reply {
    let mut r = text(
        StatusCode::UNAUTHORIZED,
        "job details need the broker's web token: send `Authorization: Bearer TOKEN` with \
         the token of STATE_DIR/web-token (readable by the broker's owner only)\n",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer realm=\"rb-broker\""),
    );
    r
}

fn text(status: StatusCode, body: &'static str) -> Reply {
    respond(
        status,
        "text/plain; charset=utf-8",
        Bytes::from_static(body.as_bytes()),
    )
}

fn respond(status: StatusCode, kind: &'static str, body: Bytes) -> Reply {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(kind));
    r
}
