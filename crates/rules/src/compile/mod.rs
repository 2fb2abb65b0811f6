//! Compiling checked YAML into plans: shared pieces (FROM, projections, parameter/lookup
//! queries). `legacy` handles `bucket_definitions`, `streams` handles sync streams.

pub mod legacy;
pub mod lookup;
pub mod streams;

pub(crate) use lookup::{lookup_query, LookupQuery};

use sqlparser::ast::{Expr as Ast, ObjectNamePart, Select, SelectItem, Spanned, TableFactor};

use super::error::RulesError;
use super::expr::Expr;
use super::plan::{key_json, Projection, TableRef};
use super::sql::lower::{fix_in_precedence, lower};
use super::sql::scope::Scope;
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
