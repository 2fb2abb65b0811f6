//! `POST /api/admin/v1/schema`: the primary's tables and columns in the official
//! `InstanceSchema` shape, from which the CLI generates a client schema.

use serde_json::{json, Value};

use super::{connect, AdminError, ADMIN_DEADLINE, CONNECTION_ID, CONNECTION_TAG};
use config::SourceConnection;
use rules::PgType;
use source::{DatabaseSchema, SchemaColumn};

/// The official `ExpressionType` type flags, by SQLite type name.
fn type_flags(sqlite_type: &str) -> u8 {
    match sqlite_type {
        "blob" => 1,
        "text" => 2,
        "integer" => 4,
        "real" => 8,
        _ => 0,
    }
}

/// The schema read from the primary within [`ADMIN_DEADLINE`].
pub(super) async fn instance_schema(source: &SourceConnection) -> Result<Value, AdminError> {
    let read = async {
        let client = connect(source).await?;
        source::connection_schema(&client)
            .await
            .map_err(|e| e.to_string())
    };
    let schemas = match tokio::time::timeout(ADMIN_DEADLINE, read).await {
        Ok(Ok(schemas)) => schemas,
        Ok(Err(message)) => {
            return Err(AdminError::unavailable(format!(
                "the primary's schema could not be read: {message}"
            )))
        }
        Err(_) => {
            return Err(AdminError::unavailable(format!(
                "the primary's schema was not read within {}s",
                ADMIN_DEADLINE.as_secs()
            )))
        }
    };
    Ok(schema_json(&schemas))
}

/// `schemas` in the official shape.
pub(super) fn schema_json(schemas: &[DatabaseSchema]) -> Value {
    let schemas: Vec<Value> = schemas
        .iter()
        .map(|schema| {
            let tables: Vec<Value> = schema
                .tables
                .iter()
                .map(|t| {
                    let columns: Vec<Value> = t.columns.iter().map(column_json).collect();
                    json!({ "name": t.name, "columns": columns })
                })
                .collect();
            json!({ "name": schema.name, "tables": tables })
        })
        .collect();
    json!({
        "connections": [{ "id": CONNECTION_ID, "tag": CONNECTION_TAG, "schemas": schemas }],
        "defaultConnectionTag": CONNECTION_TAG,
        "defaultSchema": "public",
    })
}

fn column_json(column: &SchemaColumn) -> Value {
    let ty = PgType {
        oid: column.type_oid,
        element: column.element_oid,
    };
    json!({
        "name": column.name,
        "sqlite_type": type_flags(rules::sqlite_type(ty)),
        "internal_type": column.declared,
        "type": column.declared,
        "pg_type": column.type_name,
    })
}
