//! Ordinary SQL connections to the primary, and the replication connection string.

use std::time::Duration;

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::{Client, NoTls};

use super::{tls, SourceError};
use config::{SourceConnection, SslMode};

const APPLICATION_NAME: &str = "powersync_mdbx";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection that sends nothing this long is probed by TCP keepalives, so a primary
/// that vanished without closing the connection (a network that stops forwarding) is
/// noticed instead of waited on forever.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);

/// Opens an ordinary connection; its driver task runs on the current tokio runtime.
pub async fn connect(conn: &SourceConnection) -> Result<Client, SourceError> {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&conn.host)
        .port(conn.port)
        .user(&conn.username)
        .dbname(&conn.database)
        .application_name(APPLICATION_NAME)
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(KEEPALIVE_IDLE);
    if let Some(password) = &conn.password {
        config.password(password);
    }
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

    #[test]
    fn replication_uri_escapes_and_keeps_tls_policy() {
        let conn = SourceConnection::from_uri(
            "postgresql://rep%40l:p%20w@db:5433/app?sslmode=verify-ca&sslrootcert=/ca.pem",
        )
        .unwrap();
        assert_eq!(
            replication_uri(&conn).unwrap(),
            "postgresql://rep%40l:p%20w@db:5433/app?replication=database&sslmode=verify%2Dca\
             &sslrootcert=%2Fca%2Epem&application_name=powersync%5Fmdbx"
        );
    }
}
