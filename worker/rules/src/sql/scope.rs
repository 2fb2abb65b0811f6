//! Name resolution for one query: which qualifiers name the source table or parameter
//! references, which request functions the query kind may use, and which columns it reads.

/// Which request functions a query may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStyle {
    /// Legacy data queries: no request values at all.
    Forbidden,
    /// Legacy parameter queries: `request.*()`, `token_parameters.*`, `user_parameters.*`.
    Legacy,
    /// Streams: `auth.*`, `subscription.*`, `connection.*`.
    Streams,
}

/// Name resolution for one query.
#[derive(Debug, Clone)]
pub struct Scope {
    /// Qualifiers that name the source table (its name and alias).
    pub table_qualifiers: Vec<String>,
    /// Whether the query has a source table (static parameter queries do not).
    pub has_table: bool,
    /// Qualifiers of parameter references (`bucket`, CTE aliases).
    pub ref_qualifiers: Vec<String>,
    /// Allowed request functions.
    pub request: RequestStyle,
    /// Source columns read, by slot.
    pub slots: Vec<String>,
}

impl Scope {
    /// The slot of a column, adding it on first use.
    pub fn slot(&mut self, name: &str) -> usize {
        if let Some(i) = self.slots.iter().position(|s| s == name) {
            return i;
        }
        self.slots.push(name.to_string());
        self.slots.len() - 1
    }
}
