//! JEL (Join-Elect-Leave) for adaptive ResourceBroker jobs: a job's processes join its
//! **pool**, learn in one totally ordered stream who joined, left or died, which hosts come
//! and go (with a `vacate` notice before a host is taken back), elect masters and signal each
//! other. The job's agent hosts the pool; members talk to it over a Unix socket (`RB_JEL`).
//!
//! # Layout
//! - [`wire`]: the protocol's types and their JSON lines (hello, requests, replies, events).
//! - [`pool`]: the pure pool core, [`pool::Pool::handle`] → [`pool::Output`]s, that the agent
//!   hosts (no sockets, no clock).
//! - [`client`]: the blocking Rust client ([`client::Client`], [`client::Member`],
//!   [`client::Watcher`]).
//! - `nonblocking` (feature `tokio`): the same client, async.
//! - `host` (feature `tokio`): the shell that hosts a pool on a Unix socket (`PoolHost`),
//!   driven by the job's agent.
//!
//! The protocol, with an example of every line, is in PROTOCOL.md, section "JEL".

pub mod client;
#[cfg(feature = "tokio")]
pub mod host;
#[cfg(feature = "tokio")]
pub mod nonblocking;
pub mod pool;
pub mod wire;

pub use client::{Client, Election, JelError, Member as MemberHandle, Watcher, ENV_JEL};
pub use wire::{DeathReason, Event, EventKind, Member, MemberId};
