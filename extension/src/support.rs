//! The SQL support functions: rules validation in the backend, and the live engine's
//! buckets, request resolution and open streams through the admin socket.

use admin::{AdminRequest, AdminResponse};
use pgrx::datetime::to_timestamp;
use pgrx::prelude::*;
use pgrx::JsonB;
use rules::validate::validation_report;

use crate::admin_client;

/// Compiles `rules` (sync-rules YAML) with the worker's compiler, in this backend.
#[pg_extern(immutable, parallel_safe)]
fn validate_rules(rules: &str) -> JsonB {
    JsonB(validation_report(rules))
}

/// A PowerSync checksum as the protocol sends it: the u32 sum read as a signed i32.
fn signed(checksum: u32) -> i64 {
    i64::from(checksum as i32)
}

fn int8(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn unexpected(response: &AdminResponse) -> ! {
    pgrx::error!("powersync_mdbx: unexpected answer from the engine: {response:?}")
}

/// Every stored bucket with its accumulators at the store's current checkpoint.
#[pg_extern]
fn buckets() -> TableIterator<
    'static,
    (
        name!(bucket, String),
        name!(ops, i64),
        name!(checksum, i64),
        name!(last_op_id, i64),
    ),
> {
    match admin_client::call(&AdminRequest::Buckets) {
        AdminResponse::Buckets { buckets, .. } => {
            TableIterator::new(buckets.into_iter().map(|b| {
                (
                    b.bucket,
                    int8(b.ops),
                    signed(b.checksum),
                    int8(b.last_op_id),
                )
            }))
        }
        other => unexpected(&other),
    }
}

/// The bucket set a client with these token `claims` and this `/sync/stream` request body
/// (`{"parameters": {...}, "streams": {...}}`) gets now, resolved as the endpoint does.
#[pg_extern]
fn user_buckets(
    claims: JsonB,
    parameters: default!(JsonB, "'{}'::jsonb"),
) -> TableIterator<
    'static,
    (
        name!(bucket, String),
        name!(priority, i32),
        name!(source, String),
        name!(ops, i64),
        name!(checksum, i64),
        name!(last_op_id, i64),
    ),
> {
    let request = AdminRequest::UserBuckets {
        claims: claims.0,
        request: request_body(parameters.0),
    };
    match admin_client::call(&request) {
        AdminResponse::UserBuckets {
            buckets, errors, ..
        } => {
            for (stream, message) in errors {
                pgrx::notice!("powersync_mdbx: stream {stream}: {message}");
            }
            TableIterator::new(buckets.into_iter().map(|b| {
                (
                    b.bucket,
                    i32::from(b.priority),
                    b.source,
                    int8(b.ops),
                    signed(b.checksum),
                    int8(b.last_op_id),
                )
            }))
        }
        other => unexpected(&other),
    }
}

/// Keys of a `/sync/stream` body; an object with none of them is taken as the client
/// parameters themselves.
const BODY_KEYS: &[&str] = &[
    "parameters",
    "streams",
    "client_id",
    "buckets",
    "app_metadata",
    "raw_data",
    "binary_data",
    "include_checksum",
];

/// `{"parameters": {...}}` stays as it is; `{"org": 1}` means client parameters.
fn request_body(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map)
            if !map.is_empty() && !map.keys().any(|k| BODY_KEYS.contains(&k.as_str())) =>
        {
            serde_json::json!({ "parameters": map })
        }
        other => other,
    }
}

/// The open `/sync/stream` connections.
// pgrx reads the column names from `name!` in the signature itself, so no type alias.
#[allow(clippy::type_complexity)]
#[pg_extern]
fn streams() -> TableIterator<
    'static,
    (
        name!(id, i64),
        name!(user_id, String),
        name!(client_id, Option<String>),
        name!(connected_at, TimestampWithTimeZone),
        name!(last_checkpoint, Option<i64>),
        name!(last_checkpoint_at, Option<TimestampWithTimeZone>),
        name!(buckets, i64),
        name!(token_expires_at, TimestampWithTimeZone),
    ),
> {
    let millis = |ms: u64| to_timestamp(ms as f64 / 1000.0);
    match admin_client::call(&AdminRequest::Streams) {
        AdminResponse::Streams { streams } => {
            TableIterator::new(streams.into_iter().map(move |s| {
                (
                    int8(s.id),
                    s.user_id,
                    s.client_id,
                    millis(s.started_at_ms),
                    s.last_op_id.map(int8),
                    s.last_checkpoint_at_ms.map(millis),
                    int8(s.buckets),
                    to_timestamp(s.token_expires_at as f64),
                )
            }))
        }
        other => unexpected(&other),
    }
}
