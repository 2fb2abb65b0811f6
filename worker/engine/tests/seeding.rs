//! Seeding from a peer in-process: a peer that cannot serve this replica (another secret,
//! other rules) leaves no slot on the primary and waits for the operator; a peer that
//! accepts the connection and never answers is given up within the deadline, again
//! without a slot; a peer that serves seeds the replica.
use crate::engine_rig;

use std::sync::Arc;
use std::time::Duration;

use engine::{Engine, EngineHandle};
use engine_rig::{engine_config, EngineRig, TODOS_RULES, TODOS_SCHEMA};
use status::{Phase, StatusCell};
use testkit::{free_port, wait_for};

const FLEET_SECRET: &str = "a-fleet-secret-of-enough-bytes";
const SEEDER_SLOT: &str = "psm_seeder";

/// The peer: an engine that serves copies on its sync port to this host.
fn peer() -> EngineRig {
    EngineRig::start_edited(TODOS_SCHEMA, TODOS_RULES, "psm_peer", "", |config| {
        config.fleet.peer_secret = Some(engine::PeerSecret::new(FLEET_SECRET.into()));
        config.fleet.peer_loopback = true;
    })
}

/// A second engine on `rig`'s primary with `rules`, seeding from `port` with `secret`.
struct Seeder {
    engine: Option<EngineHandle>,
    status: Arc<StatusCell>,
    _store: tempfile::TempDir,
}

impl Seeder {
    fn start(rig: &EngineRig, rules: &str, secret: &str, port: u16) -> Self {
        let store = tempfile::tempdir().unwrap();
        let mut config = engine_config(
            &rig.primary,
            store.path(),
            free_port(),
            rules,
            SEEDER_SLOT,
            "",
        );
        config.fleet.peer_secret = Some(engine::PeerSecret::new(secret.into()));
        config.fleet.seed_from =
            Some(config::SeedPeer::parse(&format!("http://127.0.0.1:{port}")).unwrap());
        let status = Arc::new(StatusCell::new(std::process::id()));
        let engine = Engine::start(config, status.clone()).unwrap();
        Self {
            engine: Some(engine),
            status,
            _store: store,
        }
    }

    /// Waits for an error with `code` in the status; returns it and whether it waits for
    /// the operator.
    fn error(&self, code: &str) -> (String, bool) {
        wait_for(&format!("the seeding to report {code}"), || {
            let snap = self.status.snapshot();
            match &snap.last_error {
                Some(e) if e.code == code => Ok((e.message.clone(), e.needs_operator)),
                other => Err(format!(
                    "{:?} {:?}",
                    snap.phase,
                    other.as_ref().map(|e| &e.message)
                )),
            }
        })
    }
}

impl Drop for Seeder {
    fn drop(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.shutdown(Duration::from_secs(5));
        }
    }
}

/// The seeder's slots on the primary.
fn seeder_slots(rig: &EngineRig) -> String {
    rig.primary.sql(&format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE '{SEEDER_SLOT}%'"
    ))
}

#[test]
fn a_peer_that_refuses_the_secret_or_serves_other_rules_leaves_no_slot_behind() {
    let rig = peer();
    let wrong = Seeder::start(
        &rig,
        TODOS_RULES,
        "another-secret-of-enough-bytes",
        rig.port,
    );
    let (message, operator) = wrong.error("PSM_B1029");
    assert!(operator && message.contains("401"), "{message}");
    assert_eq!(seeder_slots(&rig), "0", "a slot was left behind: {message}");
    drop(wrong);

    let other_rules = format!("{TODOS_RULES}  again:\n    data:\n      - SELECT id FROM todos\n");
    let other = Seeder::start(&rig, &other_rules, FLEET_SECRET, rig.port);
    let (message, operator) = other.error("PSM_B1025");
    assert!(operator, "{message}");
    assert_eq!(seeder_slots(&rig), "0", "a slot was left behind: {message}");
    drop(other);

    let seeded = Seeder::start(&rig, TODOS_RULES, FLEET_SECRET, rig.port);
    wait_for("the seeded replica streams", || {
        let snap = seeded.status.snapshot();
        if snap.phase == Phase::Streaming {
            Ok(())
        } else {
            Err(format!(
                "{:?} {:?}",
                snap.phase,
                snap.last_error.map(|e| e.message)
            ))
        }
    });
    assert_eq!(seeder_slots(&rig), "1");
}

#[test]
fn a_peer_that_never_answers_is_given_up_within_the_deadline_without_a_slot() {
    let rig = peer();
    // Connections complete in the kernel's backlog; nothing is ever read or answered.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let seeder = Seeder::start(&rig, TODOS_RULES, FLEET_SECRET, port);
    let (message, operator) = seeder.error("PSM_B1028");
    assert!(!operator && message.contains("did not answer"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(seeder_slots(&rig), "0", "a slot waits for a silent peer");
}
