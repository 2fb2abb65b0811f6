//! How the decoder follows the tables' shape on the primary: a Relation message or a
//! catalog reading compared with the columns and replica identity it knows (a change the
//! rules see starts the table's re-copy), a table missing under its name, and gone once
//! missing for long enough.

use std::time::Instant;

use super::decode::{Decoder, Described};
use crate::catalog::CatalogTable;
use crate::change::{rebind_to, Change};
use crate::error::{stream_error, ReplicationError};
use crate::table::StreamTable;
use rules::SyncRules;
use source::{ColumnMeta, Partition, Relation, SourceTable};

impl Decoder<'_> {
    /// A Relation message for a table the rules read: it must be the table of that name.
    /// When it changed, returns the change to hand the applier: the columns (and replica
    /// identity) to decode its rows with from here on, and whether its rows are copied
    /// again (a column the rules read added, dropped, renamed or retyped; the table
    /// created again; its replica identity changed).
    ///
    /// One of a relation the stream does not follow that comes right after another
    /// Relation message (`before`) is a partition's (see `partitions`).
    pub(super) fn check_relation(
        &mut self,
        relation: &Relation,
        before: Option<Described>,
    ) -> Result<Option<Change>, ReplicationError> {
        let qualified = relation.qualified();
        let index = match (self.by_oid.get(&relation.oid), self.by_name.get(&qualified)) {
            (None, None) => {
                self.described = Some(Described::Other);
                return match before {
                    Some(before) => self.partition_described(before, relation.oid, &qualified),
                    None => self.added(relation),
                };
            }
            (Some(&i), _) | (None, Some(&i)) => i,
        };
        self.described_at[index] = self.commit_lsn;
        self.described(index);
        // Its tuples may list the columns otherwise now.
        self.layouts[index] = None;
        let (shape, identity) = relation_shape(relation);
        self.check_shape(index, relation.oid, &qualified, &shape, identity, None)
    }

    /// A Relation message of relation `oid` the same as its last (see
    /// [`Self::check_relation`]).
    pub(super) fn redescribed(
        &mut self,
        oid: u32,
        before: Option<Described>,
    ) -> Result<Option<Change>, ReplicationError> {
        if let Some(&index) = self.by_oid.get(&oid) {
            self.described(index);
            return Ok(None);
        }
        self.described = Some(Described::Other);
        let Some(before) = before else {
            return Ok(None);
        };
        let qualified = self
            .pgoutput
            .relation(oid)
            .map_or_else(|| format!("OID {oid}"), source::Relation::qualified);
        self.partition_described(before, oid, &qualified)
    }

    /// A Relation message for a table the stream does not follow yet: see [`Self::follow`].
    fn added(&mut self, relation: &Relation) -> Result<Option<Change>, ReplicationError> {
        let (columns, identity) = relation_shape(relation);
        let columns = rebound_columns(&[], &columns);
        let name = (relation.namespace.as_str(), relation.name.as_str());
        self.follow(name, relation.oid, identity, (columns, None))
    }

    /// A published table the catalog shows that the stream does not follow yet: see
    /// [`Self::follow`].
    pub(super) fn added_in_catalog(
        &mut self,
        table: &SourceTable,
        seen: &CatalogTable,
    ) -> Result<Option<Change>, ReplicationError> {
        if self
            .by_name
            .contains_key(&format!("{}.{}", table.schema, table.name))
        {
            return Ok(None);
        }
        let name = (table.schema.as_str(), table.name.as_str());
        let shape = (seen.columns.clone(), seen.partitions.clone());
        self.follow(name, seen.oid, seen.identity.clone(), shape)
    }

    /// A table `schema.name` the stream does not follow yet (OID `oid`, replica identity
    /// `identity`, rows of `columns`, `partitions` when the catalog showed them): when the
    /// rules read it through a wildcard table
    /// (`todos_%`), it is followed from here on and its rows are copied (those written
    /// before may predate the slot's position, or the table's place in the publication),
    /// as a table created again is.
    fn follow(
        &mut self,
        (schema, name): (&str, &str),
        oid: u32,
        identity: Vec<String>,
        (columns, partitions): (Vec<ColumnMeta>, Option<Vec<Partition>>),
    ) -> Result<Option<Change>, ReplicationError> {
        if !self.rules.reads_by_wildcard(schema, name) {
            return Ok(None);
        }
        let qualified = format!("{schema}.{name}");
        if identity.is_empty() {
            return Err(ReplicationError::Stream {
                code: "PSM_R2012",
                message: format!(
                    "table {qualified} is new on the primary and the sync rules read it through \
                     a wildcard table, but it has no replica identity (no primary key): its \
                     updates and deletes cannot be followed. Nothing of it was applied; give it \
                     a primary key (or ALTER TABLE … REPLICA IDENTITY FULL), or rename it out \
                     of the wildcard's prefix"
                ),
                operator: true,
            });
        }
        let store_id = self.tables.iter().map(|t| t.store_id).max().unwrap_or(0) + 1;
        let table = StreamTable::added(
            store_id,
            oid,
            (schema, name),
            identity,
            columns,
            partitions,
            self.rules,
        )
        .ok_or_else(|| {
            stream_error(format!(
                "new table {qualified}: a key column is not published"
            ))
        })?;
        let index = self.tables.len();
        self.tables.push(table.clone());
        self.by_oid.insert(oid, index);
        self.by_name.insert(qualified.clone(), index);
        self.layouts.push(None);
        self.described_at.push(self.commit_lsn);
        self.partitions_at.push(self.commit_lsn);
        tracing::info!(
            table = %qualified,
            "a new table the sync rules read through a wildcard table; it is followed from \
             here on and its rows are copied while the stream goes on"
        );
        Ok(Some(Change::Added {
            index,
            table: Box::new(table),
        }))
    }

    /// The catalog's view of covered table `index` at LSN `lsn` (see `catalog`), applied
    /// like a Relation message once every transaction committed before `lsn` was decoded;
    /// not when a Relation message of a transaction committed after `lsn` described the
    /// table since (the stream knows a later shape: going back to the catalog's would
    /// decode the next rows with old columns).
    pub(super) fn check_catalog(
        &mut self,
        index: usize,
        table: Option<&CatalogTable>,
        lsn: u64,
    ) -> Result<Option<Change>, ReplicationError> {
        if index >= self.tables.len() {
            return Ok(None);
        }
        // What the stream knows of a table's partitions comes from no Relation message.
        let repartitioned =
            table.and_then(|t| self.partitions_changed(index, t.partitions.as_deref(), lsn));
        if repartitioned.is_some() {
            self.partitions_at[index] = lsn;
        }
        if self.described_at.get(index).is_some_and(|&at| at >= lsn) {
            return match repartitioned {
                Some((partitions, why)) => self.repartition(index, partitions, why).map(Some),
                None => Ok(None),
            };
        }
        let Some(table) = table else {
            self.missing(
                index,
                "it is no longer published under its name (renamed, dropped, or taken out of \
                 the publication)",
            );
            return Ok(None);
        };
        let qualified = self.tables[index].qualified();
        let shape: Vec<Column<'_>> = table
            .columns
            .iter()
            .map(|c| (c.name.as_str(), c.type_oid, c.attnum))
            .collect();
        let identity = table.identity.clone();
        self.check_shape(
            index,
            table.oid,
            &qualified,
            &shape,
            identity,
            repartitioned,
        )
    }

    /// Compares table `index` with what the primary says it is now: OID `oid`, name
    /// `qualified`, columns (see [`Column`]) and replica `identity`; `repartitioned`: its
    /// partitions changed (the ones it has now, and how).
    fn check_shape(
        &mut self,
        index: usize,
        oid: u32,
        qualified: &str,
        columns: &[Column<'_>],
        identity: Vec<String>,
        repartitioned: Option<(Vec<Partition>, String)>,
    ) -> Result<Option<Change>, ReplicationError> {
        let known = &self.tables[index];
        if known.qualified() != qualified {
            self.missing(index, &format!("it was renamed to {qualified}"));
            return Ok(None);
        }
        let mut problems = Vec::new();
        // Dropped and created again under its name (and published again), or published
        // under its name again after it was gone: its rows are copied from the table now.
        let returned = known.gone || self.missing_since.contains_key(&index);
        let recreated = known.oid != oid || returned;
        let now: Vec<Column<'_>> = columns.to_vec();
        let shape = &known.columns;
        let then: Vec<Column<'_>> = shape
            .iter()
            .map(|c| (c.name.as_str(), c.type_oid, c.attnum))
            .collect();
        let seen = changed_columns_read(self.rules, known, &now, &then);
        let mut keys_now: Vec<&str> = identity.iter().map(String::as_str).collect();
        let mut keys_then: Vec<&str> = known.identity_names.iter().map(String::as_str).collect();
        keys_now.sort_unstable();
        keys_then.sort_unstable();
        let rekeyed = keys_now != keys_then;
        if rekeyed && keys_now.is_empty() {
            problems.push(
                "its replica identity is NOTHING now (updates and deletes cannot be followed)"
                    .to_owned(),
            );
        }
        let recopy = !seen.is_empty() || recreated || rekeyed || repartitioned.is_some();
        if !problems.is_empty() {
            return Err(changed_after_snapshot(known, &problems));
        }
        let unchanged =
            now.len() == then.len() && now.iter().zip(&then).all(|(n, t)| same_column(n, t));
        if unchanged && !recreated && !rekeyed && repartitioned.is_none() {
            self.learn_attnums(index, columns.iter().map(|c| (c.0, c.1, c.2)));
            return Ok(None);
        }
        let rebound = rebound_columns(shape, columns);
        let (repartitioned, partitions_why) = match repartitioned {
            Some((partitions, why)) => (Some(partitions), why),
            None => (None, String::new()),
        };
        let why = if returned {
            self.missing_since.remove(&index);
            self.by_oid.insert(oid, index);
            format!("a table of this name is published again (OID {oid})")
        } else if recreated {
            let old = known.oid;
            self.by_oid.remove(&old);
            self.by_oid.insert(oid, index);
            format!("the table was dropped and created again (OID {old} → {oid})")
        } else if rekeyed {
            format!(
                "its replica identity changed from ({}) to ({})",
                keys_then.join(", "),
                keys_now.join(", ")
            )
        } else if seen.is_empty() && recopy {
            partitions_why
        } else if recopy {
            let mut names = seen;
            names.sort_unstable();
            names.dedup();
            format!(
                "columns the sync rules read changed: {} (from ({}) to ({}))",
                names.join(", "),
                describe(&then),
                describe(&now)
            )
        } else {
            String::new()
        };
        log_shape_change(&self.tables[index].qualified(), recopy, &why);
        let change = Change::Relation {
            table: index,
            oid,
            identity,
            columns: rebound,
            repartitioned,
            recopy,
            rekey_from: if rekeyed {
                self.tables[index].identity_names.clone()
            } else {
                Vec::new()
            },
            why,
        };
        rebind_to(&mut self.tables, &change, self.rules)?;
        // Its columns (their order, say) are the new ones from here on.
        self.layouts[index] = None;
        Ok(Some(change))
    }

    /// Table `index` is missing from the primary under its name (`why`): its changes are no
    /// longer followed; its rows stay served for `gone_after` (a migration that swaps or
    /// recreates the table in several transactions leaves no window of missing rows), then
    /// leave the buckets ([`Self::due_gone`]), as a replica started now would not find it.
    /// A table published under its name again is copied.
    fn missing(&mut self, index: usize, why: &str) {
        let table = &self.tables[index];
        if table.gone || self.missing_since.contains_key(&index) {
            return;
        }
        tracing::warn!(
            table = %table.qualified(),
            "the sync rules read this table, but {why}: its changes are not followed; unless a \
             table of this name is published again within {} s its rows leave the buckets (the \
             other tables stream on). Point the sync rules at its new name and deploy them, or \
             publish a table of this name again (it is then copied)",
            self.gone_after.as_secs()
        );
        if self.by_oid.get(&table.oid) == Some(&index) {
            self.by_oid.remove(&table.oid);
        }
        self.missing_since.insert(index, Instant::now());
    }

    /// Notes where the columns of table `index` sit (`(name, type, attnum)` as the catalog
    /// or a re-copy's snapshot saw them) where a Relation message left it unknown, so that
    /// one of them dropped and added again shows in the next catalog reading.
    pub(super) fn learn_attnums<'c>(
        &mut self,
        index: usize,
        seen: impl IntoIterator<Item = (&'c str, u32, i16)>,
    ) {
        let Some(table) = self.tables.get_mut(index) else {
            return;
        };
        for (name, type_oid, attnum) in seen {
            if let Some(column) = table
                .columns
                .iter_mut()
                .find(|c| c.attnum == 0 && c.name == name && c.type_oid == type_oid)
            {
                column.attnum = attnum;
            }
        }
    }

    /// When the next missing table is due to be gone.
    pub(super) fn next_gone_at(&self) -> Option<Instant> {
        self.missing_since
            .values()
            .min()
            .map(|since| *since + self.gone_after)
    }

    /// The tables missing for `gone_after` by `now`: gone, their rows leave the buckets.
    pub(super) fn due_gone(&mut self, now: Instant) -> Vec<Change> {
        let gone_after = self.gone_after;
        let due: Vec<usize> = self
            .missing_since
            .iter()
            .filter(|(_, since)| **since + gone_after <= now)
            .map(|(&index, _)| index)
            .collect();
        due.into_iter()
            .map(|index| {
                self.missing_since.remove(&index);
                self.tables[index].gone = true;
                Change::Gone { table: index }
            })
            .collect()
    }
}

/// A Relation message's columns (attnum 0: pgoutput does not say where a column sits) and
/// replica identity.
fn relation_shape(relation: &Relation) -> (Vec<Column<'_>>, Vec<String>) {
    let columns = relation
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.type_oid, 0))
        .collect();
    let identity = relation
        .columns
        .iter()
        .filter(|c| c.is_key)
        .map(|c| c.name.clone())
        .collect();
    (columns, identity)
}

/// A column as the primary describes it: name, type OID and attnum (0 when the message
/// does not say: a Relation message).
type Column<'a> = (&'a str, u32, i16);

/// The same column: its name and type, and its attnum where both sides know it (a column
/// dropped and added again under its name and type has a new attnum, and new values).
fn same_column(a: &Column<'_>, b: &Column<'_>) -> bool {
    a.0 == b.0 && a.1 == b.1 && (a.2 == 0 || b.2 == 0 || a.2 == b.2)
}

fn describe(columns: &[Column<'_>]) -> String {
    columns
        .iter()
        .map(|(name, oid, _)| format!("{name} oid {oid}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns the rules read (of table `known`) that were added, dropped (a rename is
/// both) or retyped between `then` and `now`.
fn changed_columns_read<'c>(
    rules: &SyncRules,
    known: &StreamTable,
    now: &[Column<'c>],
    then: &[Column<'c>],
) -> Vec<&'c str> {
    let plan = rules.plan_for(&known.schema, &known.name);
    let read = |column: &str| plan.as_ref().is_some_and(|p| p.reads_column(column));
    // Added, dropped (a rename is both) or retyped columns the rules read.
    now.iter()
        .filter(|c| !then.iter().any(|t| same_column(c, t)))
        .chain(
            then.iter()
                .filter(|c| !now.iter().any(|n| same_column(c, n))),
        )
        .map(|(name, _, _)| *name)
        .filter(|name| read(name))
        .collect()
}

/// Table `known` changed on the primary in a way the stream cannot follow (`problems`).
fn changed_after_snapshot(known: &StreamTable, problems: &[String]) -> ReplicationError {
    ReplicationError::Stream {
        code: "PSM_R2002",
        message: format!(
            "table {} changed on the primary after the snapshot: {}. Nothing of it \
             was applied and the stored rows stay as they were; give it a replica \
             identity again (ALTER TABLE … REPLICA IDENTITY DEFAULT), then run \
             SELECT powersync_mdbx.reset() to take a new snapshot",
            known.qualified(),
            problems.join("; ")
        ),
        operator: true,
    }
}

/// The table's columns as the primary describes them now, with what `shape` (the columns
/// known so far) knows of each same-named, same-typed one.
fn rebound_columns(shape: &[ColumnMeta], columns: &[Column<'_>]) -> Vec<ColumnMeta> {
    columns
        .iter()
        .map(|&(name, type_id, attnum)| {
            let known = shape
                .iter()
                .find(|s| s.name == name && s.type_oid == type_id);
            match known {
                Some(known) => ColumnMeta {
                    attnum: if attnum != 0 { attnum } else { known.attnum },
                    ..known.clone()
                },
                None => ColumnMeta {
                    name: name.to_owned(),
                    type_oid: type_id,
                    element_oid: None,
                    // Unknown here: counted as variable length (may be TOASTed).
                    typlen: -1,
                    attnum,
                },
            }
        })
        .collect()
}

/// Logs a change of `table`'s columns: copied again for `why`, or only decoded otherwise.
fn log_shape_change(table: &str, recopy: bool, why: &str) {
    if recopy {
        tracing::info!(
            table = %table,
            "{why} on the primary; the table is copied again while the stream goes on"
        );
    } else {
        tracing::info!(
            table = %table,
            "columns the sync rules do not read changed on the primary; rows are \
             decoded with the new columns"
        );
    }
}
