//! The shim's side of the job-local protocol (`proto::agent`): one request, then replies until
//! `Granted`, `Refused` or `Lost`. One JSON object per line; the connection stays open while queued
//! (closing it cancels the request) and is closed before the remote shell starts.
//! [`taken_back`] is the question the agent still answers on a new connection; the shim
//! itself reads the agent's file instead (`proto::taken_back`: no round trip).

use std::io::{self, BufRead, BufReader, Read, Write};

use proto::agent::{ShimReply, ShimRequest};

/// A host granted by the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub alloc: u64,
    pub host: String,
    pub address: String,
    pub remote_shell: Vec<String>,
    pub subagent: Vec<String>,
}

/// How a conversation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Granted(Grant),
    Refused(String),
    /// The instance's host was taken back (`proto::agent::ShimReply::Lost`).
    Lost {
        host: String,
        message: String,
    },
}

/// What went wrong talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("closed the connection before answering")]
    Closed,
    #[error("bad reply: {0}")]
    BadReply(String),
}

/// Sends `request` on `stream` and reads replies until the answer; `on_queued` sees every
/// `Queued` position and the reason the broker gave, if any.
pub fn converse<S: Read + Write>(
    mut stream: S,
    request: &ShimRequest,
    mut on_queued: impl FnMut(u32, Option<&str>),
) -> Result<Outcome, ConversationError> {
    send(&mut stream, request)?;
    steptimes::mark("shim.request_sent", None);
    let mut reader = BufReader::new(stream);
    loop {
        match read_reply(&mut reader)? {
            ShimReply::Queued { position, reason } => on_queued(position, reason.as_deref()),
            ShimReply::Granted {
                alloc,
                host,
                address,
                remote_shell,
                subagent,
            } => {
                return validate(Grant {
                    alloc,
                    host,
                    address,
                    remote_shell,
                    subagent,
                })
                .map(Outcome::Granted)
            }
            ShimReply::Refused { message } => return Ok(Outcome::Refused(message)),
            ShimReply::Lost { host, message, .. } => return Ok(Outcome::Lost { host, message }),
            other @ (ShimReply::TakenBack { .. } | ShimReply::NotTakenBack { .. }) => {
                return Err(ConversationError::BadReply(format!(
                    "an answer to a question not asked: {other:?}"
                )))
            }
        }
    }
}

/// Asks whether the broker took `alloc` back from the job while the command ran there:
/// `Some((host, message))` when it did. (The agent answers it for shims of earlier
/// versions; today's shim reads `proto::taken_back`'s file.)
pub fn taken_back<S: Read + Write>(
    mut stream: S,
    alloc: u64,
    pid: u32,
) -> Result<Option<(String, String)>, ConversationError> {
    send(&mut stream, &ShimRequest::TakenBack { alloc, pid })?;
    match read_reply(&mut BufReader::new(stream))? {
        ShimReply::TakenBack {
            alloc: a,
            host,
            message,
        } if a == alloc => Ok(Some((host, message))),
        ShimReply::NotTakenBack { alloc: a } if a == alloc => Ok(None),
        other => Err(ConversationError::BadReply(format!(
            "not an answer about allocation {alloc}: {other:?}"
        ))),
    }
}

/// Tells the agent something that needs no answer (`named`): one line, then close.
pub fn notify<W: Write>(mut stream: W, request: &ShimRequest) -> Result<(), ConversationError> {
    send(&mut stream, request)
}

fn send<W: Write>(stream: &mut W, request: &ShimRequest) -> Result<(), ConversationError> {
    let mut line =
        serde_json::to_vec(request).map_err(|e| ConversationError::BadReply(e.to_string()))?;
    line.push(b'\n');
    stream.write_all(&line)?;
    stream.flush()?;
    Ok(())
}

/// The next non-blank line as a reply; at most `proto::MAX_FRAME_BYTES` per line.
fn read_reply<R: BufRead>(reader: &mut R) -> Result<ShimReply, ConversationError> {
    let limit = proto::MAX_FRAME_BYTES as u64;
    loop {
        let mut line = Vec::new();
        let n = reader
            .by_ref()
            .take(limit + 1)
            .read_until(b'\n', &mut line)?;
        if n == 0 {
            return Err(ConversationError::Closed);
        }
        if !line.ends_with(b"\n") {
            return Err(if n as u64 > limit {
                ConversationError::BadReply(format!("a line longer than {limit} bytes"))
            } else {
                ConversationError::Closed
            });
        }
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        return serde_json::from_slice(&line).map_err(|e| {
            ConversationError::BadReply(format!(
                "{e}: `{}`",
                String::from_utf8_lossy(&line).trim_end()
            ))
        });
    }
}

/// A grant must name a remote shell, a subagent and an address.
fn validate(grant: Grant) -> Result<Grant, ConversationError> {
    let empty = |v: &[String]| v.first().map_or(true, String::is_empty);
    if empty(&grant.remote_shell) || empty(&grant.subagent) || grant.address.is_empty() {
        return Err(ConversationError::BadReply(format!(
            "a grant without remote shell, subagent or address: {grant:?}"
        )));
    }
    Ok(grant)
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::thread;

    use super::*;

    /// Runs a fake agent on one end of a socket pair: it records the request line and writes
    /// `replies` verbatim, then closes.
    fn with_agent(replies: &'static str) -> (UnixStream, thread::JoinHandle<String>) {
        let (ours, theirs) = UnixStream::pair().expect("pair");
        let agent = thread::spawn(move || {
            let mut reader = BufReader::new(&theirs);
            let mut request = String::new();
            reader.read_line(&mut request).expect("read request");
            (&theirs)
                .write_all(replies.as_bytes())
                .expect("write replies");
            request
        });
        (ours, agent)
    }

    const GRANT: &str = r#"{"t":"granted","alloc":7,"host":"node03","address":"10.77.0.3","remote_shell":["ssh"],"subagent":["/sa","--alloc","7"]}"#;

    fn allocate() -> ShimRequest {
        ShimRequest::Allocate {
            symbolic: "anyLinux".into(),
            pid: 4711,
        }
    }

    #[test]
    fn queued_then_granted() {
        let replies = Box::leak(
            format!("{{\"t\":\"queued\",\"position\":2}}\n\n{{\"t\":\"queued\",\"position\":1}}\n{GRANT}\n")
                .into_boxed_str(),
        );
        let (stream, agent) = with_agent(replies);
        let mut seen = Vec::new();
        let outcome = converse(stream, &allocate(), |p, _| seen.push(p)).expect("granted");
        assert_eq!(seen, vec![2, 1]);
        let request = agent.join().expect("agent");
        assert_eq!(
            request,
            "{\"t\":\"allocate\",\"symbolic\":\"anyLinux\",\"pid\":4711}\n"
        );
        let Outcome::Granted(grant) = outcome else {
            panic!("not granted: {outcome:?}")
        };
        assert_eq!(
            (grant.alloc, grant.host.as_str(), grant.address.as_str()),
            (7, "node03", "10.77.0.3")
        );
        assert_eq!(grant.subagent, vec!["/sa", "--alloc", "7"]);
    }

    #[test]
    fn refused() {
        let (stream, _agent) =
            with_agent("{\"t\":\"refused\",\"message\":\"no host matches anyFoo\"}\n");
        let outcome = converse(stream, &allocate(), |_, _| {}).expect("answer");
        assert_eq!(outcome, Outcome::Refused("no host matches anyFoo".into()));
    }

    #[test]
    fn lost() {
        let (stream, _agent) = with_agent(
            "{\"t\":\"lost\",\"name\":\"anyLinux-1\",\"host\":\"node03\",\"message\":\"gone\"}\n",
        );
        let outcome = converse(stream, &allocate(), |_, _| {}).expect("answer");
        assert_eq!(
            outcome,
            Outcome::Lost {
                host: "node03".into(),
                message: "gone".into()
            }
        );
    }

    #[test]
    fn closed_without_answer() {
        let (stream, _agent) = with_agent("{\"t\":\"queued\",\"position\":1}\n");
        assert!(matches!(
            converse(stream, &allocate(), |_, _| {}),
            Err(ConversationError::Closed)
        ));
        let (stream, _agent) = with_agent("{\"t\":\"refused\"");
        assert!(matches!(
            converse(stream, &allocate(), |_, _| {}),
            Err(ConversationError::Closed)
        ));
    }

    #[test]
    fn taken_back_or_not() {
        let (stream, agent) = with_agent(
            "{\"t\":\"taken_back\",\"alloc\":7,\"host\":\"node03\",\"message\":\"why\"}\n",
        );
        let answer = taken_back(stream, 7, 4711).expect("answer");
        assert_eq!(answer, Some(("node03".into(), "why".into())));
        assert_eq!(
            agent.join().expect("agent"),
            "{\"t\":\"taken_back\",\"alloc\":7,\"pid\":4711}\n"
        );
        let (stream, _agent) = with_agent("{\"t\":\"not_taken_back\",\"alloc\":7}\n");
        assert_eq!(taken_back(stream, 7, 1).expect("answer"), None);
        // About another allocation, or no answer at all: errors (the caller keeps 0).
        let (stream, _agent) = with_agent("{\"t\":\"not_taken_back\",\"alloc\":8}\n");
        assert!(matches!(
            taken_back(stream, 7, 1),
            Err(ConversationError::BadReply(_))
        ));
        let (stream, _agent) = with_agent("");
        assert!(matches!(
            taken_back(stream, 7, 1),
            Err(ConversationError::Closed)
        ));
    }

    #[test]
    fn garbage_and_empty_grants_are_bad_replies() {
        let (stream, _agent) = with_agent("hello\n");
        assert!(matches!(
            converse(stream, &allocate(), |_, _| {}),
            Err(ConversationError::BadReply(_))
        ));
        let (stream, _agent) = with_agent(
            "{\"t\":\"granted\",\"alloc\":1,\"host\":\"h\",\"address\":\"a\",\"remote_shell\":[],\"subagent\":[\"s\"]}\n",
        );
        assert!(matches!(
            converse(stream, &allocate(), |_, _| {}),
            Err(ConversationError::BadReply(_))
        ));
    }
}
