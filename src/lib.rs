//! Valkey operator library.
