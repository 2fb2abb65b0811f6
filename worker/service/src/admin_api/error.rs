//! The admin API's one error type: each failure with the official service's code where it
//! has one, the HTTP status, and what to do.

/// A refused or failed admin request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code} {description}")]
pub struct AdminError {
    /// HTTP status.
    pub status: u16,
    /// Stable code (the official one where the official service has the same failure).
    pub code: &'static str,
    /// Short error class name.
    pub name: &'static str,
    /// What happened and what to do.
    pub description: String,
}

impl AdminError {
    /// `api.tokens` is empty: the admin API is off (the official service's
    /// "Authentication disabled").
    pub fn disabled() -> Self {
        Self {
            status: 401,
            code: "PSYNC_S2101",
            name: "AuthorizationError",
            description: "Authentication disabled: the admin API is off because the \
                          configuration sets no api.tokens; add a token under api.tokens and \
                          reload (SELECT pg_reload_conf())"
                .to_owned(),
        }
    }

    /// No `Authorization: Bearer <token>` (or `Token <token>`) header.
    pub fn no_token() -> Self {
        Self {
            status: 401,
            code: "PSYNC_S2101",
            name: "AuthorizationError",
            description: "Authentication required: send Authorization: Bearer <one of \
                          api.tokens>"
                .to_owned(),
        }
    }

    /// A token that is not one of `api.tokens`.
    pub fn wrong_token() -> Self {
        Self {
            status: 401,
            code: "PSYNC_S2101",
            name: "AuthorizationError",
            description: "Authentication failed: the token is not one of api.tokens".to_owned(),
        }
    }

    /// A request body that is not the JSON the route takes.
    pub fn bad_request(description: String) -> Self {
        Self {
            status: 400,
            code: "PSM_H1400",
            name: "ValidationError",
            description,
        }
    }

    /// A deploy or re-copy is in progress (`PSYNC_S4106`).
    pub fn busy() -> Self {
        Self {
            status: 409,
            code: "PSYNC_S4106",
            name: "ServiceError",
            description: "Busy processing sync config - cannot reprocess: a deploy or re-copy \
                          is in progress (status().deploy shows it); try again when it has \
                          switched"
                .to_owned(),
        }
    }

    /// No sync config is served yet (`PSYNC_S4104`).
    pub fn no_active_config() -> Self {
        Self {
            status: 422,
            code: "PSYNC_S4104",
            name: "ServiceError",
            description: "No active sync config: the replica has not finished its first \
                          snapshot; status() shows its progress"
                .to_owned(),
        }
    }

    /// Deploying through the API (`PSYNC_S4105`): this replica deploys from its file.
    pub fn deploy_from_file() -> Self {
        Self {
            status: 422,
            code: "PSYNC_S4105",
            name: "ServiceError",
            description: "Sync config API disabled: this replica's sync config comes from its \
                          configuration file (sync_config); edit it there and reload \
                          (SELECT powersync_mdbx.reload())"
                .to_owned(),
        }
    }

    /// The engine did not answer (it is stopping, or busy beyond the bound).
    pub fn unavailable(description: String) -> Self {
        Self {
            status: 503,
            code: "PSM_H1503",
            name: "ServiceUnavailable",
            description,
        }
    }
}
