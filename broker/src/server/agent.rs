//! An agent's session: its registration, then its messages to the core (paced, one in
//! flight) and the core's messages from its outbox to it, until either side ends or the core
//! cuts it.

use super::*;

pub(super) async fn agent_session<S>(
    mut conn: FramedConn<S>,
    ctx: &ServerCtx,
    actor: &Actor,
    revoked: Revocation,
    shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if welcome(&mut conn, ctx).await.is_err() {
        return;
    }
    let mut reg = match conn.recv::<ToBroker>().await {
        Ok(ToBroker::Register(reg)) => reg,
        Ok(other) => {
            return refuse(
                &mut conn,
                ErrorCode::BadMessage,
                &format!("expected register, got {}", short(&other)),
            )
            .await
        }
        Err(_) => return,
    };
    // The job is the authenticated user's, whatever name the agent claims.
    reg.user = actor.name(&ctx.owner).to_string();
    let (tx, outbox) = outbox::channel(ctx.agent_outbox);
    let (reply_tx, reply_rx) = oneshot::channel();
    if ctx
        .events
        .send(Event::AgentRegister {
            reg,
            tx,
            reply: reply_tx,
        })
        .await
        .is_err()
    {
        return;
    }
    let job = match reply_rx.await {
        Ok(Ok(job)) => job,
        Ok(Err(why)) => return refuse(&mut conn, ErrorCode::Failed, &why).await,
        Err(_) => return,
    };
    let ended = agent_traffic(conn, ctx, job, outbox, actor, revoked, shutdown).await;
    if ended != AgentEnd::CutByCore {
        let _ = ctx.events.send(Event::AgentGone { job }).await;
    }
}

/// How an agent's connection ended.
#[derive(Debug, PartialEq, Eq)]
enum AgentEnd {
    /// It closed, failed, was refused or the broker stops.
    Closed,
    /// The core cut it (its outbox was full) and already ended its job.
    CutByCore,
}

/// Carries a registered agent's traffic: its messages to the core, and what the core
/// queued in its outbox to it, read and written at once, so that an agent that stops
/// reading blocks only its own writes (and fills its outbox, whereupon the core cuts it).
async fn agent_traffic<S>(
    conn: FramedConn<S>,
    ctx: &ServerCtx,
    job: crate::alloc::JobId,
    outbox: OutboxRx,
    actor: &Actor,
    mut revoked: Revocation,
    mut shutdown: watch::Receiver<bool>,
) -> AgentEnd
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut reader, mut writer) = conn.split();
    let OutboxRx {
        mut messages,
        mut cut,
    } = outbox;
    let writing = async {
        while let Some(msg) = messages.recv().await {
            if writer.send(&msg).await.is_err() {
                break;
            }
        }
    };
    let turns = Arc::new(Semaphore::new(AGENT_IN_FLIGHT));
    let mut pace = Pace::agent();
    let reading = async {
        loop {
            pace.wait().await;
            match reader.recv::<ToBroker>().await {
                Ok(msg) => {
                    let Ok(turn) = turns.clone().acquire_owned().await else {
                        return None;
                    };
                    let turn = Some(turn);
                    let event = Event::AgentMessage { job, msg, turn };
                    if ctx.events.send(event).await.is_err() {
                        return None;
                    }
                }
                Err(FrameError::Closed) => return None,
                Err(e) => return Some((ErrorCode::BadMessage, e.to_string())),
            }
        }
    };
    let refusal = tokio::select! {
        _ = shutdown.changed() => None,
        _ = revoked.revoked() => Some((ErrorCode::Auth, revoked_message(actor))),
        _ = &mut cut => return AgentEnd::CutByCore,
        () = writing => None,
        refusal = reading => refusal,
    };
    if let Some((code, why)) = refusal {
        // A peer that does not read is not waited for.
        let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, refuse(&mut writer, code, &why)).await;
    }
    AgentEnd::Closed
}
