//! The opening exchange of every connection, for both sides.
//!
//! TCP (cross-host): `Hello{nonce}` → `Challenge{nonce, proof}` → `Auth{mac}` → `Welcome`.
//! The client checks the server's proof before answering, so neither side talks to a peer
//! that does not hold the key. The key is the lab secret, or, when the hello names a `user`,
//! that user's credential key ([`crate::credential`]; only servers given
//! [`ServerAuth::SecretOrUser`] accept those). Unix socket (same host): `Hello` → `Welcome`,
//! after the server has checked the peer's uid with SO_PEERCRED.
//! [`authenticate`] says who the peer proved to be ([`Peer`]).
//! The server side stops before `Welcome`: the caller validates the hello (e.g. the host
//! name) and sends `Welcome` or `Error` itself. Callers bound the whole exchange with a timeout.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::{
    auth::{random_nonce, Binding, Secret},
    credential::Credential,
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
    /// TCP: challenge–response with a user's credential (the hello names the user).
    Credential(&'a Credential),
    /// Unix socket: the server checks our uid; nothing to prove.
    PeerCred,
}

/// What the broker's `Welcome` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Welcomed {
    /// How often a host daemon reports, in milliseconds.
    pub report_interval_ms: u64,
    /// A host daemon may send its reports after the first as what changed.
    pub report_changes: bool,
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
    Ok(client_handshake_welcomed(conn, role, name, auth)
        .await?
        .report_interval_ms)
}

/// [`client_handshake`], returning the whole welcome.
pub async fn client_handshake_welcomed<S>(
    conn: &mut FramedConn<S>,
    role: Role,
    name: &str,
    auth: ClientAuth<'_>,
) -> Result<Welcomed, HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let client_nonce = random_nonce().map_err(FrameError::Io)?;
    let (key, user) = match auth {
        ClientAuth::Secret(secret) => (Some(secret), None),
        ClientAuth::Credential(cred) => (Some(cred.key()), Some(cred.user())),
        ClientAuth::PeerCred => (None, None),
    };
    let hello = Hello {
        proto: PROTOCOL_VERSION,
        role,
        name: name.to_string(),
        nonce: client_nonce.clone(),
        user: user.map(String::from),
    };
    conn.send(&ToBroker::Hello(hello)).await?;
    if let Some(key) = key {
        let (server_nonce, proof) = match conn.recv::<FromBroker>().await? {
            FromBroker::Challenge { nonce, proof } => (nonce, proof),
            other => return Err(refusal_or_unexpected(other)),
        };
        let b = Binding { role, name, user };
        if !key.verify_server_proof(&b, &client_nonce, &server_nonce, &proof) {
            let what = if user.is_some() {
                "credential"
            } else {
                "lab secret"
            };
            return Err(HandshakeError::Auth(format!(
                "the broker does not hold our {what}"
            )));
        }
        let mac = key.client_mac(&b, &client_nonce, &server_nonce);
        conn.send(&ToBroker::Auth { mac }).await?;
    }
    match conn.recv::<FromBroker>().await? {
        FromBroker::Welcome {
            report_interval_ms,
            report_changes,
        } => Ok(Welcomed {
            report_interval_ms,
            report_changes,
        }),
        other => Err(refusal_or_unexpected(other)),
    }
}

fn refusal_or_unexpected(msg: FromBroker) -> HandshakeError {
    match msg {
        FromBroker::Error { code, message } => HandshakeError::Refused { code, message },
        other => HandshakeError::Unexpected(format!("{other:?}")),
    }
}

/// The keys of the users a server accepts (the broker's credential book).
pub trait UserKeys: Sync {
    /// The key of `user`, if they have a credential (not revoked).
    fn key_of(&self, user: &str) -> Option<Secret>;
}

/// Who the peer proved to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// The lab secret, or the server's own uid on a unix socket: the broker's owner (and
    /// its host daemons).
    Owner,
    /// A user credential.
    User(String),
}

/// How the server checks a client.
pub enum ServerAuth<'a> {
    /// The lab secret only.
    Secret(&'a Secret),
    /// The lab secret, or a user credential when the hello names a user.
    SecretOrUser {
        secret: &'a Secret,
        users: &'a dyn UserKeys,
    },
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
    authenticate(conn, auth).await.map(|(hello, _)| hello)
}

/// [`server_handshake`], also saying who the peer proved to be.
pub async fn authenticate<S>(
    conn: &mut FramedConn<S>,
    auth: ServerAuth<'_>,
) -> Result<(Hello, Peer), HandshakeError>
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
    let peer = match (auth, hello.user.clone()) {
        (ServerAuth::PeerUid { .. }, Some(_)) => {
            return Err(refuse_auth(conn, "a user credential means nothing on a unix socket").await)
        }
        (
            ServerAuth::PeerUid {
                expected_uid,
                peer_uid,
            },
            None,
        ) => {
            check_peer_uid(conn, expected_uid, peer_uid).await?;
            Peer::Owner
        }
        (ServerAuth::Secret(_), Some(user)) => {
            let reason = format!(
                "user credentials (`{user}`) are not accepted here; this peer needs the lab secret"
            );
            return Err(refuse_auth(conn, &reason).await);
        }
        (ServerAuth::Secret(secret) | ServerAuth::SecretOrUser { secret, .. }, None) => {
            challenge(conn, secret, &hello, "wrong lab secret").await?;
            Peer::Owner
        }
        (ServerAuth::SecretOrUser { users, .. }, Some(user)) => {
            let Some(key) = users.key_of(&user) else {
                let reason = format!("no credential for user `{user}` (revoked, or never added)\nhelp: ask the broker's owner for one: `rb user add {user}`");
                return Err(refuse_auth(conn, &reason).await);
            };
            let wrong = format!("wrong credential for user `{user}`");
            challenge(conn, &key, &hello, &wrong).await?;
            Peer::User(user)
        }
    };
    Ok((hello, peer))
}

/// Refuses with an authentication error; returns the error for the caller.
async fn refuse_auth<S>(conn: &mut FramedConn<S>, reason: &str) -> HandshakeError
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    refuse(conn, ErrorCode::Auth, reason).await;
    HandshakeError::Auth(reason.to_string())
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
    wrong: &str,
) -> Result<(), HandshakeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let server_nonce = random_nonce().map_err(FrameError::Io)?;
    let b = Binding {
        role: hello.role,
        name: &hello.name,
        user: hello.user.as_deref(),
    };
    let proof = secret.server_proof(&b, &hello.nonce, &server_nonce);
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
    if secret.verify_client_mac(&b, &hello.nonce, &server_nonce, &mac) {
        Ok(())
    } else {
        Err(refuse_auth(conn, wrong).await)
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
                    report_changes: false,
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

    struct Book(Option<Credential>);

    impl UserKeys for Book {
        fn key_of(&self, user: &str) -> Option<Secret> {
            self.0
                .as_ref()
                .filter(|c| c.user() == user)
                .map(|c| c.key().clone())
        }
    }

    /// A client with `client` against a broker that knows `book` and the lab secret `lab`.
    async fn run_user(
        client: Credential,
        book: Book,
        lab: Secret,
    ) -> (
        Result<u64, HandshakeError>,
        Result<(Hello, Peer), HandshakeError>,
    ) {
        let (a, b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move {
            let mut conn = FramedConn::new(b);
            let auth = ServerAuth::SecretOrUser {
                secret: &lab,
                users: &book,
            };
            let got = authenticate(&mut conn, auth).await;
            if got.is_ok() {
                let welcome = FromBroker::Welcome {
                    report_interval_ms: 1,
                    report_changes: true,
                };
                conn.send(&welcome).await.expect("welcome");
            }
            got
        });
        let mut conn = FramedConn::new(a);
        let auth = ClientAuth::Credential(&client);
        let got = client_handshake(&mut conn, Role::Client, "rb", auth).await;
        drop(conn);
        (got, server.await.expect("join"))
    }

    fn cred(user: &str) -> Credential {
        Credential::generate(user).expect("random").expect("valid")
    }

    /// A welcome that offers reports as what changed says so; one from a broker before it
    /// (no such field) reads as no offer, and a welcome without the offer is written as such
    /// a broker wrote it.
    #[tokio::test]
    async fn the_welcome_says_whether_reports_may_come_as_changes() {
        for (text, offered) in [
            (
                r#"{"t":"welcome","report_interval_ms":7,"report_changes":true}"#,
                true,
            ),
            (r#"{"t":"welcome","report_interval_ms":7}"#, false),
        ] {
            let (a, b) = tokio::io::duplex(4096);
            let server = tokio::spawn(async move {
                let mut conn = FramedConn::new(b);
                let _ = conn.recv::<ToBroker>().await.expect("hello");
                conn.send_encoded(text.as_bytes().to_vec())
                    .await
                    .expect("welcome");
            });
            let mut conn = FramedConn::new(a);
            let got = client_handshake_welcomed(&mut conn, Role::Hostd, "n", ClientAuth::PeerCred)
                .await
                .expect("welcomed");
            assert_eq!(
                got,
                Welcomed {
                    report_interval_ms: 7,
                    report_changes: offered,
                }
            );
            server.await.expect("join");
        }
        let old_style = crate::frame::encode(&FromBroker::Welcome {
            report_interval_ms: 7,
            report_changes: false,
        })
        .expect("encodes");
        assert_eq!(old_style, r#"{"t":"welcome","report_interval_ms":7}"#);
    }

    #[tokio::test]
    async fn a_user_credential_is_welcomed_as_that_user() {
        let bob = cred("bob");
        let lab = secret("aaaaaaaaaaaaaaaaaaaa");
        let (client, server) = run_user(bob.clone(), Book(Some(bob)), lab).await;
        assert_eq!(client.expect("client ok"), 1);
        assert_eq!(server.expect("server ok").1, Peer::User("bob".into()));
    }

    #[tokio::test]
    async fn a_revoked_or_wrong_credential_is_refused_with_reason() {
        let lab = secret("aaaaaaaaaaaaaaaaaaaa");
        let (client, server) = run_user(cred("bob"), Book(None), lab.clone()).await;
        match client {
            Err(HandshakeError::Refused { code, message }) => {
                assert_eq!(code, ErrorCode::Auth);
                assert!(
                    message.contains("no credential for user `bob`"),
                    "{message}"
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(server.is_err());
        let (client, server) = run_user(cred("bob"), Book(Some(cred("bob"))), lab).await;
        assert!(matches!(client, Err(HandshakeError::Auth(_))), "{client:?}");
        assert!(server.is_err());
    }

    #[tokio::test]
    async fn a_lab_secret_only_server_refuses_user_credentials() {
        let (a, b) = tokio::io::duplex(4096);
        let server = tokio::spawn(async move {
            let mut conn = FramedConn::new(b);
            let lab = secret("aaaaaaaaaaaaaaaaaaaa");
            server_handshake(&mut conn, ServerAuth::Secret(&lab)).await
        });
        let mut conn = FramedConn::new(a);
        let bob = cred("bob");
        let got = client_handshake(&mut conn, Role::Hostd, "n", ClientAuth::Credential(&bob)).await;
        assert!(
            matches!(got, Err(HandshakeError::Refused { .. })),
            "{got:?}"
        );
        assert!(server.await.expect("join").is_err());
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
