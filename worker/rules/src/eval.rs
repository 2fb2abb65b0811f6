//! Row evaluation: one source row → bucket memberships and lookup entries.
//!
//! Columns are converted once per row; each data query writes its `data` JSON string
//! straight into a `String` and hashes it once, whatever the number of buckets.

use std::collections::HashSet;
use std::sync::Arc;

use smallvec::SmallVec;

use super::bucket::{bucket_name, bucket_values, cross_product};
use super::checksum::put_checksum;
use super::error::RulesError;
use super::expr::{json_array_values, Env};
use super::json::{write_data_value, write_json_string, write_key_value};
use super::plan::{
    lookup_key, BucketRow, DataEvaluator, LookupCreator, LookupEntry, LookupKey, ParamFilter,
    Projection, RowEvaluation, RowObject, TablePlan,
};
use super::row::SourceRow;
use super::types::convert;
use super::value::{OwnedValue, Value};

/// A plan's queries bound to one column layout of its source ([`TablePlan::bind`]):
/// their column references point straight at the row's converted values, so a row is
/// evaluated without matching names or copying values per query.
#[derive(Debug, Clone)]
pub struct SlotBinding {
    data: Vec<DataEvaluator>,
    lookups: Vec<LookupCreator>,
    /// The plan's table name, shared by the objects of queries without an output name.
    table: Arc<str>,
    /// Per data query: its output name, shared by every row's object.
    object_types: Vec<Option<Arc<str>>>,
    /// Per data query without bucket parameters: its one bucket's name, built once.
    global_buckets: Vec<Option<String>>,
}

impl SlotBinding {
    /// The `object_type` of data query `index` for a row of `table`.
    fn object_type(&self, index: usize, table: &str) -> Arc<str> {
        match self.object_types.get(index).and_then(Option::as_ref) {
            Some(name) => name.clone(),
            None if *self.table == *table => self.table.clone(),
            None => Arc::from(table),
        }
    }
}

impl TablePlan {
    /// The binding of this plan's column slots to a source's columns, by name.
    pub fn bind<'n>(&self, columns: impl Iterator<Item = &'n str> + Clone) -> SlotBinding {
        let indices = |slots: &[String]| -> Vec<Option<usize>> {
            slots
                .iter()
                .map(|s| columns.clone().position(|c| c == s))
                .collect()
        };
        SlotBinding {
            data: bound(
                &self.data,
                |d| &d.slots,
                DataEvaluator::bind_columns,
                &indices,
            ),
            lookups: bound(
                &self.lookups,
                |l| &l.slots,
                LookupCreator::bind_columns,
                &indices,
            ),
            table: Arc::from(self.table.name.as_str()),
            object_types: self
                .data
                .iter()
                .map(|d| d.object_type.as_deref().map(Arc::from))
                .collect(),
            global_buckets: self
                .data
                .iter()
                .map(|d| {
                    (d.params == 0)
                        .then(|| bucket_name(&d.prefix, &[]))
                        .flatten()
                })
                .collect(),
        }
    }

    /// Evaluate one row: its bucket memberships and lookup entries. An error means a
    /// column value could not be converted faithfully; the caller must not skip the row
    /// silently.
    pub fn evaluate(&self, row: &SourceRow<'_>) -> Result<RowEvaluation, RulesError> {
        let binding = self.bind(row.columns.iter().map(|c| c.name));
        self.evaluate_bound(&binding, row)
    }

    /// [`Self::evaluate`] with a binding made by [`Self::bind`] for the row's columns
    /// (the same names in the same order).
    pub fn evaluate_bound(
        &self,
        binding: &SlotBinding,
        row: &SourceRow<'_>,
    ) -> Result<RowEvaluation, RulesError> {
        // A row's converted values live on the stack (wider rows than 16 columns spill to
        // the heap), as do its few objects and bucket names: a table's rows are evaluated
        // millions of times.
        let mut values: SmallVec<[Value<'_>; 16]> = SmallVec::with_capacity(row.columns.len());
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
        let env = Env {
            row: &values,
            request: None,
        };
        let mut out = RowEvaluation {
            buckets: Vec::with_capacity(binding.data.len()),
            lookups: Vec::new(),
        };
        // The row's distinct objects, and per data query the index of its object (none
        // when the row is in none of its buckets). Indices, not clones: every reference
        // count change is an atomic instruction.
        let mut distinct: SmallVec<[Object; 2]> = SmallVec::new();
        let mut objects: SmallVec<[Option<usize>; 4]> = SmallVec::new();
        let mut names = BucketNames::new();
        for (i, d) in binding.data.iter().enumerate() {
            let global = binding.global_buckets.get(i).and_then(Option::as_deref);
            bucket_names(d, global, env, &mut names);
            let object = if names.is_empty() {
                None
            } else {
                let index = self.object_for(i, d, binding, row, &values, &objects, &mut distinct);
                // An index `object_for` returned: always in `distinct`.
                add_memberships(&distinct[index], names.drain(..), &mut out.buckets);
                Some(index)
            };
            objects.push(object);
        }
        if !binding.lookups.is_empty() {
            let mut seen_keys = HashSet::new();
            for l in &binding.lookups {
                evaluate_lookup(l, env, &mut seen_keys, &mut out.lookups);
            }
        }
        Ok(out)
    }

    /// The index in `distinct` of the row's object for data query `index` (`d`): its
    /// twin's when that one was built (`objects` holds the indices of the queries before
    /// it), otherwise built (and added when no other query built the same).
    #[allow(clippy::too_many_arguments)]
    fn object_for(
        &self,
        index: usize,
        d: &DataEvaluator,
        binding: &SlotBinding,
        row: &SourceRow<'_>,
        values: &[Value<'_>],
        objects: &[Option<usize>],
        distinct: &mut SmallVec<[Object; 2]>,
    ) -> usize {
        let twin = self
            .twins
            .get(index)
            .copied()
            .flatten()
            .and_then(|j| objects.get(j).copied().flatten());
        match twin {
            Some(built) => built,
            None => build_object(
                d,
                binding.object_type(index, row.table),
                row,
                values,
                distinct,
            ),
        }
    }
}

/// Copies of `items` with their column references bound by `bind` to the source columns
/// their `slots` name (`indices`).
fn bound<T: Clone>(
    items: &[T],
    slots: impl Fn(&T) -> &[String],
    bind: impl Fn(&mut T, &[Option<usize>]),
    indices: &dyn Fn(&[String]) -> Vec<Option<usize>>,
) -> Vec<T> {
    items
        .iter()
        .map(|item| {
            let mut copy = item.clone();
            bind(&mut copy, &indices(slots(item)));
            copy
        })
        .collect()
}

/// The bucket names of one data query for one row (usually one).
type BucketNames = SmallVec<[String; 2]>;

/// The buckets data query `d` puts the row in (into `out`, which it clears first);
/// `global` is its bucket's name when it has no parameters.
fn bucket_names(d: &DataEvaluator, global: Option<&str>, env: Env<'_>, out: &mut BucketNames) {
    out.clear();
    let filter = match &d.filter {
        ParamFilter::And(items) if items.len() == 1 => &items[0],
        filter => filter,
    };
    match filter {
        // The common shapes, without building assignment lists: a global bucket (with
        // or without a row filter) and one bucket per value of one row column.
        ParamFilter::Pred(e) if d.params == 0 => {
            if e.eval(env).is_truthy() {
                match global {
                    Some(name) => out.push(name.to_owned()),
                    None => out.extend(bucket_name(&d.prefix, &[])),
                }
            }
        }
        ParamFilter::Param {
            param: 0,
            row,
            expands: false,
        } if d.params == 1 => {
            let v = row.eval(env);
            if !matches!(v, Value::Null | Value::Blob(_)) {
                out.extend(bucket_name(&d.prefix, std::slice::from_ref(&v)));
            }
        }
        filter => {
            for t in param_tuples(filter, env, d.params) {
                out.extend(bucket_name(&d.prefix, &t));
            }
        }
    }
}

/// Adds the memberships of `object` in `buckets`, once per (bucket, object).
fn add_memberships(
    object: &Object,
    buckets: impl Iterator<Item = String>,
    out: &mut Vec<BucketRow>,
) {
    for bucket in buckets {
        let known = out.iter().any(|b| {
            b.bucket == bucket
                && b.object_type == object.object_type
                && b.object_id == object.object_id
        });
        if !known {
            out.push(BucketRow {
                bucket,
                object: object.clone(),
            });
        }
    }
}

/// The row's object for one data query (data JSON, id, output table and checksum),
/// added to `distinct` unless an equal one is there; returns its index.
fn build_object(
    d: &DataEvaluator,
    object_type: Arc<str>,
    row: &SourceRow<'_>,
    values: &[Value<'_>],
    distinct: &mut SmallVec<[Object; 2]>,
) -> usize {
    let env = Env {
        row: values,
        request: None,
    };
    let mut data = String::with_capacity(512);
    data.push('{');
    let mut first = true;
    let mut star_id: Option<Value<'_>> = None;
    for p in &d.projection {
        match p {
            Projection::Star => {
                let underscored = d.star_takes_underscored();
                for (c, v) in row.columns.iter().zip(values) {
                    if (c.name.starts_with('_') && !underscored)
                        || d.explicit.iter().any(|e| e == c.name)
                    {
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
    let object_id = id_value.to_text().unwrap_or_default();
    // Another data query of this row may have built the same object (same columns,
    // different bucket parameters): share it and its checksum.
    if let Some(same) = distinct.iter().position(|o| {
        *o.data == *data && *o.object_id == *object_id && *o.object_type == *object_type
    }) {
        return same;
    }
    let checksum = put_checksum(&object_type, &object_id, &data);
    distinct.push(Arc::new(RowObject {
        object_type,
        object_id: object_id.into(),
        data: data.into_boxed_str(),
        checksum,
    }));
    distinct.len() - 1
}

/// One output object of a row, shared by twin data queries and by every bucket that
/// holds it.
type Object = Arc<RowObject>;

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
    env: Env<'_>,
    seen: &mut HashSet<LookupKey>,
    out: &mut Vec<LookupEntry>,
) {
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
            tuples = cross_product(&tuples, &bucket_values(vals));
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
