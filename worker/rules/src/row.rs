//! The input of row evaluation: one source row as replication or snapshot delivers it.
//!
//! pgoutput (text format) and `COPY ... TO STDOUT` both give, per column, a name, a type OID
//! and the text representation or NULL. The row borrows all of that, so the replication
//! source can feed rows without building a string per column.

pub use super::types::PgType;

/// One column of a source row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceColumn<'a> {
    /// The column name (`pg_attribute.attname`).
    pub name: &'a str,
    /// The column's type.
    pub pg_type: PgType,
    /// The text representation, or `None` for NULL. For an unchanged TOASTed value in an
    /// UPDATE, the caller passes the value from its stored previous row image.
    pub value: Option<&'a str>,
}

/// One row of a source table, columns in table (attnum) order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceRow<'a> {
    /// The table's schema (`public` by default).
    pub schema: &'a str,
    /// The table name.
    pub table: &'a str,
    /// The columns, in table order (this is the order `SELECT *` writes them).
    pub columns: &'a [SourceColumn<'a>],
}

/// An owned row, for tools and tests that build rows from text (the CLI, fixtures).
/// Replication code should build [`SourceRow`] directly over its buffers instead.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OwnedSourceRow {
    /// Schema name.
    pub schema: String,
    /// Table name.
    pub table: String,
    /// `(name, type, text or NULL)` in table order.
    pub columns: Vec<(String, PgType, Option<String>)>,
}

impl OwnedSourceRow {
    /// An empty row of `schema.table`.
    pub fn new(schema: &str, table: &str) -> Self {
        OwnedSourceRow {
            schema: schema.to_string(),
            table: table.to_string(),
            columns: Vec::new(),
        }
    }

    /// Append a column (builder style).
    pub fn column(mut self, name: &str, pg_type: PgType, value: Option<&str>) -> Self {
        self.columns
            .push((name.to_string(), pg_type, value.map(str::to_string)));
        self
    }

    /// The borrowed column list; wrap it in a [`SourceRow`] with [`OwnedSourceRow::view`].
    pub fn source_columns(&self) -> Vec<SourceColumn<'_>> {
        self.columns
            .iter()
            .map(|(n, t, v)| SourceColumn {
                name: n,
                pg_type: *t,
                value: v.as_deref(),
            })
            .collect()
    }

    /// A [`SourceRow`] over `columns` (from [`OwnedSourceRow::source_columns`]).
    pub fn view<'a>(&'a self, columns: &'a [SourceColumn<'a>]) -> SourceRow<'a> {
        SourceRow {
            schema: &self.schema,
            table: &self.table,
            columns,
        }
    }
}
