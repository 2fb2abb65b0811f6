//! Sync-request evaluation (sync time, `docs/spec/protocol.md` §7.8): token, client parameters and
//! stream subscriptions → the request's bucket set.
//!
//! Static parameter queries are evaluated directly; table parameter queries become lookup
//! keys answered by a [`LookupReader`] (the store implements it over its lookup index at the
//! checkpoint being served; [`InMemoryLookups`] serves tests and the CLI).

use std::borrow::Cow;
use std::cell::OnceCell;

use super::bucket::{bucket_name, cross_product};
use super::error::RulesError;
use super::expr::{json_array_values, Env, Expr, RequestRef, RequestValues};
use super::json::json_to_value;
use super::lookup_groups;
pub(crate) use super::lookup_groups::{check_limit, LinkInput, LookupGroup, RequestBranch};
pub use super::lookup_groups::{InMemoryLookups, LookupReader};
use super::plan::LookupKey;
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
    /// The JWT `sub` when it is text (a number is read from `claims`).
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
                // A `sub` that is a number stays a number, as the official evaluator reads it
                // (bucket `[42]`, not `["42"]`).
                None => member(self.parsed_claims(), "sub"),
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
    /// The values every one of these gives (one row column compared with several things:
    /// `t.a = m.x AND t.a = m.y`), as the official compiler intersects them.
    All(Vec<ParamSource>),
}

impl ParamSource {
    /// Adds the groups whose values this parameter reads to `out`.
    fn groups(&self, out: &mut Vec<usize>) {
        match self {
            ParamSource::Request { .. } => {}
            ParamSource::Lookup { group, .. } => out.push(*group),
            ParamSource::All(all) => all.iter().for_each(|p| p.groups(out)),
        }
    }

    /// The parameter's values for one choice of group rows `c`.
    fn values(
        &self,
        env: Env<'_>,
        c: &[usize],
        group_rows: &[Vec<lookup_groups::GroupRow>],
    ) -> Vec<OwnedValue> {
        match self {
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
                    .and_then(|r| r.values.get(*output))
                    .cloned()
                    .unwrap_or(Value::Null)]
            }
            ParamSource::All(sources) => {
                let mut sets = sources.iter().map(|s| s.values(env, c, group_rows));
                let first = sets.next().unwrap_or_default();
                let keys = |vals: &[OwnedValue]| -> Vec<Option<String>> {
                    vals.iter()
                        .map(|v| bucket_name("", std::slice::from_ref(v)))
                        .collect()
                };
                let rest: Vec<Vec<Option<String>>> = sets.map(|v| keys(&v)).collect();
                first
                    .into_iter()
                    .filter(|v| {
                        let k = bucket_name("", std::slice::from_ref(v));
                        k.is_some() && rest.iter().all(|r| r.contains(&k))
                    })
                    .collect()
            }
        }
    }
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
        let mut params_read = Vec::new();
        self.params.iter().for_each(|p| p.groups(&mut params_read));
        let group_rows =
            lookup_groups::rows_of(&self.groups, &params_read, env, reader, read, max)?;
        let choice = lookup_groups::combinations(&group_rows, max)?;
        let mut names = Vec::new();
        for c in &choice {
            let mut tuples: Vec<Vec<OwnedValue>> = vec![Vec::new()];
            for p in &self.params {
                let mut vals = p.values(env, c, &group_rows);
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
