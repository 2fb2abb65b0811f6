//! Errors that end the engine. Their kind tells the host what to do: wait for the
//! operator (a reload or reset), or start the engine again inside the worker after a
//! backoff (`host`).

use config::ConfigError;
use replication::ReplicationError;
use rules::RulesError;
use store::StoreError;

/// Why the engine stopped.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The configuration cannot be used.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store cannot be opened or written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The sync rules do not compile.
    #[error("PSM_C1010 the sync rules are invalid: {0}")]
    Rules(#[from] RulesError),
    /// Replication stopped on an error the operator must fix.
    #[error(transparent)]
    Replication(#[from] ReplicationError),
    /// `client_auth` holds keys that cannot be used.
    #[error("PSM_C1020 client_auth in the config file: {0}; fix the keys, then reload")]
    Auth(#[from] auth::AuthError),
    /// The HTTP port cannot be bound.
    #[error(
        "PSM_H1001 cannot listen on {address}: {source}; free the port, or change `port` \
             in the config file or powersync_mdbx.listen_addresses, then reload"
    )]
    Listen {
        /// The address that failed.
        address: String,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A rules deploy could not finish (the served generation is unaffected).
    #[error("{0}")]
    Deploy(String),
    /// A thread or the runtime could not be created.
    #[error("PSM_E1001 cannot start the engine's threads: {0}")]
    Thread(std::io::Error),
    /// The engine thread panicked: a bug. The host starts the engine again after a
    /// backoff.
    #[error(
        "PSM_E1002 the engine thread panicked (a bug; the engine starts again after a \
             backoff — please report the server log)"
    )]
    Panicked,
}

impl EngineError {
    /// True when retrying cannot help and the worker should wait for the operator
    /// (configuration reload, reset) instead of restarting in a loop.
    pub fn needs_operator(&self) -> bool {
        match self {
            Self::Config(_) | Self::Listen { .. } | Self::Rules(_) | Self::Auth(_) => true,
            Self::Replication(e) => e.needs_operator(),
            Self::Store(e) => e.needs_operator(),
            Self::Deploy(_) | Self::Thread(_) | Self::Panicked => false,
        }
    }
}
