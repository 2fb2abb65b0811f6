//! The one error type of the admin socket, on both sides.

use std::path::PathBuf;

/// What went wrong on the admin socket.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The socket path does not fit a Unix socket address.
    #[error(
        "PSM_A1001 the admin socket path {path} is {bytes} bytes, more than the {max} a Unix \
         socket allows; move the data directory to a shorter path"
    )]
    PathTooLong {
        /// The path.
        path: PathBuf,
        /// Its length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Something other than a socket has the socket's name.
    #[error("PSM_A1002 {path} exists and is not a socket; remove it, then restart the worker")]
    Foreign {
        /// The path.
        path: PathBuf,
    },
    /// Binding or preparing the socket failed.
    #[error("PSM_A1003 cannot serve the admin socket {path}: {source}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// Nothing listens on the socket: the engine is not running.
    #[error("PSM_A1004 the powersync_mdbx engine is not answering on {path} ({source})")]
    NotRunning {
        /// The path.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The engine did not answer in time.
    #[error("PSM_A1005 the powersync_mdbx engine did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The connection broke.
    #[error("PSM_A1006 the admin connection failed: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a valid request or response.
    #[error("PSM_A1007 invalid admin message: {0}")]
    Malformed(String),
    /// A line is larger than allowed.
    #[error("PSM_A1008 an admin message exceeds {max} bytes")]
    TooLarge {
        /// The limit.
        max: usize,
    },
}
