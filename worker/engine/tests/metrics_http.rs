//! Live test of `GET /metrics`: the engine in-process against a real primary and a real
//! store, clients speaking raw HTTP/1.1. Auth failures, open streams and sync answers are
//! counted; replication counters, the applied LSN and the publish latency move with a
//! commit on the primary.
use crate::engine_rig;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use testkit::Patience;

use engine_rig::{post_sync_stream, EngineRig};

const SCHEMA: &str = "
CREATE TABLE todos (id text PRIMARY KEY, owner_id text, title text);
CREATE PUBLICATION powersync FOR TABLE todos;
INSERT INTO todos SELECT 't' || g, 'u1', 'todo ' || g FROM generate_series(1, 300) g;
";

const RULES: &str = "
bucket_definitions:
  mine:
    parameters: SELECT request.user_id() AS user_id
    data:
      - SELECT * FROM todos WHERE owner_id = bucket.user_id
";

struct Rig;

impl Rig {
    fn start() -> EngineRig {
        EngineRig::start(SCHEMA, RULES, "psm_metrics_test")
    }
}

fn token(sub: &str) -> String {
    engine_rig::token(sub, 600)
}

/// A scrape: the content type and every sample by `name{labels}`.
struct Scrape {
    content_type: String,
    text: String,
    samples: BTreeMap<String, f64>,
}

impl Scrape {
    fn get(&self, key: &str) -> f64 {
        *self
            .samples
            .get(key)
            .unwrap_or_else(|| panic!("no sample {key} in\n{}", self.text))
    }

    fn value(&self, key: &str) -> Option<f64> {
        self.samples.get(key).copied()
    }
}

fn scrape(port: u16) -> Scrape {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Patience::of_run().stall)).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    let (head, text) = reply.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let mut samples = BTreeMap::new();
    let mut typed = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.push(rest.split(' ').next().unwrap().to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').unwrap();
        let value = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        // Every sample belongs to the family whose TYPE line came last.
        let name = key.split('{').next().unwrap();
        let family = typed.last().unwrap();
        assert!(
            name == family
                || [
                    format!("{family}_bucket"),
                    format!("{family}_sum"),
                    format!("{family}_count")
                ]
                .contains(&name.to_owned()),
            "{line} after TYPE {family}"
        );
        samples.insert(key.to_owned(), value);
    }
    Scrape {
        content_type,
        text: text.to_owned(),
        samples,
    }
}

/// Posts `/sync/stream`; returns the status and the open reader.
fn post(port: u16, token: Option<&str>) -> (u16, BufReader<TcpStream>) {
    let (status, _, reader) = post_sync_stream(port, token, "application/x-ndjson", "", "{}");
    (status, reader)
}

/// Reads the chunked body until `needle` appeared.
fn read_until(reader: &mut BufReader<TcpStream>, needle: &str) {
    let mut seen = String::new();
    while !seen.contains(needle) {
        let mut size = String::new();
        assert!(reader.read_line(&mut size).unwrap() > 0, "stream ended");
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        assert!(size > 0, "stream ended: {seen}");
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk[..size]));
    }
}

fn wait_for(what: &str, port: u16, done: impl Fn(&Scrape) -> bool) -> Scrape {
    // The scrape's own text moves every time (uptime, histograms): the wait has no
    // progress to show, so the stall limit bounds it.
    testkit::wait_until(what, || Some(scrape(port)).filter(|s| done(s)))
}

#[test]
fn metrics_count_auth_failures_streams_answers_and_replication() {
    let rig = Rig::start();
    let first = scrape(rig.port);
    assert!(
        first.content_type.starts_with("text/plain; version=0.0.4"),
        "{}",
        first.content_type
    );
    assert_eq!(first.get("powersync_mdbx_phase{phase=\"streaming\"}"), 1.0);
    assert_eq!(first.get("powersync_mdbx_phase{phase=\"ready\"}"), 0.0);
    assert_eq!(first.get("powersync_mdbx_snapshot_rows"), 300.0);
    assert_eq!(first.get("powersync_mdbx_sync_streams_open"), 0.0);
    assert_eq!(
        first.get("powersync_mdbx_auth_failures_total{code=\"PSYNC_S2101\"}"),
        0.0
    );
    assert!(first.get("powersync_mdbx_storage_file_bytes") > 0.0);
    assert!(first.get("powersync_mdbx_storage_used_bytes") > 0.0);
    assert!(first.get("powersync_mdbx_read_txns_total") > 0.0);
    assert!(first.get("powersync_mdbx_applied_lsn") > 0.0);
    assert_eq!(first.get("powersync_mdbx_replication_lag_seconds"), 0.0);
    assert!(first
        .value("powersync_mdbx_sync_responses_total{status=\"401\"}")
        .is_none());

    // Bad tokens: each refusal is counted under its code, and the answers by status.
    let (status, _) = post(rig.port, Some("garbage"));
    assert_eq!(status, 401);
    let (status, _) = post(rig.port, None);
    assert_eq!(status, 401);
    let after_bad = scrape(rig.port);
    assert_eq!(
        after_bad.get("powersync_mdbx_auth_failures_total{code=\"PSYNC_S2101\"}"),
        1.0
    );
    assert_eq!(
        after_bad.get("powersync_mdbx_auth_failures_total{code=\"PSYNC_S2106\"}"),
        1.0
    );
    assert_eq!(
        after_bad.get("powersync_mdbx_sync_responses_total{status=\"401\"}"),
        2.0
    );

    // A good stream is open while the client reads, and closed after it leaves.
    let (status, mut reader) = post(rig.port, Some(&token("u1")));
    assert_eq!(status, 200);
    read_until(&mut reader, "checkpoint_complete");
    let open = scrape(rig.port);
    assert_eq!(open.get("powersync_mdbx_sync_streams_open"), 1.0);
    assert_eq!(
        open.get("powersync_mdbx_sync_responses_total{status=\"200\"}"),
        1.0
    );
    let before = open.get("powersync_mdbx_applied_lsn");
    drop(reader);
    // A commit makes the server write to the closed connection, which ends the stream
    // even where the disconnect itself went unnoticed; it also moves replication. (One
    // psql command string is one transaction.)
    rig.primary.sql(
        "INSERT INTO todos VALUES ('new', 'u1', 'fresh'); \
         UPDATE todos SET title = 'x' WHERE id = 't1';",
    );
    let done = wait_for("stream close and applied commit", rig.port, |s| {
        s.get("powersync_mdbx_sync_streams_open") == 0.0
            && s.get("powersync_mdbx_source_transactions_applied_total") >= 1.0
    });
    assert!(done.get("powersync_mdbx_applied_lsn") > before);
    assert!(done.get("powersync_mdbx_rows_applied_total") >= 2.0);
    assert!(done.get("powersync_mdbx_ops_written_total") >= 2.0);
    let count = done.get("powersync_mdbx_checkpoint_publish_seconds_count");
    assert!(count >= 1.0, "{}", done.text);
    assert_eq!(
        done.get("powersync_mdbx_checkpoint_publish_seconds_bucket{le=\"+Inf\"}"),
        count
    );
    assert!(done.get("powersync_mdbx_checkpoint_publish_seconds_sum") > 0.0);
    assert_eq!(done.get("powersync_mdbx_replication_lag_seconds"), 0.0);
    assert_eq!(done.get("powersync_mdbx_read_txn_oldest_age_seconds"), 0.0);

    // The primary's head is read every 10 s: the lag in bytes is head - applied.
    let headed = wait_for("a primary head reading", rig.port, |s| {
        s.value("powersync_mdbx_primary_wal_lsn").is_some()
    });
    let head = headed.get("powersync_mdbx_primary_wal_lsn");
    let applied = headed.get("powersync_mdbx_applied_lsn");
    assert_eq!(
        headed.get("powersync_mdbx_replication_lag_bytes"),
        (head - applied).max(0.0)
    );

    // Other routes are unchanged: POST /metrics is not allowed, probes still answer.
    let mut s = TcpStream::connect(("127.0.0.1", rig.port)).unwrap();
    write!(
        s,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
}
