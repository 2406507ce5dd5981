//! How a host daemon is started on a host: the command line for each transport.
//!
//! `ssh`/`rsh` run `rb-hostd` on the host through the real remote shell (the remote command
//! is one shell-quoted string, since remote shells join and re-parse words); `local` runs it
//! as a child on this machine (virtual hosts); `manual` starts nothing.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use config::{HostEntry, LabConfig, Transport};

/// Everything needed to build launch commands.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub transport: Transport,
    /// The broker address daemons connect back to (the bound address, real port).
    pub broker_addr: SocketAddr,
    pub hostd_path: PathBuf,
    pub secret_file: PathBuf,
    pub state_dir: PathBuf,
    pub ssh_command: Vec<String>,
    pub rsh_command: Vec<String>,
    pub job_shell: Option<Vec<String>>,
    pub log_filter: Option<String>,
}

impl LaunchSpec {
    pub fn new(lab: &LabConfig, broker_addr: SocketAddr) -> Self {
        let hostd_path = lab
            .broker
            .hostd_path
            .clone()
            .unwrap_or_else(default_hostd_path);
        Self {
            transport: lab.broker.transport,
            broker_addr,
            hostd_path,
            secret_file: lab.broker.secret_file.clone(),
            state_dir: lab.broker.state_dir.clone(),
            ssh_command: lab.broker.ssh_command.clone(),
            rsh_command: lab.broker.rsh_command.clone(),
            job_shell: lab.broker.job_shell.clone(),
            log_filter: std::env::var("RB_HOSTD_LOG").ok(),
        }
    }

    /// The program and arguments that start `host`'s daemon, or `None` for `manual`.
    pub fn command(&self, host: &HostEntry) -> Option<Vec<String>> {
        let daemon = self.daemon_argv(host);
        match self.transport {
            Transport::Manual => None,
            Transport::Local => Some(daemon),
            Transport::Ssh => {
                let mut argv = self.ssh_command.clone();
                argv.extend(
                    ["-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3"].map(String::from),
                );
                argv.push(host.address.clone());
                argv.push(remote_command(&daemon, self.log_filter.as_deref()));
                Some(argv)
            }
            Transport::Rsh => {
                let mut argv = self.rsh_command.clone();
                argv.push(host.address.clone());
                argv.push(remote_command(&daemon, self.log_filter.as_deref()));
                Some(argv)
            }
        }
    }

    /// The remote shell jobs use to reach hosts (program and leading arguments; the shim
    /// appends `[-n] [-l USER] ADDRESS COMMAND`). For virtual hosts it is the subagent's
    /// `local-shell` mode, which runs the command on this machine.
    pub fn remote_shell(&self) -> Vec<String> {
        if let Some(shell) = &self.job_shell {
            return shell.clone();
        }
        match self.transport {
            Transport::Ssh | Transport::Manual => {
                let mut argv = self.ssh_command.clone();
                argv.extend(["-o", "BatchMode=yes"].map(String::from));
                argv
            }
            Transport::Rsh => self.rsh_command.clone(),
            Transport::Local => {
                let subagent = self.hostd_path.with_file_name("rb-subagent");
                vec![subagent.display().to_string(), "local-shell".into()]
            }
        }
    }

    fn daemon_argv(&self, host: &HostEntry) -> Vec<String> {
        let mut argv = vec![
            self.hostd_path.display().to_string(),
            "--broker".into(),
            self.broker_addr.to_string(),
            "--host".into(),
            host.name.clone(),
            "--secret-file".into(),
            self.secret_file.display().to_string(),
            "--lifeline-stdin".into(),
        ];
        if self.transport == Transport::Local {
            let dir = self.host_dir(&host.name);
            argv.extend([
                "--lock-dir".into(),
                dir.display().to_string(),
                "--overlay".into(),
                dir.join("overlay.toml").display().to_string(),
            ]);
        }
        argv
    }

    /// Per-host directory under the state dir (logs; lock and overlay for virtual hosts).
    pub fn host_dir(&self, host: &str) -> PathBuf {
        self.state_dir.join("hosts").join(host)
    }
}

/// `rb-hostd` next to the running executable.
pub fn default_hostd_path() -> PathBuf {
    config::sibling_program("rb-hostd")
}

/// One shell command string: `exec 'word' 'word' …`, with an optional log filter.
fn remote_command(argv: &[String], log_filter: Option<&str>) -> String {
    let mut out = String::from("exec ");
    if let Some(filter) = log_filter {
        out.push_str(&format!("env RB_LOG={} ", shell_quote(filter)));
    }
    let words: Vec<String> = argv.iter().map(|w| shell_quote(w)).collect();
    out.push_str(&words.join(" "));
    out
}

/// Quotes a word for a POSIX shell.
pub fn shell_quote(word: &str) -> String {
    let safe = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@,+".contains(c));
    if safe {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// Where a host's daemon output is kept.
pub fn log_path(state_dir: &Path, host: &str) -> PathBuf {
    state_dir.join("logs").join(format!("hostd-{host}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(transport: Transport) -> LaunchSpec {
        LaunchSpec {
            transport,
            broker_addr: "10.77.0.1:7700".parse().expect("addr"),
            hostd_path: PathBuf::from("/opt/rb/bin/rb-hostd"),
            secret_file: PathBuf::from("/home/al ice/.config/rb/secret"),
            state_dir: PathBuf::from("/var/tmp/rb"),
            ssh_command: vec!["ssh".into(), "-F".into(), "/x/cfg".into()],
            rsh_command: vec!["rsh".into()],
            job_shell: None,
            log_filter: None,
        }
    }

    #[test]
    fn job_shell_overrides_the_transports_remote_shell_for_jobs() {
        let mut s = spec(Transport::Ssh);
        assert_eq!(s.remote_shell()[..3], ["ssh", "-F", "/x/cfg"]);
        s.job_shell = Some(vec!["rsh".into()]);
        assert_eq!(s.remote_shell(), ["rsh"]);
        let daemon = s.command(&host()).expect("ssh");
        assert_eq!(daemon[0], "ssh", "daemons keep the transport");
    }

    fn host() -> HostEntry {
        HostEntry {
            name: "node02".into(),
            address: "10.77.0.2".into(),
            labels: vec![],
            owner: None,
        }
    }

    #[test]
    fn ssh_command_quotes_the_remote_words() {
        let argv = spec(Transport::Ssh).command(&host()).expect("ssh");
        assert_eq!(&argv[..3], ["ssh", "-F", "/x/cfg"]);
        assert_eq!(argv[argv.len() - 2], "10.77.0.2");
        let remote = argv.last().expect("remote");
        assert!(
            remote.starts_with("exec /opt/rb/bin/rb-hostd --broker 10.77.0.1:7700 --host node02"),
            "{remote}"
        );
        assert!(
            remote.contains("'/home/al ice/.config/rb/secret'"),
            "{remote}"
        );
    }

    #[test]
    fn local_command_gets_private_lock_and_overlay() {
        let argv = spec(Transport::Local).command(&host()).expect("local");
        assert_eq!(argv[0], "/opt/rb/bin/rb-hostd");
        assert!(argv.contains(&"/var/tmp/rb/hosts/node02/overlay.toml".to_string()));
        assert!(spec(Transport::Manual).command(&host()).is_none());
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("a/b-c"), "a/b-c");
    }
}
