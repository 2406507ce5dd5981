//! The labs of this machine, found through their manifests in `/var/tmp/rb-lab-*`, and the
//! reaping of stale ones (their creating process died without tearing them down, e.g. a
//! SIGKILLed test run). Detached labs (`rb lab up`) are never stale.

use std::net::Ipv4Addr;
use std::path::PathBuf;

use crate::creator::Creator;
use crate::manifest::{lab_dirs, MachineLock, Manifest};
use crate::Lab;

/// One lab of this machine, as its manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabSummary {
    /// The lab directory.
    pub dir: PathBuf,
    /// Subnet number S, if the manifest could be read.
    pub subnet: Option<u8>,
    /// The owning process (`None` when detached or unreadable).
    pub owner_pid: Option<u32>,
    /// Whether that owner is still alive (true for detached labs: nobody owns them).
    pub owner_alive: bool,
    /// Left running on purpose by `rb lab up`.
    pub detached: bool,
    /// Who made it, from which checkout (`None` for labs of earlier versions).
    pub made_by: Option<Creator>,
    /// Hosts with their addresses and whether they run.
    pub hosts: Vec<HostSummary>,
    /// Why the manifest could not be read, if it could not.
    pub problem: Option<String>,
}

/// One host in a [`LabSummary`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSummary {
    /// Host name.
    pub name: String,
    /// Its address.
    pub address: Ipv4Addr,
    /// Whether its process tree is alive.
    pub running: bool,
    /// Whether its link is down.
    pub partitioned: bool,
}

impl LabSummary {
    /// Whether the lab's creator died without tearing it down.
    pub fn is_stale(&self) -> bool {
        self.problem.is_none() && !self.detached && !self.owner_alive
    }
}

/// Every lab on this machine, from its manifest.
pub fn list_labs() -> Vec<LabSummary> {
    lab_dirs()
        .into_iter()
        .map(|dir| match Manifest::read(&dir) {
            Ok(m) => summarize(m),
            Err(e) => LabSummary {
                dir,
                subnet: None,
                owner_pid: None,
                owner_alive: false,
                detached: false,
                made_by: None,
                hosts: Vec::new(),
                problem: Some(e.to_string()),
            },
        })
        .collect()
}

fn summarize(m: Manifest) -> LabSummary {
    LabSummary {
        subnet: Some(m.subnet),
        owner_pid: m.owner.map(|o| o.pid),
        owner_alive: m.detached || m.owner.is_some_and(|o| o.is_alive()),
        detached: m.detached,
        made_by: m.made_by.clone(),
        hosts: m
            .hosts
            .iter()
            .map(|h| HostSummary {
                name: h.name.clone(),
                address: h.address,
                running: h.unshare.is_some_and(|p| p.is_alive())
                    && h.init.is_some_and(|p| p.is_alive()),
                partitioned: h.partitioned,
            })
            .collect(),
        dir: m.dir,
        problem: None,
    }
}

/// Tears down every stale lab and returns their directories. Failures are logged and the
/// lab stays listed for a later attempt.
pub fn reap_stale() -> Vec<PathBuf> {
    let Ok(_lock) = MachineLock::take() else {
        return Vec::new();
    };
    let mut reaped = Vec::new();
    for summary in list_labs().into_iter().filter(LabSummary::is_stale) {
        match Lab::attach(&summary.dir).and_then(Lab::down) {
            Ok(()) => reaped.push(summary.dir),
            Err(e) => {
                tracing::warn!(dir = %summary.dir.display(), error = %e, "cannot reap stale lab")
            }
        }
    }
    reaped
}
