//! Reading tables inside the slot's exported snapshot with `COPY ... TO STDOUT`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::time::{Instant, Sleep};
use tokio_postgres::{Client, CopyOutStream};

use super::validate::{quote_ident, SourceTable};
use super::SourceError;

/// One column of a source table, as replication delivers it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ColumnMeta {
    /// Column name.
    pub name: String,
    /// Type OID.
    pub type_oid: u32,
    /// Element type OID for arrays.
    pub element_oid: Option<u32>,
    /// `pg_type.typlen`: the fixed size in bytes, or -1/-2 for variable-length types
    /// (which are the ones PostgreSQL may TOAST).
    #[serde(default)]
    pub typlen: i16,
    /// `pg_attribute.attnum`, 0 when unknown (a record of an earlier build, a column a
    /// Relation message introduced): a column dropped and added again under its name and
    /// type shows only in it.
    #[serde(default)]
    pub attnum: i16,
}

/// The planner's estimate of the rows of the tables `oids` (`pg_class.reltuples`; a table
/// never analyzed or vacuumed counts 0), a partitioned table's the sum of its partitions'.
pub async fn estimated_rows(client: &Client, oids: &[u32]) -> Result<u64, SourceError> {
    let row = client
        .query_one(
            "WITH RECURSIVE tree AS ( \
               SELECT oid, relkind, reltuples FROM pg_class WHERE oid = ANY($1) \
               UNION ALL \
               SELECT c.oid, c.relkind, c.reltuples FROM tree t \
               JOIN pg_inherits i ON i.inhparent = t.oid AND t.relkind = 'p' \
               JOIN pg_class c ON c.oid = i.inhrelid) \
             SELECT coalesce(sum(greatest(reltuples, 0)), 0)::float8 FROM tree \
             WHERE relkind <> 'p'",
            &[&oids],
        )
        .await
        .map_err(SourceError::query("the planner's row estimate"))?;
    let rows: f64 = row
        .try_get(0)
        .map_err(SourceError::query("the planner's row estimate"))?;
    Ok(rows.max(0.0) as u64)
}

/// The published columns of table `oid` in attnum order (generated columns excluded, as
/// pgoutput leaves them out).
pub async fn table_columns(client: &Client, oid: u32) -> Result<Vec<ColumnMeta>, SourceError> {
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, NULLIF(t.typelem, 0), t.typlen, a.attnum \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = '' \
             ORDER BY a.attnum",
            &[&oid],
        )
        .await
        .map_err(SourceError::query("table columns"))?;
    rows.iter()
        .map(|r| {
            Ok(ColumnMeta {
                name: r.try_get(0).map_err(SourceError::query("table columns"))?,
                type_oid: r.try_get(1).map_err(SourceError::query("table columns"))?,
                element_oid: r.try_get(2).map_err(SourceError::query("table columns"))?,
                typlen: r.try_get(3).map_err(SourceError::query("table columns"))?,
                attnum: r.try_get(4).map_err(SourceError::query("table columns"))?,
            })
        })
        .collect()
}

/// Opens a read-only REPEATABLE READ transaction on `client` that sees exactly the
/// exported `snapshot`.
pub async fn enter_snapshot(client: &Client, snapshot: &str) -> Result<(), SourceError> {
    let quoted = snapshot.replace('\'', "''");
    client
        .batch_execute(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{quoted}'"
        ))
        .await
        .map_err(SourceError::query("import the exported snapshot"))
}

/// Starts `COPY table (columns) TO STDOUT`, for a `partitioned` table (which `COPY`
/// refuses) `COPY (SELECT columns FROM table) TO STDOUT`, every partition's rows; its rows
/// come one per item (with its newline), as the server sends one CopyData message per row,
/// each within `stall_after` of the one before (the progress bound, [`CopyRows`]).
pub async fn copy_table(
    client: &Client,
    table: &SourceTable,
    columns: &[ColumnMeta],
    partitioned: bool,
    stall_after: Duration,
) -> Result<CopyRows, SourceError> {
    let list = columns
        .iter()
        .map(|c| quote_ident(&c.name))
        .collect::<Vec<String>>()
        .join(", ");
    let sql = if partitioned {
        format!("COPY (SELECT {list} FROM {table}) TO STDOUT")
    } else {
        format!("COPY {table} ({list}) TO STDOUT")
    };
    let what = format!("the COPY of {table}");
    let rows = within(stall_after, &what, client.copy_out(&sql))
        .await?
        .map_err(SourceError::query("COPY"))?;
    Ok(CopyRows {
        rows: Box::pin(rows),
        stall_after,
        last: Instant::now(),
        watchdog: Box::pin(tokio::time::sleep(stall_after)),
        what,
    })
}

/// `step` (named `what`), unless it takes longer than `bound`: then [`SourceError::Stalled`].
/// For questions to the primary that answer at once when it is reachable.
pub async fn within<T>(
    bound: Duration,
    what: &str,
    step: impl Future<Output = T>,
) -> Result<T, SourceError> {
    tokio::time::timeout(bound, step)
        .await
        .map_err(|_| SourceError::stalled(what, bound))
}

/// A table's COPY, bounded by progress: when no row arrives for `stall_after` (a network
/// that stopped forwarding closes nothing, and this side sends nothing a TCP timeout
/// would notice before its keepalives run out), the next read fails with `PSM_R3003`.
/// One timer per copy, moved only when it fires, rather than one per row.
pub struct CopyRows {
    rows: Pin<Box<CopyOutStream>>,
    stall_after: Duration,
    /// When the last row arrived (or the copy started).
    last: Instant,
    /// Fires at `last + stall_after` or earlier.
    watchdog: Pin<Box<Sleep>>,
    what: String,
}

impl CopyRows {
    /// The next row, with its newline; `None` after the last.
    pub async fn next(&mut self) -> Option<Result<Bytes, SourceError>> {
        std::future::poll_fn(|cx| self.poll_row(cx)).await
    }

    fn poll_row(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, SourceError>>> {
        if let Poll::Ready(row) = self.rows.poll_next_unpin(cx) {
            self.last = Instant::now();
            return Poll::Ready(row.map(|r| r.map_err(SourceError::query("COPY"))));
        }
        loop {
            if self.watchdog.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = self.last + self.stall_after;
            if Instant::now() >= due {
                return Poll::Ready(Some(Err(SourceError::stalled(
                    self.what.clone(),
                    self.stall_after,
                ))));
            }
            self.watchdog.as_mut().reset(due);
        }
    }
}
