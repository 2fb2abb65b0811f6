//! Partitioned tables. One the rules read is followed as one table: the publication
//! publishes its partitions' changes under its name (`publish_via_partition_root = true`),
//! and its snapshot reads every partition. Attaching, detaching or dropping a partition,
//! or emptying one alone (a TRUNCATE of a partition, which pgoutput does not send under
//! the root), changes its rows with no change on the stream: the stream notices them as a
//! change of its [`Partition`]s.

use tokio_postgres::Client;

use super::SourceError;

/// One partition of a partitioned table, at any level below it: what changes when the
/// table's rows change without a row change on the stream.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Partition {
    /// Its OID.
    pub oid: u32,
    /// `pg_class.relfilenode`: another after a TRUNCATE of it or a rewrite; 0 for a
    /// partition that is itself partitioned.
    pub filenode: u32,
    /// The transaction that attached it (`pg_inherits.xmin`): a partition detached and
    /// attached again has another; 0 when only a Relation message named it.
    pub attached: u32,
}

/// The partitions of table `oid`, at every level, in OID order, as the catalog is in
/// `client`'s snapshot (not as the planner of a query there expands the table: it reads
/// the partitions the catalog has now); `None` when the table is not partitioned, or
/// does not exist.
pub async fn table_partitions(
    client: &Client,
    oid: u32,
) -> Result<Option<Vec<Partition>>, SourceError> {
    let rows = client
        .query(
            "WITH RECURSIVE tree AS ( \
               SELECT inhrelid, xmin::text::bigint AS attached FROM pg_inherits \
               WHERE inhparent = $1 \
               UNION ALL \
               SELECT i.inhrelid, i.xmin::text::bigint FROM pg_inherits i \
               JOIN tree t ON i.inhparent = t.inhrelid) \
             SELECT c.relkind = 'p', t.inhrelid, p.relfilenode, t.attached \
             FROM pg_class c LEFT JOIN (tree t JOIN pg_class p ON p.oid = t.inhrelid) ON true \
             WHERE c.oid = $1 ORDER BY 2",
            &[&oid],
        )
        .await
        .map_err(SourceError::query("partitions"))?;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let partitioned: bool = first.try_get(0).map_err(SourceError::query("partitions"))?;
    if !partitioned {
        return Ok(None);
    }
    let mut partitions = Vec::with_capacity(rows.len());
    for row in &rows {
        let oid: Option<u32> = row.try_get(1).map_err(SourceError::query("partitions"))?;
        let filenode: Option<u32> = row.try_get(2).map_err(SourceError::query("partitions"))?;
        let attached: Option<i64> = row.try_get(3).map_err(SourceError::query("partitions"))?;
        if let Some(oid) = oid {
            partitions.push(Partition {
                oid,
                filenode: filenode.unwrap_or(0),
                attached: attached.and_then(|x| u32::try_from(x).ok()).unwrap_or(0),
            });
        }
    }
    Ok(Some(partitions))
}

/// Checks the partitions of `table` (OID `oid`), a partitioned table published under its
/// own name whose replica identity is every column (`full`) or `identity`: pgoutput sends
/// a partition's old rows with the partition's own replica identity, so each must carry
/// the table's (`PSM_R1011`); a foreign table's changes are never published (`PSM_R1012`).
pub(crate) async fn check_partitions(
    client: &Client,
    table: &impl std::fmt::Display,
    oid: u32,
    full: bool,
    identity: &[String],
) -> Result<(), SourceError> {
    let rows = client
        .query(
            "WITH RECURSIVE tree AS ( \
               SELECT inhrelid FROM pg_inherits WHERE inhparent = $1 \
               UNION ALL \
               SELECT i.inhrelid FROM pg_inherits i JOIN tree t ON i.inhparent = t.inhrelid) \
             SELECT c.oid::regclass::text, c.relkind::text, c.relreplident::text, \
               ARRAY(SELECT a.attname::text FROM pg_index x JOIN pg_attribute a \
                       ON a.attrelid = x.indrelid AND a.attnum = ANY (x.indkey) \
                     WHERE x.indrelid = c.oid AND ((c.relreplident = 'd' AND x.indisprimary) \
                       OR (c.relreplident = 'i' AND x.indisreplident))) \
             FROM tree t JOIN pg_class c ON c.oid = t.inhrelid \
             WHERE c.relkind <> 'p' ORDER BY c.oid",
            &[&oid],
        )
        .await
        .map_err(SourceError::query("partitions' replica identity"))?;
    for row in &rows {
        let get = |i| -> Result<String, SourceError> {
            row.try_get(i)
                .map_err(SourceError::query("partitions' replica identity"))
        };
        let (name, relkind, replident) = (get(0)?, get(1)?, get(2)?);
        let keys: Vec<String> = row
            .try_get(3)
            .map_err(SourceError::query("partitions' replica identity"))?;
        if relkind == "f" {
            return Err(SourceError::setup(
                "PSM_R1012",
                format!(
                    "partition {name} of {table} is a foreign table, whose changes are never \
                     published; detach it, or read its rows in another way than through {table}"
                ),
            ));
        }
        let carries = replident == "f"
            || (!full && !keys.is_empty() && identity.iter().all(|k| keys.contains(k)));
        if !carries {
            let wanted = if full {
                "REPLICA IDENTITY FULL".to_owned()
            } else {
                format!("a replica identity with ({})", identity.join(", "))
            };
            return Err(SourceError::setup(
                "PSM_R1011",
                format!(
                    "partition {name} of {table} has another replica identity than {table} \
                     ({wanted}): the old rows of its updates and deletes would not name the \
                     stored rows; run ALTER TABLE {name} REPLICA IDENTITY FULL, or give it \
                     {table}'s primary key"
                ),
            ));
        }
    }
    Ok(())
}
