//! What a client's request does once its connection is authenticated: authorize it
//! ([`crate::authz`]; the job desk does it for the requests it answers, since whether a user
//! may release a host depends on whose job holds it), carry it out, and write the audit
//! line ([`crate::audit`]) for every refusal and every admin request carried out or failed.

use proto::{
    frame::FrameError,
    msg::{Request, Response},
    row_parts,
};
use tokio::sync::oneshot;
use tracing::info;

use crate::{
    audit::{AuditEntry, Outcome},
    authz::{self, Actor, AdminError},
    core::Event,
    hosts::StatusPart,
    server::ServerCtx,
};

/// What a request is answered with.
#[derive(Debug)]
pub enum Reply {
    Response(Response),
    /// `rb status`: the rows that [`Response::Status`] carries, in the parts the core
    /// keeps (`status_rows`); [`status_frame`] joins them into the answer, off the core.
    StatusRows(Vec<StatusPart>),
}

/// Answers one request and writes the audit line: every refusal, and every admin
/// request carried out or failed.
pub async fn respond(
    ctx: &ServerCtx,
    req: Request,
    local: bool,
    peer: &str,
    actor: &Actor,
) -> Result<Reply, AdminError> {
    let action = authz::action(&req);
    let target = authz::target(&req).map(String::from);
    let admin = authz::is_admin(&req);
    let result = answer(ctx, req, local, peer, actor).await;
    let (outcome, reason) = match &result {
        Err(AdminError::Denied(r)) => (Outcome::Refused, Some(r.why.clone())),
        Err(AdminError::Failed(why)) if admin => (Outcome::Failed, Some(why.clone())),
        Ok(_) if admin => (Outcome::Ok, None),
        _ => return result,
    };
    ctx.audit.record(AuditEntry {
        time_unix: 0,
        who: actor.name(&ctx.owner).to_string(),
        action: action.to_string(),
        target,
        outcome,
        reason,
    });
    result
}

async fn answer(
    ctx: &ServerCtx,
    req: Request,
    local: bool,
    peer: &str,
    actor: &Actor,
) -> Result<Reply, AdminError> {
    if let Request::Status = req {
        authz::authorize(actor, &req, |_| None)?;
        return status_rows(ctx).await.map(Reply::StatusRows);
    }
    answer_response(ctx, req, local, peer, actor)
        .await
        .map(Reply::Response)
}

/// The rows of every host, as `rb status` gets them: the core hands over each row in parts
/// ([`Event::StatusParts`]: the fixed part as kept encoded), joined off the core.
async fn status_rows(ctx: &ServerCtx) -> Result<Vec<StatusPart>, AdminError> {
    let stopping = || AdminError::Failed("broker stopping".to_string());
    let (tx, rx) = oneshot::channel();
    ctx.events
        .send(Event::StatusParts { reply: tx })
        .await
        .map_err(|_| stopping())?;
    rx.await.map_err(|_| stopping())
}

/// The response frame to status request `id` with the rows `parts` make: what
/// `proto::frame::encode` writes for `Response::Status` with these rows, written once
/// into one buffer.
pub fn status_frame(id: u64, parts: &[StatusPart]) -> Result<Vec<u8>, FrameError> {
    let (head, tail) = proto::frame::status_envelope(id)?;
    let rows_len: usize = parts.iter().map(|p| p.fixed_json.len() + 200).sum();
    let mut frame = Vec::with_capacity(head.len() + rows_len + tail.len());
    frame.extend_from_slice(head.as_bytes());
    join_rows_into(&mut frame, parts).map_err(|e| FrameError::Malformed(e.to_string()))?;
    frame.extend_from_slice(tail.as_bytes());
    Ok(frame)
}

/// Appends the JSON array of the rows `parts` make.
pub fn join_rows_into(out: &mut Vec<u8>, parts: &[StatusPart]) -> serde_json::Result<()> {
    out.push(b'[');
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        row_parts::write_row(out, &part.fixed_json, &part.live)?;
    }
    out.push(b']');
    Ok(())
}

async fn answer_response(
    ctx: &ServerCtx,
    req: Request,
    local: bool,
    peer: &str,
    actor: &Actor,
) -> Result<Response, AdminError> {
    let at_desk = matches!(
        req,
        Request::Jobs | Request::Release { .. } | Request::Drain { .. } | Request::Resume { .. }
    );
    if !at_desk {
        authz::authorize(actor, &req, |_| None)?;
    }
    let failed = AdminError::Failed;
    let stopping = || AdminError::Failed("broker stopping".to_string());
    match req {
        // Answered in parts by `answer` (status_rows), before this.
        Request::Status => Err(failed("status is answered by status_rows".into())),
        Request::Shutdown if local => {
            info!(%peer, "shutdown requested");
            let _ = ctx.stop.send(true);
            Ok(Response::Ok)
        }
        Request::Shutdown => Err(failed(
            "shutdown is only accepted on the local control socket".into(),
        )),
        Request::PolicyReload => {
            info!(%peer, "policy reload requested");
            let policy = ctx
                .policy
                .reload("rb policy reload")
                .await
                .map_err(failed)?;
            Ok(Response::Policy { policy })
        }
        Request::UserAdd { name, out } => {
            let path = ctx
                .users
                .add(&name, out.as_deref())
                .map_err(|e| failed(e.to_string()))?;
            info!(%peer, user = %name, path = %path.display(), "user added");
            Ok(Response::UserAdded {
                name,
                path: path.display().to_string(),
            })
        }
        Request::UserList => Ok(Response::Users {
            users: ctx.users.list(),
        }),
        Request::UserRevoke { name } => {
            ctx.users.revoke(&name).map_err(|e| failed(e.to_string()))?;
            info!(%peer, user = %name, "user revoked");
            Ok(Response::Done {
                message: format!("user {name} revoked; their connections are closed"),
            })
        }
        Request::PolicyShow => Ok(Response::Policy {
            policy: ctx.policy.info(),
        }),
        Request::PolicyExplain { host, job } => {
            let (tx, rx) = oneshot::channel();
            ctx.events
                .send(Event::Explain {
                    host,
                    job,
                    reply: tx,
                })
                .await
                .map_err(|_| stopping())?;
            let explain = rx.await.map_err(|_| stopping())?.map_err(failed)?;
            Ok(Response::Explain { explain })
        }
        req @ (Request::Jobs
        | Request::Release { .. }
        | Request::Drain { .. }
        | Request::Resume { .. }) => {
            let (tx, rx) = oneshot::channel();
            let actor = actor.clone();
            ctx.events
                .send(Event::Admin {
                    actor,
                    req,
                    reply: tx,
                })
                .await
                .map_err(|_| stopping())?;
            rx.await.map_err(|_| stopping())?
        }
    }
}
