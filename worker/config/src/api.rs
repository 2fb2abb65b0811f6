//! `api.parameters`: the official service's limits for sync connections, honoured when set,
//! and this engine's own `max_concurrent_connections_per_user`, which the official schema
//! does not have.

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
