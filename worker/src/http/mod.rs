//! The HTTP server on the configured port: probes now, the sync protocol in later stages.

mod error;
mod probes;
mod server;

pub use error::ApiError;
pub use server::{bind, serve, HttpState};

/// The body type every handler answers with (streaming bodies join it later).
pub type Body = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;
