//! Overflow onto Slurm: pilots submitted and cancelled, and leases that end.

use super::*;

impl JobDesk {
    /// Overflow onto Slurm: the allocator asks for pilots (`settings`), which `pilots`
    /// submits and cancels.
    pub fn with_pilots(
        mut self,
        pilots: crate::pilots::Pilots,
        settings: allocation::OverflowSettings,
    ) -> Self {
        self.alloc.set_overflow(Some(settings));
        self.pilots = Some(pilots);
        self
    }

    /// `sbatch` answered for `pilot`.
    pub fn pilot_submitted(
        &mut self,
        pilot: PilotId,
        result: Result<String, String>,
        now: Instant,
    ) {
        match result {
            Ok(id) => self.alloc.pilot_submitted(pilot, id),
            Err(_) => self.alloc.pilot_failed(pilot, now),
        }
    }

    /// This broker's pilots that Slurm still has (found at start).
    pub fn pilots_found(&mut self, ids: Vec<String>, now: Instant) {
        self.alloc.pilots_found(ids, now);
    }

    /// `host`'s daemon says it runs in Slurm job `slurm_job`: asks Slurm how long the
    /// lease has left (answered as [`crate::core::Event::PilotLeaseLeft`]). Only a pilot's
    /// host (`slurm-<node>`) is asked for, and a job id that is not a number is not passed
    /// to Slurm.
    pub fn ask_lease(&self, host: String, slurm_job: String, ending: bool) {
        let Some(pilots) = &self.pilots else {
            return warn!(%host, %slurm_job, "a daemon names a Slurm job, but overflow is off");
        };
        if !config::pilot::is_pilot_host(&host) {
            return warn!(%host, %slurm_job, "a lab host's daemon names a Slurm job; ignored");
        }
        if !config::pilot::is_slurm_job_id(&slurm_job) {
            return warn!(%host, %slurm_job, "a daemon names a Slurm job that is not a job id");
        }
        pilots.lease_left(host, slurm_job, ending);
    }

    /// What Slurm says is `left` of `host`'s lease ([`Allocator::pilot_lease`]); when the
    /// lease ends, whatever holds the host is reclaimed by Slurm's deadline
    /// ([`Allocator::lease_ends`]).
    pub fn pilot_lease(
        &mut self,
        host: &str,
        slurm_job: &str,
        left: Option<Duration>,
        ending: bool,
        now: Instant,
    ) -> Vec<Effect> {
        let Some(grace) = self.alloc.pilot_lease(host, slurm_job, left, ending, now) else {
            return Vec::new();
        };
        info!(%host, %slurm_job, grace_s = grace.as_secs_f64(), "Slurm takes a pilot's node back");
        let input = Input::LeaseEnds {
            host: host.to_string(),
            grace_us: grace.as_micros() as u64,
        };
        self.handle(input, now).0
    }

    /// Cancels every pilot Slurm knows of (at shutdown).
    pub async fn cancel_pilots(&mut self) {
        if let Some(p) = &self.pilots {
            p.cancel_now(self.alloc.pilot_ids()).await;
        }
    }
}
