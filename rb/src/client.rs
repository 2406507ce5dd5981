//! Reaching the broker: `--broker`/`RB_BROKER` (a socket path or IP:port), else the lab
//! file's control socket, else the embedded lab's. TCP uses the lab secret; on the local
//! socket each side checks the other with SO_PEERCRED (we talk only to a broker of our uid).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{anyhow, bail, Context};
use proto::{
    auth::Secret,
    frame::FramedConn,
    handshake::{client_handshake, ClientAuth},
    msg::{FromBroker, Request, Response, Role, ToBroker},
    report::HostStatus,
};
use tokio::io::{AsyncRead, AsyncWrite};

const TIMEOUT: Duration = Duration::from_secs(10);

/// Where the broker is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Socket(PathBuf),
    Tcp {
        addr: SocketAddr,
        secret_file: PathBuf,
    },
}

/// Resolves the target from flags/env (`broker`), a lab file, or the defaults.
pub fn resolve(
    broker: Option<&str>,
    lab: Option<&Path>,
    secret_file: Option<&Path>,
) -> anyhow::Result<Target> {
    let lab_cfg = config::load_lab(lab).map_err(|e| anyhow!("{e}"))?;
    if let Some(value) = broker {
        return parse_target(value, secret_file, lab_cfg.as_ref());
    }
    if let Some(cfg) = lab_cfg {
        return Ok(Target::Socket(cfg.control_socket()));
    }
    let embedded = broker::embedded::default_state_dir().join("broker.sock");
    if embedded.exists() {
        return Ok(Target::Socket(embedded));
    }
    bail!("no broker configured\nhelp: pass --broker ADDR or --lab FILE, set RB_BROKER, create ~/.config/rb/lab.toml with `rb init`, or try `rb demo`")
}

fn parse_target(
    value: &str,
    secret_file: Option<&Path>,
    lab: Option<&config::LabConfig>,
) -> anyhow::Result<Target> {
    if value.contains('/') {
        return Ok(Target::Socket(PathBuf::from(value)));
    }
    let addr: SocketAddr = value.parse().map_err(|_| {
        anyhow!("--broker `{value}` is neither a socket path nor an IP:port address")
    })?;
    let secret_file = secret_file
        .map(Path::to_path_buf)
        .or_else(|| lab.map(|l| l.broker.secret_file.clone()))
        .unwrap_or_else(config::default_secret_path);
    Ok(Target::Tcp { addr, secret_file })
}

/// Sends one request and returns the answer.
pub async fn request(target: &Target, req: Request) -> anyhow::Result<Response> {
    tokio::time::timeout(TIMEOUT, request_inner(target, req))
        .await
        .map_err(|_| anyhow!("the broker did not answer within {} s", TIMEOUT.as_secs()))?
}

async fn request_inner(target: &Target, req: Request) -> anyhow::Result<Response> {
    match target {
        Target::Socket(path) => {
            let stream = tokio::net::UnixStream::connect(path).await.with_context(|| {
                format!("cannot reach the broker at {}\nhelp: is rb-broker running? start it with `rb-broker --lab LAB.toml`", path.display())
            })?;
            proto::peercred::check_server(&stream, path, "broker")?;
            exchange(
                FramedConn::with_limit(stream, proto::MAX_RESPONSE_BYTES),
                ClientAuth::PeerCred,
                req,
            )
            .await
        }
        Target::Tcp { addr, secret_file } => {
            let secret = Secret::load(secret_file)?;
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .with_context(|| format!("cannot reach the broker at {addr}"))?;
            exchange(
                FramedConn::with_limit(stream, proto::MAX_RESPONSE_BYTES),
                ClientAuth::Secret(&secret),
                req,
            )
            .await
        }
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    mut conn: FramedConn<S>,
    auth: ClientAuth<'_>,
    req: Request,
) -> anyhow::Result<Response> {
    client_handshake(&mut conn, Role::Client, "rb", auth).await?;
    conn.send(&ToBroker::Request { id: 1, req }).await?;
    match conn.recv::<FromBroker>().await? {
        FromBroker::Response { resp, .. } => Ok(resp),
        FromBroker::Error { message, .. } => bail!("broker: {message}"),
        other => bail!("unexpected answer from broker: {other:?}"),
    }
}

/// The status of every host.
pub async fn status(target: &Target) -> anyhow::Result<Vec<HostStatus>> {
    match request(target, Request::Status).await? {
        Response::Status { hosts } => Ok(hosts),
        other => bail!("unexpected answer from broker: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_values_parse_as_socket_or_tcp() {
        let t = parse_target("/run/rb/broker.sock", None, None).expect("socket");
        assert_eq!(t, Target::Socket("/run/rb/broker.sock".into()));
        let t = parse_target("10.77.0.1:7700", Some(Path::new("/s")), None).expect("tcp");
        assert_eq!(
            t,
            Target::Tcp {
                addr: "10.77.0.1:7700".parse().expect("addr"),
                secret_file: "/s".into()
            }
        );
        assert!(parse_target("node01", None, None).is_err());
    }
}
