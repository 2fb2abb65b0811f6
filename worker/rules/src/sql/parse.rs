//! Parsing one query with `sqlparser` (PostgreSQL dialect) and checking its statement shape.
//!
//! PowerSync allows `x IN <json array expression>` without parentheses, which PostgreSQL
//! grammar does not. Before parsing, the token stream (from sqlparser's own tokenizer) has
//! such an `IN` keyword replaced by the `<@` operator token; the lowering turns that operator
//! back into an `IN` over a JSON array. A user-written `<@` is rejected up front, so every
//! `<@` in the tree is one of ours.

use sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, FunctionArguments, InTarget, Query, Select, SelectItem,
    SetExpr, Spanned, Statement,
};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Span, Token, Tokenizer};

use super::QueryCtx;
use crate::error::RulesError;

/// Token limit per query: keeps every AST shallow enough for sqlparser's own recursive
/// span, clone and display code (about 250 levels at most) on a 2 MiB thread stack.
const MAX_TOKENS: usize = 500;

/// Expression nesting limit after parsing (binary operator chains are not bounded by the
/// parser's recursion limit).
const MAX_DEPTH: usize = 64;

/// Nesting limit for the parser, so hostile input cannot exhaust the stack.
const RECURSION_LIMIT: usize = 40;

/// Parse `sql` into exactly one `SELECT` and check the clauses we never support.
pub fn parse_select(ctx: &QueryCtx<'_>, sql: &str) -> Result<Select, RulesError> {
    let dialect = PostgreSqlDialect {};
    let mut tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .map_err(|e| {
            ctx.err_at(
                e.location.line,
                e.location.column,
                format!("SQL cannot be tokenized: {}", e.message),
                "a single SELECT statement in PostgreSQL syntax",
            )
        })?;
    let count = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .count();
    if count > MAX_TOKENS {
        return Err(ctx.err_at(
            1,
            1,
            format!("the query is too long ({count} tokens; the limit is {MAX_TOKENS})"),
            "split it into several queries",
        ));
    }
    rewrite_bare_in(ctx, &mut tokens)?;
    // Positions taken from tokens, because computing spans of a deep tree recurses.
    let mut significant = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)));
    let start = significant.next().map(|t| t.span).unwrap_or(Span::empty());
    let second = tokens
        .iter()
        .skip_while(|t| t.token != Token::SemiColon)
        .find(|t| !matches!(t.token, Token::Whitespace(_) | Token::SemiColon))
        .map(|t| t.span);
    let mut parser = Parser::new(&dialect)
        .with_recursion_limit(RECURSION_LIMIT)
        .with_tokens_with_locations(tokens);
    let statements = parser.parse_statements().map_err(|e| {
        let msg = e.to_string();
        let (line, col) = position_in_message(&msg);
        ctx.err_at(
            line,
            col,
            format!("SQL syntax error: {msg}"),
            "a single SELECT statement in PostgreSQL syntax",
        )
    })?;
    if statements.len() > 1 {
        return Err(ctx.err(
            second.unwrap_or(start),
            "more than one SQL statement in one query",
            "one SELECT per query; list several queries as separate YAML entries",
        ));
    }
    let query = match statements.into_iter().next() {
        Some(Statement::Query(q)) => q,
        Some(_) => {
            return Err(ctx.err(
                start,
                "only SELECT statements are allowed",
                "a SELECT statement",
            ));
        }
        None => {
            return Err(ctx.err(Span::empty(), "the query is empty", "a SELECT statement"));
        }
    };
    let mut select = check_query(ctx, *query, start)?;
    if ctx.compat.edition >= 3 {
        super::in_forms::edition3_in_forms(ctx, &mut select)?;
    }
    Ok(select)
}

/// The span of `e`, or `fallback` when `e` is too deep to walk safely.
pub(crate) fn safe_span(e: &Expr, fallback: Span) -> Span {
    if too_deep(e, 0) {
        fallback
    } else {
        pick(e.span(), fallback)
    }
}

fn check_query(ctx: &QueryCtx<'_>, q: Query, span: Span) -> Result<Select, RulesError> {
    if query_too_deep(&q, 0) {
        return Err(ctx.err(
            span,
            format!("an expression nests deeper than {MAX_DEPTH} levels"),
            "simplify the expression or split the query",
        ));
    }
    if q.with.is_some() {
        return Err(ctx.err(
            span,
            "WITH inside a query is not supported",
            "define common table expressions under the stream's `with:` key (edition 3)",
        ));
    }
    if let Some(o) = &q.order_by {
        let at = match &o.kind {
            sqlparser::ast::OrderByKind::Expressions(e) => {
                e.first().map(|x| safe_span(&x.expr, span))
            }
            _ => None,
        };
        return Err(ctx.err(
            at.unwrap_or(span),
            "ORDER BY is not supported",
            "remove ORDER BY; clients order rows locally",
        ));
    }
    if q.limit_clause.is_some() || q.fetch.is_some() {
        let at = match &q.limit_clause {
            Some(sqlparser::ast::LimitClause::LimitOffset { limit: Some(l), .. }) => {
                safe_span(l, span)
            }
            _ => span,
        };
        return Err(ctx.err(
            at,
            "LIMIT / OFFSET / FETCH are not supported",
            "remove them; every matching row is synced",
        ));
    }
    if !q.locks.is_empty() || q.for_clause.is_some() {
        return Err(ctx.err(
            span,
            "FOR clauses are not supported",
            "remove the FOR clause",
        ));
    }
    let select = match *q.body {
        SetExpr::Select(s) => *s,
        _ => {
            return Err(ctx.err(
                span,
                "only a plain SELECT is supported (no UNION, VALUES or nested query)",
                "one SELECT per query; list several queries as separate YAML entries",
            ));
        }
    };
    let sspan = select.select_token.0.span;
    if select.distinct.is_some() {
        return Err(ctx.err(
            sspan,
            "DISTINCT is not supported",
            "remove DISTINCT; rows are keyed by `id`",
        ));
    }
    if let Some(h) = &select.having {
        return Err(ctx.err(
            safe_span(h, sspan),
            "HAVING is not supported",
            "remove HAVING",
        ));
    }
    match &select.group_by {
        sqlparser::ast::GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty() => {}
        g => {
            let at = match g {
                sqlparser::ast::GroupByExpr::Expressions(e, _) => {
                    e.first().map(|x| safe_span(x, sspan))
                }
                _ => None,
            };
            return Err(ctx.err(
                at.unwrap_or(sspan),
                "GROUP BY is not supported",
                "remove GROUP BY; rows sync one by one",
            ));
        }
    }
    if select.top.is_some()
        || select.into.is_some()
        || !select.lateral_views.is_empty()
        || select.prewhere.is_some()
        || select.qualify.is_some()
        || !select.named_window.is_empty()
        || !select.sort_by.is_empty()
        || !select.cluster_by.is_empty()
        || !select.distribute_by.is_empty()
        || !select.connect_by.is_empty()
    {
        return Err(ctx.err(
            sspan,
            "this SELECT uses a clause outside the supported subset",
            "SELECT <columns> FROM <table> [WHERE <filter>]",
        ));
    }
    Ok(select)
}

/// Replace `IN` not followed by `(` with `<@` (see module docs); reject user `<@`.
fn rewrite_bare_in(
    ctx: &QueryCtx<'_>,
    tokens: &mut [sqlparser::tokenizer::TokenWithSpan],
) -> Result<(), RulesError> {
    let n = tokens.len();
    for i in 0..n {
        if tokens[i].token == Token::ArrowAt {
            return Err(ctx.err(
                tokens[i].span,
                "operator `<@` is not supported",
                "`x IN <json array>` or `x IN (a, b)`",
            ));
        }
        let is_in = matches!(&tokens[i].token, Token::Word(w) if w.keyword == Keyword::IN && w.quote_style.is_none());
        if !is_in {
            continue;
        }
        let next = tokens[i + 1..]
            .iter()
            .find(|t| !matches!(t.token, Token::Whitespace(_)));
        let bare = !matches!(next.map(|t| &t.token), Some(Token::LParen) | None);
        if bare {
            let prev = tokens[..i]
                .iter()
                .rev()
                .find(|t| !matches!(t.token, Token::Whitespace(_)));
            if matches!(prev.map(|t| &t.token), Some(Token::Word(w)) if w.keyword == Keyword::NOT) {
                return Err(ctx.err(
                    tokens[i].span,
                    "`NOT IN <json array>` is not supported",
                    "`NOT (x IN <json array>)`",
                ));
            }
            tokens[i].token = Token::ArrowAt;
        }
    }
    Ok(())
}

fn position_in_message(msg: &str) -> (u64, u64) {
    let grab = |key: &str| -> u64 {
        msg.find(key)
            .map(|i| &msg[i + key.len()..])
            .map(|r| {
                r.chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect::<String>()
            })
            .and_then(|d| d.parse().ok())
            .unwrap_or(0)
    };
    (grab("Line: "), grab("Column: "))
}

/// `preferred` unless it is empty (some nodes carry no position).
fn pick(preferred: Span, fallback: Span) -> Span {
    if preferred == Span::empty() {
        fallback
    } else {
        preferred
    }
}

/// True when a query's expressions (including subqueries and FROM items) nest deeper than
/// [`MAX_DEPTH`]. Checked before anything walks the tree (spans, clones, lowering).
fn query_too_deep(q: &Query, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    let d = depth + 1;
    if let Some(o) = &q.order_by {
        if let sqlparser::ast::OrderByKind::Expressions(e) = &o.kind {
            if e.iter().any(|x| too_deep(&x.expr, d)) {
                return true;
            }
        }
    }
    if let Some(sqlparser::ast::LimitClause::LimitOffset { limit: Some(l), .. }) = &q.limit_clause {
        if too_deep(l, d) {
            return true;
        }
    }
    let select = match q.body.as_ref() {
        SetExpr::Select(s) => s,
        SetExpr::Query(inner) => return query_too_deep(inner, d),
        _ => return false,
    };
    let mut exprs: Vec<&Expr> = select.selection.iter().collect();
    for item in &select.projection {
        match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => exprs.push(e),
            _ => {}
        }
    }
    if let sqlparser::ast::GroupByExpr::Expressions(g, _) = &select.group_by {
        exprs.extend(g.iter());
    }
    exprs.extend(select.having.iter());
    if exprs.iter().any(|e| too_deep(e, d)) {
        return true;
    }
    select.from.iter().any(|twj| {
        factor_too_deep(&twj.relation, d)
            || twj.joins.iter().any(|j| factor_too_deep(&j.relation, d))
    })
}

fn factor_too_deep(f: &sqlparser::ast::TableFactor, depth: usize) -> bool {
    match f {
        sqlparser::ast::TableFactor::Derived { subquery, .. } => {
            query_too_deep(subquery, depth + 1)
        }
        sqlparser::ast::TableFactor::Table { args: Some(a), .. } => {
            a.args.iter().any(|x| match x {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => too_deep(e, depth + 1),
                _ => false,
            })
        }
        _ => false,
    }
}

/// True when `e` nests deeper than [`MAX_DEPTH`]; never recurses past the limit itself.
pub(crate) fn too_deep(e: &Expr, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    let d = depth + 1;
    match e {
        Expr::BinaryOp { left, right, .. } => too_deep(left, d) || too_deep(right, d),
        Expr::UnaryOp { expr, .. }
        | Expr::Nested(expr)
        | Expr::IsNull(expr)
        | Expr::IsNotNull(expr)
        | Expr::Cast { expr, .. } => too_deep(expr, d),
        Expr::In { expr, target, .. } => {
            too_deep(expr, d)
                || match target {
                    InTarget::List(l) => l.iter().any(|x| too_deep(x, d)),
                    InTarget::Subquery(q) => query_too_deep(q, d),
                    _ => false,
                }
        }
        Expr::Substring {
            expr,
            substring_from,
            substring_for,
            ..
        } => {
            too_deep(expr, d)
                || substring_from.as_ref().is_some_and(|x| too_deep(x, d))
                || substring_for.as_ref().is_some_and(|x| too_deep(x, d))
        }
        Expr::Function(f) => match &f.args {
            FunctionArguments::List(l) => l.args.iter().any(|a| match a {
                FunctionArg::Unnamed(FunctionArgExpr::Expr(x)) => too_deep(x, d),
                _ => false,
            }),
            _ => false,
        },
        Expr::Subquery(q) | Expr::Exists { subquery: q, .. } => query_too_deep(q, d),
        Expr::JsonAccess { value, .. } => too_deep(value, d),
        Expr::Between {
            expr, low, high, ..
        } => too_deep(expr, d) || too_deep(low, d) || too_deep(high, d),
        Expr::Like { expr, pattern, .. } | Expr::ILike { expr, pattern, .. } => {
            too_deep(expr, d) || too_deep(pattern, d)
        }
        Expr::Case {
            operand,
            conditions,
            else_result,
            ..
        } => {
            operand.as_ref().is_some_and(|x| too_deep(x, d))
                || conditions
                    .iter()
                    .any(|c| too_deep(&c.condition, d) || too_deep(&c.result, d))
                || else_result.as_ref().is_some_and(|x| too_deep(x, d))
        }
        _ => false,
    }
}
