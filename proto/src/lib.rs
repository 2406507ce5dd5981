//! Wire protocol shared by every ResourceBroker process.
//!
//! # Layout
//! - [`msg`], [`report`], [`symbolic`]: the wire types as plain data, from the `proto-types`
//!   crate (no I/O: the allocation core uses them without this crate's runtime), plus
//!   [`msg::decode_from_hostd`] here.
//! - [`frame`]: one JSON message per line, with a size limit, over any async byte stream.
//! - [`auth`]: the lab secret and the HMAC challenge–response used on TCP connections.
//! - [`credential`]: per-user credentials (`rb user add`), proved like the lab secret.
//! - [`handshake`]: the opening exchange (hello → challenge → auth → welcome) for both sides.
//! - [`peercred`]: SO_PEERCRED uid checks for local (unix-socket) connections.
//! - [`route`]: this machine's address on the route to a peer (what an agent advertises).
//! - [`tag`]: the environment tag that marks every process of a remote command.
//! - [`mux`]: where a job's ssh master connections (one per granted host) have their sockets.
//! - [`repeats`]: host daemons' frames, a report that repeats the last one found unparsed.
//!
//! Every connection starts with a [`msg::Hello`] carrying [`PROTOCOL_VERSION`] and the
//! peer's [`msg::Role`]. The full description lives in `PROTOCOL.md` at the repository root.

pub mod agent;
pub mod auth;
pub mod credential;
pub mod frame;
pub mod handshake;
pub mod mux;
pub mod peercred;
pub mod repeats;
pub mod route;
pub mod tag;
pub mod taken_back;

pub use proto_types::{
    report, report_changes, row_parts, symbolic, MAX_FRAME_BYTES, MAX_RESPONSE_BYTES,
    PROTOCOL_VERSION,
};

/// The messages ([`proto_types::msg`]), and decoding a host daemon's frames.
pub mod msg {
    pub use crate::frame::decode_from_hostd;
    pub use proto_types::msg::*;
}
