//! Sync-request evaluation (sync time, spec §7.8): token, client parameters and stream
//! subscriptions → the request's bucket set.
//!
//! Static parameter queries are evaluated directly; table parameter queries become lookup
//! keys answered by a [`LookupReader`] (the store implements it over its lookup index at the
//! checkpoint being served; [`InMemoryLookups`] serves tests and the CLI).

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::HashMap;

use super::bucket::{bucket_name, bucket_values, cross_product};
use super::error::RulesError;
use super::expr::{json_array_values, Env, Expr, RequestRef, RequestValues};
use super::json::{json_to_value, write_key_value};
use super::plan::{lookup_key, LookupEntry, LookupKey};
use super::value::{OwnedValue, Value};

/// A stream subscription from the request body (`streams.subscriptions[i]`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Subscription {
    /// The stream name.
    pub stream: String,
    /// `subscription.parameters()`; an object or null.
    pub parameters: serde_json::Value,
    /// Overrides the stream's priority for this subscription's buckets.
    pub override_priority: Option<u8>,
}

/// A verified token's payload, kept as its JSON text: a stream keeps its request for its
/// whole life (a replica holds 10,000 of them) and rules rarely read more than `sub`,
/// which the request keeps apart, so the object is parsed only when a rule reads a claim.
#[derive(Debug, Clone, PartialEq)]
pub struct Claims(Box<str>);

impl Claims {
    /// The claims of `payload` (an object; null counts as none).
    pub fn new(payload: &serde_json::Value) -> Self {
        if payload.is_null() {
            return Self::default();
        }
        Claims(payload.to_string().into_boxed_str())
    }

    /// The payload as JSON text (`request.jwt()`).
    pub fn text(&self) -> &str {
        &self.0
    }

    /// The payload, parsed.
    pub fn parse(&self) -> serde_json::Value {
        // Made by `new` from a value, so it parses.
        serde_json::from_str(&self.0).unwrap_or(serde_json::Value::Null)
    }
}

impl Default for Claims {
    fn default() -> Self {
        Claims("{}".into())
    }
}

/// Everything about a sync request the rules may read.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestContext {
    /// The JWT `sub`.
    pub user_id: Option<String>,
    /// The full JWT payload (an object).
    pub claims: Claims,
    /// The client's `parameters` (an object or null).
    pub parameters: serde_json::Value,
    /// `streams.include_defaults` (true when absent).
    pub include_defaults: bool,
    /// Explicit stream subscriptions, in request order.
    pub subscriptions: Vec<Subscription>,
}

impl Default for RequestContext {
    fn default() -> Self {
        RequestContext {
            user_id: None,
            claims: Claims::default(),
            parameters: serde_json::Value::Object(Default::default()),
            include_defaults: true,
            subscriptions: Vec::new(),
        }
    }
}

impl RequestContext {
    /// A request from a verified JWT payload: `sub` becomes the user id.
    pub fn from_claims(claims: serde_json::Value) -> Self {
        RequestContext {
            user_id: claims
                .get("sub")
                .and_then(|s| s.as_str())
                .map(str::to_string),
            claims: Claims::new(&claims),
            ..Default::default()
        }
    }
}

/// The request's values for one resolution (of the request, or of one subscription),
/// borrowed from its context: a stream resolves its request at every checkpoint that
/// concerns it, so nothing is copied, and the JSON texts (`request.parameters()`, …) and
/// the parsed claims are made only when the rules ask for them.
#[derive(Debug, Clone)]
pub struct RequestData<'a> {
    user_id: Option<&'a str>,
    claims: &'a Claims,
    parsed_claims: OnceCell<serde_json::Value>,
    params: &'a serde_json::Value,
    params_text: OnceCell<String>,
    sub_params: &'a serde_json::Value,
    sub_text: OnceCell<String>,
}

/// The parameters of a resolution without a subscription.
static NO_PARAMETERS: serde_json::Value = serde_json::Value::Null;

impl<'a> RequestData<'a> {
    pub(crate) fn new(ctx: &'a RequestContext, sub: Option<&'a Subscription>) -> Self {
        RequestData {
            user_id: ctx.user_id.as_deref(),
            claims: &ctx.claims,
            parsed_claims: OnceCell::new(),
            params: &ctx.parameters,
            params_text: OnceCell::new(),
            sub_params: sub.map_or(&NO_PARAMETERS, |s| &s.parameters),
            sub_text: OnceCell::new(),
        }
    }
}

/// `v` as JSON text (`{}` for null), made once in `text`.
fn object_text<'t>(text: &'t OnceCell<String>, v: &serde_json::Value) -> Value<'t> {
    Value::Text(Cow::Borrowed(text.get_or_init(|| {
        if v.is_null() {
            "{}".to_string()
        } else {
            v.to_string()
        }
    })))
}

impl RequestData<'_> {
    fn parsed_claims(&self) -> &serde_json::Value {
        self.parsed_claims.get_or_init(|| self.claims.parse())
    }
}

impl RequestValues for RequestData<'_> {
    fn value(&self, r: &RequestRef) -> Value<'_> {
        let member =
            |obj: &serde_json::Value, k: &str| obj.get(k).map(json_to_value).unwrap_or(Value::Null);
        match r {
            RequestRef::UserId => match self.user_id {
                Some(u) => Value::Text(Cow::Borrowed(u)),
                None => Value::Null,
            },
            RequestRef::Jwt => Value::Text(Cow::Borrowed(self.claims.text())),
            RequestRef::Claim(k) => member(self.parsed_claims(), k),
            RequestRef::TokenParameter(k) => self
                .parsed_claims()
                .get("parameters")
                .map(|p| member(p, k))
                .unwrap_or(Value::Null),
            RequestRef::ClientParameters => object_text(&self.params_text, self.params),
            RequestRef::ClientParameter(k) => member(self.params, k),
            RequestRef::SubscriptionParameters => object_text(&self.sub_text, self.sub_params),
            RequestRef::SubscriptionParameter(k) => member(self.sub_params, k),
        }
    }
}

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

/// Why a bucket is in the request's set (`subscriptions` on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BucketReason {
    /// A default stream or bucket definition, by its index in `checkpoint.streams`.
    Default(usize),
    /// An explicit subscription, by its index in the request.
    Subscription(usize),
}

/// One bucket of a request's set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedBucket {
    /// Full bucket name.
    pub name: String,
    /// Effective priority (the minimum over reasons).
    pub priority: u8,
    /// Why it is included.
    pub reasons: Vec<BucketReason>,
    /// The definition or stream it comes from.
    pub source: String,
}

/// A problem with one subscription; reported in `checkpoint.streams[].errors`, not fatal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionError {
    /// Index of the subscription in the request.
    pub subscription: usize,
    /// What is wrong.
    pub message: String,
}

/// The result of resolving a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolution {
    /// Buckets, unique by name, in first-seen order.
    pub buckets: Vec<ResolvedBucket>,
    /// Per-subscription problems.
    pub errors: Vec<SubscriptionError>,
    /// Lookup keys read (the engine re-resolves when one of them changes).
    pub lookups_read: Vec<LookupKey>,
}

impl Resolution {
    pub(crate) fn add(&mut self, name: String, priority: u8, reason: BucketReason, source: &str) {
        if let Some(b) = self.buckets.iter_mut().find(|b| b.name == name) {
            b.priority = b.priority.min(priority);
            if !b.reasons.contains(&reason) {
                b.reasons.push(reason);
            }
            return;
        }
        self.buckets.push(ResolvedBucket {
            name,
            priority,
            reasons: vec![reason],
            source: source.to_string(),
        });
    }
}

/// Where one bucket parameter's value comes from at request time.
#[derive(Debug, Clone)]
pub(crate) enum ParamSource {
    /// A request expression (`expands`: a JSON array, one bucket per element).
    Request { expr: Expr, expands: bool },
    /// Column `output` of lookup group `group`.
    Lookup { group: usize, output: usize },
}

/// One branch of a lookup query, request side.
#[derive(Debug, Clone)]
pub(crate) struct RequestBranch {
    pub query_id: String,
    pub requests: Vec<Expr>,
    /// Request side of each link, and whether it expands.
    pub links: Vec<(Expr, bool)>,
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

/// How one bucket source (a parameter query of a definition, or a stream query) builds its
/// bucket names for a request.
#[derive(Debug, Clone)]
pub(crate) struct BucketResolver {
    pub prefix: String,
    pub request_filters: Vec<Expr>,
    pub groups: Vec<LookupGroup>,
    pub params: Vec<ParamSource>,
    /// Priority set by `_priority` in the parameter query, if any.
    pub priority: Option<u8>,
    /// A request value that is NULL makes no bucket (edition 3's compiler: a NULL never
    /// equals a row's value, so such a bucket could never hold a row). Earlier editions name
    /// the bucket `[null]`.
    pub null_makes_no_bucket: bool,
}

impl BucketResolver {
    /// The bucket names (with the priority override, if any) for one request.
    pub(crate) fn resolve(
        &self,
        data: &RequestData<'_>,
        reader: &dyn LookupReader,
        read: &mut Vec<LookupKey>,
        max: usize,
    ) -> Result<Vec<String>, RulesError> {
        let env = Env {
            row: &[],
            request: Some(data),
        };
        if !self.request_filters.iter().all(|f| f.eval(env).is_truthy()) {
            return Ok(Vec::new());
        }
        let mut group_rows: Vec<Vec<Vec<OwnedValue>>> = Vec::with_capacity(self.groups.len());
        for g in &self.groups {
            group_rows.push(group_rows_for(g, env, reader, read, max)?);
        }
        // Cross product over groups (rows of one group stay together), then request params.
        let mut choice: Vec<Vec<usize>> = vec![Vec::new()];
        for rows in &group_rows {
            let mut next = Vec::with_capacity(choice.len() * rows.len());
            for c in &choice {
                for i in 0..rows.len() {
                    let mut c2 = c.clone();
                    c2.push(i);
                    next.push(c2);
                }
            }
            choice = next;
            check_limit(choice.len(), max)?;
        }
        let mut names = Vec::new();
        for c in &choice {
            let mut tuples: Vec<Vec<OwnedValue>> = vec![Vec::new()];
            for p in &self.params {
                let mut vals: Vec<OwnedValue> = match p {
                    ParamSource::Request { expr, expands } => {
                        let v = expr.eval(env).into_owned();
                        if *expands {
                            json_array_values(&v).unwrap_or_default()
                        } else {
                            vec![v]
                        }
                    }
                    ParamSource::Lookup { group, output } => {
                        let row = c.get(*group).and_then(|i| group_rows.get(*group)?.get(*i));
                        vec![row
                            .and_then(|r| r.get(*output))
                            .cloned()
                            .unwrap_or(Value::Null)]
                    }
                };
                if self.null_makes_no_bucket {
                    vals.retain(|v| !matches!(v, Value::Null));
                }
                tuples = cross_product(&tuples, &vals);
                check_limit(tuples.len(), max)?;
            }
            for t in tuples {
                if let Some(n) = bucket_name(&self.prefix, &t) {
                    if !names.contains(&n) {
                        names.push(n);
                        check_limit(names.len(), max)?;
                    }
                }
            }
        }
        Ok(names)
    }
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

fn group_rows_for(
    g: &LookupGroup,
    env: Env<'_>,
    reader: &dyn LookupReader,
    read: &mut Vec<LookupKey>,
    max: usize,
) -> Result<Vec<Vec<OwnedValue>>, RulesError> {
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
            Ok(vec![row])
        }
        LookupGroup::Each {
            array,
            outputs,
            filter,
        } => {
            let items = json_array_values(&array.eval(env)).unwrap_or_default();
            check_limit(items.len(), max)?;
            let mut rows: Vec<Vec<OwnedValue>> = Vec::new();
            for item in items {
                let slots = [item];
                let row_env = Env {
                    row: &slots,
                    request: env.request,
                };
                if !filter.iter().all(|f| f.eval(row_env).is_truthy()) {
                    continue;
                }
                let row: Vec<OwnedValue> = outputs
                    .iter()
                    .map(|e| e.eval(row_env).into_owned())
                    .collect();
                if !row.iter().any(|v| matches!(v, Value::Blob(_)))
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
            let mut rows: Vec<Vec<OwnedValue>> = Vec::new();
            for b in branches {
                if !b.requests.iter().all(|f| f.eval(env).is_truthy()) {
                    continue;
                }
                let mut tuples: Vec<Vec<OwnedValue>> = vec![Vec::new()];
                for (e, expands) in &b.links {
                    let v = e.eval(env).into_owned();
                    let vals = if *expands {
                        json_array_values(&v).unwrap_or_default()
                    } else {
                        vec![v]
                    };
                    tuples = cross_product(&tuples, &bucket_values(vals));
                    check_limit(tuples.len(), max)?;
                }
                for t in tuples {
                    let Some(key) = lookup_key(source, &b.query_id, &t) else {
                        continue;
                    };
                    for mut r in reader.lookup(&key)? {
                        r.extend(extra.iter().cloned());
                        if !rows.iter().any(|x| same_row(x, &r)) {
                            rows.push(r);
                        }
                    }
                    if !read.contains(&key) {
                        read.push(key);
                    }
                }
            }
            Ok(rows)
        }
    }
}

fn same_row(a: &[OwnedValue], b: &[OwnedValue]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            let (mut s, mut t) = (String::new(), String::new());
            write_key_value(&mut s, x) == write_key_value(&mut t, y) && s == t
        })
}
