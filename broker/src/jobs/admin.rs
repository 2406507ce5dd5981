//! Client requests about jobs (`rb jobs|release|drain|resume`), authorized here; `rb jobs`
//! rows with each job's notes.

use super::*;

impl JobDesk {
    /// `rb jobs` rows: the allocator's, plus each job's notes and its start and end times
    /// (unix seconds, from the allocator's "how long ago").
    pub(super) fn job_rows(&mut self, now: Instant) -> Vec<serde_json::Value> {
        let rows = self.alloc.jobs(now);
        let known: HashSet<JobId> = rows.iter().map(|r| r.id).collect();
        self.notes.retain(|job, _| known.contains(job));
        let wall = SystemTime::now();
        let unix = |ago: Option<Duration>| {
            ago.and_then(|a| wall.checked_sub(a))
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
        };
        rows.iter()
            .filter_map(|row| {
                let mut v = serde_json::to_value(row).ok()?;
                let notes = self
                    .notes
                    .get(&row.id)
                    .map(|n| n.iter().collect::<Vec<_>>());
                v["notes"] = serde_json::json!(notes.unwrap_or_default());
                v["started_at"] = serde_json::json!(unix(row.started_ago));
                v["ended_at"] = serde_json::json!(unix(row.ended_ago));
                Some(v)
            })
            .collect()
    }

    /// An admin input: its effects, or why the allocator refused it.
    pub(super) fn admin_input(
        &mut self,
        input: Input,
        now: Instant,
    ) -> Result<Vec<Effect>, String> {
        match self.handle(input, now) {
            (_, Answer::Refused(e)) => Err(e.to_string()),
            (effects, _) => Ok(effects),
        }
    }

    /// The user of the job holding `host`, if a job holds it.
    pub(super) fn holder_user(&self, host: &str) -> Option<String> {
        let (job, _) = self.alloc.holder(host)?;
        self.alloc.job_info(job).map(|i| i.user.clone())
    }

    /// Client requests about jobs, from `actor` (authorized here: whether a user may
    /// release a host depends on whose job holds it).
    pub fn admin(
        &mut self,
        actor: &Actor,
        req: Request,
        now: Instant,
    ) -> (Result<Response, AdminError>, Vec<Effect>) {
        if let Err(refusal) = authorize(actor, &req, |h| self.holder_user(h)) {
            return (Err(refusal.into()), Vec::new());
        }
        let (answer, effects) = self.admin_allowed(req, now);
        (answer.map_err(AdminError::Failed), effects)
    }

    pub(super) fn admin_allowed(
        &mut self,
        req: Request,
        now: Instant,
    ) -> (Result<Response, String>, Vec<Effect>) {
        match req {
            Request::Jobs => {
                let jobs = self.job_rows(now);
                (Ok(Response::Jobs { jobs }), Vec::new())
            }
            Request::Release { host, grace_ms } => {
                let grace = grace_ms.map_or(DEFAULT_RELEASE_GRACE, Duration::from_millis);
                if grace > MAX_RELEASE_GRACE {
                    let max = MAX_RELEASE_GRACE.as_millis();
                    let e = format!("grace_ms {} is out of range (0–{max})", grace.as_millis());
                    return (Err(e), Vec::new());
                }
                let holder = self.alloc.holder(&host);
                let input = Input::ReleaseHost {
                    host: host.clone(),
                    grace_us: grace.as_micros() as u64,
                };
                match self.admin_input(input, now) {
                    Ok(effects) => {
                        let message = match holder {
                            Some((job, _)) => format!(
                                "reclaiming {host} from job {job} (grace {:.1} s)",
                                grace.as_secs_f64()
                            ),
                            None => format!("{host} released"),
                        };
                        (Ok(Response::Done { message }), effects)
                    }
                    Err(e) => (Err(e), Vec::new()),
                }
            }
            Request::Drain { host } => {
                match self.admin_input(Input::Drain { host: host.clone() }, now) {
                    Ok(effects) => (
                        Ok(Response::Done {
                            message: format!("{host} drained: no new grants"),
                        }),
                        effects,
                    ),
                    Err(e) => (Err(e), Vec::new()),
                }
            }
            Request::Resume { host } => {
                match self.admin_input(Input::Resume { host: host.clone() }, now) {
                    Ok(effects) => (
                        Ok(Response::Done {
                            message: format!("{host} resumed"),
                        }),
                        effects,
                    ),
                    Err(e) => (Err(e), Vec::new()),
                }
            }
            other => (Err(format!("not a job request: {other:?}")), Vec::new()),
        }
    }
}
