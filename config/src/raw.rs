//! The lab file exactly as written: serde structs with `deny_unknown_fields` and spans.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLab {
    pub broker: RawBroker,
    #[serde(default)]
    pub host: Vec<RawHost>,
    #[serde(default)]
    pub overflow: Option<RawOverflow>,
    #[serde(default)]
    pub web: Option<RawWeb>,
}

/// `[web]`: the HTTP listener for metrics and the JSON view.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWeb {
    pub listen: Spanned<String>,
    #[serde(default)]
    pub jobs: Option<Spanned<String>>,
}

/// `[overflow]`: other systems the lab may grow onto when it is full.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverflow {
    #[serde(default)]
    pub slurm: Option<Spanned<RawSlurm>>,
}

/// `[overflow.slurm]`: pilot jobs on a Slurm cluster.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSlurm {
    #[serde(default)]
    pub partition: Option<Spanned<String>>,
    #[serde(default)]
    pub max_nodes: Option<Spanned<i64>>,
    #[serde(default)]
    pub lease_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub idle_exit_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub sbatch: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub squeue: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub scancel: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub scontrol: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub sbatch_args: Option<Spanned<Vec<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBroker {
    pub listen: Spanned<String>,
    #[serde(default)]
    pub transport: Option<Spanned<String>>,
    pub state_dir: Spanned<String>,
    #[serde(default)]
    pub secret_file: Option<String>,
    #[serde(default)]
    pub report_interval_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub down_after_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub restart_backoff_max_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub hostd_path: Option<String>,
    #[serde(default)]
    pub ssh_command: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub rsh_command: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub job_shell: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub reclaim_grace_s: Option<Spanned<f64>>,
    #[serde(default)]
    pub policy: Option<Spanned<String>>,
    #[serde(default)]
    pub trace_file_max_kib: Option<Spanned<i64>>,
    #[serde(default)]
    pub trace_files_kept: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    pub name: Spanned<String>,
    #[serde(default)]
    pub address: Option<Spanned<String>>,
    #[serde(default)]
    pub labels: Vec<Spanned<String>>,
    #[serde(default)]
    pub owner: Option<Spanned<String>>,
}
