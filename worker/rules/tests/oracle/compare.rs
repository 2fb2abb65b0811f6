//! Both sides of the differential test in one normalized form, and their differences.
//!
//! A result is `{compiles, warnings, rows: [{puts, error}], requests: [{buckets, errors}]}`:
//! a put is `bucket object_type object_id data`, a request bucket `bucket p<priority>
//! <reasons>`, a warning `<kind> <excerpt>` (see [`OFFICIAL_WARNINGS`]), all sorted (their
//! order carries no meaning).

use rules::{
    BucketReason, BucketVersion, InMemoryLookups, OwnedSourceRow, PgType, RequestContext,
    RulesWarning, Subscription, SyncRules, WarningKind,
};
use serde_json::{json, Value};

use super::Case;

/// The official warnings this crate reports, by the start of their message: the kind it
/// gives them, and whether their position is compared. A position is the text the warning
/// points at (`RulesWarning::excerpt` here; the official error's location within its query,
/// or within the YAML for a key): an identifier, a call, a column, a whole query, a CTE's
/// name. The alpha-streams and storage-version warnings point at YAML values (the whole
/// `streams` section, the version) and are compared by kind alone. A message not listed
/// here is compared as itself, so a warning this crate does not report fails the case.
const OFFICIAL_WARNINGS: &[(&str, WarningKind, bool)] = &[
    (
        "Potentially dangerous query based on parameters set by the client",
        WarningKind::ClientParameterQuery,
        true,
    ),
    (
        "Clients can send any value for this unauthenticated parameter",
        WarningKind::UnauthenticatedParameter,
        true,
    ),
    (
        "Unquoted identifiers are converted to lower-case",
        WarningKind::IdentifierCase,
        true,
    ),
    (
        "This is using an alpha version of Sync Streams",
        WarningKind::AlphaStreams,
        false,
    ),
    (
        "Clients subscribe to this stream by default, but it uses subscription parameters",
        WarningKind::DefaultSubscriptionParameters,
        true,
    ),
    (
        "The name of this column is unspecified",
        WarningKind::UnnamedColumn,
        true,
    ),
    (
        "A '*' column after aliased columns may give unexpected results",
        WarningKind::StarAfterAlias,
        true,
    ),
    (
        "This common table expression isn't referenced",
        WarningKind::UnusedCte,
        true,
    ),
    (
        "Storage version",
        WarningKind::UnstableStorageVersion,
        false,
    ),
];

/// A warning in the compared form: `<code> <excerpt>`, or `<code>` alone.
fn warning_key(kind: WarningKind, excerpt: &str) -> String {
    let positioned = OFFICIAL_WARNINGS
        .iter()
        .any(|(_, k, positioned)| *k == kind && *positioned);
    if positioned {
        format!("{} {}", kind.code(), excerpt.trim())
    } else {
        kind.code().to_string()
    }
}

fn our_warnings(warnings: &[RulesWarning]) -> Vec<String> {
    let mut out: Vec<String> = warnings
        .iter()
        .map(|w| warning_key(w.kind, &w.excerpt))
        .collect();
    out.sort();
    out
}

fn official_warnings(theirs: &Value) -> Vec<String> {
    let mut out: Vec<String> = theirs["warnings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let message = w["message"].as_str().unwrap_or_default();
            let excerpt = w["excerpt"].as_str().unwrap_or_default();
            match OFFICIAL_WARNINGS
                .iter()
                .find(|(m, ..)| message.starts_with(m))
            {
                Some((_, kind, _)) => warning_key(*kind, excerpt),
                None => format!("unknown: {message} at `{excerpt}`"),
            }
        })
        .collect();
    out.sort();
    out
}

/// This crate's result for a case.
pub fn evaluate(case: &Case) -> Value {
    let rules = match SyncRules::parse_with_version(&case.yaml, BucketVersion::Unversioned) {
        Ok(r) => r,
        Err(e) => return json!({"compiles": false, "error": e.to_string()}),
    };
    let mut lookups = InMemoryLookups::new();
    let mut rows = Vec::new();
    for r in &case.rows {
        let mut row = OwnedSourceRow::new("public", &r.table);
        for (name, ty, text) in &r.columns {
            let pg = PgType::from_name(ty).unwrap_or_else(|| panic!("unknown type {ty}"));
            row = row.column(name, pg, text.as_deref());
        }
        let columns = row.source_columns();
        let Some(plan) = rules.plan_for("public", &r.table) else {
            rows.push(json!({"puts": [], "error": false}));
            continue;
        };
        match plan.evaluate(&row.view(&columns)) {
            Ok(ev) => {
                let mut puts: Vec<String> = ev
                    .buckets
                    .iter()
                    .map(|b| format!("{} {} {} {}", b.bucket, b.object_type, b.object_id, b.data))
                    .collect();
                puts.sort();
                lookups.insert(ev.lookups);
                rows.push(json!({"puts": puts, "error": false}));
            }
            Err(e) => rows.push(json!({"puts": [], "error": true, "message": e.to_string()})),
        }
    }
    let requests: Vec<Value> = case
        .requests
        .iter()
        .map(|q| {
            let defined = |stream: &str| rules.sources().iter().any(|s| s.name == stream);
            let mut ctx = RequestContext::from_claims(q.claims.clone());
            ctx.parameters = q.parameters.clone();
            ctx.include_defaults = q.include_defaults;
            ctx.subscriptions = q
                .subscriptions
                .iter()
                .map(|(stream, parameters, priority)| Subscription {
                    stream: stream.clone(),
                    parameters: parameters.clone(),
                    override_priority: *priority,
                })
                .collect();
            match rules.resolve_request(&ctx, &lookups) {
                Ok(res) => {
                    let mut buckets: Vec<String> = res
                        .buckets
                        .iter()
                        .map(|b| {
                            let mut reasons: Vec<String> = b
                                .reasons
                                .iter()
                                .map(|r| match r {
                                    BucketReason::Default(_) => "default".to_string(),
                                    BucketReason::Subscription(j) => format!("sub:{j}"),
                                })
                                .collect();
                            reasons.sort();
                            reasons.dedup();
                            format!("{} p{} {}", b.name, b.priority, reasons.join(","))
                        })
                        .collect();
                    buckets.sort();
                    // A subscription to a stream the config does not define: the official
                    // querier passes over it in silence, this crate reports it to the client
                    // (deliberately: the client learns why it gets nothing).
                    let mut errors: Vec<usize> = res
                        .errors
                        .iter()
                        .map(|e| e.subscription)
                        .filter(|&j| defined(&q.subscriptions[j].0))
                        .collect();
                    errors.sort();
                    json!({"buckets": buckets, "errors": errors})
                }
                Err(e) => json!({"thrown": e.to_string()}),
            }
        })
        .collect();
    json!({"compiles": true, "warnings": our_warnings(rules.warnings()), "rows": rows, "requests": requests})
}

/// The official result in the same form.
fn normalize(theirs: &Value) -> Value {
    if let Some(t) = theirs.get("thrown") {
        return json!({"compiles": false, "error": t});
    }
    let fatal = theirs["fatal"].as_array().cloned().unwrap_or_default();
    if !fatal.is_empty() {
        return json!({"compiles": false, "error": fatal});
    }
    let rows: Vec<Value> = theirs["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let mut puts: Vec<String> = r["puts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let s = |k: &str| p[k].as_str().unwrap_or_default().to_string();
                    format!("{} {} {} {}", s("bucket"), s("table"), s("id"), s("data"))
                })
                .collect();
            // Two data queries of one bucket may both put a row there: the service's storage
            // keeps one op per (bucket, table, id), as this crate evaluates it.
            puts.sort();
            puts.dedup();
            let error =
                r.get("thrown").is_some() || r["errors"].as_array().is_some_and(|e| !e.is_empty());
            json!({"puts": puts, "error": error})
        })
        .collect();
    let requests: Vec<Value> = theirs["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|q| {
            if let Some(t) = q.get("thrown") {
                return json!({"thrown": t});
            }
            // The service merges a bucket the querier lists twice (`mergeBuckets`): its
            // reasons join and the highest priority (lowest number) wins.
            let mut merged = std::collections::BTreeMap::<String, (f64, Vec<String>)>::new();
            for b in q["buckets"].as_array().into_iter().flatten() {
                let entry = merged
                    .entry(b["bucket"].as_str().unwrap_or_default().to_string())
                    .or_insert((f64::MAX, Vec::new()));
                entry.0 = entry.0.min(b["priority"].as_f64().unwrap_or(-1.0));
                let reasons = b["reasons"].as_array().into_iter().flatten();
                entry
                    .1
                    .extend(reasons.filter_map(|r| r.as_str().map(str::to_string)));
            }
            let buckets: Vec<String> = merged
                .into_iter()
                .map(|(name, (priority, mut reasons))| {
                    reasons.sort();
                    reasons.dedup();
                    format!("{name} p{priority} {}", reasons.join(","))
                })
                .collect();
            let mut errors: Vec<u64> = q["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["subscription"].as_u64())
                .collect();
            errors.sort();
            errors.dedup();
            json!({"buckets": buckets, "errors": errors})
        })
        .collect();
    json!({"compiles": true, "warnings": official_warnings(theirs), "rows": rows, "requests": requests})
}

/// The parts where the results differ: `(part, ours vs theirs)`; empty when they agree.
pub fn differences(ours: &Value, theirs: &Value) -> Vec<(String, String)> {
    let theirs = normalize(theirs);
    if ours["compiles"] != theirs["compiles"] {
        return vec![(
            "compile".to_string(),
            format!(
                "here: {}; official: {}",
                ours.get("error").unwrap_or(&json!("compiles")),
                theirs.get("error").unwrap_or(&json!("compiles"))
            ),
        )];
    }
    let mut found = Vec::new();
    for part in ["rows", "requests"] {
        let (a, b) = (&ours[part], &theirs[part]);
        let (a, b) = (
            a.as_array().cloned().unwrap_or_default(),
            b.as_array().cloned().unwrap_or_default(),
        );
        for i in 0..a.len().max(b.len()) {
            let (x, y) = (
                a.get(i).unwrap_or(&Value::Null),
                b.get(i).unwrap_or(&Value::Null),
            );
            let x_cmp = json!({"puts": x.get("puts"), "error": x.get("error"), "buckets": x.get("buckets"), "errors": x.get("errors"), "thrown": x.get("thrown").is_some()});
            let y_cmp = json!({"puts": y.get("puts"), "error": y.get("error"), "buckets": y.get("buckets"), "errors": y.get("errors"), "thrown": y.get("thrown").is_some()});
            if x_cmp != y_cmp {
                let label = if part == "rows" { "row" } else { "request" };
                found.push((format!("{label} {i}"), format!("here: {x}\nofficial: {y}")));
            }
        }
    }
    if ours["warnings"] != theirs["warnings"] {
        found.push((
            "warnings".to_string(),
            format!(
                "here: {}\nofficial: {}",
                ours["warnings"], theirs["warnings"]
            ),
        ));
    }
    found
}

/// The failure text of a disagreeing case: the case itself and where it differs.
pub fn report(case: &Case, found: &[(String, String)]) -> String {
    let mut out = format!("case `{}`\n--- yaml\n{}\n", case.name, case.yaml.trim_end());
    for (i, r) in case.rows.iter().enumerate() {
        out.push_str(&format!("--- row {i}: {} {:?}\n", r.table, r.columns));
    }
    for (i, q) in case.requests.iter().enumerate() {
        out.push_str(&format!(
            "--- request {i}: claims {} parameters {} defaults {} subscriptions {:?}\n",
            q.claims, q.parameters, q.include_defaults, q.subscriptions
        ));
    }
    for (part, detail) in found {
        out.push_str(&format!("*** differs in {part}:\n{detail}\n"));
    }
    out
}
