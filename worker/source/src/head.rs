//! The primary's WAL head for write checkpoints, over one ordinary connection that is
//! reopened after an error.

use tokio::sync::Mutex;
use tokio_postgres::Client;

use super::{connect, SourceError};
use config::SourceConnection;

/// Writes a non-transactional logical message (prefix `powersync`, `content`) on `client`'s
/// primary: every slot's stream passes it, so a stream learns it has reached a position
/// taken before it even while the primary writes nothing else.
pub async fn emit_marker(client: &Client, content: &str) -> Result<(), SourceError> {
    client
        .execute(
            "SELECT pg_logical_emit_message(false, 'powersync', $1)",
            &[&content],
        )
        .await
        .map(drop)
        .map_err(SourceError::query("emit a logical message"))
}

/// The content of the logical message that announces a write-checkpoint request to every
/// replica of the primary (`replication`'s `WriteCheckpointNote` reads it): the record key,
/// the LSN, and the id when it is not the LSN (a checkpoint request's).
pub fn write_checkpoint_message(record_key: &str, lsn: u64, id: u64) -> String {
    if id == lsn {
        format!("write-checkpoint {record_key} {lsn}")
    } else {
        format!("write-checkpoint {record_key} {lsn} {id}")
    }
}

/// Reads `pg_current_wal_lsn()` and makes the source emit a logical message behind it.
pub struct PrimaryHead {
    connection: SourceConnection,
    client: Mutex<Option<Client>>,
}

impl PrimaryHead {
    /// Connects lazily, on the first request.
    pub fn new(connection: SourceConnection) -> Self {
        Self {
            connection,
            client: Mutex::new(None),
        }
    }

    /// The primary's current WAL position (`pg_current_wal_lsn()`).
    pub async fn current_lsn(&self) -> Result<u64, SourceError> {
        let head: String = self
            .query("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::text")
            .await?;
        head.parse()
            .map_err(|_| SourceError::Connection(format!("the primary returned LSN {head:?}")))
    }

    /// Writes a non-transactional logical message (prefix `powersync`) so replication
    /// passes the current position even when nothing else changes on the primary. Its
    /// content, `write-checkpoint <record key> <lsn> [<id>]`, tells every replica of the primary
    /// that the write checkpoint `record_key` asked for `lsn`.
    pub async fn ping(&self, record_key: &str, lsn: u64, id: u64) -> Result<(), SourceError> {
        self.mark(&write_checkpoint_message(record_key, lsn, id))
            .await
            .map(drop)
    }

    /// Like [`Self::ping`] with `content`; returns the message's LSN, which every slot
    /// of the database reaches once it decoded everything committed before it.
    pub async fn mark(&self, content: &str) -> Result<u64, SourceError> {
        let sql = format!(
            "SELECT (pg_logical_emit_message(false, 'powersync', '{}') - '0/0'::pg_lsn)::text",
            content.replace('\'', "''")
        );
        let lsn: String = self.query(&sql).await?;
        lsn.parse()
            .map_err(|_| SourceError::Connection(format!("the primary returned LSN {lsn:?}")))
    }

    /// One text value from `sql`, reconnecting first if the connection was lost.
    async fn query(&self, sql: &str) -> Result<String, SourceError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(Client::is_closed) {
            *guard = Some(connect(&self.connection).await?);
        }
        let Some(client) = guard.as_ref() else {
            return Err(SourceError::Connection(
                "no connection to the primary".into(),
            ));
        };
        match client.query_one(sql, &[]).await {
            Ok(row) => row
                .try_get(0)
                .map_err(SourceError::query("write checkpoint")),
            Err(e) => {
                *guard = None;
                Err(SourceError::query("write checkpoint")(e))
            }
        }
    }
}
