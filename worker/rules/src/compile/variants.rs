//! The variants of an edition-3 stream query: its WHERE clause in disjunctive normal form,
//! simplified as the official compiler does (`compileFilterClause` and its
//! `FilterConditionSimplifier`), each variant compiled as a query of its own with a bucket
//! of its own (`s|0`, `s|1`, …; variants instantiated alike share one later, see
//! `bucket_sources`).
//!
//! `NOT` is pushed down to the atoms (De Morgan), `AND` distributed over `OR`. Within a
//! variant, the atoms that read only the row are joined into one condition, and so are the
//! atoms that read only the request (or nothing): those are the request's filters, never the
//! row's. Variants of one atom are joined by what they read in the same way, after the
//! others: `a.x = auth.user_id() OR a.public` is two variants, `a.public OR a.shared` one.

use std::ops::ControlFlow;

use sqlparser::ast::{
    BinaryOperator, Expr as Ast, ObjectNamePart, Query, Spanned, UnaryOperator, Visit, Visitor,
};

use crate::error::RulesError;
use crate::sql::{ident_name, QueryCtx};

/// What an atom of the WHERE clause reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Columns of the selected table only.
    Row,
    /// Request values only, or nothing.
    Request,
    /// Both, a joined table or CTE, or a subquery: a link (or an error the compiler reports).
    Link,
}

/// More conjunctions than this in one distribution is refused, as by the official compiler.
const MAX_EXPANSION: usize = 100;

/// The variants of `selection` (one `None` when there is no WHERE clause); `reads` tells
/// what an atom reads.
pub(crate) fn split(
    ctx: &QueryCtx<'_>,
    selection: Option<&Ast>,
    reads: &dyn Fn(&Ast) -> Reads,
) -> Result<Vec<Option<Ast>>, RulesError> {
    let Some(selection) = selection else {
        return Ok(vec![None]);
    };
    let terms = dnf(selection, false).map_err(|()| {
        ctx.err(
            selection.span(),
            "applying the OR operators of this filter gives too many variants",
            "move inner OR operators up to the top level, or split the query under `queries:`",
        )
    })?;
    let mut and_terms: Vec<Vec<Ast>> = Vec::new();
    let mut single: Vec<Ast> = Vec::new();
    for term in terms {
        let mut merged = merge_by_reads(term, BinaryOperator::And, reads);
        if merged.len() == 1 {
            single.append(&mut merged);
        } else {
            and_terms.push(merged);
        }
    }
    for atom in merge_by_reads(single, BinaryOperator::Or, reads) {
        and_terms.push(vec![atom]);
    }
    Ok(and_terms
        .into_iter()
        .map(|t| join(t, BinaryOperator::And))
        .collect())
}

/// `e` in disjunctive normal form: conjunctions of atoms (`negate`: of `NOT e`).
fn dnf(e: &Ast, negate: bool) -> Result<Vec<Vec<Ast>>, ()> {
    match e {
        Ast::Nested(inner) => dnf(inner, negate),
        Ast::UnaryOp {
            op: UnaryOperator::Not,
            expr,
        } => dnf(expr, !negate),
        Ast::BinaryOp { left, op, right }
            if matches!(op, BinaryOperator::And | BinaryOperator::Or) =>
        {
            let (l, r) = (dnf(left, negate)?, dnf(right, negate)?);
            // NOT turns AND into OR and back.
            if (*op == BinaryOperator::And) != negate {
                if l.len() * r.len() > MAX_EXPANSION {
                    return Err(());
                }
                let mut out = Vec::with_capacity(l.len() * r.len());
                for a in &l {
                    for b in &r {
                        out.push(a.iter().chain(b).cloned().collect());
                    }
                }
                Ok(out)
            } else {
                Ok(l.into_iter().chain(r).collect())
            }
        }
        atom if negate => Ok(vec![vec![Ast::UnaryOp {
            op: UnaryOperator::Not,
            expr: Box::new(atom.clone()),
        }]]),
        atom => Ok(vec![vec![atom.clone()]]),
    }
}

/// The links in order, then the request-only atoms joined by `op`, then the row-only ones.
fn merge_by_reads(atoms: Vec<Ast>, op: BinaryOperator, reads: &dyn Fn(&Ast) -> Reads) -> Vec<Ast> {
    let (mut links, mut request, mut row) = (Vec::new(), Vec::new(), Vec::new());
    for a in atoms {
        match reads(&a) {
            Reads::Link => links.push(a),
            Reads::Request => request.push(a),
            Reads::Row => row.push(a),
        }
    }
    for group in [request, row] {
        if let Some(joined) = join(group, op.clone()) {
            links.push(joined);
        }
    }
    links
}

fn join(atoms: Vec<Ast>, op: BinaryOperator) -> Option<Ast> {
    atoms.into_iter().reduce(|a, b| Ast::BinaryOp {
        left: Box::new(a),
        op: op.clone(),
        right: Box::new(b),
    })
}

/// What `e` reads, for a query selecting from the table `data` names (its name and alias),
/// with CTEs or joined tables under the aliases `refs`.
pub(crate) fn atom_reads(e: &Ast, data: &[String], refs: &[String]) -> Reads {
    let mut seen = Seen::default();
    let _ = e.visit(&mut seen);
    let row = seen.unqualified || seen.qualifiers.iter().any(|q| data.contains(q));
    let linked = seen.subquery || seen.qualifiers.iter().any(|q| refs.contains(q));
    match (row, seen.request, linked) {
        (_, _, true) | (true, true, _) => Reads::Link,
        (true, false, false) => Reads::Row,
        (false, _, false) => Reads::Request,
    }
}

/// What an expression's column references and calls name.
#[derive(Default)]
struct Seen {
    qualifiers: Vec<String>,
    unqualified: bool,
    request: bool,
    subquery: bool,
}

impl Visitor for Seen {
    type Break = ();

    fn pre_visit_query(&mut self, _query: &Query) -> ControlFlow<()> {
        self.subquery = true;
        ControlFlow::Break(())
    }

    fn pre_visit_expr(&mut self, e: &Ast) -> ControlFlow<()> {
        match e {
            Ast::CompoundIdentifier(parts) if parts.len() == 2 => {
                self.qualifiers.push(ident_name(&parts[0]))
            }
            Ast::Identifier(_) => self.unqualified = true,
            Ast::Function(f) => {
                if let [ObjectNamePart::Identifier(schema), _] = f.name.0.as_slice() {
                    let schema = ident_name(schema);
                    self.request |=
                        matches!(schema.as_str(), "auth" | "subscription" | "connection");
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}
