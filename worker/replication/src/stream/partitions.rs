//! How the decoder follows a partitioned table's partitions (`source::Partition`). With
//! `publish_via_partition_root = true` pgoutput sends a partition's changes under the
//! partitioned table's name, each partition's first change after an invalidation
//! preceded by the table's Relation message and then the partition's own. Attaching a
//! partition with rows, detaching one, dropping it or emptying it alone changes the
//! table's rows with no row change on the stream: the table is copied again, its writes
//! held until the copy is merged (`recopy`), as for a change of its columns. A partition
//! attached is seen at its first write, from the Relation messages before it (before the
//! write is applied: clients never see its rows one by one); every change of them in the
//! catalog's reading (`catalog`).

use super::decode::{Decoder, Described};
use crate::change::{rebind_to, Change};
use crate::error::ReplicationError;
use source::Partition;

impl Decoder<'_> {
    /// Table `index`'s Relation message (new or repeated) was the last message.
    pub(super) fn described(&mut self, index: usize) {
        let partitioned = self
            .tables
            .get(index)
            .is_some_and(|t| t.partitions.is_some() && !t.gone);
        self.described = Some(if partitioned {
            Described::Partitioned(index)
        } else {
            Described::Other
        });
    }

    /// A Relation message (new or repeated) of relation `oid`, named `qualified`, that the
    /// stream does not follow, right after another (`before`). After one of a followed
    /// partitioned table's, `oid` is one of its partitions, about to have its first change
    /// published under the table's name since the last invalidation: one the stream does
    /// not know was attached since the table's last copy, and the table is copied again
    /// from here on. After any other, it is not followed as a table a wildcard matches
    /// either: it is a partition whose changes come under its table's name, or one of the
    /// tables one TRUNCATE names (the catalog reading follows it then, if it is published
    /// under its own name).
    pub(super) fn partition_described(
        &mut self,
        before: Described,
        oid: u32,
        qualified: &str,
    ) -> Result<Option<Change>, ReplicationError> {
        let Described::Partitioned(root) = before else {
            return Ok(None);
        };
        let Some(known) = self.tables.get(root).and_then(|t| t.partitions.as_ref()) else {
            return Ok(None);
        };
        if known.iter().any(|p| p.oid == oid) {
            return Ok(None);
        }
        let mut partitions = known.clone();
        partitions.push(Partition {
            oid,
            filenode: 0,
            attached: 0,
        });
        partitions.sort_by_key(|p| p.oid);
        self.partitions_at[root] = self.commit_lsn;
        let why = format!("partition {qualified} (OID {oid}) was attached");
        self.repartition(root, partitions, why).map(Some)
    }

    /// How partitioned table `index`'s partitions differ in a catalog reading at `lsn`
    /// (`seen`) from those the stream knows: the ones it has now and why, or `None` when
    /// they are the same, or the stream learned them at or after `lsn`. (A table that is
    /// partitioned now and was not, or the reverse, is another table, with another OID: it
    /// is copied as one created again, and its copy tells what it is.)
    pub(super) fn partitions_changed(
        &self,
        index: usize,
        seen: Option<&[Partition]>,
        lsn: u64,
    ) -> Option<(Vec<Partition>, String)> {
        if self.partitions_at.get(index).is_some_and(|&at| at >= lsn) {
            return None;
        }
        let known = self.tables.get(index)?.partitions.as_deref()?;
        let seen = seen?;
        let why = differences(known, seen)?;
        Some((seen.to_vec(), why))
    }

    /// Table `index` has `partitions` (learned at `lsn`) from here on, as the catalog or
    /// its copy showed them; unless the stream learned them later than that.
    pub(super) fn learn_partitions(
        &mut self,
        index: usize,
        partitions: Option<Vec<Partition>>,
        lsn: u64,
    ) {
        let (Some(table), Some(at)) = (
            self.tables.get_mut(index),
            self.partitions_at.get_mut(index),
        ) else {
            return;
        };
        if *at <= lsn {
            table.partitions = partitions;
            *at = lsn;
        }
    }

    /// Partitioned table `index` has `partitions` now (`why`): its rows are copied again.
    pub(super) fn repartition(
        &mut self,
        index: usize,
        partitions: Vec<Partition>,
        why: String,
    ) -> Result<Change, ReplicationError> {
        let table = &self.tables[index];
        tracing::info!(
            table = %table.qualified(),
            "{why} on the primary; the table is copied again while the stream goes on"
        );
        let change = Change::Relation {
            table: index,
            oid: table.oid,
            identity: table.identity_names.clone(),
            columns: table.columns.clone(),
            repartitioned: Some(partitions),
            recopy: true,
            rekey_from: Vec::new(),
            why,
        };
        rebind_to(&mut self.tables, &change, self.rules)?;
        Ok(change)
    }
}

/// What differs between the partitions a table had (`known`) and has (`seen`), in words;
/// `None` when nothing does. A partition known only from a Relation message (`attached`
/// 0) is the same as any of its OID.
fn differences(known: &[Partition], seen: &[Partition]) -> Option<String> {
    let mut what = Vec::new();
    for p in seen {
        match known.iter().find(|k| k.oid == p.oid) {
            None => what.push(format!("partition OID {} attached", p.oid)),
            Some(k) if k.attached == 0 => {}
            Some(k) if k.attached != p.attached => {
                what.push(format!(
                    "partition OID {} detached and attached again",
                    p.oid
                ));
            }
            Some(k) if k.filenode != p.filenode => {
                what.push(format!("partition OID {} emptied or rewritten", p.oid));
            }
            Some(_) => {}
        }
    }
    for k in known {
        if !seen.iter().any(|p| p.oid == k.oid) {
            what.push(format!("partition OID {} detached or dropped", k.oid));
        }
    }
    (!what.is_empty()).then(|| format!("its partitions changed ({})", what.join(", ")))
}
