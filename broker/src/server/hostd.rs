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
    let mut lease = LeaseAfterReport::default();
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
                let frame = msg.and_then(|line| frames.decode(line));
                let report = match read_frame(frame, &host, &mut last_allocs_running) {
                    FrameRead::Report(report) => report,
                    FrameRead::Other(event) => {
                        if let Some(event) = lease.told(event) {
                            ctx.turns.queue(event);
                        }
                        continue;
                    }
                    FrameRead::Refuse(why) => {
                        refuse(&mut conn, ErrorCode::BadMessage, &why).await;
                        break why;
                    }
                    FrameRead::End(why) => break why,
                };
                let row = word_slot.row();
                ctx.turns.queue(report_event(&host, id, row, report, &last_allocs_running));
                if let Some(event) = lease.reported() {
                    ctx.turns.queue(event);
                }
                // A daemon that ends allocations past their deadline hears of them from now.
                if let Some(word) = told.starts_ending(&last_allocs_running, &word_slot) {
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

/// What a session does with a frame it read.
pub(super) enum FrameRead {
    /// A report, to the core ([`report_event`]).
    Report(Reported),
    /// Another event for the core (a pilot's lease).
    Other(Event),
    /// Refused (the daemon is told why) and the session ends.
    Refuse(String),
    /// The session ends (why).
    End(String),
}

/// What a frame read from `host`'s daemon is: a report (whole, the last again, or what
/// changed; the allocations it says run kept in `last_allocs_running`), a pilot's lease,
/// or anything else, or a bad frame, which ends the session.
pub(super) fn read_frame(
    frame: Result<HostdFrame, FrameError>,
    host: &str,
    last_allocs_running: &mut Option<Vec<u64>>,
) -> FrameRead {
    match frame {
        Ok(HostdFrame::Parsed(ToBroker::Report(mut report))) => {
            *last_allocs_running = report.allocs_running.take();
            FrameRead::Report(Reported::Whole(report))
        }
        Ok(HostdFrame::Changes(mut patch)) => {
            if let Some(running) = patch.take_allocs_running() {
                *last_allocs_running = running;
            }
            FrameRead::Report(Reported::Changes(patch))
        }
        Ok(HostdFrame::Same { seq }) => FrameRead::Report(Reported::Same { seq }),
        Ok(HostdFrame::Parsed(ToBroker::PilotLease { slurm_job, ending })) => {
            FrameRead::Other(Event::PilotLease {
                host: host.to_string(),
                slurm_job,
                ending,
            })
        }
        Ok(HostdFrame::Parsed(other)) => FrameRead::Refuse(format!(
            "unexpected message from a host daemon: {}",
            short(&other)
        )),
        Err(FrameError::Closed) => FrameRead::End("connection closed".into()),
        Err(e) => FrameRead::Refuse(e.to_string()),
    }
}

/// A pilot's lease that its daemon tells before the connection's first report (as it
/// does: at once after its handshake) waits for that report: the allocator takes a lease
/// only for a host whose view it has, so a lease the core heard first was dropped and the
/// pilot's row never showed its Slurm job (found in the lab, under load, where the first
/// report came a turn after the lease).
#[derive(Debug, Default)]
pub(super) struct LeaseAfterReport {
    reported: bool,
    held: Option<Event>,
}

impl LeaseAfterReport {
    /// `event` (not a report) read: to the core now, or `None` while it waits.
    pub(super) fn told(&mut self, event: Event) -> Option<Event> {
        if self.reported || !matches!(event, Event::PilotLease { .. }) {
            return Some(event);
        }
        self.held = Some(event);
        None
    }

    /// A report went to the core: the lease that waited for it, if one did.
    pub(super) fn reported(&mut self) -> Option<Event> {
        self.reported = true;
        self.held.take()
    }
}

/// The core's event for a report of `host`'s daemon on connection `conn`, its record at
/// `row` as the core last said (counted in the metrics).
pub(super) fn report_event(
    host: &str,
    conn: u64,
    row: Option<u32>,
    report: Reported,
    allocs_running: &Option<Vec<u64>>,
) -> Event {
    crate::web::METRICS.report();
    Event::Report {
        host: host.to_string(),
        conn,
        row,
        report,
        allocs_running: allocs_running.clone(),
    }
}

/// What one host daemon has been told of the live allocations.
#[derive(Debug, Default)]
pub(super) struct Told {
    /// Its reports list the allocations running there: it ends those past their
    /// deadline when told (`FromBroker::EndAllocs`).
    ends_allocs: bool,
    live: Option<(Vec<u64>, u64)>,
    ending: Option<Vec<u64>>,
}

impl Told {
    /// The word to send a daemon whose reports now list the allocations running on its
    /// host (it ends those past their deadline): once, at its first such report.
    pub(super) fn starts_ending(
        &mut self,
        allocs_running: &Option<Vec<u64>>,
        word: &WordSender,
    ) -> Option<HostWord> {
        if allocs_running.is_none() || self.ends_allocs {
            return None;
        }
        let word = word.current()?;
        self.ends_allocs = true;
        Some(word)
    }

    /// The messages that tell a daemon what changed in `word` since it was last told: the
    /// live allocations where daemons sweep (`sweep`), those past their deadline to a
    /// daemon that ends them.
    pub(super) fn changes(&mut self, word: &HostWord, sweep: bool) -> Vec<FromBroker> {
        let mut messages = Vec::new();
        let live = (word.live.clone(), word.issued_below);
        if sweep && self.live.as_ref() != Some(&live) {
            messages.push(word.message());
            self.live = Some(live);
        }
        if self.ends_allocs && self.ending.as_ref() != Some(&word.ending) {
            messages.push(word.end_message());
            self.ending = Some(word.ending.clone());
        }
        messages
    }

    /// Sends what changed in `word`: the live allocations where daemons sweep (`sweep`),
    /// those past their deadline to a daemon that ends them.
    async fn send<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        conn: &mut FramedConn<S>,
        word: &HostWord,
        sweep: bool,
    ) -> Result<(), FrameError> {
        for message in self.changes(word, sweep) {
            conn.send(&message).await?;
        }
        Ok(())
    }
}
