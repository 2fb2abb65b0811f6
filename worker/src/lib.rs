//! The powersync_mdbx engine: a plain Rust library with no PostgreSQL headers.
//!
//! The PostgreSQL extension starts it from its background worker; tests start it in-process.
#![warn(missing_docs)]

pub mod admin;
pub mod auth;
pub mod cli;
pub mod config;
pub mod engine;
pub mod host;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod replication;
pub mod rules;
pub mod source;
pub mod status;
pub mod store;
pub mod sync;
