//! The opening exchange of every connection, for both sides.
//!
//! TCP (cross-host): `Hello{nonce}` → `Challenge{nonce, proof}` → `Auth{mac}` → `Welcome`.
//! The client checks the server's proof before answering, so neither side talks to a peer
//! that does not hold the lab secret. Unix socket (same host): `Hello` → `Welcome`, after
//! the server has checked the peer's uid with SO_PEERCRED.
//! The server side stops before `Welcome`: the caller validates the hello (e.g. the host
//! name) and sends `Welcome` or `Error` itself. Callers bound the whole exchange with a timeout.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::{
    auth::{random_nonce, Secret},
    frame::{FrameError, FramedConn},
    msg::{ErrorCode, FromBroker, Hello, Role, ToBroker},
    PROTOCOL_VERSION,
};

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("peer speaks protocol version {0}, this build speaks {PROTOCOL_VERSION}")]
    Version(u32),
    #[error("authentication failed: {0}")]
    Auth(String),
    #[error("unexpected message during handshake: {0}")]
    Unexpected(String),
    #[error("refused by broker ({code:?}): {message}")]
    Refused { code: ErrorCode, message: String },
}

/// How a client proves who it is.
pub enum ClientAuth<'a> {
    /// TCP: challenge–response with the lab secret.
    Secret(&'a Secret),
    /// Unix socket: the server checks our uid; nothing to prove.
    PeerCred,
}

/// Runs the client side; returns the report interval from `Welcome`, in milliseconds.
pub async fn client_handshake<S>(
    conn: &mut FramedConn<S>,
    role: Role,
    name: &str,
    auth: ClientAuth<'_>,
) -> Result<u64, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let client_nonce = random_nonce().map_err(FrameError::Io)?;
    let hello = Hello {
        proto: PROTOCOL_VERSION,
        role,
        name: name.to_string(),
        nonce: client_nonce.clone(),
    };
    conn.send(&ToBroker::Hello(hello)).await?;
    if let ClientAuth::Secret(secret) = auth {
        let (server_nonce, proof) = match conn.recv::<FromBroker>().await? {
            FromBroker::Challenge { nonce, proof } => (nonce, proof),
            other => return Err(refusal_or_unexpected(other)),
        };
        if !secret.verify_server_proof(role, name, &client_nonce, &server_nonce, &proof) {
            return Err(HandshakeError::Auth(
                "the broker does not hold our lab secret".into(),
            ));
        }
        let mac = secret.client_mac(role, name, &client_nonce, &server_nonce);
        conn.send(&ToBroker::Auth { mac }).await?;
    }
    match conn.recv::<FromBroker>().await? {
        FromBroker::Welcome { report_interval_ms } => Ok(report_interval_ms),
        other => Err(refusal_or_unexpected(other)),
    }
}

fn refusal_or_unexpected(msg: FromBroker) -> HandshakeError {
    match msg {
        FromBroker::Error { code, message } => HandshakeError::Refused { code, message },
        other => HandshakeError::Unexpected(format!("{other:?}")),
    }
}

/// How the server checks a client.
pub enum ServerAuth<'a> {
    Secret(&'a Secret),
    /// Unix socket: `peer_uid` (from SO_PEERCRED) must equal `expected_uid`.
    PeerUid {
        expected_uid: u32,
        peer_uid: Option<u32>,
    },
}

/// Runs the server side up to (not including) `Welcome`; returns the peer's hello.
/// On failure it has already sent an `Error` message where the peer can use one.
pub async fn server_handshake<S>(
    conn: &mut FramedConn<S>,
    auth: ServerAuth<'_>,
) -> Result<Hello, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let hello = match recv_or_refuse(conn).await? {
        ToBroker::Hello(hello) => hello,
        other => {
            let reason = format!("expected hello, got {}", tag_of(&other));
            refuse(conn, ErrorCode::BadMessage, &reason).await;
            return Err(HandshakeError::Unexpected(reason));
        }
    };
    if hello.proto != PROTOCOL_VERSION {
        let reason = format!(
            "protocol {} unsupported; this broker speaks {PROTOCOL_VERSION}",
            hello.proto
        );
        refuse(conn, ErrorCode::Version, &reason).await;
        return Err(HandshakeError::Version(hello.proto));
    }
    match auth {
        ServerAuth::PeerUid {
            expected_uid,
            peer_uid,
        } => check_peer_uid(conn, expected_uid, peer_uid).await?,
        ServerAuth::Secret(secret) => challenge(conn, secret, &hello).await?,
    }
    Ok(hello)
}

async fn check_peer_uid<S>(
    conn: &mut FramedConn<S>,
    expected: u32,
    peer: Option<u32>,
) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if peer == Some(expected) {
        return Ok(());
    }
    let reason = match peer {
        Some(uid) => format!("uid {uid} may not use the control socket of uid {expected}"),
        None => "peer credentials unavailable".to_string(),
    };
    refuse(conn, ErrorCode::Auth, &reason).await;
    Err(HandshakeError::Auth(reason))
}

async fn challenge<S>(
    conn: &mut FramedConn<S>,
    secret: &Secret,
    hello: &Hello,
) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let server_nonce = random_nonce().map_err(FrameError::Io)?;
    let proof = secret.server_proof(hello.role, &hello.name, &hello.nonce, &server_nonce);
    conn.send(&FromBroker::Challenge {
        nonce: server_nonce.clone(),
        proof,
    })
    .await?;
    let mac = match recv_or_refuse(conn).await? {
        ToBroker::Auth { mac } => mac,
        other => {
            let reason = format!("expected auth, got {}", tag_of(&other));
            refuse(conn, ErrorCode::BadMessage, &reason).await;
            return Err(HandshakeError::Unexpected(reason));
        }
    };
    if secret.verify_client_mac(hello.role, &hello.name, &hello.nonce, &server_nonce, &mac) {
        Ok(())
    } else {
        refuse(conn, ErrorCode::Auth, "wrong lab secret").await;
        Err(HandshakeError::Auth("wrong lab secret".into()))
    }
}

/// Receives the next message; a malformed one gets an error reply before the failure returns.
async fn recv_or_refuse<S>(conn: &mut FramedConn<S>) -> Result<ToBroker, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    match conn.recv::<ToBroker>().await {
        Ok(msg) => Ok(msg),
        Err(e @ (FrameError::Malformed(_) | FrameError::TooLong)) => {
            refuse(conn, ErrorCode::BadMessage, &e.to_string()).await;
            Err(e.into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Sends an error message, ignoring failures (the connection is being dropped anyway).
pub async fn refuse<S>(conn: &mut FramedConn<S>, code: ErrorCode, message: &str)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let _ = conn
        .send(&FromBroker::Error {
            code,
            message: message.to_string(),
        })
        .await;
}

fn tag_of(msg: &ToBroker) -> &'static str {
    match msg {
        ToBroker::Hello(_) => "hello",
        ToBroker::Auth { .. } => "auth",
        ToBroker::Report(_) => "report",
        ToBroker::Request { .. } => "request",
        _ => "job message",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(text: &str) -> Secret {
        Secret::from_file_bytes(text.as_bytes()).expect("long enough")
    }

    async fn run_pair(
        client_secret: Secret,
        server_secret: Secret,
    ) -> (Result<u64, HandshakeError>, Result<Hello, HandshakeError>) {
        let (a, b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move {
            let mut conn = FramedConn::new(b);
            let got = server_handshake(&mut conn, ServerAuth::Secret(&server_secret)).await;
            if got.is_ok() {
                conn.send(&FromBroker::Welcome {
                    report_interval_ms: 2000,
                })
                .await
                .expect("welcome");
            }
            got
        });
        let mut conn = FramedConn::new(a);
        let client = client_handshake(
            &mut conn,
            Role::Hostd,
            "node02",
            ClientAuth::Secret(&client_secret),
        )
        .await;
        drop(conn); // a client that gives up hangs up; the server must see that
        (client, server.await.expect("join"))
    }

    #[tokio::test]
    async fn same_secret_is_welcomed() {
        let (client, server) = run_pair(
            secret("aaaaaaaaaaaaaaaaaaaa"),
            secret("aaaaaaaaaaaaaaaaaaaa"),
        )
        .await;
        assert_eq!(client.expect("client ok"), 2000);
        assert_eq!(server.expect("server ok").name, "node02");
    }

    #[tokio::test]
    async fn wrong_secret_fails_on_both_sides() {
        let (client, server) = run_pair(
            secret("aaaaaaaaaaaaaaaaaaaa"),
            secret("bbbbbbbbbbbbbbbbbbbb"),
        )
        .await;
        assert!(matches!(client, Err(HandshakeError::Auth(_))), "{client:?}");
        assert!(server.is_err());
    }

    #[tokio::test]
    async fn wrong_uid_is_refused_with_reason() {
        let (a, b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move {
            let mut conn = FramedConn::new(b);
            server_handshake(
                &mut conn,
                ServerAuth::PeerUid {
                    expected_uid: 1000,
                    peer_uid: Some(1001),
                },
            )
            .await
        });
        let mut conn = FramedConn::new(a);
        let client = client_handshake(&mut conn, Role::Client, "rb", ClientAuth::PeerCred).await;
        match client {
            Err(HandshakeError::Refused {
                code: ErrorCode::Auth,
                message,
            }) => assert!(message.contains("1001")),
            other => panic!("unexpected {other:?}"),
        }
        assert!(server.await.expect("join").is_err());
    }
}
