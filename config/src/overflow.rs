//! `[overflow.slurm]` of the lab file: the validated settings of overflow onto a Slurm
//! cluster and their checks.
//!
//! ```toml
//! [overflow.slurm]
//! partition = "short"            # default: Slurm's default partition
//! max_nodes = 4                  # pilots at once (default 1)
//! lease_s = 3600                 # a pilot's time limit, rounded up to whole minutes
//! idle_exit_s = 60               # an unused pilot ends itself after this long
//! sbatch = ["sbatch"]            # the commands (default: found on PATH)
//! squeue = ["squeue"]
//! scancel = ["scancel"]
//! scontrol = ["scontrol"]        # read once: KillWait, a cancelled pilot's last seconds
//! sbatch_args = ["--account=lab", "--qos=short"]   # more sbatch options
//! ```
//!
//! The broker sets `--parsable`, `-N1`, `--exclusive`, `--no-requeue`, `--time`,
//! `--signal`, `--job-name` and `--partition` itself: `sbatch_args` naming one of them is an error.

use std::time::Duration;

use toml::Spanned;

use crate::{error::ConfigError, raw::RawSlurm};

/// Validated `[overflow.slurm]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmOverflow {
    /// `--partition`; `None` = the cluster's default partition.
    pub partition: Option<String>,
    /// How many pilots (one node each) may exist at once.
    pub max_nodes: u32,
    /// A pilot's time limit (whole minutes: Slurm's `--time` has minute resolution).
    pub lease: Duration,
    /// How long a pilot may stay unused before it ends itself.
    pub idle_exit: Duration,
    /// The `sbatch` command (program and leading arguments).
    pub sbatch: Vec<String>,
    /// The `squeue` command.
    pub squeue: Vec<String>,
    /// The `scancel` command.
    pub scancel: Vec<String>,
    /// The `scontrol` command (`scontrol show config`: Slurm's `KillWait`).
    pub scontrol: Vec<String>,
    /// More `sbatch` options (`--account=…`, `--qos=…`, `--constraint=…`).
    pub sbatch_args: Vec<String>,
}

/// Default of `max_nodes`.
pub const DEFAULT_MAX_NODES: u32 = 1;
/// Default of `lease_s`: one hour.
pub const DEFAULT_LEASE_S: f64 = 3600.0;
/// Default of `idle_exit_s`.
pub const DEFAULT_IDLE_EXIT_S: f64 = 60.0;

/// `sbatch` options the broker sets itself, long and short forms.
const OWN_OPTIONS: &[&str] = &[
    "--parsable",
    "-N",
    "--nodes",
    "--exclusive",
    "--no-requeue",
    "--requeue",
    "-t",
    "--time",
    "--signal",
    "-J",
    "--job-name",
    "-p",
    "--partition",
    "--wrap",
];

/// Pilot jobs' names start with this (`rb-pilot-…`), so that they can be told from other
/// jobs in `squeue`.
pub const PILOT_JOB_PREFIX: &str = "rb-pilot";

impl SlurmOverflow {
    /// `lease` in Slurm's `--time` minutes.
    pub fn lease_minutes(&self) -> u64 {
        self.lease.as_secs().div_ceil(60)
    }

    /// The `sbatch` options of one pilot job named `job_name`, warned with SIGUSR1 to its
    /// job step (the pilot's `rb-hostd`, not the batch shell) `warning` before its time
    /// limit (Slurm rounds that up to whole seconds and may send it up to a minute early):
    /// `-N1 --exclusive --no-requeue --time --signal --job-name`, the partition,
    /// `--output=/dev/null`, then `sbatch_args`. `--parsable` and the script
    /// are the caller's. Without `--output`, Slurm writes `slurm-JOBID.out` in the broker's
    /// working directory (a checkout's `tests/` in the test suite), and a compute node
    /// without that directory cannot write it; `sbatch_args` may name another `--output`
    /// (sbatch's last option wins).
    pub fn pilot_options(&self, job_name: &str, warning: Duration) -> Vec<String> {
        let warning_s = warning.as_secs_f64().ceil().max(1.0) as u64;
        let mut args = vec![
            "-N1".to_string(),
            "--exclusive".to_string(),
            // A pilot Slurm requeues (after a preemption or a node failure) would start
            // again later, unasked for: the broker asks for nodes when it needs them.
            "--no-requeue".to_string(),
            format!("--time={}", self.lease_minutes()),
            format!("--signal=USR1@{warning_s}"),
            format!("--job-name={job_name}"),
        ];
        if let Some(p) = &self.partition {
            args.push(format!("--partition={p}"));
        }
        args.push("--output=/dev/null".to_string());
        args.extend(self.sbatch_args.iter().cloned());
        args
    }
}

/// Where errors point (the file's text and path) and what `validate` needs from the rest
/// of the file.
pub(crate) struct Ctx<'a> {
    pub text: &'a str,
    pub path: Option<&'a std::path::Path>,
    /// `[broker] reclaim_grace_s`: the lease must be longer than the warning before it.
    pub reclaim_grace: Duration,
}

impl Ctx<'_> {
    fn err<T>(
        &self,
        at: &Spanned<T>,
        key: &str,
        msg: impl Into<String>,
        help: impl Into<String>,
    ) -> ConfigError {
        ConfigError::at(self.text, self.path, Some(at.span().start), key).msg(msg, help)
    }
}

/// Checks `[overflow.slurm]` and fills in defaults.
pub(crate) fn validate(ctx: &Ctx, raw: &Spanned<RawSlurm>) -> Result<SlurmOverflow, ConfigError> {
    let r = raw.get_ref();
    let partition = match &r.partition {
        Some(p) => Some(partition(ctx, p)?),
        None => None,
    };
    let max_nodes = match &r.max_nodes {
        None => DEFAULT_MAX_NODES,
        Some(v) => match u32::try_from(*v.get_ref()) {
            Ok(n) if (1..=1024).contains(&n) => n,
            _ => {
                return Err(ctx.err(
                    v,
                    "overflow.slurm.max_nodes",
                    format!("{} is out of range", v.get_ref()),
                    "use a whole number of nodes between 1 and 1024",
                ))
            }
        },
    };
    let lease = seconds(
        ctx,
        &r.lease_s,
        "overflow.slurm.lease_s",
        DEFAULT_LEASE_S,
        60.0,
    )?;
    let lease = Duration::from_secs(lease.as_secs_f64().ceil() as u64);
    if lease <= ctx.reclaim_grace {
        let at = r
            .lease_s
            .as_ref()
            .map_or(raw.span().start, |s| s.span().start);
        return Err(
            ConfigError::at(ctx.text, ctx.path, Some(at), "overflow.slurm.lease_s").msg(
                format!(
                    "a lease of {} s is not longer than broker.reclaim_grace_s ({} s)",
                    lease.as_secs(),
                    ctx.reclaim_grace.as_secs_f64()
                ),
                "Slurm warns a pilot reclaim_grace_s before its lease ends: make lease_s longer",
            ),
        );
    }
    let idle_exit = seconds(
        ctx,
        &r.idle_exit_s,
        "overflow.slurm.idle_exit_s",
        DEFAULT_IDLE_EXIT_S,
        1.0,
    )?;
    Ok(SlurmOverflow {
        partition,
        max_nodes,
        lease,
        idle_exit,
        sbatch: command(ctx, &r.sbatch, "overflow.slurm.sbatch", "sbatch")?,
        squeue: command(ctx, &r.squeue, "overflow.slurm.squeue", "squeue")?,
        scancel: command(ctx, &r.scancel, "overflow.slurm.scancel", "scancel")?,
        scontrol: command(ctx, &r.scontrol, "overflow.slurm.scontrol", "scontrol")?,
        sbatch_args: sbatch_args(ctx, &r.sbatch_args)?,
    })
}

fn partition(ctx: &Ctx, p: &Spanned<String>) -> Result<String, ConfigError> {
    let s = p.get_ref();
    let ok = !s.is_empty()
        && !s.starts_with('-')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(s.clone())
    } else {
        Err(ctx.err(
            p,
            "overflow.slurm.partition",
            format!("`{s}` is not a partition name"),
            "write one partition's name as `sinfo -s` lists it (letters, digits, '-', '_', '.'), \
             or remove the key for the cluster's default partition",
        ))
    }
}

/// Seconds in `min..=one year`, `default` when absent.
fn seconds(
    ctx: &Ctx,
    value: &Option<Spanned<f64>>,
    key: &str,
    default: f64,
    min: f64,
) -> Result<Duration, ConfigError> {
    const MAX: f64 = 366.0 * 86400.0;
    let Some(v) = value else {
        return Ok(Duration::from_secs_f64(default));
    };
    let secs = *v.get_ref();
    if !(min..=MAX).contains(&secs) {
        return Err(ctx.err(
            v,
            key,
            format!("{secs} is out of range"),
            format!("use a number of seconds between {min} and {MAX}"),
        ));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn command(
    ctx: &Ctx,
    value: &Option<Spanned<Vec<String>>>,
    key: &str,
    default: &str,
) -> Result<Vec<String>, ConfigError> {
    match value {
        None => Ok(vec![default.to_string()]),
        Some(v) if v.get_ref().first().is_none_or(|p| p.trim().is_empty()) => Err(ctx.err(
            v,
            key,
            "must name a program",
            format!("e.g. [\"{default}\"] or [\"/opt/slurm/bin/{default}\"]; remove the key to use `{default}` from PATH"),
        )),
        Some(v) => Ok(v.get_ref().clone()),
    }
}

fn sbatch_args(
    ctx: &Ctx,
    value: &Option<Spanned<Vec<String>>>,
) -> Result<Vec<String>, ConfigError> {
    let Some(v) = value else {
        return Ok(Vec::new());
    };
    let key = "overflow.slurm.sbatch_args";
    for arg in v.get_ref() {
        if !arg.starts_with('-') {
            return Err(ctx.err(
                v,
                key,
                format!("`{arg}` is not an sbatch option"),
                "write options only, each with its value: [\"--account=lab\", \"--qos=short\"]",
            ));
        }
        let name = arg.split('=').next().unwrap_or(arg);
        let short_with_value = OWN_OPTIONS
            .iter()
            .any(|o| o.len() == 2 && arg.starts_with(o) && arg.len() > 2 && !arg.starts_with("--"));
        if OWN_OPTIONS.contains(&name) || short_with_value {
            return Err(ctx.err(
                v,
                key,
                format!("`{arg}` is set by the broker"),
                "the broker sets --parsable, -N1, --exclusive, --time (from lease_s), --signal, \
                 --job-name and --partition (from partition): remove it",
            ));
        }
    }
    Ok(v.get_ref().clone())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::LabConfig;

    const BROKER: &str = "[broker]\nlisten = \"10.77.0.1:7700\"\nstate_dir = \"/var/tmp/x\"\n";

    fn parse(slurm: &str) -> Result<LabConfig, crate::ConfigError> {
        let text = format!("{BROKER}\n[overflow.slurm]\n{slurm}");
        LabConfig::parse(&text, Some(Path::new("lab.toml")))
    }

    fn error(slurm: &str) -> String {
        parse(slurm).expect_err("invalid").to_string()
    }

    #[test]
    fn without_the_table_there_is_no_overflow() {
        let lab = LabConfig::parse(BROKER, None).expect("valid");
        assert_eq!(lab.overflow, None);
    }

    #[test]
    fn an_empty_table_takes_the_defaults() {
        let s = parse("").expect("valid").overflow.expect("slurm");
        assert_eq!(s.partition, None);
        assert_eq!(s.max_nodes, 1);
        assert_eq!(s.lease.as_secs(), 3600);
        assert_eq!(s.lease_minutes(), 60);
        assert_eq!(s.idle_exit.as_secs(), 60);
        assert_eq!(s.sbatch, ["sbatch"]);
        assert_eq!(s.squeue, ["squeue"]);
        assert_eq!(s.scancel, ["scancel"]);
        assert_eq!(s.scontrol, ["scontrol"]);
        assert!(s.sbatch_args.is_empty());
    }

    #[test]
    fn every_key_is_read() {
        let s = parse(
            "partition = \"short\"\nmax_nodes = 3\nlease_s = 130\nidle_exit_s = 5\n\
             sbatch = [\"/opt/slurm/bin/sbatch\", \"-v\"]\nsqueue = [\"/opt/q\"]\n\
             scancel = [\"/opt/c\"]\nscontrol = [\"/opt/s\"]\nsbatch_args = [\"--account=lab\", \"--qos=short\"]\n",
        )
        .expect("valid")
        .overflow
        .expect("slurm");
        assert_eq!(s.partition.as_deref(), Some("short"));
        assert_eq!(s.max_nodes, 3);
        assert_eq!(s.lease.as_secs(), 130);
        assert_eq!(s.lease_minutes(), 3, "rounded up to whole minutes");
        assert_eq!(s.idle_exit.as_secs(), 5);
        assert_eq!(s.sbatch, ["/opt/slurm/bin/sbatch", "-v"]);
        assert_eq!(s.squeue, ["/opt/q"]);
        assert_eq!(s.scancel, ["/opt/c"]);
        assert_eq!(s.scontrol, ["/opt/s"]);
        assert_eq!(s.sbatch_args, ["--account=lab", "--qos=short"]);
    }

    #[test]
    fn pilot_options_carry_the_lease_the_warning_and_the_extra_arguments() {
        let s = parse("partition = \"short\"\nlease_s = 130\nsbatch_args = [\"--qos=low\"]\n")
            .expect("valid")
            .overflow
            .expect("slurm");
        let args = s.pilot_options("rb-pilot-x", std::time::Duration::from_millis(4500));
        assert_eq!(
            args,
            [
                "-N1",
                "--exclusive",
                "--no-requeue",
                "--time=3",
                "--signal=USR1@5",
                "--job-name=rb-pilot-x",
                "--partition=short",
                "--output=/dev/null",
                "--qos=low"
            ]
        );
    }

    #[test]
    fn unknown_keys_are_errors_with_line_and_suggestion() {
        let e = error("partition = \"a\"\nmax_node = 2\n");
        assert!(e.contains("lab.toml:7"), "{e}");
        assert!(e.contains("overflow.slurm.max_node"), "{e}");
        assert!(e.contains("did you mean `max_nodes`"), "{e}");
        let e = LabConfig::parse(&format!("{BROKER}[overflow.pbs]\nx = 1\n"), None)
            .expect_err("unknown system")
            .to_string();
        assert!(e.contains("overflow.pbs"), "{e}");
    }

    #[test]
    fn bad_values_name_the_key_and_line() {
        for (slurm, key, says) in [
            ("max_nodes = 0", "overflow.slurm.max_nodes", "out of range"),
            ("lease_s = 30", "overflow.slurm.lease_s", "out of range"),
            ("lease_s = 60\n", "overflow.slurm.lease_s", ""),
            (
                "idle_exit_s = 0",
                "overflow.slurm.idle_exit_s",
                "out of range",
            ),
            (
                "partition = \"-x\"",
                "overflow.slurm.partition",
                "not a partition",
            ),
            (
                "sbatch = []",
                "overflow.slurm.sbatch",
                "must name a program",
            ),
            (
                "scancel = [\" \"]",
                "overflow.slurm.scancel",
                "must name a program",
            ),
            (
                "sbatch_args = [\"--time=5\"]",
                "overflow.slurm.sbatch_args",
                "set by the broker",
            ),
            (
                "sbatch_args = [\"-pshort\"]",
                "overflow.slurm.sbatch_args",
                "set by the broker",
            ),
            (
                "sbatch_args = [\"lab\"]",
                "overflow.slurm.sbatch_args",
                "not an sbatch option",
            ),
            // Type errors come from the TOML reader: line and column, no key name.
            ("max_nodes = \"2\"", "", "invalid type"),
        ] {
            if says.is_empty() {
                // 60 s is longer than the default 5 s grace: valid.
                assert!(parse(slurm).is_ok(), "{slurm}");
                continue;
            }
            let e = error(slurm);
            assert!(e.contains("lab.toml:6"), "{slurm}: {e}");
            assert!(e.contains(key) && e.contains(says), "{slurm}: {e}");
            assert!(e.contains("help:"), "{slurm}: {e}");
        }
    }

    #[test]
    fn the_lease_must_outlast_the_reclaim_grace() {
        let text =
            "[broker]\nlisten = \"10.77.0.1:7700\"\nstate_dir = \"/x\"\nreclaim_grace_s = 90\n\
                    [overflow.slurm]\nlease_s = 90\n";
        let e = LabConfig::parse(text, None)
            .expect_err("too short")
            .to_string();
        assert!(
            e.contains("overflow.slurm.lease_s") && e.contains("reclaim_grace_s"),
            "{e}"
        );
    }

    #[test]
    fn a_listen_address_compute_nodes_cannot_reach_is_warned_about() {
        let with = |listen: &str, overflow: bool| {
            let text = format!(
                "[broker]\nlisten = \"{listen}\"\nstate_dir = \"/x\"\ntransport = \"local\"\n{}",
                if overflow { "[overflow.slurm]\n" } else { "" }
            );
            LabConfig::parse(&text, None).expect("valid").warnings()
        };
        for listen in ["127.0.0.1:7700", "0.0.0.0:7700"] {
            let w = with(listen, true);
            assert_eq!(w.len(), 1, "{listen}: {w:?}");
            assert_eq!(w[0].key, "broker.listen");
            assert!(w[0].message.contains("compute nodes cannot reach"), "{w:?}");
            assert!(with(listen, false).is_empty(), "no overflow, no warning");
        }
        assert!(with("10.1.0.5:7700", true).is_empty());
    }
}
