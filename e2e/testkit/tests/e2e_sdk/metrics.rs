//! The official service's metric names after a sync, and the separate metrics port.
use serde_json::json;
use testkit::{free_port, PgInstall};

use super::{assert_rows, metric, Rig, Rules, AUDIENCE, SECRET};

/// Dashboards built on the official service's metric names find them after a sync: the
/// connection, the ops and bytes sent, the rows replicated, the storage sizes; and the
/// worker process's own figures. `telemetry.prometheus_port` serves them alone on a port
/// of their own.
#[test]
fn official_metric_names_count_a_sync() {
    let prometheus_port = free_port();
    let client_auth = format!(
        "client_auth:\n  audience: [{AUDIENCE}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: psm-e2e, k: {SECRET}}}\n\
         telemetry:\n  prometheus_port: {prometheus_port}\n"
    );
    let rig = Rig::start_with(Rules::Legacy, &client_auth, PgInstall::pg16());
    let synced = rig.client().run("initial");
    assert_rows(
        "initial sync",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    rig.primary.sql(
        "UPDATE tasks SET title = 'Counted by the metrics' WHERE id = 'task-sentinel-update-0001'",
    );
    rig.wait_replicated();
    let reply = testkit::http_get(rig.http_port, "/metrics").expect("GET /metrics answers");
    let text = reply.body;
    let value = |name: &str| {
        metric(&text, name).unwrap_or_else(|| panic!("/metrics has no {name}:\n{text}"))
    };
    let rows = rig.expected_tasks().as_array().unwrap().len() as f64;
    assert!(value("powersync_operations_synced_total") >= rows, "{text}");
    assert!(
        value("powersync_data_synced_bytes_total") >= value("powersync_data_sent_bytes_total")
            && value("powersync_data_sent_bytes_total") > 0.0,
        "{text}"
    );
    assert!(value("powersync_concurrent_connections") >= 0.0);
    assert!(value("powersync_rows_replicated_total") >= 1.0, "{text}");
    assert!(
        value("powersync_transactions_replicated_total") >= 1.0,
        "{text}"
    );
    assert!(value("powersync_replication_lag_seconds") >= 0.0);
    for size in [
        "powersync_replication_storage_size_bytes",
        "powersync_operation_storage_size_bytes",
        "powersync_parameter_storage_size_bytes",
    ] {
        assert!(value(size) > 0.0, "{size}: {text}");
    }
    assert!(value("process_cpu_seconds_total") > 0.0, "{text}");
    assert!(value("process_resident_memory_bytes") > 0.0, "{text}");
    assert!(
        text.contains("powersync_mdbx_build_info{version=\""),
        "{text}"
    );
    let scraped = testkit::http_get(prometheus_port, "/metrics").expect("the metrics port answers");
    assert_eq!(scraped.status, 200);
    assert!(metric(&scraped.body, "powersync_operations_synced_total").is_some());
    for other in ["/probes/readiness", "/sync/stream", "/"] {
        let reply = testkit::http_get(prometheus_port, other).unwrap();
        assert_eq!(
            reply.status, 404,
            "{other} on the metrics port: {}",
            reply.body
        );
    }
    assert_eq!(rig.status()["config_ignored"], json!([]));
}
