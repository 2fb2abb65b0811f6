//! Parsing one query with `sqlparser` (PostgreSQL dialect) and checking its statement shape.
//!
//! PowerSync allows `x IN <json array expression>` without parentheses, which PostgreSQL
//! grammar does not. Before parsing, the token stream (from sqlparser's own tokenizer) has
//! such an `IN` keyword replaced by the `<@` operator token; the lowering turns that operator
//! back into an `IN` over a JSON array. A user-written `<@` is rejected up front, so every
//! `<@` in the tree is one of ours.

use sqlparser::ast::{Query, Select, SetExpr, Spanned, Statement};
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Span, Token, Tokenizer};

use super::QueryCtx;
use crate::rules::error::RulesError;

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
    rewrite_bare_in(ctx, &mut tokens)?;
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
    let mut it = statements.into_iter();
    let first = it.next();
    if let Some(second) = it.next() {
        let span = sqlparser::ast::Spanned::span(&second);
        return Err(ctx.err(
            span,
            "more than one SQL statement in one query",
            "one SELECT per query; list several queries as separate YAML entries",
        ));
    }
    let query = match first {
        Some(Statement::Query(q)) => q,
        Some(other) => {
            let span = sqlparser::ast::Spanned::span(&other);
            return Err(ctx.err(
                span,
                "only SELECT statements are allowed",
                "a SELECT statement",
            ));
        }
        None => {
            return Err(ctx.err(Span::empty(), "the query is empty", "a SELECT statement"));
        }
    };
    check_query(ctx, *query)
}

fn check_query(ctx: &QueryCtx<'_>, q: Query) -> Result<Select, RulesError> {
    let span = sqlparser::ast::Spanned::span(&q);
    if q.with.is_some() {
        return Err(ctx.err(
            span,
            "WITH inside a query is not supported",
            "define common table expressions under the stream's `with:` key (edition 3)",
        ));
    }
    if let Some(o) = &q.order_by {
        let at = match &o.kind {
            sqlparser::ast::OrderByKind::Expressions(e) => e.first().map(|x| x.expr.span()),
            _ => None,
        };
        return Err(ctx.err(
            pick(at.unwrap_or(span), span),
            "ORDER BY is not supported",
            "remove ORDER BY; clients order rows locally",
        ));
    }
    if q.limit_clause.is_some() || q.fetch.is_some() {
        let at = q.limit_clause.as_ref().map(|l| l.span()).unwrap_or(span);
        return Err(ctx.err(
            pick(at, span),
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
        other => {
            let span = sqlparser::ast::Spanned::span(&other);
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
            pick(h.span(), sspan),
            "HAVING is not supported",
            "remove HAVING",
        ));
    }
    match &select.group_by {
        sqlparser::ast::GroupByExpr::Expressions(e, m) if e.is_empty() && m.is_empty() => {}
        g => {
            let at = match g {
                sqlparser::ast::GroupByExpr::Expressions(e, _) => e.first().map(|x| x.span()),
                _ => None,
            };
            return Err(ctx.err(
                pick(at.unwrap_or(sspan), sspan),
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
