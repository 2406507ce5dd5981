//! A bare agent on the broker's control socket: the hello and a job's registration, then
//! messages line by line, with no agent process behind it. The tests use it for peers that
//! misbehave (a flood that never reads) and to time grants; `rb-bench`'s scale part to time
//! grants under load.

use std::{
    fmt,
    io::{BufRead, BufReader, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

use proto::msg::{FromBroker, Hello, JobRegistration, Role, ToBroker};

/// What went wrong on a raw agent's connection.
#[derive(Debug)]
pub enum RawAgentError {
    /// Connecting, reading (no answer within the agent's read timeout) or writing failed.
    Io(std::io::Error),
    /// A message could not be encoded, or a line from the broker is no message.
    Frame(String),
    /// The broker closed the connection.
    Closed,
    /// The broker answered the handshake with something else.
    Unexpected { wanted: &'static str, got: String },
}

impl fmt::Display for RawAgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawAgentError::Io(e) => write!(f, "the agent's connection: {e}"),
            RawAgentError::Frame(e) => write!(f, "a message on the agent's connection: {e}"),
            RawAgentError::Closed => write!(f, "the broker closed the agent's connection"),
            RawAgentError::Unexpected { wanted, got } => {
                write!(f, "the broker answered {got} where {wanted} was due")
            }
        }
    }
}

impl std::error::Error for RawAgentError {}

impl From<std::io::Error> for RawAgentError {
    fn from(e: std::io::Error) -> Self {
        RawAgentError::Io(e)
    }
}

/// An agent connection whose handshake and registration are done.
pub struct RawAgent {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl RawAgent {
    /// Connects to the control socket `socket`, says hello as `name` and registers an
    /// adaptive job; a read waits at most `answer_within`.
    pub fn register(
        socket: &Path,
        name: &str,
        answer_within: Duration,
    ) -> Result<RawAgent, RawAgentError> {
        let stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(answer_within))?;
        let reader = BufReader::new(stream.try_clone()?);
        let mut agent = RawAgent { stream, reader };
        agent.send(&ToBroker::Hello(Hello {
            proto: proto::PROTOCOL_VERSION,
            role: Role::Agent,
            name: name.into(),
            nonce: String::new(),
            user: None,
        }))?;
        agent.expect("a welcome", |m| matches!(m, FromBroker::Welcome { .. }))?;
        agent.send(&ToBroker::Register(Box::new(JobRegistration {
            user: "ignored".into(),
            cwd: "/".into(),
            argv: vec![name.into()],
            spec: None,
            adaptive: true,
            resume: None,
            runs_on: None,
            module: None,
        })))?;
        agent.expect("the registration", |m| {
            matches!(m, FromBroker::Registered { .. })
        })?;
        Ok(agent)
    }

    /// Asks for `symbolic` as request `req` and, once granted, gives the host back: how long
    /// the grant took; `None` when refused or not granted within `within` (the request is
    /// then cancelled).
    pub fn grant(
        &mut self,
        req: u64,
        symbolic: &str,
        within: Duration,
    ) -> Result<Option<Duration>, RawAgentError> {
        let asked = Instant::now();
        self.send(&ToBroker::Allocate {
            req,
            symbolic: symbolic.into(),
        })?;
        while asked.elapsed() < within {
            match self.recv() {
                Ok(FromBroker::Granted { req: r, alloc, .. }) if r == req => {
                    let took = asked.elapsed();
                    self.send(&ToBroker::GiveBack { alloc })?;
                    return Ok(Some(took));
                }
                Ok(FromBroker::Refused { .. }) | Err(RawAgentError::Io(_)) => break,
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
        }
        self.send(&ToBroker::Cancel { req })?;
        Ok(None)
    }

    pub fn send(&mut self, msg: &ToBroker) -> Result<(), RawAgentError> {
        let line = proto::frame::encode(msg).map_err(|e| RawAgentError::Frame(e.to_string()))?;
        self.stream.write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    }

    /// The next message from the broker.
    pub fn recv(&mut self) -> Result<FromBroker, RawAgentError> {
        let mut line = String::new();
        match self.reader.read_line(&mut line)? {
            0 => Err(RawAgentError::Closed),
            _ => proto::frame::decode(line.trim_end())
                .map_err(|e| RawAgentError::Frame(e.to_string())),
        }
    }

    /// The next message, which must be `wanted`.
    fn expect(
        &mut self,
        wanted: &'static str,
        is: impl Fn(&FromBroker) -> bool,
    ) -> Result<FromBroker, RawAgentError> {
        let msg = self.recv()?;
        match is(&msg) {
            true => Ok(msg),
            false => Err(RawAgentError::Unexpected {
                wanted,
                got: format!("{msg:?}"),
            }),
        }
    }
}
