//! Serving outlives ingest (`docs/operations.md`, section 5.8): a replica whose store holds
//! a complete snapshot serves its last checkpoint to open streams and new clients while its
//! ingest cannot run — restarted while its primary is down, or waiting for the operator
//! after a source change it cannot follow — and write checkpoints, which need the ingest,
//! get a retryable 503 at once. (The full disk: `disk_full.rs`.)
use crate::engine_rig;
use crate::sync_client;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use engine_rig::{token, EngineRig, TODOS_RULES, TODOS_SCHEMA};
use status::Phase;
use sync_client::{first_checkpoint, rows_of, Lines};
use testkit::wait_for;

/// A write checkpoint that waited for the primary takes its 5 s deadline (`source::head`);
/// one refused because no ingest runs is answered at once, in milliseconds on any machine.
const NO_PRIMARY_WAIT: Duration = Duration::from_secs(5);

/// `GET /write-checkpoint2.json` for `user`: the status code and how long the answer took.
fn write_checkpoint(port: u16, user: &str) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = format!(
        "GET /write-checkpoint2.json?client_id=c HTTP/1.1\r\nHost: x\r\n\
         Authorization: Token {}\r\nConnection: close\r\n\r\n",
        token(user, 600)
    );
    s.write_all(request.as_bytes()).unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let code = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    (code, started.elapsed())
}

/// The rows a new client gets, once they hold `id`.
fn rows_once_holding(rig: &EngineRig, id: &str) -> std::collections::BTreeMap<String, String> {
    wait_for(&format!("a client to get {id}"), || {
        let (_, client, _) = first_checkpoint(rig.port, "u1");
        let rows = rows_of(&client, "everything[]");
        if rows.contains_key(id) {
            Ok(rows)
        } else {
            Err(rows.len())
        }
    })
}

/// True when the server has not closed `stream` (nothing to read within a second is fine).
pub fn still_open(stream: &mut Lines) -> bool {
    let socket = stream.reader.get_ref();
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut byte = [0u8; 1];
    let open = match socket.peek(&mut byte) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    socket
        .set_read_timeout(Some(testkit::Patience::of_run().stall))
        .unwrap();
    open
}

#[test]
fn a_replica_restarted_while_its_primary_is_down_serves_its_last_checkpoint() {
    let mut rig = EngineRig::start(TODOS_SCHEMA, TODOS_RULES, "psm_primary_down");
    rig.primary
        .sql("INSERT INTO todos VALUES ('x1', 'before the primary stopped')");
    let before = rows_once_holding(&rig, "x1");
    rig.stop();
    rig.primary.stop_fast();

    rig.start_with_rules(TODOS_RULES);
    let started = Instant::now();
    wait_for("the restarted engine to serve", || {
        let snap = rig.status.snapshot();
        if snap.ready {
            Ok(())
        } else {
            Err(format!("{:?}", snap.phase))
        }
    });
    let (took, client, mut open) = first_checkpoint(rig.port, "u1");
    println!(
        "primary down: served {:?} after the engine's start, a new client's first checkpoint \
         took {took:?}",
        started.elapsed()
    );
    assert_eq!(
        rows_of(&client, "everything[]"),
        before,
        "the last checkpoint, whole"
    );
    let snap = rig.status.snapshot();
    assert_eq!(snap.phase, Phase::Validating, "{:?}", snap.last_error);
    assert!(snap.ingest.running);
    let (code, answered) = write_checkpoint(rig.port, "u1");
    assert_eq!(code, 503, "a write checkpoint needs the ingest");
    assert!(
        answered < NO_PRIMARY_WAIT,
        "answered without waiting for the primary: {answered:?}"
    );

    // The primary returns: the ingest streams again, and the client connected during the
    // outage gets what is written after.
    rig.primary.start();
    rig.wait_phase(Phase::Streaming);
    rig.primary
        .sql("INSERT INTO todos VALUES ('x2', 'after the primary returned')");
    let mut kept = client;
    wait_for("the open stream to get x2", || {
        kept.apply(&open.until_complete());
        let rows = rows_of(&kept, "everything[]");
        if rows.contains_key("x2") {
            Ok(())
        } else {
            Err(rows.len())
        }
    });
    assert_eq!(write_checkpoint(rig.port, "u1").0, 200);
}

#[test]
fn an_ingest_waiting_for_the_operator_keeps_serving_its_last_checkpoint() {
    let rig = EngineRig::start(TODOS_SCHEMA, TODOS_RULES, "psm_operator_wait");
    rig.primary
        .sql("INSERT INTO todos VALUES ('x1', 'before the change')");
    let before = rows_once_holding(&rig, "x1");
    let (_, _, mut open) = first_checkpoint(rig.port, "u1");

    // A change the stream cannot follow: it stops and waits for the operator.
    rig.primary
        .sql("ALTER TABLE todos REPLICA IDENTITY NOTHING");
    rig.primary
        .sql("INSERT INTO todos VALUES ('x2', 'after the replica identity went')");
    let error = wait_for("the ingest to wait for the operator", || {
        let snap = rig.status.snapshot();
        match snap.last_error.clone() {
            Some(e) if e.needs_operator && !snap.ingest.running => Ok((e, snap)),
            other => Err(format!("{:?} {:?}", snap.phase, other.map(|e| e.code))),
        }
    });
    let (error, snap) = error;
    assert_eq!(error.code, "PSM_R2002", "{}", error.message);
    assert!(error
        .message
        .contains("the last checkpoint is still served"));
    assert_eq!(snap.phase, Phase::Failed);
    assert!(snap.ready, "still served");
    assert!(snap.ingest.waiting_for_operator);

    assert!(still_open(&mut open), "the open stream was closed");
    let (took, client, _) = first_checkpoint(rig.port, "u2");
    println!("waiting for the operator: a new client's first checkpoint took {took:?}");
    assert_eq!(
        rows_of(&client, "everything[]"),
        before,
        "the last checkpoint, whole"
    );
    let (code, answered) = write_checkpoint(rig.port, "u2");
    assert_eq!(code, 503, "a write checkpoint needs the ingest");
    assert!(
        answered < NO_PRIMARY_WAIT,
        "answered without waiting for the primary: {answered:?}"
    );
    let probe = testkit::http_get(rig.port, "/probes/readiness").expect("the probe answers");
    assert_eq!(probe.status, 200, "{}", probe.body);
    assert!(
        probe.body.contains("\"ingest_running\":false"),
        "{}",
        probe.body
    );

    // The operator reloads: the ingest starts again (and meets the same change again).
    rig.deploy_rules(TODOS_RULES);
    wait_for("the ingest to start again on reload", || {
        let snap = rig.status.snapshot();
        if snap.ingest.restarts == 1 {
            Ok(())
        } else {
            Err(snap.ingest.restarts)
        }
    });
    assert!(still_open(&mut open), "the open stream was closed");
}
