//! `rb-hostd`: the host daemon that runs on every lab machine.
//!
//! # Layout
//! - [`sensors`]: reads the machine (load, CPUs, memory, users, idleness) into a
//!   [`proto::report::HostReport`]; pure parsers plus thin file reads, all paths configurable.
//! - [`daemon`]: connects to the broker, authenticates, sends reports on an interval and at
//!   once on a login or resumed input, reconnects with backoff, exits on its lifeline.
//! - [`jobload`]: `job_load`, the load of this lab's job processes (HTCondor's
//!   `CondorLoadAvg`), from their CPU time, averaged like `load1`.
//! - [`sweep`]: ends leftover processes of allocations the broker no longer has (pure
//!   decision, `/proc` scan at the edge).

pub mod cli;
pub mod daemon;
pub mod jobload;
pub mod sensors;
pub mod sweep;
