//! Per-table plans and row evaluation (replication time, spec §7.8).
//!
//! A [`TablePlan`] holds everything the rules do with rows of one source table: the data
//! queries that put the row into buckets and the parameter queries that turn it into lookup
//! entries. Evaluating a row converts its columns once, then writes each `data` JSON string
//! directly. Subkeys are not assigned here; the store does that per source row.

use std::collections::HashSet;

use super::bucket::bucket_name;
use super::checksum::put_checksum;
use super::error::RulesError;
use super::expr::{json_array_values, Env, Expr};
use super::json::{write_data_value, write_json_string, write_key_value};
use super::options::Compatibility;
use super::row::SourceRow;
use super::types::convert;
use super::value::{OwnedValue, Value};

/// A source table, as `SyncRules::tables` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TableRef {
    /// Schema (`public` when the query did not name one).
    pub schema: String,
    /// Table name.
    pub name: String,
}

impl std::fmt::Display for TableRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.name)
    }
}

/// One output column of a data query.
#[derive(Debug, Clone)]
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

/// A row's membership in one bucket: what the store turns into a PUT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketRow {
    /// The full bucket name (with version prefix).
    pub bucket: String,
    /// Output table name (`object_type` on the wire).
    pub object_type: String,
    /// Row id as text (`object_id` on the wire).
    pub object_id: String,
    /// The exact `data` JSON string.
    pub data: String,
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
}

impl TablePlan {
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

    /// Evaluate one row: its bucket memberships and lookup entries. An error means a
    /// column value could not be converted faithfully; the caller must not skip the row
    /// silently.
    pub fn evaluate(&self, row: &SourceRow<'_>) -> Result<RowEvaluation, RulesError> {
        let mut values = Vec::with_capacity(row.columns.len());
        for c in row.columns {
            values.push(match c.value {
                None => Value::Null,
                Some(text) => {
                    convert(c.pg_type, text, &self.compat).map_err(|message| RulesError::Row {
                        table: format!("{}.{}", row.schema, row.table),
                        column: c.name.to_string(),
                        message,
                    })?
                }
            });
        }
        let mut out = RowEvaluation::default();
        let mut seen = HashSet::new();
        for d in &self.data {
            let slots = slot_values(&d.slots, row, &values);
            self.evaluate_data(d, row, &values, &slots, &mut seen, &mut out.buckets);
        }
        let mut seen_keys = HashSet::new();
        for l in &self.lookups {
            let slots = slot_values(&l.slots, row, &values);
            evaluate_lookup(l, &slots, &mut seen_keys, &mut out.lookups);
        }
        Ok(out)
    }

    fn evaluate_data(
        &self,
        d: &DataEvaluator,
        row: &SourceRow<'_>,
        values: &[Value<'_>],
        slots: &[Value<'_>],
        seen: &mut HashSet<(String, String, String)>,
        out: &mut Vec<BucketRow>,
    ) {
        let env = Env {
            row: slots,
            request: None,
        };
        let tuples = param_tuples(&d.filter, env, d.params);
        if tuples.is_empty() {
            return;
        }
        let mut data = String::with_capacity(256);
        data.push('{');
        let mut first = true;
        let mut star_id: Option<Value<'_>> = None;
        for p in &d.projection {
            match p {
                Projection::Star => {
                    for (c, v) in row.columns.iter().zip(values) {
                        if c.name.starts_with('_') || d.explicit.iter().any(|e| e == c.name) {
                            continue;
                        }
                        if c.name == "id" {
                            star_id = Some(v.borrowed());
                        }
                        write_field(&mut data, &mut first, None, c.name, v);
                    }
                }
                Projection::Column {
                    name,
                    key_json,
                    expr,
                } => {
                    let v = expr.eval(env);
                    write_field(&mut data, &mut first, Some(key_json), name, &v);
                }
            }
        }
        data.push('}');
        let id_value = match &d.id {
            Some(e) => e.eval(env),
            None => star_id.unwrap_or(Value::Null),
        };
        let object_id = id_value
            .to_text()
            .map(|t| t.into_owned())
            .unwrap_or_default();
        let object_type = d
            .object_type
            .clone()
            .unwrap_or_else(|| row.table.to_string());
        let checksum = put_checksum(&object_type, &object_id, &data);
        for t in tuples {
            let Some(bucket) = bucket_name(&d.prefix, &t) else {
                continue;
            };
            if seen.insert((bucket.clone(), object_type.clone(), object_id.clone())) {
                out.push(BucketRow {
                    bucket,
                    object_type: object_type.clone(),
                    object_id: object_id.clone(),
                    data: data.clone(),
                    checksum,
                });
            }
        }
    }
}

fn write_field(
    out: &mut String,
    first: &mut bool,
    key_json: Option<&String>,
    name: &str,
    v: &Value<'_>,
) {
    if matches!(v, Value::Blob(_)) {
        return;
    }
    if !*first {
        out.push(',');
    }
    *first = false;
    match key_json {
        Some(k) => out.push_str(k),
        None => {
            write_json_string(out, name);
            out.push(':');
        }
    }
    write_data_value(out, v);
}

/// `"name":` for an output column, computed once.
pub(crate) fn key_json(name: &str) -> String {
    let mut k = String::with_capacity(name.len() + 3);
    write_json_string(&mut k, name);
    k.push(':');
    k
}

fn slot_values<'e>(
    slots: &[String],
    row: &SourceRow<'_>,
    values: &'e [Value<'e>],
) -> Vec<Value<'e>> {
    slots
        .iter()
        .map(|s| {
            row.columns
                .iter()
                .position(|c| c.name == s)
                .and_then(|i| values.get(i))
                .map(|v| v.borrowed())
                .unwrap_or(Value::Null)
        })
        .collect()
}

/// The complete bucket-parameter tuples a row produces.
fn param_tuples<'e>(f: &'e ParamFilter, env: Env<'e>, n: usize) -> Vec<Vec<Value<'e>>> {
    let partial = assignments(f, env, n);
    let mut out: Vec<Vec<Value<'e>>> = Vec::new();
    for a in partial {
        if a.iter().all(Option::is_some) {
            let t: Vec<Value<'e>> = a.into_iter().flatten().collect();
            if !out.contains(&t) {
                out.push(t);
            }
        }
    }
    out
}

type Assignment<'e> = Vec<Option<Value<'e>>>;

fn assignments<'e>(f: &'e ParamFilter, env: Env<'e>, n: usize) -> Vec<Assignment<'e>> {
    match f {
        ParamFilter::Pred(e) => {
            if e.eval(env).is_truthy() {
                vec![vec![None; n]]
            } else {
                vec![]
            }
        }
        ParamFilter::Param {
            param,
            row,
            expands,
        } => {
            let v = row.eval(env);
            let values: Vec<Value<'e>> = if *expands {
                json_array_values(&v).unwrap_or_default()
            } else {
                vec![v]
            };
            values
                .into_iter()
                .filter(|v| !matches!(v, Value::Null | Value::Blob(_)))
                .map(|v| {
                    let mut a = vec![None; n];
                    if let Some(slot) = a.get_mut(*param) {
                        *slot = Some(v);
                    }
                    a
                })
                .collect()
        }
        ParamFilter::Or(items) => items.iter().flat_map(|i| assignments(i, env, n)).collect(),
        ParamFilter::And(items) => {
            let mut acc: Vec<Assignment<'e>> = vec![vec![None; n]];
            for i in items {
                let next = assignments(i, env, n);
                let mut combined = Vec::new();
                for a in &acc {
                    'next: for b in &next {
                        let mut m = a.clone();
                        for (slot, v) in m.iter_mut().zip(b) {
                            if let Some(v) = v {
                                match slot {
                                    Some(existing) if !same_key(existing, v) => continue 'next,
                                    _ => *slot = Some(v.clone()),
                                }
                            }
                        }
                        combined.push(m);
                    }
                }
                acc = combined;
                if acc.is_empty() {
                    break;
                }
            }
            acc
        }
    }
}

fn same_key(a: &Value<'_>, b: &Value<'_>) -> bool {
    let (mut x, mut y) = (String::new(), String::new());
    write_key_value(&mut x, a) && write_key_value(&mut y, b) && x == y
}

fn evaluate_lookup(
    l: &LookupCreator,
    slots: &[Value<'_>],
    seen: &mut HashSet<LookupKey>,
    out: &mut Vec<LookupEntry>,
) {
    let env = Env {
        row: slots,
        request: None,
    };
    for b in &l.branches {
        if !b.rows.iter().all(|e| e.eval(env).is_truthy()) {
            continue;
        }
        let mut tuples: Vec<Vec<Value<'_>>> = vec![Vec::new()];
        for (e, expands) in &b.links {
            let v = e.eval(env);
            let vals: Vec<Value<'_>> = if *expands {
                json_array_values(&v).unwrap_or_default()
            } else {
                vec![v]
            };
            let vals: Vec<Value<'_>> = vals
                .into_iter()
                .filter(|v| !matches!(v, Value::Null | Value::Blob(_)))
                .collect();
            let mut next = Vec::new();
            for t in &tuples {
                for v in &vals {
                    let mut t2 = t.clone();
                    t2.push(v.clone());
                    next.push(t2);
                }
            }
            tuples = next;
        }
        if tuples.is_empty() {
            continue;
        }
        let outputs: Vec<OwnedValue> = l.outputs.iter().map(|e| e.eval(env).into_owned()).collect();
        for t in tuples {
            if let Some(key) = lookup_key(&l.source, &b.query_id, &t) {
                if seen.insert(key.clone()) {
                    out.push(LookupEntry {
                        key,
                        outputs: outputs.clone(),
                    });
                }
            }
        }
    }
}
