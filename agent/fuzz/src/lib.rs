//! Harness of the `agent` fuzz targets: arbitrary bytes as what a peer sends the agent's
//! listeners (`agent/src/listeners.rs`), through the same framing, handshake and decoding.
//!
//! Shared by the cargo-fuzz targets (`fuzz_targets/`) and by `tests/tests/fuzz_smoke.rs`
//! (which includes this file), so the stable smoke replays exactly what the fuzzer runs.
//! A panic anywhere is the bug; so is a decoded message that does not encode and decode
//! again.

use agent::listeners::subagent_alloc;
use proto::{
    agent::ShimRequest,
    auth::Secret,
    frame::{self, FramedConn},
    handshake::{server_handshake, ServerAuth},
    msg::ToBroker,
    symbolic,
};
use serde::{de::DeserializeOwned, Serialize};

/// Frame limit for the in-memory connection: small, so short inputs reach the too-long
/// path too (the listeners use [`proto::MAX_FRAME_BYTES`]).
pub const LIMIT: usize = 4096;

/// The job-local socket: one request (`allocate`, `attach`, or the preload's `resolved`),
/// then lines the shim may send while it waits, as `shim_conn` reads them.
pub fn shim_socket(data: &[u8]) {
    run(async {
        let mut conn = FramedConn::with_limit(tokio::io::join(data, tokio::io::sink()), LIMIT);
        let Ok(request) = conn.recv::<ShimRequest>().await else {
            return;
        };
        names_of(&request);
        while conn.recv_line().await.is_ok() {}
    });
    decode_each_line::<ShimRequest>(data, names_of);
}

/// The subagent port: hello → challenge → auth with the lab secret, the allocation id in
/// the hello's name, then the subagent's messages (only reached with the right MAC, so
/// every line is also decoded alone).
pub fn subagent(data: &[u8]) {
    let secret = Secret::from_file_bytes(
        b"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
    )
    .expect("a 64-character secret is long enough");
    run(async {
        let mut conn = FramedConn::with_limit(tokio::io::join(data, tokio::io::sink()), LIMIT);
        let Ok(hello) = server_handshake(&mut conn, ServerAuth::Secret(&secret)).await else {
            return;
        };
        if subagent_alloc(&hello).is_none() {
            return;
        }
        while let Ok(msg) = conn.recv::<ToBroker>().await {
            round_trip(&msg);
        }
    });
    decode_each_line::<ToBroker>(data, |_| {});
}

/// What the agent and the shim do with the names in a request.
fn names_of(request: &ShimRequest) {
    let name = match request {
        ShimRequest::Allocate { symbolic: name, .. }
        | ShimRequest::Attach { host: name, .. }
        | ShimRequest::Resolved { symbolic: name, .. }
        | ShimRequest::Named { host: name, .. }
        | ShimRequest::Used { host: name, .. } => name,
        ShimRequest::TakenBack { .. } => return,
    };
    if symbolic::is_symbolic(name) {
        let _ = symbolic::placeholder_address(name);
    }
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

/// Every line of `data` decoded as a frame of type `T`, then `check`ed.
fn decode_each_line<T>(data: &[u8], check: impl Fn(&T))
where
    T: DeserializeOwned + Serialize,
{
    for line in data.split(|&b| b == b'\n') {
        let Ok(text) = std::str::from_utf8(line) else {
            continue;
        };
        if let Ok(msg) = frame::decode::<T>(text) {
            check(&msg);
            round_trip(&msg);
        }
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(msg: &T) {
    let text = frame::encode(msg).expect("a decoded message encodes");
    frame::decode::<T>(&text).expect("an encoded message decodes");
}
