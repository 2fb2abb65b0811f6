//! The network to the primary stops forwarding (a proxy in between keeps every connection
//! open and passes nothing, both ways; new connections are accepted and swallowed too):
//! write checkpoints answer within their deadline, `status()` and the readiness probe's body
//! show the stalled source (the probe itself stays 200: the store is still served), a copy ends in its coded error, and once the network forwards again
//! replication is back within a minute with nothing lost.
//!
//! The proxy's host acknowledges what it swallows, so TCP keepalives and `TCP_USER_TIMEOUT`
//! (set short here, below the blackholes) never end these connections: the engine's own
//! bounds notice. The bounds are shortened so that each test takes about a minute.
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use config::{SourceBounds, SourceConnection};
use serde_json::Value;
use store::Store;
use testkit::buckets;

use crate::engine_rig::{token, EngineRig, TODOS_RULES, TODOS_SCHEMA};

/// The bounds of the streaming test: keepalives give up after 2 + 3 × 1 s, unacknowledged
/// data after 5 s, and 20 s of silence shows the source stalled.
const BOUNDS: SourceBounds = SourceBounds {
    keepalive_idle: Duration::from_secs(2),
    keepalive_interval: Duration::from_secs(1),
    keepalive_count: 3,
    user_timeout: Duration::from_secs(5),
    stall_after: Duration::from_secs(20),
};

/// Longer than every bound above and than the stream's liveness bound (30 s with the
/// primary's `wal_sender_timeout` of 10 s).
const BLACKHOLE: Duration = Duration::from_secs(45);

/// How long replication may take to be back once the network forwards again.
const RECOVERY: Duration = Duration::from_secs(60);

/// One HTTP/1.1 request; the status code, the body and how long the answer took.
fn http(port: u16, request: &str) -> (u16, String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let took = started.elapsed();
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (code, body, took)
}

fn write_checkpoint(port: u16, user: &str) -> (u16, String, Duration) {
    http(
        port,
        &format!(
            "GET /write-checkpoint2.json?client_id=c HTTP/1.1\r\nHost: x\r\n\
             Authorization: Token {}\r\nConnection: close\r\n\r\n",
            token(user, 600)
        ),
    )
}

/// The readiness probe's status code and whether its body says the source is stalled.
fn readiness(port: u16) -> (u16, bool) {
    let (code, body, _) = http(
        port,
        "GET /probes/readiness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    (code, body.contains("\"source_stalled\":true"))
}

fn status(rig: &EngineRig) -> Value {
    serde_json::to_value(rig.status.snapshot()).unwrap()
}

/// Polls `check` every 100 ms until it gives a value, for at most `bound`.
fn within<T>(what: &str, bound: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(started.elapsed() < bound, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until the engine applied everything the primary committed so far.
fn caught_up(rig: &EngineRig, bound: Duration) {
    let head = buckets::lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    rig.primary
        .sql("SELECT pg_logical_emit_message(false, 'powersync', 'caught up?')");
    within("the engine applying the primary's head", bound, || {
        let snap = status(rig);
        let applied = snap["replication"]["applied_lsn"].as_str()?;
        (buckets::lsn(applied) >= head).then_some(())
    });
}

/// Stops the engine and compares its store with the rules applied to the primary's rows.
fn assert_nothing_lost(mut rig: EngineRig, rows: usize) {
    rig.stop();
    let store = Store::open(&rig.storage_dir()).unwrap();
    let rules = buckets::rules_for(&store, TODOS_RULES);
    let conn = SourceConnection::from_uri(&rig.primary.uri("postgres")).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let expected = runtime.block_on(buckets::expected(&conn, &rules, &["todos"]));
    let stored = buckets::stored(&store);
    assert_eq!(stored.values().map(|r| r.len()).sum::<usize>(), rows);
    let diff = buckets::diff(&stored, &expected);
    assert!(diff.is_empty(), "{diff}");
}

/// Before: one connection behind a mutex, no query timeout — the first request waited
/// on the swallowed query forever and every other one behind it.
#[test]
fn write_checkpoints_answer_within_their_deadline_while_the_primary_is_unreachable() {
    let rig = EngineRig::start_proxied(
        TODOS_SCHEMA,
        TODOS_RULES,
        "psm_wc_blackhole",
        &[],
        |_| {},
        |_| {},
    );
    rig.wait_phase(status::Phase::Streaming);
    // The head's connection is open when the network stops.
    assert_eq!(write_checkpoint(rig.port, "u0").0, 200);
    let proxy = rig.proxy.as_ref().unwrap();
    proxy.blackhole(true);

    const N: usize = 12;
    let port = rig.port;
    let started = Instant::now();
    let answers: Vec<(u16, String, Duration)> = (0..N)
        .map(|i| std::thread::spawn(move || write_checkpoint(port, &format!("u{}", i + 1))))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let all = started.elapsed();
    let bound = source::HEAD_DEADLINE + Duration::from_secs(2);
    for (code, body, took) in &answers {
        assert_eq!(*code, 503, "{body} after {took:?}");
        let error: Value = serde_json::from_str(body).unwrap();
        assert_eq!(error["error"]["code"], "PSM_H1503", "{body}");
        assert_eq!(error["error"]["status"], 503, "{body}");
        assert!(*took < bound, "answered after {took:?}: {body}");
    }
    assert!(all < bound, "{N} requests took {all:?}");
    println!(
        "{N} write checkpoints answered 503 within {all:?} (slowest {:?})",
        answers.iter().map(|a| a.2).max().unwrap()
    );

    // The network forwards again: write checkpoints succeed once the failure is forgotten.
    proxy.blackhole(false);
    let waited = Instant::now();
    within(
        "a write checkpoint after the network came back",
        source::FAIL_FAST_FOR + source::HEAD_DEADLINE * 2,
        || (write_checkpoint(rig.port, "u0").0 == 200).then_some(()),
    );
    println!(
        "write checkpoints succeed again {:?} after",
        waited.elapsed()
    );
}

/// Before: the probes stayed green and `status()` had nothing to show while nothing
/// arrived from the primary.
#[test]
fn a_network_that_stops_forwarding_while_streaming_is_shown_and_left_without_loss() {
    let rig = EngineRig::start_proxied(
        TODOS_SCHEMA,
        TODOS_RULES,
        "psm_stream_blackhole",
        &["wal_sender_timeout = '10s'".to_owned()],
        |_| {},
        |config| config.service.source.bounds = BOUNDS,
    );
    rig.wait_phase(status::Phase::Streaming);
    let p = &rig.primary;
    p.sql("INSERT INTO todos VALUES ('a1', 'before the blackhole')");
    caught_up(&rig, RECOVERY);
    assert_eq!(readiness(rig.port), (200, false));
    assert_eq!(status(&rig)["replication"]["source_stalled"], false);

    let proxy = rig.proxy.as_ref().unwrap();
    let began = Instant::now();
    proxy.blackhole(true);
    p.sql("INSERT INTO todos VALUES ('a2', 'during the blackhole')");
    p.sql("UPDATE todos SET title = 'changed during the blackhole' WHERE id = 't5'");
    p.sql("DELETE FROM todos WHERE id = 't6'");
    within(
        "the readiness probe and status() to show the stall",
        BLACKHOLE,
        || {
            let snap = status(&rig);
            // Still served: load balancers keep the replica (the probe's official meaning).
            (snap["replication"]["source_stalled"] == true && readiness(rig.port) == (200, true))
                .then_some(())
        },
    );
    let shown = began.elapsed();
    let snap = status(&rig);
    assert!(snap["replication"]["source_heard_at"].as_u64().is_some());
    assert_eq!(snap["ready"], true, "what is stored is still served");
    std::thread::sleep(BLACKHOLE.saturating_sub(began.elapsed()));

    proxy.blackhole(false);
    let returned = Instant::now();
    p.sql("INSERT INTO todos VALUES ('a3', 'after the blackhole')");
    caught_up(&rig, RECOVERY);
    let back = returned.elapsed();
    within("the probe's stall gone", Duration::from_secs(5), || {
        (readiness(rig.port) == (200, false)).then_some(())
    });
    assert_eq!(status(&rig)["replication"]["source_stalled"], false);
    println!(
        "blackhole of {BLACKHOLE:?}: stall shown after {shown:?}, replication back {back:?} \
         after the network returned"
    );
    assert_nothing_lost(rig, 3002);
}

/// Before: the initial copy waited for its rows forever (the bootstrap never ended).
#[test]
fn a_copy_whose_network_stops_ends_in_its_code_and_recovers() {
    let rig = EngineRig::start_proxied(
        TODOS_SCHEMA,
        TODOS_RULES,
        "psm_copy_blackhole",
        &[],
        |proxy| proxy.stall_when_client_sends(Some("COPY ")),
        |config| {
            config.service.source.bounds = SourceBounds {
                stall_after: Duration::from_secs(5),
                ..BOUNDS
            }
        },
    );
    let proxy = rig.proxy.as_ref().unwrap();
    within("the COPY under way", Duration::from_secs(60), || {
        (proxy.stalled_on_sending() > 0).then_some(())
    });
    // The network stops altogether while the copy waits for its rows.
    proxy.stall_when_client_sends(None);
    proxy.blackhole(true);
    let began = Instant::now();
    let error = within("the copy's coded error", Duration::from_secs(30), || {
        let snap = status(&rig);
        let error = snap["last_error"].clone();
        (error["code"] == "PSM_R3003").then_some(error)
    });
    let failed_after = began.elapsed();
    assert_eq!(error["needs_operator"], false, "{error}");
    assert!(
        error["message"].as_str().unwrap().contains("COPY"),
        "{error}"
    );
    assert_eq!(status(&rig)["ready"], false);
    std::thread::sleep(Duration::from_secs(20).saturating_sub(began.elapsed()));

    proxy.blackhole(false);
    let returned = Instant::now();
    within("the engine streaming", RECOVERY, || {
        (rig.status.snapshot().phase == status::Phase::Streaming).then_some(())
    });
    let back = returned.elapsed();
    println!("the copy failed {failed_after:?} into the stall; streaming {back:?} after the network returned");
    assert_nothing_lost(rig, 3000);
}

/// The network stops just as the bootstrap checks the primary (before any copy). Before:
/// the check waited for its answer forever.
#[test]
fn a_bootstrap_whose_checks_get_no_answer_ends_in_its_code_and_recovers() {
    let rig = EngineRig::start_proxied(
        TODOS_SCHEMA,
        TODOS_RULES,
        "psm_checks_blackhole",
        &[],
        |proxy| proxy.stall_when_client_sends(Some("SHOW wal_level")),
        |config| {
            config.service.source.bounds = SourceBounds {
                stall_after: Duration::from_secs(5),
                ..BOUNDS
            }
        },
    );
    let proxy = rig.proxy.as_ref().unwrap();
    within("the checks under way", Duration::from_secs(60), || {
        (proxy.stalled_on_sending() > 0).then_some(())
    });
    proxy.stall_when_client_sends(None);
    let error = within("the checks' coded error", Duration::from_secs(30), || {
        let error = status(&rig)["last_error"].clone();
        (error["code"] == "PSM_R3003").then_some(error)
    });
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("the checks of the primary"),
        "{error}"
    );
    within("the engine streaming", RECOVERY, || {
        (rig.status.snapshot().phase == status::Phase::Streaming).then_some(())
    });
    assert_nothing_lost(rig, 3000);
}
