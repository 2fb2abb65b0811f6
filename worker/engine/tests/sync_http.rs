//! Live tests of the HTTP sync endpoints: the engine in-process against a real primary,
//! clients speaking raw HTTP/1.1. Initial sync checked with a client model (checksums add
//! up, rows equal the rules' output), incremental changes, write checkpoints, BSON, and
//! bad input answered with the right status.
use crate::engine_rig;
use crate::sync_client;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use testkit::{Patience, Waiting};

use engine_rig::{base64_url, token, EngineRig, AUDIENCE};
use serde_json::{json, Value};
use sync_client::{post, post_with, Client};

const SCHEMA: &str = "
CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL);
CREATE TABLE todos (id text PRIMARY KEY, list_id text, title text);
CREATE PUBLICATION powersync FOR TABLE lists, todos;
INSERT INTO lists VALUES ('l1', 'u1'), ('l2', 'u2');
INSERT INTO todos SELECT 't' || g, CASE WHEN g % 3 = 0 THEN 'l2' ELSE 'l1' END, 'todo ' || g
  FROM generate_series(1, 2500) g;
";

const RULES: &str = "
bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM todos WHERE list_id = bucket.list_id
  everything_count:
    priority: 1
    data:
      - SELECT id, owner_id FROM lists
";

struct Rig;

impl Rig {
    fn start() -> EngineRig {
        EngineRig::start(SCHEMA, RULES, "psm_http_test")
    }
}

#[test]
fn a_client_syncs_follows_changes_and_gets_its_write_checkpoint() {
    let rig = Rig::start();
    let body =
        json!({"buckets": [], "include_checksum": true, "raw_data": true, "client_id": "c1"});
    let (status, mut lines) = post(
        rig.port,
        Some(&token("u1", 600)),
        "application/x-ndjson",
        &body.to_string(),
    );
    assert_eq!(status, 200);
    assert_eq!(lines.content_type, "application/x-ndjson");
    let first = lines.until_complete();
    assert!(first[0].get("checkpoint").is_some(), "{}", first[0]);
    // Priority 1 completes before priority 3.
    assert!(first
        .iter()
        .any(|l| l.get("partial_checkpoint_complete").is_some()));
    let mut client = Client::default();
    client.apply(&first);
    let l1 = client.named("by_list[\"l1\"]").unwrap();
    let l1 = l1.as_str();
    let rows = client.rows(l1);
    assert_eq!(rows.len(), 2500 - 2500 / 3);
    assert_eq!(rows["t1"], r#"{"id":"t1","list_id":"l1","title":"todo 1"}"#);
    assert_eq!(client.named("by_list[\"l2\"]"), None);

    // An insert, an update moving a row out, a new list for u1: one diff each way.
    rig.primary.sql(
        "BEGIN; INSERT INTO todos VALUES ('new', 'l1', 'fresh'); \
         UPDATE todos SET list_id = 'l2' WHERE id = 't1'; INSERT INTO lists VALUES ('l3', 'u1'); \
         INSERT INTO todos VALUES ('in3', 'l3', 'third list'); COMMIT;",
    );
    let next = lines.until_complete();
    assert!(next[0].get("checkpoint_diff").is_some(), "{}", next[0]);
    client.apply(&next);
    let rows = client.rows(l1);
    assert!(rows.contains_key("new") && !rows.contains_key("t1"));
    let l3 = client.named("by_list[\"l3\"]").unwrap();
    assert_eq!(client.rows(&l3).len(), 1);

    // A write checkpoint is reported once replication passes it.
    let reply = write_checkpoint(rig.port, &token("u1", 600), "c1");
    let id: u64 = reply["data"]["write_checkpoint"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let mut waiting = Waiting::new(format!("write checkpoint {id} reported"));
    loop {
        waiting.progress(rig.progress());
        let more = lines.until_complete();
        client.apply(&more);
        let seen: u64 = client
            .write_checkpoint
            .as_deref()
            .unwrap_or("0")
            .parse()
            .unwrap();
        if seen >= id {
            break;
        }
    }

    // Reconnect with the positions held: nothing is sent again, checksums still add up.
    let positions: Vec<Value> = client
        .announced
        .keys()
        .map(|b| json!({"name": b, "after": client.last_op_id.to_string()}))
        .collect();
    let body = json!({"buckets": positions, "client_id": "c1"});
    let (status, mut again) = post(
        rig.port,
        Some(&token("u1", 600)),
        "application/x-ndjson",
        &body.to_string(),
    );
    assert_eq!(status, 200);
    let resumed = again.until_complete();
    assert!(
        resumed.iter().all(|l| l.get("data").is_none()),
        "{resumed:?}"
    );
}

fn write_checkpoint(port: u16, token: &str, client_id: &str) -> Value {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET /write-checkpoint2.json?client_id={client_id} HTTP/1.1\r\nHost: x\r\n\
         Authorization: Token {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    serde_json::from_str(text.split("\r\n\r\n").nth(1).unwrap()).unwrap()
}

#[test]
fn bson_streams_and_bad_requests_get_their_errors() {
    let rig = Rig::start();
    let sdk_accept = "application/vnd.powersync.bson-stream;q=0.9,application/x-ndjson;q=0.8";
    let (status, mut lines) = post(rig.port, Some(&token("u1", 600)), sdk_accept, "{}");
    assert_eq!(status, 200);
    assert_eq!(lines.content_type, "application/vnd.powersync.bson-stream");
    let len = lines.next_bson_len().unwrap();
    assert!(len > 5);

    let good = token("u1", 600);
    let cases: Vec<(Option<String>, &str, u16, &str)> = vec![
        (None, "{}", 401, "PSYNC_S2106"),
        (Some("garbage".into()), "{}", 401, "PSYNC_S2101"),
        (Some(token("u1", 3 * 86400)), "{}", 401, "PSYNC_S2104"),
        (Some(good.clone()), "{not json", 400, "PSM_Y1001"),
        (
            Some(good.clone()),
            r#"{"buckets": [{"name": "x", "after": 5}]}"#,
            400,
            "PSM_Y1002",
        ),
        (
            Some(good.clone()),
            r#"{"buckets": [{"name": "x", "after": "-1"}]}"#,
            400,
            "PSM_Y1002",
        ),
        (
            Some(good.clone()),
            r#"{"streams": {"subscriptions": "no"}}"#,
            400,
            "PSM_Y1002",
        ),
    ];
    for (token, body, expected, code) in cases {
        let (status, mut reply) = post(rig.port, token.as_deref(), "application/x-ndjson", body);
        let mut text = String::new();
        let _ = reply.reader.read_to_string(&mut text);
        assert_eq!(status, expected, "{body}: {text}");
        assert!(text.contains(code), "{body}: {text}");
    }
    // An expired token (beyond the clock tolerance) is refused; alg none too.
    let (status, _) = post(
        rig.port,
        Some(&token("u1", -120)),
        "application/x-ndjson",
        "{}",
    );
    assert_eq!(status, 401);
    let none = format!(
        "{}.{}.",
        base64_url(br#"{"alg":"none","typ":"JWT"}"#),
        base64_url(
            json!({"sub": "u1", "aud": AUDIENCE, "iat": 1, "exp": 4_000_000_000u64})
                .to_string()
                .as_bytes()
        )
    );
    let (status, _) = post(rig.port, Some(&none), "application/x-ndjson", "{}");
    assert_eq!(status, 401);

    // gzip and zstd when asked for: the first checkpoint decodes from the chunks sent so
    // far (each chunk is compressed whole: a zstd frame, deflate blocks ended by a flush).
    for (coding, header) in [
        ("gzip", "Accept-Encoding: gzip, deflate\r\n"),
        ("zstd", "Accept-Encoding: zstd\r\n"),
    ] {
        let (status, mut lines) =
            post_with(rig.port, Some(&good), "application/x-ndjson", header, "{}");
        assert_eq!(status, 200);
        let mut text = String::new();
        while !text.contains("checkpoint_complete") {
            assert!(lines.fill(), "{coding}: the stream ended");
            let mut decoded = Vec::new();
            let compressed = lines.pending.as_slice();
            let _ = match coding {
                "gzip" => flate2::read::GzDecoder::new(compressed).read_to_end(&mut decoded),
                _ => zstd::stream::read::Decoder::new(compressed)
                    .unwrap()
                    .read_to_end(&mut decoded),
            };
            text = String::from_utf8_lossy(&decoded).into_owned();
        }
        assert!(text.starts_with("{\"checkpoint\":"), "{coding}: {text}");
    }

    // An oversized body is refused before it is read whole.
    let huge = format!("{{\"app_metadata\": \"{}\"}}", "x".repeat(5 << 20));
    // The server answers before it reads the rest, so the upload may fail half-way and the
    // answer may be lost with the connection's reset: try a few times.
    let answers: Vec<u16> = (0..3)
        .map(|_| post_oversized(rig.port, &good, &huge))
        .collect();
    assert!(answers.contains(&413), "{answers:?}");
    assert!(answers.iter().all(|s| [0, 413].contains(s)), "{answers:?}");
}

/// Posts `body` (larger than the server accepts), ignoring a failed upload; the status,
/// or 0 when the connection was reset before it arrived.
fn post_oversized(port: u16, token: &str, body: &str) -> u16 {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Patience::of_run().stall))
        .unwrap();
    let _ = write!(
        stream,
        "POST /sync/stream HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Token {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut status_line = String::new();
    match BufReader::new(stream).read_line(&mut status_line) {
        Ok(_) => status_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        Err(_) => 0,
    }
}

/// Only the sync endpoints are offered to browsers of other origins: probes, `/metrics`
/// and unknown paths carry no CORS header.
#[test]
fn cors_is_offered_on_the_sync_endpoints_only() {
    let rig = Rig::start();
    let ask = |request: &str| {
        let mut stream = TcpStream::connect(("127.0.0.1", rig.port)).unwrap();
        stream
            .set_read_timeout(Some(Patience::of_run().stall))
            .unwrap();
        stream.write_all(request.as_bytes()).unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let (head, _) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        let status: u16 = head[9..12].parse().unwrap();
        let cors = head
            .to_ascii_lowercase()
            .contains("access-control-allow-origin: *");
        (status, cors)
    };
    let origin = "Host: x\r\nOrigin: https://app.example\r\nConnection: close\r\n";
    assert_eq!(
        ask(&format!(
            "OPTIONS /sync/stream HTTP/1.1\r\n{origin}Access-Control-Request-Method: POST\r\n\r\n"
        )),
        (204, true)
    );
    assert_eq!(
        ask(&format!(
            "POST /sync/stream HTTP/1.1\r\n{origin}Content-Length: 2\r\n\r\n{{}}"
        )),
        (401, true),
        "a refused sync request stays readable to the page"
    );
    assert_eq!(
        ask(&format!(
            "GET /write-checkpoint2.json HTTP/1.1\r\n{origin}\r\n"
        )),
        (401, true)
    );
    assert_eq!(
        ask(&format!("GET /probes/liveness HTTP/1.1\r\n{origin}\r\n")),
        (200, false)
    );
    assert_eq!(
        ask(&format!("GET /metrics HTTP/1.1\r\n{origin}\r\n")),
        (200, false)
    );
    assert_eq!(
        ask(&format!("GET /nope HTTP/1.1\r\n{origin}\r\n")),
        (404, false)
    );
}

/// A user asking for write checkpoints faster than 10 per second (after a burst of 20)
/// is answered 429; another user is not affected.
#[test]
fn write_checkpoints_are_rate_limited_per_user() {
    let rig = Rig::start();
    let ask = |user: &str| {
        let mut s = TcpStream::connect(("127.0.0.1", rig.port)).unwrap();
        write!(
            s,
            "GET /write-checkpoint2.json?client_id=c HTTP/1.1\r\nHost: x\r\n\
             Authorization: Token {}\r\nConnection: close\r\n\r\n",
            token(user, 600)
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text
    };
    let answers: Vec<String> = (0..40).map(|_| ask("u1")).collect();
    let refused = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 429"))
        .count();
    assert!(refused >= 1, "40 requests at once, none refused");
    assert!(
        answers
            .iter()
            .all(|a| a.starts_with("HTTP/1.1 200") || a.contains("PSM_H1431")),
        "{answers:?}"
    );
    assert!(ask("u2").starts_with("HTTP/1.1 200"));
}

/// Clients that invent client ids leave one write-checkpoint request each; the writer
/// removes those older than the age (1 s here, 24 h by default) once a checkpoint passed
/// them, in its own transactions, while replication goes on.
#[test]
fn old_write_checkpoint_requests_are_expired_by_the_writer() {
    let rig = EngineRig::start_edited(SCHEMA, RULES, "psm_wc_expiry", "", |config| {
        config.write_checkpoint_max_age = Some(std::time::Duration::from_secs(1));
    });
    let metric = || -> u64 {
        let mut s = TcpStream::connect(("127.0.0.1", rig.port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        text.lines()
            .find_map(|l| {
                l.strip_prefix("powersync_mdbx_write_checkpoints_expired_total ")?
                    .parse()
                    .ok()
            })
            .expect("the counter is exported")
    };
    assert_eq!(metric(), 0);
    // Three users, ten invented client ids each (within the per-user rate).
    for user in ["u1", "u2", "u3"] {
        let token = token(user, 600);
        for i in 0..10 {
            write_checkpoint(rig.port, &token, &format!("invented-{i}"));
        }
    }
    // Each request's ping reaches the writer; one every poll keeps transactions coming.
    let poller = token("u4", 600);
    let expired = testkit::wait_for("the writer expiring the invented requests", || {
        write_checkpoint(rig.port, &poller, "poller");
        std::thread::sleep(std::time::Duration::from_millis(200));
        let expired = metric();
        if expired >= 30 {
            Ok(expired)
        } else {
            Err(expired)
        }
    });
    assert!(expired >= 30, "{expired}");
    // Replication went on meanwhile: a change on the primary still reaches the store.
    rig.primary
        .sql("INSERT INTO lists VALUES ('l-after-expiry', 'u1')");
    let (status, mut lines) = post(
        rig.port,
        Some(&token("u1", 600)),
        "application/x-ndjson",
        &json!({"buckets": [], "raw_data": true, "client_id": "c9"}).to_string(),
    );
    assert_eq!(status, 200);
    // The row may be applied after the stream's first checkpoint: the next one has it.
    let mut seen = lines.until_complete();
    while !seen
        .iter()
        .any(|l| l.to_string().contains("l-after-expiry"))
    {
        seen = lines.until_complete();
    }
    assert!(
        seen.iter()
            .any(|l| l.to_string().contains("l-after-expiry")),
        "the row applied after the sweep is served"
    );
}

/// A client that does not send `raw_data: true` (an older one) gets each PUT's row as an
/// object in NDJSON, as the official service answers it; `raw_data: true` and BSON keep
/// the row as a string.
#[test]
fn without_raw_data_rows_arrive_as_objects() {
    let rig = Rig::start();
    let first_put = |body: Value| {
        let (status, mut lines) = post(
            rig.port,
            Some(&token("u1", 600)),
            "application/x-ndjson",
            &body.to_string(),
        );
        assert_eq!(status, 200);
        let lines = lines.until_complete();
        lines
            .iter()
            .filter_map(|l| l["data"]["data"].as_array())
            .flatten()
            .find(|op| op["op"] == "PUT" && op["object_id"] == "t1")
            .cloned()
            .unwrap_or_else(|| panic!("no PUT of t1 in {lines:?}"))
    };
    let nested = first_put(json!({"buckets": [], "include_checksum": true}));
    assert_eq!(
        nested["data"],
        json!({"id": "t1", "list_id": "l1", "title": "todo 1"})
    );
    let raw = first_put(json!({"buckets": [], "raw_data": false}));
    assert!(raw["data"].is_object(), "{raw}");
    let string = first_put(json!({"buckets": [], "raw_data": true}));
    assert_eq!(
        string["data"],
        json!(r#"{"id":"t1","list_id":"l1","title":"todo 1"}"#)
    );
    assert_eq!(string["checksum"], nested["checksum"]);
}
