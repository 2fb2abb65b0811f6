//! Bucket definitions: a parameter query that decides access from client parameters alone.
//!
//! The client sets `request.parameters()` and `user_parameters.*` to anything; the token's
//! values (`request.user_id()`, `request.jwt()`, `token_parameters.*`) are verified. The
//! official compiler warns when a parameter query reads a client value and no token value
//! in the places it counts: its outputs (and a `json_each` source) always, its WHERE clause
//! only in a query of a table. In a table query's WHERE clause it reads the conditions left
//! to right, and an `OR` between conditions that compare the table with the request
//! forgets the token values it has seen so far and counts none of its own (a quirk of its
//! visitor, followed here so the same files warn: `(a = request.user_id() OR b =
//! request.user_id()) AND c = request.parameters() ->> 'c'` warns, the same conditions
//! with the `OR` last do not).

use std::ops::ControlFlow;

use sqlparser::ast::{
    BinaryOperator, Expr as Ast, Select, SelectItem, TableFactor, Visit, Visitor,
};

use super::{qualified_call, whole_query};
use crate::sql::{ident_name, QueryCtx};
use crate::warning::{RulesWarning, WarningKind};

/// The warning, about the whole query.
pub(super) fn warning(ctx: &QueryCtx<'_>) -> RulesWarning {
    whole_query(
        ctx,
        WarningKind::ClientParameterQuery,
        "this parameter query decides access from client parameters (`request.parameters()`, \
         `user_parameters`) and no token value; the client can send any value for them (the \
         official compiler: \"Potentially dangerous query based on parameters set by the client\")"
            .into(),
        "also match a token value (`request.user_id()`, `request.jwt() ->> 'k'`, \
         `token_parameters.k`) in an output, or in the WHERE clause of a query of a table; or \
         set `accept_potentially_dangerous_queries: true` on the definition if any client may \
         have these buckets"
            .into(),
    )
}

/// Whether the parameter query reads client parameters and no token value where the
/// official compiler counts one.
pub(super) fn decides_access(select: &Select) -> bool {
    let outputs = Reads::of_outputs(select);
    let filter = select.selection.as_ref().map(Reads::of).unwrap_or_default();
    let (source, table) = match select.from.first().map(|t| &t.relation) {
        None => (Reads::default(), false),
        Some(TableFactor::Table { args: Some(_), .. }) | Some(TableFactor::Function { .. }) => {
            (Reads::of_from(select), false)
        }
        Some(_) => (Reads::default(), true),
    };
    let client = outputs.client || filter.client || source.client;
    let token = outputs.token
        || source.token
        || (table && select.selection.as_ref().is_some_and(filter_counts_token));
    client && !token
}

/// What part of a query reads: token values, client values, table columns.
#[derive(Debug, Default, Clone, Copy)]
struct Reads {
    token: bool,
    client: bool,
    column: bool,
}

impl Reads {
    fn of(e: &Ast) -> Self {
        let mut r = Reads::default();
        let _ = e.visit(&mut r);
        r
    }

    /// The outputs, but `_priority` (a literal the compiler takes apart).
    fn of_outputs(select: &Select) -> Self {
        let mut r = Reads::default();
        for item in &select.projection {
            match item {
                SelectItem::ExprWithAlias { alias, .. } if ident_name(alias) == "_priority" => {}
                other => {
                    let _ = other.visit(&mut r);
                }
            }
        }
        r
    }

    /// The FROM list (a `json_each` call's argument).
    fn of_from(select: &Select) -> Self {
        let mut r = Reads::default();
        let _ = select.from.visit(&mut r);
        r
    }
}

impl Visitor for Reads {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &Ast) -> ControlFlow<()> {
        match e {
            Ast::Function(f) => match qualified_call(f) {
                Some((ns, name)) if ns == "request" => match name.as_str() {
                    "user_id" | "jwt" => self.token = true,
                    "parameters" => self.client = true,
                    _ => {}
                },
                _ => {}
            },
            Ast::CompoundIdentifier(parts) => match parts.first().map(ident_name).as_deref() {
                Some("token_parameters") => self.token = true,
                Some("user_parameters") => self.client = true,
                _ => self.column = true,
            },
            Ast::Identifier(_) => self.column = true,
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

/// Whether a table query's WHERE clause counts as reading a token value, read as the
/// official compiler reads it (see the module comment).
fn filter_counts_token(e: &Ast) -> bool {
    let mut token = false;
    walk(e, &mut token);
    token
}

fn walk(e: &Ast, token: &mut bool) {
    match e {
        Ast::Nested(inner) => walk(inner, token),
        Ast::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            walk(left, token);
            walk(right, token);
        }
        Ast::BinaryOp {
            left,
            op: BinaryOperator::Or,
            right,
        } => {
            let (l, r) = (Reads::of(left), Reads::of(right));
            let request = |x: Reads| x.token || x.client;
            let rows_only = !request(l) && !request(r);
            let request_only = !l.column && !r.column;
            if rows_only || request_only {
                *token |= l.token || r.token;
            } else {
                *token = false;
            }
        }
        other => *token |= Reads::of(other).token,
    }
}
