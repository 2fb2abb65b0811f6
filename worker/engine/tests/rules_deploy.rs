//! Live tests of rules deploys: the engine in-process against a real primary, a client
//! connected throughout. Changed rules are deployed inside the served store (the tables
//! they read differently copied again) while it keeps serving and following the primary;
//! the client moves over through a `checkpoint_diff`, downloads again only the buckets of
//! definitions that changed, and ends holding exactly the new rules' rows. A change of
//! edition builds a new generation beside the served one, whose slot and files then go.
//! Invalid rules change nothing; a crash during a deploy recovers.
use crate::engine_rig;
use crate::sync_client;

use std::collections::BTreeMap;
use testkit::Waiting;

use engine_rig::{token, token_with_claims, EngineRig};
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

/// V2 and a definition whose buckets the client does not get (its token has no team).
const RULES_V3: &str = "
bucket_definitions:
  mine:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, n FROM items WHERE owner = bucket.owner AND kind = 'a'
  my_notes:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT id, body FROM notes WHERE owner = bucket.owner
  by_team:
    parameters: SELECT request.jwt() ->> 'team' AS kind WHERE request.jwt() ->> 'team' IS NOT NULL
    data:
      - SELECT id FROM items WHERE kind = bucket.kind
";

/// Only the notes, under edition 2: every definition changes, so a new generation is built.
const RULES_V4: &str = "
config:
  edition: 2
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
    let mut names: Vec<&str> = client
        .announced
        .keys()
        .map(|b| b.split_once('#').map_or(b.as_str(), |(_, rest)| rest))
        .collect();
    names.sort();
    names
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

fn rules_hash(text: &str) -> String {
    rules::SyncRules::parse(text).unwrap().content_hash_hex()
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

    deploy_in_the_served_store(&rig, &mut client, &mut lines, &v1_names);
    let v2_names =
        follow_and_deploy_what_this_client_does_not_get(&rig, &mut client, &mut lines, &t);
    invalid_rules_change_nothing(&rig, &mut client, &mut lines);
    a_new_edition_is_built_beside_and_survives_a_crash(&mut rig, lines, &t, &v2_names);
}

/// v2, deployed inside the served store while the primary changes: the client moves
/// over, and no new generation, slot or file remains.
fn deploy_in_the_served_store(
    rig: &EngineRig,
    client: &mut Client,
    lines: &mut Lines,
    v1_names: &[String],
) {
    // Deploy v2 while the primary keeps changing: inside the served store, which keeps
    // following the primary. `mine` changed: its bucket has a new name, the old one is
    // removed; `my_notes` is new.
    rig.deploy_rules(RULES_V2);
    rig.primary.sql(
        "UPDATE items SET kind = 'a' WHERE id IN ('i2', 'i4');
         INSERT INTO notes VALUES ('n-new', 'u1', 'written during the build');",
    );
    until_buckets(
        rig,
        lines,
        client,
        &[r#"mine["u1"]"#, r#"my_notes["u1"]"#],
        v1_names,
    );
    wait_for(rig, "the deploy to end", || {
        rig.status.snapshot().rules_hash == Some(rules_hash(RULES_V2))
    });
    let status = rig.status.snapshot();
    assert_eq!(status.generation, Some(1), "{status:?}");
    assert!(status.deploy.is_none(), "{status:?}");
    assert_eq!(status.last_deploy.as_ref().unwrap().generation, 1);
    assert!(status.ready);
    let mut want = expected(
        rig,
        "SELECT id, n FROM items WHERE owner = 'u1' AND kind = 'a'",
    );
    want.extend(expected(
        rig,
        "SELECT id, body FROM notes WHERE owner = 'u1'",
    ));
    assert!(want.contains_key("n-new") && want.contains_key("i2"));
    assert_eq!(held(client), want);
    // No new generation: the re-copies' temporary slots are gone, the store is the one.
    wait_for(rig, "only the served slot to remain", || {
        slots(rig) == vec![SLOT.to_owned()]
    });
    assert!(!store_entries(rig)
        .iter()
        .any(|e| e.starts_with('g') && e != "generation"));
}

/// The deployed rules are followed; then v3, which only adds a definition this client
/// does not get, reaches it as nothing but the next write. Returns the buckets v2 named.
fn follow_and_deploy_what_this_client_does_not_get(
    rig: &EngineRig,
    client: &mut Client,
    lines: &mut Lines,
    t: &str,
) -> BTreeMap<String, u32> {
    // The deployed rules are followed.
    rig.primary.sql(
        "INSERT INTO items VALUES ('i-late', 'u1', 'a', 7); DELETE FROM notes WHERE id = 'n1';",
    );
    wait_for(rig, "the change to arrive", || {
        client.apply(&lines.until_complete());
        let rows = held(client);
        rows.contains_key("i-late") && !rows.contains_key("n1")
    });

    // A deploy that only adds a definition this client does not get: `items` is copied
    // again for it, and the client, connected throughout, receives no data line and keeps
    // its bucket names, positions and checksums (checked at every checkpoint_complete).
    let v2_names = client.announced.clone();
    rig.deploy_rules(RULES_V3);
    wait_for(rig, "the deploy of v3 to switch", || {
        rig.status.snapshot().rules_hash == Some(rules_hash(RULES_V3))
    });
    rig.primary
        .sql("INSERT INTO notes VALUES ('n-after-v3', 'u1', 'x');");
    let mut data_lines = 0;
    let mut waiting = Waiting::new("a write after the deploy of v3");
    while !held(client).contains_key("n-after-v3") {
        waiting.progress(rig.progress());
        let batch = lines.until_complete();
        data_lines += batch.iter().filter(|l| l.get("data").is_some()).count();
        client.apply(&batch);
        assert!(
            client.announced.keys().eq(v2_names.keys()),
            "the buckets stay as they were"
        );
    }
    assert_eq!(
        data_lines, 1,
        "only the write after the deploy reached the client"
    );
    let (fresh, _fresh_lines) = connect(rig, t);
    assert_eq!(fresh.announced, client.announced);
    assert_eq!(held(&fresh), held(client));
    let team = token_with_claims(&[("sub", "u9"), ("team", "a")], 3600);
    let (by_team, _team_lines) = connect(rig, &team);
    let team_bucket = by_team.named(r#"by_team["a"]"#).unwrap();
    let team_rows: BTreeMap<String, Value> = by_team
        .rows(&team_bucket)
        .into_iter()
        .map(|(id, data)| (id, serde_json::from_str(&data).unwrap()))
        .collect();
    assert_eq!(
        team_rows,
        expected(rig, "SELECT id FROM items WHERE kind = 'a'")
    );

    v2_names
}

/// Invalid rules, deployed: the served rules and the stream go on.
fn invalid_rules_change_nothing(rig: &EngineRig, client: &mut Client, lines: &mut Lines) {
    // Invalid rules change nothing: the error shows, v3 keeps serving.
    rig.deploy_rules("bucket_definitions:\n  b:\n    data: [SELECT FROM]\n");
    wait_for(rig, "the rules error", || {
        rig.status
            .snapshot()
            .last_error
            .is_some_and(|e| e.code == "PSM_C1010")
    });
    let status = rig.status.snapshot();
    assert_eq!(status.rules_hash, Some(rules_hash(RULES_V3)));
    assert!(status.deploy.is_none() && status.ready);
    rig.primary
        .sql("INSERT INTO notes VALUES ('n-after-invalid', 'u1', 'x');");
    wait_for(rig, "the change to arrive", || {
        client.apply(&lines.until_complete());
        held(client).contains_key("n-after-invalid")
    });
}

/// v4, a new edition, built as a new generation beside the served one; a crash during
/// its build is recovered from, and only the new generation's slot and store remain.
fn a_new_edition_is_built_beside_and_survives_a_crash(
    rig: &mut EngineRig,
    lines: Lines,
    t: &str,
    v2_names: &BTreeMap<String, u32>,
) {
    // A change of edition renames every bucket: a new generation is built beside the
    // served one. A crash during its build: the restarted engine serves v3 from its own
    // stored rules, resumes the build (the same generation) and switches. A long
    // transaction on the primary holds the build while it creates its slot (its bootstrap
    // record is written by then), so the crash comes at that step every run.
    let long_transaction = rig.primary.hold_transaction("SELECT pg_current_xact_id()");
    rig.deploy_rules(RULES_V4);
    let slot_g2 = format!("{SLOT}_g2");
    wait_for(rig, "the build to create its slot", || {
        rig.status.snapshot().deploy.is_some() && slots(rig).contains(&slot_g2)
    });
    rig.stop();
    drop(lines);
    // The slot's creation ends with the long transaction; its walsender then finds the
    // engine gone.
    long_transaction.commit();
    wait_for(rig, "the interrupted slot creation to end", || {
        rig.primary.sql(&format!(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot_g2}' AND active"
        )) == "0"
    });
    rig.start_with_rules(RULES_V4);
    rig.wait_phase(Phase::Streaming);
    wait_for(rig, "the resumed deploy to switch", || {
        rig.status.snapshot().generation == Some(2)
    });
    let (fresh, _lines) = connect(rig, t);
    assert_eq!(untagged(&fresh), vec![r#"my_notes["u1"]"#]);
    assert!(!v2_names.contains_key(fresh.announced.keys().next().unwrap()));
    assert_eq!(
        held(&fresh),
        expected(rig, "SELECT id, owner, body FROM notes WHERE owner = 'u1'")
    );
    wait_for(
        rig,
        "only the new generation's slot and store to remain",
        || {
            slots(rig) == vec![slot_g2.clone()]
                && store_entries(rig) == vec!["active", "g2", "generation"]
        },
    );
}

#[test]
fn a_deploy_in_the_served_store_interrupted_by_a_stop_is_resumed_or_abandoned() {
    let mut rig = EngineRig::start(SCHEMA, RULES_V1, "psm_deploy_resume");
    let t = token("u1", 3600);
    // A long transaction holds the deploy's re-copies (their temporary slots wait for
    // it), so the stop comes while the deploy is recorded and unfinished.
    let stop_during = |rig: &mut EngineRig, rules: &str| {
        let long_transaction = rig.primary.hold_transaction("SELECT pg_current_xact_id()");
        rig.deploy_rules(rules);
        wait_for(rig, "the deploy to be under way", || {
            rig.status
                .snapshot()
                .deploy
                .is_some_and(|d| d.in_place && d.tables_done < d.tables_total)
        });
        rig.stop();
        long_transaction.commit();
    };

    // Started again with the same rules: the deploy its store records goes on.
    stop_during(&mut rig, RULES_V2);
    rig.primary
        .sql("INSERT INTO notes VALUES ('n-while-stopped', 'u1', 'x');");
    rig.start_with_rules(RULES_V2);
    wait_for(&rig, "the resumed deploy to end", || {
        let s = rig.status.snapshot();
        s.rules_hash == Some(rules_hash(RULES_V2)) && s.deploy.is_none()
    });
    let (client, _lines) = connect(&rig, &t);
    assert_eq!(
        untagged(&client),
        vec![r#"mine["u1"]"#, r#"my_notes["u1"]"#]
    );
    let mut want = expected(
        &rig,
        "SELECT id, n FROM items WHERE owner = 'u1' AND kind = 'a'",
    );
    want.extend(expected(
        &rig,
        "SELECT id, body FROM notes WHERE owner = 'u1'",
    ));
    assert!(want.contains_key("n-while-stopped"));
    assert_eq!(held(&client), want);
    assert_eq!(rig.status.snapshot().generation, Some(1));

    // Started again with the served rules: the deploy is abandoned, they keep serving
    // (the tables it marked are copied again under them: nothing changes for a client).
    stop_during(&mut rig, RULES_V3);
    rig.start_with_rules(RULES_V2);
    rig.wait_phase(Phase::Streaming);
    wait_for(&rig, "the abandoned deploy's re-copies to end", || {
        let s = rig.status.snapshot();
        s.deploy.is_none()
            && s.replication
                .is_some_and(|r| r.recopying == 0 && r.last_op_id > 0)
    });
    assert_eq!(rig.status.snapshot().rules_hash, Some(rules_hash(RULES_V2)));
    let (after, _lines) = connect(&rig, &t);
    assert_eq!(
        after.announced.keys().collect::<Vec<_>>(),
        client.announced.keys().collect::<Vec<_>>()
    );
    assert_eq!(held(&after), want);
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
    let (status, mut lines) = post(
        rig.port,
        Some(t),
        "application/x-ndjson",
        r#"{"raw_data":true}"#,
    );
    assert_eq!(status, 200);
    let mut client = Client::default();
    client.apply(&lines.until_complete());
    (client, lines)
}

/// Rules deployed inside the served store add a wildcard table: the tables it matches that
/// the store did not follow are copied, and one created afterwards reaches the connected
/// client too.
#[test]
fn a_deployed_wildcard_table_copies_the_tables_it_matches_and_follows_new_ones() {
    const SCHEMA: &str = "
        CREATE TABLE items (id text PRIMARY KEY, owner text NOT NULL, kind text NOT NULL, n int);
        CREATE TABLE archive_2024 (id text PRIMARY KEY, body text);
        CREATE PUBLICATION powersync FOR ALL TABLES;
        INSERT INTO items VALUES ('i1', 'u1', 'a', 1), ('i2', 'u2', 'b', 2);
        INSERT INTO archive_2024 VALUES ('old1', 'x'), ('old2', 'y');
    ";
    let with_archive = format!(
        "{RULES_V1}  archive:\n    data:\n      - SELECT id, _table_suffix AS year FROM \"archive_%\"\n"
    );
    let rig = EngineRig::start(SCHEMA, RULES_V1, SLOT);
    let (mut client, mut lines) = connect(&rig, &token("u1", 3600));
    assert_eq!(untagged(&client), vec![r#"mine["u1"]"#]);

    rig.deploy_rules(&with_archive);
    until_buckets(
        &rig,
        &mut lines,
        &mut client,
        &["archive[]", r#"mine["u1"]"#],
        &[],
    );
    wait_for(&rig, "the deploy to end", || {
        rig.status.snapshot().rules_hash == Some(rules_hash(&with_archive))
    });
    let mine = "SELECT id, owner, kind, n FROM items WHERE owner = 'u1'";
    let archived = |tables: &[&str]| {
        tables
            .iter()
            .map(|t| format!("SELECT id, substr('{t}', 9) AS year FROM {t}"))
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    };
    let mut want = expected(&rig, mine);
    want.extend(expected(&rig, &archived(&["archive_2024"])));
    assert_eq!(held(&client), want);

    rig.primary.sql(
        "CREATE TABLE archive_2025 (id text PRIMARY KEY, body text);
         INSERT INTO archive_2025 VALUES ('new1', 'z');",
    );
    let mut want = expected(&rig, mine);
    want.extend(expected(&rig, &archived(&["archive_2024", "archive_2025"])));
    assert!(want.contains_key("new1"));
    wait_for(&rig, "the new table's rows at the client", || {
        client.apply(&lines.until_complete());
        held(&client) == want
    });
}
