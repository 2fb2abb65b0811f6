//! Live tests of rules deploys: the engine in-process against a real primary, a client
//! connected throughout. Changed rules are built into a new generation beside the served
//! one while it keeps serving and following the primary; the client moves over through a
//! `checkpoint_diff` and ends holding exactly the new rules' rows; the old generation's
//! slot and files go. Invalid rules change nothing; a crash during the build recovers.
use crate::engine_rig;
use crate::sync_client;

use std::collections::BTreeMap;
use testkit::Waiting;

use engine_rig::{token, EngineRig};
use serde_json::Value;
use status::Phase;
use sync_client::{post, Client, Lines};

const SLOT: &str = "psm_deploy_test";

const SCHEMA: &str = "
CREATE TABLE items (id text PRIMARY KEY, owner text NOT NULL, kind text NOT NULL, n int);
CREATE TABLE notes (id text PRIMARY KEY, owner text NOT NULL, body text);
CREATE PUBLICATION powersync FOR TABLE items, notes;
INSERT INTO items SELECT 'i' || g, CASE WHEN g % 2 = 0 THEN 'u1' ELSE 'u2' END,
  CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END, g FROM generate_series(1, 3000) g;
INSERT INTO notes SELECT 'n' || g, 'u1', 'note ' || g FROM generate_series(1, 50) g;
";

/// Served first: every item of the user.
const RULES_V1: &str = "
bucket_definitions:
  mine:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, owner, kind, n FROM items WHERE owner = bucket.owner
";

/// A changed filter and column list, and an added definition.
const RULES_V2: &str = "
bucket_definitions:
  mine:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, n FROM items WHERE owner = bucket.owner AND kind = 'a'
  my_notes:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, body FROM notes WHERE owner = bucket.owner
";

/// Only the notes.
const RULES_V3: &str = "
bucket_definitions:
  my_notes:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, owner, body FROM notes WHERE owner = bucket.owner
";

/// Reads lines until a `checkpoint_complete` after which the client holds exactly the
/// buckets `want` names (by definition, `name[...]` after the tag) and none of `gone`
/// (full names); applies every line to `client`.
fn until_buckets(
    rig: &EngineRig,
    lines: &mut Lines,
    client: &mut Client,
    want: &[&str],
    gone: &[String],
) {
    let mut waiting = Waiting::new(format!("a checkpoint of buckets {want:?}"));
    loop {
        waiting.progress(rig.progress());
        let batch = lines.until_complete();
        client.apply(&batch);
        if untagged(client) == want && !gone.iter().any(|g| client.announced.contains_key(g)) {
            return;
        }
    }
}

/// The client's bucket names without their tags (`mine["u1"]`), sorted.
fn untagged(client: &Client) -> Vec<&str> {
    client
        .announced
        .keys()
        .map(|b| b.split_once('#').map_or(b.as_str(), |(_, rest)| rest))
        .collect()
}

/// The rows the client holds in every bucket, by id (data JSON).
fn held(client: &Client) -> BTreeMap<String, Value> {
    let mut rows = BTreeMap::new();
    for bucket in client.announced.keys() {
        for (id, data) in client.rows(bucket) {
            rows.insert(id, serde_json::from_str(&data).unwrap());
        }
    }
    rows
}

/// `sql` (one JSON object per row, with `id`) from the primary, by id.
fn expected(rig: &EngineRig, sql: &str) -> BTreeMap<String, Value> {
    let out = rig.primary.sql(&format!(
        "SELECT coalesce(json_agg(r), '[]') FROM ({sql}) r"
    ));
    let rows: Vec<Value> = serde_json::from_str(out.trim()).unwrap();
    rows.into_iter()
        .map(|r| (r["id"].as_str().unwrap().to_owned(), r))
        .collect()
}

/// Waits while the engine advances until `done`.
fn wait_for(rig: &EngineRig, what: &str, mut done: impl FnMut() -> bool) {
    testkit::wait_for(what, || if done() { Ok(()) } else { Err(rig.progress()) });
}

fn slots(rig: &EngineRig) -> Vec<String> {
    rig.primary
        .sql("SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM pg_replication_slots")
        .trim()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn store_entries(rig: &EngineRig) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(rig.storage_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn a_connected_client_moves_to_each_deployed_generation() {
    let mut rig = EngineRig::start(SCHEMA, RULES_V1, SLOT);
    let t = token("u1", 3600);
    let (mut client, mut lines) = connect(&rig, &t);
    assert_eq!(untagged(&client), vec![r#"mine["u1"]"#]);
    let v1_names: Vec<String> = client.announced.keys().cloned().collect();
    assert_eq!(
        held(&client),
        expected(
            &rig,
            "SELECT id, owner, kind, n FROM items WHERE owner = 'u1'"
        )
    );

    // Deploy v2 while the primary keeps changing: the served generation follows. `mine`
    // changed: its bucket has a new name, the old one is removed.
    rig.deploy_rules(RULES_V2);
    rig.primary.sql(
        "UPDATE items SET kind = 'a' WHERE id IN ('i2', 'i4');
         INSERT INTO notes VALUES ('n-new', 'u1', 'written during the build');",
    );
    until_buckets(
        &rig,
        &mut lines,
        &mut client,
        &[r#"mine["u1"]"#, r#"my_notes["u1"]"#],
        &v1_names,
    );
    let status = rig.status.snapshot();
    assert_eq!(status.generation, Some(2), "{status:?}");
    assert!(status.deploy.is_none(), "{status:?}");
    assert_eq!(status.last_deploy.as_ref().unwrap().generation, 2);
    assert!(status.ready);
    let mut want = expected(
        &rig,
        "SELECT id, n FROM items WHERE owner = 'u1' AND kind = 'a'",
    );
    want.extend(expected(
        &rig,
        "SELECT id, body FROM notes WHERE owner = 'u1'",
    ));
    assert!(want.contains_key("n-new") && want.contains_key("i2"));
    assert_eq!(held(&client), want);
    // The old generation's slot and files go once nobody reads them (its data file
    // first, then its lock file).
    wait_for(&rig, "the old slot and store to go", || {
        slots(&rig) == vec![format!("{SLOT}_g2")]
            && store_entries(&rig) == vec!["active", "g2", "generation"]
    });

    // The new generation follows the primary.
    rig.primary.sql(
        "INSERT INTO items VALUES ('i-late', 'u1', 'a', 7); DELETE FROM notes WHERE id = 'n1';",
    );
    wait_for(&rig, "the change to arrive", || {
        client.apply(&lines.until_complete());
        let rows = held(&client);
        rows.contains_key("i-late") && !rows.contains_key("n1")
    });

    // Invalid rules change nothing: the error shows, v2 keeps serving.
    rig.deploy_rules("bucket_definitions:\n  b:\n    data: [SELECT FROM]\n");
    wait_for(&rig, "the rules error", || {
        rig.status
            .snapshot()
            .last_error
            .is_some_and(|e| e.code == "PSM_C1010")
    });
    let status = rig.status.snapshot();
    assert_eq!(status.generation, Some(2));
    assert!(status.deploy.is_none() && status.ready);
    rig.primary
        .sql("INSERT INTO notes VALUES ('n-after-invalid', 'u1', 'x');");
    wait_for(&rig, "the change to arrive", || {
        client.apply(&lines.until_complete());
        held(&client).contains_key("n-after-invalid")
    });

    // A crash during the build of v3: the restarted engine serves v2 from its own stored
    // rules, resumes the build (the same generation) and switches. A long transaction on
    // the primary holds the build while it creates its slot (its bootstrap record is
    // written by then), so the crash comes at that step every run.
    let long_transaction = rig.primary.hold_transaction("SELECT pg_current_xact_id()");
    rig.deploy_rules(RULES_V3);
    let slot_g3 = format!("{SLOT}_g3");
    wait_for(&rig, "the build to create its slot", || {
        rig.status.snapshot().deploy.is_some() && slots(&rig).contains(&slot_g3)
    });
    rig.stop();
    drop(lines);
    // The slot's creation ends with the long transaction; its walsender then finds the
    // engine gone.
    long_transaction.commit();
    wait_for(&rig, "the interrupted slot creation to end", || {
        rig.primary.sql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot_g3}' AND active"
        )) == "0"
    });
    rig.start_with_rules(RULES_V3);
    rig.wait_phase(Phase::Streaming);
    wait_for(&rig, "the resumed deploy to switch", || {
        rig.status.snapshot().generation == Some(3)
    });
    let (fresh, _lines) = connect(&rig, &t);
    assert_eq!(untagged(&fresh), vec![r#"my_notes["u1"]"#]);
    assert!(!client
        .announced
        .contains_key(fresh.announced.keys().next().unwrap()));
    assert_eq!(
        held(&fresh),
        expected(&rig, "SELECT id, owner, body FROM notes WHERE owner = 'u1'")
    );
    wait_for(&rig, "only the v3 slot to remain", || {
        slots(&rig) == vec![format!("{SLOT}_g3")] && !rig.storage_dir().join("g2").exists()
    });
}

#[test]
fn a_build_the_primary_cannot_serve_fails_and_the_served_rules_stay() {
    let rig = EngineRig::start(SCHEMA, RULES_V1, "psm_deploy_fail");
    rig.primary
        .sql("CREATE TABLE secrets (id text PRIMARY KEY, owner text);");
    // `secrets` is not in the publication: the build must fail, v1 keeps serving.
    rig.deploy_rules(
        "bucket_definitions:\n  s:\n    parameters: SELECT request.user_id() AS owner\n    \
         data:\n      - SELECT * FROM secrets WHERE owner = bucket.owner\n",
    );
    wait_for(&rig, "the build to fail", || {
        rig.status
            .snapshot()
            .deploy
            .is_some_and(|d| d.phase == status::DeployPhase::Failed)
    });
    let status = rig.status.snapshot();
    let deploy = status.deploy.unwrap();
    assert!(
        deploy
            .last_error
            .as_ref()
            .unwrap()
            .message
            .contains("secrets"),
        "{deploy:?}"
    );
    assert_eq!(status.generation, Some(1));
    assert!(status.ready);
    wait_for(&rig, "the failed build's files and slot to go", || {
        slots(&rig) == vec!["psm_deploy_fail".to_owned()] && !rig.storage_dir().join("g2").exists()
    });
    let t = token("u2", 3600);
    let (client, _lines) = connect(&rig, &t);
    assert_eq!(
        held(&client),
        expected(
            &rig,
            "SELECT id, owner, kind, n FROM items WHERE owner = 'u2'"
        )
    );
}

/// A new client connected with token `t` and synced to its first checkpoint, and the
/// stream it keeps reading.
fn connect(rig: &EngineRig, t: &str) -> (Client, Lines) {
    let (status, mut lines) = post(rig.port, Some(t), "application/x-ndjson", "{}");
    assert_eq!(status, 200);
    let mut client = Client::default();
    client.apply(&lines.until_complete());
    (client, lines)
}
