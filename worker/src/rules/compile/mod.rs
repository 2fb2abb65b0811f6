//! Compiling checked YAML into plans: shared pieces (FROM, projections, parameter/lookup
//! queries). `legacy` handles `bucket_definitions`, `streams` handles sync streams.

pub mod legacy;
pub mod streams;

use sqlparser::ast::{Expr as Ast, ObjectNamePart, Select, SelectItem, Spanned, TableFactor};

use super::error::RulesError;
use super::expr::Expr;
use super::plan::{key_json, LookupBranch, LookupCreator, Projection, TableRef};
use super::request::{LookupGroup, RequestBranch};
use super::sql::filter::{classify, to_dnf, Cond, LinkTarget};
use super::sql::lower::{fix_in_precedence, lower, lower_side, RequestStyle, Scope, Side};
use super::sql::{ident_name, QueryCtx};

/// Most DNF branches one query may expand to; more is almost certainly a mistake.
pub(crate) const MAX_BRANCHES: usize = 16;

/// A named relation in FROM.
#[derive(Debug, Clone)]
pub(crate) struct FromItem {
    /// `schema.table` (schema defaults to `public`).
    pub table: TableRef,
    /// Whether a schema was written (a CTE reference never has one).
    pub has_schema: bool,
    /// The alias, if any.
    pub alias: Option<String>,
    /// Position for errors.
    pub span: sqlparser::tokenizer::Span,
}

/// Read the FROM list: plain named relations only (no joins, subqueries or functions).
pub(crate) fn from_items(ctx: &QueryCtx<'_>, select: &Select) -> Result<Vec<FromItem>, RulesError> {
    let mut out = Vec::new();
    for twj in &select.from {
        if let Some(j) = twj.joins.first() {
            return Err(ctx.err(
                j.relation.span(),
                "JOIN is not supported",
                "one table per query; in streams, list a CTE after a comma (`FROM t, cte AS bucket WHERE t.c = bucket.c`) or use `IN (SELECT ...)`",
            ));
        }
        match &twj.relation {
            TableFactor::Table {
                name, alias, args, ..
            } => {
                if args.is_some() {
                    return Err(ctx.err(
                        twj.relation.span(),
                        "table-valued functions (such as json_each) are not supported",
                        "a table name; expand JSON arrays with `x IN <json array>` instead",
                    ));
                }
                if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
                    return Err(ctx.err(
                        twj.relation.span(),
                        "column aliases on a table are not supported",
                        "`FROM table AS name`",
                    ));
                }
                let mut parts = Vec::new();
                for p in &name.0 {
                    match p {
                        ObjectNamePart::Identifier(id) => parts.push(ident_name(id)),
                        ObjectNamePart::Function(_) => {
                            return Err(ctx.err(
                                twj.relation.span(),
                                "this table name form is not supported",
                                "`[schema.]table`",
                            ))
                        }
                    }
                }
                let (schema, table, has_schema) = match parts.as_slice() {
                    [t] => ("public".to_string(), t.clone(), false),
                    [s, t] => (s.clone(), t.clone(), true),
                    _ => {
                        return Err(ctx.err(
                            twj.relation.span(),
                            "database-qualified table names are not supported",
                            "`[schema.]table`",
                        ))
                    }
                };
                if table.contains('%') {
                    return Err(ctx.err(
                        twj.relation.span(),
                        "wildcard table names (`%`) are not supported by powersync_mdbx yet",
                        "one query per table",
                    ));
                }
                out.push(FromItem {
                    table: TableRef {
                        schema,
                        name: table,
                    },
                    has_schema,
                    alias: alias.as_ref().map(|a| ident_name(&a.name)),
                    span: twj.relation.span(),
                });
            }
            other => {
                return Err(ctx.err(
                    other.span(),
                    "only plain table names are supported in FROM (no subqueries or functions)",
                    "`FROM [schema.]table [AS name]`",
                ))
            }
        }
    }
    Ok(out)
}

/// The output name of a projection item without alias: a bare column keeps its name.
fn implicit_name(e: &Ast) -> Option<String> {
    match e {
        Ast::Identifier(id) => Some(ident_name(id)),
        Ast::CompoundIdentifier(parts) if parts.len() == 2 => parts.last().map(ident_name),
        _ => None,
    }
}

/// A data query's projection: output columns and the `id` value.
pub(crate) struct Shape {
    pub projection: Vec<Projection>,
    pub explicit: Vec<String>,
    pub id: Option<Expr>,
}

/// Compile a data query's SELECT list (`*`, columns, `expr AS name`) and check `id`.
pub(crate) fn data_projection(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    select: &Select,
) -> Result<Shape, RulesError> {
    let mut shape = Shape {
        projection: Vec::new(),
        explicit: Vec::new(),
        id: None,
    };
    let mut has_star = false;
    for item in &select.projection {
        let (e, name) = match item {
            SelectItem::Wildcard(opts) => {
                if opts.opt_exclude.is_some()
                    || opts.opt_except.is_some()
                    || opts.opt_replace.is_some()
                    || opts.opt_rename.is_some()
                {
                    return Err(ctx.err(
                        item.span(),
                        "`*` options are not supported",
                        "`*` or explicit columns",
                    ));
                }
                has_star = true;
                shape.projection.push(Projection::Star);
                continue;
            }
            SelectItem::QualifiedWildcard(kind, _) => {
                let q = match kind {
                    sqlparser::ast::SelectItemQualifiedWildcardKind::ObjectName(n) => {
                        match n.0.as_slice() {
                            [ObjectNamePart::Identifier(id)] => ident_name(id),
                            _ => n.to_string(),
                        }
                    }
                    other => other.to_string(),
                };
                if !scope.table_qualifiers.contains(&q) {
                    return Err(ctx.err(
                        item.span(),
                        format!("`{q}.*` does not name the source table"),
                        "`*` or `<table>.*`",
                    ));
                }
                has_star = true;
                shape.projection.push(Projection::Star);
                continue;
            }
            SelectItem::UnnamedExpr(e) => match implicit_name(e) {
                Some(n) => (e, n),
                None => {
                    return Err(ctx.err(
                        e.span(),
                        format!("expression `{e}` needs a name"),
                        format!("`{e} AS <name>`"),
                    ))
                }
            },
            SelectItem::ExprWithAlias { expr, alias } => (expr, ident_name(alias)),
            other => {
                return Err(ctx.err(
                    other.span(),
                    "this SELECT item form is not supported",
                    "`expr AS name`",
                ))
            }
        };
        let fixed = fix_in_precedence(e);
        let lowered = lower(ctx, scope, &fixed)?;
        if lowered.uses_request() {
            return Err(ctx.err(
                e.span(),
                "data queries cannot output request values",
                "output row columns only",
            ));
        }
        if shape.explicit.contains(&name) {
            return Err(ctx.err(
                e.span(),
                format!("output column `{name}` appears twice"),
                "give each output column a unique name",
            ));
        }
        if name == "id" {
            shape.id = Some(lowered.clone());
        }
        shape.explicit.push(name.clone());
        shape.projection.push(Projection::Column {
            key_json: key_json(&name),
            name,
            expr: lowered,
        });
    }
    if shape.id.is_none() && !has_star {
        return Err(ctx.err(
            select.select_token.0.span,
            "query must return an \"id\" column",
            "add `id` (or `<expr> AS id`) to the SELECT list",
        ));
    }
    Ok(shape)
}

/// A compiled parameter/lookup query (legacy parameter query, stream CTE or subquery).
pub(crate) struct LookupQuery {
    /// The lookup creator and its table (table queries only).
    pub creator: Option<(TableRef, LookupCreator)>,
    /// The request side.
    pub group: LookupGroup,
    /// Output names, by position in a group row.
    pub outputs: Vec<String>,
    /// `_priority`, if given.
    pub priority: Option<u8>,
}

/// Compile a parameter query: static (no FROM) or table (one table, links to the request).
pub(crate) fn lookup_query(
    ctx: &QueryCtx<'_>,
    select: &Select,
    source: &str,
    query_id: &str,
    style: RequestStyle,
) -> Result<LookupQuery, RulesError> {
    let from = from_items(ctx, select)?;
    if from.len() > 1 {
        return Err(ctx.err(
            from[1].span,
            "a parameter query reads one table",
            "one table per parameter query",
        ));
    }
    let table = from.first().cloned();
    if let (Some(t), RequestStyle::Legacy) = (&table, style) {
        if t.alias.is_some() {
            return Err(ctx.err(
                t.span,
                "table aliases are not supported in parameter queries",
                "`FROM <table>` without alias",
            ));
        }
    }
    let mut scope = Scope {
        table_qualifiers: table
            .iter()
            .flat_map(|t| [Some(t.table.name.clone()), t.alias.clone()])
            .flatten()
            .collect(),
        has_table: table.is_some(),
        ref_qualifiers: Vec::new(),
        request: style,
        slots: Vec::new(),
    };
    let mut row_outputs: Vec<(String, Expr)> = Vec::new();
    let mut req_outputs: Vec<(String, Expr)> = Vec::new();
    let mut priority = None;
    for item in &select.projection {
        let (e, name) = match item {
            SelectItem::UnnamedExpr(e) => match implicit_name(e) {
                Some(n) => (e, n),
                None => {
                    return Err(ctx.err(
                        e.span(),
                        format!("expression `{e}` needs a name"),
                        format!("`{e} AS <name>`"),
                    ))
                }
            },
            SelectItem::ExprWithAlias { expr, alias } => (expr, ident_name(alias)),
            SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => {
                return Err(ctx.err(
                    item.span(),
                    "`*` is not allowed in a parameter query",
                    "list the parameter columns explicitly",
                ))
            }
            other => {
                return Err(ctx.err(
                    other.span(),
                    "this SELECT item form is not supported",
                    "`expr AS name`",
                ))
            }
        };
        if name == "_priority" {
            if priority.is_some() {
                return Err(ctx.err(e.span(), "`_priority` is set twice", "set `_priority` once"));
            }
            priority = Some(match e {
                Ast::Value(v) => match &v.value {
                    sqlparser::ast::Value::Number(n, _) => match n.parse::<u8>() {
                        Ok(p) if p <= 3 => p,
                        _ => {
                            return Err(ctx.err(
                                e.span(),
                                "`_priority` must be 0..3",
                                "`1 AS _priority`",
                            ))
                        }
                    },
                    _ => {
                        return Err(ctx.err(
                            e.span(),
                            "`_priority` must be an integer literal",
                            "`1 AS _priority`",
                        ))
                    }
                },
                _ => {
                    return Err(ctx.err(
                        e.span(),
                        "`_priority` must be an integer literal",
                        "`1 AS _priority`",
                    ))
                }
            });
            continue;
        }
        if row_outputs
            .iter()
            .chain(&req_outputs)
            .any(|(n, _)| *n == name)
        {
            return Err(ctx.err(
                e.span(),
                format!("output column `{name}` appears twice"),
                "unique output names",
            ));
        }
        match lower_side(ctx, &mut scope, &fix_in_precedence(e))? {
            Side::Row(x) => row_outputs.push((name, x)),
            Side::Request(x) | Side::Static(x) => req_outputs.push((name, x)),
            Side::Ref { .. } => {
                return Err(ctx.err(
                    e.span(),
                    "parameter references are not allowed here",
                    "row columns or request values",
                ))
            }
        }
    }
    let filter = match (&select.selection, &table) {
        (Some(w), Some(_)) => Some(classify(ctx, &mut scope, &fix_in_precedence(w))?),
        _ => None,
    };
    let Some(table) = table else {
        // Static: outputs and filter read only the request.
        // Without a table every condition reads only the request (columns were rejected
        // while lowering), so keep AND/OR/NOT exactly as written.
        let mut conds = Vec::new();
        if let Some(w) = &select.selection {
            conds.push(lower(ctx, &mut scope, &fix_in_precedence(w))?);
        }
        return Ok(LookupQuery {
            creator: None,
            outputs: req_outputs.iter().map(|(n, _)| n.clone()).collect(),
            group: LookupGroup::Static {
                outputs: req_outputs.into_iter().map(|(_, e)| e).collect(),
                filter: conds,
            },
            priority,
        });
    };
    let Some(filter) = filter else {
        return Err(ctx.err(
            select.select_token.0.span,
            "a parameter query that reads a table must filter it by request values",
            "`WHERE <table>.<column> = request.user_id()` (or auth.user_id() in streams)",
        ));
    };
    let branches = to_dnf(&filter, MAX_BRANCHES).ok_or_else(|| {
        ctx.err(
            select.select_token.0.span,
            "the WHERE clause expands to too many OR branches",
            "simplify the filter or split it into several queries",
        )
    })?;
    let mut creator_branches = Vec::new();
    let mut request_branches = Vec::new();
    let multi = branches.len() > 1;
    for (i, b) in branches.into_iter().enumerate() {
        let id = if multi {
            format!("{query_id}.{i}")
        } else {
            query_id.to_string()
        };
        let mut row_links = Vec::new();
        let mut req_links = Vec::new();
        let mut expanding = 0;
        for l in b.links {
            match l {
                Cond::Link {
                    row,
                    row_expands,
                    target: LinkTarget::Request(r),
                    target_expands,
                    span,
                } => {
                    if row_expands || target_expands {
                        expanding += 1;
                        if expanding > 1 {
                            return Err(ctx.err(
                                span,
                                "cannot have multiple array (IN) parameters in one parameter query",
                                "at most one `IN` link per query",
                            ));
                        }
                    }
                    row_links.push((row, row_expands));
                    req_links.push((r, target_expands));
                }
                Cond::Link { span, .. } | Cond::Subquery { span, .. } => {
                    return Err(ctx.err(
                        span,
                        "this condition is not supported in a parameter query",
                        "`<table>.<column> = <request value>` or IN forms",
                    ))
                }
                Cond::Row(_) | Cond::Request(_) => {}
            }
        }
        if row_links.is_empty() {
            return Err(ctx.err(
                select.selection.as_ref().map(|w| w.span()).unwrap_or(select.select_token.0.span),
                "every OR branch of a parameter query must compare a row column with a request value",
                "`<table>.<column> = request.user_id()` in each branch",
            ));
        }
        creator_branches.push(LookupBranch {
            query_id: id.clone(),
            rows: b.rows,
            links: row_links,
        });
        request_branches.push(RequestBranch {
            query_id: id,
            requests: b.requests,
            links: req_links,
        });
    }
    let mut outputs: Vec<String> = row_outputs.iter().map(|(n, _)| n.clone()).collect();
    outputs.extend(req_outputs.iter().map(|(n, _)| n.clone()));
    Ok(LookupQuery {
        creator: Some((
            table.table.clone(),
            LookupCreator {
                source: source.to_string(),
                slots: scope.slots.clone(),
                outputs: row_outputs.into_iter().map(|(_, e)| e).collect(),
                branches: creator_branches,
            },
        )),
        group: LookupGroup::Table {
            source: source.to_string(),
            branches: request_branches,
            request_outputs: req_outputs.into_iter().map(|(_, e)| e).collect(),
        },
        outputs,
        priority,
    })
}
