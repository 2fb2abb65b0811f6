//! `streams` (editions 2 and 3) → data evaluators, lookup creators and request resolvers.
//!
//! Supported shape per query: one data table, optionally joined (comma form) with CTEs from
//! `with:`, filtered by a conjunction of row predicates, request predicates and links
//! (`row = auth.user_id()`, `row = subscription.parameter('p')`, `row = cte.col`,
//! `row IN (SELECT ...)`, `row IN <request array>`, `<request> IN <row array>`). Each link
//! becomes one bucket parameter, in the order written.

use sqlparser::ast::{Query, SetExpr, Spanned};
use sqlparser::tokenizer::Span;

use super::lookup::{lookup_query, LookupQuery};
use super::select_list::{data_projection, Shape};
use super::{from_items, FromItem, MAX_BRANCHES};
use crate::bucket::BucketVersion;
use crate::error::RulesError;
use crate::expr::Expr;
use crate::fingerprint::{self, Fingerprint};
use crate::options::Compatibility;
use crate::plan::{DataEvaluator, LookupCreator, ParamFilter, TableRef};
use crate::request::{BucketResolver, LookupGroup, ParamSource};
use crate::sql::filter::{classify, to_dnf, Cond, LinkTarget};
use crate::sql::lower::fix_in_precedence;
use crate::sql::parse::parse_select;
use crate::sql::scope::{RequestStyle, Scope};
use crate::sql::QueryCtx;
use crate::value::Value;
use crate::yaml::RawStream;

/// What errors call a stream.
const KIND: &str = "stream";

/// A compiled stream.
pub(crate) struct CompiledStream {
    pub resolvers: Vec<BucketResolver>,
    pub data: Vec<(TableRef, DataEvaluator)>,
    pub lookups: Vec<(TableRef, LookupCreator)>,
    /// What the stream makes of rows (its bucket names carry it).
    pub fingerprint: Fingerprint,
}

/// Compile one stream; `global_with` are the file-level CTEs.
pub(crate) fn compile(
    s: &RawStream,
    global_with: &[(String, String)],
    compat: Compatibility,
    version: BucketVersion,
) -> Result<CompiledStream, RulesError> {
    let fingerprint = fingerprint::of_stream(s, global_with, compat);
    let sources = LookupSources {
        stream: super::lookup_source(version, &s.name, &fingerprint),
        global: super::lookup_source(
            version,
            "$with",
            &fingerprint::of_global_with(global_with, compat),
        ),
    };
    let mut out = CompiledStream {
        resolvers: Vec::new(),
        data: Vec::new(),
        lookups: Vec::new(),
        fingerprint,
    };
    for (k, sql) in s.queries.iter().enumerate() {
        let label = if s.uses_queries_key {
            format!("queries[{k}]")
        } else {
            "query".to_string()
        };
        let ctx = QueryCtx::new(KIND, &s.name, label, sql, compat);
        let prefix = version.prefix(&format!("{}|{k}", s.name), &fingerprint);
        query(&ctx, s, k, global_with, prefix, &sources, &mut out)?;
    }
    Ok(out)
}

/// The names a stream's lookups are stored under (see `lookup_source`): its own CTEs and
/// subqueries, and the file's CTEs (shared by every stream that reads them).
struct LookupSources {
    stream: String,
    global: String,
}

fn cte_lookup(
    s: &RawStream,
    global_with: &[(String, String)],
    name: &str,
    compat: Compatibility,
    sources: &LookupSources,
) -> Option<Result<LookupQuery, RulesError>> {
    let (source, sql) = if let Some((_, q)) = s.with.iter().find(|(n, _)| n == name) {
        (sources.stream.clone(), q)
    } else {
        let (_, q) = global_with.iter().find(|(n, _)| n == name)?;
        (sources.global.clone(), q)
    };
    let ctx = QueryCtx::new(KIND, &s.name, format!("with.{name}"), sql, compat);
    Some(parse_select(&ctx, sql).and_then(|sel| {
        lookup_query(
            &ctx,
            &sel,
            &source,
            &format!("with.{name}"),
            RequestStyle::Streams,
        )
    }))
}

fn query(
    ctx: &QueryCtx<'_>,
    s: &RawStream,
    k: usize,
    global_with: &[(String, String)],
    prefix: String,
    sources: &LookupSources,
    out: &mut CompiledStream,
) -> Result<(), RulesError> {
    let select = parse_select(ctx, ctx.sql)?;
    let from = from_items(ctx, &select)?;
    let Some(data_table) = from.first().cloned() else {
        return Err(ctx.err(
            select.select_token.0.span,
            "a stream query needs FROM <table>",
            "`SELECT ... FROM <table> WHERE ...`",
        ));
    };
    // Everything after the first FROM item must be a CTE.
    let mut links = joined_ctes(ctx, s, &from[1..], global_with, sources, out)?;
    let mut scope = Scope {
        table_qualifiers: [
            Some(data_table.table.name.clone()),
            data_table.alias.clone(),
        ]
        .into_iter()
        .flatten()
        .collect(),
        has_table: true,
        ref_qualifiers: links.aliases.iter().map(|(a, _)| a.clone()).collect(),
        request: RequestStyle::Streams,
        slots: Vec::new(),
    };
    let shape = data_projection(ctx, &mut scope, &select)?;
    let mut row_filters: Vec<Expr> = Vec::new();
    let mut request_filters = Vec::new();
    if let Some(w) = &select.selection {
        let f = classify(ctx, &mut scope, &fix_in_precedence(w))?;
        let branches = to_dnf(&f, MAX_BRANCHES).unwrap_or_default();
        let [branch] = branches.as_slice() else {
            return Err(ctx.err(
                w.span(),
                "OR between parameter conditions is not supported in a stream query",
                "split the alternatives into separate entries under `queries:`",
            ));
        };
        row_filters.extend(branch.rows.iter().cloned());
        request_filters.extend(branch.requests.iter().cloned());
        for link in &branch.links {
            links.add(ctx, k, sources, link, out)?;
        }
    }
    if let Some((alias, _)) = links
        .aliases
        .iter()
        .find(|(a, _)| !links.used_aliases.contains(a))
    {
        return Err(ctx.err(
            select.select_token.0.span,
            format!("CTE `{alias}` is joined but never compared with the table"),
            format!("add `WHERE <table>.<column> = {alias}.<column>`"),
        ));
    }
    let data = DataQuery {
        table: data_table,
        prefix,
        slots: scope.slots,
        shape,
        row_filters,
    };
    push_query(ctx, data, request_filters, links, out);
    Ok(())
}

/// What a stream query's links add up to: the lookup groups and CTE aliases it reads, the
/// bucket parameters, and the data side's filters on them.
struct Links {
    groups: Vec<LookupGroup>,
    /// `(alias, output names)` per group.
    aliases: Vec<(String, Vec<String>)>,
    data_params: Vec<ParamFilter>,
    params: Vec<ParamSource>,
    /// Aliases some link compared with the table.
    used_aliases: Vec<String>,
}

/// The CTEs joined after the data table (comma form): each becomes a lookup group.
fn joined_ctes(
    ctx: &QueryCtx<'_>,
    s: &RawStream,
    joined: &[FromItem],
    global_with: &[(String, String)],
    sources: &LookupSources,
    out: &mut CompiledStream,
) -> Result<Links, RulesError> {
    let mut groups = Vec::new();
    let mut aliases: Vec<(String, Vec<String>)> = Vec::new();
    for item in joined {
        if item.has_schema {
            return Err(ctx.err(
                item.span,
                "only one table per stream query",
                "join CTEs from `with:` only, or use `IN (SELECT ...)`",
            ));
        }
        let name = &item.table.name;
        let Some(q) = cte_lookup(s, global_with, name, ctx.compat, sources) else {
            return Err(ctx.err(
                item.span,
                format!("`{name}` is neither a CTE of this stream nor a global CTE; joining tables is not supported"),
                "define it under `with:` (one table filtered by request values), or use `IN (SELECT ...)`",
            ));
        };
        let q = q?;
        if let Some(c) = q.creator {
            out.lookups.push(c);
        }
        let alias = item.alias.clone().unwrap_or_else(|| name.clone());
        aliases.push((alias, q.outputs.clone()));
        groups.push(q.group);
    }
    Ok(Links {
        groups,
        aliases,
        data_params: Vec::new(),
        params: Vec::new(),
        used_aliases: Vec::new(),
    })
}

impl Links {
    /// One link of the WHERE clause becomes the next bucket parameter.
    fn add(
        &mut self,
        ctx: &QueryCtx<'_>,
        k: usize,
        sources: &LookupSources,
        link: &Cond,
        out: &mut CompiledStream,
    ) -> Result<(), RulesError> {
        let i = self.params.len();
        match link {
            Cond::Link {
                row,
                row_expands,
                target,
                target_expands,
                span,
            } => {
                self.data_params.push(ParamFilter::Param {
                    param: i,
                    row: row.clone(),
                    expands: *row_expands,
                });
                let param = match target {
                    LinkTarget::Request(e) => ParamSource::Request {
                        expr: e.clone(),
                        expands: *target_expands,
                    },
                    LinkTarget::Ref {
                        qualifier, name, ..
                    } => self.cte_output(ctx, qualifier, name, *span)?,
                };
                self.params.push(param);
            }
            Cond::Subquery { row, query, span } => {
                self.subquery(ctx, k, sources, i, row, query, *span, out)?
            }
            Cond::Row(_) | Cond::Request(_) => {}
        }
        Ok(())
    }

    /// `row = cte.col`: the parameter is that output of the CTE's lookup group.
    fn cte_output(
        &mut self,
        ctx: &QueryCtx<'_>,
        qualifier: &str,
        name: &str,
        span: Span,
    ) -> Result<ParamSource, RulesError> {
        let aliases = &self.aliases;
        let group = aliases
            .iter()
            .position(|(a, _)| a == qualifier)
            .unwrap_or(0);
        let output = aliases
            .get(group)
            .and_then(|(_, outs)| outs.iter().position(|o| o == name))
            .ok_or_else(|| {
                ctx.err(
                    span,
                    format!("`{qualifier}.{name}` is not an output column of the CTE"),
                    format!(
                        "one of: {}",
                        aliases
                            .get(group)
                            .map(|(_, o)| o.join(", "))
                            .unwrap_or_default()
                    ),
                )
            })?;
        if !self.used_aliases.iter().any(|a| a == qualifier) {
            self.used_aliases.push(qualifier.to_owned());
        }
        Ok(ParamSource::Lookup { group, output })
    }

    /// `row IN (SELECT ...)`: the subquery becomes a lookup group of its own, parameter `i`
    /// its one output.
    #[allow(clippy::too_many_arguments)]
    fn subquery(
        &mut self,
        ctx: &QueryCtx<'_>,
        k: usize,
        sources: &LookupSources,
        i: usize,
        row: &Expr,
        query: &Query,
        span: Span,
        out: &mut CompiledStream,
    ) -> Result<(), RulesError> {
        let sub = match query.body.as_ref() {
            SetExpr::Select(sel)
                if query.with.is_none()
                    && query.order_by.is_none()
                    && query.limit_clause.is_none() =>
            {
                sel
            }
            _ => {
                return Err(ctx.err(
                    span,
                    "only a plain SELECT is supported inside IN (...)",
                    "`IN (SELECT col FROM t WHERE ...)`",
                ))
            }
        };
        let id = format!("{k}.sub{}", self.groups.len());
        let q = lookup_query(ctx, sub, &sources.stream, &id, RequestStyle::Streams)?;
        if q.outputs.len() != 1 {
            return Err(ctx.err(
                span,
                "a subquery in IN must select exactly one column",
                "`IN (SELECT col FROM t WHERE ...)`",
            ));
        }
        if let Some(c) = q.creator {
            out.lookups.push(c);
        }
        self.data_params.push(ParamFilter::Param {
            param: i,
            row: row.clone(),
            expands: false,
        });
        self.params.push(ParamSource::Lookup {
            group: self.groups.len(),
            output: 0,
        });
        self.groups.push(q.group);
        self.aliases.push((format!("$sub{i}"), q.outputs));
        self.used_aliases.push(format!("$sub{i}"));
        Ok(())
    }
}

/// The data side of one stream query, checked.
struct DataQuery {
    table: FromItem,
    prefix: String,
    slots: Vec<String>,
    shape: Shape,
    row_filters: Vec<Expr>,
}

/// Adds a checked query to the stream: its data evaluator and its request resolver.
fn push_query(
    ctx: &QueryCtx<'_>,
    data: DataQuery,
    request_filters: Vec<Expr>,
    links: Links,
    out: &mut CompiledStream,
) {
    let DataQuery {
        table: data_table,
        prefix,
        slots,
        shape,
        row_filters,
    } = data;
    let Links {
        groups,
        data_params,
        params,
        ..
    } = links;
    let mut filter_items: Vec<ParamFilter> =
        row_filters.into_iter().map(ParamFilter::Pred).collect();
    filter_items.extend(data_params);
    let filter = if filter_items.is_empty() {
        ParamFilter::Pred(Expr::Literal(Value::Integer(1)))
    } else {
        ParamFilter::And(filter_items)
    };
    out.data.push((
        data_table.table.clone(),
        DataEvaluator {
            prefix: prefix.clone(),
            object_type: data_table
                .alias
                .clone()
                .or(Some(data_table.table.name.clone())),
            slots,
            projection: shape.projection,
            explicit: shape.explicit,
            id: shape.id,
            filter,
            params: params.len(),
        },
    ));
    out.resolvers.push(BucketResolver {
        prefix,
        request_filters,
        groups,
        params,
        priority: None,
        null_makes_no_bucket: ctx.compat.edition >= 3,
    });
}
