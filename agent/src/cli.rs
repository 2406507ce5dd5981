//! `agent` command line → validated [`AgentConfig`]: the app and its arguments, the job
//! spec (from `--rsl` or the paper's trailing `-- '(module="pvm")'` form), and where the
//! broker is.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;

/// Run a job under ResourceBroker: `rsh anyLinux cmd` inside it gets a machine chosen now.
#[derive(Debug, Parser)]
#[command(name = "agent", version, trailing_var_arg = true)]
pub struct Args {
    /// Job spec in Globus RSL (e.g. '&(adaptive=yes)(module="pvm")'), or @FILE. With
    /// --rsl every word after the app is the app's, a trailing `-- '(…)'` included.
    #[arg(long, value_name = "SPEC|@FILE")]
    pub rsl: Option<String>,
    /// Broker: control-socket path or IP:port (default: $RB_BROKER, the lab file, else an
    /// embedded single-machine broker started for this job).
    #[arg(long, env = "RB_BROKER")]
    pub broker: Option<String>,
    /// Lab file (default ~/.config/rb/lab.toml).
    #[arg(long, env = "RB_LAB")]
    pub lab: Option<PathBuf>,
    /// Lab secret (default: the lab file's, else ~/.config/rb/secret).
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Grace period for the job's remote processes when a host is taken back, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub grace_s: f64,
    /// Time limit of a module's grow and halt programs, in seconds (see modules/CONTRACT.md;
    /// shrink gets the reclaim's grace period).
    #[arg(long, default_value_t = 60.0)]
    pub module_timeout_s: f64,
    /// Load librb_preload.so into the job (LD_PRELOAD): symbolic names such as `anyLinux`
    /// resolve (to a placeholder loopback address) in programs that look a host up before
    /// they run rsh (PVM's `add anyLinux`, `lamgrow anyLinux`; in a module job the lookup
    /// starts the request), and LAM's MPI_Init errno 14 bug is guarded. `auto`: for jobs
    /// with a module.
    #[arg(long, value_enum, default_value_t = Preload::Auto)]
    pub preload: Preload,
    /// The application and its arguments.
    #[arg(required = true, allow_hyphen_values = true)]
    pub app: Vec<String>,
}

/// When the job gets the preload library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preload {
    /// For jobs whose spec names a module (PVM, LAM, …).
    Auto,
    /// Always; an error if the library is missing.
    On,
    /// Never.
    Off,
}

/// Everything the agent needs, validated.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub app: Vec<String>,
    pub spec: Option<serde_json::Value>,
    pub adaptive: bool,
    pub broker: Option<String>,
    pub lab: Option<PathBuf>,
    pub secret_file: Option<PathBuf>,
    pub grace_ms: u64,
    /// The spec's `module` (validated name), if any.
    pub module: Option<String>,
    pub module_timeout: std::time::Duration,
    /// Whether the job gets the preload library, and whether its absence is an error.
    pub preload: Preload,
    /// The job's JEL pool settings (the spec's `jel`, checked; default reliable, uniform).
    pub jel: jel::pool::PoolConfig,
}

impl AgentConfig {
    pub fn from_args(args: Args) -> anyhow::Result<Self> {
        // With --rsl the spec is given: every word after the app is the app's own, a
        // trailing `-- '(…)'` included.
        let (app, spec_arg) = match args.rsl {
            Some(rsl) => (args.app, Some(rsl)),
            None => split_paper_form(args.app),
        };
        let spec_text = spec_arg.as_deref().map(read_spec).transpose()?;
        if let Some(broker) = &args.broker {
            crate::link::parse_broker(broker)?;
        }
        let (spec, adaptive) = match spec_text {
            Some(text) => parse_spec(&text)?,
            None => (None, false),
        };
        if !(0.0..=3600.0).contains(&args.grace_s) {
            bail!("--grace-s {} is out of range (0–3600)", args.grace_s);
        }
        if !(0.1..=3600.0).contains(&args.module_timeout_s) {
            bail!(
                "--module-timeout-s {} is out of range (0.1–3600)",
                args.module_timeout_s
            );
        }
        let module = spec.as_ref().and_then(module_name);
        if let Some(name) = &module {
            crate::module::check_name(name).map_err(|e| anyhow::anyhow!("job spec: {e}"))?;
        }
        let jel_value = spec.as_ref().and_then(jel_value).unwrap_or_default();
        let jel = jel::pool::PoolConfig::from_rsl(&jel_value)
            .map_err(|e| anyhow::anyhow!("job spec: {e}"))?;
        let preload = match (args.preload, &module) {
            (Preload::Auto, None) => Preload::Off,
            (choice, _) => choice,
        };
        Ok(Self {
            jel,
            preload,
            app,
            spec,
            adaptive,
            broker: args.broker,
            lab: args.lab,
            secret_file: args.secret_file,
            grace_ms: (args.grace_s * 1000.0) as u64,
            module,
            module_timeout: std::time::Duration::from_secs_f64(args.module_timeout_s),
        })
    }
}

/// The paper's form: `agent app args -- '(module="pvm")'` — a final `--` followed by one
/// word that starts like RSL. Anything else after `--` belongs to the app (and with `--rsl`
/// everything does: that is the way to run an app whose own last arguments are `-- (…)`).
fn split_paper_form(mut app: Vec<String>) -> (Vec<String>, Option<String>) {
    let n = app.len();
    let looks_like_rsl = |s: &str| s.starts_with('(') || s.starts_with("&(") || s.starts_with("+(");
    if n >= 3 && app[n - 2] == "--" && looks_like_rsl(&app[n - 1]) {
        let spec = app.pop();
        app.pop();
        return (app, spec);
    }
    (app, None)
}

/// The spec text: `@FILE` (or `@-`, standard input) read, at most
/// [`rsl::input::MAX_SPEC_BYTES`].
fn read_spec(arg: &str) -> anyhow::Result<String> {
    let (name, bytes) = rsl::input::read_spec_arg(arg).context("job spec")?;
    String::from_utf8(bytes).map_err(|_| {
        anyhow::anyhow!(
            "job spec {}: not UTF-8 text",
            name.as_deref().unwrap_or("argument")
        )
    })
}

/// Strict RSL → JobSpec JSON and the adaptive flag.
fn parse_spec(text: &str) -> anyhow::Result<(Option<serde_json::Value>, bool)> {
    let spec = rsl::JobSpec::from_rsl_text(text).map_err(|e| anyhow::anyhow!("job spec: {e}"))?;
    let json = serde_json::to_value(&spec)?;
    let adaptive = adaptive_flag(&json);
    Ok((Some(json), adaptive))
}

/// The `module` of the spec's first part that names one.
fn module_name(spec: &serde_json::Value) -> Option<String> {
    let of = |p: &serde_json::Value| p.get("module").and_then(|m| m.as_str()).map(String::from);
    match spec.get("parts").and_then(|p| p.as_array()) {
        Some(parts) => parts.iter().find_map(of),
        None => of(spec),
    }
}

/// The `jel` of the spec's first part that has one.
fn jel_value(spec: &serde_json::Value) -> Option<String> {
    let of = |p: &serde_json::Value| p.get("jel").and_then(|m| m.as_str()).map(String::from);
    match spec.get("parts").and_then(|p| p.as_array()) {
        Some(parts) => parts.iter().find_map(of),
        None => of(spec),
    }
}

/// `adaptive = yes` in any part of the spec.
fn adaptive_flag(spec: &serde_json::Value) -> bool {
    let part_adaptive =
        |p: &serde_json::Value| p.get("adaptive").and_then(|a| a.as_bool()).unwrap_or(false);
    match spec.get("parts").and_then(|p| p.as_array()) {
        Some(parts) => parts.iter().any(part_adaptive),
        None => part_adaptive(spec),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn paper_form_is_split_off() {
        let (app, spec) = split_paper_form(strings(&["pvm", "--", "(module=\"pvm\")"]));
        assert_eq!(app, vec!["pvm"]);
        assert_eq!(spec.as_deref(), Some("(module=\"pvm\")"));
        let (app, spec) = split_paper_form(strings(&["make", "--", "-j4"]));
        assert_eq!(app, strings(&["make", "--", "-j4"]));
        assert!(spec.is_none());
    }

    fn parse(argv: &[&str]) -> anyhow::Result<AgentConfig> {
        let mut all = vec!["agent"];
        all.extend_from_slice(argv);
        AgentConfig::from_args(Args::try_parse_from(all)?)
    }

    #[test]
    fn with_rsl_a_trailing_dash_dash_spec_belongs_to_the_app() {
        let argv = [
            "--rsl",
            "&(count=1)",
            "--",
            "sh",
            "-c",
            "x",
            "--",
            "(module=\"pvm\")",
        ];
        let cfg = parse(&argv).expect("the app's own `-- (…)` is not a second spec");
        assert_eq!(cfg.app, strings(&argv[3..]));
        assert_eq!(cfg.module, None);
        let cfg = parse(&["--rsl", "&(count=1)", "make", "--", "-j4"]).expect("ok");
        assert_eq!(cfg.app, strings(&["make", "--", "-j4"]));
    }

    #[test]
    fn every_flag_and_argument_has_help() {
        use clap::CommandFactory;
        let cmd = Args::command();
        let missing: Vec<_> = cmd
            .get_arguments()
            .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
            .filter(|a| a.get_help().is_none())
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(missing.is_empty(), "without help: {missing:?}");
    }

    #[test]
    fn a_bad_broker_value_is_a_usage_error() {
        let err = parse(&["--broker", "node01", "sh"]).expect_err("neither path nor IP:port");
        assert!(err.to_string().contains("--broker `node01`"), "{err}");
        assert!(parse(&["--broker", "127.0.0.1:7700", "sh"]).is_ok());
        assert!(parse(&["--broker", "/run/rb/broker.sock", "sh"]).is_ok());
    }

    #[test]
    fn module_comes_from_the_spec_and_bad_names_are_refused() {
        let parse = |argv: &[&str]| {
            let mut all = vec!["agent"];
            all.extend_from_slice(argv);
            AgentConfig::from_args(Args::parse_from(all))
        };
        let cfg = parse(&["--rsl", "&(adaptive=yes)(module=\"pvm\")", "pvm"]).expect("ok");
        assert_eq!(cfg.module.as_deref(), Some("pvm"));
        assert!(cfg.adaptive);
        let cfg = parse(&["pvm", "--", "(module=\"lam\")"]).expect("ok");
        assert_eq!(cfg.module.as_deref(), Some("lam"));
        assert_eq!(parse(&["sh"]).expect("ok").module, None);
        assert_eq!(parse(&["sh"]).expect("ok").preload, Preload::Off);
        let on = parse(&["--preload", "on", "sh"]).expect("ok");
        assert_eq!(on.preload, Preload::On);
        let pvm = parse(&["pvm", "--", "(module=\"pvm\")"]).expect("ok");
        assert_eq!(
            pvm.preload,
            Preload::Auto,
            "auto stays auto for module jobs"
        );
        let err = parse(&["--rsl", "&(module=\"../x\")", "sh"]).expect_err("bad name");
        assert!(err.to_string().contains("module name `../x`"), "{err}");
        let err = parse(&["--module-timeout-s", "0", "sh"]).expect_err("range");
        assert!(err.to_string().contains("--module-timeout-s"), "{err}");
    }

    #[test]
    fn the_jel_value_is_checked_before_the_job_starts() {
        let cfg = parse(&["--rsl", "(adaptive=yes)(jel=\"unreliable\")", "sh"])
            .expect("a good jel value");
        assert_eq!(cfg.jel.membership, jel::pool::Membership::Unreliable);
        assert_eq!(
            parse(&["sh"]).expect("no spec").jel,
            jel::pool::PoolConfig::default()
        );
        let e = parse(&["--rsl", "(jel=\"sometimes\")", "sh"]).expect_err("a bad jel value");
        let text = format!("{e:#}");
        assert!(
            text.contains("job spec") && text.contains("`sometimes`"),
            "{text}"
        );
    }
}
