//! Wire protocol shared by every ResourceBroker process.
//!
//! # Layout
//! - [`msg`]: the messages, one serde enum per direction (`ToBroker`, `FromBroker`).
//! - [`report`]: the host report a host daemon sends, and the host status the broker serves.
//! - [`frame`]: one JSON message per line, with a size limit, over any async byte stream.
//! - [`auth`]: the lab secret and the HMAC challenge–response used on TCP connections.
//! - [`credential`]: per-user credentials (`rb user add`), proved like the lab secret.
//! - [`handshake`]: the opening exchange (hello → challenge → auth → welcome) for both sides.
//! - [`peercred`]: SO_PEERCRED uid checks for local (unix-socket) connections.
//! - [`route`]: this machine's address on the route to a peer (what an agent advertises).
//! - [`symbolic`]: which host names are symbolic, and their placeholder addresses.
//! - [`tag`]: the environment tag that marks every process of a remote command.
//! - [`mux`]: where a job's ssh master connections (one per granted host) have their sockets.
//!
//! Every connection starts with a [`msg::Hello`] carrying [`PROTOCOL_VERSION`] and the
//! peer's [`msg::Role`]. The full description lives in `PROTOCOL.md` at the repository root.

pub mod agent;
pub mod auth;
pub mod credential;
pub mod frame;
pub mod handshake;
pub mod msg;
pub mod mux;
pub mod peercred;
pub mod report;
pub mod route;
pub mod symbolic;
pub mod tag;

/// Version spoken by this build; a peer with another version is refused at hello.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame (one JSON message) a server accepts from a peer, in bytes. Bigger frames
/// close the connection.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// Largest frame a client accepts from the broker (e.g. the status of 10k hosts).
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;
