//! A host daemon's session: its reports to the core, its host's allocations (the live ones
//! and those to end, [`crate::host_words`]) to it whenever they change, until the core
//! closes it or it goes away. Sessions run on the host daemons' runtime, in its turns
//! ([`super::turns`]): their events go to the core at the end of each turn, in order.

use super::{turns::Pace, *};
use crate::host_words::{HostWord, WordSender};

pub(super) async fn hostd_session<S>(
    mut conn: FramedConn<S>,
    ctx: &ServerCtx,
    host: String,
    mut shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let id = ctx.next_conn.fetch_add(1, Ordering::Relaxed);
    let (close_tx, mut close_rx) = oneshot::channel::<String>();
    // The core sets the host's word as it takes the connection, then at each change.
    let word_slot = WordSender::default();
    let connected = Event::HostdConnected {
        host: host.clone(),
        conn: id,
        close: close_tx,
        word: word_slot.clone(),
    };
    ctx.turns.queue(connected); // the daemon was welcomed when it authenticated
    let mut told = Told::default();
    let mut frames = HostdFrames::default();
    let mut last_allocs_running: Option<Vec<u64>> = None;
    let mut pace = Pace::default();
    // The waits for the broker's stop and for a word are made once, not per frame: each
    // made and dropped around every frame registered and unregistered a waiter under a
    // lock, twice a frame.
    let stopping = shutdown.changed();
    tokio::pin!(stopping);
    let next_word = word_slot.next();
    tokio::pin!(next_word);
    let reason = loop {
        tokio::select! {
            _ = &mut stopping => break "broker stopping".to_string(),
            why = &mut close_rx => break why.unwrap_or_else(|_| "closed by broker".into()),
            word = &mut next_word => {
                next_word.set(word_slot.next());
                if told.send(&mut conn, &word, ctx.sweep_live).await.is_err() {
                    break "connection closed".into();
                }
            }
            msg = conn.recv_line() => {
                ctx.turns.frame_read(&mut pace).await;
                let report = match msg.and_then(|line| frames.decode(line)) {
                    Ok(HostdFrame::Parsed(ToBroker::Report(mut report))) => {
                        last_allocs_running = report.allocs_running.take();
                        Reported::Whole(report)
                    }
                    Ok(HostdFrame::Changes(mut patch)) => {
                        if let Some(running) = patch.take_allocs_running() {
                            last_allocs_running = running;
                        }
                        Reported::Changes(patch)
                    }
                    Ok(HostdFrame::Same { seq }) => Reported::Same { seq },
                    // Boxed: rare, and 0.8 KiB of room every session would keep.
                    other => match Box::pin(other_frame(other, &host, &mut conn, ctx)).await {
                        Ok(()) => continue,
                        Err(why) => break why,
                    },
                };
                let report = Event::Report {
                    host: host.clone(),
                    conn: id,
                    report,
                    allocs_running: last_allocs_running.clone(),
                };
                let ends_allocs = last_allocs_running.is_some() && !told.ends_allocs;
                crate::web::METRICS.report();
                ctx.turns.queue(report);
                // A daemon that ends allocations past their deadline hears of them from now.
                if let Some(word) = ends_allocs.then(|| word_slot.current()).flatten() {
                    told.ends_allocs = true;
                    if told.send(&mut conn, &word, ctx.sweep_live).await.is_err() {
                        break "connection closed".into();
                    }
                }
            }
        }
    };
    ctx.turns.queue(Event::Disconnected {
        host,
        conn: id,
        reason,
    });
}

/// A frame from the daemon that is not a report: a pilot's lease goes to the core (`Ok`);
/// anything else, or a bad frame, is refused and ends the session (`Err`: why).
async fn other_frame<S>(
    frame: Result<HostdFrame, FrameError>,
    host: &str,
    conn: &mut FramedConn<S>,
    ctx: &ServerCtx,
) -> Result<(), String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match frame {
        Ok(HostdFrame::Parsed(ToBroker::PilotLease { slurm_job, ending })) => {
            ctx.turns.queue(Event::PilotLease {
                host: host.to_string(),
                slurm_job,
                ending,
            });
            Ok(())
        }
        Ok(HostdFrame::Parsed(other)) => {
            let why = format!("unexpected message from a host daemon: {}", short(&other));
            refuse(conn, ErrorCode::BadMessage, &why).await;
            Err(why)
        }
        Ok(HostdFrame::Same { .. } | HostdFrame::Changes(_)) => Ok(()), // the caller's
        Err(FrameError::Closed) => Err("connection closed".into()),
        Err(e) => {
            refuse(conn, ErrorCode::BadMessage, &e.to_string()).await;
            Err(e.to_string())
        }
    }
}

/// What one host daemon has been told of the live allocations.
#[derive(Debug, Default)]
struct Told {
    /// Its reports list the allocations running there: it ends those past their
    /// deadline when told (`FromBroker::EndAllocs`).
    ends_allocs: bool,
    live: Option<(Vec<u64>, u64)>,
    ending: Option<Vec<u64>>,
}

impl Told {
    /// Sends what changed in `word`: the live allocations where daemons sweep (`sweep`),
    /// those past their deadline to a daemon that ends them.
    async fn send<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        conn: &mut FramedConn<S>,
        word: &HostWord,
        sweep: bool,
    ) -> Result<(), FrameError> {
        let live = (word.live.clone(), word.issued_below);
        if sweep && self.live.as_ref() != Some(&live) {
            conn.send(&word.message()).await?;
            self.live = Some(live);
        }
        if self.ends_allocs && self.ending.as_ref() != Some(&word.ending) {
            conn.send(&word.end_message()).await?;
            self.ending = Some(word.ending.clone());
        }
        Ok(())
    }
}
