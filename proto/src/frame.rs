//! Framing: one JSON message per `\n`-terminated line, at most [`MAX_FRAME_BYTES`].
//!
//! [`FramedConn`] wraps any async byte stream. A line that is too long, not UTF-8 or not
//! valid JSON for the expected type is an error; callers close the connection on errors.

use futures::{SinkExt, StreamExt};
use serde::{de::DeserializeOwned, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::{Framed, LinesCodec, LinesCodecError};

use crate::MAX_FRAME_BYTES;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed by peer")]
    Closed,
    #[error("frame longer than the connection's limit")]
    TooLong,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed message: {0}")]
    Malformed(String),
}

/// A message stream over an async byte stream.
pub struct FramedConn<S> {
    inner: Framed<S, LinesCodec>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> FramedConn<S> {
    /// A connection that accepts frames up to [`MAX_FRAME_BYTES`] (what servers use).
    pub fn new(stream: S) -> Self {
        Self::with_limit(stream, MAX_FRAME_BYTES)
    }

    /// A connection that accepts frames up to `max_bytes`: clients of the broker use
    /// [`crate::MAX_RESPONSE_BYTES`], since a status of 10k hosts is several MiB.
    pub fn with_limit(stream: S, max_bytes: usize) -> Self {
        Self {
            inner: Framed::new(stream, LinesCodec::new_with_max_length(max_bytes)),
        }
    }

    /// Reads the next message; `Err(Closed)` at a clean end of stream.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T, FrameError> {
        let line = self.recv_line().await?;
        decode(&line)
    }

    /// Reads the next raw line (for callers that decode themselves).
    pub async fn recv_line(&mut self) -> Result<String, FrameError> {
        match self.inner.next().await {
            None => Err(FrameError::Closed),
            Some(Ok(line)) => Ok(line),
            Some(Err(LinesCodecError::MaxLineLengthExceeded)) => Err(FrameError::TooLong),
            Some(Err(LinesCodecError::Io(e))) if e.kind() == std::io::ErrorKind::InvalidData => {
                Err(FrameError::Malformed("frame is not UTF-8".into()))
            }
            Some(Err(LinesCodecError::Io(e))) => Err(FrameError::Io(e)),
        }
    }

    /// Writes one message and flushes it.
    pub async fn send<T: Serialize>(&mut self, msg: &T) -> Result<(), FrameError> {
        let line = encode(msg)?;
        self.inner.send(line).await.map_err(|e| match e {
            LinesCodecError::MaxLineLengthExceeded => FrameError::TooLong,
            LinesCodecError::Io(e) => FrameError::Io(e),
        })
    }

    /// The underlying stream (e.g. to read peer credentials).
    pub fn get_ref(&self) -> &S {
        self.inner.get_ref()
    }
}

/// Decodes one frame's text.
pub fn decode<T: DeserializeOwned>(line: &str) -> Result<T, FrameError> {
    serde_json::from_str(line).map_err(|e| FrameError::Malformed(e.to_string()))
}

/// Encodes one message as a frame's text (without the newline). Size is the receiver's
/// business: each side enforces its own limit when reading.
pub fn encode<T: Serialize>(msg: &T) -> Result<String, FrameError> {
    serde_json::to_string(msg).map_err(|e| FrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::msg::{Request, ToBroker};

    #[tokio::test]
    async fn round_trip_over_duplex() {
        let (a, b) = tokio::io::duplex(4096);
        let mut a = FramedConn::new(a);
        let mut b = FramedConn::new(b);
        let msg = ToBroker::Request {
            id: 1,
            req: Request::Status,
        };
        a.send(&msg).await.expect("send");
        let got: ToBroker = b.recv().await.expect("recv");
        assert_eq!(got, msg);
    }

    #[tokio::test]
    async fn garbage_is_malformed_not_panic() {
        let (mut a, b) = tokio::io::duplex(4096);
        let mut b = FramedConn::new(b);
        a.write_all(b"\x00\x01garbage{\n").await.expect("write");
        let got = b.recv::<ToBroker>().await;
        assert!(matches!(got, Err(FrameError::Malformed(_))), "{got:?}");
    }

    #[tokio::test]
    async fn overlong_frame_is_rejected() {
        let (mut a, b) = tokio::io::duplex(1 << 16);
        let mut b = FramedConn::new(b);
        tokio::spawn(async move {
            let chunk = vec![b'x'; 1 << 16];
            for _ in 0..20 {
                if a.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        });
        let got = b.recv::<ToBroker>().await;
        assert!(matches!(got, Err(FrameError::TooLong)), "{got:?}");
    }

    #[tokio::test]
    async fn eof_is_closed() {
        let (a, b) = tokio::io::duplex(64);
        drop(a);
        let mut b = FramedConn::new(b);
        assert!(matches!(
            b.recv::<ToBroker>().await,
            Err(FrameError::Closed)
        ));
    }
}
