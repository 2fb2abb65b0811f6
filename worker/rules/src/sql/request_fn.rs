//! Request functions: `request.*()` (bucket definitions) and `auth.*`, `subscription.*`,
//! `connection.*` (streams), each allowed only where the official service allows it.

use sqlparser::ast::{Expr as Ast, Spanned, Value as AstValue};

use super::scope::RequestStyle;
use super::QueryCtx;
use crate::error::RulesError;
use crate::expr::{Expr, RequestRef};
use crate::functions;

/// Lower `ns.name(args)` to a request reference, or explain where it is allowed.
pub(crate) fn request_function(
    ctx: &QueryCtx<'_>,
    style: RequestStyle,
    ast: &Ast,
    ns: &str,
    name: &str,
    args: &[&Ast],
) -> Result<Expr, RulesError> {
    let key_arg = |args: &[&Ast]| -> Result<String, RulesError> {
        match args {
            [Ast::Value(v)] => match &v.value {
                AstValue::SingleQuotedString(s) => Ok(s.clone()),
                _ => Err(ctx.err(
                    ast.span(),
                    format!("`{ns}.{name}` needs a string literal key"),
                    format!("{ns}.{name}('key')"),
                )),
            },
            _ => Err(ctx.err(
                ast.span(),
                format!("`{ns}.{name}` takes exactly one string literal"),
                format!("{ns}.{name}('key')"),
            )),
        }
    };
    let no_args = |args: &[&Ast]| -> Result<(), RulesError> {
        if args.is_empty() {
            Ok(())
        } else {
            Err(ctx.err(
                ast.span(),
                format!("`{ns}.{name}()` takes no arguments"),
                format!("{ns}.{name}()"),
            ))
        }
    };
    let r = match (style, ns, name) {
        (RequestStyle::Legacy, "request", "user_id") => {
            no_args(args)?;
            RequestRef::UserId
        }
        (RequestStyle::Legacy, "request", "jwt") => {
            no_args(args)?;
            RequestRef::Jwt
        }
        (RequestStyle::Legacy, "request", "parameters") => {
            no_args(args)?;
            RequestRef::ClientParameters
        }
        (RequestStyle::Streams, "auth", "user_id") => {
            no_args(args)?;
            RequestRef::UserId
        }
        (RequestStyle::Streams, "auth", "parameters") => {
            no_args(args)?;
            RequestRef::Jwt
        }
        (RequestStyle::Streams, "auth", "parameter") => RequestRef::Claim(key_arg(args)?),
        (RequestStyle::Streams, "subscription", "parameters") => {
            no_args(args)?;
            RequestRef::SubscriptionParameters
        }
        (RequestStyle::Streams, "subscription", "parameter") => {
            RequestRef::SubscriptionParameter(key_arg(args)?)
        }
        (RequestStyle::Streams, "connection", "parameters") => {
            no_args(args)?;
            RequestRef::ClientParameters
        }
        (RequestStyle::Streams, "connection", "parameter") => RequestRef::ClientParameter(key_arg(args)?),
        (RequestStyle::Forbidden, "request" | "auth" | "subscription" | "connection", _) => {
            return Err(ctx.err(
                ast.span(),
                format!("`{ns}.{name}()` is not available in a data query"),
                "move request-dependent conditions into a parameter query and filter with bucket.<name>",
            ))
        }
        (RequestStyle::Streams, "request", _) => {
            return Err(ctx.err(
                ast.span(),
                format!("`request.{name}()` is the bucket_definitions form"),
                "auth.user_id(), auth.parameter('k'), subscription.parameter('k'), connection.parameter('k')",
            ))
        }
        (RequestStyle::Legacy, "auth" | "subscription" | "connection", _) => {
            return Err(ctx.err(
                ast.span(),
                format!("`{ns}.{name}()` is only available in streams"),
                "request.user_id(), request.jwt() ->> 'k', request.parameters() ->> 'k', token_parameters.k",
            ))
        }
        _ => {
            return Err(ctx.err(
                ast.span(),
                format!("function `{ns}.{name}` is not supported"),
                format!("request.user_id()/jwt()/parameters() (bucket definitions), auth.*/subscription.*/connection.* (streams), or one of: {}", functions::supported_list()),
            ))
        }
    };
    Ok(Expr::Request(r))
}
