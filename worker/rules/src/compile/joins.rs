//! Joined tables in a stream query: `FROM a JOIN b ON … , c WHERE …` (inner joins, as the
//! official compiler takes them).
//!
//! The table the query selects from syncs its rows; every other table is a parameter
//! source. The conditions are split by the tables they read and the tables arranged as a
//! tree from the selected one along `=` comparisons, as the official compiler resolves them:
//! a table compared with the selected one becomes a lookup joined to the query like a CTE
//! (`FROM t, cte AS alias WHERE t.c = alias.c`, one row of it per bucket, so composite keys
//! stay together), and a table compared with a joined one becomes a subquery nested in that
//! one's lookup (`b.x IN (SELECT c.y FROM c WHERE …)`). The lookups are rewritten SQL
//! (sqlparser's tree) built from the written expressions, so errors still point into the
//! query as written. A CTE in the query stays beside the selected table, compared with it
//! as in a query without joins.

use std::ops::ControlFlow;

use sqlparser::ast::{
    BinaryOperator, Expr as Ast, Ident, InTarget, JoinConstraint, JoinOperator, Query, Select,
    SelectItem, SelectItemQualifiedWildcardKind, SetExpr, Spanned, TableFactor, TableWithJoins,
    Visit, Visitor,
};
use sqlparser::tokenizer::Span;

use super::{from_item, FromItem};
use crate::error::RulesError;
use crate::sql::{ident_name, QueryCtx};

/// A stream query with its joined tables taken apart.
pub(crate) struct Joins {
    /// The query over the selected table alone: its own conditions and its comparisons with
    /// the joined tables, which the lookups below stand for (as CTEs do).
    pub select: Select,
    /// One lookup per table compared with the selected one: the alias the query uses, and
    /// the lookup's SELECT (outputs named like the compared columns).
    pub lookups: Vec<(String, Select)>,
}

/// A table of the query: its FROM item and the relation as written.
struct Table<'a> {
    item: FromItem,
    alias: String,
    relation: &'a TableFactor,
}

/// A comparison `a.x = b.y` between two tables (indexes into the tables).
struct Edge<'a> {
    ends: [(usize, &'a Ast); 2],
    cond: &'a Ast,
}

/// Takes a stream query's joins apart; `None` when it joins no table (`is_cte` tells the
/// CTE names, which the comma form joins as before).
pub(crate) fn take_apart(
    ctx: &QueryCtx<'_>,
    select: &Select,
    is_cte: &dyn Fn(&str) -> bool,
) -> Result<Option<Joins>, RulesError> {
    let (tables, on) = tables_of(ctx, select)?;
    let joins_tables = tables.len() > 1
        && (select.from.iter().any(|t| !t.joins.is_empty())
            || tables
                .iter()
                .skip(1)
                .any(|t| t.item.has_schema || !is_cte(&t.item.table.name)));
    if !joins_tables {
        return Ok(None);
    }
    // CTEs stay joined to the selected table as in a query without joins (comma form).
    let cte: Vec<bool> = tables
        .iter()
        .map(|t| !t.item.has_schema && is_cte(&t.item.table.name))
        .collect();
    let data = selected_table(ctx, select, &tables)?;
    let mut conditions: Vec<&Ast> = Vec::new();
    for c in on.into_iter().chain(select.selection.as_ref()) {
        split_and(c, &mut conditions);
    }
    let mut own: Vec<Vec<&Ast>> = vec![Vec::new(); tables.len()];
    let mut edges: Vec<Edge<'_>> = Vec::new();
    let mut with_ctes: Vec<&Ast> = Vec::new();
    for cond in conditions {
        let read = tables_read(ctx, cond, &tables)?;
        if read.iter().any(|&t| cte[t]) {
            if !read.iter().all(|&t| t == data || cte[t]) {
                return Err(ctx.err(
                    cond.span(),
                    "a CTE in a query that joins tables can be compared with the selected table only",
                    "compare the CTE with the table whose rows sync, or nest it: `b.x IN (SELECT col FROM cte)`",
                ));
            }
            with_ctes.push(cond);
            continue;
        }
        match read.as_slice() {
            [] => own[data].push(cond),
            [t] => own[*t].push(cond),
            [_, _] => edges.push(edge(ctx, cond, &tables)?),
            _ => {
                return Err(ctx.err(
                    cond.span(),
                    "a condition may read at most two of the joined tables",
                    "compare two tables with `=` (`a.x = b.y`), and filter each table on its own",
                ))
            }
        }
    }
    let tree = Tree::grow(ctx, data, &tables, &edges, &cte)?;
    let mut lookups = Vec::new();
    let mut data_conditions = std::mem::take(&mut own[data]);
    data_conditions.extend(with_ctes);
    for t in tree.children(data) {
        data_conditions.extend(tree.up[t].iter().map(|e| e.cond));
        let outputs = tree.up[t].iter().map(|e| e.ends[1].1).collect::<Vec<_>>();
        let lookup = tree.lookup_select(ctx, select, t, &outputs, &tables, &own)?;
        lookups.push((tables[t].alias.clone(), lookup));
    }
    let mut rewritten = select.clone();
    rewritten.from = std::iter::once(data)
        .chain((0..tables.len()).filter(|&t| cte[t]))
        .map(|t| TableWithJoins {
            relation: tables[t].relation.clone(),
            joins: Vec::new(),
        })
        .collect();
    rewritten.selection = and_all(data_conditions);
    Ok(Some(Joins {
        select: rewritten,
        lookups,
    }))
}

/// The tables of FROM (comma items and inner joins, in order) and the ON conditions.
fn tables_of<'a>(
    ctx: &QueryCtx<'_>,
    select: &'a Select,
) -> Result<(Vec<Table<'a>>, Vec<&'a Ast>), RulesError> {
    let mut tables: Vec<Table<'a>> = Vec::new();
    let mut on = Vec::new();
    let mut add = |relation: &'a TableFactor| -> Result<(), RulesError> {
        let item = from_item(ctx, relation)?;
        let alias = item
            .alias
            .clone()
            .unwrap_or_else(|| item.table.name.clone());
        if tables.iter().any(|t| t.alias == alias) {
            return Err(ctx.err(
                item.span,
                format!("`{alias}` names two tables of the query"),
                "give each table its own alias (`JOIN t AS t2`)",
            ));
        }
        tables.push(Table {
            item,
            alias,
            relation,
        });
        Ok(())
    };
    for twj in &select.from {
        add(&twj.relation)?;
        for j in &twj.joins {
            let constraint = match &j.join_operator {
                JoinOperator::Join(c) | JoinOperator::Inner(c) => c,
                _ => {
                    return Err(ctx.err(
                        j.relation.span(),
                        "only inner joins are supported",
                        "`JOIN <table> ON <condition>` (LEFT, RIGHT, FULL and CROSS joins are not sync streams)",
                    ))
                }
            };
            match constraint {
                JoinConstraint::On(e) => on.push(e),
                JoinConstraint::None => {}
                _ => {
                    return Err(ctx.err(
                        j.relation.span(),
                        "USING and NATURAL joins are not supported",
                        "`JOIN <table> ON a.x = b.y`",
                    ))
                }
            }
            add(&j.relation)?;
        }
    }
    Ok((tables, on))
}

/// The table the SELECT list reads (`t.*`, `t.col`): exactly one.
fn selected_table(
    ctx: &QueryCtx<'_>,
    select: &Select,
    tables: &[Table<'_>],
) -> Result<usize, RulesError> {
    let mut selected: Option<usize> = None;
    for item in &select.projection {
        let read = match item {
            SelectItem::QualifiedWildcard(SelectItemQualifiedWildcardKind::ObjectName(name), _) => {
                let alias = name.0.last().and_then(|p| p.as_ident()).map(ident_name);
                match tables.iter().position(|t| Some(&t.alias) == alias.as_ref()) {
                    Some(t) => vec![t],
                    None => {
                        return Err(ctx.err(
                            item.span(),
                            format!("`{name}.*` names no table of the query"),
                            "`<alias>.*` of a table in FROM",
                        ))
                    }
                }
            }
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => {
                tables_read(ctx, e, tables)?
            }
            _ => {
                return Err(ctx.err(
                    item.span(),
                    "`*` is ambiguous when the query joins tables",
                    "`<table>.*` for the table whose rows sync",
                ))
            }
        };
        for t in read {
            match selected {
                None => selected = Some(t),
                Some(s) if s == t => {}
                Some(s) => {
                    return Err(ctx.err(
                        item.span(),
                        format!(
                            "a stream syncs rows of one table, and this query already selects from `{}`",
                            tables[s].alias
                        ),
                        "select columns of one table; the others filter which of its rows sync",
                    ))
                }
            }
        }
    }
    selected.ok_or_else(|| {
        ctx.err(
            select.select_token.0.span,
            "the SELECT list reads no table",
            "`SELECT <table>.* FROM ...`",
        )
    })
}

/// The tables an expression reads (outside its subqueries), in the order of `tables`.
fn tables_read(
    ctx: &QueryCtx<'_>,
    e: &Ast,
    tables: &[Table<'_>],
) -> Result<Vec<usize>, RulesError> {
    let mut refs = References::default();
    let _ = e.visit(&mut refs);
    if let Some(span) = refs.unqualified {
        return Err(ctx.err(
            span,
            "a column without its table, in a query that joins tables",
            "qualify the column (`<table>.<column>`): several tables are in scope",
        ));
    }
    Ok((0..tables.len())
        .filter(|&t| refs.qualifiers.contains(&tables[t].alias))
        .collect())
}

/// The column qualifiers an expression uses outside its subqueries, and the first column
/// without one.
#[derive(Default)]
struct References {
    depth: usize,
    qualifiers: Vec<String>,
    unqualified: Option<Span>,
}

impl Visitor for References {
    type Break = ();

    fn pre_visit_query(&mut self, _query: &Query) -> ControlFlow<()> {
        self.depth += 1;
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _query: &Query) -> ControlFlow<()> {
        self.depth -= 1;
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Ast) -> ControlFlow<()> {
        if self.depth == 0 {
            match e {
                Ast::CompoundIdentifier(parts) if parts.len() == 2 => {
                    self.qualifiers.push(ident_name(&parts[0]))
                }
                Ast::Identifier(id) => {
                    self.unqualified.get_or_insert(id.span);
                }
                _ => {}
            }
        }
        ControlFlow::Continue(())
    }
}

/// `a.x = b.y` between two tables.
fn edge<'a>(
    ctx: &QueryCtx<'_>,
    cond: &'a Ast,
    tables: &[Table<'_>],
) -> Result<Edge<'a>, RulesError> {
    let Ast::BinaryOp {
        left,
        op: BinaryOperator::Eq,
        right,
    } = strip(cond)
    else {
        return Err(ctx.err(
            cond.span(),
            "two joined tables can only be compared with `=`",
            "`a.x = b.y`; filter each table on its own",
        ));
    };
    let side = |e: &'a Ast| -> Result<(usize, &'a Ast), RulesError> {
        match tables_read(ctx, e, tables)?.as_slice() {
            [t] => Ok((*t, e)),
            _ => Err(ctx.err(
                e.span(),
                "each side of a join condition must read one table",
                "`a.x = b.y`",
            )),
        }
    };
    let ends = [side(left)?, side(right)?];
    if ends[0].0 == ends[1].0 {
        return Err(ctx.err(
            cond.span(),
            "each side of a join condition must read one table",
            "`a.x = b.y`",
        ));
    }
    Ok(Edge { ends, cond })
}

/// The tables as a tree from the selected one: for each table, the comparisons with its
/// parent, oriented parent side first.
struct Tree<'a> {
    parent: Vec<Option<usize>>,
    up: Vec<Vec<Edge<'a>>>,
}

impl<'a> Tree<'a> {
    fn grow(
        ctx: &QueryCtx<'_>,
        root: usize,
        tables: &[Table<'_>],
        edges: &[Edge<'a>],
        ctes: &[bool],
    ) -> Result<Self, RulesError> {
        let n = tables.len();
        // The CTEs stay beside the root, outside the tree.
        let mut placed = ctes.to_vec();
        placed[root] = true;
        let mut tree = Tree {
            parent: vec![None; n],
            up: (0..n).map(|_| Vec::new()).collect(),
        };
        let mut used = vec![false; edges.len()];
        let mut grew = true;
        while grew {
            grew = false;
            for (i, e) in edges.iter().enumerate() {
                if used[i] {
                    continue;
                }
                let [(a, ea), (b, eb)] = e.ends;
                let (parent, child) = match (placed[a], placed[b]) {
                    (true, false) => ((a, ea), (b, eb)),
                    (false, true) => ((b, eb), (a, ea)),
                    _ => continue,
                };
                placed[child.0] = true;
                tree.parent[child.0] = Some(parent.0);
                used[i] = true;
                grew = true;
                // Every comparison between the two is a key of the same lookup row.
                for (j, other) in edges.iter().enumerate() {
                    let [(x, ex), (y, ey)] = other.ends;
                    if !used[j] && [x, y] == [parent.0, child.0] {
                        tree.up[child.0].push(Edge {
                            ends: [(x, ex), (y, ey)],
                            cond: other.cond,
                        });
                        used[j] = true;
                    } else if !used[j] && [y, x] == [parent.0, child.0] {
                        tree.up[child.0].push(Edge {
                            ends: [(y, ey), (x, ex)],
                            cond: other.cond,
                        });
                        used[j] = true;
                    }
                }
                tree.up[child.0].insert(
                    0,
                    Edge {
                        ends: [parent, child],
                        cond: e.cond,
                    },
                );
            }
        }
        if let Some(t) = (0..n).find(|&t| !placed[t]) {
            return Err(ctx.err(
                tables[t].item.span,
                format!(
                    "`{}` is not compared with `{}` (or a table joined to it) by `=`",
                    tables[t].alias, tables[root].alias
                ),
                "join it with `ON <table>.<column> = <other>.<column>`",
            ));
        }
        if let Some(i) = (0..edges.len()).find(|&i| !used[i]) {
            return Err(ctx.err(
                edges[i].cond.span(),
                "this comparison closes a circle of joined tables",
                "join each table to the others along one path",
            ));
        }
        Ok(tree)
    }

    fn children(&self, t: usize) -> Vec<usize> {
        (0..self.parent.len())
            .filter(|&c| self.parent[c] == Some(t))
            .collect()
    }

    /// The lookup SELECT of table `t`: `outputs` (its sides of the comparisons with its
    /// parent, named by their columns), its own conditions, and a nested `IN (SELECT ...)`
    /// per table joined to it.
    fn lookup_select(
        &self,
        ctx: &QueryCtx<'_>,
        template: &Select,
        t: usize,
        outputs: &[&Ast],
        tables: &[Table<'_>],
        own: &[Vec<&Ast>],
    ) -> Result<Select, RulesError> {
        let mut projection: Vec<SelectItem> = Vec::new();
        for e in outputs {
            let Ast::CompoundIdentifier(parts) = strip(e) else {
                return Err(ctx.err(
                    e.span(),
                    "a joined table is compared by one of its columns",
                    "`a.x = b.y` with a column on each side",
                ));
            };
            let name = ident_name(&parts[1]);
            if !projection.iter().any(|p| matches!(p, SelectItem::ExprWithAlias { alias, .. } if ident_name(alias) == name)) {
                projection.push(SelectItem::ExprWithAlias {
                    expr: (*e).clone(),
                    alias: Ident::new(name),
                });
            }
        }
        let mut conditions: Vec<Ast> = own[t].iter().map(|c| (*c).clone()).collect();
        for c in self.children(t) {
            let [edge] = self.up[c].as_slice() else {
                return Err(ctx.err(
                    self.up[c][1].cond.span(),
                    "tables joined beyond the first are compared by one column",
                    "join the table on one column, or compare it with the selected table",
                ));
            };
            let inner = self.lookup_select(ctx, template, c, &[edge.ends[1].1], tables, own)?;
            conditions.push(Ast::In {
                expr: Box::new(edge.ends[0].1.clone()),
                target: InTarget::Subquery(Box::new(query_of(inner))),
                negated: false,
                global: false,
            });
        }
        let mut select = template.clone();
        select.projection = projection;
        select.from = vec![TableWithJoins {
            relation: tables[t].relation.clone(),
            joins: Vec::new(),
        }];
        select.selection = and_all(conditions.iter().collect());
        Ok(select)
    }
}

fn strip(e: &Ast) -> &Ast {
    match e {
        Ast::Nested(inner) => strip(inner),
        other => other,
    }
}

/// The conjuncts of `e` (through parentheses).
fn split_and<'a>(e: &'a Ast, out: &mut Vec<&'a Ast>) {
    match e {
        Ast::Nested(inner) => split_and(inner, out),
        Ast::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            split_and(left, out);
            split_and(right, out);
        }
        other => out.push(other),
    }
}

fn and_all(conditions: Vec<&Ast>) -> Option<Ast> {
    conditions
        .into_iter()
        .cloned()
        .reduce(|a, b| Ast::BinaryOp {
            left: Box::new(a),
            op: BinaryOperator::And,
            right: Box::new(b),
        })
}

/// A query of one SELECT.
fn query_of(select: Select) -> Query {
    Query {
        with: None,
        body: Box::new(SetExpr::Select(Box::new(select))),
        order_by: None,
        limit_clause: None,
        fetch: None,
        locks: Vec::new(),
        for_clause: None,
        settings: None,
        format_clause: None,
        pipe_operators: Vec::new(),
    }
}
