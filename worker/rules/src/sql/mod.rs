//! The SQL front end: parse one query (real parser), then lower its expressions into
//! [`crate::expr::Expr`] within a scope that says which names mean what.

pub mod filter;
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
