//! Parameter queries (legacy `parameters`, stream CTEs and `IN (SELECT ...)` subqueries):
//! static ones read only the request; table ones become lookup creators (row side) and
//! lookup groups (request side) that meet in `LookupKey`s.

use sqlparser::ast::{Expr as Ast, Select, SelectItem, Spanned};

use super::select_list::{select_output, SelectOutput, UnsupportedItem, UNSUPPORTED_ITEM};
use super::{from_items, FromItem, MAX_BRANCHES};
use crate::error::RulesError;
use crate::expr::Expr;
use crate::plan::{LookupBranch, LookupCreator, TableRef};
use crate::request::{LinkInput, LookupGroup, RequestBranch};
use crate::sql::filter::{classify, to_dnf, Branch, Cond, LinkTarget};
use crate::sql::lower::{fix_in_precedence, lower, lower_side, Side};
use crate::sql::scope::{RequestStyle, Scope};
use crate::sql::{ident_name, QueryCtx};

/// A compiled parameter/lookup query (legacy parameter query, stream CTE or subquery).
pub(crate) struct LookupQuery {
    /// The lookup creators and their tables: this query's (table queries only) and those of
    /// the subqueries nested in it.
    pub creators: Vec<(TableRef, LookupCreator)>,
    /// The request side: the groups of the nested subqueries, then this query's own (the
    /// last). A [`LinkInput::Group`] counts from the first.
    pub groups: Vec<LookupGroup>,
    /// Output names, by position in a group row.
    pub outputs: Vec<String>,
    /// `_priority`, if given.
    pub priority: Option<u8>,
}

impl LookupQuery {
    /// A query of one group (static or `json_each`).
    pub(crate) fn single(group: LookupGroup, outputs: Vec<String>, priority: Option<u8>) -> Self {
        LookupQuery {
            creators: Vec::new(),
            groups: vec![group],
            outputs,
            priority,
        }
    }

    /// Moves the groups to the end of a resolver's `groups`; returns the index of this
    /// query's own group there.
    pub(crate) fn push_groups(&mut self, groups: &mut Vec<LookupGroup>) -> usize {
        let offset = groups.len();
        groups.extend(self.groups.drain(..).map(|g| g.rebased(offset)));
        groups.len() - 1
    }
}

/// Compile a parameter query: static (no FROM) or table (one table, links to the request).
pub(crate) fn lookup_query(
    ctx: &QueryCtx<'_>,
    select: &Select,
    source: &str,
    query_id: &str,
    style: RequestStyle,
) -> Result<LookupQuery, RulesError> {
    if let Some(each) = json_each(ctx, select, style)? {
        return Ok(each);
    }
    let table = one_table(ctx, select, style)?;
    let mut scope = Scope {
        table_qualifiers: table
            .iter()
            .flat_map(|t| [Some(t.table.name.clone()), t.alias.clone()])
            .flatten()
            .collect(),
        has_table: table.is_some(),
        ref_qualifiers: Vec::new(),
        request: style,
        slots: Vec::new(),
    };
    let ParameterOutputs {
        row: row_outputs,
        request: req_outputs,
        priority,
    } = parameter_outputs(ctx, &mut scope, select)?;
    let filter = match (&select.selection, &table) {
        (Some(w), Some(_)) => Some(classify(ctx, &mut scope, &fix_in_precedence(w))?),
        _ => None,
    };
    let Some(table) = table else {
        // Static: outputs and filter read only the request.
        // Without a table every condition reads only the request (columns were rejected
        // while lowering), so keep AND/OR/NOT exactly as written.
        let mut conds = Vec::new();
        if let Some(w) = &select.selection {
            conds.push(lower(ctx, &mut scope, &fix_in_precedence(w))?);
        }
        let names = req_outputs.iter().map(|(n, _)| n.clone()).collect();
        let group = LookupGroup::Static {
            outputs: req_outputs.into_iter().map(|(_, e)| e).collect(),
            filter: conds,
        };
        return Ok(LookupQuery::single(group, names, priority));
    };
    // In streams a table read without a link to the request is one lookup of all its
    // (matching) rows, as the official compiler resolves it.
    let branches = match (filter, style) {
        (Some(filter), _) => to_dnf(&filter, MAX_BRANCHES).ok_or_else(|| {
            ctx.err(
                select.select_token.0.span,
                "the WHERE clause expands to too many OR branches",
                "simplify the filter or split it into several queries",
            )
        })?,
        (None, RequestStyle::Streams) => vec![Branch::default()],
        (None, RequestStyle::Legacy | RequestStyle::Forbidden) => {
            return Err(ctx.err(
                select.select_token.0.span,
                "a parameter query that reads a table must filter it by request values",
                "`WHERE <table>.<column> = request.user_id()`",
            ))
        }
    };
    let mut nested = Nested {
        source,
        style,
        creators: Vec::new(),
        groups: Vec::new(),
    };
    let (creator_branches, request_branches) =
        lookup_branches(ctx, select, query_id, branches, &mut nested)?;
    let mut outputs: Vec<String> = row_outputs.iter().map(|(n, _)| n.clone()).collect();
    outputs.extend(req_outputs.iter().map(|(n, _)| n.clone()));
    let mut creators = vec![(
        table.table.clone(),
        LookupCreator {
            source: source.to_string(),
            slots: scope.slots.clone(),
            outputs: row_outputs.into_iter().map(|(_, e)| e).collect(),
            branches: creator_branches,
        },
    )];
    creators.extend(nested.creators);
    let mut groups = nested.groups;
    groups.push(LookupGroup::Table {
        source: source.to_string(),
        branches: request_branches,
        request_outputs: req_outputs.into_iter().map(|(_, e)| e).collect(),
    });
    Ok(LookupQuery {
        creators,
        groups,
        outputs,
        priority,
    })
}

/// The table a parameter query reads, if any: at most one, without alias in legacy rules.
fn one_table(
    ctx: &QueryCtx<'_>,
    select: &Select,
    style: RequestStyle,
) -> Result<Option<FromItem>, RulesError> {
    let from = from_items(ctx, select)?;
    if from.len() > 1 {
        return Err(ctx.err(
            from[1].span,
            "a parameter query reads one table",
            "one table per parameter query",
        ));
    }
    let table = from.first().cloned();
    if let (Some(t), RequestStyle::Legacy) = (&table, style) {
        if t.alias.is_some() {
            return Err(ctx.err(
                t.span,
                "table aliases are not supported in parameter queries",
                "`FROM <table>` without alias",
            ));
        }
    }
    Ok(table)
}

/// A parameter query's output columns, by the side they read, and its `_priority`.
struct ParameterOutputs {
    /// Outputs that read the row.
    row: Vec<(String, Expr)>,
    /// Outputs that read the request (or nothing).
    request: Vec<(String, Expr)>,
    priority: Option<u8>,
}

/// Lower the SELECT list of a parameter query: unique names, no parameter references.
fn parameter_outputs(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    select: &Select,
) -> Result<ParameterOutputs, RulesError> {
    let mut row_outputs: Vec<(String, Expr)> = Vec::new();
    let mut req_outputs: Vec<(String, Expr)> = Vec::new();
    let mut priority = None;
    let star = (
        "`*` is not allowed in a parameter query",
        "list the parameter columns explicitly",
    );
    for item in &select.projection {
        let Some((e, name)) = parameter_output(ctx, item, UNSUPPORTED_ITEM, star, &mut priority)?
        else {
            continue;
        };
        if row_outputs
            .iter()
            .chain(&req_outputs)
            .any(|(n, _)| *n == name)
        {
            return Err(ctx.err(
                e.span(),
                format!("output column `{name}` appears twice"),
                "unique output names",
            ));
        }
        match lower_side(ctx, scope, &fix_in_precedence(e))? {
            Side::Row(x) => row_outputs.push((name, x)),
            Side::Request(x) | Side::Static(x) => req_outputs.push((name, x)),
            Side::Ref { .. } => {
                return Err(ctx.err(
                    e.span(),
                    "parameter references are not allowed here",
                    "row columns or request values",
                ))
            }
        }
    }
    Ok(ParameterOutputs {
        row: row_outputs,
        request: req_outputs,
        priority,
    })
}

/// The subqueries nested in a parameter query's WHERE (`col IN (SELECT ...)`, streams
/// only), compiled as they are met: their lookup creators, and their groups, which come
/// before the query's own.
struct Nested<'s> {
    source: &'s str,
    style: RequestStyle,
    creators: Vec<(TableRef, LookupCreator)>,
    groups: Vec<LookupGroup>,
}

/// Each OR branch of a table parameter query: its row side (lookup creator) and its
/// request side (lookup group), under one query id.
fn lookup_branches(
    ctx: &QueryCtx<'_>,
    select: &Select,
    query_id: &str,
    branches: Vec<Branch>,
    nested: &mut Nested<'_>,
) -> Result<(Vec<LookupBranch>, Vec<RequestBranch>), RulesError> {
    let mut creator_branches = Vec::new();
    let mut request_branches = Vec::new();
    let multi = branches.len() > 1;
    for (i, b) in branches.into_iter().enumerate() {
        let id = if multi {
            format!("{query_id}.{i}")
        } else {
            query_id.to_string()
        };
        let (row_links, req_links) = branch_links(ctx, &id, b.links, nested)?;
        if row_links.is_empty() && nested.style != RequestStyle::Streams {
            return Err(ctx.err(
                select.selection.as_ref().map(|w| w.span()).unwrap_or(select.select_token.0.span),
                "every OR branch of a parameter query must compare a row column with a request value",
                "`<table>.<column> = request.user_id()` in each branch",
            ));
        }
        creator_branches.push(LookupBranch {
            query_id: id.clone(),
            rows: b.rows,
            links: row_links,
        });
        request_branches.push(RequestBranch {
            query_id: id,
            requests: b.requests,
            links: req_links,
        });
    }
    Ok((creator_branches, request_branches))
}

/// The links of one branch, split into their row sides and request sides (each with
/// whether it expands an array); at most one may expand. A nested subquery's request side
/// is its group's output.
#[allow(clippy::type_complexity)]
fn branch_links(
    ctx: &QueryCtx<'_>,
    id: &str,
    links: Vec<Cond>,
    nested: &mut Nested<'_>,
) -> Result<(Vec<(Expr, bool)>, Vec<(LinkInput, bool)>), RulesError> {
    let mut row_links = Vec::new();
    let mut req_links = Vec::new();
    let mut expanding = 0;
    for l in links {
        match l {
            Cond::Link {
                row,
                row_expands,
                target: LinkTarget::Request(r),
                target_expands,
                span,
            } => {
                if row_expands || target_expands {
                    expanding += 1;
                    if expanding > 1 {
                        return Err(ctx.err(
                            span,
                            "cannot have multiple array (IN) parameters in one parameter query",
                            "at most one `IN` link per query",
                        ));
                    }
                }
                row_links.push((row, row_expands));
                req_links.push((LinkInput::Request(r), target_expands));
            }
            Cond::Subquery { row, query, span } if nested.style == RequestStyle::Streams => {
                let sub_id = format!("{id}.in{}", row_links.len());
                let group = nested_subquery(ctx, &query, span, &sub_id, nested)?;
                row_links.push((row, false));
                req_links.push((LinkInput::Group { group, output: 0 }, false));
            }
            Cond::Link { span, .. } | Cond::Subquery { span, .. } | Cond::Gate { span, .. } => {
                return Err(ctx.err(
                    span,
                    "this condition is not supported in a parameter query",
                    "`<table>.<column> = <request value>` or IN forms",
                ))
            }
            Cond::Row(_) | Cond::Request(_) => {}
        }
    }
    Ok((row_links, req_links))
}

/// `col IN (SELECT x FROM t WHERE ...)` inside a parameter query: the subquery is compiled
/// under `id` and its groups join the nested ones; returns the index of its own group.
fn nested_subquery(
    ctx: &QueryCtx<'_>,
    query: &sqlparser::ast::Query,
    span: sqlparser::tokenizer::Span,
    id: &str,
    nested: &mut Nested<'_>,
) -> Result<usize, RulesError> {
    let mut q = in_subquery(ctx, query, span, nested.source, id, nested.style)?;
    nested.creators.append(&mut q.creators);
    Ok(q.push_groups(&mut nested.groups))
}

/// The subquery of `x IN (SELECT col FROM t WHERE ...)`, compiled under `source` and `id`:
/// a plain SELECT of exactly one column.
pub(crate) fn in_subquery(
    ctx: &QueryCtx<'_>,
    query: &sqlparser::ast::Query,
    span: sqlparser::tokenizer::Span,
    source: &str,
    id: &str,
    style: RequestStyle,
) -> Result<LookupQuery, RulesError> {
    let sub = plain_select(ctx, query, span)?;
    let q = lookup_query(ctx, sub, source, id, style)?;
    if q.outputs.len() != 1 {
        return Err(ctx.err(
            span,
            "a subquery in IN must select exactly one column",
            "`IN (SELECT col FROM t WHERE ...)`",
        ));
    }
    Ok(q)
}

/// The SELECT of `IN (SELECT ...)`: a plain one, without WITH, ORDER BY or LIMIT.
pub(crate) fn plain_select<'q>(
    ctx: &QueryCtx<'_>,
    query: &'q sqlparser::ast::Query,
    span: sqlparser::tokenizer::Span,
) -> Result<&'q Select, RulesError> {
    match query.body.as_ref() {
        sqlparser::ast::SetExpr::Select(sel)
            if query.with.is_none() && query.order_by.is_none() && query.limit_clause.is_none() =>
        {
            Ok(sel)
        }
        _ => Err(ctx.err(
            span,
            "only a plain SELECT is supported inside IN (...)",
            "`IN (SELECT col FROM t WHERE ...)`",
        )),
    }
}

/// `SELECT <exprs of value> FROM json_each(<request array>) [WHERE ...]`: expands a JSON
/// array from the request into one parameter row per element. `None` when the query does
/// not read `json_each`.
fn json_each(
    ctx: &QueryCtx<'_>,
    select: &Select,
    style: RequestStyle,
) -> Result<Option<LookupQuery>, RulesError> {
    let [twj] = select.from.as_slice() else {
        return Ok(None);
    };
    let sqlparser::ast::TableFactor::Table {
        name,
        alias,
        args: Some(args),
        ..
    } = &twj.relation
    else {
        return Ok(None);
    };
    let is_each = matches!(name.0.as_slice(), [sqlparser::ast::ObjectNamePart::Identifier(id)] if ident_name(id) == "json_each");
    if !is_each || !twj.joins.is_empty() {
        return Ok(None);
    }
    let span = twj.relation.span();
    let [sqlparser::ast::FunctionArg::Unnamed(sqlparser::ast::FunctionArgExpr::Expr(arg))] =
        args.args.as_slice()
    else {
        return Err(ctx.err(
            span,
            "json_each takes exactly one argument",
            "`json_each(<request JSON array>)`",
        ));
    };
    let mut request_scope = Scope {
        table_qualifiers: Vec::new(),
        has_table: false,
        ref_qualifiers: Vec::new(),
        request: style,
        slots: Vec::new(),
    };
    let array = lower(ctx, &mut request_scope, &fix_in_precedence(arg))?;
    let mut scope = Scope {
        table_qualifiers: ["json_each".to_string()]
            .into_iter()
            .chain(alias.as_ref().map(|a| ident_name(&a.name)))
            .collect(),
        has_table: true,
        ref_qualifiers: Vec::new(),
        request: style,
        slots: vec!["value".to_string()],
    };
    let mut names = Vec::new();
    let mut outputs = Vec::new();
    let mut priority = None;
    // `*` is just another form json_each does not support.
    let unsupported = (
        "this SELECT item form is not supported here",
        "`value AS <name>`",
    );
    for item in &select.projection {
        let Some((e, name)) = parameter_output(ctx, item, unsupported, unsupported, &mut priority)?
        else {
            continue;
        };
        outputs.push(lower(ctx, &mut scope, &fix_in_precedence(e))?);
        names.push(name);
    }
    let mut filter = Vec::new();
    if let Some(w) = &select.selection {
        filter.push(lower(ctx, &mut scope, &fix_in_precedence(w))?);
    }
    if let Some(extra) = scope.slots.get(1) {
        return Err(ctx.err(
            span,
            format!("json_each has no column `{extra}`"),
            "`value` (the array element)",
        ));
    }
    let group = LookupGroup::Each {
        array,
        outputs,
        filter,
    };
    Ok(Some(LookupQuery::single(group, names, priority)))
}

/// Read one SELECT list item of a parameter query: its output expression and name, or
/// `None` when it sets `_priority` (recorded in `priority`). `star` is the error for `*`,
/// `unsupported` the one for other item forms.
fn parameter_output<'a>(
    ctx: &QueryCtx<'_>,
    item: &'a SelectItem,
    unsupported: UnsupportedItem,
    star: UnsupportedItem,
    priority: &mut Option<u8>,
) -> Result<Option<(&'a Ast, String)>, RulesError> {
    let (e, name) = match select_output(ctx, item, unsupported)? {
        SelectOutput::Named(e, name) => (e, name),
        SelectOutput::Star(_) | SelectOutput::QualifiedStar(_) => {
            return Err(ctx.err(item.span(), star.0, star.1))
        }
    };
    if name == "_priority" {
        *priority = Some(priority_literal(ctx, e, *priority)?);
        return Ok(None);
    }
    Ok(Some((e, name)))
}

/// `_priority`: an integer literal 0..3, set once.
fn priority_literal(ctx: &QueryCtx<'_>, e: &Ast, previous: Option<u8>) -> Result<u8, RulesError> {
    if previous.is_some() {
        return Err(ctx.err(e.span(), "`_priority` is set twice", "set `_priority` once"));
    }
    match e {
        Ast::Value(v) => match &v.value {
            sqlparser::ast::Value::Number(n, _) => match n.parse::<u8>() {
                Ok(p) if p <= 3 => Ok(p),
                _ => Err(ctx.err(e.span(), "`_priority` must be 0..3", "`1 AS _priority`")),
            },
            _ => Err(ctx.err(
                e.span(),
                "`_priority` must be an integer literal",
                "`1 AS _priority`",
            )),
        },
        _ => Err(ctx.err(
            e.span(),
            "`_priority` must be an integer literal",
            "`1 AS _priority`",
        )),
    }
}
