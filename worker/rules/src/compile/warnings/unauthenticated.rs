//! Edition 3: a stream bucket chosen by values the client sets (`subscription.*`,
//! `connection.*`) and no token value (`auth.*`).
//!
//! As the official compiler decides it, for each bucket of a stream after those
//! instantiated alike were merged: its parameters, in bucket order, each classified by the
//! request values it is made of (a lookup's by the values it is looked up with, a CTE's or
//! `json_each`'s by its request side). One parameter with a token value is enough; a value
//! with no request value at all counts as a token's. Only when no parameter reads the
//! request do the request-only conditions decide, read together as one. The warning points
//! at the first client value of the first parameter (or condition) that decided.

use std::ops::ControlFlow;

use sqlparser::ast::{
    Expr as Ast, FunctionArg, FunctionArgExpr, FunctionArguments, Spanned, Value as AstValue,
    Visit, Visitor,
};
use sqlparser::tokenizer::Location;

use super::{at, parsed, qualified_call};
use crate::compile::bucket_sources::StreamBucket;
use crate::expr::{Expr, RequestRef};
use crate::options::Compatibility;
use crate::request::{LinkInput, LookupGroup, ParamSource};
use crate::sql::{offset_of, QueryCtx};
use crate::warning::{RulesWarning, WarningKind};
use crate::yaml::RawStream;

/// What decides a bucket's instantiation.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class<'a> {
    /// A token value (or a value of no request at all).
    Token,
    /// Nothing of the request.
    Neutral,
    /// Client values only; the first of them.
    Client(&'a RequestRef),
}

/// The warning for one of a stream's buckets, if it is chosen by client values only.
pub(super) fn of_bucket(
    s: &RawStream,
    global_with: &[(String, String)],
    compat: Compatibility,
    bucket: &StreamBucket,
) -> Option<RulesWarning> {
    let r = &bucket.resolver;
    let mut class = merge(r.params.iter().map(|p| param(p, &r.groups)));
    if class == Class::Neutral {
        class = conditions(r.request_filters.iter(), &r.groups, &r.params);
    }
    let Class::Client(value) = class else {
        return None;
    };
    let (ctx, start, text) = locate(s, global_with, compat, &bucket.query_label, value)?;
    Some(at(
        &ctx,
        WarningKind::UnauthenticatedParameter,
        start,
        &text,
        format!(
            "the stream's buckets are chosen by `{text}`, which the client sets, and by no token \
             value (the official compiler: \"Clients can send any value for this unauthenticated \
             parameter, so this is unsuitable for authorization\")"
        ),
        "also constrain the query by a token value (`auth.user_id()`, `auth.parameter('k')`), or \
         set `accept_potentially_dangerous_queries: true` on the stream if any client may have \
         these buckets"
            .into(),
    ))
}

fn is_token(r: &RequestRef) -> bool {
    matches!(
        r,
        RequestRef::UserId | RequestRef::Jwt | RequestRef::Claim(_) | RequestRef::TokenParameter(_)
    )
}

/// One expression: a token value if it reads one or reads no request value at all.
fn expr(e: &Expr) -> Class<'_> {
    let mut refs = Vec::new();
    e.request_refs(&mut refs);
    match refs.iter().find(|r| is_token(r)) {
        Some(_) => Class::Token,
        None => refs.first().map_or(Class::Token, |r| Class::Client(r)),
    }
}

/// Several: a token value if any is; else the first client value.
fn merge<'a>(classes: impl Iterator<Item = Class<'a>>) -> Class<'a> {
    let mut first = Class::Neutral;
    for c in classes {
        match c {
            Class::Token => return Class::Token,
            Class::Client(_) if first == Class::Neutral => first = c,
            _ => {}
        }
    }
    first
}

fn param<'a>(p: &'a ParamSource, groups: &'a [LookupGroup]) -> Class<'a> {
    match p {
        ParamSource::Request { expr: e, .. } => expr(e),
        ParamSource::Lookup { group, output } => group_output(groups, *group, *output),
        ParamSource::All(all) => merge(all.iter().map(|p| param(p, groups))),
    }
}

/// Output `output` of group `g`: a table's lookup by its keys, a static CTE's by the
/// expression, `json_each` by its array.
fn group_output(groups: &[LookupGroup], g: usize, output: usize) -> Class<'_> {
    match groups.get(g) {
        Some(LookupGroup::Table { branches, .. }) => merge(
            branches
                .iter()
                .flat_map(|b| b.links.iter())
                .map(|(input, _)| match input {
                    LinkInput::Request(e) => expr(e),
                    LinkInput::Group { group, output } => group_output(groups, *group, *output),
                }),
        ),
        Some(LookupGroup::Static { outputs, .. }) => {
            outputs.get(output).map_or(Class::Neutral, expr)
        }
        Some(LookupGroup::Each { array, .. }) => expr(array),
        None => Class::Neutral,
    }
}

/// The request-only conditions read as one: the resolver's and those inside the groups its
/// parameters read.
fn conditions<'a>(
    filters: impl Iterator<Item = &'a Expr>,
    groups: &'a [LookupGroup],
    params: &'a [ParamSource],
) -> Class<'a> {
    let mut refs = Vec::new();
    for f in filters {
        f.request_refs(&mut refs);
    }
    for g in reached(groups, params) {
        match groups.get(g) {
            Some(LookupGroup::Table { branches, .. }) => branches
                .iter()
                .flat_map(|b| b.requests.iter())
                .for_each(|e| e.request_refs(&mut refs)),
            Some(LookupGroup::Static { filter, .. }) => {
                filter.iter().for_each(|e| e.request_refs(&mut refs))
            }
            _ => {}
        }
    }
    if refs.iter().any(|r| is_token(r)) {
        return Class::Token;
    }
    refs.first().map_or(Class::Neutral, |r| Class::Client(r))
}

/// The groups the parameters read, directly or through other groups.
fn reached(groups: &[LookupGroup], params: &[ParamSource]) -> Vec<usize> {
    fn of_param(p: &ParamSource, out: &mut Vec<usize>) {
        match p {
            ParamSource::Request { .. } => {}
            ParamSource::Lookup { group, .. } => out.push(*group),
            ParamSource::All(all) => all.iter().for_each(|p| of_param(p, out)),
        }
    }
    let mut out = Vec::new();
    params.iter().for_each(|p| of_param(p, &mut out));
    let mut i = 0;
    while let Some(&g) = out.get(i) {
        if let Some(LookupGroup::Table { branches, .. }) = groups.get(g) {
            for (input, _) in branches.iter().flat_map(|b| b.links.iter()) {
                if let LinkInput::Group { group, .. } = input {
                    if !out.contains(group) {
                        out.push(*group);
                    }
                }
            }
        }
        i += 1;
    }
    out
}

/// Where `value` is written: the first call that reads it in the bucket's query, else in
/// the stream's CTEs, else in the file's.
fn locate<'a>(
    s: &'a RawStream,
    global_with: &'a [(String, String)],
    compat: Compatibility,
    label: &str,
    value: &RequestRef,
) -> Option<(QueryCtx<'a>, Location, String)> {
    let query = s
        .queries
        .iter()
        .enumerate()
        .find(|(k, _)| super::query_label(s, *k) == label)
        .map(|(_, sql)| (label.to_string(), sql));
    let ctes = s
        .with
        .iter()
        .chain(global_with)
        .map(|(name, sql)| (format!("with.{name}"), sql));
    let mut first_query = None;
    for (label, sql) in query.into_iter().chain(ctes) {
        let ctx = QueryCtx::new("stream", &s.name, label, sql, compat);
        if first_query.is_none() {
            first_query = Some(ctx.clone());
        }
        let Some(select) = parsed(&ctx) else { continue };
        let mut calls = Calls { value, first: None };
        let _ = select.visit(&mut calls);
        if let Some(start) = calls.first {
            let text = call_text(ctx.sql, start).unwrap_or(ctx.sql).to_string();
            return Some((ctx, start, text));
        }
    }
    first_query.map(|ctx| {
        let text = ctx.sql.to_string();
        (ctx, Location::new(1, 1), text)
    })
}

/// The first call (by position) that reads a request value.
struct Calls<'v> {
    value: &'v RequestRef,
    first: Option<Location>,
}

impl Visitor for Calls<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, e: &Ast) -> ControlFlow<()> {
        if let Ast::Function(f) = e {
            if let Some((ns, name)) = qualified_call(f) {
                if reads(self.value, &ns, &name, first_string(&f.args)) {
                    let start = e.span().start;
                    if self
                        .first
                        .is_none_or(|s| (start.line, start.column) < (s.line, s.column))
                    {
                        self.first = Some(start);
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// Whether `ns.name('key')` reads `value`.
fn reads(value: &RequestRef, ns: &str, name: &str, key: Option<&str>) -> bool {
    match value {
        RequestRef::SubscriptionParameter(k) => {
            ns == "subscription" && name == "parameter" && key == Some(k.as_str())
        }
        RequestRef::SubscriptionParameters => ns == "subscription" && name == "parameters",
        RequestRef::ClientParameter(k) => {
            ns == "connection" && name == "parameter" && key == Some(k.as_str())
        }
        RequestRef::ClientParameters => ns == "connection" && name == "parameters",
        _ => false,
    }
}

/// The first argument, when it is a string literal.
fn first_string(args: &FunctionArguments) -> Option<&str> {
    let FunctionArguments::List(list) = args else {
        return None;
    };
    match list.args.first()? {
        FunctionArg::Unnamed(FunctionArgExpr::Expr(Ast::Value(v))) => match &v.value {
            AstValue::SingleQuotedString(s) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

/// The text of the call starting at `start`: to its closing parenthesis.
fn call_text(sql: &str, start: Location) -> Option<&str> {
    let from = offset_of(sql, start)?;
    let rest = sql.get(from..)?;
    let mut depth = 0usize;
    let mut quoted = false;
    for (i, c) in rest.char_indices() {
        match c {
            '\'' => quoted = !quoted,
            '(' if !quoted => depth += 1,
            ')' if !quoted => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return rest.get(..=i);
                }
            }
            _ => {}
        }
    }
    None
}
