//! Edition 3's output columns: an expression without alias (named by its text as written,
//! in a stream query or a CTE) and `*` after an aliased column (in a stream query, where a
//! source column of that name would overwrite it).

use sqlparser::ast::{Expr as Ast, Select, SelectItem, Spanned};

use super::{at, span_text};
use crate::sql::{ident_name, select_item_text, QueryCtx};
use crate::warning::{RulesWarning, WarningKind};

/// Output columns that are expressions without alias.
pub(super) fn unnamed(ctx: &QueryCtx<'_>, select: &Select) -> Vec<RulesWarning> {
    let mut out = Vec::new();
    for item in &select.projection {
        let SelectItem::UnnamedExpr(e) = item else {
            continue;
        };
        if is_reference(e) {
            continue;
        }
        let start = e.span().start;
        let text = select_item_text(ctx.sql, start).unwrap_or(ctx.sql);
        out.push(at(
            ctx,
            WarningKind::UnnamedColumn,
            start,
            text,
            format!(
                "the output column `{text}` has no alias and is named by its text (the official \
                 compiler: \"The name of this column is unspecified, consider adding an alias.\")"
            ),
            format!("`{text} AS <name>`"),
        ));
    }
    out
}

/// `*` or `t.*` after a column with an alias.
pub(super) fn star_after_alias(ctx: &QueryCtx<'_>, select: &Select) -> Vec<RulesWarning> {
    let mut out = Vec::new();
    let mut alias: Option<String> = None;
    for item in &select.projection {
        match item {
            SelectItem::ExprWithAlias { alias: a, .. } => alias = Some(ident_name(a)),
            SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..) => {
                let Some(name) = &alias else { continue };
                let span = item.span();
                let text = span_text(ctx.sql, span).unwrap_or("*");
                out.push(at(
                    ctx,
                    WarningKind::StarAfterAlias,
                    span.start,
                    text,
                    format!(
                        "`{text}` comes after the aliased column `{name}`: if the table has a \
                         column named `{name}`, the order decides which of the two is synced (the \
                         official compiler: \"A '*' column after aliased columns may give \
                         unexpected results\")"
                    ),
                    "list `*` before the aliased columns, or choose an alias no column of the table has".into(),
                ));
            }
            _ => {}
        }
    }
    out
}

/// A bare column reference (`col`, `t.col`): named by its column.
fn is_reference(e: &Ast) -> bool {
    matches!(e, Ast::Identifier(_) | Ast::CompoundIdentifier(_))
}
