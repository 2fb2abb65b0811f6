//! Lowering sqlparser expressions into compiled [`Expr`] trees.
//!
//! A [`Scope`] says which qualifiers name the source table, which name bucket parameters or
//! CTEs (only allowed directly in `=`/`IN`, see [`super::filter`]), and which request
//! functions the query kind may use. Anything outside the subset is an error with a position.

use sqlparser::ast::{
    BinaryOperator, CastKind, DataType, Expr as Ast, FunctionArg, FunctionArgExpr,
    FunctionArguments, InTarget, ObjectNamePart, Spanned, UnaryOperator, Value as AstValue,
};
use sqlparser::tokenizer::Span;

use super::scope::{RequestStyle, Scope};
use super::{ident_name, QueryCtx};
use crate::cast::CastType;
use crate::error::RulesError;
use crate::expr::{BinOp, Expr, RequestRef};
use crate::functions;
use crate::value::Value;

/// One operand of a condition, classified by where its values come from.
#[derive(Debug, Clone)]
pub enum Side {
    /// Reads only the source row.
    Row(Expr),
    /// Reads only the request.
    Request(Expr),
    /// A constant.
    Static(Expr),
    /// `bucket.p` or `cte_alias.col`.
    Ref {
        /// The qualifier (`bucket` or the CTE alias).
        qualifier: String,
        /// The parameter or column name.
        name: String,
        /// Where it was written.
        span: Span,
    },
}

/// Lower an operand, keeping a bare parameter reference as [`Side::Ref`].
pub fn lower_side(ctx: &QueryCtx<'_>, scope: &mut Scope, ast: &Ast) -> Result<Side, RulesError> {
    let inner = strip_nested(ast);
    if let Ast::CompoundIdentifier(parts) = inner {
        if let [q, n] = parts.as_slice() {
            let q = ident_name(q);
            if scope.ref_qualifiers.contains(&q) {
                return Ok(Side::Ref {
                    qualifier: q,
                    name: ident_name(n),
                    span: inner.span(),
                });
            }
        }
    }
    let e = lower(ctx, scope, ast)?;
    let (row, req) = (e.uses_row(), e.uses_request());
    Ok(match (row, req) {
        (true, true) => {
            return Err(ctx.err(
                ast.span(),
                "this expression mixes source-row columns and request values",
                "compare a row expression with a request expression using `=` or `IN`",
            ))
        }
        (true, false) => Side::Row(e),
        (false, true) => Side::Request(e),
        (false, false) => Side::Static(e),
    })
}

fn strip_nested(mut ast: &Ast) -> &Ast {
    while let Ast::Nested(inner) = ast {
        ast = inner;
    }
    ast
}

/// Undo the precedence of our `IN` → `<@` rewrite: `(x <@ a) -> 'k'` becomes
/// `x <@ (a -> 'k')`, because `IN` binds looser than the JSON operators.
pub fn fix_in_precedence(ast: &Ast) -> Ast {
    match ast {
        Ast::BinaryOp { left, op, right } => {
            let left = fix_in_precedence(left);
            let right = fix_in_precedence(right);
            if matches!(op, BinaryOperator::Arrow | BinaryOperator::LongArrow) {
                if let Ast::BinaryOp {
                    left: l2,
                    op: BinaryOperator::ArrowAt,
                    right: r2,
                } = left
                {
                    return Ast::BinaryOp {
                        left: l2,
                        op: BinaryOperator::ArrowAt,
                        right: Box::new(Ast::BinaryOp {
                            left: r2,
                            op: op.clone(),
                            right: Box::new(right),
                        }),
                    };
                }
            }
            Ast::BinaryOp {
                left: Box::new(left),
                op: op.clone(),
                right: Box::new(right),
            }
        }
        Ast::Nested(inner) => Ast::Nested(Box::new(fix_in_precedence(inner))),
        Ast::UnaryOp { op, expr } => Ast::UnaryOp {
            op: *op,
            expr: Box::new(fix_in_precedence(expr)),
        },
        other => other.clone(),
    }
}

fn unsupported(ctx: &QueryCtx<'_>, ast: &Ast, what: &str, hint: &str) -> RulesError {
    // Unsupported nodes were not depth-checked; never walk a deep one.
    if super::parse::too_deep(ast, 0) {
        return ctx.err_at(
            1,
            1,
            format!("{what} is not supported (deeply nested)"),
            hint,
        );
    }
    ctx.err(
        ast.span(),
        format!("{what} is not supported: `{ast}`"),
        hint,
    )
}

const EXPR_HINT: &str =
    "columns, literals, = != < <= > >=, + - * /, ||, AND/OR/NOT, IS [NOT] NULL, \
IN, ->, ->>, CAST and the documented functions";

/// Lower an expression; parameter references are errors here.
pub fn lower(ctx: &QueryCtx<'_>, scope: &mut Scope, ast: &Ast) -> Result<Expr, RulesError> {
    Ok(match ast {
        Ast::Nested(inner) => lower(ctx, scope, inner)?,
        Ast::Identifier(id) => {
            if !scope.has_table {
                return Err(ctx.err(
                    ast.span(),
                    format!("column `{}` is used but the query has no FROM table", id.value),
                    "request values such as request.user_id(), token_parameters.<name> or \
                     auth.user_id(); or add FROM <table>",
                ));
            }
            Expr::Column(scope.slot(&ident_name(id)))
        }
        Ast::CompoundIdentifier(parts) => lower_compound(ctx, scope, ast, parts)?,
        Ast::Value(v) => Expr::Literal(literal(ctx, ast, &v.value)?),
        Ast::BinaryOp { left, op, right } => lower_binary(ctx, scope, ast, left, op, right)?,
        Ast::UnaryOp { op, expr } => lower_unary(ctx, scope, ast, op, expr)?,
        Ast::IsNull(x) => Expr::IsNull(Box::new(lower(ctx, scope, x)?), false),
        Ast::IsNotNull(x) => Expr::IsNull(Box::new(lower(ctx, scope, x)?), true),
        Ast::In {
            expr,
            target: InTarget::List(list),
            negated,
            ..
        } => {
            let mut items = Vec::with_capacity(list.len());
            for item in list {
                items.push(lower(ctx, scope, item)?);
            }
            Expr::InList(Box::new(lower(ctx, scope, expr)?), items, *negated)
        }
        Ast::In { .. } => {
            return Err(unsupported(
                ctx,
                ast,
                "a subquery here",
                "in streams, `<row column> IN (SELECT ...)` directly in the WHERE clause (AND-ed); \
                 in bucket definitions use a parameter query",
            ))
        }
        Ast::Cast {
            kind,
            expr,
            data_type,
            format,
            ..
        } => {
            if format.is_some() || !matches!(kind, CastKind::Cast | CastKind::DoubleColon) {
                return Err(unsupported(ctx, ast, "this cast form", "CAST(x AS text|numeric|integer|real|blob)"));
            }
            let t = cast_type(data_type).ok_or_else(|| {
                ctx.err(
                    ast.span(),
                    format!("CAST to `{data_type}` is not supported"),
                    "CAST(x AS text|numeric|integer|real|blob)",
                )
            })?;
            Expr::Cast(Box::new(lower(ctx, scope, expr)?), t)
        }
        Ast::Substring {
            expr,
            substring_from,
            substring_for,
            ..
        } => {
            let mut args = vec![lower(ctx, scope, expr)?];
            match substring_from {
                Some(f) => args.push(lower(ctx, scope, f)?),
                None => args.push(Expr::Literal(Value::Integer(1))),
            }
            if let Some(f) = substring_for {
                args.push(lower(ctx, scope, f)?);
            }
            Expr::Func(functions::Func::Substring, args)
        }
        Ast::Function(f) => lower_function(ctx, scope, ast, f)?,
        Ast::Like { .. } | Ast::ILike { .. } | Ast::SimilarTo { .. } | Ast::RLike { .. } => {
            return Err(unsupported(
                ctx,
                ast,
                "LIKE / ILIKE / SIMILAR TO",
                "=, !=, <, >, IN, or functions such as substring()/lower()",
            ))
        }
        Ast::Between {
            expr,
            negated,
            low,
            high,
        } if ctx.compat.edition >= 3 => {
            let between = lower_between(ctx, scope, expr, low, high)?;
            match negated {
                true => Expr::Not(Box::new(between)),
                false => between,
            }
        }
        Ast::Between { .. } => {
            return Err(unsupported(ctx, ast, "BETWEEN", "`x >= a AND x <= b`"))
        }
        Ast::Case {
            operand,
            conditions,
            else_result,
            ..
        } if ctx.compat.edition >= 3 => {
            lower_case(ctx, scope, operand.as_deref(), conditions, else_result.as_deref())?
        }
        Ast::Case { .. } => return Err(unsupported(ctx, ast, "CASE", "iif(cond, a, b) or ifnull(a, b)")),
        Ast::Subquery(_) | Ast::Exists { .. } => {
            return Err(unsupported(
                ctx,
                ast,
                "a subquery here",
                "in streams, `<row column> IN (SELECT ...)` in the WHERE clause; otherwise a parameter query",
            ))
        }
        other => return Err(unsupported(ctx, other, "this expression", EXPR_HINT)),
    })
}

/// `x BETWEEN low AND high` as the edition-3 evaluator has it (`Func::Between`).
fn lower_between(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    x: &Ast,
    low: &Ast,
    high: &Ast,
) -> Result<Expr, RulesError> {
    let args = [x, low, high]
        .into_iter()
        .map(|a| lower(ctx, scope, a))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Expr::Func(functions::Func::Between, args))
}

/// `CASE [operand] WHEN … THEN … [ELSE …] END` as the edition-3 evaluator has it: the
/// result of the first `WHEN` that is true (equal to the operand: `Func::CaseOf`), else the
/// `ELSE` or NULL. Each part appears once in what it becomes.
fn lower_case(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    operand: Option<&Ast>,
    conditions: &[sqlparser::ast::CaseWhen],
    otherwise: Option<&Ast>,
) -> Result<Expr, RulesError> {
    let operand = operand.map(|o| lower(ctx, scope, o)).transpose()?;
    let mut arms = Vec::with_capacity(conditions.len());
    for arm in conditions {
        arms.push((
            lower(ctx, scope, &arm.condition)?,
            lower(ctx, scope, &arm.result)?,
        ));
    }
    let otherwise = match otherwise {
        Some(e) => lower(ctx, scope, e)?,
        None => Expr::Literal(Value::Null),
    };
    if let Some(operand) = operand {
        let mut args = vec![operand, otherwise];
        for (when, then) in arms {
            args.extend([when, then]);
        }
        return Ok(Expr::Func(functions::Func::CaseOf, args));
    }
    let mut out = otherwise;
    for (when, then) in arms.into_iter().rev() {
        out = Expr::Func(functions::Func::Iif, vec![when, then, out]);
    }
    Ok(out)
}

/// A binary operator: comparisons, arithmetic, `||`, AND/OR, `->`/`->>` and `@>`.
fn lower_binary(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    ast: &Ast,
    left: &Ast,
    op: &BinaryOperator,
    right: &Ast,
) -> Result<Expr, RulesError> {
    let bop = match op {
        BinaryOperator::Eq => BinOp::Eq,
        BinaryOperator::NotEq => BinOp::Ne,
        BinaryOperator::Lt => BinOp::Lt,
        BinaryOperator::LtEq => BinOp::Le,
        BinaryOperator::Gt => BinOp::Gt,
        BinaryOperator::GtEq => BinOp::Ge,
        BinaryOperator::Plus => BinOp::Add,
        BinaryOperator::Minus => BinOp::Sub,
        BinaryOperator::Multiply => BinOp::Mul,
        BinaryOperator::Divide => BinOp::Div,
        BinaryOperator::StringConcat => BinOp::Concat,
        BinaryOperator::And => BinOp::And,
        BinaryOperator::Or => BinOp::Or,
        BinaryOperator::Arrow | BinaryOperator::LongArrow => {
            return Ok(Expr::JsonArrow {
                value: Box::new(lower(ctx, scope, left)?),
                path: Box::new(lower(ctx, scope, right)?),
                as_text: matches!(op, BinaryOperator::LongArrow),
                fixed: ctx.compat.fixed_json_extract,
            })
        }
        BinaryOperator::ArrowAt => {
            return Ok(Expr::InJson(
                Box::new(lower(ctx, scope, left)?),
                Box::new(lower(ctx, scope, right)?),
            ))
        }
        other => {
            return Err(ctx.err(
                ast.span(),
                format!("operator `{other}` is not supported"),
                EXPR_HINT,
            ))
        }
    };
    let binary = Expr::Binary(
        bop,
        Box::new(lower(ctx, scope, left)?),
        Box::new(lower(ctx, scope, right)?),
    );
    Ok(match binary {
        // The edition-3 evaluator reads `a != b` as `NOT (a = b)` (`NULL != NULL` is 1).
        Expr::Binary(BinOp::Ne, l, r) if ctx.compat.edition >= 3 => {
            Expr::Not(Box::new(Expr::Binary(BinOp::Eq, l, r)))
        }
        other => other,
    })
}

/// A unary operator: NOT, `+` and `-` (a negated literal stays a literal).
fn lower_unary(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    ast: &Ast,
    op: &UnaryOperator,
    expr: &Ast,
) -> Result<Expr, RulesError> {
    Ok(match op {
        UnaryOperator::Not => Expr::Not(Box::new(lower(ctx, scope, expr)?)),
        UnaryOperator::Plus => lower(ctx, scope, expr)?,
        UnaryOperator::Minus => match lower(ctx, scope, expr)? {
            Expr::Literal(Value::Integer(i)) if is_number(expr) => {
                Expr::Literal(Value::Integer(i.wrapping_neg()))
            }
            Expr::Literal(Value::Real(f)) if is_number(expr) => Expr::Literal(Value::Real(-f)),
            // The edition-3 compiler takes a minus only before a number.
            _ if ctx.compat.edition >= 3 => {
                return Err(ctx.err(
                    ast.span(),
                    "unary minus is only supported before a number at edition 3 (as in the \
                     official compiler)",
                    "`0 - x`",
                ))
            }
            Expr::Literal(Value::Integer(i)) => Expr::Literal(Value::Integer(i.wrapping_neg())),
            Expr::Literal(Value::Real(f)) => Expr::Literal(Value::Real(-f)),
            other => Expr::Neg(Box::new(other)),
        },
        other => {
            return Err(ctx.err(
                ast.span(),
                format!("unary operator `{other}` is not supported"),
                EXPR_HINT,
            ))
        }
    })
}

/// True for a number as written (not `(1)` or an expression).
fn is_number(ast: &Ast) -> bool {
    matches!(
        ast,
        Ast::Value(v) if matches!(v.value, sqlparser::ast::Value::Number(..))
    )
}

fn lower_compound(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    ast: &Ast,
    parts: &[sqlparser::ast::Ident],
) -> Result<Expr, RulesError> {
    let [q, n] = parts else {
        return Err(ctx.err(
            ast.span(),
            format!("`{ast}` names a schema in a column reference"),
            "`column` or `table.column`",
        ));
    };
    let (q, n) = (ident_name(q), ident_name(n));
    if scope.request == RequestStyle::Legacy {
        match q.as_str() {
            "token_parameters" => {
                return Ok(Expr::Request(if n == "user_id" {
                    RequestRef::UserId
                } else {
                    RequestRef::TokenParameter(n)
                }))
            }
            "user_parameters" => return Ok(Expr::Request(RequestRef::ClientParameter(n))),
            _ => {}
        }
    }
    if matches!(q.as_str(), "token_parameters" | "user_parameters") {
        return Err(ctx.err(
            ast.span(),
            format!("`{q}.{n}` is not available in this query"),
            match scope.request {
                RequestStyle::Forbidden => {
                    "data queries cannot read request values; move the condition into a parameter query and use bucket.<name>"
                }
                _ => "auth.parameter('<name>') / auth.user_id() / subscription.parameter('<name>') in streams",
            },
        ));
    }
    if scope.table_qualifiers.contains(&q) {
        return Ok(Expr::Column(scope.slot(&n)));
    }
    if scope.ref_qualifiers.contains(&q) {
        return Err(ctx.err(
            ast.span(),
            format!("`{q}.{n}` can only be compared directly (`<row expression> = {q}.{n}` or `IN`), not used inside a function or other operator"),
            "compare a row expression with the parameter: `WHERE table.col = bucket.param`",
        ));
    }
    Err(ctx.err(
        ast.span(),
        format!("unknown table or qualifier `{q}` in `{q}.{n}`"),
        "the FROM table's name or alias",
    ))
}

fn literal(ctx: &QueryCtx<'_>, ast: &Ast, v: &AstValue) -> Result<Value<'static>, RulesError> {
    Ok(match v {
        AstValue::Number(s, _) => match s.parse::<i64>() {
            Ok(i) => Value::Integer(i),
            Err(_) => Value::Real(s.parse::<f64>().map_err(|_| {
                ctx.err(
                    ast.span(),
                    format!("number `{s}` is out of range"),
                    "a 64-bit integer or a double",
                )
            })?),
        },
        AstValue::SingleQuotedString(s) | AstValue::EscapedStringLiteral(s) => {
            Value::text(s.clone())
        }
        AstValue::Boolean(b) => Value::Integer(i64::from(*b)),
        AstValue::Null => Value::Null,
        other => {
            return Err(ctx.err(
                ast.span(),
                format!("literal `{other}` is not supported"),
                "'text', numbers, TRUE, FALSE, NULL",
            ))
        }
    })
}

fn cast_type(t: &DataType) -> Option<CastType> {
    let name = t.to_string().to_lowercase();
    Some(match name.as_str() {
        "text" => CastType::Text,
        "numeric" => CastType::Numeric,
        "integer" | "int" => CastType::Integer,
        "real" => CastType::Real,
        "blob" => CastType::Blob,
        _ => return None,
    })
}

fn lower_function(
    ctx: &QueryCtx<'_>,
    scope: &mut Scope,
    ast: &Ast,
    f: &sqlparser::ast::Function,
) -> Result<Expr, RulesError> {
    let mut names = Vec::new();
    for p in &f.name.0 {
        match p {
            ObjectNamePart::Identifier(id) => names.push(ident_name(id)),
            ObjectNamePart::Function(_) => {
                return Err(unsupported(
                    ctx,
                    ast,
                    "this function name",
                    "a plain function name",
                ))
            }
        }
    }
    if f.filter.is_some()
        || f.over.is_some()
        || !f.within_group.is_empty()
        || f.null_treatment.is_some()
    {
        return Err(unsupported(
            ctx,
            ast,
            "aggregate or window syntax",
            "plain scalar function calls",
        ));
    }
    let args: Vec<&Ast> = match &f.args {
        FunctionArguments::None => Vec::new(),
        FunctionArguments::List(l) => {
            if l.duplicate_treatment.is_some() || !l.clauses.is_empty() {
                return Err(unsupported(
                    ctx,
                    ast,
                    "DISTINCT or clauses inside a call",
                    "plain arguments",
                ));
            }
            let mut out = Vec::new();
            for a in &l.args {
                match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => out.push(e),
                    _ => {
                        return Err(unsupported(
                            ctx,
                            ast,
                            "named or `*` arguments",
                            "plain positional arguments",
                        ))
                    }
                }
            }
            out
        }
        FunctionArguments::Subquery(_) => {
            return Err(unsupported(
                ctx,
                ast,
                "a subquery argument",
                "plain arguments",
            ))
        }
    };
    match names.as_slice() {
        [name] => {
            let (func, lo, hi) = match functions::lookup(name, ctx.compat.edition) {
                functions::Lookup::Known(func, lo, hi) => (func, lo, hi),
                functions::Lookup::UntilEdition(last) => {
                    return Err(ctx.err(
                        ast.span(),
                        format!(
                            "function `{name}` is not supported at edition {} (the official compiler knows it up to edition {last})",
                            ctx.compat.edition
                        ),
                        "another function of the edition (`substring` for `substr`), or `config: edition: 2`",
                    ))
                }
                functions::Lookup::Unknown => {
                    return Err(ctx.err(
                        ast.span(),
                        format!("function `{name}` is not supported"),
                        format!("one of: {}", functions::supported_list()),
                    ))
                }
            };
            if args.len() < lo || args.len() > hi {
                return Err(ctx.err(
                    ast.span(),
                    format!(
                        "function `{name}` takes {} argument(s), got {}",
                        arg_count(lo, hi),
                        args.len()
                    ),
                    format!("call {name} with {} argument(s)", arg_count(lo, hi)),
                ));
            }
            let mut lowered = Vec::with_capacity(args.len());
            for a in args {
                lowered.push(lower(ctx, scope, a)?);
            }
            Ok(Expr::Func(func, lowered))
        }
        [ns, name] => super::request_fn::request_function(ctx, scope.request, ast, ns, name, &args),
        _ => Err(unsupported(
            ctx,
            ast,
            "this function name",
            "a plain function name",
        )),
    }
}

fn arg_count(lo: usize, hi: usize) -> String {
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo} to {hi}")
    }
}
