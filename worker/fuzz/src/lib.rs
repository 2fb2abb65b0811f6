//! What several fuzz targets share: exercising compiled sync rules the way the service
//! does (a row through every table's plan, a request through the resolvers).

use rules::{InMemoryLookups, OwnedSourceRow, PgType, RequestContext, SyncRules};
use serde_json::Value;

/// The benchmark fixture's sync streams (`e2e/fixture/sync-config.yaml`).
pub const FIXTURE_STREAMS: &str = include_str!("../../../e2e/fixture/sync-config.yaml");
/// The same data shape as bucket definitions (`e2e/fixture/sync-rules-legacy.yaml`).
pub const FIXTURE_LEGACY: &str = include_str!("../../../e2e/fixture/sync-rules-legacy.yaml");

/// A type by name, as the snapshot reads it from `pg_type`.
pub fn ty(name: &str) -> PgType {
    let oid = match name {
        "bool" => 16,
        "bytea" => 17,
        "int8" => 20,
        "int2" => 21,
        "int4" => 23,
        "text" => 25,
        "json" => 114,
        "float4" => 700,
        "float8" => 701,
        "varchar" => 1043,
        "date" => 1082,
        "time" => 1083,
        "timestamp" => 1114,
        "timestamptz" => 1184,
        "numeric" => 1700,
        "uuid" => 2950,
        "jsonb" => 3802,
        "int4[]" => 1007,
        "text[]" => 1009,
        _ => 25,
    };
    PgType {
        oid,
        element: PgType::from_oid(oid).element,
    }
}

/// Every table's plan on a row of typical columns, then a request with `claims` and
/// `parameters`. Checks what the store and the protocol rely on: data is a JSON object.
pub fn exercise_rules(rules: &SyncRules, claims: Value) {
    for (table, _) in rules.tables() {
        let row = OwnedSourceRow::new(&table.schema, &table.name)
            .column("id", ty("text"), Some("x"))
            .column("a", ty("int8"), Some("1"))
            .column("b", ty("jsonb"), Some(r#"{"k": [1, "2"]}"#))
            .column("c", ty("text"), None)
            .column(
                "project_id",
                ty("uuid"),
                Some("00000000-0000-0000-0000-000000000001"),
            )
            .column("user_id", ty("text"), Some("u"));
        let columns = row.source_columns();
        if let Some(plan) = rules.plan_for(&table.schema, &table.name) {
            if let Ok(out) = plan.evaluate(&row.view(&columns)) {
                for bucket in out.buckets {
                    let data: Value = serde_json::from_str(&bucket.data)
                        .unwrap_or_else(|e| panic!("row data is not JSON ({e}): {}", bucket.data));
                    assert!(
                        data.is_object(),
                        "row data is not an object: {}",
                        bucket.data
                    );
                }
            }
        }
    }
    let ctx = RequestContext::from_claims(claims);
    let _ = rules.resolve_request(&ctx, &InMemoryLookups::new());
}
