//! Classifying a WHERE clause into row filters, request filters and parameter links.
//!
//! Bucket parameters and lookups come from conditions that *link* a row value to something
//! outside the row (`bucket.p`, a request value, a CTE column). Everything else is a plain
//! predicate evaluated on one side only. Subtrees that touch one side only collapse into a
//! single predicate, so `NOT`/`OR` stay free within a side.

use sqlparser::ast::{BinaryOperator, Expr as Ast, InTarget, Query, Spanned};
use sqlparser::tokenizer::Span;

use super::lower::{lower_side, Side};
use super::scope::Scope;
use super::QueryCtx;
use crate::error::RulesError;
use crate::expr::{BinOp, Expr};

/// What a row value is linked to.
#[derive(Debug, Clone)]
pub enum LinkTarget {
    /// `bucket.p` or `cte_alias.col`.
    Ref {
        /// `bucket` or the CTE alias.
        qualifier: String,
        /// Parameter or column name.
        name: String,
        /// Position, for errors.
        span: Span,
    },
    /// A request expression.
    Request(Expr),
}

/// One leaf condition.
#[derive(Debug, Clone)]
pub enum Cond {
    /// Only reads the row (or is constant).
    Row(Expr),
    /// Only reads the request.
    Request(Expr),
    /// `row = target`, `row IN target_array` (`target_expands`) or
    /// `target IN row_array` (`row_expands`).
    Link {
        /// The row side.
        row: Expr,
        /// The row side is a JSON array, one link per element.
        row_expands: bool,
        /// The other side.
        target: LinkTarget,
        /// The target is a JSON array, one link per element.
        target_expands: bool,
        /// Position, for errors.
        span: Span,
    },
    /// `<request value> IN (SELECT col FROM t ...)` (streams): the request gets the stream's
    /// buckets only when the subquery has a row whose `col` is that value.
    Gate {
        /// The request side, as written.
        value: Box<Ast>,
        /// The subquery.
        query: Box<Query>,
        /// Position, for errors.
        span: Span,
    },
    /// `row IN (SELECT ...)` (streams).
    Subquery {
        /// The row side.
        row: Expr,
        /// The subquery.
        query: Box<Query>,
        /// Position, for errors.
        span: Span,
    },
}

/// A classified WHERE clause.
#[derive(Debug, Clone)]
pub enum Filter {
    /// All must hold.
    And(Vec<Filter>),
    /// Any may hold.
    Or(Vec<Filter>),
    /// A leaf.
    Leaf(Cond),
}

/// Classify `ast` within `scope`.
pub fn classify(ctx: &QueryCtx<'_>, scope: &mut Scope, ast: &Ast) -> Result<Filter, RulesError> {
    match ast {
        Ast::Nested(inner) => classify(ctx, scope, inner),
        Ast::BinaryOp {
            left,
            op: op @ (BinaryOperator::And | BinaryOperator::Or),
            right,
        } => {
            let l = classify(ctx, scope, left)?;
            let r = classify(ctx, scope, right)?;
            let is_and = matches!(op, BinaryOperator::And);
            Ok(combine(is_and, l, r))
        }
        Ast::BinaryOp {
            left,
            op: BinaryOperator::Eq,
            right,
        } => {
            let l = lower_side(ctx, scope, left)?;
            let r = lower_side(ctx, scope, right)?;
            eq_condition(ctx, ast, l, r)
        }
        Ast::BinaryOp {
            left,
            op: BinaryOperator::ArrowAt,
            right,
        } => {
            let l = lower_side(ctx, scope, left)?;
            let r = lower_side(ctx, scope, right)?;
            in_condition(ctx, ast, l, r)
        }
        Ast::BinaryOp {
            left,
            op: BinaryOperator::PGOverlap,
            right,
        } => {
            let l = lower_side(ctx, scope, left)?;
            let r = lower_side(ctx, scope, right)?;
            overlap_condition(ctx, ast, l, r)
        }
        Ast::In {
            expr,
            target: InTarget::Subquery(subquery),
            negated,
            ..
        } => {
            if *negated {
                return Err(ctx.err(
                    ast.span(),
                    "NOT IN (SELECT ...) is not supported",
                    "`<row column> IN (SELECT ...)`",
                ));
            }
            match lower_side(ctx, scope, expr)? {
                Side::Row(row) => Ok(Filter::Leaf(Cond::Subquery {
                    row,
                    query: subquery.clone(),
                    span: ast.span(),
                })),
                Side::Request(_) => Ok(Filter::Leaf(Cond::Gate {
                    value: expr.clone(),
                    query: subquery.clone(),
                    span: ast.span(),
                })),
                _ => Err(ctx.err(
                    ast.span(),
                    "the left side of IN (SELECT ...) must read the source row",
                    "`<row column> IN (SELECT <column> FROM <table> WHERE ...)`",
                )),
            }
        }
        _ => match lower_side(ctx, scope, ast)? {
            Side::Row(e) | Side::Static(e) => Ok(Filter::Leaf(Cond::Row(e))),
            Side::Request(e) => Ok(Filter::Leaf(Cond::Request(e))),
            Side::Ref {
                qualifier, name, ..
            } => Err(ctx.err(
                ast.span(),
                format!("`{qualifier}.{name}` alone is not a condition"),
                format!("compare it with a row value: `<column> = {qualifier}.{name}`"),
            )),
        },
    }
}

fn combine(is_and: bool, l: Filter, r: Filter) -> Filter {
    let op = if is_and { BinOp::And } else { BinOp::Or };
    match (l, r) {
        (Filter::Leaf(Cond::Row(a)), Filter::Leaf(Cond::Row(b))) => {
            Filter::Leaf(Cond::Row(Expr::Binary(op, Box::new(a), Box::new(b))))
        }
        (Filter::Leaf(Cond::Request(a)), Filter::Leaf(Cond::Request(b))) => {
            Filter::Leaf(Cond::Request(Expr::Binary(op, Box::new(a), Box::new(b))))
        }
        (l, r) => {
            let mut items = Vec::new();
            for f in [l, r] {
                match (f, is_and) {
                    (Filter::And(v), true) | (Filter::Or(v), false) => items.extend(v),
                    (other, _) => items.push(other),
                }
            }
            if is_and {
                Filter::And(items)
            } else {
                Filter::Or(items)
            }
        }
    }
}

fn ref_target(side: Side) -> Option<LinkTarget> {
    match side {
        Side::Ref {
            qualifier,
            name,
            span,
        } => Some(LinkTarget::Ref {
            qualifier,
            name,
            span,
        }),
        Side::Request(e) => Some(LinkTarget::Request(e)),
        _ => None,
    }
}

fn eq_condition(ctx: &QueryCtx<'_>, ast: &Ast, l: Side, r: Side) -> Result<Filter, RulesError> {
    let span = ast.span();
    match (l, r) {
        (Side::Ref { .. }, Side::Ref { .. }) => Err(ctx.err(
            span,
            "parameter references on both sides of `=`",
            "compare a row expression with one parameter: `<column> = bucket.<name>`",
        )),
        (Side::Row(row), other @ (Side::Ref { .. } | Side::Request(_)))
        | (other @ (Side::Ref { .. } | Side::Request(_)), Side::Row(row)) => {
            let target =
                ref_target(other).ok_or_else(|| ctx.err(span, "internal: bad link", "-"))?;
            Ok(Filter::Leaf(Cond::Link {
                row,
                row_expands: false,
                target,
                target_expands: false,
                span,
            }))
        }
        (
            Side::Ref {
                qualifier, name, ..
            },
            _,
        )
        | (
            _,
            Side::Ref {
                qualifier, name, ..
            },
        ) => Err(ctx.err(
            span,
            format!("`{qualifier}.{name}` must be compared with a source-row value"),
            format!("`<row column> = {qualifier}.{name}`"),
        )),
        (Side::Request(a), Side::Request(b) | Side::Static(b))
        | (Side::Static(b), Side::Request(a)) => Ok(Filter::Leaf(Cond::Request(Expr::Binary(
            BinOp::Eq,
            Box::new(a),
            Box::new(b),
        )))),
        (a, b) => Ok(Filter::Leaf(Cond::Row(Expr::Binary(
            BinOp::Eq,
            Box::new(side_expr(a)),
            Box::new(side_expr(b)),
        )))),
    }
}

fn side_expr(s: Side) -> Expr {
    match s {
        Side::Row(e) | Side::Request(e) | Side::Static(e) => e,
        Side::Ref { .. } => Expr::Literal(crate::value::Value::Null),
    }
}

/// `row_array && request_array`: the row is in a bucket per element of its array, the
/// request gets one per element of its own; they meet where the arrays overlap.
fn overlap_condition(
    ctx: &QueryCtx<'_>,
    ast: &Ast,
    l: Side,
    r: Side,
) -> Result<Filter, RulesError> {
    let span = ast.span();
    match (l, r) {
        (Side::Row(row), Side::Request(arr)) | (Side::Request(arr), Side::Row(row)) => {
            Ok(Filter::Leaf(Cond::Link {
                row,
                row_expands: true,
                target: LinkTarget::Request(arr),
                target_expands: true,
                span,
            }))
        }
        _ => Err(ctx.err(
            span,
            "`&&` compares a row's JSON array with a request's here",
            "`<row json array> && <request json array>`",
        )),
    }
}

fn in_condition(ctx: &QueryCtx<'_>, ast: &Ast, l: Side, r: Side) -> Result<Filter, RulesError> {
    let span = ast.span();
    match (l, r) {
        (Side::Row(row), Side::Request(arr)) => Ok(Filter::Leaf(Cond::Link {
            row,
            row_expands: false,
            target: LinkTarget::Request(arr),
            target_expands: true,
            span,
        })),
        (other @ (Side::Ref { .. } | Side::Request(_)), Side::Row(arr)) => {
            let target = ref_target(other).ok_or_else(|| ctx.err(span, "internal: bad link", "-"))?;
            Ok(Filter::Leaf(Cond::Link {
                row: arr,
                row_expands: true,
                target,
                target_expands: false,
                span,
            }))
        }
        (Side::Ref { qualifier, name, .. }, _) | (_, Side::Ref { qualifier, name, .. }) => Err(ctx.err(
            span,
            format!("`{qualifier}.{name}` in this IN form is not supported"),
            format!("`{qualifier}.{name} IN <row json array column>` or `<row column> = {qualifier}.{name}`"),
        )),
        (a @ Side::Request(_), b @ (Side::Request(_) | Side::Static(_))) | (a @ Side::Static(_), b @ Side::Request(_)) => {
            Ok(Filter::Leaf(Cond::Request(Expr::InJson(
                Box::new(side_expr(a)),
                Box::new(side_expr(b)),
            ))))
        }
        (a, b) => Ok(Filter::Leaf(Cond::Row(Expr::InJson(
            Box::new(side_expr(a)),
            Box::new(side_expr(b)),
        )))),
    }
}

/// One conjunction of a filter in disjunctive normal form.
#[derive(Debug, Clone, Default)]
pub struct Branch {
    /// Row predicates (all must be truthy).
    pub rows: Vec<Expr>,
    /// Request predicates (all must be truthy).
    pub requests: Vec<Expr>,
    /// Links and subqueries, in the order written.
    pub links: Vec<Cond>,
}

/// Expand a filter into DNF branches; `None` when there would be more than `limit`.
pub fn to_dnf(f: &Filter, limit: usize) -> Option<Vec<Branch>> {
    match f {
        Filter::Leaf(c) => {
            let mut b = Branch::default();
            match c {
                Cond::Row(e) => b.rows.push(e.clone()),
                Cond::Request(e) => b.requests.push(e.clone()),
                other => b.links.push(other.clone()),
            }
            Some(vec![b])
        }
        Filter::Or(items) => {
            let mut out = Vec::new();
            for i in items {
                out.extend(to_dnf(i, limit)?);
                if out.len() > limit {
                    return None;
                }
            }
            Some(out)
        }
        Filter::And(items) => {
            let mut acc = vec![Branch::default()];
            for i in items {
                let next = to_dnf(i, limit)?;
                let mut combined = Vec::new();
                for a in &acc {
                    for n in &next {
                        let mut b = a.clone();
                        b.rows.extend(n.rows.iter().cloned());
                        b.requests.extend(n.requests.iter().cloned());
                        b.links.extend(n.links.iter().cloned());
                        combined.push(b);
                        if combined.len() > limit {
                            return None;
                        }
                    }
                }
                acc = combined;
            }
            Some(acc)
        }
    }
}
