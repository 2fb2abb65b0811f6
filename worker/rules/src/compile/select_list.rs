//! SELECT lists: the named outputs of a query, and a data query's projection.

use sqlparser::ast::{
    Expr as Ast, ObjectNamePart, Select, SelectItem, SelectItemQualifiedWildcardKind, Spanned,
    WildcardAdditionalOptions,
};

use crate::error::RulesError;
use crate::expr::Expr;
use crate::plan::{key_json, Projection};
use crate::sql::lower::{fix_in_precedence, lower};
use crate::sql::scope::Scope;
use crate::sql::{ident_name, select_item_text, QueryCtx};

/// The output name of a projection item without alias: a bare column keeps its name.
fn implicit_name(e: &Ast) -> Option<String> {
    match e {
        Ast::Identifier(id) => Some(ident_name(id)),
        Ast::CompoundIdentifier(parts) if parts.len() == 2 => parts.last().map(ident_name),
        _ => None,
    }
}

/// What one SELECT list item outputs.
pub(crate) enum SelectOutput<'a> {
    /// An expression under its alias, or a bare column under its own name.
    Named(&'a Ast, String),
    /// `*`, with its options.
    Star(&'a WildcardAdditionalOptions),
    /// `<qualifier>.*`.
    QualifiedStar(&'a SelectItemQualifiedWildcardKind),
}

/// The error (message, hint) for a SELECT item of none of the supported forms.
pub(crate) type UnsupportedItem = (&'static str, &'static str);

/// What data and parameter queries say of an item form they do not support.
pub(crate) const UNSUPPORTED_ITEM: UnsupportedItem =
    ("this SELECT item form is not supported", "`expr AS name`");

/// Read one SELECT list item. An expression needs a name (an alias, or a bare column's own
/// name); an item of another form is the error `unsupported`. Whether `*` is allowed is the
/// caller's choice.
pub(crate) fn select_output<'a>(
    ctx: &QueryCtx<'_>,
    item: &'a SelectItem,
    unsupported: UnsupportedItem,
) -> Result<SelectOutput<'a>, RulesError> {
    match item {
        SelectItem::Wildcard(opts) => Ok(SelectOutput::Star(opts)),
        SelectItem::QualifiedWildcard(kind, _) => Ok(SelectOutput::QualifiedStar(kind)),
        SelectItem::UnnamedExpr(e) => match implicit_name(e) {
            Some(n) => Ok(SelectOutput::Named(e, n)),
            // The edition-3 compiler names it by its text as written (and warns).
            None if ctx.compat.edition >= 3 => match select_item_text(ctx.sql, e.span().start) {
                Some(text) => Ok(SelectOutput::Named(e, text.to_string())),
                None => Err(ctx.err(
                    e.span(),
                    format!("expression `{e}` needs a name"),
                    format!("`{e} AS <name>`"),
                )),
            },
            None => Err(ctx.err(
                e.span(),
                format!("expression `{e}` needs a name"),
                format!("`{e} AS <name>`"),
            )),
        },
        SelectItem::ExprWithAlias { expr, alias } => {
            Ok(SelectOutput::Named(expr, ident_name(alias)))
        }
        other => Err(ctx.err(other.span(), unsupported.0, unsupported.1)),
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
    row_projection(ctx, scope, select, true)
}

/// [`data_projection`], with an `id` column required or not (an event's payload).
pub(crate) fn row_projection(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    select: &Select,
    needs_id: bool,
) -> Result<Shape, RulesError> {
    let mut shape = Shape {
        projection: Vec::new(),
        explicit: Vec::new(),
        id: None,
    };
    let mut has_star = false;
    for item in &select.projection {
        let (e, name) = match select_output(ctx, item, UNSUPPORTED_ITEM)? {
            SelectOutput::Star(opts) => {
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
            SelectOutput::QualifiedStar(kind) => {
                let q = match kind {
                    SelectItemQualifiedWildcardKind::ObjectName(n) => match n.0.as_slice() {
                        [ObjectNamePart::Identifier(id)] => ident_name(id),
                        _ => n.to_string(),
                    },
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
            SelectOutput::Named(e, name) => (e, name),
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
    if needs_id && shape.id.is_none() && !has_star {
        return Err(ctx.err(
            select.select_token.0.span,
            "query must return an \"id\" column",
            "add `id` (or `<expr> AS id`) to the SELECT list",
        ));
    }
    Ok(shape)
}
