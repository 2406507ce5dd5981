//! ResourceBroker's wire types as plain data: what the messages say, not how they travel.
//! A crate of its own so that code which only reads or builds them (the allocation core,
//! `rb policy replay`) needs neither an async runtime nor system calls; `proto` adds the
//! I/O (framing, the handshake, authentication) and re-exports these modules under the
//! same paths (`proto::msg`, `proto::report`, `proto::symbolic`).
//!
//! # Layout
//! - [`msg`]: the messages, one serde enum per direction (`ToBroker`, `FromBroker`).
//! - [`report`]: the host report a host daemon sends, and the host status the broker serves.
//! - [`report_changes`]: a host report sent as the fields that changed since the last one.
//! - [`symbolic`]: which host names are symbolic, and their placeholder addresses.

pub mod msg;
pub mod report;
pub mod report_changes;
pub mod row_parts;
pub mod symbolic;

/// Version spoken by this build; a peer with another version is refused at hello.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame (one JSON message) a server accepts from a peer, in bytes. Bigger frames
/// close the connection.
pub const MAX_FRAME_BYTES: usize = 1 << 20;

/// Largest frame a client accepts from the broker (e.g. the status of 10k hosts).
pub const MAX_RESPONSE_BYTES: usize = 256 << 20;
