//! The one error type of the sync-protocol domain.
//!
//! Request errors (`PSM_Y1xxx`) are the client's: the HTTP layer answers them with
//! [`SyncError::status`] before streaming starts. Errors during a session end the stream;
//! the client reconnects after its retry delay.

use rules::RulesError;
use store::StoreError;

/// Why a sync request or session cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The body is not JSON, or not a JSON object.
    #[error("PSM_Y1001 the sync request body is not a JSON object ({reason}); send the body the PowerSync SDK builds")]
    BadBody {
        /// The parser's complaint.
        reason: String,
    },
    /// A field has the wrong type or an invalid value.
    #[error("PSM_Y1002 sync request field `{field}` {problem}")]
    BadField {
        /// JSON path of the field (`buckets[3].after`).
        field: String,
        /// What is wrong and what is expected.
        problem: String,
    },
    /// The body is larger than the server accepts.
    #[error("PSM_Y1003 the sync request body has {bytes} bytes, more than the {max} accepted; send fewer bucket positions or parameters")]
    BodyTooLarge {
        /// Size received.
        bytes: usize,
        /// Limit.
        max: usize,
    },
    /// A list in the body is longer than the server accepts.
    #[error(
        "PSM_Y1004 sync request field `{field}` has {count} entries, more than the {max} accepted"
    )]
    TooMany {
        /// Which list.
        field: &'static str,
        /// Entries received.
        count: usize,
        /// Limit.
        max: usize,
    },
    /// A field a stream keeps for its whole life is larger than the server accepts.
    #[error(
        "PSM_Y1005 sync request field `{field}` has {bytes} bytes (as JSON text), more than the {max} accepted"
    )]
    FieldTooLarge {
        /// Which field.
        field: &'static str,
        /// Its size as JSON text (a string's own bytes for `client_id`).
        bytes: usize,
        /// Limit.
        max: usize,
    },
    /// The request's bucket set cannot be resolved (the official service's `PSYNC_S2305`
    /// "too many buckets" is one case).
    #[error("PSYNC_S2305 {0}")]
    Rules(RulesError),
    /// The store could not be read; the stream ends and the client retries.
    #[error("PSM_Y1201 the bucket store could not be read: {0}")]
    Store(#[from] StoreError),
}

impl SyncError {
    /// The stable code, for logs and the JSON error body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadBody { .. } => "PSM_Y1001",
            Self::BadField { .. } => "PSM_Y1002",
            Self::BodyTooLarge { .. } => "PSM_Y1003",
            Self::TooMany { .. } => "PSM_Y1004",
            Self::FieldTooLarge { .. } => "PSM_Y1005",
            Self::Rules(_) => "PSYNC_S2305",
            Self::Store(_) => "PSM_Y1201",
        }
    }

    /// The HTTP status when the error is answered before streaming: 400 for the client's
    /// mistakes (any non-401 makes the SDK retry later), 413 for an oversized body, 500 for
    /// the server's.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadBody { .. }
            | Self::BadField { .. }
            | Self::TooMany { .. }
            | Self::FieldTooLarge { .. } => 400,
            Self::Rules(_) => 400,
            Self::BodyTooLarge { .. } => 413,
            Self::Store(_) => 500,
        }
    }

    pub(crate) fn field(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self::BadField {
            field: field.into(),
            problem: problem.into(),
        }
    }
}
