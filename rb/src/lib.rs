//! The `rb` command line, as a library so tests and other binaries can reuse its pieces.
//!
//! # Layout
//! - [`cli`]: the command line: flags, subcommands, which subcommand takes which flag.
//! - [`client`]: finding the broker (flag, env, lab file) and talking to it.
//! - [`table`]: the `rb status` table and its formatting helpers.
//! - [`init`]: `rb init` (secret and example lab file).
//! - [`policy`]: `rb policy show|reload|explain`.
//! - [`probe`]: `rb check --probe`, asking the Slurm cluster of `[overflow.slurm]` once.
//! - [`replay`]: `rb policy replay`, a decision trace replayed under another policy.
//! - [`report`]: `rb report`, the utilization chart of a decision trace (SVG).
//! - [`demo`]: `rb demo`, the embedded single-machine lab end to end.

pub mod cli;
pub mod client;
pub mod demo;
pub mod init;
pub mod policy;
pub mod probe;
pub mod replay;
pub mod report;
pub mod table;
