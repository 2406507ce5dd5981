//! Hosts a job uses without holding them — the machine its agent runs on, hosts it added by
//! name (`pvm> add node05`) — which are never granted to it (PVM and LAM refuse a host of
//! their virtual machine twice), and finding the lab host an agent names by address or
//! name. Soft state like the host views: agents tell it again when they re-register.

use std::time::Instant;

use super::{
    host::HostView,
    state::{Allocator, Fx},
    Effect, JobId,
};

impl Allocator {
    /// `job` uses `hosts` (lab host names, see [`lab_host`](Self::lab_host)) without
    /// holding them: none is ever granted to it (a PVM or LAM job refuses a second daemon on
    /// a host of its virtual machine). A queued request of the job that no other host can
    /// ever serve is refused. Ignored for a job that is not running.
    pub fn uses_hosts(
        &mut self,
        job: JobId,
        hosts: impl IntoIterator<Item = String>,
        now: Instant,
    ) -> Vec<Effect> {
        let mut fx = Fx::default();
        if self.is_running(job) {
            let set = self.in_use.entry(job).or_default();
            let before = set.len();
            set.extend(hosts);
            if set.len() != before {
                self.serve(now, &mut fx);
            }
        }
        self.finish(fx)
    }

    /// Whether `job` uses `host` without holding it ([`uses_hosts`](Self::uses_hosts)).
    pub fn uses(&self, job: JobId, host: &str) -> bool {
        self.in_use.get(&job).is_some_and(|s| s.contains(host))
    }

    /// The lab host called `name` or at address `name`: the address first, then the name
    /// (case-insensitive), then its first label (`node05.lab.example` → `node05`). Never the
    /// host name a daemon reports: virtual hosts on one machine (the embedded broker, a local
    /// lab) all report that machine's name, which would make the first of them the agent's.
    pub fn lab_host(&self, name: &str) -> Option<String> {
        let short = name.split('.').next().unwrap_or(name);
        let by = |f: &dyn Fn(&HostView) -> bool| self.views().find(|v| f(v));
        by(&|v| v.address == name)
            .or_else(|| by(&|v| v.name.eq_ignore_ascii_case(name)))
            .or_else(|| by(&|v| !short.is_empty() && v.name.eq_ignore_ascii_case(short)))
            .map(|v| v.name.clone())
    }

    /// The lab host of a machine known by its host name and addresses: one of the
    /// addresses first (loopback addresses never count), else the name.
    pub fn lab_host_of(&self, hostname: &str, addresses: &[String]) -> Option<String> {
        let loopback = |a: &str| {
            a.parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
        };
        addresses
            .iter()
            .filter(|a| !loopback(a))
            .find_map(|a| self.views().find(|v| v.address == *a))
            .map(|v| v.name.clone())
            .or_else(|| self.lab_host(hostname))
    }
}
