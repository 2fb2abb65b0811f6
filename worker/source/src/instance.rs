//! What the admin API reads live from the primary (`docs/operations.md`, "The admin API and
//! the official CLI"): its schema as the official `/api/admin/v1/schema` lists it, whether a
//! table the rules read is replicated as they need, and the slot's WAL budget.

use tokio_postgres::Client;

use super::validate::{check_publication, check_table, scalar, SourceTable, TableInfo};
use super::SourceError;

/// One column of a table in the primary's schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaColumn {
    /// Column name.
    pub name: String,
    /// `format_type()`: the type as declared (`character varying(255)[]`).
    pub declared: String,
    /// The type's name in `pg_type`, arrays written `elem[]` (`varchar[]`).
    pub type_name: String,
    /// The type OID whose values the column holds (a domain's base type).
    pub type_oid: u32,
    /// For an array type, its element type OID.
    pub element_oid: Option<u32>,
}

/// One table (or partitioned table) of the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaTable {
    /// Table name.
    pub name: String,
    /// Columns in their order.
    pub columns: Vec<SchemaColumn>,
}

/// The tables of one schema the connection's user can read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseSchema {
    /// Schema name.
    pub name: String,
    /// Its tables, by name.
    pub tables: Vec<SchemaTable>,
}

/// Every table of every user schema the connection's user may read, with its columns:
/// ordinary and partitioned tables, system schemas left out.
pub async fn connection_schema(client: &Client) -> Result<Vec<DatabaseSchema>, SourceError> {
    let rows = client
        .query(
            "SELECT n.nspname::text, c.relname::text, a.attname::text, \
                    format_type(a.atttypid, a.atttypmod), t.typname::text, \
                    (CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END)::int8, \
                    (CASE WHEN t.typcategory = 'A' THEN t.typelem ELSE 0 END)::int8 \
             FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
             JOIN pg_type t ON t.oid = a.atttypid \
             WHERE c.relkind IN ('r', 'p') \
               AND n.nspname NOT IN ('information_schema', 'pg_catalog', 'pg_toast') \
               AND n.nspname NOT LIKE 'pg\\_temp\\_%' AND n.nspname NOT LIKE 'pg\\_toast\\_temp\\_%' \
               AND has_schema_privilege(n.oid, 'USAGE') \
               AND has_table_privilege(c.oid, 'SELECT') \
             ORDER BY 1, 2, a.attnum",
            &[],
        )
        .await
        .map_err(SourceError::query("schema"))?;
    let mut schemas: Vec<DatabaseSchema> = Vec::new();
    for row in rows {
        let text = |i: usize| row.try_get::<_, String>(i).unwrap_or_default();
        let oid = |i: usize| u32::try_from(row.try_get::<_, i64>(i).unwrap_or(0)).unwrap_or(0);
        let (schema, table) = (text(0), text(1));
        let type_name = text(4);
        let column = SchemaColumn {
            name: text(2),
            declared: text(3),
            type_name: match type_name.strip_prefix('_') {
                Some(element) => format!("{element}[]"),
                None => type_name,
            },
            type_oid: oid(5),
            element_oid: Some(oid(6)).filter(|&e| e != 0),
        };
        let schema_at = match schemas.iter().rposition(|s| s.name == schema) {
            Some(at) => at,
            None => {
                schemas.push(DatabaseSchema {
                    name: schema,
                    tables: Vec::new(),
                });
                schemas.len() - 1
            }
        };
        let tables = &mut schemas[schema_at].tables;
        let table_at = match tables.iter().rposition(|t| t.name == table) {
            Some(at) => at,
            None => {
                tables.push(SchemaTable {
                    name: table,
                    columns: Vec::new(),
                });
                tables.len() - 1
            }
        };
        tables[table_at].columns.push(column);
    }
    Ok(schemas)
}

/// `table` as replication would find it now: its replica identity, or the coded error that
/// validation would stop on (missing, not published, filtered, ...). The publication's
/// own problems come first.
pub async fn table_status(client: &Client, table: &SourceTable) -> Result<TableInfo, SourceError> {
    let version: i32 = scalar(client, "SHOW server_version_num", "server version")
        .await?
        .parse()
        .unwrap_or(0);
    let via_root = check_publication(client, version).await?;
    check_table(client, table, version, via_root).await
}

/// A slot's standing on the primary, as the official diagnostics show it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotBudget {
    /// The slot exists.
    pub exists: bool,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
    /// Bytes of WAL that may still be written before the slot is at risk of being
    /// invalidated (only with `max_slot_wal_keep_size` set).
    pub safe_wal_size: Option<i64>,
    /// `max_slot_wal_keep_size` in bytes; `None` when unlimited.
    pub max_slot_wal_keep_size: Option<i64>,
    /// WAL between the primary's position and what the slot confirmed, bytes.
    pub lag_bytes: Option<i64>,
}

/// Reads slot `name`'s WAL budget and lag.
pub async fn slot_budget(client: &Client, name: &str) -> Result<SlotBudget, SourceError> {
    let row = client
        .query_opt(
            "SELECT wal_status::text, safe_wal_size::int8, \
                    (pg_current_wal_lsn() - confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&name],
        )
        .await
        .map_err(SourceError::query("replication slot"))?;
    // `max_slot_wal_keep_size` is in MB; -1 means unlimited.
    let keep: i64 = scalar(
        client,
        "SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size'",
        "max_slot_wal_keep_size",
    )
    .await?
    .parse()
    .unwrap_or(-1);
    let max_slot_wal_keep_size = (keep >= 0).then(|| keep * 1024 * 1024);
    Ok(match row {
        None => SlotBudget {
            max_slot_wal_keep_size,
            ..SlotBudget::default()
        },
        Some(row) => SlotBudget {
            exists: true,
            wal_status: row.try_get(0).ok().flatten(),
            safe_wal_size: row.try_get(1).ok().flatten(),
            max_slot_wal_keep_size,
            lag_bytes: row.try_get(2).ok().flatten(),
        },
    })
}
