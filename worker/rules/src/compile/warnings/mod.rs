//! The official compiler's warnings, found here for a file that compiled (`crate::warning`).
//!
//! `@powersync/service-sync-rules` 0.38.1 reports some problems as errors of type
//! `warning`: the rules work, but probably not as meant. The ones it reports without a
//! source schema (the service compiles without one), where it reports them, and the module
//! that finds them here:
//!
//! | official message | official source | here |
//! | --- | --- | --- |
//! | Potentially dangerous query based on parameters set by the client | `SqlParameterQuery`, `StaticSqlParameterQuery`, `TableValuedFunctionSqlParameterQuery` | `client_parameters` |
//! | Clients can send any value for this unauthenticated parameter | `compiler/detect_dangerous_parameters.ts` | `unauthenticated` |
//! | Unquoted identifiers are converted to lower-case | `sql_filters.ts` (`checkSpecificNameCase`, `checkColumnNameCase`) | `case` |
//! | This is using an alpha version of Sync Streams | `from_yaml.ts` | here |
//! | Clients subscribe to this stream by default, but it uses subscription parameters | `streams/from_sql.ts` | here |
//! | The name of this column is unspecified, consider adding an alias | `compiler/parser.ts` | `columns` |
//! | A '*' column after aliased columns may give unexpected results | `compiler/parser.ts` | `columns` |
//! | This common table expression isn't referenced | `from_yaml.ts` | `ctes` |
//! | Storage version N is unstable | `from_yaml.ts` | here |
//!
//! Not reported: the warnings that need the source schema (a table or column not found, a
//! `*` query without `id`, a CTE named like a table) — the rules crate does not know the
//! schema, the replication source checks tables against `SyncRules::tables()`; the one
//! warning of `event_definitions`, a payload's table not found, is of this kind.

mod case;
mod client_parameters;
mod columns;
mod ctes;
mod unauthenticated;

use sqlparser::ast::{ObjectNamePart, Select, Visit, Visitor};
use sqlparser::tokenizer::{Location, Span};
use std::ops::ControlFlow;

use super::bucket_sources::StreamBucket;
use crate::error::SqlLocation;
use crate::options::Compatibility;
use crate::sql::parse::parse_select;
use crate::sql::{ident_name, offset_of, QueryCtx};
use crate::warning::{RulesWarning, WarningKind};
use crate::yaml::{RawDefinition, RawRules, RawStream};

/// The warnings of a checked file that do not depend on how its streams compiled: all of
/// them but edition 3's unauthenticated parameters ([`of_stream_buckets`]).
pub(crate) fn of_file(raw: &RawRules) -> Vec<RulesWarning> {
    let compat = raw.compat;
    let mut out = Vec::new();
    if raw.storage_version == Some(3) {
        out.push(structural(
            WarningKind::UnstableStorageVersion,
            "key",
            "config.storage_version",
            "",
            "3",
            "storage_version 3 is unstable in the official service (\"Storage version 3 is \
             unstable, and may cause unexpected behavior or stop functioning in any \
             release\"); powersync_mdbx ignores storage_version"
                .into(),
            "remove `storage_version`, or write 2 if the file is also deployed to the official service".into(),
        ));
    }
    if compat.edition < 3 && !raw.streams.is_empty() {
        out.push(structural(
            WarningKind::AlphaStreams,
            "key",
            "streams",
            "",
            "streams",
            "streams at edition 2 are the alpha version of Sync Streams (the official compiler: \
             \"This is using an alpha version of Sync Streams. We recommend upgrading \
             `config.edition` to version 3\")"
                .into(),
            "`config: { edition: 3 }` for the current Sync Streams (it also names buckets \
             differently and evaluates some expressions differently: docs/sync-rules.md)"
                .into(),
        ));
    }
    for d in &raw.definitions {
        out.extend(of_definition(d, compat));
    }
    for s in &raw.streams {
        out.extend(of_stream_queries(s, compat));
    }
    if compat.edition >= 3 {
        for (name, sql) in &raw.with {
            let ctx = QueryCtx::new("CTE", name, format!("with.{name}"), sql, compat);
            if let Some(select) = parsed(&ctx) {
                out.extend(columns::unnamed(&ctx, &select));
            }
        }
        out.extend(ctes::unused(raw));
    }
    out
}

/// The warnings of one bucket definition: client parameters deciding access (unless
/// accepted) and identifier case.
fn of_definition(d: &RawDefinition, compat: Compatibility) -> Vec<RulesWarning> {
    let mut out = Vec::new();
    for (i, sql) in d.parameters.iter().enumerate() {
        let ctx = QueryCtx::new(
            "bucket definition",
            &d.name,
            format!("parameters[{i}]"),
            sql,
            compat,
        );
        if let Some(select) = parsed(&ctx) {
            if !d.accept_dangerous && client_parameters::decides_access(&select) {
                out.push(client_parameters::warning(&ctx));
            }
            out.extend(case::of_query(&ctx, &select, true));
        }
    }
    for (j, sql) in d.data.iter().enumerate() {
        let ctx = QueryCtx::new(
            "bucket definition",
            &d.name,
            format!("data[{j}]"),
            sql,
            compat,
        );
        if let Some(select) = parsed(&ctx) {
            out.extend(case::of_query(&ctx, &select, false));
        }
    }
    out
}

/// The warnings of one stream's queries and CTEs, by edition: edition 2 compiles them as
/// the official alpha compiler (identifier case, default subscriptions), edition 3 as its
/// streams compiler (output column names).
fn of_stream_queries(s: &RawStream, compat: Compatibility) -> Vec<RulesWarning> {
    let mut out = Vec::new();
    for (k, sql) in s.queries.iter().enumerate() {
        let ctx = QueryCtx::new("stream", &s.name, query_label(s, k), sql, compat);
        let Some(select) = parsed(&ctx) else { continue };
        if compat.edition >= 3 {
            out.extend(columns::unnamed(&ctx, &select));
            out.extend(columns::star_after_alias(&ctx, &select));
        } else {
            out.extend(case::of_query(&ctx, &select, false));
            if s.auto_subscribe && reads_subscription(&select) {
                out.push(whole_query(
                    &ctx,
                    WarningKind::DefaultSubscriptionParameters,
                    "the stream is subscribed by default (`auto_subscribe: true`) but reads \
                     subscription parameters, which are NULL for a default subscription (the \
                     official compiler: \"Clients subscribe to this stream by default, but it \
                     uses subscription parameters\")"
                        .into(),
                    "remove the subscription parameter, or remove `auto_subscribe: true` and \
                     have clients subscribe with parameters"
                        .into(),
                ));
            }
        }
    }
    if compat.edition >= 3 {
        for (name, sql) in &s.with {
            let ctx = QueryCtx::new("stream", &s.name, format!("with.{name}"), sql, compat);
            if let Some(select) = parsed(&ctx) {
                out.extend(columns::unnamed(&ctx, &select));
            }
        }
    }
    out
}

/// Edition 3's warning about buckets chosen by unauthenticated values only, for one
/// stream's buckets as compiled (after those instantiated alike were merged), unless the
/// stream accepts such queries.
pub(crate) fn of_stream_buckets(
    s: &RawStream,
    global_with: &[(String, String)],
    compat: Compatibility,
    buckets: &[StreamBucket],
) -> Vec<RulesWarning> {
    if compat.edition < 3 || s.accept_dangerous {
        return Vec::new();
    }
    buckets
        .iter()
        .filter_map(|b| unauthenticated::of_bucket(s, global_with, compat, b))
        .collect()
}

/// `queries[k]` or `query`, as errors name a stream query.
fn query_label(s: &RawStream, k: usize) -> String {
    if s.uses_queries_key {
        format!("queries[{k}]")
    } else {
        "query".to_string()
    }
}

/// The query parsed as the compiler parsed it (it did, so this succeeds).
fn parsed(ctx: &QueryCtx<'_>) -> Option<Select> {
    parse_select(ctx, ctx.sql).ok()
}

/// A warning at `start` in the query of `ctx`, about `excerpt`.
fn at(
    ctx: &QueryCtx<'_>,
    kind: WarningKind,
    start: Location,
    excerpt: &str,
    message: String,
    hint: String,
) -> RulesWarning {
    RulesWarning {
        kind,
        location: SqlLocation {
            kind: ctx.kind,
            rule: ctx.rule.to_string(),
            query_label: ctx.label.clone(),
            sql: ctx.sql.to_string(),
            line: start.line.max(1),
            column: start.column.max(1),
        },
        excerpt: excerpt.to_string(),
        message,
        hint,
    }
}

/// A warning about the whole query of `ctx`.
fn whole_query(
    ctx: &QueryCtx<'_>,
    kind: WarningKind,
    message: String,
    hint: String,
) -> RulesWarning {
    at(ctx, kind, Location::new(1, 1), ctx.sql, message, hint)
}

/// A warning about the file's structure (a key, a CTE's name), not inside a query.
fn structural(
    kind: WarningKind,
    where_kind: &'static str,
    rule: &str,
    label: &str,
    excerpt: &str,
    message: String,
    hint: String,
) -> RulesWarning {
    RulesWarning {
        kind,
        location: SqlLocation {
            kind: where_kind,
            rule: rule.to_string(),
            query_label: label.to_string(),
            sql: String::new(),
            line: 0,
            column: 0,
        },
        excerpt: excerpt.to_string(),
        message,
        hint,
    }
}

/// The text of `span` in `sql`.
fn span_text(sql: &str, span: Span) -> Option<&str> {
    sql.get(offset_of(sql, span.start)?..offset_of(sql, span.end)?)
}

/// `ns.name(...)`: the namespace and name of a function call written with one.
fn qualified_call(f: &sqlparser::ast::Function) -> Option<(String, String)> {
    match f.name.0.as_slice() {
        [ObjectNamePart::Identifier(ns), ObjectNamePart::Identifier(name)] => {
            Some((ident_name(ns), ident_name(name)))
        }
        _ => None,
    }
}

/// Whether the query calls `subscription.parameter(…)` or `subscription.parameters()`.
fn reads_subscription(select: &Select) -> bool {
    struct Calls(bool);
    impl Visitor for Calls {
        type Break = ();
        fn pre_visit_expr(&mut self, e: &sqlparser::ast::Expr) -> ControlFlow<()> {
            if let sqlparser::ast::Expr::Function(f) = e {
                if qualified_call(f).is_some_and(|(ns, _)| ns == "subscription") {
                    self.0 = true;
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        }
    }
    let mut calls = Calls(false);
    let _ = select.visit(&mut calls);
    calls.0
}
