//! Ordinary SQL connections to the primary, and the replication connection string.

use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::{Client, NoTls};

use super::{tls, SourceError};
use config::{SourceConnection, SslMode};

const APPLICATION_NAME: &str = "powersync_mdbx";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The settings of an ordinary connection to `conn`, TLS aside: TCP keepalives and
/// `TCP_USER_TIMEOUT` as `conn.bounds` says, so a primary that vanished without closing
/// the connection (a network that stops forwarding) is noticed in about a minute instead
/// of the OS's 2 h + 9 × 75 s (or its idle time as set here + 9 × 75 s).
fn pg_config(conn: &SourceConnection) -> tokio_postgres::Config {
    let bounds = &conn.bounds;
    let mut config = tokio_postgres::Config::new();
    config
        .host(&conn.host)
        .port(conn.port)
        .user(&conn.username)
        .dbname(&conn.database)
        .application_name(APPLICATION_NAME)
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(bounds.keepalive_idle)
        .keepalives_interval(bounds.keepalive_interval)
        .keepalives_retries(bounds.keepalive_count)
        .tcp_user_timeout(bounds.user_timeout);
    if let Some(password) = &conn.password {
        config.password(password);
    }
    config
}

/// Opens an ordinary connection; its driver task runs on the current tokio runtime.
pub async fn connect(conn: &SourceConnection) -> Result<Client, SourceError> {
    let mut config = pg_config(conn);
    match tls::client_config(conn)? {
        None => {
            config.ssl_mode(PgSslMode::Disable);
            let (client, connection) = bounded(config.connect(NoTls)).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "primary connection closed");
                }
            });
            Ok(client)
        }
        Some(tls_config) => {
            config.ssl_mode(PgSslMode::Require);
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config);
            let (client, connection) = bounded(config.connect(tls)).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "primary connection closed");
                }
            });
            Ok(client)
        }
    }
}

/// A connection attempt, TLS and startup included, bounded by [`CONNECT_TIMEOUT`]
/// (tokio-postgres bounds only the TCP connect: a server that accepts and then says
/// nothing would hold the attempt forever).
async fn bounded<T>(
    attempt: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
) -> Result<T, SourceError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(result) => result.map_err(connect_error),
        Err(_) => Err(SourceError::Connection(format!(
            "the primary did not complete the connection within {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

fn connect_error(e: tokio_postgres::Error) -> SourceError {
    let text = e.to_string();
    let chain = std::iter::successors(std::error::Error::source(&e), |s| s.source())
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(": ");
    let full = if chain.is_empty() {
        text
    } else {
        format!("{text}: {chain}")
    };
    // Certificate failures and a server without TLS under verify-*: configuration, not
    // the network; never retried, never downgraded.
    if full.contains("TLS") || full.contains("certificate") || full.contains("Certificate") {
        SourceError::Tls(full)
    } else if let Some(db) = e.as_db_error() {
        // Authentication and authorization failures need the operator.
        SourceError::setup(
            "PSM_R1000",
            format!("the primary refused the connection: {}", db.message()),
        )
    } else {
        SourceError::Connection(full)
    }
}

/// A libpq URI for `pg_walstream`'s replication connection (`replication=database`).
/// An inline PEM `cacert` is written to a private file first (libpq wants a path).
pub fn replication_uri(conn: &SourceConnection) -> Result<String, SourceError> {
    let enc = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    let mut uri = format!("postgresql://{}", enc(&conn.username));
    if let Some(password) = &conn.password {
        uri.push(':');
        uri.push_str(&enc(password));
    }
    uri.push('@');
    let mut params = vec![("replication".to_owned(), "database".to_owned())];
    if conn.is_unix_socket() {
        params.push(("host".into(), conn.host.clone()));
        params.push(("port".into(), conn.port.to_string()));
    } else if conn.host.contains(':') {
        uri.push_str(&format!("[{}]:{}", conn.host, conn.port));
    } else {
        uri.push_str(&format!("{}:{}", conn.host, conn.port));
    }
    uri.push('/');
    uri.push_str(&enc(&conn.database));
    let mode = match conn.sslmode {
        SslMode::Disable => "disable",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    };
    if !conn.is_unix_socket() {
        params.push(("sslmode".into(), mode.into()));
    }
    if let Some(cacert) = &conn.cacert {
        params.push(("sslrootcert".into(), super::tls::cacert_file(cacert)?));
    }
    params.push(("application_name".into(), APPLICATION_NAME.into()));
    if !conn.is_unix_socket() {
        // libpq's options, which pg_walstream applies to its socket the same way.
        let bounds = &conn.bounds;
        params.extend([
            ("keepalives".into(), "1".into()),
            (
                "keepalives_idle".into(),
                bounds.keepalive_idle.as_secs().to_string(),
            ),
            (
                "keepalives_interval".into(),
                bounds.keepalive_interval.as_secs().to_string(),
            ),
            (
                "keepalives_count".into(),
                bounds.keepalive_count.to_string(),
            ),
            (
                "tcp_user_timeout".into(),
                bounds.user_timeout.as_millis().to_string(),
            ),
        ]);
    }
    let query: Vec<String> = params
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    uri.push('?');
    uri.push_str(&query.join("&"));
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every ordinary connection probes an idle peer with the bounds' keepalives and gives
    /// up on data unacknowledged for their user timeout (not the OS's 2 h + 9 × 75 s).
    #[test]
    fn connections_carry_the_keepalive_and_user_timeout_bounds() {
        let mut conn = SourceConnection::from_uri("postgresql://u@db:5433/app").unwrap();
        conn.bounds.keepalive_idle = Duration::from_secs(7);
        conn.bounds.keepalive_interval = Duration::from_secs(3);
        conn.bounds.keepalive_count = 4;
        conn.bounds.user_timeout = Duration::from_secs(19);
        let config = pg_config(&conn);
        assert!(config.get_keepalives());
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(7));
        assert_eq!(
            config.get_keepalives_interval(),
            Some(Duration::from_secs(3))
        );
        assert_eq!(config.get_keepalives_retries(), Some(4));
        assert_eq!(
            config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(19))
        );
    }

    /// The replication connection (`pg_walstream`, which reads libpq's options) carries the
    /// same bounds, in libpq's units (seconds; milliseconds for `tcp_user_timeout`).
    #[test]
    fn the_replication_uri_carries_the_same_bounds() {
        let mut conn =
            SourceConnection::from_uri("postgresql://u@db:5433/app?sslmode=disable").unwrap();
        conn.bounds.keepalive_idle = Duration::from_secs(7);
        conn.bounds.keepalive_interval = Duration::from_secs(3);
        conn.bounds.keepalive_count = 4;
        conn.bounds.user_timeout = Duration::from_secs(19);
        let uri = replication_uri(&conn).unwrap();
        for option in [
            "keepalives=1",
            "keepalives_idle=7",
            "keepalives_interval=3",
            "keepalives_count=4",
            "tcp_user_timeout=19000",
        ] {
            assert!(uri.contains(option), "{option} in {uri}");
        }
    }

    #[test]
    fn replication_uri_escapes_and_keeps_tls_policy() {
        let conn = SourceConnection::from_uri(
            "postgresql://rep%40l:p%20w@db:5433/app?sslmode=verify-ca&sslrootcert=/ca.pem",
        )
        .unwrap();
        assert_eq!(
            replication_uri(&conn).unwrap(),
            "postgresql://rep%40l:p%20w@db:5433/app?replication=database&sslmode=verify%2Dca\
             &sslrootcert=%2Fca%2Epem&application_name=powersync%5Fmdbx&keepalives=1\
             &keepalives_idle=30&keepalives_interval=10&keepalives_count=3\
             &tcp_user_timeout=60000"
        );
    }
}
