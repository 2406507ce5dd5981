//! `rb-mw`, the master-worker example application (README, "Example applications").
//!
//! The program is C (`c/`, with the JEL C client compiled in); `build.rs` compiles it and
//! puts it at `target/<profile>/rb-mw`. This crate only carries that build and says where
//! the program is.

/// The path of the `rb-mw` program this build made.
pub const PROGRAM: &str = env!("RB_MW_PATH");
