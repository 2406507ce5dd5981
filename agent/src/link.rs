//! The agent's connection to the broker: find it (flag, env, lab file, else an embedded
//! single-machine broker started for this job), authenticate, register the job.
//!
//! Over TCP the agent proves the lab secret, or a user's credential: the one
//! `RB_CREDENTIAL` names, else `~/.config/rb/credential` when the lab secret is not
//! readable ([`proto::credential::load_tcp_key`]). The broker gives the job to the user it
//! authenticated, whatever `JobRegistration.user` says.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use proto::{
    credential::load_tcp_key,
    frame::FramedConn,
    handshake::{client_handshake, ClientAuth},
    msg::{FromBroker, JobRegistration, Role, ToBroker},
    peercred::BrokerSocketError,
};
use tokio::io::{AsyncRead, AsyncWrite};

/// Any byte stream to the broker.
pub trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

pub type Conn = FramedConn<Box<dyn Stream>>;

/// Where the broker is and how to prove who we are.
#[derive(Debug, Clone)]
pub enum Target {
    Socket(PathBuf),
    Tcp(std::net::SocketAddr),
}

/// The broker we talk to, resolved once.
#[derive(Debug, Clone)]
pub struct BrokerTarget {
    pub target: Target,
    /// The lab secret: needed for TCP; for our subagents it defaults to the broker's own.
    pub secret_file: Option<PathBuf>,
}

/// What registration told us.
#[derive(Debug, Clone)]
pub struct Registered {
    pub job: u64,
    pub remote_shell: Vec<String>,
    pub transport: String,
    pub secret_file: PathBuf,
    /// The broker's IP as its hosts reach it (see [`advertised_ip`]).
    pub hosts_reach_broker_at: Option<IpAddr>,
    /// The lab's public mark, for the subagents' tags (`None` from older brokers).
    pub lab_mark: Option<String>,
    /// The lab host this agent runs on, if it is one (`None` from older brokers).
    pub front_end: Option<String>,
}

/// A `--broker`/`RB_BROKER` value that is neither a socket path nor IP:port (exit 64).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--broker `{0}` is neither a control-socket path nor an IP:port address\nhelp: e.g. --broker /var/tmp/rb-$USER/broker.sock or --broker 10.77.0.1:7700")]
pub struct BadBroker(pub String);

/// A `--broker` value: a path (anything with a `/`) or IP:port.
pub fn parse_broker(value: &str) -> Result<Target, BadBroker> {
    if value.contains('/') {
        return Ok(Target::Socket(PathBuf::from(value)));
    }
    value
        .parse()
        .map(Target::Tcp)
        .map_err(|_| BadBroker(value.to_string()))
}

/// Where the job's broker is.
#[derive(Debug, Clone)]
pub enum Resolution {
    /// The broker `--broker`, `RB_BROKER`, the lab file (`--lab`, `RB_LAB` or
    /// `~/.config/rb/lab.toml`) names.
    Broker(BrokerTarget),
    /// An embedded single-machine broker for this job: none is configured, or only the
    /// implicit `~/.config/rb/lab.toml`, whose broker is not running (`note` says so).
    Embedded { note: Option<String> },
}

/// Resolves the broker from the flags, env and lab file. Only the implicit lab file falls
/// back to an embedded broker when its broker is not running; a broker or lab named by a
/// flag or the environment never does.
pub fn resolve(
    broker: Option<&str>,
    lab: Option<&Path>,
    secret_file: Option<&Path>,
) -> anyhow::Result<Resolution> {
    let lab_cfg = config::load_lab(lab)?;
    let secret = secret_file
        .map(Path::to_path_buf)
        .or_else(|| lab_cfg.as_ref().map(|l| l.broker.secret_file.clone()));
    let target = match (broker, &lab_cfg) {
        (Some(v), _) => parse_broker(v)?,
        (None, Some(l)) => {
            let socket = l.control_socket();
            if socket.symlink_metadata().is_err() {
                let (file, socket) = (l.source_name(), socket.display());
                let why = format!("no broker is running for {file} (no control socket {socket})");
                let start = format!("start it with `rb-broker --lab {file} &`");
                if lab.is_some() {
                    bail!("{why}\nhelp: {start}; or, for an embedded single-machine broker, run the job without --lab and RB_LAB");
                }
                return Ok(Resolution::Embedded {
                    note: Some(format!(
                        "{why}: this job runs on an embedded single-machine broker\nhelp: to use the lab, {start}"
                    )),
                });
            }
            Target::Socket(socket)
        }
        (None, None) => return Ok(Resolution::Embedded { note: None }),
    };
    Ok(Resolution::Broker(BrokerTarget {
        target,
        secret_file: secret,
    }))
}

/// Connects and authenticates; returns the connection and our address as the broker sees
/// it over TCP (loopback through the control socket): [`advertised_ip`]'s fallback.
pub async fn connect(t: &BrokerTarget, label: &str) -> anyhow::Result<(Conn, IpAddr)> {
    match &t.target {
        Target::Socket(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| BrokerSocketError::new(path, e))?;
            proto::peercred::check_server(&stream, path, "broker")?;
            let mut conn: Conn =
                FramedConn::with_limit(Box::new(stream), proto::MAX_RESPONSE_BYTES);
            client_handshake(&mut conn, Role::Agent, label, ClientAuth::PeerCred).await?;
            Ok((conn, IpAddr::V4(Ipv4Addr::LOCALHOST)))
        }
        Target::Tcp(addr) => {
            let path = t
                .secret_file
                .clone()
                .unwrap_or_else(config::default_secret_path);
            let chosen = std::env::var_os("RB_CREDENTIAL")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from);
            let default_credential = config::default_credential_path();
            let key = load_tcp_key(chosen.as_deref(), &path, &default_credential)?;
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .with_context(|| format!("cannot reach the broker at {addr}"))?;
            let _ = stream.set_nodelay(true);
            let local = stream.local_addr()?.ip();
            let mut conn: Conn =
                FramedConn::with_limit(Box::new(stream), proto::MAX_RESPONSE_BYTES);
            client_handshake(&mut conn, Role::Agent, label, key.client_auth()).await?;
            Ok((conn, local))
        }
    }
}

/// Sends the registration and waits for the job id.
pub async fn register(conn: &mut Conn, reg: JobRegistration) -> anyhow::Result<Registered> {
    conn.send(&ToBroker::Register(Box::new(reg))).await?;
    match conn.recv::<FromBroker>().await? {
        FromBroker::Registered {
            job,
            remote_shell,
            transport,
            secret_file,
            hosts_reach_broker_at,
            lab_mark,
            front_end,
        } => Ok(Registered {
            job,
            remote_shell,
            transport,
            secret_file: PathBuf::from(secret_file),
            hosts_reach_broker_at,
            lab_mark: lab_mark.filter(|m| proto::tag::is_mark(m)),
            front_end,
        }),
        FromBroker::Error { message, .. } => bail!("the broker refused the job: {message}"),
        other => bail!("unexpected answer to registration: {other:?}"),
    }
}

/// The address subagents on the lab's hosts reach this agent at: ours on the route to the
/// broker's host-facing IP, which the broker tells us whichever way we reached it (through
/// the control socket, `fallback` would be loopback: unreachable from other hosts). For the
/// `local` transport that IP is loopback, and so is ours. `fallback` when the broker told
/// nothing or no route leads there.
pub fn advertised_ip(job: &Registered, fallback: IpAddr) -> IpAddr {
    job.hosts_reach_broker_at
        .and_then(|broker| proto::route::source_toward(broker).ok())
        .unwrap_or(fallback)
}

/// A single-machine broker started for this job (virtual hosts on this machine).
pub struct EmbeddedBroker {
    child: Child,
    pub dir: PathBuf,
}

impl EmbeddedBroker {
    /// Starts `rb-broker --embedded` in a fresh state dir and waits for its socket.
    pub fn start() -> anyhow::Result<(Self, BrokerTarget)> {
        let dir = privdir::in_root(&format!("embedded-{}", std::process::id()))?;
        let log = std::fs::File::create(dir.with_extension("log"))?;
        let mut cmd = Command::new(sibling("rb-broker"));
        cmd.arg("--embedded")
            .arg("--state-dir")
            .arg(&dir)
            // Ended with the job's processes if this agent dies without stopping it.
            .env(crate::jobguard::JOB_TAG_VAR, crate::jobguard::job_tag())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let child = crate::reaper::spawn_own(|| cmd.spawn(), |c| Some(c.id()))
            .context("cannot start the embedded rb-broker (is it installed next to `agent`?)")?;
        let socket = dir.join("broker.sock");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            if Instant::now() > deadline {
                bail!(
                    "the embedded broker did not start; see {}",
                    dir.with_extension("log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let target = BrokerTarget {
            target: Target::Socket(socket),
            secret_file: Some(dir.join("secret")),
        };
        Ok((Self { child, dir }, target))
    }

    /// Stops the broker (SIGTERM, then SIGKILL) and removes its state dir.
    pub fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("log"));
    }
}

/// A program installed next to this one (see [`config::sibling_program`]).
pub fn sibling(name: &str) -> PathBuf {
    config::sibling_program(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(hosts_reach_broker_at: Option<IpAddr>) -> Registered {
        Registered {
            job: 1,
            remote_shell: vec!["ssh".into()],
            transport: "ssh".into(),
            secret_file: PathBuf::from("/s"),
            hosts_reach_broker_at,
            lab_mark: None,
            front_end: None,
        }
    }

    #[test]
    fn the_agent_advertises_its_address_on_the_route_to_the_broker_else_the_fallback() {
        let fallback = IpAddr::from([192, 0, 2, 7]);
        let loopback = IpAddr::from([127, 0, 0, 1]);
        // The local transport: the broker is reached on loopback, and so are we.
        assert_eq!(
            advertised_ip(&registered(Some(loopback)), fallback),
            loopback
        );
        // An older broker says nothing: what the connection gave.
        assert_eq!(advertised_ip(&registered(None), fallback), fallback);
    }
}
