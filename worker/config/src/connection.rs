//! The replication source: where the primary is and how to reach it safely.

use std::fmt;
use std::time::Duration;

/// How the TLS connection to the primary is verified. There is no unverified TLS mode:
/// either the certificate chain and host name are checked, or TLS is off because the
/// operator said `disable` (or the connection is a Unix socket).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    /// Plain TCP. Only when the configuration says so explicitly.
    Disable,
    /// Verify the certificate chain against the CA, not the host name.
    VerifyCa,
    /// Verify the chain and that the certificate names the host (the default).
    VerifyFull,
}

impl SslMode {
    /// Parses the libpq spelling; the modes that encrypt without verifying are refused.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "disable" => Ok(Self::Disable),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            "allow" | "prefer" | "require" => Err(format!(
                "sslmode `{text}` encrypts without verifying the server; use `verify-full` \
                 (with `cacert` for a private CA), `verify-ca`, or `disable` on a trusted network"
            )),
            other => Err(format!(
                "unknown sslmode `{other}`; use `verify-full`, `verify-ca` or `disable`"
            )),
        }
    }
}

/// One PostgreSQL connection target, from `replication.connections[0]`.
#[derive(Clone, PartialEq, Eq, serde::Serialize)]
pub struct SourceConnection {
    /// Host name, IP address, or an absolute Unix-socket directory.
    pub host: String,
    /// TCP port (also names the socket file for Unix sockets).
    pub port: u16,
    /// Database on the primary.
    pub database: String,
    /// Role to connect as (needs REPLICATION and SELECT on the published tables).
    pub username: String,
    /// Password, if any. Never shown in status or logs.
    #[serde(skip)]
    pub password: Option<String>,
    /// TLS verification policy.
    pub sslmode: SslMode,
    /// PEM file (or inline PEM) of the CA that signs the primary's certificate.
    pub cacert: Option<String>,
    /// `slot_failover`: the slot is created with `failover = true` (PostgreSQL 17+), so a
    /// standby with `sync_replication_slots` keeps it through a promotion.
    #[serde(default)]
    pub slot_failover: bool,
    /// How long the network to the primary may fail silently on this connection.
    #[serde(skip)]
    pub bounds: SourceBounds,
}

/// How long a network to the primary that stops forwarding (no reset, no close: a NAT that
/// forgot the flow, a cable pulled between switches) goes unnoticed on a connection
/// (`docs/operations.md`, "A network that stops forwarding"). Not read from the
/// configuration file: these hold for any deployment; tests shorten them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceBounds {
    /// A connection idle this long sends its first TCP keepalive probe.
    pub keepalive_idle: Duration,
    /// Time between keepalive probes.
    pub keepalive_interval: Duration,
    /// Probes unanswered before the kernel drops the connection: an idle connection to a
    /// peer gone silently ends after `keepalive_idle + keepalive_count × keepalive_interval`.
    pub keepalive_count: u32,
    /// `TCP_USER_TIMEOUT`: data sent and not acknowledged for this long drops the connection
    /// (a query or a reply waiting on a network that stopped; keepalives cover only idle
    /// connections).
    pub user_timeout: Duration,
    /// The progress bound of a copy and of a question to the primary during one: nothing
    /// received for this long fails it (`PSM_R3003`), and it is started again as other
    /// network errors are. Also how long replication may hear nothing from the primary
    /// before `status()` shows the source stalled and the readiness probe fails.
    pub stall_after: Duration,
}

impl Default for SourceBounds {
    fn default() -> Self {
        Self {
            keepalive_idle: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(10),
            keepalive_count: 3,
            user_timeout: Duration::from_secs(60),
            stall_after: Duration::from_secs(120),
        }
    }
}

impl SourceConnection {
    /// True when the host is a Unix-socket directory rather than a TCP address.
    pub fn is_unix_socket(&self) -> bool {
        self.host.starts_with('/')
    }

    /// Parses a `postgres://` / `postgresql://` URI. Query parameters `sslmode`,
    /// `sslrootcert` and `host` (a socket directory) are honoured; others are refused so a
    /// setting the engine would not apply is never silently dropped.
    pub fn from_uri(uri: &str) -> Result<Self, String> {
        let parsed = url::Url::parse(uri).map_err(|e| format!("not a valid URI ({e})"))?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(format!(
                "scheme `{}` is not `postgresql://`",
                parsed.scheme()
            ));
        }
        // Names the part, never quotes it: the password must not reach a log or status().
        let decode = |part: &str, s: &str| {
            percent_decode(s).ok_or_else(|| format!("invalid percent-encoding in the {part}"))
        };
        let mut host = parsed
            .host_str()
            .map(|h| h.trim_matches(['[', ']']).to_owned());
        let mut sslmode = None;
        let mut cacert = None;
        let mut username = decode("user name", parsed.username())?;
        let mut password = parsed
            .password()
            .map(|p| decode("password", p))
            .transpose()?;
        let mut port = parsed.port();
        for (key, value) in parsed.query_pairs() {
            match key.as_ref() {
                "sslmode" => sslmode = Some(SslMode::parse(&value)?),
                "sslrootcert" => cacert = Some(value.into_owned()),
                "host" => host = Some(value.into_owned()),
                "user" => username = value.into_owned(),
                "password" => password = Some(value.into_owned()),
                "port" => port = Some(value.parse().map_err(|_| format!("bad port `{value}`"))?),
                other => {
                    return Err(format!(
                        "URI parameter `{other}` is not supported; supported: sslmode, \
                         sslrootcert, host, port, user, password"
                    ))
                }
            }
        }
        let host = host
            .filter(|h| !h.is_empty())
            .ok_or("the URI names no host")?;
        let database = decode("database name", parsed.path().trim_start_matches('/'))?;
        Self::build(host, port, database, username, password, sslmode, cacert)
    }

    /// Assembles a connection from separate fields, applying defaults (port 5432,
    /// `verify-full` for TCP, no TLS for Unix sockets).
    pub fn build(
        host: String,
        port: Option<u16>,
        database: String,
        username: String,
        password: Option<String>,
        sslmode: Option<SslMode>,
        cacert: Option<String>,
    ) -> Result<Self, String> {
        if database.is_empty() {
            return Err("no database name".to_owned());
        }
        if username.is_empty() {
            return Err("no user name".to_owned());
        }
        let unix = host.starts_with('/');
        let sslmode = match (sslmode, unix) {
            (Some(mode), _) => mode,
            (None, true) => SslMode::Disable,
            (None, false) => SslMode::VerifyFull,
        };
        Ok(Self {
            host,
            port: port.unwrap_or(5432),
            database,
            username,
            password,
            sslmode,
            cacert,
            slot_failover: false,
            bounds: SourceBounds::default(),
        })
    }
}

impl fmt::Debug for SourceConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SourceConnection")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database", &self.database)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("sslmode", &self.sslmode)
            .field("cacert", &self.cacert)
            .field("slot_failover", &self.slot_failover)
            .field("bounds", &self.bounds)
            .finish()
    }
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes.get(i) {
            Some(b'%') => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            Some(&b) => {
                out.push(b);
                i += 1;
            }
            None => break,
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_with_defaults_verifies_tls() {
        let c = SourceConnection::from_uri("postgresql://repl:p%40ss@db.example:6543/app").unwrap();
        assert_eq!(c.host, "db.example");
        assert_eq!(c.port, 6543);
        assert_eq!(c.database, "app");
        assert_eq!(c.username, "repl");
        assert_eq!(c.password.as_deref(), Some("p@ss"));
        assert_eq!(c.sslmode, SslMode::VerifyFull);
        assert!(!format!("{c:?}").contains("p@ss"));
    }

    #[test]
    fn uri_socket_host_defaults_to_plain() {
        let c = SourceConnection::from_uri("postgresql:///db?host=/run/postgresql&user=u").unwrap();
        assert!(c.is_unix_socket());
        assert_eq!(c.sslmode, SslMode::Disable);
    }

    #[test]
    fn unverified_tls_and_unknown_parameters_are_refused() {
        let err = SourceConnection::from_uri("postgresql://u@h/db?sslmode=require").unwrap_err();
        assert!(err.contains("verify-full"), "{err}");
        let err = SourceConnection::from_uri("postgresql://u@h/db?options=-c").unwrap_err();
        assert!(err.contains("`options`"), "{err}");
        let err = SourceConnection::from_uri("mysql://u@h/db").unwrap_err();
        assert!(err.contains("scheme"), "{err}");
        let err = SourceConnection::from_uri("postgresql://h/db").unwrap_err();
        assert!(err.contains("user"), "{err}");
        // A broken password is named, never quoted.
        let err = SourceConnection::from_uri("postgresql://u:s3cr%ZZet@h/db").unwrap_err();
        assert!(err.contains("password"), "{err}");
        assert!(!err.contains("s3cr"), "{err}");
    }
}
