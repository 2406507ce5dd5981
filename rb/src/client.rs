//! Reaching the broker: `--broker`/`RB_BROKER` (a socket path or IP:port), else the lab
//! file's control socket, else a running `rb demo --keep` or embedded broker. TCP uses the
//! lab secret, or a user's credential (`--credential`/`RB_CREDENTIAL`, or
//! `~/.config/rb/credential` when the lab secret is not readable:
//! [`proto::credential::load_tcp_key`]); on the local socket each side checks the other
//! with SO_PEERCRED (we talk only to a broker of our uid). The broker's refusals come back
//! as [`BrokerError`] (a permission refusal makes `rb` exit 77).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{anyhow, bail, Context};
use proto::{
    credential::load_tcp_key,
    frame::FramedConn,
    handshake::{client_handshake, ClientAuth},
    msg::{FromBroker, Request, Response, Role, ToBroker},
    peercred::BrokerSocketError,
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
        /// A credential chosen by `--credential` or `RB_CREDENTIAL` (see [`request`]).
        credential: Option<PathBuf>,
    },
}

/// The broker answered with an error.
#[derive(Debug, thiserror::Error)]
#[error("broker: {message}")]
pub struct BrokerError {
    pub code: proto::msg::ErrorCode,
    pub message: String,
}

impl BrokerError {
    /// A refusal for want of permission or identity (exit 77).
    pub fn is_permission(&self) -> bool {
        use proto::msg::ErrorCode;
        matches!(self.code, ErrorCode::Denied | ErrorCode::Auth)
    }
}

/// Why no broker could be chosen: the flags or the lab file are wrong (exit 64), or no
/// broker is running where they point.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("--broker `{0}` is neither a control-socket path nor an IP:port address\nhelp: e.g. --broker /var/tmp/rb-$USER/broker.sock or --broker 10.77.0.1:7700")]
    BadBroker(String),
    #[error(transparent)]
    Config(Box<config::ConfigError>),
    #[error("no broker is running for {lab} (no control socket {socket})\nhelp: start it with `rb-broker --lab {lab} &`{also}")]
    NotRunning {
        lab: String,
        socket: String,
        also: &'static str,
    },
    #[error("no broker configured\nhelp: pass --broker ADDR or --lab FILE, set RB_BROKER, create ~/.config/rb/lab.toml with `rb init`, or try `rb demo --keep`")]
    NoneConfigured,
}

impl From<config::ConfigError> for ResolveError {
    fn from(e: config::ConfigError) -> Self {
        Self::Config(Box::new(e))
    }
}

impl ResolveError {
    /// True when the flags or the lab file are at fault (exit 64).
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::BadBroker(_) | Self::Config(_))
    }
}

/// The broker to talk to, and a note for stderr when it is not the one the user may expect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub target: Target,
    pub note: Option<String>,
}

/// Where to look when no flag says: the implicit lab file (`~/.config/rb/lab.toml`) and
/// the sockets of a running `rb demo --keep` or embedded broker, in order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Defaults {
    pub lab_file: PathBuf,
    pub demo_sockets: Vec<PathBuf>,
}

/// Resolves the target: `broker` (flag or `RB_BROKER`), else the control socket of `lab`
/// (flag or `RB_LAB`), else of `~/.config/rb/lab.toml`; when that implicit lab's broker is not
/// running, or there is no lab file, a running `rb demo --keep` or embedded broker.
pub fn resolve(
    broker: Option<&str>,
    lab: Option<&Path>,
    secret_file: Option<&Path>,
    defaults: &Defaults,
) -> Result<Resolved, ResolveError> {
    let found = |target| Resolved { target, note: None };
    let lab_cfg = match lab {
        Some(path) => Some(config::LabConfig::load(path)?),
        None if defaults.lab_file.exists() => Some(config::LabConfig::load(&defaults.lab_file)?),
        None => None,
    };
    let demo_sockets = &defaults.demo_sockets;
    if let Some(value) = broker {
        return parse_target(value, secret_file, lab_cfg.as_ref()).map(found);
    }
    let running_demo = demo_sockets.iter().find(|s| s.exists());
    let Some(cfg) = lab_cfg else {
        return running_demo
            .map(|s| found(Target::Socket(s.clone())))
            .ok_or(ResolveError::NoneConfigured);
    };
    let socket = cfg.control_socket();
    if socket.symlink_metadata().is_ok() {
        return Ok(found(Target::Socket(socket)));
    }
    let (lab_name, socket_name) = (cfg.source_name(), socket.display().to_string());
    let not_running = |also| ResolveError::NotRunning {
        lab: lab_name.clone(),
        socket: socket_name.clone(),
        also,
    };
    match (lab, running_demo) {
        (None, Some(demo)) => Ok(Resolved {
            target: Target::Socket(demo.clone()),
            note: Some(format!(
                "no broker is running for {lab_name} (no control socket {socket_name}); \
                 showing the `rb demo --keep` or embedded broker at {}\n\
                 help: to use the lab, start its broker with `rb-broker --lab {lab_name} &`",
                demo.display()
            )),
        }),
        (None, None) => Err(not_running(", or try `rb demo --keep`")),
        (Some(_), _) => Err(not_running("")),
    }
}

fn parse_target(
    value: &str,
    secret_file: Option<&Path>,
    lab: Option<&config::LabConfig>,
) -> Result<Target, ResolveError> {
    if value.contains('/') {
        return Ok(Target::Socket(PathBuf::from(value)));
    }
    let addr: SocketAddr = value
        .parse()
        .map_err(|_| ResolveError::BadBroker(value.to_string()))?;
    let secret_file = secret_file
        .map(Path::to_path_buf)
        .or_else(|| lab.map(|l| l.broker.secret_file.clone()))
        .unwrap_or_else(config::default_secret_path);
    Ok(Target::Tcp {
        addr,
        secret_file,
        credential: None,
    })
}

/// Sends one request and returns the answer.
pub async fn request(target: &Target, req: Request) -> anyhow::Result<Response> {
    answer(&request_line(target, req).await?)
}

/// The id of the one request a connection of `rb` makes.
const REQUEST_ID: u64 = 1;

/// Sends one request and returns the answer's frame as it came (one line of JSON).
async fn request_line(target: &Target, req: Request) -> anyhow::Result<String> {
    frame_text(request_frame(target, req).await?)
}

/// An answer's frame as text.
fn frame_text(frame: Vec<u8>) -> anyhow::Result<String> {
    String::from_utf8(frame).map_err(|_| anyhow!("the broker's answer is not UTF-8"))
}

/// [`request_line`] as bytes, unchecked.
async fn request_frame(target: &Target, req: Request) -> anyhow::Result<Vec<u8>> {
    tokio::time::timeout(TIMEOUT, request_inner(target, req))
        .await
        .map_err(|_| anyhow!("the broker did not answer within {} s", TIMEOUT.as_secs()))?
}

async fn request_inner(target: &Target, req: Request) -> anyhow::Result<Vec<u8>> {
    match target {
        Target::Socket(path) => {
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| BrokerSocketError::new(path, e))?;
            proto::peercred::check_server(&stream, path, "broker")?;
            exchange(
                FramedConn::with_limit(stream, proto::MAX_RESPONSE_BYTES),
                ClientAuth::PeerCred,
                req,
            )
            .await
        }
        Target::Tcp {
            addr,
            secret_file,
            credential,
        } => {
            let default_credential = config::default_credential_path();
            let key = load_tcp_key(credential.as_deref(), secret_file, &default_credential)?;
            let stream = tokio::net::TcpStream::connect(addr)
                .await
                .with_context(|| format!("cannot reach the broker at {addr}"))?;
            exchange(
                FramedConn::with_limit(stream, proto::MAX_RESPONSE_BYTES),
                key.client_auth(),
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
) -> anyhow::Result<Vec<u8>> {
    client_handshake(&mut conn, Role::Client, "rb", auth).await?;
    conn.send(&ToBroker::Request {
        id: REQUEST_ID,
        req,
    })
    .await?;
    Ok(conn.recv_line_bytes().await?)
}

/// The broker's answer in `line` (one frame), or its refusal as a [`BrokerError`].
fn answer(line: &str) -> anyhow::Result<Response> {
    // A status answer is megabytes at thousands of hosts: parsed straight into its rows
    // (the tagged enums would buffer the whole frame into an intermediate tree first,
    // which took most of `rb status`'s time); any other frame, or one this shape does not
    // fit, goes through the tagged enums.
    if let Ok(StatusFrame {
        t: FrameKind::Response,
        resp: StatusResp {
            kind: RespKind::Status,
            hosts,
        },
    }) = serde_json::from_str(line)
    {
        return Ok(Response::Status { hosts });
    }
    match proto::frame::decode::<FromBroker>(line)? {
        FromBroker::Response { resp, .. } => Ok(resp),
        FromBroker::Error { code, message } => Err(BrokerError { code, message }.into()),
        other => bail!("unexpected answer from broker: {other:?}"),
    }
}

/// `FromBroker::Response` carrying `Response::Status`, as plain structs.
#[derive(serde::Deserialize)]
struct StatusFrame {
    t: FrameKind,
    resp: StatusResp,
}

#[derive(serde::Deserialize)]
struct StatusResp {
    kind: RespKind,
    hosts: Vec<HostStatus>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum FrameKind {
    Response,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum RespKind {
    Status,
}

/// The status of every host as the broker sent it: its JSON array of rows, untouched
/// (never parsed into rows: megabytes at 10k hosts; see `status_rows_json`).
pub async fn status_json(target: &Target) -> anyhow::Result<StatusLine> {
    status_rows_json(request_frame(target, Request::Status).await?)
}

/// The JSON array of every host's row and a newline, in the frame it came in.
#[derive(Debug)]
pub struct StatusLine {
    frame: Vec<u8>,
    line: std::ops::Range<usize>,
}

impl StatusLine {
    /// The rows and the newline after them: one write to a line-buffered stdout, which
    /// then finds the newline at once (a write without one had it search the 5 MB of rows
    /// at 10k hosts, backwards).
    pub fn as_bytes(&self) -> &[u8] {
        &self.frame[self.line.clone()]
    }

    fn of_text(mut rows: String) -> StatusLine {
        rows.push('\n');
        let line = 0..rows.len();
        StatusLine {
            frame: rows.into_bytes(),
            line,
        }
    }
}

/// The rows of a status answer `frame`; a refusal as a [`BrokerError`]. A frame as today's
/// broker writes it gives its rows untouched and in place (no copy), not even checked
/// ([`proto::frame::status_rows`]: 5 MB at 10k hosts); another spelling (an older broker)
/// is checked to be JSON.
fn status_rows_json(mut frame: Vec<u8>) -> anyhow::Result<StatusLine> {
    if let Some(rows) = proto::frame::status_rows(&frame, REQUEST_ID) {
        if rows.end < frame.len() {
            // The envelope's closing brace after the rows becomes their newline.
            frame[rows.end] = b'\n';
            let line = rows.start..rows.end + 1;
            return Ok(StatusLine { frame, line });
        }
    }
    let line = frame_text(frame)?;
    let line = line.as_str();
    if let Ok(RawStatusFrame {
        t: FrameKind::Response,
        resp: RawStatusResp {
            kind: RespKind::Status,
            hosts,
        },
    }) = serde_json::from_str(line)
    {
        return Ok(StatusLine::of_text(hosts.get().to_string()));
    }
    match answer(line)? {
        Response::Status { hosts } => Ok(StatusLine::of_text(serde_json::to_string(&hosts)?)),
        other => bail!("unexpected answer from broker: {other:?}"),
    }
}

/// [`StatusFrame`] with the rows left as text.
#[derive(serde::Deserialize)]
struct RawStatusFrame<'a> {
    t: FrameKind,
    #[serde(borrow)]
    resp: RawStatusResp<'a>,
}

#[derive(serde::Deserialize)]
struct RawStatusResp<'a> {
    kind: RespKind,
    #[serde(borrow)]
    hosts: &'a serde_json::value::RawValue,
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
    use proto::{msg::ErrorCode, report::HostState};

    /// A status frame parses straight into its rows (every field kept); any other frame
    /// and a refusal parse as before.
    #[test]
    fn answers_parse_status_rows_directly_and_other_frames_as_before() {
        let mut down = crate::table::tests::host("n2", HostState::Down);
        down.policy_note = Some("policy start is false here".into());
        let hosts = vec![crate::table::tests::host("n1", HostState::Up), down];
        let frame = |resp| proto::frame::encode(&FromBroker::Response { id: 1, resp });
        let line = frame(Response::Status {
            hosts: hosts.clone(),
        })
        .expect("encode");
        assert_eq!(
            answer(&line).expect("status"),
            Response::Status {
                hosts: hosts.clone()
            }
        );
        let rows = status_rows_json(line.clone().into_bytes()).expect("rows");
        assert!(
            rows.as_bytes().ends_with(b"]\n"),
            "the rows, then a newline"
        );
        assert_eq!(
            serde_json::from_slice::<Vec<HostStatus>>(rows.as_bytes()).expect("rows parse"),
            hosts,
            "the rows as text"
        );
        // An older broker's spelling (spaces around its members) is parsed, the same rows.
        let spaced = serde_json::to_string_pretty(&FromBroker::Response {
            id: 1,
            resp: Response::Status {
                hosts: hosts.clone(),
            },
        })
        .expect("encode")
        .replace('\n', " ");
        let rows = status_rows_json(spaced.into_bytes()).expect("rows");
        assert!(rows.as_bytes().ends_with(b"]\n"));
        assert_eq!(
            serde_json::from_slice::<Vec<HostStatus>>(rows.as_bytes()).expect("rows parse"),
            hosts
        );
        let line = frame(Response::Ok).expect("encode");
        assert_eq!(answer(&line).expect("ok"), Response::Ok);
        let refusal = proto::frame::encode(&FromBroker::Error {
            code: ErrorCode::Denied,
            message: "no".into(),
        })
        .expect("encode");
        let err = answer(&refusal).expect_err("refused");
        assert!(err.downcast_ref::<BrokerError>().is_some(), "{err}");
        let err = status_rows_json(refusal.clone().into_bytes()).expect_err("refused");
        assert!(err.downcast_ref::<BrokerError>().is_some(), "{err}");
        assert!(answer("{\"t\":\"response\"}").is_err());
    }

    #[test]
    fn broker_values_parse_as_socket_or_tcp() {
        let t = parse_target("/run/rb/broker.sock", None, None).expect("socket");
        assert_eq!(t, Target::Socket("/run/rb/broker.sock".into()));
        let t = parse_target("10.77.0.1:7700", Some(Path::new("/s")), None).expect("tcp");
        assert_eq!(
            t,
            Target::Tcp {
                addr: "10.77.0.1:7700".parse().expect("addr"),
                secret_file: "/s".into(),
                credential: None,
            }
        );
        assert!(parse_target("node01", None, None).is_err());
    }

    /// A lab file in `dir` whose state dir is `dir/state`, and the defaults around it.
    fn setup(dir: &Path) -> (PathBuf, Defaults) {
        let lab = dir.join("lab.toml");
        let text = format!(
            "[broker]\nlisten = \"127.0.0.1:0\"\ntransport = \"local\"\nstate_dir = \"{}\"\n",
            dir.join("state").display()
        );
        std::fs::write(&lab, text).expect("write lab");
        let defaults = Defaults {
            lab_file: dir.join("absent.toml"),
            demo_sockets: vec![dir.join("demo/broker.sock")],
        };
        (lab, defaults)
    }

    fn make_socket_file(path: &Path) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, "").expect("stand-in for a socket");
    }

    #[test]
    fn a_running_demo_keep_broker_is_found_without_flags() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, defaults) = setup(dir.path());
        assert!(matches!(
            resolve(None, None, None, &defaults),
            Err(ResolveError::NoneConfigured)
        ));
        make_socket_file(&defaults.demo_sockets[0]);
        let got = resolve(None, None, None, &defaults).expect("demo");
        assert_eq!(got.target, Target::Socket(defaults.demo_sockets[0].clone()));
        assert_eq!(got.note, None);
    }

    #[test]
    fn only_the_implicit_lab_file_falls_back_and_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (lab, mut defaults) = setup(dir.path());
        defaults.lab_file = lab.clone();
        let err = resolve(None, None, None, &defaults).expect_err("nothing runs");
        let shown = err.to_string();
        assert!(
            shown.contains(&format!("no broker is running for {}", lab.display())),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("rb-broker --lab {} &", lab.display())),
            "{shown}"
        );
        make_socket_file(&defaults.demo_sockets[0]);
        let got = resolve(None, None, None, &defaults).expect("falls back to the demo");
        assert_eq!(got.target, Target::Socket(defaults.demo_sockets[0].clone()));
        let note = got.note.expect("says so");
        assert!(note.contains(&lab.display().to_string()), "{note}");
        let err = resolve(None, Some(&lab), None, &defaults).expect_err("named lab: no fallback");
        assert!(matches!(err, ResolveError::NotRunning { .. }), "{err}");
        make_socket_file(&dir.path().join("state/broker.sock"));
        let got = resolve(None, Some(&lab), None, &defaults).expect("its broker");
        assert_eq!(
            got.target,
            Target::Socket(dir.path().join("state/broker.sock"))
        );
        let err = resolve(Some("node01"), None, None, &defaults).expect_err("bad value");
        assert!(err.is_usage(), "{err}");
    }
}
