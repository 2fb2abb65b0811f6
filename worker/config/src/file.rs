//! Reading and validating the YAML file into a [`ServiceConfig`].

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::Value;

use super::api::{self, ApiLimits, ApiTokens};
use super::connection::{SourceConnection, SslMode};
use super::env_tags;
use super::error::ConfigError;
use super::keys;

/// The port the official service listens on by default.
pub const DEFAULT_PORT: u16 = 8080;

/// Where the sync rules come from, and their text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RulesSource {
    /// The rules file, or `None` when they are inline (`content:`).
    pub path: Option<PathBuf>,
    /// The YAML text of the rules.
    #[serde(skip)]
    pub content: String,
}

/// `client_auth`: how client JWTs are verified.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ClientAuth {
    /// JWKS documents to fetch keys from.
    pub jwks_uri: Vec<String>,
    /// Inline JWKs (`jwks.keys`), kept as JSON objects for the auth stage to parse.
    #[serde(skip)]
    pub jwks_keys: Vec<serde_json::Value>,
    /// Accepted `aud` values; a token must carry one of them.
    pub audience: Vec<String>,
    /// Required `iss`, when configured.
    pub issuer: Option<String>,
    /// `jwks_allow_http`: fetch `http://` JWKS URIs of hosts other than loopback (off:
    /// keys fetched in clear can be replaced in transit).
    pub jwks_allow_http: bool,
    /// `supabase: true`: Supabase Auth's tokens are accepted as the official service
    /// accepts them (`Supabase`).
    pub supabase: Option<Supabase>,
    /// Addresses a JWKS URI may not resolve to (`jwks_reject_ip_ranges`, and `local` for
    /// `block_local_jwks`): CIDR ranges, or `local` for every address that is not public
    /// unicast.
    pub jwks_reject_ip_ranges: Vec<String>,
    /// `block_local_jwks`: IPv6 addresses are refused too.
    pub jwks_reject_ipv6: bool,
}

/// Supabase Auth, as `client_auth.supabase: true` configures it: its tokens carry
/// `aud: authenticated` (whatever `audience` says) and live up to a week.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Supabase {
    /// The project's JWKS (`https://<project>.supabase.co/auth/v1/.well-known/jwks.json`),
    /// derived from the connection's host `db.<project>.supabase.co`; `None` when the host
    /// is not a Supabase one.
    pub jwks_uri: Option<String>,
    /// `supabase_jwt_secret`: the project's legacy HS256 secret, as text.
    #[serde(skip)]
    pub jwt_secret: Option<String>,
}

/// The validated configuration the engine runs with.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ServiceConfig {
    /// The file this was read from.
    pub path: PathBuf,
    /// `replication.connections[0]`.
    pub source: SourceConnection,
    /// `sync_config` (or the older `sync_rules`).
    pub rules: RulesSource,
    /// `client_auth`.
    pub client_auth: ClientAuth,
    /// `port` for the sync protocol's HTTP server.
    pub port: u16,
    /// `telemetry.prometheus_port`: `GET /metrics` alone on this port too.
    pub prometheus_port: Option<u16>,
    /// `api.parameters`: the limits the file sets.
    pub api: ApiLimits,
    /// `api.tokens`: who may call the admin API (none: it is off).
    pub api_tokens: ApiTokens,
    /// Top-level keys present in the file that the engine does not use.
    pub ignored: Vec<String>,
}

#[derive(Deserialize)]
struct RawFile {
    replication: Option<RawReplication>,
    sync_config: Option<RawRules>,
    sync_rules: Option<RawRules>,
    client_auth: Option<RawClientAuth>,
    port: Option<Value>,
    api: Option<Value>,
    telemetry: Option<RawTelemetry>,
}

#[derive(Deserialize)]
struct RawTelemetry {
    prometheus_port: Option<Value>,
}

#[derive(Deserialize)]
struct RawReplication {
    #[serde(default)]
    connections: Vec<RawConnection>,
}

#[derive(Deserialize)]
struct RawConnection {
    #[serde(rename = "type")]
    kind: Option<String>,
    uri: Option<String>,
    #[serde(alias = "host")]
    hostname: Option<String>,
    port: Option<Value>,
    database: Option<String>,
    #[serde(alias = "user")]
    username: Option<String>,
    password: Option<String>,
    sslmode: Option<String>,
    cacert: Option<String>,
    slot_failover: Option<Value>,
}

#[derive(Deserialize)]
struct RawRules {
    path: Option<String>,
    content: Option<String>,
}

#[derive(Deserialize)]
struct RawClientAuth {
    jwks_uri: Option<OneOrMany>,
    jwks: Option<RawJwks>,
    audience: Option<OneOrMany>,
    issuer: Option<String>,
    #[serde(default)]
    jwks_allow_http: bool,
    #[serde(default)]
    supabase: bool,
    supabase_jwt_secret: Option<String>,
    #[serde(default)]
    block_local_jwks: bool,
    #[serde(default)]
    jwks_reject_ip_ranges: Vec<String>,
}

#[derive(Deserialize)]
struct RawJwks {
    #[serde(default)]
    keys: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(one) => vec![one],
            Self::Many(many) => many,
        }
    }
}

impl ServiceConfig {
    /// Reads and validates the file at `path`, resolving `!env` tags from the process
    /// environment and a relative rules `path` against the file's directory.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Unreadable {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text, &|name| std::env::var(name).ok())
    }

    /// Validates `text` as if read from `path`; `env` resolves `!env` tags.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let syntax = |message: String| ConfigError::Syntax {
            path: path.to_owned(),
            message,
        };
        let mut value: Value = serde_norway::from_str(text).map_err(|e| syntax(e.to_string()))?;
        if value.is_null() {
            return Err(syntax("the file is empty".to_owned()));
        }
        env_tags::resolve(&mut value, env).map_err(|name| ConfigError::MissingEnv {
            path: path.to_owned(),
            name,
        })?;
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        let Value::Mapping(top) = &value else {
            return Err(syntax(
                "the file must be a mapping of keys (replication, sync_config, client_auth, ...)"
                    .to_owned(),
            ));
        };
        let ignored = keys::not_used(top).map_err(|(key, why)| invalid(&key, why.to_owned()))?;
        let raw: RawFile = serde_norway::from_value(value).map_err(|e| syntax(e.to_string()))?;

        let source = source_connection(path, raw.replication)?;
        let rules = rules_source(path, raw.sync_config.or(raw.sync_rules))?;
        let mut ignored = ignored;
        let client_auth = match raw.client_auth {
            None => ClientAuth::default(),
            Some(section) => client_auth(section, &source.host, env, &mut ignored)
                .map_err(|(key, m)| invalid(&key, m))?,
        };
        let port = match raw.port {
            None => DEFAULT_PORT,
            Some(v) => parse_port(&v).map_err(|m| invalid("port", m))?,
        };
        let prometheus_port = raw
            .telemetry
            .and_then(|t| t.prometheus_port)
            .filter(|v| !v.is_null())
            .map(|v| parse_port(&v))
            .transpose()
            .map_err(|m| invalid("telemetry.prometheus_port", m))?;
        if prometheus_port == Some(port) {
            return Err(invalid(
                "telemetry.prometheus_port",
                format!("is the sync port ({port}), which serves /metrics already; give another port or leave it out"),
            ));
        }
        let (api, api_tokens) = match &raw.api {
            None => (ApiLimits::default(), ApiTokens::default()),
            Some(section) => (
                api::parse(section).map_err(|(key, m)| invalid(&key, m))?,
                api::parse_tokens(section).map_err(|(key, m)| invalid(&key, m))?,
            ),
        };
        Ok(Self {
            path: path.to_owned(),
            source,
            rules,
            client_auth,
            port,
            prometheus_port,
            api,
            api_tokens,
            ignored,
        })
    }
}

fn source_connection(
    path: &Path,
    replication: Option<RawReplication>,
) -> Result<SourceConnection, ConfigError> {
    let raw = only_connection(path, replication)?;
    let invalid = |key: &str, message: String| connection_invalid(path, key, message);
    if let Some(kind) = raw.kind.as_deref().filter(|k| *k != "postgresql") {
        return Err(invalid(
            "type",
            format!("`{kind}` is not supported; use `postgresql`"),
        ));
    }
    let sslmode = raw
        .sslmode
        .as_deref()
        .map(SslMode::parse)
        .transpose()
        .map_err(|m| invalid("sslmode", m))?;
    let port = raw
        .port
        .as_ref()
        .map(parse_port)
        .transpose()
        .map_err(|m| invalid("port", m))?;
    let mut conn = if let Some(uri) = raw.uri {
        if raw.hostname.is_some() || raw.database.is_some() || raw.username.is_some() {
            return Err(invalid(
                "uri",
                "give either `uri` or hostname/port/database/username/password, not both".into(),
            ));
        }
        let mut conn = SourceConnection::from_uri(&uri).map_err(|m| invalid("uri", m))?;
        if let Some(mode) = sslmode {
            conn.sslmode = mode;
        }
        if let Some(port) = port {
            conn.port = port;
        }
        conn
    } else {
        let host = raw.hostname.ok_or_else(|| ConfigError::Missing {
            path: path.to_owned(),
            key: "replication.connections[0].uri",
            hint: "give `uri`, or `hostname`, `database` and `username`",
        })?;
        SourceConnection::build(
            host,
            port,
            raw.database.unwrap_or_default(),
            raw.username.unwrap_or_default(),
            raw.password,
            sslmode,
            None,
        )
        .map_err(|m| invalid("", m))?
    };
    if raw.cacert.is_some() {
        conn.cacert = raw.cacert;
    }
    conn.slot_failover = match raw.slot_failover {
        None => false,
        Some(Value::Bool(on)) => on,
        Some(other) => {
            return Err(invalid(
                "slot_failover",
                format!("is {other:?}; give true or false"),
            ))
        }
    };
    if conn.sslmode == SslMode::Disable && conn.cacert.is_some() {
        return Err(invalid("cacert", "is set but sslmode is `disable`".into()));
    }
    Ok(conn)
}

/// `replication.connections[0].<key>` is invalid.
fn connection_invalid(path: &Path, key: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        path: path.to_owned(),
        key: format!("replication.connections[0].{key}"),
        message,
    }
}

/// What to add when the file has no `replication` section.
const NO_REPLICATION_HINT: &str =
    "add the primary, e.g. `replication: {connections: [{type: postgresql, \
     uri: \"postgresql://user:pass@host:5432/db\"}]}`";

/// The one source connection `replication` lists (none or several is an error).
fn only_connection(
    path: &Path,
    replication: Option<RawReplication>,
) -> Result<RawConnection, ConfigError> {
    let missing = ConfigError::Missing {
        path: path.to_owned(),
        key: "replication.connections[0]",
        hint: NO_REPLICATION_HINT,
    };
    let mut connections = replication.ok_or(missing)?.connections.into_iter();
    let Some(raw) = connections.next() else {
        return Err(ConfigError::Missing {
            path: path.to_owned(),
            key: "replication.connections[0]",
            hint: "the list is empty; add the primary's connection",
        });
    };
    if connections.next().is_some() {
        return Err(connection_invalid(
            path,
            "",
            "only one source connection is supported; run one sync replica per source".into(),
        ));
    }
    Ok(raw)
}

fn rules_source(path: &Path, raw: Option<RawRules>) -> Result<RulesSource, ConfigError> {
    let missing = |hint| ConfigError::Missing {
        path: path.to_owned(),
        key: "sync_config",
        hint,
    };
    let raw = raw.ok_or_else(|| {
        missing("add `sync_config: {path: sync-config.yaml}` or inline `content:`")
    })?;
    match (raw.path, raw.content) {
        (Some(_), Some(_)) => Err(ConfigError::Invalid {
            path: path.to_owned(),
            key: "sync_config".into(),
            message: "give either `path` or `content`, not both".into(),
        }),
        (None, Some(content)) => Ok(RulesSource {
            path: None,
            content,
        }),
        (Some(rules_path), None) => {
            let base = path.parent().unwrap_or(Path::new("."));
            let full = base.join(rules_path);
            let content =
                std::fs::read_to_string(&full).map_err(|source| ConfigError::Unreadable {
                    path: full.clone(),
                    source,
                })?;
            Ok(RulesSource {
                path: Some(full),
                content,
            })
        }
        (None, None) => Err(missing("it has neither `path` nor `content`")),
    }
}

/// `client_auth`, with the Supabase project's JWKS derived from `source_host` (or taken
/// from `env`'s [`SUPABASE_JWKS_OVERRIDE_ENV`]). A `supabase_jwt_secret` without
/// `supabase: true` has no effect, as in the official service: it is added to `ignored`.
fn client_auth(
    raw: RawClientAuth,
    source_host: &str,
    env: &dyn Fn(&str) -> Option<String>,
    ignored: &mut Vec<String>,
) -> Result<ClientAuth, (String, String)> {
    for range in &raw.jwks_reject_ip_ranges {
        if range != "local" && range.parse::<ipnet::IpNet>().is_err() {
            return Err((
                "client_auth.jwks_reject_ip_ranges".to_owned(),
                format!(
                    "`{range}` is neither a CIDR range (10.0.0.0/8, fd00::/8) nor `local` \
                     (every address that is not public unicast)"
                ),
            ));
        }
    }
    let mut reject = raw.jwks_reject_ip_ranges;
    if raw.block_local_jwks && !reject.iter().any(|r| r == "local") {
        reject.push("local".to_owned());
    }
    let supabase = raw.supabase.then(|| Supabase {
        jwks_uri: env(SUPABASE_JWKS_OVERRIDE_ENV).or_else(|| supabase_jwks_uri(source_host)),
        jwt_secret: raw.supabase_jwt_secret.clone(),
    });
    if !raw.supabase && raw.supabase_jwt_secret.is_some() {
        ignored.push("client_auth.supabase_jwt_secret (used only with supabase: true)".to_owned());
        ignored.sort();
    }
    Ok(ClientAuth {
        jwks_uri: raw.jwks_uri.map(OneOrMany::into_vec).unwrap_or_default(),
        jwks_keys: raw.jwks.map(|j| j.keys).unwrap_or_default(),
        audience: raw.audience.map(OneOrMany::into_vec).unwrap_or_default(),
        issuer: raw.issuer,
        jwks_allow_http: raw.jwks_allow_http,
        supabase,
        jwks_reject_ip_ranges: reject,
        jwks_reject_ipv6: raw.block_local_jwks,
    })
}

/// For tests only: the JWKS URL used for `client_auth.supabase: true` instead of the one
/// derived from the connection's host (a local server stands in for Supabase). Read from
/// the server's environment; `docs/migrating.md` documents it as such.
pub const SUPABASE_JWKS_OVERRIDE_ENV: &str = "PSM_TEST_SUPABASE_JWKS_URI";

/// Supabase Auth's JWKS for a connection to `db.<project>.supabase.co`, as the official
/// service derives it.
fn supabase_jwks_uri(host: &str) -> Option<String> {
    let project = host.strip_prefix("db.")?.strip_suffix(".supabase.co")?;
    let word = !project.is_empty()
        && project
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    word.then(|| format!("https://{project}.supabase.co/auth/v1/.well-known/jwks.json"))
}

fn parse_port(value: &Value) -> Result<u16, String> {
    let number = match value {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    number
        .and_then(|n| u16::try_from(n).ok())
        .filter(|n| *n != 0)
        .ok_or_else(|| format!("`{}` is not a TCP port (1-65535)", show(value)))
}

fn show(value: &Value) -> String {
    serde_norway::to_string(value).map_or_else(|_| "?".into(), |s| s.trim().to_owned())
}

#[cfg(test)]
mod tests;
