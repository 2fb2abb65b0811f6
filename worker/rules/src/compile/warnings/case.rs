//! Unquoted identifiers written with capitals (bucket definitions and edition-2 streams):
//! `FROM Todos` reads `todos`, as in PostgreSQL. The official compiler of those formats
//! warns about the table read (when it has neither alias nor schema), every column
//! reference and its qualifier, subqueries' included, and, in parameter queries, the
//! output aliases. The edition-3 compiler does not.

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr as Ast, Ident, Query, Select, SelectItem, SetExpr, TableFactor, Visit, Visitor,
};

use super::{at, span_text};
use crate::sql::QueryCtx;
use crate::warning::{RulesWarning, WarningKind};

/// The identifier-case warnings of one query; `aliases`: a parameter query, whose output
/// names are checked too.
pub(super) fn of_query(ctx: &QueryCtx<'_>, select: &Select, aliases: bool) -> Vec<RulesWarning> {
    let mut found = Found {
        ctx,
        out: Vec::new(),
    };
    found.table(select);
    if aliases {
        for item in &select.projection {
            if let SelectItem::ExprWithAlias { alias, .. } = item {
                found.ident(alias);
            }
        }
    }
    let _ = select.visit(&mut found);
    found.out
}

/// The warnings found so far.
struct Found<'c, 'a> {
    ctx: &'c QueryCtx<'a>,
    out: Vec<RulesWarning>,
}

impl Found<'_, '_> {
    /// `FROM <name>` without alias or schema.
    fn table(&mut self, select: &Select) {
        for twj in &select.from {
            if let TableFactor::Table {
                name,
                alias: None,
                args: None,
                ..
            } = &twj.relation
            {
                if let [sqlparser::ast::ObjectNamePart::Identifier(id)] = name.0.as_slice() {
                    self.ident(id);
                }
            }
        }
    }

    fn ident(&mut self, id: &Ident) {
        if id.quote_style.is_some() || id.value.to_lowercase() == id.value {
            return;
        }
        let written = span_text(self.ctx.sql, id.span).unwrap_or(&id.value);
        let lower = id.value.to_lowercase();
        self.out.push(at(
            self.ctx,
            WarningKind::IdentifierCase,
            id.span.start,
            written,
            format!(
                "the unquoted identifier `{written}` means `{lower}` (the official compiler: \
                 \"Unquoted identifiers are converted to lower-case. Use \"{written}\" instead.\")"
            ),
            format!("write `{lower}`, or `\"{written}\"` if the name has capitals in the database"),
        ));
    }
}

impl Visitor for Found<'_, '_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &Query) -> ControlFlow<()> {
        if let SetExpr::Select(select) = query.body.as_ref() {
            self.table(select);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Ast) -> ControlFlow<()> {
        match e {
            Ast::Identifier(id) => self.ident(id),
            Ast::CompoundIdentifier(parts) => match parts.as_slice() {
                [table, column] => {
                    self.ident(table);
                    self.ident(column);
                }
                [.., column] => self.ident(column),
                [] => {}
            },
            _ => {}
        }
        ControlFlow::Continue(())
    }
}
