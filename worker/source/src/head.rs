//! The primary's WAL head for write checkpoints, over a small pool of ordinary connections.
//!
//! Each call has one deadline, [`HEAD_DEADLINE`], over its wait for a connection of the
//! pool, the connect when none is open, and the query: with the primary unreachable a
//! request is answered within it, however many wait. A failure of the network (a connect
//! that failed, a query that got no answer in time or whose connection broke) is
//! remembered for [`FAIL_FAST_FOR`]: calls meanwhile fail at once instead of each waiting
//! through a connect of their own.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
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

/// Connections to the primary a [`PrimaryHead`] keeps: write checkpoints of several
/// clients at once do not queue behind one query.
pub const HEAD_CONNECTIONS: usize = 4;
/// The most a call of a [`PrimaryHead`] takes: waiting for a connection, connecting and
/// asking together.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// How long a failure of the network to the primary is answered from memory.
pub const FAIL_FAST_FOR: Duration = Duration::from_secs(5);

/// Reads `pg_current_wal_lsn()` and makes the source emit a logical message behind it.
pub struct PrimaryHead {
    connection: SourceConnection,
    /// One permit per connection of the pool, open or not.
    permits: Semaphore,
    /// Open connections not in use.
    idle: Mutex<Vec<Client>>,
    /// The last failure of the network, and when it happened.
    failed: Mutex<Option<(Instant, String)>>,
}

impl PrimaryHead {
    /// Connects lazily, on the first request.
    pub fn new(connection: SourceConnection) -> Self {
        Self {
            connection,
            permits: Semaphore::new(HEAD_CONNECTIONS),
            idle: Mutex::new(Vec::new()),
            failed: Mutex::new(None),
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

    /// One text value from `sql` within [`HEAD_DEADLINE`], or the network's failure
    /// remembered from a call before.
    async fn query(&self, sql: &str) -> Result<String, SourceError> {
        if let Some(failure) = self.recent_failure() {
            return Err(failure);
        }
        let result = match tokio::time::timeout(HEAD_DEADLINE, self.pooled(sql)).await {
            Ok(result) => result,
            Err(_) => Err(SourceError::Connection(format!(
                "the primary did not answer within {} s",
                HEAD_DEADLINE.as_secs()
            ))),
        };
        if let Err(e) = &result {
            if is_network(e) {
                let text = match e {
                    SourceError::Connection(text) => text.clone(),
                    other => other.to_string(),
                };
                *lock(&self.failed) = Some((Instant::now(), text));
            }
        }
        result
    }

    /// `sql` on a connection of the pool (one opened if none is idle). A connection whose
    /// query failed or did not finish (the deadline dropped it) is closed, not reused.
    async fn pooled(&self, sql: &str) -> Result<String, SourceError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| SourceError::Connection("the connection pool is closed".into()))?;
        // A call that failed while this one waited for its place.
        if let Some(failure) = self.recent_failure() {
            return Err(failure);
        }
        let idle = lock(&self.idle).pop().filter(|c| !c.is_closed());
        let client = match idle {
            Some(client) => client,
            None => connect(&self.connection).await?,
        };
        let value = client
            .query_one(sql, &[])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(SourceError::query("write checkpoint"))?;
        lock(&self.idle).push(client);
        Ok(value)
    }

    /// The network's failure if one happened within [`FAIL_FAST_FOR`].
    fn recent_failure(&self) -> Option<SourceError> {
        let failed = lock(&self.failed);
        let (at, text) = failed.as_ref()?;
        let ago = at.elapsed();
        (ago < FAIL_FAST_FOR).then(|| {
            SourceError::Connection(format!(
                "{text} ({:.1} s ago; asked again {} s after a failure)",
                ago.as_secs_f64(),
                FAIL_FAST_FOR.as_secs()
            ))
        })
    }
}

/// A failure of the connection rather than an answer of the server.
fn is_network(error: &SourceError) -> bool {
    match error {
        SourceError::Connection(_) | SourceError::Stalled { .. } => true,
        SourceError::Query { source, .. } => source.as_db_error().is_none(),
        SourceError::Setup { .. } | SourceError::Tls(_) => false,
    }
}

/// `mutex`'s value; a panic of another holder left nothing half-changed here.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
