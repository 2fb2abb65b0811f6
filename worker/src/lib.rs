//! The powersync_mdbx engine: a plain Rust library with no PostgreSQL headers.
//!
//! The PostgreSQL extension starts it from its background worker; tests start it in-process.
#![warn(missing_docs)]

pub mod cli;
pub mod rules;
