//! The `rb` command line: flags and subcommands, and which subcommand takes which flag.
//!
//! The broker flags (`--broker`, `--lab`, `--secret-file`) belong to the commands that talk
//! to a broker; they may come before the subcommand (`rb --broker S status`, as before) or
//! after it (`rb status --broker S`). Before a subcommand that has no use for them (`rb rsl`,
//! `rb lab`, `rb demo`) they are refused instead of being silently ignored, and they are not
//! listed in those subcommands' help.
//!
//! Exit codes of `rb`: 0 success; 64 bad flags, lab file, job spec or RSL; 66 an input
//! file missing; 73 an output file that cannot be made; 77 permission denied (e.g. on the
//! broker's socket); 141 standard output's reader went away (`rb status | head -1`), saying
//! nothing; 1 anything else (the broker is not running, …).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Exit code for bad flags, configuration or input.
pub const EXIT_USAGE: u8 = startup::EXIT_USAGE;
/// Exit code for an input file that is missing or cannot be read.
pub const EXIT_NO_INPUT: u8 = 66;
/// Exit code for an output file that cannot be created.
pub const EXIT_CANT_CREATE: u8 = 73;
/// Exit code for permission denied.
pub const EXIT_PERMISSION: u8 = 77;

/// What `rb jobs --help` and `man rb-jobs` say about the table (see `table::render_jobs`).
const JOBS_HELP: &str = "\
Columns: JOB (the job id), USER (who the broker authenticated), STATE (running, ended),
STARTED and ENDED (local time; `-` when unknown, e.g. a job restored after a broker restart),
HOSTS (the hosts the job holds), QUEUED (symbolic names of its waiting requests, in queue
order), COMMAND (the app and its arguments).

Under a job, one line per waiting request: `waits: NAME #POSITION for AGE: REASON`, e.g.
`waits: anyLinux #1 for 12s: 2 matching host(s): 1 held by jobs, 1 owner active`, then the
job's last note (module failures, …). With overflow onto Slurm the line ends with what
overflow does for it (`waits for Slurm: 1 pilot(s) queued`).

Reasons (--json: `reason_code` of each `waiting` entry):
  reclaiming       taking a host back from another job for it
  no_host_matches  no host matches (yet: a host has not reported)
  max_hosts        the job holds the policy's max_hosts already
  all_held         every matching host is held by a job
  owner_active     every matching host's owner is active
  drained          every matching host is drained (rb drain)
  down             every matching host is down
  reserved         every matching host is reserved for an
                   earlier request
  policy           the policy's `start` declines every one
  mixed            several of these: the text counts each

For each host the name matches, the first cause that keeps it from the request counts.

--json: an array of objects with id, user, state, started_at, ended_at (unix seconds or
null), hosts, queued, waiting ([{req, symbolic, position, age_s, reason, reason_code, slurm}]),
notes, argv, cwd, spec.";

/// What `rb status --help` and `man rb-status` say about the table.
const STATUS_HELP: &str = "\
Per host: state, ALLOC (free; held(N) by job N; releasing(N) being taken back; reserved(N)
taken back for a waiting request; draining(N) drained while job N holds it; drained; leaving:
a Slurm pilot's lease ends), 1-minute load, CPUs, memory (available/total), logged-in users
with their tty idle time, console idle time (`?` = unknown: never read as idle), labels (lab
file and sensors), owner, the age of the last report, and NOTE: why the policy starts no job
on a free host now, or a Slurm pilot's job and lease. Down hosts are listed underneath with
the reason.

--json: an array of objects with name, state (up/down), alloc_state, held_by, drained, cpus,
load1, users ([{user, tty, idle_s}]), console_idle_s, labels, owner, last_report_age_s,
down_reason, hostname, load5, load15, cpu_util, mem_*, managed_procs, job_load,
daemon_starts, policy_note, slurm_job, lease_left_s, lease_ending. Indented on a terminal;
piped, on one line as the broker sent it (not parsed: megabytes at 10k hosts).";

/// ResourceBroker: hand idle lab machines to adaptive parallel jobs.
#[derive(Debug, Parser)]
#[command(name = "rb", version)]
pub struct Cli {
    #[command(flatten)]
    pub broker: BrokerFlags,
    #[command(subcommand)]
    pub command: Cmd,
}

/// How to reach the broker (the commands that talk to one).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct BrokerFlags {
    /// Broker to talk to: its control socket (a path) or IP:port [env: RB_BROKER]
    /// (default: the control socket of the lab file, else a running `rb demo --keep` or
    /// embedded broker).
    #[arg(long, value_name = "PATH|IP:PORT")]
    pub broker: Option<String>,
    /// Lab file whose broker to reach [env: RB_LAB] (default ~/.config/rb/lab.toml).
    #[arg(long, value_name = "FILE")]
    pub lab: Option<PathBuf>,
    /// Lab secret for TCP connections (default: the lab file's, else ~/.config/rb/secret).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Your user credential for TCP connections (from `rb user add`) [env: RB_CREDENTIAL]
    /// (default: ~/.config/rb/credential when the lab secret is not readable).
    #[arg(long, value_name = "FILE")]
    pub credential: Option<PathBuf>,
}

impl BrokerFlags {
    /// These flags, else `before` (given before the subcommand), else the environment.
    pub fn or(&self, before: &BrokerFlags, env: impl Fn(&str) -> Option<String>) -> BrokerFlags {
        BrokerFlags {
            broker: self
                .broker
                .clone()
                .or_else(|| before.broker.clone())
                .or_else(|| env("RB_BROKER").filter(|v| !v.is_empty())),
            lab: self
                .lab
                .clone()
                .or_else(|| before.lab.clone())
                .or_else(|| env("RB_LAB").filter(|v| !v.is_empty()).map(PathBuf::from)),
            secret_file: self
                .secret_file
                .clone()
                .or_else(|| before.secret_file.clone()),
            credential: self
                .credential
                .clone()
                .or_else(|| before.credential.clone())
                .or_else(|| {
                    env("RB_CREDENTIAL")
                        .filter(|v| !v.is_empty())
                        .map(PathBuf::from)
                }),
        }
    }
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Create the lab secret and an example lab file (never overwrites without --force).
    Init {
        /// Overwrite an existing secret and lab file.
        #[arg(long)]
        force: bool,
        /// Where to write the lab file [env: RB_LAB] (default ~/.config/rb/lab.toml).
        #[arg(long, value_name = "FILE")]
        lab: Option<PathBuf>,
        /// Where to write the secret (default ~/.config/rb/secret).
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
    },
    /// Validate a lab file as rb-broker would at start, without starting anything (exit 64
    /// when invalid).
    Check {
        /// The lab file [env: RB_LAB] (default ~/.config/rb/lab.toml).
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        /// The lab file, as the other commands' `--lab` names it (the same as FILE).
        #[arg(long = "lab", value_name = "FILE", conflicts_with = "file")]
        lab: Option<PathBuf>,
        /// Also ask the Slurm cluster of `[overflow.slurm]` once (`squeue`) and say what it
        /// found (exit 69 when it does not answer).
        #[arg(long)]
        probe: bool,
    },
    /// Show every host: state, allocation (free, held by a job, drained…), load, CPUs, users,
    /// idleness, labels, owner.
    #[command(after_long_help = STATUS_HELP)]
    Status {
        /// Machine-readable output: a JSON array of host objects (one line when piped).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Stop the broker (local control socket only).
    Shutdown {
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Show jobs: id, user, state, start and end times, hosts, and each waiting request's
    /// position, age and why it waits.
    #[command(after_long_help = JOBS_HELP)]
    Jobs {
        /// Machine-readable output: a JSON array of job objects.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Take HOST back from whatever job holds it (TERM, grace period, then KILL).
    Release {
        /// The host, as named in the lab file.
        host: String,
        /// Grace period in seconds before remaining processes are killed (0–3600; default:
        /// the job's own).
        #[arg(long, value_name = "SECONDS")]
        grace_s: Option<f64>,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Stop granting HOST to jobs (jobs already on it keep it).
    Drain {
        /// The host, as named in the lab file.
        host: String,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Grant HOST to jobs again.
    Resume {
        /// The host, as named in the lab file.
        host: String,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Test hosts on this machine (root): network namespaces with their own sshd.
    #[command(subcommand)]
    Lab(lab::cli::LabCommand),
    /// Globus RSL job specifications: check them, turn them into job specs.
    #[command(subcommand)]
    Rsl(rsl::cli::RslCommand),
    /// Allocation policy files (`policies/README.md`): check them.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Users with a credential of their own (the broker's owner only): add, list, revoke.
    #[command(subcommand)]
    User(UserCommand),
    /// Draw the lab's utilization from the broker's decision trace (TRACE_DIR: its
    /// STATE_DIR/trace) as an SVG chart: hosts lent to jobs, free, in their owner's use,
    /// drained and down over time, in total and per host. The trace is replayed as `rb
    /// policy replay` does, so the chart's host-seconds are those of its `host states:`
    /// line. Exit 0; 64 for a bad trace line or policy file; 66 when TRACE_DIR is missing
    /// or holds no trace; 73 when FILE cannot be written (77: permission denied).
    Report {
        /// The trace directory (`STATE_DIR/trace` of the broker's lab file).
        trace_dir: PathBuf,
        /// Where to write the SVG (`-`: standard output).
        #[arg(long, value_name = "FILE")]
        svg: PathBuf,
        /// The policy to replay with (default: the shipped policy the trace was recorded
        /// under; required when that was a policy file of its own).
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
        /// Time buckets across the chart.
        #[arg(long, value_name = "N", default_value_t = 120,
              value_parser = clap::value_parser!(u16).range(1..=2000))]
        buckets: u16,
        /// Per-host rows drawn at most (the total counts every host).
        #[arg(long, value_name = "N", default_value_t = 64)]
        max_hosts: usize,
        /// The chart's title (default: `Lab utilization: TRACE_DIR`).
        #[arg(long, value_name = "TEXT")]
        title: Option<String>,
    },
    /// Run the embedded single-machine lab: start a broker with virtual hosts, show them up.
    Demo {
        /// Number of virtual hosts.
        #[arg(long, default_value_t = 4)]
        hosts: usize,
        /// Leave the broker running afterwards (`rb status` then finds it).
        #[arg(long)]
        keep: bool,
        /// State dir, holding the broker's log `broker.log` (default $XDG_RUNTIME_DIR/rb/demo,
        /// else /tmp/rb-<uid>/demo); created 0700, refused if another user owns it.
        #[allow(rustdoc::invalid_html_tags)] // --help text: `<uid>` is shown as written
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
}

impl Cmd {
    /// The subcommand's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Cmd::Init { .. } => "init",
            Cmd::Check { .. } => "check",
            Cmd::Status { .. } => "status",
            Cmd::Shutdown { .. } => "shutdown",
            Cmd::Jobs { .. } => "jobs",
            Cmd::Release { .. } => "release",
            Cmd::Drain { .. } => "drain",
            Cmd::Resume { .. } => "resume",
            Cmd::Lab(_) => "lab",
            Cmd::Rsl(_) => "rsl",
            Cmd::Policy(_) => "policy",
            Cmd::User(_) => "user",
            Cmd::Demo { .. } => "demo",
            Cmd::Report { .. } => "report",
        }
    }

    /// The broker flags given after the subcommand, for the commands that talk to a broker.
    pub fn broker_flags(&self) -> Option<&BrokerFlags> {
        match self {
            Cmd::Status { broker, .. }
            | Cmd::Shutdown { broker }
            | Cmd::Jobs { broker, .. }
            | Cmd::Release { broker, .. }
            | Cmd::Drain { broker, .. }
            | Cmd::Resume { broker, .. }
            | Cmd::Policy(PolicyCommand::Show { broker, .. })
            | Cmd::Policy(PolicyCommand::Reload { broker })
            | Cmd::Policy(PolicyCommand::Explain { broker, .. })
            | Cmd::User(UserCommand::Add { broker, .. })
            | Cmd::User(UserCommand::List { broker, .. })
            | Cmd::User(UserCommand::Revoke { broker, .. }) => Some(broker),
            _ => None,
        }
    }
}

/// `rb policy …`.
#[derive(Debug, Clone, Subcommand)]
pub enum PolicyCommand {
    /// Load FILE as the broker would: parse, check every field and evaluate every hook
    /// against sample hosts and jobs. Exit 0 with a one-line summary; a bad file exits 64
    /// with `FILE:LINE:COL: key `HOOK`: …` and a `help:` line.
    Check {
        /// The policy file (a path; the shipped ones are in the checkout's `policies/`).
        file: PathBuf,
    },
    /// The broker's policy in force: path, sha256, when it was loaded, the last reload
    /// error.
    Show {
        /// Machine-readable output: one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Load the lab's policy file again (as SIGHUP to rb-broker does). A bad file is
    /// refused with its error (exit 1) and the old policy stays.
    Reload {
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Re-simulate the broker's decision trace (TRACE_DIR: its STATE_DIR/trace) under the
    /// policy FILE: print each decision that would have differed (time, host, job, recorded
    /// vs replayed) and `N decisions, M would differ under FILE`. Exit 0; 64 for a bad
    /// policy file or trace (`FILE:LINE` of a bad trace line).
    Replay {
        /// The trace directory (`STATE_DIR/trace` of the broker's lab file).
        trace_dir: PathBuf,
        /// The policy file to decide with.
        #[arg(long, value_name = "FILE")]
        policy: PathBuf,
    },
    /// Each policy hook's value on HOST and the inputs it read, for a job (open to every
    /// user of the lab).
    Explain {
        /// The host, as named in the lab file.
        host: String,
        /// The job asking (default: a hypothetical new non-adaptive job).
        #[arg(long, value_name = "ID")]
        job: Option<u64>,
        /// Machine-readable output: one JSON object.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerFlags,
    },
}

/// `rb user …` (the broker's owner only; others get exit 77).
#[derive(Debug, Clone, Subcommand)]
pub enum UserCommand {
    /// Create a credential for NAME (who need not exist on this machine). The broker writes
    /// it to FILE (default STATE_DIR/credentials/NAME, mode 0600; never over an existing
    /// file) and the path is the last line printed. NAME keeps it as
    /// ~/.config/rb/credential, mode 0600.
    Add {
        /// The user's name: 1–32 of A-Z a-z 0-9 . _ -
        name: String,
        /// Where the broker writes the credential (a path on the broker's machine).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// The users with a credential: name, created, last seen.
    List {
        /// Machine-readable output: a JSON array of user objects.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        broker: BrokerFlags,
    },
    /// Remove NAME's credential; their connections (agents, rb) are dropped at once.
    Revoke {
        /// The user's name.
        name: String,
        #[command(flatten)]
        broker: BrokerFlags,
    },
}

/// A flag given where it means nothing, or a value out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UsageError {
    #[error("{flag} means nothing to `rb {command}`\nhelp: drop it (see `rb {command} --help`)")]
    Meaningless {
        flag: &'static str,
        command: &'static str,
    },
    #[error("--grace-s {0} is not a number of seconds between 0 and 3600\nhelp: e.g. --grace-s 5")]
    Grace(f64),
}

impl Cli {
    /// Refuses broker flags given before a subcommand that has no use for them (`init`
    /// takes `--lab` and `--secret-file` as the files to write, `check` takes `--lab`).
    pub fn check_flags(&self) -> Result<(), UsageError> {
        if self.command.broker_flags().is_some() {
            return Ok(());
        }
        let meaningless = |flag| UsageError::Meaningless {
            flag,
            command: self.command.name(),
        };
        let b = &self.broker;
        let (lab_ok, secret_ok) = match self.command {
            Cmd::Init { .. } => (true, true),
            Cmd::Check { .. } => (true, false),
            _ => (false, false),
        };
        if b.broker.is_some() {
            return Err(meaningless("--broker"));
        }
        if b.lab.is_some() && !lab_ok {
            return Err(meaningless("--lab"));
        }
        if b.secret_file.is_some() && !secret_ok {
            return Err(meaningless("--secret-file"));
        }
        if b.credential.is_some() {
            return Err(meaningless("--credential"));
        }
        Ok(())
    }
}

/// `rb release --grace-s`: finite seconds in 0–3600 (as `agent --grace-s`), in milliseconds.
pub fn grace_ms(grace_s: Option<f64>) -> Result<Option<u64>, UsageError> {
    match grace_s {
        None => Ok(None),
        Some(g) if (0.0..=3600.0).contains(&g) => Ok(Some((g * 1000.0).round() as u64)),
        Some(g) => Err(UsageError::Grace(g)),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(argv: &[&str]) -> Result<Cli, String> {
        let cli = Cli::try_parse_from(std::iter::once("rb").chain(argv.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.check_flags().map_err(|e| e.to_string())?;
        Ok(cli)
    }

    #[test]
    fn release_grace_refuses_nan_negative_and_infinite_seconds() {
        for bad in [f64::NAN, -1.0, f64::INFINITY, f64::NEG_INFINITY, 3601.0] {
            assert_eq!(grace_ms(Some(bad)).ok(), None, "{bad}");
        }
        assert_eq!(grace_ms(Some(0.5)), Ok(Some(500)));
        assert_eq!(grace_ms(None), Ok(None));
        let cli = parse(&["release", "node03", "--grace-s", "NaN"]).expect("parses");
        let Cmd::Release { grace_s, .. } = cli.command else {
            panic!("release")
        };
        assert!(grace_ms(grace_s).is_err());
    }

    #[test]
    fn broker_flags_go_before_or_after_the_subcommand_and_nowhere_else() {
        let none = |_: &str| None;
        let cli = parse(&["--broker", "/s", "status"]).expect("before");
        let flags = cli
            .command
            .broker_flags()
            .expect("status talks to a broker");
        assert_eq!(flags.or(&cli.broker, none).broker.as_deref(), Some("/s"));
        let cli = parse(&["status", "--broker", "/t", "--json"]).expect("after");
        let flags = cli.command.broker_flags().expect("status");
        assert_eq!(flags.or(&cli.broker, none).broker.as_deref(), Some("/t"));
        let env = |k: &str| (k == "RB_BROKER").then(|| "/env".to_string());
        let cli = parse(&["jobs"]).expect("env");
        let flags = cli.command.broker_flags().expect("jobs");
        assert_eq!(flags.or(&cli.broker, env).broker.as_deref(), Some("/env"));
        let err = parse(&["--broker", "/s", "rsl", "check", "x=1"]).expect_err("meaningless");
        assert!(err.contains("--broker means nothing to `rb rsl`"), "{err}");
        assert!(parse(&["rsl", "check", "--broker", "/s", "x=1"]).is_err());
        assert!(parse(&["--lab", "/l", "demo"]).is_err());
        assert!(parse(&["--lab", "/l", "check"]).is_ok());
        assert!(parse(&["--lab", "/l", "--secret-file", "/s", "init"]).is_ok());
    }

    /// Every flag and argument of every subcommand, with its help.
    fn all_args(cmd: &clap::Command, path: &str, out: &mut Vec<(String, bool)>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            out.push((format!("{path} {id}"), arg.get_help().is_some()));
        }
        for sub in cmd.get_subcommands() {
            all_args(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    #[test]
    fn every_flag_and_argument_has_help_and_rsl_lists_no_broker_flag() {
        let mut args = Vec::new();
        all_args(&Cli::command(), "rb", &mut args);
        let missing: Vec<_> = args.iter().filter(|(_, has)| !has).collect();
        assert!(missing.is_empty(), "without help: {missing:?}");
        let mut rb = Cli::command();
        for sub in ["rsl", "lab", "demo"] {
            let help = rb
                .find_subcommand_mut(sub)
                .expect("subcommand")
                .render_long_help()
                .to_string();
            assert!(
                !help.contains("--broker"),
                "rb {sub} --help lists --broker:\n{help}"
            );
        }
    }
}
