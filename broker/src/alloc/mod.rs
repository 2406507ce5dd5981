//! The allocation core, which lives in the `allocation` crate (shared with `rb`, which
//! replays decision traces through it), and the SQLite [`store`] that makes its durable
//! state survive a broker restart.

pub use allocation::*;

pub mod store;

pub use store::{Store, StoreError};
