//! Per-table plans and row evaluation (replication time, `docs/spec/protocol.md` §7.8).
//!
//! A [`TablePlan`] holds everything the rules do with rows of one source table: the data
//! queries that put the row into buckets and the parameter queries that turn it into lookup
//! entries. Evaluating a row converts its columns once, then writes each `data` JSON string
//! directly (see the `eval` module). Subkeys are not assigned here; the store does that per
//! source row.

use super::bucket::bucket_name;
use super::expr::Expr;
use super::json::write_json_string;
use super::options::Compatibility;
use super::value::{OwnedValue, Value};

/// A source table, as `SyncRules::tables` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableRef {
    /// Schema (`public` when the query did not name one).
    pub schema: String,
    /// Table name.
    pub name: String,
}

impl TableRef {
    /// True for a wildcard table (`todos_%`): it stands for every table of its schema whose
    /// name starts with the part before the final `%`, as the official compiler matches it
    /// (a plain prefix: `_` and other `%` are literal).
    pub fn is_pattern(&self) -> bool {
        self.name.ends_with('%')
    }

    /// True when a table `schema.name` is this table, or one this pattern stands for.
    pub fn matches(&self, schema: &str, name: &str) -> bool {
        if self.schema != schema {
            return false;
        }
        match self.name.strip_suffix('%') {
            Some(prefix) => name.starts_with(prefix),
            None => self.name == name,
        }
    }

    /// The part of `name` after this pattern's prefix (`_table_suffix`); empty for a
    /// plain table.
    pub fn suffix_of<'n>(&self, name: &'n str) -> &'n str {
        match self.name.strip_suffix('%') {
            Some(prefix) => name.get(prefix.len()..).unwrap_or(""),
            None => "",
        }
    }
}

impl std::fmt::Display for TableRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// One output column of a data query.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Projection {
    /// `*`: every source column not starting with `_`, unless an explicit column has its name.
    Star,
    /// `expr AS name`.
    Column {
        /// The output name.
        name: String,
        /// `"name":`, escaped once at compile time.
        key_json: String,
        /// The value.
        expr: Expr,
    },
}

/// How a row's bucket-parameter values are found (data side).
#[derive(Debug, Clone)]
pub(crate) enum ParamFilter {
    /// A row predicate: keeps the row (no parameters) when truthy.
    Pred(Expr),
    /// Parameter `param` takes the row value (or each element of a row JSON array).
    Param {
        /// Index in the bucket parameter list.
        param: usize,
        /// The row value.
        row: Expr,
        /// The row value is a JSON array: one bucket per element.
        expands: bool,
    },
    /// Cross product of the children's assignments.
    And(Vec<ParamFilter>),
    /// Union of the children's assignments.
    Or(Vec<ParamFilter>),
}

/// A data query (or a stream query's data side) compiled for one table.
#[derive(Debug, Clone)]
pub(crate) struct DataEvaluator {
    /// Bucket name prefix including the version (`1#by_user`, `1#tasks|0`).
    pub prefix: String,
    /// The output table name; `None` means the source table name.
    pub object_type: Option<String>,
    /// Source columns read by slot.
    pub slots: Vec<String>,
    /// Output columns, in SELECT order.
    pub projection: Vec<Projection>,
    /// Names of explicit output columns (they win over `*`).
    pub explicit: Vec<String>,
    /// The `id` value: `None` means take `id` from `*`.
    pub id: Option<Expr>,
    /// Bucket parameters of the row.
    pub filter: ParamFilter,
    /// Number of bucket parameters.
    pub params: usize,
    /// A `bucket_definitions` query over a wildcard table: a column named `_table_suffix`
    /// reads the part of the source table's name after the pattern's prefix.
    pub table_suffix: bool,
    /// A stream's query (the official stream evaluator's rules for columns): a selected
    /// column the source row lacks is left out of `data` rather than written as `null`;
    /// from edition 3 on, `*` also takes the columns whose names start with `_`.
    pub stream_columns: Option<StreamColumns>,
}

/// How a stream's query writes columns (see [`DataEvaluator::stream_columns`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamColumns {
    /// `*` takes every column, `_`-prefixed ones too (edition 3).
    pub star_takes_underscored: bool,
}

/// One conjunction of a lookup-producing parameter query.
#[derive(Debug, Clone)]
pub(crate) struct LookupBranch {
    /// The lookup's query id (query index, plus branch index when there are several).
    pub query_id: String,
    /// Row predicates that must hold.
    pub rows: Vec<Expr>,
    /// The row side of each link, and whether it is a JSON array to expand.
    pub links: Vec<(Expr, bool)>,
}

/// A parameter query reading this table, compiled to produce lookup entries.
#[derive(Debug, Clone)]
pub(crate) struct LookupCreator {
    /// The definition or stream (or `$with` for global CTEs) the lookup belongs to.
    pub source: String,
    /// Source columns read by slot.
    pub slots: Vec<String>,
    /// Row-derived output values, stored with each entry.
    pub outputs: Vec<Expr>,
    /// DNF branches.
    pub branches: Vec<LookupBranch>,
}

impl LookupCreator {
    /// True when `other` writes the same lookups (the same source and query ids): a
    /// global CTE read by several streams, or a definition both rules of a deploy hold.
    pub(crate) fn same_lookup(&self, other: &LookupCreator) -> bool {
        self.source == other.source
            && self
                .branches
                .iter()
                .map(|b| &b.query_id)
                .eq(other.branches.iter().map(|b| &b.query_id))
    }
}

/// Identifies a parameter lookup: which query, and the values the row side matched.
///
/// The store keys lookup entries by this (plus the source row); the request side builds the
/// same key from token/parameter values.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LookupKey {
    /// Definition, stream or `$with` name.
    pub source: String,
    /// Query id within the source.
    pub query: String,
    /// The matched values, serialized like bucket parameters (`3` and `3.0` agree).
    pub values: String,
}

impl LookupKey {
    /// A stable byte encoding for storage: the JSON array `[source, query, ...values]`.
    pub fn encode(&self) -> String {
        let mut out =
            String::with_capacity(self.source.len() + self.query.len() + self.values.len() + 8);
        out.push('[');
        write_json_string(&mut out, &self.source);
        out.push(',');
        write_json_string(&mut out, &self.query);
        let inner = self.values.trim_start_matches('[').trim_end_matches(']');
        if !inner.is_empty() {
            out.push(',');
            out.push_str(inner);
        }
        out.push(']');
        out
    }
}

/// Build a lookup key from its values; `None` if a value is a blob.
pub(crate) fn lookup_key(source: &str, query: &str, values: &[Value<'_>]) -> Option<LookupKey> {
    Some(LookupKey {
        source: source.to_string(),
        query: query.to_string(),
        values: bucket_name("", values)?,
    })
}

/// A row's membership in one bucket: what the store turns into a PUT. The object's
/// fields read through it (`b.object_id`, `b.data`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRow {
    /// The full bucket name (with version prefix).
    pub bucket: String,
    /// What the bucket shows: one allocation, and one reference count to move, however
    /// many buckets and twin queries hold it.
    pub object: std::sync::Arc<RowObject>,
}

impl std::ops::Deref for BucketRow {
    type Target = RowObject;

    fn deref(&self) -> &RowObject {
        &self.object
    }
}

/// One output object of a row: what a PUT shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowObject {
    /// Output table name (`object_type` on the wire). Shared by the table's rows.
    pub object_type: std::sync::Arc<str>,
    /// Row id as text (`object_id` on the wire).
    pub object_id: Box<str>,
    /// The exact `data` JSON string.
    pub data: Box<str>,
    /// PUT checksum of `(object_type, object_id, data)`.
    pub checksum: u32,
}

/// A lookup entry the row produces: key → the row's output values for the parameter query.
#[derive(Debug, Clone, PartialEq)]
pub struct LookupEntry {
    /// The lookup key.
    pub key: LookupKey,
    /// Row-derived output values, in the parameter query's output order.
    pub outputs: Vec<OwnedValue>,
}

/// Everything one source row produces.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowEvaluation {
    /// Bucket memberships, unique by `(bucket, object_type, object_id)`.
    pub buckets: Vec<BucketRow>,
    /// Lookup entries, unique by key.
    pub lookups: Vec<LookupEntry>,
}

/// What the rules do with rows of one source table.
#[derive(Debug, Clone)]
pub struct TablePlan {
    pub(crate) table: TableRef,
    pub(crate) compat: Compatibility,
    pub(crate) data: Vec<DataEvaluator>,
    pub(crate) lookups: Vec<LookupCreator>,
    /// For each data evaluator, an earlier one whose output (`object_type`, `id`, data
    /// JSON) is the same for every row: its JSON and checksum are reused, not rebuilt.
    pub(crate) twins: Vec<Option<usize>>,
}

impl ParamFilter {
    /// See [`Expr::each_column`].
    fn each_column(&mut self, f: &mut dyn FnMut(&mut Expr)) {
        match self {
            ParamFilter::Pred(e) | ParamFilter::Param { row: e, .. } => e.each_column(f),
            ParamFilter::And(items) | ParamFilter::Or(items) => {
                items.iter_mut().for_each(|i| i.each_column(f))
            }
        }
    }
}

impl LookupCreator {
    /// See [`Expr::bind_columns`].
    pub(crate) fn bind_columns(&mut self, columns: &[Option<usize>]) {
        self.outputs
            .iter_mut()
            .for_each(|e| e.bind_columns(columns));
        for b in &mut self.branches {
            b.rows.iter_mut().for_each(|e| e.bind_columns(columns));
            b.links
                .iter_mut()
                .for_each(|(e, _)| e.bind_columns(columns));
        }
    }
}

impl DataEvaluator {
    /// See [`Expr::bind_columns`].
    pub(crate) fn bind_columns(&mut self, columns: &[Option<usize>]) {
        if self.stream_columns.is_some() {
            // A stream leaves out a selected column the source lacks.
            self.projection.retain(|p| match p {
                Projection::Column {
                    expr: Expr::Column(slot),
                    ..
                } => columns.get(*slot).copied().flatten().is_some(),
                _ => true,
            });
        }
        self.each_column(&mut |e| e.bind_columns(columns));
    }

    /// True when `*` takes the columns whose names start with `_` too.
    pub(crate) fn star_takes_underscored(&self) -> bool {
        self.stream_columns
            .is_some_and(|s| s.star_takes_underscored)
    }

    /// See [`Expr::each_column`].
    fn each_column(&mut self, f: &mut dyn FnMut(&mut Expr)) {
        for p in &mut self.projection {
            if let Projection::Column { expr, .. } = p {
                expr.each_column(f);
            }
        }
        if let Some(id) = &mut self.id {
            id.each_column(f);
        }
        self.filter.each_column(f);
    }

    /// This evaluator for rows of table `name` read through the wildcard `pattern`: a
    /// `bucket_definitions` query's `_table_suffix` column becomes that table's suffix.
    fn for_table(&self, pattern: &TableRef, name: &str) -> DataEvaluator {
        let mut copy = self.clone();
        let Some(slot) = self
            .table_suffix
            .then(|| self.slots.iter().position(|s| s == "_table_suffix"))
            .flatten()
        else {
            return copy;
        };
        let suffix = Value::Text(pattern.suffix_of(name).to_owned().into());
        copy.each_column(&mut |e| {
            if *e == Expr::Column(slot) {
                *e = Expr::Literal(suffix.clone());
            }
        });
        copy
    }

    /// True when `self` and `other` produce the same object for every row.
    fn same_output(&self, other: &DataEvaluator) -> bool {
        self.object_type == other.object_type
            && self.slots == other.slots
            && self.projection == other.projection
            && self.explicit == other.explicit
            && self.id == other.id
    }
}

impl TablePlan {
    /// A plan of `table` that does nothing yet.
    pub(crate) fn empty(table: TableRef, compat: Compatibility) -> Self {
        TablePlan {
            table,
            compat,
            data: Vec::new(),
            lookups: Vec::new(),
            twins: Vec::new(),
        }
    }

    /// Adds what `wildcard` (the plan of a wildcard table matching this plan's table) does
    /// with its rows.
    pub(crate) fn absorb(&mut self, wildcard: &TablePlan) {
        let name = self.table.name.clone();
        self.data.extend(
            wildcard
                .data
                .iter()
                .map(|d| d.for_table(&wildcard.table, &name)),
        );
        for l in &wildcard.lookups {
            if !self.lookups.iter().any(|x| x.same_lookup(l)) {
                self.lookups.push(l.clone());
            }
        }
        self.find_twins();
    }

    /// Links each data evaluator to the first earlier one with the same output.
    pub(crate) fn find_twins(&mut self) {
        self.twins = (0..self.data.len())
            .map(|i| (0..i).find(|&j| self.data[j].same_output(&self.data[i])))
            .collect();
    }

    /// The table this plan reads.
    pub fn table(&self) -> &TableRef {
        &self.table
    }

    /// True when rows of this table land in buckets (not only in lookups).
    pub fn has_data(&self) -> bool {
        !self.data.is_empty()
    }

    /// True when rows of this table feed parameter lookups.
    pub fn has_lookups(&self) -> bool {
        !self.lookups.is_empty()
    }

    /// True when a source column named `name` can change what this plan produces: a
    /// query reads it by name (output, `id`, filter, parameter), or a data query's `*`
    /// takes it (every column not starting with `_`). Adding, dropping, renaming or
    /// retyping any other column changes nothing the rules produce.
    pub fn reads_column(&self, name: &str) -> bool {
        let by_star = self.data.iter().any(|d| {
            (d.projection.iter().any(|p| matches!(p, Projection::Star))
                && (!name.starts_with('_') || d.star_takes_underscored()))
                || (d.id.is_none() && name == "id")
        });
        by_star
            || self.data.iter().any(|d| d.slots.iter().any(|s| s == name))
            || self
                .lookups
                .iter()
                .any(|l| l.slots.iter().any(|s| s == name))
    }
}

/// `"name":` for an output column, computed once.
pub(crate) fn key_json(name: &str) -> String {
    let mut k = String::with_capacity(name.len() + 3);
    write_json_string(&mut k, name);
    k.push(':');
    k
}
