//! A real Slurm cluster (Debian's `slurmctld`, `slurmd`, `munged`) made of lab hosts, for
//! the overflow tests.
//!
//! # Choice: one `slurmd` inside each lab host, not several `slurmd -N` on the machine
//! Debian's `slurmd` can run several daemons per machine (`slurmd -N NAME`, distinct ports,
//! `%n` in paths), but they would all share the machine's address, hostname, /tmp and
//! process list: a pilot's `rb-hostd` would then run in the root namespace beside the broker,
//! and "a Slurm node" would be indistinguishable from the front end. Here each Slurm node is
//! a real lab host: `slurmd` runs inside the host's namespaces, so a pilot job's `rb-hostd`
//! runs on a machine with its own address (10.77.S.N), hostname and /tmp, reachable from the
//! broker's transport and inside the network rule (only lab addresses). `slurmctld` runs on
//! the first node (the controller is a lab host too, so every Slurm message stays between
//! lab addresses and Slurm never resolves a name in the root namespace). Ports are Slurm's
//! defaults (6817/6818): each host has its own network namespace, so they cannot clash with
//! another lab or with anything on the machine.
//!
//! # Pieces
//! - one `munged` in the root namespace with its own key, socket, pid and log files in
//!   `LABDIR/slurm/` (/var/tmp is shared by the hosts, so every daemon and client finds the
//!   socket through `AuthInfo=socket=…` in `slurm.conf`);
//! - `LABDIR/slurm/slurm.conf` (clients take it from `SLURM_CONF`, see
//!   [`SlurmCluster::conf`] and [`SlurmCluster::client`]), spool, state, pid and log paths
//!   per node with `%n`;
//! - two partitions over every node: `rbtest` (the default, where pilots run) and
//!   `rburgent`, whose jobs preempt `rbtest`'s (`PreemptMode=CANCEL` after `GraceTime`), as
//!   a site's high-priority queue does;
//! - `slurmctld -D` on the first node and `slurmd -D` on every node, started with
//!   [`Lab::spawn`]; [`SlurmCluster::start`] returns once `sinfo` shows every node idle.
//!
//! # Teardown
//! [`SlurmCluster::down`] (also on drop, also while a test panics) cancels every job, then
//! stops `slurmd`s, `slurmctld` and `munged` by pid (SIGTERM, SIGKILL after a few seconds)
//! and removes `LABDIR/slurm`. Job steps a killed `slurmd` leaves behind live in the lab
//! host's PID namespace and die with the host at the lab's teardown.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::cmd;
use crate::process::{children, poll, ProcRef};
use crate::{provision, Lab, LabError};

/// The controller's port (inside the first node's network namespace).
pub const CTLD_PORT: u16 = 6817;
/// Each node's `slurmd` port (inside its own network namespace).
pub const SLURMD_PORT: u16 = 6818;
/// The partition every node is in (the default one); its jobs can be preempted by
/// [`URGENT_PARTITION`]'s, and get [`PREEMPT_GRACE_S`] of grace when they are.
pub const PARTITION: &str = "rbtest";
/// A partition over the same nodes whose jobs preempt [`PARTITION`]'s (cancel, after the
/// preempted job's grace time), as a site's high-priority queue does.
pub const URGENT_PARTITION: &str = "rburgent";
/// `GraceTime` of [`PARTITION`]: how long a preempted job has from its SIGTERM until Slurm
/// ends it (its end time becomes now + this).
pub const PREEMPT_GRACE_S: u64 = 15;
/// `KillWait`: how long Slurm waits between a job's SIGTERM and its SIGKILL.
pub const KILL_WAIT_S: u64 = 2;
/// How long the cluster may take to come up (every node idle).
const UP_LIMIT: Duration = Duration::from_secs(30);
/// How long a daemon gets between SIGTERM and SIGKILL at teardown.
const STOP_GRACE: Duration = Duration::from_secs(5);
const HELP: &str = "install slurmctld slurmd slurm-client munge (./test.sh does, as root); \
                    see the logs in LABDIR/slurm";

/// A running Slurm cluster whose nodes are lab hosts. See the module docs.
pub struct SlurmCluster {
    dir: PathBuf,
    nodes: Vec<String>,
    munged: Option<Child>,
    ctld: Option<Child>,
    slurmds: Vec<(String, Child)>,
}

impl SlurmCluster {
    /// Starts munged, `slurmctld` on `nodes[0]` and a `slurmd` on every node of `nodes`
    /// (names of running hosts of `lab`), and waits until every node is idle.
    pub fn start(lab: &Lab, nodes: &[&str]) -> Result<SlurmCluster, LabError> {
        if nodes.is_empty() {
            return Err(LabError::InvalidInput {
                reason: "a Slurm cluster without nodes".into(),
                help: "name at least one lab host".into(),
            });
        }
        let dir = lab.dir().join("slurm");
        let mut cluster = SlurmCluster {
            dir: dir.clone(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            munged: None,
            ctld: None,
            slurmds: Vec::new(),
        };
        // From here on, dropping `cluster` stops whatever was started.
        cluster.write_files(lab)?;
        cluster.munged = Some(cluster.start_munged()?);
        cluster.ctld = Some(cluster.spawn_daemon(lab, nodes[0], "slurmctld")?);
        for node in nodes {
            let child = cluster.spawn_daemon(lab, node, "slurmd")?;
            cluster.slurmds.push((node.to_string(), child));
        }
        cluster.wait_idle()?;
        Ok(cluster)
    }

    /// The `slurm.conf` clients need (`SLURM_CONF=<this>`).
    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// The cluster's directory (`LABDIR/slurm`): config, key, logs, spool and state.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The node names, controller first.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// A Slurm client command (`sbatch`, `squeue`, …) run in the root namespace with
    /// `SLURM_CONF` set to this cluster's config.
    pub fn client(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", self.conf()).stdin(Stdio::null());
        c
    }

    /// Runs a client command to completion; a non-zero exit is an error.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<Output, LabError> {
        cmd::run(self.client(program).args(args), HELP)
    }

    /// The ids of the jobs Slurm knows (pending, running, completing).
    pub fn job_ids(&self) -> Result<Vec<String>, LabError> {
        let out = self.run("squeue", &["-h", "-o", "%i"])?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect())
    }

    /// The daemons this cluster started, as running processes (munged; slurmctld and each
    /// slurmd inside its host): for checking that teardown left none behind.
    pub fn daemons(&self) -> Vec<ProcRef> {
        let munged = self.munged.iter().filter_map(|c| ProcRef::of(c.id()));
        let inside = self
            .ctld
            .iter()
            .chain(self.slurmds.iter().map(|(_, c)| c))
            .flat_map(|c| children(c.id()))
            .filter_map(ProcRef::of);
        munged.chain(inside).collect()
    }

    /// Stops the cluster, reporting every step that failed.
    pub fn down(mut self) -> Result<(), LabError> {
        self.teardown()
    }

    fn write_files(&self, lab: &Lab) -> Result<(), LabError> {
        // munged requires every directory above its socket to be searchable by all.
        provision::mkdir(&self.dir, 0o755)?;
        for sub in ["state", "spool", "log", "run", "jobs"] {
            provision::mkdir(&self.dir.join(sub), 0o755)?;
        }
        let mut key = [0u8; 1024];
        getrandom(&mut key)?;
        let key_path = self.dir.join("munge.key");
        std::fs::write(&key_path, key).map_err(LabError::io(
            "write",
            &key_path,
            "is the lab directory writable?",
        ))?;
        provision::set_mode(&key_path, 0o600)?;
        let nodes: Vec<(String, String)> = self
            .nodes
            .iter()
            .map(|n| Ok((n.clone(), lab.host(n)?.address.to_string())))
            .collect::<Result<_, LabError>>()?;
        provision::write(&self.conf(), &slurm_conf(&self.dir, &nodes), 0o644)?;
        provision::write(&self.dir.join("cgroup.conf"), CGROUP_CONF, 0o644)
    }

    fn munge_socket(&self) -> PathBuf {
        self.dir.join("run/munge.socket")
    }

    fn start_munged(&self) -> Result<Child, LabError> {
        let d = &self.dir;
        let mut c = Command::new("munged");
        c.arg("--foreground")
            .arg(format!("--socket={}", self.munge_socket().display()))
            .arg(format!("--key-file={}", d.join("munge.key").display()))
            .arg(format!("--log-file={}", d.join("log/munged.log").display()))
            .arg(format!("--pid-file={}", d.join("run/munged.pid").display()))
            .arg(format!(
                "--seed-file={}",
                d.join("run/munged.seed").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file(&d.join("log/munged.out"))?);
        let mut child = c.spawn().map_err(|source| LabError::Spawn {
            command: cmd::describe(&c),
            source,
            help: HELP.into(),
        })?;
        let sock = self.munge_socket();
        let waited = poll(Duration::from_secs(10), "munged's socket", HELP, || {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(LabError::Command {
                    command: cmd::describe(&c),
                    status: status.to_string(),
                    stderr: tail(&d.join("log/munged.out")),
                    help: HELP.into(),
                });
            }
            Ok(sock.exists())
        });
        match waited {
            Ok(()) => Ok(child),
            Err(e) => {
                stop_child(&mut child);
                Err(e)
            }
        }
    }

    /// `slurmctld -D` or `slurmd -D` inside `node`, output to `log/<daemon>-<node>.out`.
    fn spawn_daemon(&self, lab: &Lab, node: &str, daemon: &str) -> Result<Child, LabError> {
        let conf = self.conf().display().to_string();
        let mut c = lab.command(node, &[daemon, "-D", "-f", &conf], false)?;
        let out = self.dir.join(format!("log/{daemon}-{node}.out"));
        c.env("SLURM_CONF", &conf)
            .stdin(Stdio::null())
            .stdout(log_file(&out)?)
            .stderr(log_file(&out)?);
        c.spawn().map_err(|source| LabError::Spawn {
            command: cmd::describe(&c),
            source,
            help: HELP.into(),
        })
    }

    /// Polls `sinfo` until every node is idle; fails early when a daemon died.
    fn wait_idle(&mut self) -> Result<(), LabError> {
        let want = self.nodes.len();
        let what = format!("{want} Slurm node(s) idle");
        let mut last = String::new();
        let result = poll(UP_LIMIT, &what, HELP, || {
            self.check_daemons()?;
            // One line per node and partition: ask for the default partition's.
            let sinfo = ["-h", "-N", "-p", PARTITION, "-o", "%N %t"];
            let out = cmd::output(self.client("sinfo").args(sinfo), HELP)?;
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            let idle = last.lines().filter(|l| l.ends_with(" idle")).count();
            Ok(out.status.success() && idle == want)
        });
        result.map_err(|e| match e {
            LabError::Timeout { what, waited, .. } => LabError::Timeout {
                what,
                waited,
                help: format!("last sinfo: {last:?}; {}", self.log_tails()),
            },
            e => e,
        })
    }

    /// An error when a daemon this cluster started has exited, with the end of its logs.
    fn check_daemons(&mut self) -> Result<(), LabError> {
        let dir = self.dir.clone();
        let first = self.nodes[0].clone();
        let named = self
            .ctld
            .iter_mut()
            .map(|c| ("slurmctld", first.clone(), c))
            .chain(
                self.slurmds
                    .iter_mut()
                    .map(|(n, c)| ("slurmd", n.clone(), c)),
            );
        for (daemon, node, child) in named {
            if let Ok(Some(status)) = child.try_wait() {
                let log = if daemon == "slurmd" {
                    format!("slurmd-{node}.log")
                } else {
                    "slurmctld.log".into()
                };
                return Err(LabError::Command {
                    command: format!("{daemon} on {node}"),
                    status: status.to_string(),
                    stderr: format!(
                        "{} | {}",
                        tail(&dir.join(format!("log/{daemon}-{node}.out"))),
                        tail(&dir.join("log").join(log))
                    ),
                    help: HELP.into(),
                });
            }
        }
        Ok(())
    }

    fn log_tails(&self) -> String {
        let Ok(entries) = std::fs::read_dir(self.dir.join("log")) else {
            return String::new();
        };
        let mut s = String::new();
        for e in entries.flatten() {
            let _ = write!(s, "{}: {} ", e.path().display(), tail(&e.path()));
        }
        s
    }

    /// Cancels every job (and waits a little for them to go), then stops the daemons.
    fn teardown(&mut self) -> Result<(), LabError> {
        let mut errors = Vec::new();
        if self.ctld.is_some() && self.munged.is_some() {
            if let Err(e) = self.cancel_all() {
                errors.push(format!("cancel jobs: {e}"));
            }
        }
        for (_, mut child) in self.slurmds.drain(..) {
            stop_inside(&mut child);
        }
        if let Some(mut child) = self.ctld.take() {
            stop_inside(&mut child);
        }
        if let Some(mut child) = self.munged.take() {
            stop_child(&mut child);
        }
        if self.dir.exists() {
            if let Err(e) = std::fs::remove_dir_all(&self.dir) {
                errors.push(format!("remove {}: {e}", self.dir.display()));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(LabError::Teardown {
                dir: self.dir.clone(),
                errors,
            })
        }
    }

    fn cancel_all(&self) -> Result<(), LabError> {
        let ids = self.job_ids()?;
        if ids.is_empty() {
            return Ok(());
        }
        let mut args = vec!["--full"];
        args.extend(ids.iter().map(String::as_str));
        // A job that ended meanwhile makes scancel fail: what matters is the queue after.
        let _ = cmd::output(self.client("scancel").args(&args), HELP)?;
        poll(Duration::from_secs(10), "Slurm jobs to end", HELP, || {
            Ok(self.job_ids()?.is_empty())
        })
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("lab slurm: teardown on drop failed: {e}");
        }
    }
}

/// `cgroup.conf` beside `slurm.conf`. slurmd 22.05 initialises its cgroup plugin even when
/// no cgroup plugin is configured, and autodetection fails inside a lab host (`ip netns
/// exec` mounts a fresh sysfs without /sys/fs/cgroup): name the version instead. Nothing
/// here uses cgroups (proctrack/linuxproc, task/none).
const CGROUP_CONF: &str = "CgroupPlugin=cgroup/v1\n";

/// The `slurm.conf` of a cluster in `dir` whose nodes are `(name, address)`, the first one
/// also the controller.
pub(crate) fn slurm_conf(dir: &Path, nodes: &[(String, String)]) -> String {
    let d = dir.display();
    let (ctl, ctl_addr) = &nodes[0];
    let names: Vec<&str> = nodes.iter().map(|(n, _)| n.as_str()).collect();
    let mut s = format!(
        "# Written by the lab harness (lab/src/slurm.rs) for one test run.\n\
         ClusterName=rblab\n\
         SlurmctldHost={ctl}({ctl_addr})\n\
         SlurmctldPort={CTLD_PORT}\n\
         SlurmdPort={SLURMD_PORT}\n\
         SlurmUser=root\n\
         SlurmdUser=root\n\
         AuthType=auth/munge\n\
         AuthInfo=socket={d}/run/munge.socket\n\
         CredType=cred/munge\n\
         StateSaveLocation={d}/state\n\
         SlurmdSpoolDir={d}/spool/%n\n\
         SlurmctldPidFile={d}/run/slurmctld.pid\n\
         SlurmdPidFile={d}/run/slurmd-%n.pid\n\
         SlurmctldLogFile={d}/log/slurmctld.log\n\
         SlurmdLogFile={d}/log/slurmd-%n.log\n\
         SlurmdParameters=config_overrides\n\
         ProctrackType=proctrack/linuxproc\n\
         TaskPlugin=task/none\n\
         SelectType=select/linear\n\
         SchedulerType=sched/builtin\n\
         JobAcctGatherType=jobacct_gather/none\n\
         AccountingStorageType=accounting_storage/none\n\
         JobCompType=jobcomp/none\n\
         MpiDefault=none\n\
         ReturnToService=2\n\
         KillWait={KILL_WAIT_S}\n\
         PreemptType=preempt/partition_prio\n\
         PreemptMode=CANCEL\n\
         InactiveLimit=0\n\
         MinJobAge=10\n\
         SlurmctldDebug=info\n\
         SlurmdDebug=info\n"
    );
    for (name, addr) in nodes {
        let _ = writeln!(s, "NodeName={name} NodeAddr={addr} CPUs=1 State=UNKNOWN");
    }
    let _ = writeln!(
        s,
        "PartitionName={PARTITION} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP \
         PriorityTier=1 GraceTime={PREEMPT_GRACE_S}\n\
         PartitionName={URGENT_PARTITION} Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=2",
        nodes = names.join(",")
    );
    s
}

/// Fills `buf` from the kernel's random source.
fn getrandom(buf: &mut [u8]) -> Result<(), LabError> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(LabError::io(
            "read",
            "/dev/urandom",
            "this should not happen",
        ))
}

fn log_file(path: &Path) -> Result<std::fs::File, LabError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(LabError::io("open", path, "is the lab directory writable?"))
}

/// SIGTERM to a process started by this process, SIGKILL after [`STOP_GRACE`], then reaped.
fn stop_child(child: &mut Child) {
    if let Some(p) = ProcRef::of(child.id()) {
        let _ = p.signal(Signal::SIGTERM);
    }
    let exited = poll(STOP_GRACE, "daemon to exit", "", || {
        Ok(child.try_wait().ok().flatten().is_some())
    });
    if exited.is_err() {
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// [`stop_child`] for a daemon started inside a host: the signals go to the process inside
/// (the `nsenter` wrapper's child), whose exit ends the wrapper.
fn stop_inside(child: &mut Child) {
    let inside: Vec<ProcRef> = children(child.id())
        .into_iter()
        .filter_map(ProcRef::of)
        .collect();
    for p in &inside {
        let _ = p.signal(Signal::SIGTERM);
    }
    let exited = poll(STOP_GRACE, "daemon to exit", "", || {
        Ok(child.try_wait().ok().flatten().is_some())
    });
    if exited.is_err() {
        for p in &inside {
            let _ = p.signal(Signal::SIGKILL);
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conf_names_the_controller_and_every_node() {
        let nodes = vec![
            ("node04".to_string(), "10.77.9.4".to_string()),
            ("node05".to_string(), "10.77.9.5".to_string()),
        ];
        let conf = slurm_conf(Path::new("/var/tmp/rb-lab-9/slurm"), &nodes);
        assert!(conf.contains("SlurmctldHost=node04(10.77.9.4)\n"));
        assert!(conf.contains("NodeName=node05 NodeAddr=10.77.9.5 CPUs=1"));
        assert!(conf.contains("PartitionName=rbtest Nodes=node04,node05 Default=YES"));
        assert!(conf.contains("PreemptType=preempt/partition_prio\nPreemptMode=CANCEL\n"));
        assert!(conf.contains("PriorityTier=1 GraceTime=15\n"), "{conf}");
        assert!(conf.contains("PartitionName=rburgent Nodes=node04,node05 MaxTime"));
        assert!(conf.contains("AuthInfo=socket=/var/tmp/rb-lab-9/slurm/run/munge.socket\n"));
        assert!(conf.contains("SlurmdSpoolDir=/var/tmp/rb-lab-9/slurm/spool/%n\n"));
    }
}
