//! The HTTP server's own limits: how long a client may take to send a request's headers
//! (also how long a kept-alive connection may sit idle between requests) and then its
//! body, how long it may take nothing of what it is sent, and how many connections it
//! holds at once. Defaults in `docs/operations.md`, "Limits".

use std::time::Duration;

/// How long a client gets to send a request's headers, and a kept-alive connection to
/// start its next request, before the connection is closed.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client gets to send a request's whole body, counted once the request's
/// headers are read (and, on the sync endpoints, its token accepted).
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may go without the client taking any of what it is sent
/// before it is closed (a client that stopped reading).
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Descriptors kept for everything but client connections: the store's files, the
/// connections to the primary, the admin socket, logs, PostgreSQL's own.
pub const DESCRIPTOR_RESERVE: u64 = 256;

/// The fewest connections a server holds, however low the descriptor limit.
const MIN_CONNECTIONS: u64 = 16;

/// What the HTTP server holds its clients to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// See [`DEFAULT_HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// Connections open at once; one more is answered 503 (`PSM_H1504`) and closed.
    pub max_connections: usize,
    /// See [`DEFAULT_WRITE_TIMEOUT`].
    pub write_timeout: Duration,
    /// See [`DEFAULT_BODY_READ_TIMEOUT`]; past it the request is answered 408
    /// (`PSM_H1408`) and the connection closed.
    pub body_read_timeout: Duration,
}

impl HttpLimits {
    /// The defaults for a process that may hold `open_files` descriptors: every one but
    /// [`DESCRIPTOR_RESERVE`] for client connections.
    pub fn for_open_files(open_files: u64) -> Self {
        let connections = open_files
            .saturating_sub(DESCRIPTOR_RESERVE)
            .max(MIN_CONNECTIONS);
        Self {
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: usize::try_from(connections).unwrap_or(usize::MAX),
            write_timeout: DEFAULT_WRITE_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_the_descriptors_less_a_reserve() {
        assert_eq!(HttpLimits::for_open_files(20_000).max_connections, 19_744);
        assert_eq!(HttpLimits::for_open_files(100).max_connections, 16);
        assert_eq!(HttpLimits::for_open_files(0).max_connections, 16);
    }
}
