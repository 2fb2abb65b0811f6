//! The HTTP adapter over the sync service, on the configured port: probes, `/metrics`,
//! `/sync/stream` and `/write-checkpoint2.json`; and the peer listener (`/peer/store` over
//! TLS).
#![warn(missing_docs)]

mod accept;
mod admin_api;
mod admission;
mod authorization;
mod body;
mod compress;
mod connection;
mod cors;
mod error;
#[doc(hidden)]
pub mod fuzzing;
mod limits;
mod metrics;
mod metrics_port;
mod metrics_text;
mod peer_copy;
mod peer_gate;
mod peer_tls;
mod probes;
mod request_body;
mod rsocket;
mod server;
mod setup_gate;
mod state;
mod stream_log;
mod sync_socket;
mod sync_stream;
mod write_checkpoint;
mod write_timeout;

pub use body::Body;
pub use error::ApiError;
pub use limits::{
    HttpLimits, DEFAULT_BODY_READ_TIMEOUT, DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_WRITE_TIMEOUT,
    DESCRIPTOR_RESERVE,
};
pub use metrics_port::serve_metrics;
pub use peer_gate::PeerGate;
pub use peer_tls::{peer_tls_acceptor, serve_peers};
pub use server::{bind, raise_open_files_limit, serve};
pub use state::HttpState;
pub use sync_socket::MAX_SOCKETS_WAITING_FOR_SETUP;
