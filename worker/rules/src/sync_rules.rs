//! [`SyncRules`]: the compiled form of one sync-rules file, the entry point of the module.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use sha2::{Digest, Sha256};

use super::bucket::BucketVersion;
use super::compile::events::{self, EventDefinition};
use super::compile::{bucket_sources, legacy, streams, warnings};
use super::error::RulesError;
use super::fingerprint::Fingerprint;
use super::options::Compatibility;
use super::plan::{DataEvaluator, LookupCreator, TablePlan, TableRef};
use super::request::{
    check_limit, BucketReason, BucketResolver, LookupReader, RequestContext, RequestData,
    Resolution, SubscriptionError,
};
use super::warning::RulesWarning;
use super::yaml;

/// The default bucket priority when neither the rule nor the request sets one.
pub const DEFAULT_PRIORITY: u8 = 3;

/// Most buckets one request may resolve to (the official service's default limit).
pub const DEFAULT_MAX_BUCKETS: usize = 1000;

/// Whether a bucket source came from `bucket_definitions` or `streams`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    /// A legacy bucket definition (always synced).
    Definition,
    /// A sync stream.
    Stream,
}

/// One entry of `checkpoint.streams`: a definition or stream, in file order.
#[derive(Debug, Clone)]
pub struct BucketSource {
    /// Definition or stream name.
    pub name: String,
    /// Which section it came from.
    pub kind: SourceKind,
    /// Its priority (default 3).
    pub priority: u8,
    /// Synced without an explicit subscription (`is_default` on the wire).
    pub is_default: bool,
    /// Bucket parameter names (definitions) — empty for global buckets and streams.
    pub parameters: Vec<String>,
    resolvers: Vec<BucketResolver>,
}

/// How a table is used by the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TableUsage {
    /// Rows go into buckets.
    pub data: bool,
    /// Rows feed parameter lookups.
    pub parameters: bool,
}

/// Compiled sync rules.
#[derive(Debug, Clone)]
pub struct SyncRules {
    compat: Compatibility,
    version: BucketVersion,
    hash: [u8; 32],
    text: std::sync::Arc<str>,
    sources: Vec<BucketSource>,
    plans: BTreeMap<TableRef, TablePlan>,
    /// For each table, the fingerprints of the definitions and streams that read it.
    readers: BTreeMap<TableRef, BTreeSet<Fingerprint>>,
    /// `event_definitions`, compiled and checked (they have no effect: see `events`).
    events: Vec<EventDefinition>,
    /// What the official compiler would warn about (see [`Self::warnings`]).
    warnings: Vec<RulesWarning>,
}

impl SyncRules {
    /// Parse and compile with bucket-name generation 1 (`1#...`).
    pub fn parse(yaml: &str) -> Result<SyncRules, RulesError> {
        Self::parse_with_version(yaml, BucketVersion::default())
    }

    /// Parse and compile with an explicit bucket-name version; the engine passes the one
    /// of the store the rules build (see [`BucketVersion`]).
    pub fn parse_with_version(
        yaml_text: &str,
        version: BucketVersion,
    ) -> Result<SyncRules, RulesError> {
        let raw = yaml::parse(yaml_text)?;
        let compat = raw.compat;
        let mut sources = Vec::new();
        let mut data: Vec<(TableRef, DataEvaluator)> = Vec::new();
        let mut lookups: Vec<(TableRef, LookupCreator)> = Vec::new();
        let mut readers: BTreeMap<TableRef, BTreeSet<Fingerprint>> = BTreeMap::new();
        let mut note_readers = |fingerprint: Fingerprint, tables: Vec<&TableRef>| {
            for t in tables {
                readers.entry(t.clone()).or_default().insert(fingerprint);
            }
        };
        for d in &raw.definitions {
            let c = legacy::compile(d, compat, version)?;
            note_readers(c.fingerprint, tables_read(&c.data, &c.lookups));
            data.extend(c.data);
            lookups.extend(c.lookups);
            sources.push(BucketSource {
                name: d.name.clone(),
                kind: SourceKind::Definition,
                priority: d.priority.unwrap_or(DEFAULT_PRIORITY),
                is_default: true,
                parameters: c.params,
                resolvers: c.resolvers,
            });
        }
        let mut names = bucket_sources::Names::default();
        let mut warned = warnings::of_file(&raw);
        for s in &raw.streams {
            let c = streams::compile(s, &raw.with, compat, version)?;
            warned.extend(warnings::of_stream_buckets(
                s, &raw.with, compat, &c.buckets,
            ));
            let mut resolvers = Vec::new();
            let mut filled = Vec::new();
            for b in c.buckets {
                let share = compat.edition >= 3;
                let (resolver, evaluators) = names.assign(b, share, version, &c.fingerprint);
                resolvers.push(resolver);
                filled.extend(evaluators);
            }
            note_readers(c.fingerprint, tables_read(&filled, &c.lookups));
            data.extend(filled);
            lookups.extend(c.lookups);
            sources.push(BucketSource {
                name: s.name.clone(),
                kind: SourceKind::Stream,
                priority: s.priority.unwrap_or(DEFAULT_PRIORITY),
                is_default: s.auto_subscribe,
                parameters: Vec::new(),
                resolvers,
            });
        }
        let mut plans: BTreeMap<TableRef, TablePlan> = BTreeMap::new();
        let plan = |plans: &mut BTreeMap<TableRef, TablePlan>, t: &TableRef| -> TableRef {
            plans.entry(t.clone()).or_insert_with(|| TablePlan {
                table: t.clone(),
                compat,
                data: Vec::new(),
                lookups: Vec::new(),
                twins: Vec::new(),
            });
            t.clone()
        };
        for (t, d) in data {
            let key = plan(&mut plans, &t);
            if let Some(p) = plans.get_mut(&key) {
                p.data.push(d);
            }
        }
        for (t, l) in lookups {
            let key = plan(&mut plans, &t);
            if let Some(p) = plans.get_mut(&key) {
                // A global CTE used by several streams is materialized once.
                if !p.lookups.iter().any(|x| x.same_lookup(&l)) {
                    p.lookups.push(l);
                }
            }
        }
        for plan in plans.values_mut() {
            plan.find_twins();
        }
        let events = raw
            .events
            .iter()
            .map(|e| events::compile(e, compat))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(SyncRules {
            compat,
            version,
            hash: Sha256::digest(yaml_text.as_bytes()).into(),
            text: yaml_text.into(),
            sources,
            plans,
            readers,
            events,
            warnings: warned,
        })
    }

    /// What the stream evaluates during a deploy that keeps its store: every bucket and
    /// lookup of these rules and of `next` (a definition both hold, by fingerprint, once),
    /// so the served buckets stay current while the new ones are filled. It serves nothing
    /// (its request side and text are these rules'). `None` when the two differ in bucket
    /// version or edition options (then every definition changed anyway).
    pub fn with_rows_of(&self, next: &SyncRules) -> Option<SyncRules> {
        let derived = matches!(self.version, BucketVersion::Derived(_));
        if !derived || self.version != next.version || self.compat != next.compat {
            return None;
        }
        let mut union = self.clone();
        for (table, plan) in &next.plans {
            let into = union
                .plans
                .entry(table.clone())
                .or_insert_with(|| TablePlan {
                    table: table.clone(),
                    compat: self.compat,
                    data: Vec::new(),
                    lookups: Vec::new(),
                    twins: Vec::new(),
                });
            for d in &plan.data {
                if !into.data.iter().any(|x| x.prefix == d.prefix) {
                    into.data.push(d.clone());
                }
            }
            for l in &plan.lookups {
                if !into.lookups.iter().any(|x| x.same_lookup(l)) {
                    into.lookups.push(l.clone());
                }
            }
            into.find_twins();
        }
        for (table, readers) in &next.readers {
            union
                .readers
                .entry(table.clone())
                .or_default()
                .extend(readers.iter().copied());
        }
        Some(union)
    }

    /// True when `other` makes of rows of `table` exactly what these rules make of them
    /// (the same definitions and streams read it, by [`Fingerprint`]): rules compiled with
    /// the same bucket version then write the same buckets and lookups for its rows.
    pub fn reads_table_as(&self, other: &SyncRules, table: &TableRef) -> bool {
        self.readers_of(table) == other.readers_of(table)
    }

    /// The fingerprints of the definitions and streams that read `table`, by its name or
    /// through a wildcard table.
    fn readers_of(&self, table: &TableRef) -> BTreeSet<Fingerprint> {
        self.readers
            .iter()
            .filter(|(t, _)| {
                t == &table || (t.is_pattern() && t.matches(&table.schema, &table.name))
            })
            .flat_map(|(_, readers)| readers.iter().copied())
            .collect()
    }

    /// What the official compiler warns about in these rules: they compile and sync, but
    /// probably not as meant (`docs/sync-rules.md`, "Warnings"). Each names where it is;
    /// their order is stable, not the file's.
    pub fn warnings(&self) -> &[RulesWarning] {
        &self.warnings
    }

    /// SHA-256 of the YAML text: identifies a deployment's rules content.
    pub fn content_hash(&self) -> [u8; 32] {
        self.hash
    }

    /// The YAML text the rules were compiled from (stored with the data they built, so a
    /// generation keeps serving with its own rules while a deploy builds the next one).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// [`Self::content_hash`] as lower-case hex.
    pub fn content_hash_hex(&self) -> String {
        self.hash.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The edition options in force.
    pub fn compatibility(&self) -> Compatibility {
        self.compat
    }

    /// The bucket-name version these rules were compiled with.
    pub fn bucket_version(&self) -> BucketVersion {
        self.version
    }

    /// The `event_definitions`, in file order: compiled and checked, with no effect (as in
    /// the official open-source service, where nothing consumes the events).
    pub fn event_definitions(&self) -> &[EventDefinition] {
        &self.events
    }

    /// Definitions and streams in file order (`checkpoint.streams` order).
    pub fn sources(&self) -> &[BucketSource] {
        &self.sources
    }

    /// Every source table the rules read and how, wildcard tables (`todos_%`, see
    /// [`TableRef::is_pattern`]) as they are written; the replication source checks the
    /// publication covers them, and finds the tables a wildcard stands for.
    pub fn tables(&self) -> Vec<(TableRef, TableUsage)> {
        self.plans
            .iter()
            .map(|(t, p)| {
                (
                    t.clone(),
                    TableUsage {
                        data: p.has_data(),
                        parameters: p.has_lookups(),
                    },
                )
            })
            .collect()
    }

    /// The plan for rows of `schema.table`, or `None` when the rules ignore that table: what
    /// the rules do with it by its name and through every wildcard table it matches.
    pub fn plan_for(&self, schema: &str, table: &str) -> Option<Cow<'_, TablePlan>> {
        let named = TableRef {
            schema: schema.to_string(),
            name: table.to_string(),
        };
        let exact = self.plans.get(&named);
        let mut wildcards = self
            .plans
            .iter()
            .filter(|(t, _)| t.is_pattern() && t.matches(schema, table))
            .peekable();
        if wildcards.peek().is_none() {
            return exact.map(Cow::Borrowed);
        }
        let mut plan = exact
            .cloned()
            .unwrap_or_else(|| TablePlan::empty(named, self.compat));
        for (_, wildcard) in wildcards {
            plan.absorb(wildcard);
        }
        Some(Cow::Owned(plan))
    }

    /// True when the rules read `schema.table` through a wildcard table only: a table the
    /// stream meets for the first time is followed from then on.
    pub fn reads_by_wildcard(&self, schema: &str, table: &str) -> bool {
        self.plans
            .keys()
            .any(|t| t.is_pattern() && t.matches(schema, table))
    }

    /// Resolve a request's bucket set: default definitions/streams (unless
    /// `include_defaults` is false) and explicit subscriptions. Lookups are read through
    /// `reader` at the checkpoint the caller serves. At most [`DEFAULT_MAX_BUCKETS`].
    pub fn resolve_request(
        &self,
        ctx: &RequestContext,
        reader: &dyn LookupReader,
    ) -> Result<Resolution, RulesError> {
        self.resolve_request_with_limit(ctx, reader, DEFAULT_MAX_BUCKETS)
    }

    /// [`Self::resolve_request`] with an explicit bucket limit; exceeding it is a
    /// `RulesError::Request`.
    pub fn resolve_request_with_limit(
        &self,
        ctx: &RequestContext,
        reader: &dyn LookupReader,
        max: usize,
    ) -> Result<Resolution, RulesError> {
        let mut res = Resolution::default();
        if ctx.include_defaults {
            let data = RequestData::new(ctx, None);
            for (i, s) in self.sources.iter().enumerate() {
                if !s.is_default {
                    continue;
                }
                for r in &s.resolvers {
                    let prio = r.priority.unwrap_or(s.priority);
                    for name in r.resolve(&data, reader, &mut res.lookups_read, max)? {
                        res.add(name, prio, BucketReason::Default(i), &s.name);
                        check_limit(res.buckets.len(), max)?;
                    }
                }
            }
        }
        for (j, sub) in ctx.subscriptions.iter().enumerate() {
            let Some(s) = self
                .sources
                .iter()
                .find(|s| s.name == sub.stream && s.kind == SourceKind::Stream)
            else {
                res.errors.push(SubscriptionError {
                    subscription: j,
                    message: format!("unknown stream `{}`", sub.stream),
                });
                continue;
            };
            if !sub.parameters.is_null() && !sub.parameters.is_object() {
                res.errors.push(SubscriptionError {
                    subscription: j,
                    message: format!(
                        "parameters of stream `{}` must be a JSON object",
                        sub.stream
                    ),
                });
                continue;
            }
            let data = RequestData::new(ctx, Some(sub));
            let prio = sub
                .override_priority
                .unwrap_or(s.priority)
                .min(DEFAULT_PRIORITY);
            for r in &s.resolvers {
                for name in r.resolve(&data, reader, &mut res.lookups_read, max)? {
                    res.add(name, prio, BucketReason::Subscription(j), &s.name);
                    check_limit(res.buckets.len(), max)?;
                }
            }
        }
        Ok(res)
    }
}

/// The tables a compiled definition reads (with repeats).
fn tables_read<'a, D, L>(
    data: &'a [(TableRef, D)],
    lookups: &'a [(TableRef, L)],
) -> Vec<&'a TableRef> {
    data.iter()
        .map(|(t, _)| t)
        .chain(lookups.iter().map(|(t, _)| t))
        .collect()
}
