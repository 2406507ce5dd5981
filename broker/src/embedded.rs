//! The single-machine default: a lab of virtual hosts on this machine (local transport),
//! used when no lab file is configured, so that a fresh machine can run everything.

use std::{path::Path, time::Duration};

use config::{BrokerSettings, HostEntry, LabConfig, Transport};

/// Default number of virtual hosts.
pub const DEFAULT_HOSTS: usize = 4;

/// Builds the embedded lab in `state_dir` (created or verified private, see
/// [`privdir::create_private`]), creating its secret (mode 0600) if missing.
/// Hosts are `vhost01`…; all public, labelled `virtual`.
pub fn lab(state_dir: &Path, hosts: usize) -> std::io::Result<LabConfig> {
    privdir::create_private(state_dir).map_err(std::io::Error::other)?;
    let secret_file = state_dir.join("secret");
    if !secret_file.exists() {
        proto::auth::write_new_secret(&secret_file, false)?;
    }
    let hosts = (1..=hosts)
        .map(|i| HostEntry {
            name: format!("vhost{i:02}"),
            address: "127.0.0.1".into(),
            labels: vec!["public".into(), "virtual".into()],
            owner: None,
        })
        .collect();
    Ok(LabConfig {
        source: None,
        broker: BrokerSettings {
            listen: ([127, 0, 0, 1], 0).into(),
            transport: Transport::Local,
            state_dir: state_dir.to_path_buf(),
            secret_file,
            report_interval: Duration::from_secs(2),
            down_after: Duration::from_secs(6),
            restart_backoff_max: Duration::from_secs(4),
            hostd_path: None,
            ssh_command: vec!["ssh".into()],
            rsh_command: vec!["rsh".into()],
            job_shell: None,
            reclaim_grace: Duration::from_secs(5),
            policy: "paper".into(),
            // Its state dir is in the runtime dir, in memory: a smaller trace.
            trace_file_max_bytes: EMBEDDED_TRACE_FILE_MAX_BYTES,
            trace_files_kept: EMBEDDED_TRACE_FILES_KEPT,
        },
        hosts,
        overflow: None,
        web: None,
    })
}

/// The embedded broker's decision trace: files of 1 MiB, the newest 4 kept (its state dir
/// is in the runtime dir, usually in memory).
pub const EMBEDDED_TRACE_FILE_MAX_BYTES: u64 = 1 << 20;
pub const EMBEDDED_TRACE_FILES_KEPT: usize = 4;

/// The embedded lab's default state dir: `embedded` in the private runtime root
/// (`$XDG_RUNTIME_DIR/rb/embedded`, else `/tmp/rb-<uid>/embedded`).
pub fn default_state_dir() -> std::path::PathBuf {
    privdir::embedded_state_dir()
}
