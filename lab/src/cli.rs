//! `rb lab …`: the lab for people. The lead wires [`LabCommand`] into the `rb` binary;
//! [`run`] does the work.
//!
//! `rb lab up` builds a lab and leaves it running (detached); the other commands find it
//! through its manifest: with `--dir DIR`, or the only lab made by `rb lab up` by this user
//! from this checkout (else the only one on the machine). A bare `rb lab down` takes only
//! this user's labs of this checkout ([`crate::creator`]).

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::creator::default_candidates;
use crate::{list_labs, plan_down, require_root, Creator, Lab, LabSpec, LabSummary, SlurmCluster};

/// The `rb lab` subcommands.
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum LabCommand {
    /// Build a lab of test hosts on this machine and leave it running.
    Up {
        /// Number of hosts (node02 …).
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// Also run real rshd (inetd + in.rshd) on every host.
        #[arg(long)]
        rsh: bool,
    },
    /// Tear down labs: by default those this user made from this checkout; says what it left.
    ///
    /// Without arguments: the labs made by this user (uid, and SUDO_UID under sudo) with the
    /// binaries of this checkout (this `rb`'s directory), except labs a running process
    /// (a test) owns. Labs of other users or checkouts are left and listed.
    Down {
        /// Tear down only this lab directory (/var/tmp/rb-lab-S), whoever made it.
        dir: Option<PathBuf>,
        /// Every lab on this machine, whoever made it, except labs a running process owns.
        #[arg(long, conflicts_with_all = ["dir", "stale"])]
        all: bool,
        /// Only labs whose creating process died without tearing them down (anyone's).
        #[arg(long, conflicts_with = "dir")]
        stale: bool,
    },
    /// List the labs of this machine and their hosts.
    Status,
    /// Run a command inside a host (as root, or as the lab user with --user).
    Exec {
        /// Lab directory (default: your only lab of this checkout, else the only lab here).
        #[arg(long = "dir", value_name = "DIR")]
        lab: Option<PathBuf>,
        /// Run as the lab user instead of root.
        #[arg(long)]
        user: bool,
        /// The host (node02, …).
        host: String,
        /// The command and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        argv: Vec<String>,
    },
    /// Crash a host: every process on it dies at once.
    Crash {
        /// Lab directory (default: your only lab of this checkout, else the only lab here).
        #[arg(long = "dir", value_name = "DIR")]
        lab: Option<PathBuf>,
        /// The host.
        host: String,
    },
    /// Boot a crashed host; returns when its sshd accepts connections.
    Boot {
        /// Lab directory (default: your only lab of this checkout, else the only lab here).
        #[arg(long = "dir", value_name = "DIR")]
        lab: Option<PathBuf>,
        /// The host.
        host: String,
    },
    /// Cut a host off the lab network.
    Partition {
        /// Lab directory (default: your only lab of this checkout, else the only lab here).
        #[arg(long = "dir", value_name = "DIR")]
        lab: Option<PathBuf>,
        /// The host.
        host: String,
    },
    /// Run a real Slurm cluster on lab hosts until interrupted: `slurmctld` on the first
    /// node, a `slurmd` on each (Debian's slurmctld, slurmd, munge), to try overflow onto
    /// Slurm by hand. Prints the `[overflow.slurm]` lines for the lab file; Ctrl-C (or
    /// SIGTERM) stops the cluster.
    Slurm {
        /// Lab directory (default: your only lab of this checkout, else the only lab here).
        #[arg(long = "dir", value_name = "DIR")]
        lab: Option<PathBuf>,
        /// The hosts that become Slurm nodes (leave them out of the lab file's [[host]]s:
        /// pilots bring them in as slurm-NODE).
        #[allow(rustdoc::broken_intra_doc_links)] // --help text: `[[host]]` is TOML
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
    },
    /// Reconnect a partitioned host.
    Heal {
        /// Lab directory (default: your only lab of this checkout, else the only lab here).
        #[arg(long = "dir", value_name = "DIR")]
        lab: Option<PathBuf>,
        /// The host.
        host: String,
    },
}

/// Runs one `rb lab` command; returns the exit code: 0, or for `exec` the command's own
/// status (128+N when signal N ended it), so that `rb lab exec` stands in for the command.
pub fn run(cmd: LabCommand) -> anyhow::Result<u8> {
    if cmd != LabCommand::Status {
        require_root()?;
    }
    if let LabCommand::Exec {
        lab,
        user,
        host,
        argv,
    } = cmd
    {
        return exec(lab, user, &host, &argv);
    }
    run_other(cmd).map(|()| 0)
}

fn run_other(cmd: LabCommand) -> anyhow::Result<()> {
    match cmd {
        LabCommand::Up { hosts, rsh } => up(hosts, rsh),
        LabCommand::Down { stale: true, .. } => {
            for dir in crate::reap_stale() {
                say_line(format_args!("reaped stale lab {}", dir.display()));
            }
            Ok(())
        }
        LabCommand::Down { dir: Some(d), .. } => down(vec![d]),
        LabCommand::Down { dir: None, all, .. } => {
            let plan = plan_down(&list_labs(), &Creator::current(), all);
            if plan.take.is_empty() {
                say_line(format_args!("no lab to take down"));
            }
            let left = plan.report_left();
            down(plan.take)?;
            say(format_args!("{left}"));
            Ok(())
        }
        LabCommand::Status => {
            status();
            Ok(())
        }
        LabCommand::Exec { .. } => unreachable!("handled by run"),
        LabCommand::Crash { lab, host } => Ok(find(lab, &host)?.crash(&host)?),
        LabCommand::Boot { lab, host } => Ok(find(lab, &host)?.boot(&host)?),
        LabCommand::Partition { lab, host } => Ok(find(lab, &host)?.partition(&host)?),
        LabCommand::Heal { lab, host } => Ok(find(lab, &host)?.heal(&host)?),
        LabCommand::Slurm { lab, nodes } => slurm(lab, &nodes),
    }
}

fn up(hosts: usize, rsh: bool) -> anyhow::Result<()> {
    let started = Instant::now();
    let lab = Lab::up(&LabSpec {
        hosts,
        rsh,
        prefix: None,
    })?;
    let text = summary(&lab, started.elapsed().as_secs_f64());
    lab.detach(); // before printing: a closed stdout must not tear the lab down
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(())
}

/// What `rb lab up` prints: where things are and how to get in.
fn summary(lab: &Lab, secs: f64) -> String {
    let cfg = lab.ssh_config();
    let u = lab.user();
    let first = lab.hosts().first().map_or("node02", |h| h.name.as_str());
    let mut s = format!("lab up in {secs:.2} s: {}\n", lab.dir().display());
    let _ = writeln!(
        s,
        "  node01   {}  (gateway: this machine, run the broker here)",
        lab.gateway()
    );
    for h in lab.hosts() {
        let _ = writeln!(s, "  {:<8} {}", h.name, h.address);
    }
    let _ = writeln!(
        s,
        "  user     {} (uid {}), home {}",
        u.name,
        u.uid,
        u.home.display()
    );
    let rsh = if lab.rsh() {
        "in.rshd on every host"
    } else {
        "off"
    };
    let _ = writeln!(s, "  rsh      {rsh}");
    let _ = writeln!(s, "ssh in:    ssh -F {} {first}", cfg.display());
    let _ = writeln!(
        s,
        "as user:   ssh -F {} -i {} -l {} {first}",
        cfg.display(),
        u.key.display(),
        u.name
    );
    let _ = writeln!(s, "run:       rb lab exec [--user] {first} hostname");
    let _ = writeln!(s, "tear down: rb lab down {}", lab.dir().display());
    s
}

/// Tears down the labs in `dirs`, saying how long each took.
fn down(dirs: Vec<PathBuf>) -> anyhow::Result<()> {
    for d in dirs {
        let started = Instant::now();
        Lab::attach(&d)?
            .down()
            .with_context(|| format!("tearing down {}", d.display()))?;
        say_line(format_args!(
            "down in {:.2} s: {}",
            started.elapsed().as_secs_f64(),
            d.display()
        ));
    }
    Ok(())
}

fn status() {
    let labs = list_labs();
    if labs.is_empty() {
        say_line(format_args!("no labs on this machine"));
    }
    for l in labs {
        say(format_args!("{}", describe(&l)));
    }
}

/// A few lines about one lab.
fn describe(l: &LabSummary) -> String {
    if let Some(p) = &l.problem {
        return format!("{}: unreadable: {p}\n", l.dir.display());
    }
    let who = match (l.detached, l.owner_pid, l.owner_alive) {
        (true, _, _) => "made by `rb lab up`".to_string(),
        (false, Some(pid), true) => format!("owned by pid {pid}"),
        (false, pid, _) => format!(
            "STALE (owner pid {} died; `rb lab down {}` or lab::reap_stale)",
            pid.map_or("?".into(), |p| p.to_string()),
            l.dir.display()
        ),
    };
    let mut s = format!(
        "{} gateway 10.77.{}.1, {who}\n",
        l.dir.display(),
        l.subnet.unwrap_or(0)
    );
    match &l.made_by {
        Some(c) => {
            let _ = writeln!(s, "  by {} from {}", c.user(), c.checkout.display());
        }
        None => s += "  by an earlier rb (creator not recorded)\n",
    }
    for h in &l.hosts {
        let state = if h.running { "running" } else { "down" };
        let part = if h.partitioned { ", partitioned" } else { "" };
        s += &format!(
            "  {:<8} {:<12} {state}{part}\n",
            h.name,
            h.address.to_string()
        );
    }
    s
}

/// The lab to act on: `--dir DIR`, or the only lab made by `rb lab up` from this checkout
/// (see [`default_candidates`]); among several, the only one that has `host`.
fn find(dir: Option<PathBuf>, host: &str) -> anyhow::Result<Lab> {
    if let Some(d) = dir {
        return Ok(Lab::attach(&d)?);
    }
    let labs = list_labs();
    let candidates = default_candidates(&labs, &Creator::current());
    match choose(&labs, candidates, host) {
        Ok(dir) => Ok(Lab::attach(&dir)?),
        Err(message) => bail!(message),
    }
}

/// The one lab of `candidates` to act on, or what to tell the user.
fn choose(
    labs: &[LabSummary],
    mut candidates: Vec<PathBuf>,
    host: &str,
) -> Result<PathBuf, String> {
    if candidates.len() > 1 {
        let with_host: Vec<PathBuf> = candidates
            .iter()
            .filter(|d| {
                labs.iter()
                    .any(|l| &l.dir == *d && l.hosts.iter().any(|h| h.name == host))
            })
            .cloned()
            .collect();
        if with_host.len() == 1 {
            candidates = with_host;
        }
    }
    match candidates.len() {
        0 => Err("no lab made by `rb lab up` on this machine\nhelp: start one with `rb lab up`, or name one with --dir DIR".into()),
        1 => Ok(candidates.remove(0)),
        _ => {
            let lines: Vec<String> = labs
                .iter()
                .filter(|l| candidates.contains(&l.dir))
                .map(|l| {
                    let by = l.made_by.as_ref().map_or("an earlier rb".to_string(), |c| {
                        format!("{} from {}", c.user(), c.checkout.display())
                    });
                    format!("  {} (made by {by})", l.dir.display())
                })
                .collect();
            Err(format!(
                "several labs on this machine have {host}:\n{}\nhelp: choose one with --dir DIR, e.g. `rb lab exec --dir {} {host} …`",
                lines.join("\n"),
                candidates[0].display()
            ))
        }
    }
}

/// `rb lab slurm`: the cluster up, what to put in the lab file, then wait for a stop signal.
fn slurm(lab: Option<PathBuf>, nodes: &[String]) -> anyhow::Result<()> {
    let first = nodes.first().map_or("", String::as_str);
    let lab = find(lab, first)?;
    // Blocked before the cluster starts, so a signal that comes early is waited for, not lost.
    let stop = stop_signals();
    stop.thread_block()
        .context("blocking SIGINT/SIGTERM/SIGHUP")?;
    let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let started = Instant::now();
    let cluster = SlurmCluster::start(&lab, &names)?;
    let mut out = std::io::stdout();
    let _ = out.write_all(slurm_summary(&cluster, started.elapsed().as_secs_f64()).as_bytes());
    let _ = out.flush();
    let signal = stop.wait().context("waiting for a stop signal")?;
    say_line(format_args!("{signal}: stopping the Slurm cluster"));
    cluster.down()?;
    say_line(format_args!("slurm down"));
    Ok(())
}

fn stop_signals() -> nix::sys::signal::SigSet {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    set
}

/// What `rb lab slurm` prints once every node is idle.
fn slurm_summary(cluster: &SlurmCluster, secs: f64) -> String {
    let conf = cluster.conf();
    let nodes = cluster.nodes().join(" ");
    let mut s = format!(
        "slurm up in {secs:.2} s: nodes {nodes} (controller {})\n",
        cluster.nodes()[0]
    );
    let _ = writeln!(s, "clients:   SLURM_CONF={} sinfo", conf.display());
    let _ = writeln!(s, "lab file:  leave {nodes} out of its [[host]]s, and add");
    let _ = writeln!(s, "[overflow.slurm]");
    let _ = writeln!(s, "partition = \"{}\"", crate::slurm::PARTITION);
    for name in ["sbatch", "squeue", "scancel", "scontrol"] {
        let _ = writeln!(
            s,
            "{name} = [\"env\", \"SLURM_CONF={}\", \"{name}\"]",
            conf.display()
        );
    }
    let _ = writeln!(s, "stop:      Ctrl-C or kill -TERM {}", std::process::id());
    s
}

/// Runs `argv` inside `host`; returns its exit status as an exit code (128+N for signal N).
fn exec(lab: Option<PathBuf>, user: bool, host: &str, argv: &[String]) -> anyhow::Result<u8> {
    let lab = find(lab, host)?;
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let status = lab
        .command(host, &argv, user)?
        .status()
        .context("running nsenter")?;
    Ok(exit_code(status))
}

fn exit_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(255),
        (None, None) => 1,
    }
}

/// Writes to standard output, ignoring a failure: what `rb lab` says follows or precedes
/// work on the lab (a teardown, a Slurm cluster stopped) that must go on whether or not
/// anyone still reads (`println!` would panic on a closed pipe and leave it half done).
fn say(text: std::fmt::Arguments<'_>) {
    let _ = startup::output::print_fmt(text);
}

/// [`say`] and a newline.
fn say_line(text: std::fmt::Arguments<'_>) {
    say(format_args!("{text}\n"));
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: LabCommand,
    }

    fn parse(args: &[&str]) -> LabCommand {
        Cli::try_parse_from(std::iter::once("rb-lab").chain(args.iter().copied()))
            .expect("valid command line")
            .cmd
    }

    fn summary(dir: &str, hosts: &[&str]) -> LabSummary {
        LabSummary {
            dir: PathBuf::from(dir),
            subnet: Some(1),
            owner_pid: None,
            owner_alive: true,
            detached: true,
            made_by: None,
            hosts: hosts
                .iter()
                .map(|h| crate::registry::HostSummary {
                    name: (*h).into(),
                    address: std::net::Ipv4Addr::LOCALHOST,
                    running: true,
                    partitioned: false,
                })
                .collect(),
            problem: None,
        }
    }

    #[test]
    fn among_several_labs_the_one_with_the_host_is_chosen_else_dir_is_asked_for() {
        let labs = [
            summary("/var/tmp/rb-lab-1", &["node02", "node03"]),
            summary(
                "/var/tmp/rb-lab-2",
                &["node02", "node03", "node04", "node05"],
            ),
        ];
        let all: Vec<PathBuf> = labs.iter().map(|l| l.dir.clone()).collect();
        assert_eq!(
            choose(&labs, all.clone(), "node05"),
            Ok(PathBuf::from("/var/tmp/rb-lab-2"))
        );
        let both = choose(&labs, all.clone(), "node03").expect_err("ambiguous");
        assert!(
            both.contains("/var/tmp/rb-lab-1")
                && both.contains("/var/tmp/rb-lab-2")
                && both.contains("--dir"),
            "{both}"
        );
        assert_eq!(
            choose(&labs, all[..1].to_vec(), "node09"),
            Ok(PathBuf::from("/var/tmp/rb-lab-1")),
            "one candidate: it says itself that the host is unknown"
        );
        assert!(choose(&labs, Vec::new(), "node02").is_err());
    }

    #[test]
    fn exec_passes_the_commands_status_through() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(0)), 0);
        assert_eq!(
            exit_code(std::process::ExitStatus::from_raw(15)),
            143,
            "killed by SIGTERM"
        );
    }

    #[test]
    fn parses_up_with_defaults() {
        assert_eq!(
            parse(&["up"]),
            LabCommand::Up {
                hosts: 4,
                rsh: false
            }
        );
        assert_eq!(
            parse(&["up", "--hosts", "8", "--rsh"]),
            LabCommand::Up {
                hosts: 8,
                rsh: true
            }
        );
    }

    #[test]
    fn down_takes_dir_or_all_or_stale() {
        assert_eq!(
            parse(&["down"]),
            LabCommand::Down {
                dir: None,
                all: false,
                stale: false
            }
        );
        assert!(matches!(
            parse(&["down", "--all"]),
            LabCommand::Down { all: true, .. }
        ));
        let cli = |a: &[&str]| {
            Cli::try_parse_from(std::iter::once("rb-lab").chain(a.iter().copied())).is_err()
        };
        assert!(
            cli(&["down", "--all", "/var/tmp/rb-lab-3"]),
            "--all with DIR"
        );
        assert!(cli(&["down", "--all", "--stale"]), "--all with --stale");
    }

    #[test]
    fn exec_keeps_the_command_s_own_flags() {
        assert_eq!(
            parse(&["exec", "--user", "node03", "ls", "-l", "/tmp"]),
            LabCommand::Exec {
                lab: None,
                user: true,
                host: "node03".into(),
                argv: vec!["ls".into(), "-l".into(), "/tmp".into()],
            }
        );
    }

    #[test]
    fn describes_stale_labs() {
        let l = LabSummary {
            dir: "/var/tmp/rb-lab-3".into(),
            subnet: Some(3),
            owner_pid: Some(99),
            owner_alive: false,
            detached: false,
            made_by: None,
            hosts: vec![],
            problem: None,
        };
        assert!(describe(&l).contains("STALE"));
        assert!(l.is_stale());
    }
}
