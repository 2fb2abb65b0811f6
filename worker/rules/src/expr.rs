//! Compiled expressions and their evaluator.
//!
//! SQL is lowered once into this small tree over typed values; evaluating a row walks it
//! without building any JSON tree. Semantics follow SQLite (what the official service
//! evaluates with): three-valued logic, numeric < text < blob ordering, integer math.

use std::borrow::Cow;
use std::cmp::Ordering;

use super::cast::{bool_value, cast, to_number, CastType};
use super::functions::{self, Func, FunctionArgs};
use super::json::{follow, json_to_value, parse_dollar_path, PathStep};
pub use super::value::compare;
use super::value::{OwnedValue, Value};

/// Binary operators of the supported subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `=`
    Eq,
    /// `!=`, `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `||`
    Concat,
    /// `AND`
    And,
    /// `OR`
    Or,
}

/// A value that comes from the sync request, not from a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestRef {
    /// `request.user_id()`, `auth.user_id()`, `token_parameters.user_id`: the JWT `sub`.
    UserId,
    /// `request.jwt()`, `auth.parameters()`: the JWT payload as JSON text.
    Jwt,
    /// `auth.parameter('k')`: a top-level JWT claim.
    Claim(String),
    /// `token_parameters.k`: a key of the JWT `parameters` claim.
    TokenParameter(String),
    /// `request.parameters()`, `connection.parameters()`: client parameters as JSON text.
    ClientParameters,
    /// `user_parameters.k`, `connection.parameter('k')`: one client parameter.
    ClientParameter(String),
    /// `subscription.parameters()`: the stream subscription's parameters as JSON text.
    SubscriptionParameters,
    /// `subscription.parameter('k')`: one subscription parameter.
    SubscriptionParameter(String),
}

/// A compiled expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A constant.
    Literal(OwnedValue),
    /// A source-row column, by slot in the plan's column list.
    Column(usize),
    /// A request value.
    Request(RequestRef),
    /// `NOT x`
    Not(Box<Expr>),
    /// `-x`
    Neg(Box<Expr>),
    /// A binary operator.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `x IS NULL` (`negated`: `IS NOT NULL`).
    IsNull(Box<Expr>, bool),
    /// `x [NOT] IN (a, b, ...)`.
    InList(Box<Expr>, Vec<Expr>, bool),
    /// `x IN <json array text>` (the PowerSync form without parentheses).
    InJson(Box<Expr>, Box<Expr>),
    /// `x -> path` (`as_text == false`) or `x ->> path`.
    JsonArrow {
        /// The JSON text operand.
        value: Box<Expr>,
        /// The key or index.
        path: Box<Expr>,
        /// `->>` returns a SQL value; `->` returns JSON text.
        as_text: bool,
        /// Edition ≥ 2: the key is literal unless it starts with `$.`.
        fixed: bool,
    },
    /// A scalar function call.
    Func(Func, Vec<Expr>),
    /// `CAST(x AS t)`.
    Cast(Box<Expr>, CastType),
}

/// Where an expression reads [`Expr::Request`] values: the sync request, prepared by
/// whoever evaluates on the request side. The evaluator knows nothing else of requests.
pub trait RequestValues {
    /// The value `r` refers to (NULL when the request lacks it).
    fn value(&self, r: &RequestRef) -> Value<'_>;
}

/// What an expression is evaluated against.
#[derive(Clone, Copy)]
pub struct Env<'e> {
    /// Converted source-row values by plan slot (empty on the request side).
    pub row: &'e [Value<'e>],
    /// The request's values, on the request side.
    pub request: Option<&'e dyn RequestValues>,
}

impl Expr {
    /// Evaluate against a row and/or a request.
    pub fn eval<'e>(&'e self, env: Env<'e>) -> Value<'e> {
        match self {
            Expr::Literal(v) => v.borrowed(),
            Expr::Column(i) => env.row.get(*i).map(|v| v.borrowed()).unwrap_or(Value::Null),
            Expr::Request(r) => match env.request {
                Some(req) => req.value(r),
                None => Value::Null,
            },
            // Two-valued like the official evaluator: NOT NULL is 1.
            Expr::Not(x) => bool_value(!x.eval(env).is_truthy()),
            Expr::Neg(x) => match x.eval(env) {
                Value::Integer(i) => i
                    .checked_neg()
                    .map(Value::Integer)
                    .unwrap_or(Value::Real(-(i as f64))),
                Value::Real(f) => Value::Real(-f),
                Value::Null => Value::Null,
                other => match to_number(&other) {
                    Value::Integer(i) => Value::Integer(i.wrapping_neg()),
                    Value::Real(f) => Value::Real(-f),
                    _ => Value::Null,
                },
            },
            Expr::Binary(op, a, b) => binary(*op, a, b, env),
            Expr::IsNull(x, negated) => bool_value(x.eval(env).is_null() != *negated),
            Expr::InList(x, list, negated) => {
                let v = x.eval(env);
                if v.is_null() {
                    return Value::Null;
                }
                let mut saw_null = false;
                for item in list {
                    let w = item.eval(env);
                    if w.is_null() {
                        saw_null = true;
                    } else if compare(&v, &w) == Some(Ordering::Equal) {
                        return bool_value(!*negated);
                    }
                }
                if saw_null {
                    Value::Null
                } else {
                    bool_value(*negated)
                }
            }
            Expr::InJson(x, arr) => {
                let v = x.eval(env);
                if v.is_null() {
                    return Value::Null;
                }
                let items = json_array_values(&arr.eval(env));
                match items {
                    None => Value::Null,
                    Some(items) => bool_value(
                        items
                            .iter()
                            .any(|w| compare(&v, w) == Some(Ordering::Equal)),
                    ),
                }
            }
            Expr::JsonArrow {
                value,
                path,
                as_text,
                fixed,
            } => json_arrow(&value.eval(env), &path.eval(env), *as_text, *fixed),
            Expr::Func(f, args) => functions::call(*f, &CallArgs { args, env }),
            Expr::Cast(x, t) => cast(x.eval(env), *t),
        }
    }

    /// Points column references at a source's column order: slot `i` reads column
    /// `columns[i]`, or NULL when the source lacks it ([`super::SlotBinding`]).
    pub(crate) fn bind_columns(&mut self, columns: &[Option<usize>]) {
        self.each_column(&mut |e| {
            if let Expr::Column(slot) = e {
                match columns.get(*slot).copied().flatten() {
                    Some(index) => *slot = index,
                    None => *e = Expr::Literal(Value::Null),
                }
            }
        });
    }

    /// Calls `f` on every [`Expr::Column`] inside this expression (it may replace it).
    pub(crate) fn each_column(&mut self, f: &mut dyn FnMut(&mut Expr)) {
        match self {
            Expr::Column(_) => f(self),
            Expr::Literal(_) | Expr::Request(_) => {}
            Expr::Not(x) | Expr::Neg(x) | Expr::IsNull(x, _) | Expr::Cast(x, _) => x.each_column(f),
            Expr::Binary(_, a, b) | Expr::InJson(a, b) => {
                a.each_column(f);
                b.each_column(f);
            }
            Expr::JsonArrow { value, path, .. } => {
                value.each_column(f);
                path.each_column(f);
            }
            Expr::InList(x, list, _) => {
                x.each_column(f);
                list.iter_mut().for_each(|e| e.each_column(f));
            }
            Expr::Func(_, args) => args.iter_mut().for_each(|e| e.each_column(f)),
        }
    }

    /// True when the expression reads a source-row column.
    pub fn uses_row(&self) -> bool {
        self.any(&|e| matches!(e, Expr::Column(_)))
    }

    /// True when the expression reads a request value.
    pub fn uses_request(&self) -> bool {
        self.any(&|e| matches!(e, Expr::Request(_)))
    }

    /// The request values the expression reads, in the order written (left to right).
    pub(crate) fn request_refs<'a>(&'a self, out: &mut Vec<&'a RequestRef>) {
        match self {
            Expr::Request(r) => out.push(r),
            Expr::Literal(_) | Expr::Column(_) => {}
            Expr::Not(x) | Expr::Neg(x) | Expr::IsNull(x, _) | Expr::Cast(x, _) => {
                x.request_refs(out)
            }
            Expr::Binary(_, a, b) | Expr::InJson(a, b) => {
                a.request_refs(out);
                b.request_refs(out);
            }
            Expr::JsonArrow { value, path, .. } => {
                value.request_refs(out);
                path.request_refs(out);
            }
            Expr::InList(x, l, _) => {
                x.request_refs(out);
                l.iter().for_each(|e| e.request_refs(out));
            }
            Expr::Func(_, args) => args.iter().for_each(|e| e.request_refs(out)),
        }
    }

    fn any(&self, p: &dyn Fn(&Expr) -> bool) -> bool {
        if p(self) {
            return true;
        }
        match self {
            Expr::Literal(_) | Expr::Column(_) | Expr::Request(_) => false,
            Expr::Not(x) | Expr::Neg(x) | Expr::IsNull(x, _) | Expr::Cast(x, _) => x.any(p),
            Expr::Binary(_, a, b) | Expr::InJson(a, b) => a.any(p) || b.any(p),
            Expr::JsonArrow { value, path, .. } => value.any(p) || path.any(p),
            Expr::InList(x, l, _) => x.any(p) || l.iter().any(|e| e.any(p)),
            Expr::Func(_, args) => args.iter().any(|e| e.any(p)),
        }
    }
}

fn binary<'e>(op: BinOp, a: &'e Expr, b: &'e Expr, env: Env<'e>) -> Value<'e> {
    match op {
        // Two-valued like the official evaluator (`sqliteBool(a) && sqliteBool(b)`).
        BinOp::And => bool_value(a.eval(env).is_truthy() && b.eval(env).is_truthy()),
        BinOp::Or => bool_value(a.eval(env).is_truthy() || b.eval(env).is_truthy()),
        _ => {
            let x = a.eval(env);
            let y = b.eval(env);
            if x.is_null() || y.is_null() {
                return Value::Null;
            }
            match op {
                BinOp::Eq => cmp_value(&x, &y, |o| o == Ordering::Equal),
                BinOp::Ne => cmp_value(&x, &y, |o| o != Ordering::Equal),
                BinOp::Lt => cmp_value(&x, &y, |o| o == Ordering::Less),
                BinOp::Le => cmp_value(&x, &y, |o| o != Ordering::Greater),
                BinOp::Gt => cmp_value(&x, &y, |o| o == Ordering::Greater),
                BinOp::Ge => cmp_value(&x, &y, |o| o != Ordering::Less),
                BinOp::Concat => {
                    let mut s = x.to_text().unwrap_or_default().into_owned();
                    s.push_str(&y.to_text().unwrap_or_default());
                    Value::Text(Cow::Owned(s))
                }
                _ => arithmetic(op, to_number(&x), to_number(&y)),
            }
        }
    }
}

fn cmp_value(x: &Value<'_>, y: &Value<'_>, f: impl Fn(Ordering) -> bool) -> Value<'static> {
    match compare(x, y) {
        Some(o) => bool_value(f(o)),
        None => Value::Null,
    }
}

/// The arguments of one function call, evaluated only when the function reads them.
struct CallArgs<'e> {
    args: &'e [Expr],
    env: Env<'e>,
}

impl<'e> FunctionArgs<'e> for CallArgs<'e> {
    fn count(&self) -> usize {
        self.args.len()
    }

    fn value(&self, i: usize) -> Value<'e> {
        self.args
            .get(i)
            .map(|a| a.eval(self.env))
            .unwrap_or(Value::Null)
    }
}

fn arithmetic(op: BinOp, x: Value<'static>, y: Value<'static>) -> Value<'static> {
    match (x, y) {
        (Value::Integer(a), Value::Integer(b)) => {
            let r = match op {
                BinOp::Add => a.checked_add(b),
                BinOp::Sub => a.checked_sub(b),
                BinOp::Mul => a.checked_mul(b),
                BinOp::Div => {
                    if b == 0 {
                        return Value::Null;
                    }
                    a.checked_div(b)
                }
                _ => None,
            };
            match r {
                Some(r) => Value::Integer(r),
                None => real_arith(op, a as f64, b as f64),
            }
        }
        (Value::Integer(a), Value::Real(b)) => real_arith(op, a as f64, b),
        (Value::Real(a), Value::Integer(b)) => real_arith(op, a, b as f64),
        (Value::Real(a), Value::Real(b)) => real_arith(op, a, b),
        _ => Value::Null,
    }
}

fn real_arith(op: BinOp, a: f64, b: f64) -> Value<'static> {
    Value::Real(match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => {
            if b == 0.0 {
                return Value::Null;
            }
            a / b
        }
        _ => return Value::Null,
    })
}

/// The elements of a JSON array text as SQL values; `None` when it is not an array.
pub fn json_array_values(v: &Value<'_>) -> Option<Vec<OwnedValue>> {
    let text = match v {
        Value::Text(t) => t.as_ref(),
        _ => return None,
    };
    match serde_json::from_str::<serde_json::Value>(text).ok()? {
        serde_json::Value::Array(items) => Some(items.iter().map(json_to_value).collect()),
        _ => None,
    }
}

fn json_arrow<'e>(v: &Value<'_>, path: &Value<'_>, as_text: bool, fixed: bool) -> Value<'e> {
    let text = match v {
        Value::Text(t) => t.as_ref(),
        _ => return Value::Null,
    };
    let steps: Vec<PathStep> = match path {
        Value::Integer(i) if *i >= 0 => vec![PathStep::Index(*i as usize)],
        Value::Text(k) => {
            if k.starts_with('$') && (fixed || k.starts_with("$.") || k.as_ref() == "$") {
                match parse_dollar_path(k) {
                    Some(s) => s,
                    None => return Value::Null,
                }
            } else if fixed {
                vec![PathStep::Key(k.to_string())]
            } else {
                k.split('.').map(|p| PathStep::Key(p.to_string())).collect()
            }
        }
        _ => return Value::Null,
    };
    let doc: serde_json::Value = match serde_json::from_str(text) {
        Ok(d) => d,
        Err(_) => return Value::Null,
    };
    match follow(&doc, &steps) {
        None => Value::Null,
        Some(found) if as_text => json_to_value(found),
        Some(found) => Value::Text(Cow::Owned(found.to_string())),
    }
}
