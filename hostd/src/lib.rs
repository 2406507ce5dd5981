//! `rb-hostd`: the host daemon that runs on every lab machine.
//!
//! # Layout
//! - [`sensors`]: reads the machine (load, CPUs, memory, users, idleness) into a
//!   [`proto::report::HostReport`]; pure parsers plus thin file reads, all paths configurable.
//! - [`daemon`]: connects to the broker, authenticates, sends reports on an interval and at
//!   once on a login or resumed input, reconnects with backoff, exits on its lifeline.

pub mod daemon;
pub mod sensors;
