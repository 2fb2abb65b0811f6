//! The SDK over other transports: RSocket over a WebSocket, and the web SDK in a headless
//! browser (over streamed `fetch` and a WebSocket).
use super::{assert_no_warnings, assert_rows, metric, wait_equal, Rig, Rules};
use serde_json::json;

/// `connectionMethod: WEB_SOCKET` (React Native apps without streaming `fetch`): the SDK
/// opens RSocket over a WebSocket on `/sync/stream`, gets every line as BSON within its
/// request-N credit, follows changes, and uploads and waits for its write checkpoint.
#[test]
fn sdk_syncs_over_a_websocket() {
    let rig = Rig::start(Rules::Streams);
    let client = rig.client().with_env("PSM_CONNECTION_METHOD", "web-socket");
    let first = client.run("initial");
    assert_rows(
        "initial sync over a WebSocket",
        &first["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    assert_no_warnings(&first, "WebSocket initial sync");
    let mut client = client.watch();
    rig.primary
        .sql("UPDATE tasks SET title = 'Over the socket' WHERE id = 'task-sentinel-update-0001'");
    wait_equal(&mut client, &rig, "a change over a WebSocket");
    client.send(
        &json!({"cmd": "update", "table": "tasks", "id": "task-org-001-0002-0005",
        "set": {"status": "done", "title": "Closed over the socket"}}),
    );
    let synced = client.send(&json!({"cmd": "wait_synced_after_upload"}));
    assert_rows(
        "after an upload over a WebSocket",
        &synced["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    let last = client.send(&json!({"cmd": "dump"}));
    assert_no_warnings(&last, "WebSocket");
    client.finish();
    // Every stream was a WebSocket (101), none a streamed POST (200).
    let metrics = testkit::http_get(rig.http_port, "/metrics").unwrap().body;
    let upgraded = metric(
        &metrics,
        "powersync_mdbx_sync_responses_total{status=\"101\"}",
    );
    assert!(upgraded >= Some(2.0), "{metrics}");
    assert_eq!(
        metric(
            &metrics,
            "powersync_mdbx_sync_responses_total{status=\"200\"}"
        ),
        None,
        "{metrics}"
    );
}

/// The web SDK in a real browser: `@powersync/web` (SQLite in a web worker, the sync in a
/// shared worker, across origins) syncs the fixture in headless Chromium over streamed
/// `fetch` and then over a WebSocket, holds exactly the primary's rows (the same digest as
/// the Node SDK's), and follows a change made on the primary while the page is open. The
/// page's screenshots are kept in `target/e2e/web-sdk-<transport>.png`.
#[test]
fn web_sdk_syncs_in_a_headless_browser() {
    let rig = Rig::start(Rules::Streams);
    let node = rig.client().run("initial");
    assert_rows(
        "the Node SDK",
        &node["tables"]["tasks"],
        &rig.expected_tasks(),
    );
    for (n, method) in ["http", "web-socket"].into_iter().enumerate() {
        let screenshot = browser_screenshot_path(method);
        let title = format!("Changed in the browser test ({method})");
        let page = rig
            .client()
            .with_env("PSM_CONNECTION_METHOD", method)
            .with_env(
                "PSM_BROWSER_CHANGE_SQL",
                &format!(
                    "UPDATE tasks SET title = '{title}' WHERE id = 'task-sentinel-update-0001'"
                ),
            )
            .run_in_browser(&screenshot);
        let what = format!("the web SDK over {method}");
        assert_no_warnings(&page, &what);
        assert_eq!(page["digest_checked"], true, "{what}: {page}");
        if n == 0 {
            // Nothing changed yet: the same rows as the Node SDK's, the same buckets.
            assert_rows(&what, &page["tables"]["tasks"], &node["tables"]["tasks"]);
            assert_eq!(
                page["buckets"], node["buckets"],
                "{what}: the Node SDK's buckets"
            );
        }
        assert_rows(
            &format!("{what}, after a change on the primary"),
            &page["after_change"],
            &rig.expected_tasks(),
        );
        let png = std::fs::read(&screenshot).unwrap();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 1000,
            "{what}: the page's screenshot at {} is not a PNG",
            screenshot.display()
        );
        println!(
            "{what} ({}) synced {} tasks in {} ms, digest {}; screenshot {}",
            page["browser"],
            page["tables"]["tasks"].as_array().unwrap().len(),
            page["elapsed_ms"],
            page["digest"],
            screenshot.display()
        );
    }
    // The second page's stream was a WebSocket (101), the first pages' streamed POSTs (200).
    let metrics = testkit::http_get(rig.http_port, "/metrics").unwrap().body;
    for status in ["101", "200"] {
        let name = format!("powersync_mdbx_sync_responses_total{{status=\"{status}\"}}");
        assert!(metric(&metrics, &name) >= Some(1.0), "{name}: {metrics}");
    }
}

/// `target/e2e/web-sdk-<transport>.png` in the build's target directory.
fn browser_screenshot_path(transport: &str) -> std::path::PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
        std::path::PathBuf::from,
    );
    let dir = target.join("e2e");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("web-sdk-{transport}.png"))
}
