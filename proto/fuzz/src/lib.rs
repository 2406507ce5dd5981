//! Harness of the `proto` fuzz targets: arbitrary bytes as what a peer sends a broker
//! listener, through the framing, handshake and decoding the listeners use
//! (`broker/src/server.rs`: [`FramedConn`], [`server_handshake`], `recv::<ToBroker>`).
//!
//! Shared by the cargo-fuzz targets (`fuzz_targets/`) and by `proto/tests/fuzz_smoke.rs`
//! (which includes this file), so the stable smoke replays exactly what the fuzzer runs.
//! A panic anywhere is the bug; so is a decoded message that does not encode and decode
//! again (what the broker stores and echoes must stay readable).

use proto::{
    auth::Secret,
    frame::{self, FramedConn},
    handshake::{server_handshake, ServerAuth, UserKeys},
    msg::{decode_from_hostd, ToBroker},
    repeats::{HostdFrame, HostdFrames},
    report::HostReport,
};

/// The broker's credential book, with one user, `bob` (key: the lab secret's text, so a
/// seed's MAC can be computed the same way for both).
struct OneUser(Secret);

impl UserKeys for OneUser {
    fn key_of(&self, user: &str) -> Option<Secret> {
        (user == "bob").then(|| self.0.clone())
    }
}

/// Frame limit for the in-memory connection: small, so short inputs reach the too-long
/// path too (the listeners use [`proto::MAX_FRAME_BYTES`]).
pub const LIMIT: usize = 4096;

/// The broker's TCP port: hello → challenge → auth with the lab secret or user `bob`'s
/// credential (as the broker's listener takes them), then the messages of a session (only
/// reached with the right MAC, so every line is also decoded alone).
pub fn broker_tcp(data: &[u8]) {
    let secret = Secret::from_file_bytes(
        b"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    )
    .expect("a 64-character secret is long enough");
    let users = OneUser(secret.clone());
    let auth = ServerAuth::SecretOrUser {
        secret: &secret,
        users: &users,
    };
    serve(data, auth);
    decode_each_line(data);
}

/// The control socket: hello from a peer whose uid matches (SO_PEERCRED), then requests.
pub fn control_socket(data: &[u8]) {
    let auth = ServerAuth::PeerUid {
        expected_uid: 1000,
        peer_uid: Some(1000),
    };
    serve(data, auth);
    decode_each_line(data);
}

/// One connection whose peer sent `data` and then closed: the handshake, then messages
/// until the first error, as a broker session reads them.
fn serve(data: &[u8], auth: ServerAuth<'_>) {
    run(async {
        let mut conn = FramedConn::with_limit(tokio::io::join(data, tokio::io::sink()), LIMIT);
        if server_handshake(&mut conn, auth).await.is_err() {
            return;
        }
        while let Ok(msg) = conn.recv::<ToBroker>().await {
            round_trip(&msg);
        }
    });
}

/// Runs `session` to its end on this thread's runtime (one per thread, reused: a
/// runtime per input would cost more than the input).
fn run(session: impl std::future::Future<Output = ()>) {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime builds");
    }
    RUNTIME.with(|runtime| runtime.block_on(session));
}

/// Every line of `data` decoded as the broker decodes a frame, and as it decodes a host
/// daemon's frame ([`decode_from_hostd`]: a report straight into `HostReport`), which must
/// agree with the tagged enum whenever both decode it; and the lines in turn as one host
/// daemon's session decodes them ([`HostdFrames`]: repeats, and reports as what changed,
/// applied to the last one as the broker's host table applies them), whose reports must
/// encode and decode again.
fn decode_each_line(data: &[u8]) {
    let mut session = HostdFrames::default();
    let mut held = HostReport::default();
    for line in data.split(|&b| b == b'\n') {
        let Ok(text) = std::str::from_utf8(line) else {
            continue;
        };
        match session.decode(text.to_string()) {
            Ok(HostdFrame::Parsed(msg)) => {
                if let ToBroker::Report(whole) = &msg {
                    held = (**whole).clone();
                }
                round_trip(&msg);
            }
            Ok(HostdFrame::Changes(mut patch)) => {
                patch.apply_to(&mut held);
                round_trip(&ToBroker::Report(Box::new(held.clone())));
            }
            _ => {}
        }
        let generic = frame::decode::<ToBroker>(text);
        if let Ok(msg) = &generic {
            round_trip(msg);
        }
        if let Ok(msg) = decode_from_hostd(text) {
            round_trip(&msg);
            if let Ok(generic) = generic {
                assert_eq!(
                    msg, generic,
                    "the two decodings of a host daemon's frame differ"
                );
            }
        }
    }
}

fn round_trip(msg: &ToBroker) {
    let text = frame::encode(msg).expect("a decoded message encodes");
    frame::decode::<ToBroker>(&text).expect("an encoded message decodes");
}
