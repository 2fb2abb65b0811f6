//! Errors talking to the primary. The kind decides: retry with backoff (the network, a
//! restarting primary) or wait for the operator (a setting, a grant, a certificate).

/// Why the source cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The primary is not set up the way replication needs; the message names the fix.
    #[error("{code} {message}")]
    Setup {
        /// Stable code (`PSM_R1xxx`).
        code: &'static str,
        /// What is wrong and what to run or change.
        message: String,
    },
    /// TLS cannot be set up or the server's certificate fails verification.
    #[error(
        "PSM_R2001 TLS to the primary: {0}; check sslmode, cacert and the server's \
             certificate (a verification failure is not retried)"
    )]
    Tls(String),
    /// The primary could not be reached or the connection broke; retried with backoff.
    #[error("PSM_R3001 connection to the primary failed: {0}")]
    Connection(String),
    /// Nothing arrived from the primary within the progress bound where something should
    /// have (a copy's next rows, the answer to a question during one): the network to it
    /// may have stopped forwarding without closing anything; retried with backoff on new
    /// connections.
    #[error(
        "PSM_R3003 the primary sent nothing for {seconds} s during {what}: the network to it \
         may have stopped forwarding (nothing was closed); retrying on new connections"
    )]
    Stalled {
        /// What was waited for.
        what: String,
        /// The bound, in seconds.
        seconds: u64,
    },
    /// The primary answered a query with an error.
    #[error("PSM_R3002 query on the primary failed ({context}): {source}")]
    Query {
        /// What was being asked.
        context: &'static str,
        /// The server's error.
        source: tokio_postgres::Error,
    },
}

impl SourceError {
    pub(crate) fn setup(code: &'static str, message: impl Into<String>) -> Self {
        Self::Setup {
            code,
            message: message.into(),
        }
    }

    /// A failed query, named by `context` (for `map_err`).
    pub fn query(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Self {
        move |source| Self::Query { context, source }
    }

    /// `what` did not finish within `bound` ([`Self::Stalled`]).
    pub fn stalled(what: impl Into<String>, bound: std::time::Duration) -> Self {
        Self::Stalled {
            what: what.into(),
            seconds: bound.as_secs(),
        }
    }

    /// True when only the operator can fix it; false when retrying may help.
    pub fn needs_operator(&self) -> bool {
        match self {
            Self::Setup { .. } | Self::Tls(_) => true,
            Self::Connection(_) | Self::Stalled { .. } => false,
            // Permission and undefined-object errors are set-up problems; others may pass.
            Self::Query { source, .. } => source.code().is_some_and(|code| {
                let class = &code.code()[..2];
                matches!(class, "28" | "42")
            }),
        }
    }
}
