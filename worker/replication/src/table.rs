//! A covered table as the stream decodes and applies it: its current columns, replica
//! identity and the rules' plan bound to those columns; looked up by index, rebound when
//! its columns change.

use std::sync::Arc;

use crate::error::{stream_error, ReplicationError};
use crate::intent::IntentTable;
use rules::{
    PgType, RowEvaluation, RulesError, SlotBinding, SourceColumn, SourceRow, SyncRules, TablePlan,
};
use smallvec::SmallVec;
use source::{ColumnMeta, Partition};

/// A table as the stream applies it.
#[derive(Debug, Clone)]
pub(super) struct StreamTable {
    pub store_id: u32,
    /// OID on the primary.
    pub oid: u32,
    /// Replica identity column names (as the snapshot saw them).
    pub identity_names: Vec<String>,
    pub schema: String,
    pub name: String,
    /// The columns rows come with now (the snapshot's, then each Relation message's).
    pub columns: Vec<ColumnMeta>,
    types: Vec<PgType>,
    /// Indices (into `columns`) of the replica identity, in key order.
    identity: Vec<usize>,
    /// Per column: whether the rules read it (a value of a column they do not read
    /// cannot change their output).
    reads: Vec<bool>,
    /// The rules' plan for the table bound to `columns`, made once per shape (`None`:
    /// the rules ignore the table).
    plan: Option<Arc<BoundPlan>>,
    /// Gone from the primary under its name (see [`IntentTable::gone`]).
    pub gone: bool,
    /// A partitioned table's partitions as the stream knows them (see
    /// [`IntentTable::partitions`]; `None`: not partitioned).
    pub partitions: Option<Vec<Partition>>,
}

/// A table's plan with its column slots bound to one column layout: a row is evaluated
/// without matching names per row.
#[derive(Debug)]
struct BoundPlan {
    plan: TablePlan,
    binding: SlotBinding,
}

impl StreamTable {
    /// The table from the bootstrap record; `None` when the record predates column
    /// tracking or names an identity column the table lacks.
    pub fn from_intent(table: &IntentTable, rules: &SyncRules) -> Option<Self> {
        if table.columns.is_empty() || table.identity.is_empty() || table.oid == 0 {
            return None;
        }
        Self {
            store_id: table.id,
            oid: table.oid,
            identity_names: table.identity.clone(),
            schema: table.schema.clone(),
            name: table.name.clone(),
            columns: Vec::new(),
            types: Vec::new(),
            identity: Vec::new(),
            reads: Vec::new(),
            plan: None,
            gone: table.gone,
            partitions: table.partitions.clone(),
        }
        .with_columns(table.columns.clone(), rules)
    }

    /// A table the stream meets for the first time (see `stream::shape`): `schema.name`,
    /// with OID `oid`, replica identity `identity`, rows of `columns` and `partitions` (as
    /// the catalog showed them, or `None` from a Relation message: its copy tells), stored
    /// as `store_id`; `None` when an identity column is not among `columns`.
    pub fn added(
        store_id: u32,
        oid: u32,
        (schema, name): (&str, &str),
        identity: Vec<String>,
        columns: Vec<ColumnMeta>,
        partitions: Option<Vec<Partition>>,
        rules: &SyncRules,
    ) -> Option<Self> {
        Self {
            store_id,
            oid,
            identity_names: identity,
            schema: schema.to_owned(),
            name: name.to_owned(),
            columns: Vec::new(),
            types: Vec::new(),
            identity: Vec::new(),
            reads: Vec::new(),
            plan: None,
            gone: false,
            partitions,
        }
        .with_columns(columns, rules)
    }

    /// This table with rows of `columns`; `None` when a replica identity column is not
    /// among them.
    pub fn with_columns(&self, columns: Vec<ColumnMeta>, rules: &SyncRules) -> Option<Self> {
        let identity = self
            .identity_names
            .iter()
            .map(|name| columns.iter().position(|c| &c.name == name))
            .collect::<Option<Vec<usize>>>()?;
        let types = columns
            .iter()
            .map(|c| PgType {
                oid: c.type_oid,
                element: c.element_oid.or(PgType::from_oid(c.type_oid).element),
            })
            .collect();
        let plan = rules.plan_for(&self.schema, &self.name);
        let reads = columns
            .iter()
            .map(|c| plan.as_ref().is_some_and(|p| p.reads_column(&c.name)))
            .collect();
        let plan = plan.map(|plan| {
            Arc::new(BoundPlan {
                binding: plan.bind(columns.iter().map(|c| c.name.as_str())),
                plan: plan.into_owned(),
            })
        });
        Some(Self {
            columns,
            types,
            identity,
            reads,
            plan,
            ..self.clone()
        })
    }

    /// Evaluates a row of this shape with the rules it was shaped by; `value(i)`: the
    /// value of column `i`, its text checked as UTF-8.
    pub fn evaluate<'v>(
        &self,
        value: impl Fn(usize) -> Option<&'v str>,
    ) -> Result<RowEvaluation, RulesError> {
        let Some(bound) = &self.plan else {
            return Ok(RowEvaluation::default());
        };
        let columns: SmallVec<[SourceColumn<'_>; 16]> = self
            .columns
            .iter()
            .zip(&self.types)
            .enumerate()
            .map(|(i, (c, t))| SourceColumn {
                name: &c.name,
                pg_type: *t,
                value: value(i),
            })
            .collect();
        let row = SourceRow {
            schema: &self.schema,
            table: &self.name,
            columns: &columns,
        };
        bound.plan.evaluate_bound(&bound.binding, &row)
    }

    /// Indices (into `columns`) of the replica identity, in key order.
    #[inline]
    pub fn identity_columns(&self) -> &[usize] {
        &self.identity
    }

    /// Whether the rules read column `i` (`None`: no such column).
    #[inline]
    pub fn reads_at(&self, i: usize) -> Option<bool> {
        self.reads.get(i).copied()
    }

    pub fn qualified(&self) -> String {
        format!("{}.{}", self.schema, self.name)
    }

    /// The table as the source names it.
    pub fn source(&self) -> source::SourceTable {
        source::SourceTable {
            schema: self.schema.clone(),
            name: self.name.clone(),
        }
    }
}

/// Rows of `tables[index]` come with `columns` (from the table with OID `oid`: another one
/// when the table was dropped and created again) from here on, and its partitions are
/// `repartitioned` when they changed (the decoder's and the applier's copies of the tables
/// both follow Relation changes through it).
pub(super) fn rebind(
    tables: &mut [StreamTable],
    index: usize,
    oid: u32,
    identity: Vec<String>,
    columns: Vec<ColumnMeta>,
    repartitioned: Option<Vec<Partition>>,
    rules: &SyncRules,
) -> Result<(), ReplicationError> {
    let table = table_at(tables, index)?;
    let renamed = StreamTable {
        identity_names: identity,
        ..table.clone()
    };
    let mut rebound = renamed.with_columns(columns, rules).ok_or_else(|| {
        stream_error(format!(
            "a Relation message of {} left out a replica identity column",
            table.qualified()
        ))
    })?;
    rebound.oid = oid;
    rebound.gone = false;
    if repartitioned.is_some() {
        rebound.partitions = repartitioned;
    }
    tables[index] = rebound;
    Ok(())
}

pub(super) fn table_at(
    tables: &[StreamTable],
    index: usize,
) -> Result<&StreamTable, ReplicationError> {
    tables
        .get(index)
        .ok_or_else(|| stream_error(format!("a change for unknown table #{index}")))
}

/// The positions in `table`'s columns of identity columns `names`; `None` when there are
/// none or one is gone.
pub(super) fn key_columns(table: &StreamTable, names: &[String]) -> Option<Vec<usize>> {
    if names.is_empty() {
        return None;
    }
    names
        .iter()
        .map(|name| table.columns.iter().position(|c| &c.name == name))
        .collect()
}
