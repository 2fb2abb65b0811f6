//! Why a request is not authenticated, or why keys cannot be loaded.
//!
//! Token problems answer 401: the client drops its token and fetches a new one. Key-source
//! problems are the operator's: a bad inline key is a configuration error (500), an unreachable
//! JWKS with nothing cached is 503 so clients retry later instead of discarding good tokens.
//! Messages never echo token contents beyond a short algorithm or key id.

/// An authentication failure. `Display` is the description sent to the client; `code()` is
/// the stable code (the official service's `PSYNC_S21xx`/`S22xx` where one exists).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header, or an empty one.
    #[error("no token: send the header `Authorization: Token <jwt>`")]
    MissingToken,
    /// The header is not `Token <jwt>` or `Bearer <jwt>`.
    #[error(
        "the Authorization header must be `Token <jwt>` or `Bearer <jwt>` (one space, \
         no whitespace inside the token)"
    )]
    MalformedHeader,
    /// The token is not a compact JWS with JSON header and payload.
    #[error("the token is not a valid JWT: {reason}")]
    Malformed {
        /// Which part failed.
        reason: &'static str,
    },
    /// `alg` names an algorithm this server refuses (including `none`).
    #[error(
        "token algorithm `{alg}` is not accepted; sign tokens with HS256, HS384, HS512, \
         RS256, RS384, RS512, ES256, ES384 or EdDSA"
    )]
    UnsupportedAlgorithm {
        /// The header's `alg`, shortened.
        alg: String,
    },
    /// The key named by `kid` is for another algorithm.
    #[error("Unexpected token algorithm {alg}: the key with kid `{kid}` does not accept it")]
    UnexpectedAlgorithm {
        /// The token's `kid`, shortened.
        kid: String,
        /// The token's `alg`.
        alg: &'static str,
    },
    /// No configured key has the token's `kid`, and no key without a `kid` accepts its `alg`.
    #[error(
        "Could not find an appropriate key in the keystore: no key has kid {kid} and no key \
         without a kid accepts {alg}; sign the token with a key listed in client_auth"
    )]
    NoSuitableKey {
        /// The token's `kid` (quoted), or `(none)`.
        kid: String,
        /// The token's `alg`.
        alg: &'static str,
    },
    /// A matching key exists but the signature does not verify with it.
    #[error("the token signature does not verify with {keys}")]
    BadSignature {
        /// Which keys were tried.
        keys: String,
    },
    /// `exp` is in the past, beyond the clock tolerance.
    #[error("the token expired at {exp} (Unix seconds); fetch a new token")]
    Expired {
        /// The token's `exp`.
        exp: i64,
    },
    /// `nbf` is in the future, beyond the clock tolerance.
    #[error("the token is not valid before {nbf} (Unix seconds); check the issuer's clock")]
    NotYetValid {
        /// The token's `nbf`.
        nbf: i64,
    },
    /// A required claim is absent.
    #[error("the token has no `{claim}` claim; tokens need `sub`, `iat`, `exp` and `aud`")]
    MissingClaim {
        /// The claim's name.
        claim: &'static str,
    },
    /// A claim has the wrong type or an impossible value.
    #[error("the token's `{claim}` claim {problem}")]
    InvalidClaim {
        /// The claim's name.
        claim: &'static str,
        /// What is wrong.
        problem: &'static str,
    },
    /// `exp - iat` exceeds the allowed lifetime.
    #[error(
        "Token must expire in a maximum of {max} seconds, this one lives {lifetime} s \
         (exp - iat); issue shorter-lived tokens"
    )]
    LifetimeTooLong {
        /// `exp - iat`, whole seconds.
        lifetime: i64,
        /// The allowed maximum, seconds.
        max: u64,
    },
    /// `client_auth.audience` is empty, so no token can be accepted.
    #[error(
        "no audience is configured, so every token is refused: set client_auth.audience to \
         the `aud` value your tokens carry (usually this service's URL)"
    )]
    AudienceNotConfigured,
    /// The token has no `aud`.
    #[error("the token has no `aud` claim; it must name one of client_auth.audience")]
    MissingAudience,
    /// No `aud` value is an accepted audience.
    #[error(
        "Unexpected \"aud\" claim value: none of the token's audiences is in client_auth.audience"
    )]
    AudienceMismatch,
    /// `iss` is missing or differs from `client_auth.issuer`.
    #[error("the token's `iss` claim is missing or is not client_auth.issuer")]
    IssuerMismatch,
    /// `parameters` is present but not a JSON object.
    #[error("the token's `parameters` claim must be a JSON object")]
    InvalidParameters,
    /// An inline key in `client_auth.jwks.keys` cannot be used.
    #[error("client_auth.jwks.keys[{index}] cannot be used: {reason}; fix or remove that key")]
    InvalidKey {
        /// Position in the list.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// A `client_auth.jwks_uri` entry is not a usable URL.
    #[error("client_auth.jwks_uri `{uri}`: {reason}")]
    InvalidJwksUri {
        /// The configured value.
        uri: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
    /// A JWKS could not be fetched and no keys from it are cached.
    #[error(
        "JWKS request failed: cannot load keys from {uri}: {reason}; check that the URI is \
         reachable from the database server and answers {{\"keys\": [...]}}"
    )]
    KeysUnavailable {
        /// The JWKS URI.
        uri: String,
        /// Why the last fetch failed.
        reason: String,
    },
}

impl AuthError {
    /// Every code [`code`](Self::code) returns (the labels of the auth-failure metric).
    pub const CODES: &'static [&'static str] = &[
        "PSYNC_S2101",
        "PSYNC_S2102",
        "PSYNC_S2103",
        "PSYNC_S2104",
        "PSYNC_S2105",
        "PSYNC_S2106",
        "PSYNC_S2201",
        "PSYNC_S2204",
    ];

    /// The stable code; `PSYNC_S2101`–`S2106` for token problems as in the official service.
    pub fn code(&self) -> &'static str {
        match self {
            Self::MissingToken | Self::MalformedHeader => "PSYNC_S2106",
            Self::Malformed { .. }
            | Self::UnsupportedAlgorithm { .. }
            | Self::UnexpectedAlgorithm { .. }
            | Self::NoSuitableKey { .. }
            | Self::NotYetValid { .. }
            | Self::MissingClaim { .. }
            | Self::InvalidClaim { .. }
            | Self::IssuerMismatch
            | Self::InvalidParameters => "PSYNC_S2101",
            Self::BadSignature { .. } => "PSYNC_S2102",
            Self::Expired { .. } => "PSYNC_S2103",
            Self::LifetimeTooLong { .. } => "PSYNC_S2104",
            Self::AudienceNotConfigured | Self::MissingAudience | Self::AudienceMismatch => {
                "PSYNC_S2105"
            }
            Self::InvalidKey { .. } | Self::InvalidJwksUri { .. } => "PSYNC_S2201",
            Self::KeysUnavailable { .. } => "PSYNC_S2204",
        }
    }

    /// 401 for anything about the token; 503 when keys cannot be fetched at all (retry
    /// later, keep the token); 500 for configuration errors.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::KeysUnavailable { .. } => 503,
            Self::InvalidKey { .. } | Self::InvalidJwksUri { .. } => 500,
            _ => 401,
        }
    }

    /// The error class name for the JSON answer.
    pub fn name(&self) -> &'static str {
        match self.http_status() {
            401 => "AuthorizationError",
            _ => "ServiceError",
        }
    }
}

/// At most `max` characters of attacker-controlled text, for messages and logs.
pub(crate) fn shorten(text: &str, max: usize) -> String {
    let mut out: String = text.chars().take(max).collect();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_errors_are_401_and_key_outages_503() {
        assert_eq!(AuthError::MissingToken.http_status(), 401);
        assert_eq!(AuthError::MissingToken.code(), "PSYNC_S2106");
        assert_eq!(AuthError::Expired { exp: 1 }.code(), "PSYNC_S2103");
        let outage = AuthError::KeysUnavailable {
            uri: "http://x".into(),
            reason: "refused".into(),
        };
        assert_eq!(outage.http_status(), 503);
        assert!(outage.to_string().contains("http://x"));
        assert!(AuthError::CODES.contains(&outage.code()));
        assert_eq!(outage.code(), "PSYNC_S2204");
    }

    #[test]
    fn every_code_is_listed() {
        let all = [
            AuthError::MissingToken,
            AuthError::MalformedHeader,
            AuthError::Malformed { reason: "x" },
            AuthError::UnsupportedAlgorithm { alg: "x".into() },
            AuthError::UnexpectedAlgorithm {
                kid: "k".into(),
                alg: "x",
            },
            AuthError::NoSuitableKey {
                kid: "k".into(),
                alg: "x",
            },
            AuthError::BadSignature { keys: "k".into() },
            AuthError::Expired { exp: 1 },
            AuthError::NotYetValid { nbf: 1 },
            AuthError::MissingClaim { claim: "sub" },
            AuthError::InvalidClaim {
                claim: "sub",
                problem: "x",
            },
            AuthError::LifetimeTooLong {
                lifetime: 1,
                max: 1,
            },
            AuthError::AudienceNotConfigured,
            AuthError::MissingAudience,
            AuthError::AudienceMismatch,
            AuthError::IssuerMismatch,
            AuthError::InvalidParameters,
            AuthError::InvalidKey {
                index: 0,
                reason: "x".into(),
            },
            AuthError::InvalidJwksUri {
                uri: "x".into(),
                reason: "x".into(),
            },
            AuthError::KeysUnavailable {
                uri: "x".into(),
                reason: "x".into(),
            },
        ];
        for error in all {
            assert!(AuthError::CODES.contains(&error.code()), "{error:?}");
        }
    }

    #[test]
    fn shorten_cuts_on_characters() {
        assert_eq!(shorten("abc", 5), "abc");
        assert_eq!(shorten("ééééé", 2), "éé…");
    }
}
