//! The source tables the rules read now: each table they name, and every published table a
//! wildcard table (`todos_%`) stands for, as the primary's catalog lists them.

use rules::SyncRules;
use source::{published_with_prefix, SourceTable};
use tokio_postgres::Client;

use crate::error::ReplicationError;

/// The tables `rules` read on the primary of `client`, in name order (a snapshot's store
/// ids follow it): the named ones, and the published tables each wildcard matches.
pub(crate) async fn covered_tables(
    client: &Client,
    rules: &SyncRules,
) -> Result<Vec<SourceTable>, ReplicationError> {
    let mut tables = Vec::new();
    for (table, _) in rules.tables() {
        match table.name.strip_suffix('%') {
            Some(prefix) => {
                tables.extend(published_with_prefix(client, &table.schema, prefix).await?)
            }
            None => tables.push(SourceTable {
                schema: table.schema,
                name: table.name,
            }),
        }
    }
    tables.sort();
    tables.dedup();
    Ok(tables)
}
