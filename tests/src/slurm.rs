//! Overflow-onto-Slurm support shared by `tests/tests/slurm_lab.rs` and rb-bench's overflow
//! section: a lab whose last hosts form a real Slurm cluster
//! ([`lab::SlurmCluster`]), a broker whose lab file has `[overflow.slurm]` pointing at it,
//! and agents run by the broker's owner (pilots serve the owner's jobs only).

use std::{path::PathBuf, process::Command, time::Duration};

use crate::{
    labtier::{lab_file_with, LabOptions, Timing},
    Broker,
};

/// The `[overflow.slurm]` section of a lab file, and how many lab hosts are Slurm nodes.
#[derive(Debug, Clone)]
pub struct OverflowOptions {
    /// The lab's last `slurm_nodes` hosts run `slurmd` (the first of them `slurmctld` too);
    /// the broker does not manage them.
    pub slurm_nodes: usize,
    /// `partition`; `None` leaves the key out (Slurm's default partition).
    pub partition: Option<String>,
    pub lease_s: u64,
    /// `max_nodes`; `None` leaves the key out (default 1).
    pub max_nodes: Option<usize>,
    pub idle_exit_s: u64,
    /// A program put before each of the `sbatch`/`squeue`/`scancel`/`scontrol` commands, given the
    /// command's name and then the command (e.g. a script that records the call).
    pub wrapper: Option<PathBuf>,
    pub timing: Timing,
    /// `[broker] reclaim_grace_s` (Slurm warns a pilot this long before its lease ends);
    /// `None` leaves the key out.
    pub reclaim_grace_s: Option<u64>,
    /// The broker listens on a port chosen once (free when the lab file is written) instead
    /// of `:0`, as a production broker does on its fixed address: a restarted broker
    /// (`Broker::kill_and_restart`) listens where pilots started with `--broker` reconnect.
    pub fixed_port: bool,
}

impl OverflowOptions {
    /// One Slurm node, the cluster's partition, a 5-minute lease, `idle_exit_s` as given.
    pub fn new(idle_exit_s: u64, timing: Timing) -> Self {
        Self {
            slurm_nodes: 1,
            partition: Some(lab::slurm::PARTITION.into()),
            lease_s: 300,
            max_nodes: Some(1),
            idle_exit_s,
            wrapper: None,
            timing,
            reclaim_grace_s: None,
            fixed_port: false,
        }
    }
}

/// The lab hosts that are Slurm nodes under `opts`: the last `opts.slurm_nodes`.
pub fn slurm_nodes(lab: &lab::Lab, opts: &OverflowOptions) -> Vec<String> {
    let hosts = lab.hosts();
    hosts[hosts.len().saturating_sub(opts.slurm_nodes)..]
        .iter()
        .map(|h| h.name.clone())
        .collect()
}

/// A lab file for `lab` (ssh transport; the Slurm nodes unmanaged) with `[overflow.slurm]`
/// for `cluster`. The cluster's slurm.conf is not /etc/slurm's: the commands say where it is.
pub fn overflow_lab_file(
    lab: &lab::Lab,
    cluster: &lab::SlurmCluster,
    opts: &OverflowOptions,
) -> String {
    let mut lab_opts = LabOptions::new(&[], opts.timing);
    lab_opts.unmanaged = slurm_nodes(lab, opts);
    let command = |name: &str| {
        let mut argv: Vec<String> = Vec::new();
        if let Some(w) = &opts.wrapper {
            argv.extend([w.display().to_string(), name.to_string()]);
        }
        argv.extend([
            "env".to_string(),
            format!("SLURM_CONF={}", cluster.conf().display()),
            name.to_string(),
        ]);
        format!("{name} = {argv:?}\n")
    };
    let mut broker_part = lab_file_with(lab, &lab_opts);
    if let Some(grace) = opts.reclaim_grace_s {
        let with = format!("[broker]\nreclaim_grace_s = {grace}\n");
        broker_part = broker_part.replacen("[broker]\n", &with, 1);
    }
    if opts.fixed_port {
        let gw = lab.gateway();
        let fixed = format!("listen = \"{gw}:{}\"\n", free_port(gw));
        broker_part = broker_part.replacen(&format!("listen = \"{gw}:0\"\n"), &fixed, 1);
    }
    let mut text = format!(
        "{broker_part}\n[overflow.slurm]\nlease_s = {}\nidle_exit_s = {}\n",
        opts.lease_s, opts.idle_exit_s
    );
    if let Some(p) = &opts.partition {
        text.push_str(&format!("partition = {p:?}\n"));
    }
    if let Some(n) = opts.max_nodes {
        text.push_str(&format!("max_nodes = {n}\n"));
    }
    for name in ["sbatch", "squeue", "scancel", "scontrol"] {
        text.push_str(&command(name));
    }
    text
}

/// A TCP port on `ip` that is free now: the kernel's choice for port 0, let go at once.
fn free_port(ip: std::net::Ipv4Addr) -> u16 {
    let listener = std::net::TcpListener::bind((ip, 0)).expect("bind a free port on the gateway");
    listener.local_addr().expect("local address").port()
}

/// A lab, a Slurm cluster of its last hosts and a broker overflowing onto it, every
/// managed host up. Torn down on drop: the broker first (it cancels its pilots), then the
/// cluster, then the lab.
pub struct SlurmLab {
    // Field order matters: fields drop in this order.
    pub broker: Broker,
    pub cluster: lab::SlurmCluster,
    pub lab: lab::Lab,
}

impl SlurmLab {
    /// `hosts` lab hosts in all, the last `opts.slurm_nodes` of them Slurm nodes.
    pub fn start(hosts: usize, opts: &OverflowOptions) -> Result<SlurmLab, String> {
        let lab = lab::Lab::up(&lab::LabSpec {
            hosts,
            ..lab::LabSpec::default()
        })
        .map_err(|e| format!("lab up: {e}"))?;
        let nodes = slurm_nodes(&lab, opts);
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let cluster =
            lab::SlurmCluster::start(&lab, &nodes).map_err(|e| format!("slurm up: {e}"))?;
        let broker = Broker::start(&overflow_lab_file(&lab, &cluster, opts));
        broker.wait_all_up(Duration::from_secs(20));
        Ok(SlurmLab {
            broker,
            cluster,
            lab,
        })
    }
}

/// An agent run by this machine's user (the broker's owner, so pilots serve it) against
/// `broker` over TCP with the lab secret, outside any job, running `script` with sh.
pub fn owner_agent(broker: &Broker, script: &str) -> Command {
    let mut c = Command::new(crate::bin("agent"));
    c.arg("--broker")
        .arg(broker.tcp_addr().to_string())
        .arg("--secret-file")
        .arg(broker.secret())
        .args(["--grace-s", "1", "--", "sh", "-c", script])
        .env_remove("RB_AGENT")
        .env_remove("RB_LAB")
        .env_remove("RB_JEL");
    c
}
