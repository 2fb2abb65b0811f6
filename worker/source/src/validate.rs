//! Checks on the primary before anything is created there. Each failure is a
//! [`SourceError::Setup`] with a stable code and the statement that fixes it.

use tokio_postgres::Client;

use super::SourceError;

/// The publication the rules read through (the official service uses the same name).
pub const PUBLICATION: &str = "powersync";
/// PostgreSQL 14: older servers' pgoutput carries no logical messages (which write
/// checkpoints ride on), and the replication client speaks to 14 and later only.
const MIN_SERVER_VERSION: i32 = 140_000;

/// `server_version_num` as people write it (`170011` → `17.11`).
pub(crate) fn version_name(version: i32) -> String {
    format!("{}.{}", version / 10_000, version % 10_000)
}

/// A table the sync rules read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceTable {
    /// Schema name.
    pub schema: String,
    /// Table name.
    pub name: String,
}

impl std::fmt::Display for SourceTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}.{}",
            quote_ident(&self.schema),
            quote_ident(&self.name)
        )
    }
}

/// How rows of a table are identified in UPDATE and DELETE messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaIdentity {
    /// The primary key.
    Default,
    /// A unique index chosen with `REPLICA IDENTITY USING INDEX`.
    Index,
    /// Every column.
    Full,
}

/// What validation learned about one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableInfo {
    /// The table.
    pub table: SourceTable,
    /// Its relation OID on the primary.
    pub oid: u32,
    /// Its replica identity.
    pub identity: ReplicaIdentity,
    /// The identity columns (all columns for FULL).
    pub identity_columns: Vec<String>,
}

/// What validation learned about the primary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimaryInfo {
    /// `server_version_num`.
    pub server_version: i32,
    /// `pg_control_system().system_identifier`, which ties storage to this cluster.
    pub system_identifier: String,
    /// The timeline the primary writes WAL on.
    pub timeline: u32,
    /// The tables, in the order asked.
    pub tables: Vec<TableInfo>,
}

/// Validates the primary for replicating `tables` through [`PUBLICATION`].
pub async fn validate_primary(
    client: &Client,
    tables: &[SourceTable],
) -> Result<PrimaryInfo, SourceError> {
    let version: i32 = scalar(client, "SHOW server_version_num", "server version")
        .await?
        .parse()
        .unwrap_or(0);
    if version < MIN_SERVER_VERSION {
        return Err(SourceError::setup(
            "PSM_R1001",
            format!(
                "the primary runs PostgreSQL {}; version 14 or later is required (an older \
                 primary's pgoutput carries no logical messages, which write checkpoints \
                 need): upgrade the primary, or point replication.connections at a server of \
                 14 or later",
                version_name(version)
            ),
        ));
    }
    let wal_level = scalar(client, "SHOW wal_level", "wal_level").await?;
    if wal_level != "logical" {
        return Err(SourceError::setup(
            "PSM_R1002",
            format!(
                "the primary has wal_level = {wal_level}; set wal_level = logical in its \
                 postgresql.conf and restart it"
            ),
        ));
    }
    let can_replicate = scalar(
        client,
        "SELECT (rolreplication OR rolsuper)::text FROM pg_roles WHERE rolname = current_user",
        "role attributes",
    )
    .await?;
    if can_replicate != "true" {
        return Err(SourceError::setup(
            "PSM_R1003",
            "the configured user lacks the REPLICATION attribute; run ALTER ROLE <user> REPLICATION \
             on the primary",
        ));
    }
    let via_root = check_publication(client, version).await?;
    let identity = super::walsender::primary_identity(client).await?;
    let mut infos = Vec::with_capacity(tables.len());
    for table in tables {
        infos.push(check_table(client, table, version, via_root).await?);
    }
    Ok(PrimaryInfo {
        server_version: version,
        system_identifier: identity.system_identifier,
        timeline: identity.timeline,
        tables: infos,
    })
}

/// `tables` as published now, in order: `None` for one that does not exist or the
/// publication does not publish under its name (`PSM_R1007`, `PSM_R1008`, `PSM_R1018`,
/// `PSM_R1019`: a covered table renamed, dropped or taken out of the publication while a
/// store follows it, or `publish_via_partition_root` changed under it); any other problem,
/// the publication itself gone included, is an error.
pub async fn published_tables(
    client: &Client,
    tables: &[SourceTable],
) -> Result<Vec<Option<TableInfo>>, SourceError> {
    let version: i32 = scalar(client, "SHOW server_version_num", "server version")
        .await?
        .parse()
        .unwrap_or(0);
    let via_root = check_publication(client, version).await?;
    let mut published = Vec::with_capacity(tables.len());
    for table in tables {
        published.push(match check_table(client, table, version, via_root).await {
            Ok(info) => Some(info),
            Err(SourceError::Setup {
                code: "PSM_R1007" | "PSM_R1008" | "PSM_R1018" | "PSM_R1019",
                ..
            }) => None,
            Err(e) => return Err(e),
        });
    }
    Ok(published)
}

/// The tables of `schema` the publication includes whose names start with `prefix`, in
/// name order: what a wildcard table of the sync rules (`todos_%`) stands for now.
pub async fn published_with_prefix(
    client: &Client,
    schema: &str,
    prefix: &str,
) -> Result<Vec<SourceTable>, SourceError> {
    let rows = client
        .query(
            "SELECT tablename::text FROM pg_publication_tables \
             WHERE pubname = $1 AND schemaname = $2 AND starts_with(tablename::text, $3) \
             ORDER BY 1",
            &[&PUBLICATION, &schema, &prefix],
        )
        .await
        .map_err(SourceError::query("published tables"))?;
    rows.iter()
        .map(|row| {
            Ok(SourceTable {
                schema: schema.to_owned(),
                name: row
                    .try_get(0)
                    .map_err(SourceError::query("published tables"))?,
            })
        })
        .collect()
}

pub(crate) async fn scalar(
    client: &Client,
    sql: &str,
    context: &'static str,
) -> Result<String, SourceError> {
    let row = client
        .query_one(sql, &[])
        .await
        .map_err(SourceError::query(context))?;
    row.try_get::<_, String>(0)
        .map_err(SourceError::query(context))
}

/// Checks the publication; returns its `publish_via_partition_root`: whether a partitioned
/// table's changes are published under its own name (else under its partitions').
pub(crate) async fn check_publication(client: &Client, version: i32) -> Result<bool, SourceError> {
    // PostgreSQL 18 can publish stored generated columns (`publish_generated_columns`).
    let generated = if version >= 180_000 {
        "pubgencols::text <> 'n'"
    } else {
        "false"
    };
    let row = client
        .query_opt(
            &format!(
                "SELECT pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot, {generated} \
                 FROM pg_publication WHERE pubname = $1"
            ),
            &[&PUBLICATION],
        )
        .await
        .map_err(SourceError::query("publication"))?;
    let Some(row) = row else {
        return Err(SourceError::setup(
            "PSM_R1004",
            format!(
                "publication \"{PUBLICATION}\" does not exist on the primary; create it, e.g. \
                 CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES"
            ),
        ));
    };
    let flag = |i: usize| row.try_get::<_, bool>(i).unwrap_or(false);
    let missing: Vec<&str> = ["insert", "update", "delete", "truncate"]
        .iter()
        .enumerate()
        .filter(|(i, _)| !flag(*i))
        .map(|(_, op)| *op)
        .collect();
    if !missing.is_empty() {
        return Err(SourceError::setup(
            "PSM_R1005",
            format!(
                "publication \"{PUBLICATION}\" does not publish {}; run ALTER PUBLICATION \
                 {PUBLICATION} SET (publish = 'insert, update, delete, truncate')",
                missing.join(", ")
            ),
        ));
    }
    if flag(5) {
        // The snapshot reads the columns pgoutput sends by default, without generated ones.
        return Err(SourceError::setup(
            "PSM_R1015",
            format!(
                "publication \"{PUBLICATION}\" publishes generated columns \
                 (publish_generated_columns = stored), which is not supported: generated \
                 columns are not synced (the snapshot leaves them out, as pgoutput does by \
                 default); run ALTER PUBLICATION {PUBLICATION} SET (publish_generated_columns \
                 = none)"
            ),
        ));
    }
    Ok(flag(4))
}

/// A table the rules name as the catalog shows it.
struct Found {
    oid: u32,
    /// `pg_class.relreplident`.
    replident: String,
    /// Partitioned (`relkind` `p`).
    partitioned: bool,
    /// A partition of another table (`relispartition`).
    partition: bool,
}

pub(crate) async fn check_table(
    client: &Client,
    table: &SourceTable,
    version: i32,
    via_root: bool,
) -> Result<TableInfo, SourceError> {
    let found = find_table(client, table).await?;
    if found.partitioned && !via_root {
        return Err(SourceError::setup(
            "PSM_R1018",
            format!(
                "the sync rules read {table}, a partitioned table, but publication \
                 \"{PUBLICATION}\" publishes its changes under its partitions' names \
                 (publish_via_partition_root = false); run ALTER PUBLICATION {PUBLICATION} SET \
                 (publish_via_partition_root = true) to have them published under its name, \
                 or read each partition in the sync rules"
            ),
        ));
    }
    check_published(client, table, &found, version, via_root).await?;
    let (identity, columns) = replica_identity(client, table, &found).await?;
    if found.partitioned {
        let full = identity == ReplicaIdentity::Full;
        super::partition::check_partitions(client, table, found.oid, full, &columns).await?;
    }
    Ok(TableInfo {
        table: table.clone(),
        oid: found.oid,
        identity,
        identity_columns: columns,
    })
}

/// `table` in the catalog: it must exist (`PSM_R1007`) and be a table (`PSM_R1012`).
async fn find_table(client: &Client, table: &SourceTable) -> Result<Found, SourceError> {
    let row = client
        .query_opt(
            "SELECT c.oid, c.relreplident::text, c.relkind::text, c.relispartition \
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&table.schema, &table.name],
        )
        .await
        .map_err(SourceError::query("table lookup"))?;
    let Some(row) = row else {
        return Err(SourceError::setup(
            "PSM_R1007",
            format!("the sync rules read {table}, which does not exist on the primary; create it or fix the rules"),
        ));
    };
    let relkind: String = row.try_get(2).map_err(SourceError::query("table lookup"))?;
    if relkind != "r" && relkind != "p" {
        return Err(SourceError::setup(
            "PSM_R1012",
            format!("{table} is not a table (relkind {relkind}); sync rules can read tables only"),
        ));
    }
    Ok(Found {
        oid: row.try_get(0).map_err(SourceError::query("table lookup"))?,
        replident: row.try_get(1).map_err(SourceError::query("table lookup"))?,
        partitioned: relkind == "p",
        partition: row.try_get(3).map_err(SourceError::query("table lookup"))?,
    })
}

/// The publication publishes `table` under its name (`PSM_R1008`; `PSM_R1019` for a
/// partition whose changes it publishes under a partitioned table's name), all of its rows
/// (`PSM_R1009`) and columns (`PSM_R1010`).
async fn check_published(
    client: &Client,
    table: &SourceTable,
    found: &Found,
    version: i32,
    via_root: bool,
) -> Result<(), SourceError> {
    // Row filters and column lists exist since PostgreSQL 15.
    let publication_sql = if version >= 150_000 {
        "SELECT rowfilter IS NOT NULL, \
                attnames IS NOT NULL AND EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $3 \
                  AND attnum > 0 AND NOT attisdropped AND attgenerated = '' \
                  AND NOT attname = ANY (attnames)) \
         FROM pg_publication_tables WHERE pubname = $4 AND schemaname = $1 AND tablename = $2"
    } else {
        "SELECT false, false FROM pg_publication_tables \
         WHERE $3::oid IS NOT NULL AND pubname = $4 AND schemaname = $1 AND tablename = $2"
    };
    let published = client
        .query_opt(
            publication_sql,
            &[&table.schema, &table.name, &found.oid, &PUBLICATION],
        )
        .await
        .map_err(SourceError::query("publication tables"))?;
    let Some(published) = published else {
        let root = if found.partition && via_root {
            published_ancestor(client, found.oid).await?
        } else {
            None
        };
        if let Some(root) = root {
            return Err(SourceError::setup(
                "PSM_R1019",
                format!(
                    "the sync rules read {table}, a partition of {root}, whose changes \
                     publication \"{PUBLICATION}\" publishes under {root}'s name \
                     (publish_via_partition_root = true); read {root} in the sync rules, or run \
                     ALTER PUBLICATION {PUBLICATION} SET (publish_via_partition_root = false) \
                     to have each partition's changes published under its own name"
                ),
            ));
        }
        return Err(SourceError::setup(
            "PSM_R1008",
            format!(
                "the sync rules read {table}, but publication \"{PUBLICATION}\" does not include it; \
                 run ALTER PUBLICATION {PUBLICATION} ADD TABLE {table}"
            ),
        ));
    };
    if published.try_get::<_, bool>(0).unwrap_or(true) {
        return Err(SourceError::setup(
            "PSM_R1009",
            format!(
                "publication \"{PUBLICATION}\" has a row filter (WHERE) on {table}; filtered rows would \
                 be missing or stale in buckets. Remove it (ALTER PUBLICATION {PUBLICATION} SET TABLE \
                 {table}) and filter in the sync rules instead"
            ),
        ));
    }
    if published.try_get::<_, bool>(1).unwrap_or(true) {
        return Err(SourceError::setup(
            "PSM_R1010",
            format!(
                "publication \"{PUBLICATION}\" publishes only some columns of {table}; publish all \
                 columns (ALTER PUBLICATION {PUBLICATION} SET TABLE {table}) and choose columns in \
                 the sync rules"
            ),
        ));
    }
    Ok(())
}

/// `table`'s replica identity and its columns, in key order (`PSM_R1011` when there are
/// none).
async fn replica_identity(
    client: &Client,
    table: &SourceTable,
    found: &Found,
) -> Result<(ReplicaIdentity, Vec<String>), SourceError> {
    let (identity, identity_sql) = match found.replident.as_str() {
        "d" => (ReplicaIdentity::Default, "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = $1 AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)"),
        "i" => (ReplicaIdentity::Index, "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = $1 AND i.indisreplident ORDER BY array_position(i.indkey, a.attnum)"),
        "f" => (ReplicaIdentity::Full, "SELECT attname::text FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum"),
        _ => {
            return Err(SourceError::setup(
                "PSM_R1011",
                format!(
                    "{table} has REPLICA IDENTITY NOTHING, so updates and deletes cannot be matched to \
                     rows; run ALTER TABLE {table} REPLICA IDENTITY DEFAULT (with a primary key) or FULL"
                ),
            ))
        }
    };
    let columns: Vec<String> = client
        .query(identity_sql, &[&found.oid])
        .await
        .map_err(SourceError::query("replica identity"))?
        .iter()
        .filter_map(|r| r.try_get(0).ok())
        .collect();
    if columns.is_empty() {
        return Err(SourceError::setup(
            "PSM_R1011",
            format!(
                "{table} has no primary key, so its default replica identity cannot match updates and \
                 deletes to rows; add a primary key or run ALTER TABLE {table} REPLICA IDENTITY FULL"
            ),
        ));
    }
    Ok((identity, columns))
}

/// The partitioned table above partition `oid` that the publication publishes, by name
/// (`schema.name`); `None` when none is.
async fn published_ancestor(client: &Client, oid: u32) -> Result<Option<String>, SourceError> {
    let row = client
        .query_opt(
            "SELECT quote_ident(p.schemaname::text) || '.' || quote_ident(p.tablename::text) \
             FROM pg_partition_ancestors($1::oid::regclass) a JOIN pg_class c ON c.oid = a.relid \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             JOIN pg_publication_tables p ON p.pubname = $2 AND p.schemaname = n.nspname \
               AND p.tablename = c.relname \
             WHERE a.relid::oid <> $1::oid LIMIT 1",
            &[&oid, &PUBLICATION],
        )
        .await
        .map_err(SourceError::query("partition ancestors"))?;
    row.map(|r| r.try_get(0))
        .transpose()
        .map_err(SourceError::query("partition ancestors"))
}

/// Quotes an identifier the way PostgreSQL's `quote_ident` does for display and SQL.
pub(crate) fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_owned()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}
