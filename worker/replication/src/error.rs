//! Errors of the replication stage, each with its kind: retry, or wait for the operator.

use rules::RulesError;
use source::SourceError;
use store::StoreError;

/// Why replication stopped.
#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    /// The primary, its settings or the connection.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A row the rules cannot evaluate (a value they cannot read).
    #[error("PSM_B1006 {0}; fix the rules or the data, then reload")]
    Rules(#[from] RulesError),
    /// The stored bootstrap and the primary or configuration disagree.
    #[error("{code} {message}")]
    Ownership {
        /// Stable code (`PSM_B1xxx`).
        code: &'static str,
        /// What disagrees and what to do.
        message: String,
    },
    /// The replication stream: a lost slot, a changed table, an unexpected message.
    #[error("{code} {message}")]
    Stream {
        /// Stable code (`PSM_R2xxx`).
        code: &'static str,
        /// What happened and what to do.
        message: String,
        /// Only the operator can fix it.
        operator: bool,
    },
    /// Seeding from a peer (`seed`) failed.
    #[error("{code} {message}")]
    Seed {
        /// Stable code (`PSM_B102x`).
        code: &'static str,
        /// What happened and what to do.
        message: String,
        /// Only the operator can fix it.
        operator: bool,
    },
    /// COPY delivered a row that does not decode.
    #[error("PSM_B1007 table {table}: {problem}")]
    Copy {
        /// The table.
        table: String,
        /// What is wrong.
        problem: String,
    },
}

impl ReplicationError {
    /// True when only the operator can fix it; false when retrying may help.
    pub fn needs_operator(&self) -> bool {
        match self {
            Self::Source(e) => e.needs_operator(),
            Self::Store(e) => e.needs_operator(),
            Self::Stream { operator, .. } | Self::Seed { operator, .. } => *operator,
            Self::Rules(_) | Self::Ownership { .. } | Self::Copy { .. } => true,
        }
    }

    /// True when the store failed under the engine (a failed commit poisons it): retrying
    /// on the same store cannot help; the engine opens the store again first.
    pub fn needs_restart(&self) -> bool {
        matches!(self, Self::Store(e) if !e.needs_operator())
    }
}

/// A transient problem of the replication stream (`PSM_R2010`): reconnect and retry.
pub(super) fn stream_error(message: String) -> ReplicationError {
    ReplicationError::Stream {
        code: "PSM_R2010",
        message,
        operator: false,
    }
}
