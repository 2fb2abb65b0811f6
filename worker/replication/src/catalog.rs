//! Watching the primary's catalog for what pgoutput does not announce until a table's
//! next row change: an `ALTER TABLE … ADD COLUMN … DEFAULT` under `SELECT *` changes what
//! every row holds without a change on the stream; a rewrite (`ALTER COLUMN … TYPE`), a
//! table dropped and created again, a new replica identity show only with the next write;
//! a partition attached to a partitioned table, detached, dropped or emptied alone changes
//! the table's rows and shows on the stream never (or, attached, with its first write).
//!
//! Every [`EVERY`] the covered tables' OIDs, columns, replica identity and partitions are
//! read, then the primary's WAL position `P`, then the catalog once more: when both
//! readings agree, the state holds at `P` (the first saw nothing committed after `P`; the
//! second, begun after `P` was taken, saw what committed before it — short of a DDL still
//! between its commit record and its visibility during both readings, a window of
//! microseconds each). When
//! it differs from the last state handed on, a logical message past `P` is emitted (an
//! idle stream passes it) and the state handed to the stream, which applies it like a
//! Relation message once it has decoded every transaction committed before `P`:
//! transactions after that carry rows of the new shape. Readings that disagree are
//! dropped and the next turn reads again.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::liveness::{asked, ASK_TIMEOUT};
use crate::plan::SourcePlan;
use source::{
    connect, primary_identity, published_tables, published_with_prefix, table_columns,
    table_partitions, ColumnMeta, Partition, SourceTable, TableInfo,
};

/// How often the catalog is read.
pub(super) const EVERY: Duration = Duration::from_secs(2);

/// A covered table as the catalog shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CatalogTable {
    pub oid: u32,
    /// Published columns, in attnum order.
    pub columns: Vec<ColumnMeta>,
    /// Replica identity columns, in key order.
    pub identity: Vec<String>,
    /// A partitioned table's partitions (`None`: not partitioned).
    pub partitions: Option<Vec<Partition>>,
}

/// What a read of the catalog saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CatalogState {
    /// The primary's WAL position after the read.
    pub lsn: u64,
    /// The covered tables, in the stream's order; `None` for one not published under its
    /// name (renamed, dropped, or taken out of the publication).
    pub tables: Vec<Option<CatalogTable>>,
    /// Published tables a wildcard table of the rules matches that are not among them
    /// (the stream follows those it does not know yet).
    pub added: Vec<(SourceTable, CatalogTable)>,
}

/// One reading: the covered tables, then the other tables the wildcards match.
type Reading = (Vec<Option<CatalogTable>>, Vec<(SourceTable, CatalogTable)>);

/// What the watcher reads: the covered tables, and the wildcard tables of the rules as
/// `(schema, prefix)`.
#[derive(Debug, Clone)]
pub(super) struct Watched {
    pub tables: Vec<SourceTable>,
    pub wildcards: Vec<(String, String)>,
    /// Tables a wildcard matches that a handed-on reading listed already, as it saw them:
    /// later readings list them the same without reading their columns again (the stream
    /// follows them from the first reading it applies, and their Relation messages after).
    pub reported: Vec<(SourceTable, CatalogTable)>,
}

/// Reads the catalog of `tables` until the stream drops `out`'s receiver. A read that
/// fails (a covered table gone from the publication, say) is logged when its message
/// changes and tried again at the next turn; the stream is not stopped by it.
pub(super) async fn watch_catalog(
    plan: SourcePlan,
    system_identifier: String,
    mut tables: Watched,
    out: watch::Sender<Option<Arc<CatalogState>>>,
) {
    let mut client = None;
    let mut last: Option<Reading> = None;
    let mut last_problem = String::new();
    loop {
        if client.is_none() {
            client = connect(&plan.connection).await.ok();
        }
        // A question the network stopped answering is given up (`asked`), and the next
        // turn connects again.
        let mut reconnect = false;
        if let Some(c) = &client {
            let reading = asked(read(c, &system_identifier, &tables))
                .await
                .unwrap_or_else(|| {
                    reconnect = true;
                    Err(format!(
                        "the primary did not answer within {} s (the network may have stopped \
                         forwarding); connecting again",
                        ASK_TIMEOUT.as_secs()
                    ))
                });
            match reading {
                Ok(seen) if last.as_ref() != Some(&seen) => {
                    match asked(confirm(c, &system_identifier, &tables, &seen)).await {
                        Some(Ok(Some(lsn))) => {
                            last = Some(seen.clone());
                            let (covered, added) = seen;
                            for found in &added {
                                if !tables.reported.iter().any(|(t, _)| *t == found.0) {
                                    tables.reported.push(found.clone());
                                }
                            }
                            let state = CatalogState {
                                lsn,
                                tables: covered,
                                added,
                            };
                            if out.send(Some(Arc::new(state))).is_err() {
                                return;
                            }
                        }
                        // It changed again meanwhile: the next turn reads it anew.
                        Some(Ok(None)) => {}
                        Some(Err(_)) | None => reconnect = true,
                    }
                }
                Ok(_) => {}
                Err(problem) => {
                    if problem != last_problem {
                        tracing::warn!(
                            "reading the covered tables' catalog on the primary: {problem}; \
                             their changes are followed through the replication stream only"
                        );
                        last_problem = problem;
                    }
                    reconnect |= c.is_closed();
                }
            }
        }
        if reconnect {
            client = None;
        }
        if out.is_closed() {
            return;
        }
        tokio::time::sleep(EVERY).await;
    }
}

/// One consistent reading (a repeatable-read transaction: a table dropped and created
/// again between two of its queries cannot mix).
async fn read(
    client: &tokio_postgres::Client,
    system_identifier: &str,
    tables: &Watched,
) -> Result<Reading, String> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await
        .map_err(|e| e.to_string())?;
    let seen = read_in_transaction(client, system_identifier, tables).await;
    let ended = client.batch_execute("COMMIT").await;
    let seen = seen?;
    ended.map_err(|e| e.to_string())?;
    Ok(seen)
}

async fn read_in_transaction(
    client: &tokio_postgres::Client,
    system_identifier: &str,
    watched: &Watched,
) -> Result<Reading, String> {
    let reached = primary_identity(client)
        .await
        .map_err(|e| e.to_string())?
        .system_identifier;
    // A connection that now leads to another cluster reads nothing from it (the stream's
    // next reconnect refuses it: PSM_R2008).
    if reached != system_identifier {
        return Err(format!(
            "the connection leads to another PostgreSQL cluster (system identifier {reached})"
        ));
    }
    let published = published_tables(client, &watched.tables)
        .await
        .map_err(|e| e.to_string())?;
    let mut seen = Vec::with_capacity(watched.tables.len());
    for info in published {
        seen.push(match info {
            Some(info) => Some(catalog_table(client, info).await?),
            None => None,
        });
    }
    let mut added = Vec::new();
    for (schema, prefix) in &watched.wildcards {
        let matching = published_with_prefix(client, schema, prefix)
            .await
            .map_err(|e| e.to_string())?;
        for table in matching {
            if watched.tables.contains(&table) {
                continue;
            }
            if let Some(known) = watched.reported.iter().find(|(t, _)| *t == table) {
                added.push(known.clone());
                continue;
            }
            // One the stream cannot follow (no replica identity, say) is refused when its
            // first change comes; the others are read.
            if let Ok([Some(info)]) = published_tables(client, std::slice::from_ref(&table))
                .await
                .as_deref()
            {
                added.push((table, catalog_table(client, info.clone()).await?));
            }
        }
    }
    Ok((seen, added))
}

/// A published table's columns and partitions, as the catalog shows them.
async fn catalog_table(
    client: &tokio_postgres::Client,
    info: TableInfo,
) -> Result<CatalogTable, String> {
    let columns = table_columns(client, info.oid)
        .await
        .map_err(|e| e.to_string())?;
    if !info
        .identity_columns
        .iter()
        .all(|key| columns.iter().any(|c| &c.name == key))
    {
        return Err(format!(
            "table {} has a replica identity column that is not published",
            info.table
        ));
    }
    let partitions = table_partitions(client, info.oid)
        .await
        .map_err(|e| e.to_string())?;
    Ok(CatalogTable {
        oid: info.oid,
        columns,
        identity: info.identity_columns,
        partitions,
    })
}

/// The position at which `seen` holds: the primary's WAL position `P` is taken, then the
/// catalog read again; `None` when the second reading differs. A DDL statement that
/// committed before `P` but after the first reading's snapshot would otherwise be missing
/// from a state applied at `P`: the stream, already past it, would go back to the old
/// columns and take the next Relation message of the same columns for no change.
async fn confirm(
    client: &tokio_postgres::Client,
    system_identifier: &str,
    tables: &Watched,
    seen: &Reading,
) -> Result<Option<u64>, String> {
    let lsn = position(client).await.map_err(|e| e.to_string())?;
    let again = read(client, system_identifier, tables).await?;
    Ok((&again == seen).then_some(lsn))
}

/// The primary's WAL position now, with a logical message past it so that an idle
/// stream reaches it.
async fn position(client: &tokio_postgres::Client) -> Result<u64, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint, \
             pg_logical_emit_message(false, 'powersync', 'catalog')",
            &[],
        )
        .await?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::{Cluster, ClusterKind, PgInstall, TcpProxy, TestDir};

    /// A primary publishing one table, `notes`.
    fn primary_with_notes(install: &PgInstall, dir: &TestDir) -> Cluster {
        let primary = Cluster::start_new(install, dir, "primary", ClusterKind::Primary, &[]);
        primary.sql(
            "CREATE TABLE notes (id text PRIMARY KEY, body text);
             CREATE PUBLICATION powersync FOR TABLE notes;",
        );
        primary
    }

    fn plan(uri: &str) -> SourcePlan {
        SourcePlan {
            connection: config::SourceConnection::from_uri(uri).unwrap(),
            slot: "unused".into(),
        }
    }

    fn notes() -> Watched {
        Watched {
            tables: vec![SourceTable {
                schema: "public".into(),
                name: "notes".into(),
            }],
            wildcards: Vec::new(),
            reported: Vec::new(),
        }
    }

    /// The catalog of a cluster other than the store's (its system identifier) is not
    /// read; the store's own is, and a change of it is handed on.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_stores_own_cluster_is_read() {
        let install = PgInstall::pg16();
        let dir = TestDir::new(&install);
        let primary = primary_with_notes(&install, &dir);
        let plan = plan(&primary.uri("postgres"));
        let tables = notes();
        let watch = |system_identifier: String| {
            let (out, seen) = watch::channel(None);
            let task = tokio::spawn(watch_catalog(
                plan.clone(),
                system_identifier,
                tables.clone(),
                out,
            ));
            (task, seen)
        };

        let client = source::connect(&plan.connection).await.unwrap();
        let refused = read(&client, "1", &tables).await.unwrap_err();
        assert!(refused.contains("another PostgreSQL cluster"), "{refused}");

        let own = primary.sql("SELECT system_identifier FROM pg_control_system()");
        let (task, mut seen) = watch(own);
        testkit::wait_for_future("the first reading", || (), seen.changed())
            .await
            .unwrap();
        let first = seen.borrow_and_update().clone().unwrap();
        assert_eq!(first.tables[0].as_ref().unwrap().columns.len(), 2);
        primary.sql("ALTER TABLE notes ADD COLUMN extra text DEFAULT 'x'");
        testkit::wait_for_future("a reading with the new column", || (), seen.changed())
            .await
            .unwrap();
        let second = seen.borrow_and_update().clone().unwrap();
        assert_eq!(second.tables[0].as_ref().unwrap().columns.len(), 3);
        assert!(second.lsn > first.lsn);
        task.abort();
    }

    /// The network to the primary stops forwarding in the middle of a reading (nothing
    /// closes): the reading is given up in time and the catalog read again over a new
    /// connection, instead of waiting forever for the answer and following nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reading_the_network_stops_answering_is_made_again() {
        let install = PgInstall::pg16();
        let dir = TestDir::new(&install);
        let primary = primary_with_notes(&install, &dir);
        let proxy = TcpProxy::start(primary.port());
        let own = primary.sql("SELECT system_identifier FROM pg_control_system()");
        let (out, mut seen) = watch::channel(None);
        let task = tokio::spawn(watch_catalog(plan(&proxy.uri()), own, notes(), out));
        testkit::wait_for_future("the first reading", || (), seen.changed())
            .await
            .unwrap();
        seen.borrow_and_update();

        proxy.stall_when_client_sends(Some("BEGIN ISOLATION LEVEL REPEATABLE READ"));
        testkit::wait_until("a reading to start", || {
            (proxy.stalled_on_sending() > 0).then_some(())
        });
        proxy.stall_when_client_sends(None);
        primary.sql("ALTER TABLE notes ADD COLUMN extra text DEFAULT 'x'");
        testkit::wait_for_future("a reading with the new column", || (), seen.changed())
            .await
            .unwrap();
        let reading = seen.borrow_and_update().clone().unwrap();
        assert_eq!(reading.tables[0].as_ref().unwrap().columns.len(), 3);
        task.abort();
    }
}
