//! Lookup groups: the request side of parameter queries (a group yields parameter rows for
//! a request), the [`LookupReader`] that answers table groups, and the rows of a resolver's
//! groups for one request and the ways to combine them.
//!
//! A group's rows come from the request (static and `json_each` groups) or from the lookup
//! reader (table groups). A table group whose links read an earlier group (a nested
//! subquery, a joined table) is looked up once per row of that group, and each of its rows
//! remembers the row it came from. Combining the groups takes one row of each, and a row
//! only together with the rows it came from: values of one source row stay together, as in
//! the official evaluator's provenance, so a request never gets a bucket that no chain of
//! rows leads to.

use super::bucket::{bucket_values, cross_product};
use super::error::RulesError;
use super::expr::{json_array_values, Env};
use super::json::write_key_value;
use super::plan::{lookup_key, LookupKey};
use std::collections::HashMap;

use super::expr::Expr;
use super::plan::LookupEntry;
use super::value::{OwnedValue, Value};

/// Answers lookup keys with the output rows stored for them at the checkpoint being served.
///
/// The store implements this over its parameter index; each returned row is the `outputs`
/// of one live [`LookupEntry`].
pub trait LookupReader {
    /// All output rows currently stored under `key`.
    fn lookup(&self, key: &LookupKey) -> Result<Vec<Vec<OwnedValue>>, RulesError>;
}

/// An in-memory [`LookupReader`] for tests and the CLI.
#[derive(Debug, Clone, Default)]
pub struct InMemoryLookups {
    entries: HashMap<LookupKey, Vec<Vec<OwnedValue>>>,
}

impl InMemoryLookups {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add entries a row produced (as `TablePlan::evaluate` returned them).
    pub fn insert(&mut self, entries: impl IntoIterator<Item = LookupEntry>) {
        for e in entries {
            self.entries.entry(e.key).or_default().push(e.outputs);
        }
    }
}

impl LookupReader for InMemoryLookups {
    fn lookup(&self, key: &LookupKey) -> Result<Vec<Vec<OwnedValue>>, RulesError> {
        Ok(self.entries.get(key).cloned().unwrap_or_default())
    }
}

/// What a lookup's link compares the row with at request time.
#[derive(Debug, Clone)]
pub(crate) enum LinkInput {
    /// A request expression.
    Request(Expr),
    /// Column `output` of an earlier lookup group's row (a nested subquery or a joined
    /// table): the lookup is read once per row of that group, and its rows remember it.
    Group { group: usize, output: usize },
}

/// One branch of a lookup query, request side.
#[derive(Debug, Clone)]
pub(crate) struct RequestBranch {
    pub query_id: String,
    pub requests: Vec<Expr>,
    /// Request side of each link, and whether it expands.
    pub links: Vec<(LinkInput, bool)>,
}

/// A source of parameter rows at request time.
#[derive(Debug, Clone)]
pub(crate) enum LookupGroup {
    /// A static query: one row of request outputs if the filter holds.
    Static {
        outputs: Vec<Expr>,
        filter: Vec<Expr>,
    },
    /// `FROM json_each(<request array>)`: one row per array element (slot 0 = `value`).
    Each {
        array: Expr,
        outputs: Vec<Expr>,
        filter: Vec<Expr>,
    },
    /// A table query: rows from the lookup reader; `request_outputs` fill output columns
    /// that come from the request rather than the row (by position in `row_width + i`).
    Table {
        source: String,
        branches: Vec<RequestBranch>,
        request_outputs: Vec<Expr>,
    },
}

/// Fail a request whose bucket set (or an intermediate product) exceeds `max`, so hostile
/// parameters cannot make the server build millions of names.
pub(crate) fn check_limit(n: usize, max: usize) -> Result<(), RulesError> {
    if n > max {
        return Err(RulesError::Request {
            message: format!(
                "the request resolves to more than {max} buckets; reduce its parameters or subscriptions \
                 (or raise the engine's bucket limit)"
            ),
        });
    }
    Ok(())
}

impl LookupGroup {
    /// The group without the names its lookups are stored under (to compare what it reads).
    pub(crate) fn unnamed(mut self) -> Self {
        if let LookupGroup::Table {
            source, branches, ..
        } = &mut self
        {
            source.clear();
            branches.iter_mut().for_each(|b| b.query_id.clear());
        }
        self
    }

    /// The group as the `offset`-th and later groups of a longer list: its links to
    /// earlier groups shift with it.
    pub(crate) fn rebased(mut self, offset: usize) -> Self {
        if let LookupGroup::Table { branches, .. } = &mut self {
            for (input, _) in branches.iter_mut().flat_map(|b| b.links.iter_mut()) {
                if let LinkInput::Group { group, .. } = input {
                    *group += offset;
                }
            }
        }
        self
    }
}

/// The groups a group's links read (`LinkInput::Group`).
fn groups_read(g: &LookupGroup) -> impl Iterator<Item = usize> + '_ {
    let branches = match g {
        LookupGroup::Table { branches, .. } => branches.as_slice(),
        _ => &[],
    };
    branches
        .iter()
        .flat_map(|b| b.links.iter())
        .filter_map(|(input, _)| match input {
            LinkInput::Group { group, .. } => Some(*group),
            LinkInput::Request(_) => None,
        })
}

/// Keeps one row per provenance of a group whose values nothing reads (not a parameter,
/// nor a later group's link): such a group only gates the buckets (a CTE joined and never
/// compared, an `EXISTS` subquery), and its rows of one provenance are alike.
fn gate_once(rows: &mut Vec<GroupRow>) {
    let mut seen = std::collections::HashSet::new();
    rows.retain(|r| seen.insert(r.from.clone()));
}

/// One row of a lookup group.
#[derive(Debug, Clone)]
pub(crate) struct GroupRow {
    /// The group's outputs.
    pub values: Vec<OwnedValue>,
    /// The rows of earlier groups this one was looked up from: `(group, row)`.
    pub from: Vec<(usize, usize)>,
}

/// Every group's rows, in order (a group reads only groups before it).
/// Groups whose values a parameter reads (`params_read`) or a later group's link does keep
/// every row; the others only gate the buckets (see [`gate_once`]).
pub(crate) fn rows_of(
    groups: &[LookupGroup],
    params_read: &[usize],
    env: Env<'_>,
    reader: &dyn LookupReader,
    read: &mut Vec<LookupKey>,
    max: usize,
) -> Result<Vec<Vec<GroupRow>>, RulesError> {
    let mut needed = vec![false; groups.len()];
    for g in params_read
        .iter()
        .copied()
        .chain(groups.iter().flat_map(groups_read))
    {
        if let Some(n) = needed.get_mut(g) {
            *n = true;
        }
    }
    let mut all: Vec<Vec<GroupRow>> = Vec::with_capacity(groups.len());
    for (g, needed) in groups.iter().zip(needed) {
        let mut rows = rows_for(g, env, &all, reader, read, max)?;
        if !needed {
            gate_once(&mut rows);
        }
        check_limit(rows.len(), max)?;
        all.push(rows);
    }
    Ok(all)
}

/// Every choice of one row per group whose rows agree on where they came from.
pub(crate) fn combinations(
    group_rows: &[Vec<GroupRow>],
    max: usize,
) -> Result<Vec<Vec<usize>>, RulesError> {
    let mut choice: Vec<Vec<usize>> = vec![Vec::new()];
    for rows in group_rows {
        let mut next = Vec::with_capacity(choice.len() * rows.len());
        for c in &choice {
            for (i, row) in rows.iter().enumerate() {
                if row.from.iter().all(|(g, r)| c.get(*g) == Some(r)) {
                    let mut c2 = c.clone();
                    c2.push(i);
                    next.push(c2);
                }
            }
        }
        choice = next;
        check_limit(choice.len(), max)?;
    }
    Ok(choice)
}

fn rows_for(
    g: &LookupGroup,
    env: Env<'_>,
    earlier: &[Vec<GroupRow>],
    reader: &dyn LookupReader,
    read: &mut Vec<LookupKey>,
    max: usize,
) -> Result<Vec<GroupRow>, RulesError> {
    let plain = |values| GroupRow {
        values,
        from: Vec::new(),
    };
    match g {
        LookupGroup::Static { outputs, filter } => {
            if !filter.iter().all(|f| f.eval(env).is_truthy()) {
                return Ok(Vec::new());
            }
            let row: Vec<OwnedValue> = outputs.iter().map(|e| e.eval(env).into_owned()).collect();
            // A blob output means no bucket (not representable in a name).
            if row.iter().any(|v| matches!(v, Value::Blob(_))) {
                return Ok(Vec::new());
            }
            Ok(vec![plain(row)])
        }
        LookupGroup::Each {
            array,
            outputs,
            filter,
        } => {
            let items = json_array_values(&array.eval(env)).unwrap_or_default();
            check_limit(items.len(), max)?;
            let mut rows: Vec<GroupRow> = Vec::new();
            for item in items {
                let slots = [item];
                let row_env = Env {
                    row: &slots,
                    request: env.request,
                };
                if !filter.iter().all(|f| f.eval(row_env).is_truthy()) {
                    continue;
                }
                let row = plain(
                    outputs
                        .iter()
                        .map(|e| e.eval(row_env).into_owned())
                        .collect(),
                );
                if !row.values.iter().any(|v| matches!(v, Value::Blob(_)))
                    && !rows.iter().any(|r| same_row(r, &row))
                {
                    rows.push(row);
                }
            }
            Ok(rows)
        }
        LookupGroup::Table {
            source,
            branches,
            request_outputs,
        } => {
            let extra: Vec<OwnedValue> = request_outputs
                .iter()
                .map(|e| e.eval(env).into_owned())
                .collect();
            let mut rows: Vec<GroupRow> = Vec::new();
            for b in branches {
                if !b.requests.iter().all(|f| f.eval(env).is_truthy()) {
                    continue;
                }
                for from in parent_rows(b, earlier, max)? {
                    for t in link_tuples(b, env, earlier, &from, max)? {
                        let Some(key) = lookup_key(source, &b.query_id, &t) else {
                            continue;
                        };
                        for mut values in reader.lookup(&key)? {
                            values.extend(extra.iter().cloned());
                            let row = GroupRow {
                                values,
                                from: from.clone(),
                            };
                            if !rows.iter().any(|x| same_row(x, &row)) {
                                rows.push(row);
                            }
                        }
                        if !read.contains(&key) {
                            read.push(key);
                        }
                    }
                }
            }
            Ok(rows)
        }
    }
}

/// The combinations of rows of the earlier groups a branch's links read (one empty
/// combination when they read none).
fn parent_rows(
    b: &RequestBranch,
    earlier: &[Vec<GroupRow>],
    max: usize,
) -> Result<Vec<Vec<(usize, usize)>>, RulesError> {
    let mut parents: Vec<usize> = Vec::new();
    for (input, _) in &b.links {
        if let LinkInput::Group { group, .. } = input {
            if !parents.contains(group) {
                parents.push(*group);
            }
        }
    }
    let mut combos: Vec<Vec<(usize, usize)>> = vec![Vec::new()];
    for g in parents {
        let rows: Vec<(usize, usize)> = (0..earlier.get(g).map_or(0, Vec::len))
            .map(|r| (g, r))
            .collect();
        combos = cross_product(&combos, &rows);
        check_limit(combos.len(), max)?;
    }
    Ok(combos)
}

/// The key values a branch looks up for one combination of parent rows.
fn link_tuples(
    b: &RequestBranch,
    env: Env<'_>,
    earlier: &[Vec<GroupRow>],
    from: &[(usize, usize)],
    max: usize,
) -> Result<Vec<Vec<OwnedValue>>, RulesError> {
    let mut tuples: Vec<Vec<OwnedValue>> = vec![Vec::new()];
    for (input, expands) in &b.links {
        let v = match input {
            LinkInput::Request(e) => e.eval(env).into_owned(),
            LinkInput::Group { group, output } => from
                .iter()
                .find(|(g, _)| g == group)
                .and_then(|(g, r)| earlier.get(*g)?.get(*r)?.values.get(*output))
                .cloned()
                .unwrap_or(Value::Null),
        };
        let vals = if *expands {
            json_array_values(&v).unwrap_or_default()
        } else {
            vec![v]
        };
        tuples = cross_product(&tuples, &bucket_values(vals));
        check_limit(tuples.len(), max)?;
    }
    Ok(tuples)
}

fn same_row(a: &GroupRow, b: &GroupRow) -> bool {
    a.from == b.from
        && a.values.len() == b.values.len()
        && a.values.iter().zip(&b.values).all(|(x, y)| {
            let (mut s, mut t) = (String::new(), String::new());
            write_key_value(&mut s, x) == write_key_value(&mut t, y) && s == t
        })
}
