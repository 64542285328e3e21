//! Test tooling placeholder.
