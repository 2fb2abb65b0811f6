//! Requests → responses, from the sync service's store, rules and stream registry. Store
//! reads run on blocking threads, as the sync endpoint's do.

use std::sync::Arc;

use serde_json::Value;

use super::protocol::{AdminRequest, AdminResponse, BucketRow, UserBucketRow};
use service::inspect::request_buckets;
use service::SyncService;
use service::{SyncError, SyncRequest};
use store::StoreError;

/// Answers one request; failures become error responses.
pub(super) async fn answer(request: AdminRequest, sync: &Arc<SyncService>) -> AdminResponse {
    match request {
        AdminRequest::Streams => AdminResponse::Streams {
            streams: sync.registry.list(),
        },
        AdminRequest::Buckets => {
            let store = sync.current().store.clone();
            let read = tokio::task::spawn_blocking(move || {
                store.read(|view| Ok((view.checkpoint()?, view.bucket_states()?)))
            })
            .await;
            match read {
                Ok(Ok((checkpoint, states))) => AdminResponse::Buckets {
                    op_id: checkpoint.op_id,
                    buckets: states
                        .into_iter()
                        .map(|(bucket, s)| BucketRow {
                            bucket,
                            ops: s.count,
                            checksum: s.checksum,
                            last_op_id: s.last_op,
                        })
                        .collect(),
                },
                Ok(Err(e)) => store_error(&e),
                Err(e) => AdminResponse::error(
                    "PSM_A1009",
                    format!("the read failed: {e}"),
                    "see the server log",
                ),
            }
        }
        AdminRequest::UserBuckets { claims, request } => user_buckets(claims, request, sync).await,
    }
}

async fn user_buckets(claims: Value, request: Value, sync: &Arc<SyncService>) -> AdminResponse {
    let has_sub = claims
        .get("sub")
        .is_some_and(|s| s.is_string() || s.is_number());
    if !claims.is_object() || !has_sub {
        return AdminResponse::error(
            "PSM_A1010",
            "the claims must be a JSON object with `sub` (the user id), as in a client's token",
            "pass the token's payload, e.g. '{\"sub\": \"user-1\"}'::jsonb",
        );
    }
    let request = if request.is_null() {
        Value::Object(Default::default())
    } else {
        request
    };
    let parsed = match SyncRequest::from_value(request) {
        Ok(r) => r,
        Err(e) => return sync_error(&e),
    };
    let ctx = parsed.context(claims);
    let served = sync.current();
    let (store, rules) = (served.store.clone(), served.rules.clone());
    let limits = sync.limits.request;
    let resolved =
        tokio::task::spawn_blocking(move || request_buckets(&store, &rules, &ctx, limits)).await;
    match resolved {
        Ok(Ok(r)) => AdminResponse::UserBuckets {
            op_id: r.op_id,
            buckets: r
                .buckets
                .into_iter()
                .map(|b| UserBucketRow {
                    bucket: b.name,
                    priority: b.priority,
                    source: b.source,
                    ops: b.count,
                    checksum: b.checksum,
                    last_op_id: b.last_op,
                })
                .collect(),
            errors: r.errors,
        },
        Ok(Err(e)) => sync_error(&e),
        Err(e) => AdminResponse::error(
            "PSM_A1009",
            format!("the read failed: {e}"),
            "see the server log",
        ),
    }
}

fn sync_error(e: &SyncError) -> AdminResponse {
    AdminResponse::error(
        e.code(),
        e.to_string(),
        "the /sync/stream endpoint would refuse this request the same way",
    )
}

fn store_error(e: &StoreError) -> AdminResponse {
    AdminResponse::error(
        "PSM_A1009",
        e.to_string(),
        "see powersync_mdbx.status() and the server log",
    )
}
