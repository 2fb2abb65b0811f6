//! Compiling checked YAML into plans: shared pieces (FROM here, SELECT lists in
//! `select_list`, parameter/lookup queries in `lookup`). `legacy` handles
//! `bucket_definitions`, `streams` handles sync streams.

pub(crate) mod bucket_sources;
pub mod events;
pub mod joins;
pub mod legacy;
pub mod lookup;
pub(crate) mod param_order;
pub mod select_list;
pub(crate) mod stream_ctes;
pub mod streams;
pub(crate) mod variants;
pub(crate) mod warnings;

use sqlparser::ast::{ObjectNamePart, Select, Spanned, TableFactor};

use super::error::RulesError;
use super::plan::TableRef;
use super::sql::scope::{RequestStyle, Scope};
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
        out.push(from_item(ctx, &twj.relation)?);
    }
    Ok(out)
}

/// The one table a query over rows reads (a data query, an event payload): `what` names
/// the query in the errors for none and for several.
pub(crate) fn one_row_table(
    ctx: &QueryCtx<'_>,
    select: &Select,
    what: &str,
) -> Result<FromItem, RulesError> {
    let from = from_items(ctx, select)?;
    match from.as_slice() {
        [t] => Ok(t.clone()),
        [] => Err(ctx.err(
            select.select_token.0.span,
            format!("{what} needs FROM <table>"),
            "`SELECT ... FROM <table>`",
        )),
        [_, second, ..] => Err(ctx.err(
            second.span,
            format!("{what} reads exactly one table"),
            "one table per query; add another query for other tables",
        )),
    }
}

/// The scope of a query over rows of `table` (its name and alias qualify columns), where
/// request values are refused and `refs` qualify references (`bucket`).
pub(crate) fn row_scope(table: &FromItem, refs: Vec<String>) -> Scope {
    Scope {
        table_qualifiers: [Some(table.table.name.clone()), table.alias.clone()]
            .into_iter()
            .flatten()
            .collect(),
        has_table: true,
        ref_qualifiers: refs,
        request: RequestStyle::Forbidden,
        slots: Vec::new(),
    }
}

/// One named relation of FROM: `[schema.]table [AS alias]`.
pub(crate) fn from_item(
    ctx: &QueryCtx<'_>,
    relation: &TableFactor,
) -> Result<FromItem, RulesError> {
    match relation {
        TableFactor::Table {
            name, alias, args, ..
        } => {
            if args.is_some() {
                return Err(ctx.err(
                    relation.span(),
                    "table-valued functions (such as json_each) are not supported",
                    "a table name; expand JSON arrays with `x IN <json array>` instead",
                ));
            }
            if alias.as_ref().is_some_and(|a| !a.columns.is_empty()) {
                return Err(ctx.err(
                    relation.span(),
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
                            relation.span(),
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
                        relation.span(),
                        "database-qualified table names are not supported",
                        "`[schema.]table`",
                    ))
                }
            };
            Ok(FromItem {
                table: TableRef {
                    schema,
                    name: table,
                },
                has_schema,
                alias: alias.as_ref().map(|a| ident_name(&a.name)),
                span: relation.span(),
            })
        }
        other => Err(ctx.err(
            other.span(),
            "only plain table names are supported in FROM (no subqueries or functions)",
            "`FROM [schema.]table [AS name]`",
        )),
    }
}

/// The name a definition's lookups are stored under: tagged like its bucket names when
/// names are derived (two versions of a definition, evaluated side by side during a
/// deploy, never share lookups), its plain name otherwise (stores of earlier builds).
pub(crate) fn lookup_source(
    version: crate::bucket::BucketVersion,
    name: &str,
    fingerprint: &crate::fingerprint::Fingerprint,
) -> String {
    match version {
        crate::bucket::BucketVersion::Derived(_) => version.prefix(name, fingerprint),
        _ => name.to_owned(),
    }
}
