//! `IN` as the edition-3 compiler reads it, made into the forms the rest of the compiler
//! knows before anything else sees the query:
//! - `x IN (a, b, …)` with several values is refused (the official compiler refuses it);
//! - `x IN (a)` is `x IN a`, membership in the JSON array `a` (its parser takes the
//!   parentheses as grouping);
//! - `x IN ARRAY[a, b]` and `x IN ROW(a, b)` are lists of values.

use std::ops::ControlFlow;

use sqlparser::ast::{
    visit_expressions_mut, BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments,
    InTarget, Select, Spanned, UnaryOperator,
};

use super::QueryCtx;
use crate::error::RulesError;

/// Rewrites `select`'s `IN` forms as edition 3 reads them (see the module), or refuses a
/// list of several values. The query was depth-checked: its spans are safe to take.
pub(crate) fn edition3_in_forms(ctx: &QueryCtx<'_>, select: &mut Select) -> Result<(), RulesError> {
    let refused = visit_expressions_mut(select, |e| {
        if let Expr::In {
            target: InTarget::List(list),
            ..
        } = e
        {
            if list.len() > 1 {
                return ControlFlow::Break(e.span());
            }
        }
        if let Some(rewritten) = rewrite(e) {
            *e = rewritten;
        }
        ControlFlow::Continue(())
    });
    match refused {
        ControlFlow::Break(span) => Err(ctx.err(
            span,
            "an `IN (…)` list of several values is not supported at edition 3 (the official \
             compiler refuses it)",
            "`x IN ARRAY[a, b]`, or `x = a OR x = b`",
        )),
        ControlFlow::Continue(()) => Ok(()),
    }
}

/// The edition-3 reading of `e`, when it differs from the older editions'.
fn rewrite(e: &Expr) -> Option<Expr> {
    match e {
        Expr::In {
            expr,
            target: InTarget::List(list),
            negated,
            ..
        } => {
            let [single] = list.as_slice() else {
                return None;
            };
            // `<@` is the compiler's own spelling of `x IN <JSON array>` (see `parse`).
            let member = Expr::Nested(Box::new(Expr::BinaryOp {
                left: expr.clone(),
                op: BinaryOperator::ArrowAt,
                right: Box::new(single.clone()),
            }));
            Some(match negated {
                true => Expr::UnaryOp {
                    op: UnaryOperator::Not,
                    expr: Box::new(member),
                },
                false => member,
            })
        }
        Expr::BinaryOp {
            left,
            op: BinaryOperator::ArrowAt,
            right,
        } => values(right).map(|list| Expr::In {
            expr: left.clone(),
            target: InTarget::List(list),
            negated: false,
            global: false,
        }),
        _ => None,
    }
}

/// The values of `ARRAY[a, b]` or `ROW(a, b)`.
fn values(e: &Expr) -> Option<Vec<Expr>> {
    match e {
        Expr::Array(array) => Some(array.elem.clone()),
        Expr::Function(f) if f.name.to_string().eq_ignore_ascii_case("row") => match &f.args {
            FunctionArguments::List(l) => l
                .args
                .iter()
                .map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => Some(x.clone()),
                    _ => None,
                })
                .collect(),
            _ => None,
        },
        _ => None,
    }
}
