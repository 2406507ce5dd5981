pub mod compile;
pub mod error;
pub mod facts;
pub mod hooks;
mod source;
pub mod value;
