//! `streams` (editions 2 and 3) → data evaluators, lookup creators and request resolvers.
//!
//! Supported shape per query: one data table, optionally joined (comma form) with CTEs from
//! `with:`, filtered by a conjunction of row predicates, request predicates and links
//! (`row = auth.user_id()`, `row = subscription.parameter('p')`, `row = cte.col`,
//! `row IN (SELECT ...)`, `row IN <request array>`, `<request> IN <row array>`). Each link
//! becomes one bucket parameter, in the order written.

use sqlparser::ast::{Query, Spanned};
use sqlparser::tokenizer::Span;

use super::bucket_sources::{self, StreamBucket};
use super::lookup::{in_subquery, lookup_query, plain_select, LookupQuery};
use super::select_list::{data_projection, Shape};
use super::stream_ctes::{cte_column, LookupSources};
use super::{from_items, joins, param_order, variants, FromItem, MAX_BRANCHES};
use crate::bucket::BucketVersion;
use crate::error::RulesError;
use crate::expr::Expr;
use crate::fingerprint::{self, Fingerprint};
use crate::options::Compatibility;
use crate::plan::{DataEvaluator, LookupCreator, ParamFilter, StreamColumns, TableRef};
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

/// Most buckets one stream may define at edition 3 (its queries and their `OR` variants,
/// after merging), as in the official compiler.
const MAX_BUCKET_SOURCES: usize = 100;

/// A compiled stream.
pub(crate) struct CompiledStream {
    /// Its buckets, not yet named (see `bucket_sources`).
    pub buckets: Vec<StreamBucket>,
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
        stream_name: s.name.clone(),
        stream_with: s.with.clone(),
        global_with: global_with.to_vec(),
    };
    let mut out = CompiledStream {
        buckets: Vec::new(),
        lookups: Vec::new(),
        fingerprint,
    };
    let mut counter = 0;
    for (k, sql) in s.queries.iter().enumerate() {
        let label = if s.uses_queries_key {
            format!("queries[{k}]")
        } else {
            "query".to_string()
        };
        let ctx = QueryCtx::new(KIND, &s.name, label, sql, compat);
        query(&ctx, s, k, &mut counter, &sources, &mut out)?;
    }
    if compat.edition >= 3 {
        out.buckets = bucket_sources::merge_within_stream(std::mem::take(&mut out.buckets));
        if out.buckets.len() > MAX_BUCKET_SOURCES {
            let ctx = QueryCtx::new(KIND, &s.name, "queries".to_string(), "", compat);
            return Err(ctx.err_at(
                1,
                1,
                format!(
                    "the stream defines {} buckets; at most {MAX_BUCKET_SOURCES} are allowed",
                    out.buckets.len()
                ),
                "split the queries into separate streams, or move inner OR operators into separate queries",
            ));
        }
    }
    Ok(out)
}

/// One query of a stream: at edition 3 one compiled query per variant of its WHERE clause
/// (see `variants`), each named by the stream's next number (`counter`).
fn query(
    ctx: &QueryCtx<'_>,
    s: &RawStream,
    k: usize,
    counter: &mut usize,
    sources: &LookupSources,
    out: &mut CompiledStream,
) -> Result<(), RulesError> {
    let select = parse_select(ctx, ctx.sql)?;
    let is_cte = |name: &str| sources.is_cte(name);
    let (select, joined) = match joins::take_apart(ctx, &select, &is_cte)? {
        Some(j) => (j.select, j.lookups),
        None => (select, Vec::new()),
    };
    let from = from_items(ctx, &select)?;
    let Some(data_table) = from.first() else {
        return Err(ctx.err(
            select.select_token.0.span,
            "a stream query needs FROM <table>",
            "`SELECT ... FROM <table> WHERE ...`",
        ));
    };
    let variants = if ctx.compat.edition >= 3 {
        let data: Vec<String> = [
            Some(data_table.table.name.clone()),
            data_table.alias.clone(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let refs: Vec<String> = from[1..]
            .iter()
            .map(|f| f.alias.clone().unwrap_or_else(|| f.table.name.clone()))
            .chain(joined.iter().map(|(alias, _)| alias.clone()))
            .collect();
        let reads = |e: &sqlparser::ast::Expr| variants::atom_reads(e, &data, &refs);
        variants::split(ctx, select.selection.as_ref(), &reads)?
    } else {
        vec![select.selection.clone()]
    };
    for (v, selection) in variants.into_iter().enumerate() {
        // Lookup ids of the first variant are those of earlier builds (stores keep them).
        let id = if v == 0 {
            k.to_string()
        } else {
            format!("{k}v{v}")
        };
        let name = format!("{}|{counter}", s.name);
        *counter += 1;
        let mut variant = select.clone();
        variant.selection = selection;
        let parts = QueryParts {
            id: &id,
            select: &variant,
            from: &from,
            joined: joined.clone(),
        };
        compile_variant(ctx, parts, name, sources, out)?;
    }
    Ok(())
}

/// A stream query (one variant of it) taken apart.
struct QueryParts<'q> {
    /// What its lookup ids start with.
    id: &'q str,
    select: &'q sqlparser::ast::Select,
    from: &'q [FromItem],
    /// The lookups standing for its joined tables.
    joined: Vec<(String, sqlparser::ast::Select)>,
}

fn compile_variant(
    ctx: &QueryCtx<'_>,
    parts: QueryParts<'_>,
    name: String,
    sources: &LookupSources,
    out: &mut CompiledStream,
) -> Result<(), RulesError> {
    let QueryParts {
        id,
        select,
        from,
        joined,
    } = parts;
    let data_table = from[0].clone();
    // Everything after the first FROM item must be a CTE.
    let mut links = joined_ctes(ctx, &from[1..], sources, out)?;
    for (n, (alias, lookup)) in joined.into_iter().enumerate() {
        let lookup_id = format!("{id}.join{n}");
        let mut q = lookup_query(
            ctx,
            &lookup,
            &sources.stream,
            &lookup_id,
            RequestStyle::Streams,
        )?;
        out.lookups.append(&mut q.creators);
        let group = q.push_groups(&mut links.groups);
        links.aliases.push((alias, group, q.outputs));
    }
    let mut scope = Scope {
        table_qualifiers: [
            Some(data_table.table.name.clone()),
            data_table.alias.clone(),
        ]
        .into_iter()
        .flatten()
        .collect(),
        has_table: true,
        ref_qualifiers: links.aliases.iter().map(|(a, ..)| a.clone()).collect(),
        request: RequestStyle::Streams,
        slots: Vec::new(),
    };
    let shape = data_projection(ctx, &mut scope, select)?;
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
        // At edition 3 a condition that reads no column filters requests, not rows.
        for r in &branch.rows {
            if ctx.compat.edition >= 3 && !r.uses_row() {
                request_filters.push(r.clone());
            } else {
                row_filters.push(r.clone());
            }
        }
        request_filters.extend(branch.requests.iter().cloned());
        for link in &branch.links {
            links.add(ctx, id, sources, link, out)?;
        }
    }
    let data = DataQuery {
        table: data_table,
        name,
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
    /// `(alias, its group, output names)` per CTE or subquery.
    aliases: Vec<(String, usize, Vec<String>)>,
    data_params: Vec<ParamFilter>,
    params: Vec<ParamSource>,
    /// Aliases some link compared with the table.
    used_aliases: Vec<String>,
}

/// The CTEs joined after the data table (comma form; `joins` took the queries that join
/// tables apart): each becomes a lookup group.
fn joined_ctes(
    ctx: &QueryCtx<'_>,
    joined: &[FromItem],
    sources: &LookupSources,
    out: &mut CompiledStream,
) -> Result<Links, RulesError> {
    let mut groups = Vec::new();
    let mut aliases: Vec<(String, usize, Vec<String>)> = Vec::new();
    for item in joined {
        let name = &item.table.name;
        let Some(q) = sources.cte(name, ctx.compat) else {
            return Err(ctx.err(
                item.span,
                format!("`{name}` is neither a CTE of this stream nor a global CTE"),
                "define it under `with:`, or join the table (`JOIN <table> ON ...`)",
            ));
        };
        let mut q = q?;
        out.lookups.append(&mut q.creators);
        let alias = item.alias.clone().unwrap_or_else(|| name.clone());
        let group = q.push_groups(&mut groups);
        aliases.push((alias, group, q.outputs.clone()));
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
        id: &str,
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
                self.subquery(ctx, id, sources, i, row, query, *span, out)?
            }
            Cond::Gate { value, query, span } => {
                self.gate(ctx, id, sources, value, query, *span, out)?
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
        let Some((_, group, outputs)) = self.aliases.iter().find(|(a, ..)| a == qualifier) else {
            return Err(ctx.err(
                span,
                format!("`{qualifier}` is not a CTE joined in this query"),
                "join the CTE after a comma (`FROM t, cte AS alias`)",
            ));
        };
        let group = *group;
        let output = outputs.iter().position(|o| o == name).ok_or_else(|| {
            ctx.err(
                span,
                format!("`{qualifier}.{name}` is not an output column of the CTE"),
                format!("one of: {}", outputs.join(", ")),
            )
        })?;
        if !self.used_aliases.iter().any(|a| a == qualifier) {
            self.used_aliases.push(qualifier.to_owned());
        }
        Ok(ParamSource::Lookup { group, output })
    }

    /// `<request value> IN (SELECT col FROM t WHERE ...)`: the subquery, with `col = <request
    /// value>` added, becomes a lookup group that gives no parameter: a request whose group
    /// has no row gets none of the query's buckets (the official compiler's EXISTS).
    #[allow(clippy::too_many_arguments)]
    fn gate(
        &mut self,
        ctx: &QueryCtx<'_>,
        id: &str,
        sources: &LookupSources,
        value: &sqlparser::ast::Expr,
        query: &Query,
        span: Span,
        out: &mut CompiledStream,
    ) -> Result<(), RulesError> {
        let sub = plain_select(ctx, query, span)?;
        let [item] = sub.projection.as_slice() else {
            return Err(ctx.err(
                span,
                "a subquery in IN must select exactly one column",
                "`IN (SELECT col FROM t WHERE ...)`",
            ));
        };
        let output = match item {
            sqlparser::ast::SelectItem::UnnamedExpr(e)
            | sqlparser::ast::SelectItem::ExprWithAlias { expr: e, .. } => e.clone(),
            other => {
                return Err(ctx.err(
                    other.span(),
                    "a subquery in IN must select one column",
                    "`IN (SELECT col FROM t WHERE ...)`",
                ))
            }
        };
        let matches = sqlparser::ast::Expr::BinaryOp {
            left: Box::new(output),
            op: sqlparser::ast::BinaryOperator::Eq,
            right: Box::new(value.clone()),
        };
        let mut gated = sub.clone();
        gated.selection = Some(match sub.selection.clone() {
            Some(w) => sqlparser::ast::Expr::BinaryOp {
                left: Box::new(sqlparser::ast::Expr::Nested(Box::new(w))),
                op: sqlparser::ast::BinaryOperator::And,
                right: Box::new(matches),
            },
            None => matches,
        });
        let gate_id = format!("{id}.gate{}", self.groups.len());
        let mut q = lookup_query(
            ctx,
            &gated,
            &sources.stream,
            &gate_id,
            RequestStyle::Streams,
        )?;
        out.lookups.append(&mut q.creators);
        q.push_groups(&mut self.groups);
        Ok(())
    }

    /// `row IN (SELECT ...)`: the subquery becomes a lookup group of its own, parameter `i`
    /// its one output.
    #[allow(clippy::too_many_arguments)]
    fn subquery(
        &mut self,
        ctx: &QueryCtx<'_>,
        id: &str,
        sources: &LookupSources,
        i: usize,
        row: &Expr,
        query: &Query,
        span: Span,
        out: &mut CompiledStream,
    ) -> Result<(), RulesError> {
        if let Some((cte, column)) = cte_column(ctx, query, span, sources)? {
            return self.cte_subquery(ctx, sources, i, row, (&cte, &column), span, out);
        }
        let sub_id = format!("{id}.sub{}", self.groups.len());
        let q = in_subquery(
            ctx,
            query,
            span,
            &sources.stream,
            &sub_id,
            RequestStyle::Streams,
        )?;
        self.lookup_param(i, row, q, 0, out);
        Ok(())
    }
}

impl Links {
    /// `row IN (SELECT col FROM cte)`: the CTE's lookup group, parameter `i` its output
    /// `col`, as when the CTE is joined (`FROM t, cte AS c WHERE row = c.col`).
    #[allow(clippy::too_many_arguments)]
    fn cte_subquery(
        &mut self,
        ctx: &QueryCtx<'_>,
        sources: &LookupSources,
        i: usize,
        row: &Expr,
        (cte, column): (&str, &str),
        span: Span,
        out: &mut CompiledStream,
    ) -> Result<(), RulesError> {
        let Some(q) = sources.cte(cte, ctx.compat) else {
            return Err(ctx.err(
                span,
                format!("`{cte}` is not a CTE"),
                "define it under `with:`",
            ));
        };
        let q = q?;
        let Some(output) = q.outputs.iter().position(|o| o == column) else {
            return Err(ctx.err(
                span,
                format!("`{column}` is not an output column of CTE `{cte}`"),
                format!("one of: {}", q.outputs.join(", ")),
            ));
        };
        self.lookup_param(i, row, q, output, out);
        Ok(())
    }

    /// Parameter `i`: `row` equal to output `output` of `q`'s group (a subquery's).
    fn lookup_param(
        &mut self,
        i: usize,
        row: &Expr,
        mut q: LookupQuery,
        output: usize,
        out: &mut CompiledStream,
    ) {
        out.lookups.append(&mut q.creators);
        self.data_params.push(ParamFilter::Param {
            param: i,
            row: row.clone(),
            expands: false,
        });
        let group = q.push_groups(&mut self.groups);
        self.params.push(ParamSource::Lookup { group, output });
        self.aliases.push((format!("$sub{i}"), group, q.outputs));
        self.used_aliases.push(format!("$sub{i}"));
    }
}

/// One parameter per row expression (edition 3): a row value compared with several things
/// (`t.a = m.x AND t.a = m.y`) is one bucket parameter whose value must be all of them, as
/// the official compiler keys a bucket by the row expressions it partitions by.
fn merge_same_keys(data_params: &mut Vec<ParamFilter>, params: &mut Vec<ParamSource>) {
    let mut written: Vec<Option<ParamSource>> = params.drain(..).map(Some).collect();
    let mut kept: Vec<ParamFilter> = Vec::new();
    let mut sources: Vec<Vec<ParamSource>> = Vec::new();
    for f in data_params.drain(..) {
        let ParamFilter::Param {
            param,
            row,
            expands,
        } = f
        else {
            kept.push(f);
            continue;
        };
        let source = written.get_mut(param).and_then(Option::take);
        let same = kept.iter().position(|k| {
            matches!(k, ParamFilter::Param { row: r, expands: false, .. } if !expands && *r == row)
        });
        match (same, source) {
            (Some(j), Some(source)) => sources[j].push(source),
            (_, source) => {
                kept.push(ParamFilter::Param {
                    param: sources.len(),
                    row,
                    expands,
                });
                sources.push(source.into_iter().collect());
            }
        }
    }
    *data_params = kept;
    *params = sources
        .into_iter()
        .map(|mut v| match v.len() {
            1 => v.remove(0),
            _ => ParamSource::All(v),
        })
        .collect();
}

/// Puts the parameters in `order` (written indexes): the bucket's values follow it.
fn reorder(order: &[usize], data_params: &mut [ParamFilter], params: &mut Vec<ParamSource>) {
    for f in data_params.iter_mut() {
        if let ParamFilter::Param { param, .. } = f {
            *param = order.iter().position(|w| w == param).unwrap_or(*param);
        }
    }
    let mut written: Vec<Option<ParamSource>> = params.drain(..).map(Some).collect();
    params.extend(
        order
            .iter()
            .filter_map(|&w| written.get_mut(w).and_then(Option::take)),
    );
}

/// The data side of one stream query, checked.
struct DataQuery {
    table: FromItem,
    name: String,
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
        name,
        slots,
        shape,
        row_filters,
    } = data;
    let Links {
        groups,
        mut data_params,
        mut params,
        ..
    } = links;
    if ctx.compat.edition >= 3 {
        merge_same_keys(&mut data_params, &mut params);
        if let Some(order) = param_order::official_order(&data_params, &slots) {
            reorder(&order, &mut data_params, &mut params);
        }
    }
    let mut filter_items: Vec<ParamFilter> =
        row_filters.into_iter().map(ParamFilter::Pred).collect();
    filter_items.extend(data_params);
    let filter = if filter_items.is_empty() {
        ParamFilter::Pred(Expr::Literal(Value::Integer(1)))
    } else {
        ParamFilter::And(filter_items)
    };
    let evaluator = (
        data_table.table.clone(),
        DataEvaluator {
            prefix: String::new(),
            // An unaliased wildcard table's rows show their own table's name.
            object_type: data_table
                .alias
                .clone()
                .or((!data_table.table.is_pattern()).then(|| data_table.table.name.clone())),
            slots,
            projection: shape.projection,
            explicit: shape.explicit,
            id: shape.id,
            filter,
            params: params.len(),
            table_suffix: false,
            stream_columns: Some(StreamColumns {
                star_takes_underscored: ctx.compat.edition >= 3,
            }),
        },
    );
    out.buckets.push(StreamBucket {
        name,
        query_label: ctx.label.clone(),
        resolver: BucketResolver {
            prefix: String::new(),
            request_filters,
            groups,
            params,
            priority: None,
            null_makes_no_bucket: ctx.compat.edition >= 3,
        },
        evaluators: vec![evaluator],
    });
}
