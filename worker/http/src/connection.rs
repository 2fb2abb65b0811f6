//! What a request's handler knows of the connection it came on: [`Connection`].

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::limits::HttpLimits;

/// A connection as its requests' handlers see it.
#[derive(Clone)]
pub(crate) struct Connection {
    /// Its place among the server's connections (`HttpLimits::max_connections`). hyper
    /// lets go of a connection once it is upgraded, so a WebSocket keeps a clone for its
    /// whole life: the place is given back when the last holder ends.
    #[allow(dead_code, reason = "held for its drop")]
    pub place: Arc<OwnedSemaphorePermit>,
    /// The server's limits.
    pub limits: HttpLimits,
    /// The server's places for WebSockets that wait for their SETUP
    /// ([`super::sync_socket::MAX_SOCKETS_WAITING_FOR_SETUP`]).
    pub setups: Arc<Semaphore>,
}
