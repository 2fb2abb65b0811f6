//! `powersync-mdbx rules check|eval`.

use std::io::Write;

use serde_json::{json, Value as Json};

use super::CliError;
use rules::{
    BucketReason, BucketVersion, InMemoryLookups, OwnedSourceRow, OwnedValue, PgType,
    RequestContext, SourceKind, Subscription, SyncRules, Value,
};

pub(super) fn run(
    args: &[String],
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    match args.first().map(String::as_str) {
        Some("check") => match args {
            [_, file] => check(file, out, err),
            _ => Err(CliError::Usage(
                "`rules check` takes exactly one FILE".into(),
            )),
        },
        Some("eval") => eval(&args[1..], out),
        _ => Err(CliError::Usage(
            "expected `rules check` or `rules eval`".into(),
        )),
    }
}

fn load(file: &str, version: BucketVersion) -> Result<SyncRules, CliError> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| CliError::Failed(format!("cannot read {file}: {e}")))?;
    SyncRules::parse_with_version(&text, version)
        .map_err(|e| CliError::Failed(format!("{file}: {e}")))
}

fn io(e: std::io::Error) -> CliError {
    CliError::Failed(format!("cannot write output: {e}"))
}

/// The summary on `out`; the official compiler's warnings on `err`, one a line, like
/// errors (they do not fail the check).
fn check(file: &str, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), CliError> {
    let rules = load(file, BucketVersion::default())?;
    let defs = rules
        .sources()
        .iter()
        .filter(|s| s.kind == SourceKind::Definition)
        .count();
    let streams = rules.sources().len() - defs;
    writeln!(
        out,
        "ok: edition {}, {defs} bucket definition(s), {streams} stream(s), sha256 {}",
        rules.compatibility().edition,
        rules.content_hash_hex()
    )
    .map_err(io)?;
    for (t, u) in rules.tables() {
        let how = match (u.data, u.parameters) {
            (true, true) => "data, parameters",
            (true, false) => "data",
            _ => "parameters",
        };
        writeln!(out, "table {t}: {how}").map_err(io)?;
    }
    for event in rules.event_definitions() {
        let tables: Vec<String> = event.tables.iter().map(ToString::to_string).collect();
        writeln!(
            out,
            "event {}: {} (checked; events have no effect here)",
            event.name,
            tables.join(", ")
        )
        .map_err(io)?;
    }
    for w in rules.warnings() {
        writeln!(err, "warning: {file}: {w}").map_err(io)?;
    }
    Ok(())
}

struct EvalArgs {
    file: String,
    table: Option<String>,
    row: Option<String>,
    claims: Option<String>,
    params: Option<String>,
    subscribe: Vec<String>,
    defaults: bool,
    generation: u64,
}

fn parse_args(args: &[String]) -> Result<EvalArgs, CliError> {
    let mut it = args.iter();
    let file = it
        .next()
        .ok_or_else(|| CliError::Usage("`rules eval` needs FILE".into()))?
        .clone();
    let mut a = EvalArgs {
        file,
        table: None,
        row: None,
        claims: None,
        params: None,
        subscribe: Vec::new(),
        defaults: true,
        generation: 1,
    };
    while let Some(flag) = it.next() {
        if flag == "--no-defaults" {
            a.defaults = false;
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| CliError::Usage(format!("`{flag}` needs a value")))?
            .clone();
        match flag.as_str() {
            "--table" => a.table = Some(value),
            "--row" => a.row = Some(value),
            "--claims" => a.claims = Some(value),
            "--params" => a.params = Some(value),
            "--subscribe" => a.subscribe.push(value),
            "--generation" => {
                a.generation = value.parse().map_err(|_| {
                    CliError::Usage(format!("--generation must be a number, got `{value}`"))
                })?
            }
            other => return Err(CliError::Usage(format!("unknown option `{other}`"))),
        }
    }
    Ok(a)
}

fn json_arg(name: &str, text: &str) -> Result<Json, CliError> {
    serde_json::from_str(text)
        .map_err(|e| CliError::Failed(format!("{name} is not valid JSON: {e}")))
}

/// Build a row from the documented `--row` format.
pub(crate) fn row_from_json(
    schema: &str,
    table: &str,
    row: &Json,
) -> Result<OwnedSourceRow, CliError> {
    let obj = row
        .as_object()
        .ok_or_else(|| CliError::Failed("--row must be a JSON object of columns".into()))?;
    let mut r = OwnedSourceRow::new(schema, table);
    for (name, col) in obj {
        let bad = |m: &str| CliError::Failed(format!("--row column `{name}`: {m}"));
        let ty = if let Some(t) = col.get("type").and_then(Json::as_str) {
            PgType::from_name(t).ok_or_else(|| bad(&format!("unknown type `{t}` (use a name such as int8, text, timestamptz, int4[] or give \"oid\")")))?
        } else if let Some(oid) = col.get("oid").and_then(Json::as_u64) {
            PgType::from_oid(u32::try_from(oid).map_err(|_| bad("oid out of range"))?)
        } else {
            return Err(bad("needs \"type\" (or \"oid\")"));
        };
        let value = match col.get("value") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.as_str()),
            Some(_) => {
                return Err(bad(
                    "\"value\" must be the PostgreSQL text representation (a string) or null",
                ))
            }
        };
        r = r.column(name, ty, value);
    }
    Ok(r)
}

fn value_json(v: &OwnedValue) -> Json {
    match v {
        Value::Null => Json::Null,
        Value::Integer(i) => json!(i),
        Value::Real(f) => json!(f),
        Value::Text(t) => json!(t),
        Value::Blob(b) => {
            json!({ "blob_hex": b.iter().map(|x| format!("{x:02x}")).collect::<String>() })
        }
    }
}

fn eval(args: &[String], out: &mut dyn Write) -> Result<(), CliError> {
    let a = parse_args(args)?;
    let rules = load(&a.file, BucketVersion::Versioned(a.generation))?;
    let mut lookups = InMemoryLookups::new();
    if let (Some(table), Some(row)) = (&a.table, &a.row) {
        let (schema, name) = table.split_once('.').unwrap_or(("public", table));
        let owned = row_from_json(schema, name, &json_arg("--row", row)?)?;
        let plan = rules.plan_for(schema, name).ok_or_else(|| {
            CliError::Failed(format!("the rules do not read table {schema}.{name}"))
        })?;
        let cols = owned.source_columns();
        let result = plan
            .evaluate(&owned.view(&cols))
            .map_err(|e| CliError::Failed(e.to_string()))?;
        for b in &result.buckets {
            let line = json!({"op": "PUT", "bucket": b.bucket, "object_type": &*b.object_type,
                "object_id": b.object_id, "data": b.data, "checksum": b.checksum});
            writeln!(out, "{line}").map_err(io)?;
        }
        for l in &result.lookups {
            let key: Json = serde_json::from_str(&l.key.encode()).unwrap_or(Json::Null);
            let outputs: Vec<Json> = l.outputs.iter().map(value_json).collect();
            writeln!(out, "{}", json!({"lookup": key, "outputs": outputs})).map_err(io)?;
        }
        lookups.insert(result.lookups);
    } else if a.table.is_some() || a.row.is_some() {
        return Err(CliError::Usage("--table and --row go together".into()));
    }
    if let Some(claims) = &a.claims {
        let mut req = RequestContext::from_claims(json_arg("--claims", claims)?);
        if let Some(p) = &a.params {
            req.parameters = json_arg("--params", p)?;
        }
        req.include_defaults = a.defaults;
        for s in &a.subscribe {
            let (stream, params) = match s.split_once('=') {
                Some((n, p)) => (n.to_string(), json_arg("--subscribe", p)?),
                None => (s.clone(), json!({})),
            };
            req.subscriptions.push(Subscription {
                stream,
                parameters: params,
                override_priority: None,
            });
        }
        let res = rules
            .resolve_request(&req, &lookups)
            .map_err(|e| CliError::Failed(e.to_string()))?;
        for b in &res.buckets {
            let reasons: Vec<Json> = b
                .reasons
                .iter()
                .map(|r| match r {
                    BucketReason::Default(i) => json!({"default": i}),
                    BucketReason::Subscription(i) => json!({"sub": i}),
                })
                .collect();
            let line = json!({"request_bucket": {"bucket": b.name, "priority": b.priority, "subscriptions": reasons}});
            writeln!(out, "{line}").map_err(io)?;
        }
        for e in &res.errors {
            writeln!(
                out,
                "{}",
                json!({"subscription_error": {"sub": e.subscription, "message": e.message}})
            )
            .map_err(io)?;
        }
    }
    Ok(())
}
