//! The one error type of the rules domain.
//!
//! Every message names where the problem is (definition or stream, query, position) and what
//! the operator can write instead, because an unsupported rule must stop deployment loudly
//! rather than serve wrong data.

use std::fmt;

/// Where in the sync rules a SQL problem was found.
///
/// Kept separate from the message so tests and tooling can check the location without parsing
/// text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlLocation {
    /// `bucket definition`, `stream` or `CTE`.
    pub kind: &'static str,
    /// The definition, stream or CTE name.
    pub rule: String,
    /// Which query of the rule (`parameters[0]`, `data[1]`, `query`, `with.name`, ...).
    pub query_label: String,
    /// The SQL text of the query.
    pub sql: String,
    /// 1-based line within the SQL text (0 when unknown).
    pub line: u64,
    /// 1-based column within the SQL text (0 when unknown).
    pub column: u64,
}

impl fmt::Display for SqlLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} `{}`, {} `{}`",
            self.kind, self.rule, self.query_label, self.sql
        )?;
        if self.line > 0 {
            write!(f, " at line {}, column {}", self.line, self.column)?;
        }
        Ok(())
    }
}

/// Errors of the sync rules compiler and evaluator.
///
/// `Yaml`, `Config` and `Sql` stop a deployment (the operator must fix the rules);
/// `Row` means a source value could not be represented (the replication source must stop
/// rather than sync a wrong row); `Request` is a client problem for one sync request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RulesError {
    /// The YAML text cannot be read or does not have the sync-rules shape.
    #[error("[PSM_RULES_YAML] sync rules YAML is invalid: {message}. Fix: {hint}")]
    Yaml {
        /// What is wrong, with the YAML position when known.
        message: String,
        /// What to write instead.
        hint: String,
        /// 1-based line in the YAML text (0 when unknown).
        line: u64,
        /// 1-based column in the YAML text (0 when unknown).
        column: u64,
    },
    /// A definition or stream is well-formed YAML but not a valid rule (duplicate names,
    /// bad priority, edition mismatch).
    #[error("[PSM_RULES_CONFIG] {rule}: {message}. Fix: {hint}")]
    Config {
        /// The rule (or `config`) the problem is in.
        rule: String,
        /// What is wrong.
        message: String,
        /// What to write instead.
        hint: String,
    },
    /// A query uses SQL outside the supported subset, or is inconsistent.
    #[error("[PSM_RULES_SQL] {location}: {message}. Supported instead: {hint}")]
    Sql {
        /// Where the problem is.
        location: Box<SqlLocation>,
        /// What is wrong.
        message: String,
        /// What is supported instead.
        hint: String,
    },
    /// A source row value cannot be converted faithfully.
    #[error("[PSM_RULES_ROW] table {table}, column {column}: {message}")]
    Row {
        /// `schema.table` of the row.
        table: String,
        /// The column name.
        column: String,
        /// What is wrong with the value.
        message: String,
    },
    /// A sync request cannot be evaluated (bad parameters or subscription).
    #[error("[PSM_RULES_REQUEST] {message}")]
    Request {
        /// What is wrong, naming the stream or parameter.
        message: String,
    },
}

impl RulesError {
    /// A stable code for logs and status, so operators can search for it.
    pub fn code(&self) -> &'static str {
        match self {
            RulesError::Yaml { .. } => "PSM_RULES_YAML",
            RulesError::Config { .. } => "PSM_RULES_CONFIG",
            RulesError::Sql { .. } => "PSM_RULES_SQL",
            RulesError::Row { .. } => "PSM_RULES_ROW",
            RulesError::Request { .. } => "PSM_RULES_REQUEST",
        }
    }

    pub(crate) fn config(rule: &str, message: impl Into<String>, hint: impl Into<String>) -> Self {
        RulesError::Config {
            rule: rule.to_string(),
            message: message.into(),
            hint: hint.into(),
        }
    }
}
