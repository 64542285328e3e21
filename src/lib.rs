//! Valkey operator library.
pub mod roll;
pub mod runtime;
pub mod valkey;
