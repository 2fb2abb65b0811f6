//! What a sync stream logs and counts of itself, in the official service's names: its
//! first `checkpoint_complete` with the ops and bytes it sent and where its time went
//! (`ms.*`), `Sync stream complete` with its totals and `close_reason` when it ends, and
//! `powersync_sync_connections_total` by outcome (a client that left, a token that
//! expired, a refused token). The engine in-process against a real primary, its log
//! events captured by the engine's own log layer.
use crate::engine_rig;

use std::sync::{Mutex, OnceLock};

use engine::logging::{self, LogReceiver};
use engine_rig::{post_sync_stream, EngineRig};
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;

const SCHEMA: &str = "
CREATE TABLE notes (id text PRIMARY KEY, owner_id text, body text);
CREATE PUBLICATION powersync FOR TABLE notes;
INSERT INTO notes SELECT 'n' || g, 'log-user-' || (g % 2), 'note ' || g FROM generate_series(1, 200) g;
";

const RULES: &str = "
bucket_definitions:
  mine:
    parameters: SELECT request.user_id() AS user_id
    data:
      - SELECT * FROM notes WHERE owner_id = bucket.user_id
";

/// Every log line of this test binary since the first call, kept across drains.
fn log_lines() -> Vec<String> {
    static CAPTURE: OnceLock<(Mutex<LogReceiver>, Mutex<Vec<String>>)> = OnceLock::new();
    let (receiver, lines) = CAPTURE.get_or_init(|| {
        let (layer, receiver) = logging::channel(1 << 20, Level::DEBUG);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this binary");
        (Mutex::new(receiver), Mutex::new(Vec::new()))
    });
    let mut lines = lines.lock().unwrap();
    lines.extend(receiver.lock().unwrap().drain().map(|e| e.message));
    lines.clone()
}

/// Waits for a log line containing every one of `parts`.
fn wait_log(parts: &[&str]) -> String {
    testkit::wait_until(&format!("a log line with {parts:?}"), || {
        log_lines()
            .into_iter()
            .find(|l| parts.iter().all(|p| l.contains(p)))
    })
}

/// The value of `name{outcome="…"}` in a scrape of `/metrics`.
fn outcome(port: u16, name: &str) -> f64 {
    let reply = testkit::http_get(port, "/metrics").expect("GET /metrics");
    let key = format!("powersync_sync_connections_total{{outcome=\"{name}\"}} ");
    reply
        .body
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .unwrap_or_else(|| panic!("no {key} in\n{}", reply.body))
        .trim()
        .parse()
        .unwrap()
}

/// Reads the chunked body until `needle` appears; false if the stream ended first.
fn read_until(reader: &mut std::io::BufReader<std::net::TcpStream>, needle: &str) -> bool {
    use std::io::{BufRead, Read};
    let mut seen = String::new();
    while !seen.contains(needle) {
        let mut size = String::new();
        if reader.read_line(&mut size).unwrap_or(0) == 0 {
            return false;
        }
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            return false;
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk[..size]));
    }
    true
}

#[test]
fn a_stream_logs_its_checkpoints_and_its_end_and_counts_its_outcome() {
    log_lines();
    let rig = EngineRig::start(SCHEMA, RULES, "psm_stream_log_test");
    let post =
        |token: Option<&str>| post_sync_stream(rig.port, token, "application/x-ndjson", "", "{}");

    // A refused token is counted as refused.
    let (status, _, _) = post(Some("garbage"));
    assert_eq!(status, 401);
    assert_eq!(outcome(rig.port, "refused"), 1.0);

    // A client that syncs and leaves: its initial sync's checkpoint_complete, then the
    // end, with the client's close reason, once a commit makes the server notice.
    let (status, _, mut reader) = post(Some(&engine_rig::token("log-user-1", 600)));
    assert_eq!(status, 200);
    assert!(read_until(&mut reader, "checkpoint_complete"));
    let complete = wait_log(&["checkpoint_complete: ", "user_id=log-user-1"]);
    for field in [
        "operations_synced=100",
        "data_synced_bytes=",
        "ms.checkpoint=",
        "ms.bucket_data=",
        "ms.sending=",
        "ms.total=",
    ] {
        assert!(complete.contains(field), "{field} missing: {complete}");
    }
    drop(reader);
    rig.primary
        .sql("UPDATE notes SET body = 'seen by no one' WHERE id = 'n1'");
    let ended = wait_log(&["Sync stream complete", "user_id=log-user-1"]);
    assert!(
        ended.contains("close_reason=client closing stream")
            && ended.contains("operations_synced=100")
            && ended.contains("stream_ms="),
        "{ended}"
    );
    assert_eq!(outcome(rig.port, "client_closed"), 1.0);

    // A token that expires: the service ends the stream.
    let (status, _, mut reader) = post(Some(&engine_rig::token("log-user-0", 3)));
    assert_eq!(status, 200);
    // Bounded by the stream's own progress: once it said the token expired (`0`), its
    // next read is its end, not another line.
    assert!(
        read_until(&mut reader, "\"token_expires_in\":0"),
        "the stream ended before it said the token expired"
    );
    assert!(
        !read_until(&mut reader, "token_expires_in"),
        "the stream outlived its token"
    );
    let expired = wait_log(&["Sync stream complete", "user_id=log-user-0"]);
    assert!(
        expired.contains("close_reason=service closing stream"),
        "{expired}"
    );
    assert_eq!(outcome(rig.port, "service_closed"), 1.0);
    assert_eq!(outcome(rig.port, "error"), 0.0);
}
