//! `api.parameters`: the official service's limits for sync connections, honoured when set,
//! and this engine's own `max_concurrent_connections_per_user`, which the official schema
//! does not have; `api.tokens`: who may call the admin API.

use serde_norway::Value;

/// The limits `api.parameters` sets; `None` where the file leaves the engine's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ApiLimits {
    /// `max_concurrent_connections`: sync streams open at once (over it: 429).
    pub max_concurrent_connections: Option<usize>,
    /// `max_buckets_per_connection`: buckets one stream may resolve to (over it:
    /// `PSYNC_S2305`).
    pub max_buckets_per_connection: Option<usize>,
    /// `max_parameter_query_results`: rows the parameter queries of one request may return
    /// (over it: `PSYNC_S2305`).
    pub max_parameter_query_results: Option<usize>,
    /// `max_concurrent_connections_per_user` (this engine's own): sync streams one user
    /// (token `sub`) may hold at once (over it: 429 `PSM_H1430`).
    pub max_concurrent_connections_per_user: Option<usize>,
}

/// The keys of `api.parameters` this engine honours.
const HONOURED: &[&str] = &[
    "max_concurrent_connections",
    "max_buckets_per_connection",
    "max_parameter_query_results",
    "max_concurrent_connections_per_user",
];

/// Reads the honoured limits of the `api` section (`keys` lists the others). An honoured
/// key with a value that is not a positive integer is an error naming the key.
pub(crate) fn parse(api: &Value) -> Result<ApiLimits, (String, String)> {
    let mut limits = ApiLimits::default();
    let Some(Value::Mapping(parameters)) = api.get("parameters") else {
        return Ok(limits);
    };
    for (name, value) in parameters {
        let name = super::keys::key_text(name);
        if !HONOURED.contains(&name.as_str()) {
            continue;
        }
        let path = format!("api.parameters.{name}");
        let limit = positive(value).map_err(|message| (path.clone(), message))?;
        let field = match name.as_str() {
            "max_concurrent_connections" => &mut limits.max_concurrent_connections,
            "max_buckets_per_connection" => &mut limits.max_buckets_per_connection,
            "max_concurrent_connections_per_user" => {
                &mut limits.max_concurrent_connections_per_user
            }
            _ => &mut limits.max_parameter_query_results,
        };
        *field = Some(limit);
    }
    Ok(limits)
}

/// `api.tokens`: the bearer tokens the admin API accepts (`/api/admin/v1/*`,
/// `/api/sync-rules/v1/*`). Empty: the admin API is off, as in the official service. The
/// tokens never show in `Debug` or serialized output.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiTokens(Vec<String>);

impl ApiTokens {
    /// Tokens given in code (tests, tools).
    pub fn new(tokens: Vec<String>) -> Self {
        Self(tokens)
    }

    /// The tokens, to compare a request's against.
    pub fn expose(&self) -> &[String] {
        &self.0
    }

    /// No token configured: the admin API is off.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiTokens({} configured)", self.0.len())
    }
}

impl serde::Serialize for ApiTokens {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.0.len() as u64)
    }
}

/// Reads `api.tokens`: a list of non-empty strings (`!env` tags resolve to strings). A
/// token with whitespace could never be sent in an `Authorization` header: refused.
pub(crate) fn parse_tokens(api: &Value) -> Result<ApiTokens, (String, String)> {
    let tokens = match api.get("tokens") {
        None | Some(Value::Null) => return Ok(ApiTokens::default()),
        Some(Value::Sequence(items)) => items,
        Some(_) => {
            return Err((
                "api.tokens".to_owned(),
                "must be a list of strings".to_owned(),
            ))
        }
    };
    let mut out = Vec::with_capacity(tokens.len());
    for (i, token) in tokens.iter().enumerate() {
        let path = format!("api.tokens[{i}]");
        let text = match token {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => return Err((path, "must be a string".to_owned())),
        };
        if text.is_empty() || text.chars().any(char::is_whitespace) {
            return Err((
                path,
                "must be a non-empty string without whitespace (it is sent as `Authorization: Bearer <token>`)".to_owned(),
            ));
        }
        out.push(text);
    }
    Ok(ApiTokens(out))
}

/// A positive integer, written as a number or as digits in a string (`!env` tags resolve
/// to strings).
fn positive(value: &Value) -> Result<usize, String> {
    let parsed = match value {
        Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
        Value::String(s) => s.trim().parse::<usize>().ok(),
        _ => None,
    };
    match parsed {
        Some(n) if n > 0 => Ok(n),
        _ => Err("must be a positive integer".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(yaml: &str) -> Result<ApiLimits, (String, String)> {
        parse(&serde_norway::from_str(yaml).unwrap())
    }

    #[test]
    fn honoured_limits_are_read() {
        let limits = api(
            "parameters:\n  max_concurrent_connections: 500\n  max_buckets_per_connection: '20'\n  max_parameter_query_results: 7\n  max_concurrent_connections_per_user: 3\n  max_data_fetch_concurrency: 10\ntokens: [x]\n",
        )
        .unwrap();
        assert_eq!(limits.max_concurrent_connections, Some(500));
        assert_eq!(limits.max_buckets_per_connection, Some(20));
        assert_eq!(limits.max_parameter_query_results, Some(7));
        assert_eq!(limits.max_concurrent_connections_per_user, Some(3));
    }

    #[test]
    fn tokens_are_read_and_never_shown() {
        let section = serde_norway::from_str("tokens: [alpha, '1234']\n").unwrap();
        let tokens = parse_tokens(&section).unwrap();
        assert_eq!(tokens.expose(), ["alpha", "1234"]);
        assert_eq!(format!("{tokens:?}"), "ApiTokens(2 configured)");
        assert_eq!(serde_json::to_string(&tokens).unwrap(), "2");
        let none = parse_tokens(&serde_norway::from_str("parameters: {}\n").unwrap()).unwrap();
        assert!(none.is_empty());
        let spaced = parse_tokens(&serde_norway::from_str("tokens: ['a b']\n").unwrap());
        assert_eq!(spaced.unwrap_err().0, "api.tokens[0]");
        let scalar = parse_tokens(&serde_norway::from_str("tokens: abc\n").unwrap());
        assert_eq!(scalar.unwrap_err().0, "api.tokens");
    }

    #[test]
    fn a_limit_that_is_not_a_positive_integer_names_its_key() {
        for bad in ["0", "-3", "many", "1.5"] {
            let (key, message) = api(&format!(
                "parameters:\n  max_concurrent_connections: {bad}\n"
            ))
            .unwrap_err();
            assert_eq!(key, "api.parameters.max_concurrent_connections");
            assert!(message.contains("positive integer"), "{message}");
        }
    }
}
