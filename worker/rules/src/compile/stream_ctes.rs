//! The CTEs a stream's queries read (its own `with:` and the file's) and the names its
//! lookups are stored under: a CTE joined after the data table, or read by
//! `row IN (SELECT col FROM cte)`, becomes a lookup group.

use sqlparser::ast::Query;
use sqlparser::tokenizer::Span;

use super::from_items;
use super::lookup::{lookup_query, LookupQuery};
use crate::error::RulesError;
use crate::options::Compatibility;
use crate::sql::parse::parse_select;
use crate::sql::scope::RequestStyle;
use crate::sql::QueryCtx;

/// What errors call a stream.
const KIND: &str = "stream";

/// The names a stream's lookups are stored under (see `lookup_source`): its own CTEs and
/// subqueries, and the file's CTEs (shared by every stream that reads them).
pub(crate) struct LookupSources {
    pub stream: String,
    pub global: String,
    /// The stream's name, its CTEs and the file's, for the queries that read them.
    pub stream_name: String,
    pub stream_with: Vec<(String, String)>,
    pub global_with: Vec<(String, String)>,
}

impl LookupSources {
    /// The stream's or the file's CTE `name` (the stream's first; names compare without
    /// case, as the official compiler compares them), with the lookups it is stored under.
    fn cte_text(&self, name: &str) -> Option<(&str, &str, &str)> {
        fn find<'w>(with: &'w [(String, String)], name: &str) -> Option<(&'w str, &'w str)> {
            with.iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(n, q)| (n.as_str(), q.as_str()))
        }
        find(&self.stream_with, name)
            .map(|(n, q)| (n, q, self.stream.as_str()))
            .or_else(|| find(&self.global_with, name).map(|(n, q)| (n, q, self.global.as_str())))
    }

    /// True when `name` is a CTE of the stream or of the file.
    pub fn is_cte(&self, name: &str) -> bool {
        self.cte_text(name).is_some()
    }

    /// CTE `name` compiled as a lookup query, or `None` when there is none of that name.
    pub fn cte(
        &self,
        name: &str,
        compat: Compatibility,
    ) -> Option<Result<LookupQuery, RulesError>> {
        let (name, sql, source) = self.cte_text(name)?;
        let label = format!("with.{name}");
        let ctx = QueryCtx::new(KIND, &self.stream_name, label.clone(), sql, compat);
        Some(
            parse_select(&ctx, sql)
                .and_then(|sel| lookup_query(&ctx, &sel, source, &label, RequestStyle::Streams)),
        )
    }
}

/// The CTE and column of a subquery `SELECT col FROM cte [AS c]` that reads a CTE of the
/// stream or the file; `None` for a subquery of a table. A subquery of a CTE with more
/// than that (a filter, an expression) is refused: the CTE would be read as a table.
pub(crate) fn cte_column(
    ctx: &QueryCtx<'_>,
    query: &Query,
    span: Span,
    sources: &LookupSources,
) -> Result<Option<(String, String)>, RulesError> {
    let sub = super::lookup::plain_select(ctx, query, span)?;
    // Only a plain name can be a CTE (a function, a join or a schema-qualified name is not).
    let [from] = sub.from.as_slice() else {
        return Ok(None);
    };
    let plain = matches!(
        &from.relation,
        sqlparser::ast::TableFactor::Table { name, args: None, .. } if name.0.len() == 1
    );
    if !plain || !from.joins.is_empty() {
        return Ok(None);
    }
    let items = from_items(ctx, sub)?;
    let [item] = items.as_slice() else {
        return Ok(None);
    };
    if !sources.is_cte(&item.table.name) {
        return Ok(None);
    }
    let refuse = || {
        ctx.err(
            span,
            format!(
                "a subquery of CTE `{}` must be `SELECT <column> FROM {}` here",
                item.table.name, item.table.name
            ),
            "join the CTE instead: `FROM t, cte AS c WHERE t.x = c.col AND <filter on c>`",
        )
    };
    let column = match sub.projection.as_slice() {
        [sqlparser::ast::SelectItem::UnnamedExpr(e)
        | sqlparser::ast::SelectItem::ExprWithAlias { expr: e, .. }] => match e {
            sqlparser::ast::Expr::Identifier(id) => crate::sql::ident_name(id),
            sqlparser::ast::Expr::CompoundIdentifier(parts) if parts.len() == 2 => {
                crate::sql::ident_name(&parts[1])
            }
            _ => return Err(refuse()),
        },
        _ => return Err(refuse()),
    };
    if sub.selection.is_some() {
        return Err(refuse());
    }
    Ok(Some((item.table.name.clone(), column)))
}
