//! The service configuration file, in the PowerSync service's YAML format.
//!
//! Operators reuse the file they already run the official service with; this module reads
//! the subset the engine honours (`replication.connections[0]`, `sync_config`/`sync_rules`,
//! `client_auth`, `port`, the limits of `api.parameters`), resolves `!env` tags and relative paths, and reports every other
//! top-level section as ignored so nothing changes behaviour silently.
#![warn(missing_docs)]

mod api;
mod connection;
mod env_tags;
mod error;
mod file;
mod keys;
mod peer;

pub use api::{ApiLimits, ApiTokens};
pub use connection::{SourceBounds, SourceConnection, SslMode};
pub use error::ConfigError;
pub use file::{
    ClientAuth, RulesSource, ServiceConfig, Supabase, DEFAULT_PORT, SUPABASE_JWKS_OVERRIDE_ENV,
};
pub use peer::{PeerSecret, PeerTlsFiles, SeedPeer};
