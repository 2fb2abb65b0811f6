//! The SQL front end: parse one query (real parser), then lower its expressions into
//! [`crate::expr::Expr`] within a scope that says which names mean what.

pub mod filter;
pub(crate) mod in_forms;
pub mod lower;
pub mod parse;
pub mod request_fn;
pub mod scope;

use sqlparser::tokenizer::Span;

use super::error::{RulesError, SqlLocation};
use super::options::Compatibility;

/// Where a query sits in the rules, for error messages; plus the edition options.
#[derive(Debug, Clone)]
pub struct QueryCtx<'a> {
    /// `bucket definition`, `stream` or `CTE`.
    pub kind: &'static str,
    /// The definition or stream name.
    pub rule: &'a str,
    /// `parameters[0]`, `data[1]`, `query`, `queries[0]`, `with.<name>`.
    pub label: String,
    /// The SQL text.
    pub sql: &'a str,
    /// Edition options in force.
    pub compat: Compatibility,
}

impl<'a> QueryCtx<'a> {
    /// The context of one query: `sql`, found at `label` of the `kind` named `rule`.
    pub fn new(
        kind: &'static str,
        rule: &'a str,
        label: String,
        sql: &'a str,
        compat: Compatibility,
    ) -> Self {
        QueryCtx {
            kind,
            rule,
            label,
            sql,
            compat,
        }
    }

    /// An error at a parser span (line/column 0 when the span is empty).
    pub fn err(
        &self,
        span: Span,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RulesError {
        self.err_at(span.start.line, span.start.column, message, hint)
    }

    /// An error at an explicit line and column.
    pub fn err_at(
        &self,
        line: u64,
        column: u64,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) -> RulesError {
        RulesError::Sql {
            location: Box::new(SqlLocation {
                kind: self.kind,
                rule: self.rule.to_string(),
                query_label: self.label.clone(),
                sql: self.sql.to_string(),
                line: if line == 0 { 1 } else { line },
                column: if column == 0 { 1 } else { column },
            }),
            message: message.into(),
            hint: hint.into(),
        }
    }
}

/// Normalize an identifier: unquoted names are lower-cased (PostgreSQL rule), quoted names
/// keep their case.
pub fn ident_name(id: &sqlparser::ast::Ident) -> String {
    if id.quote_style.is_some() {
        id.value.clone()
    } else {
        id.value.to_lowercase()
    }
}

/// The byte offset of a sqlparser location (lines and columns count from 1, columns in
/// characters) in `sql`.
pub(crate) fn offset_of(sql: &str, loc: sqlparser::tokenizer::Location) -> Option<usize> {
    let line_start: usize = sql
        .split_inclusive('\n')
        .take(usize::try_from(loc.line).ok()?.checked_sub(1)?)
        .map(str::len)
        .sum();
    let line = sql.get(line_start..)?;
    let column = usize::try_from(loc.column).ok()?.checked_sub(1)?;
    Some(
        line_start
            + line
                .char_indices()
                .nth(column)
                .map_or(line.len(), |(i, _)| i),
    )
}

/// The text of the item of the query's first SELECT list that holds `at`, as written (less
/// the parentheses around all of it): what the official compiler names an output without
/// alias. sqlparser's spans of some expressions (calls, casts) leave out their ends, so the
/// items are found by tokens: the SELECT list is split at its top-level commas.
pub(crate) fn select_item_text(sql: &str, at: sqlparser::tokenizer::Location) -> Option<&str> {
    use sqlparser::keywords::Keyword;
    use sqlparser::tokenizer::{Token, Tokenizer};
    let dialect = sqlparser::dialect::PostgreSqlDialect {};
    let tokens = Tokenizer::new(&dialect, sql)
        .tokenize_with_location()
        .ok()?;
    let at = offset_of(sql, at)?;
    let mut depth = 0usize;
    let mut item: Option<(usize, usize)> = None;
    let mut started = false;
    for t in &tokens {
        match &t.token {
            Token::Word(w) if w.keyword == Keyword::SELECT && !started => {
                started = true;
                continue;
            }
            _ if !started => continue,
            Token::Whitespace(_) => continue,
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            Token::Comma | Token::Word(_) if depth == 0 && ends_item(&t.token) => {
                if let Some((s, e)) = item.take() {
                    if (s..e).contains(&at) {
                        return strip_parens(sql.get(s..e)?);
                    }
                }
                if matches!(t.token, Token::Word(_)) {
                    return None;
                }
                continue;
            }
            _ => {}
        }
        let (s, e) = (offset_of(sql, t.span.start)?, offset_of(sql, t.span.end)?);
        item = Some(item.map_or((s, e), |(s0, _)| (s0, e)));
    }
    let (s, e) = item?;
    (s..e)
        .contains(&at)
        .then(|| strip_parens(sql.get(s..e)?))
        .flatten()
}

/// A comma, or the FROM that ends a SELECT list.
fn ends_item(t: &sqlparser::tokenizer::Token) -> bool {
    match t {
        sqlparser::tokenizer::Token::Comma => true,
        sqlparser::tokenizer::Token::Word(w) => w.keyword == sqlparser::keywords::Keyword::FROM,
        _ => false,
    }
}

/// `text` without parentheses that enclose all of it.
fn strip_parens(text: &str) -> Option<&str> {
    let mut t = text.trim();
    while t.starts_with('(') && t.ends_with(')') {
        let mut depth = 0i32;
        let closes_at_end = t.char_indices().all(|(i, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            depth > 0 || i == t.len() - 1
        });
        if !closes_at_end {
            break;
        }
        t = t[1..t.len() - 1].trim();
    }
    Some(t)
}
