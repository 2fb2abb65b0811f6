//! The positions a client comes back with: beyond the checkpoint, unknown, further
//! along than the store, or of a history that forked away.

use super::*;

#[test]
fn positions_beyond_the_checkpoint_restart_and_unknown_buckets_are_ignored() {
    let mut db = Db::new();
    db.commit(vec![item("1", "cold", "a"), item("2", "hot", "b")]);
    let positions = [
        BucketPosition {
            name: "1#global[]".into(),
            after: 999,
        },
        BucketPosition {
            name: "1#nope[]".into(),
            after: 1,
        },
        BucketPosition {
            name: "1#hot[]".into(),
            after: 3,
        },
    ];
    let mut s = db
        .session(&positions, Budgets::default())
        .with_catch_up_hold(std::time::Duration::ZERO);
    let lines = json_lines(&db, &mut s, None);
    let cp = &lines[0]["checkpoint"];
    assert!(!cp.to_string().contains("nope"));
    assert_eq!(cp["last_op_id"], "3");
    let global: Vec<&Value> = lines
        .iter()
        .filter(|l| l["data"]["bucket"] == "1#global[]")
        .collect();
    assert_eq!(global.len(), 1);
    assert_eq!(
        global[0]["data"]["after"], "0",
        "a position above the head restarts"
    );
    assert!(
        !lines.iter().any(|l| l["data"]["bucket"] == "1#hot[]"),
        "hot is complete at its position"
    );
    assert_eq!(kind(lines.last().unwrap()), "checkpoint_complete");
}

#[test]
fn a_client_further_along_is_held_until_the_store_catches_up() {
    // A client that synced from a peer of the same history up to op 3 reconnects here,
    // where only op 1 is applied yet.
    let mut db = Db::new();
    db.commit(vec![item("1", "cold", "a")]);
    let positions = [BucketPosition {
        name: "1#global[]".into(),
        after: 3,
    }];
    let mut s = db.session(&positions, Budgets::default());
    assert!(
        json_lines(&db, &mut s, None).is_empty(),
        "no checkpoint older than the client's position"
    );
    assert!(s.is_unannounced());
    db.commit(vec![item("2", "cold", "b")]);
    assert!(
        json_lines(&db, &mut s, None).is_empty(),
        "still behind at op 2"
    );
    // Caught up (op 4): the checkpoint comes, with only the op after the client's position.
    db.commit(vec![item("3", "cold", "c"), item("4", "cold", "d")]);
    let lines = json_lines(&db, &mut s, None);
    assert_eq!(lines[0]["checkpoint"]["last_op_id"], "4");
    let data: Vec<&Value> = lines.iter().filter(|l| kind(l) == "data").collect();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["data"]["after"], "3");
    assert_eq!(data[0]["data"]["data"].as_array().unwrap().len(), 1);
    assert_eq!(kind(lines.last().unwrap()), "checkpoint_complete");
}

/// Two stores of one history (the same `commits` give the same op ids); then B writes
/// something of its own (a re-copy's merge, say: item 1 deleted), and its op ids fork away.
fn forked_pair(commits: &[Vec<Change>]) -> (Db, Db) {
    let (mut a, mut b) = (Db::new(), Db::new());
    for db in [&mut a, &mut b] {
        for changes in commits {
            db.commit(changes.clone());
        }
    }
    b.lsn += 1;
    b.store
        .write(b.lsn, |w| {
            w.diverge();
            w.delete_row(3, b"1")?;
            Ok(())
        })
        .unwrap();
    b.rows.remove(&("items", "1".to_owned()));
    (a, b)
}

#[test]
fn a_client_of_a_history_that_forked_away_is_cleared_and_downloads_again() {
    let (mut a, b) = forked_pair(&[
        vec![item("1", "cold", "a"), item("2", "hot", "b")],
        vec![item("3", "cold", "c")],
    ]);
    let forks = b.store.read(|v| v.forks()).unwrap();
    assert_eq!(forks.list().len(), 1, "one fork: {forks:?}");
    assert!(forks.list()[0].resumed_at >= store::forks::MIN_JUMP);
    // A writes on with ids B never gave out; a client follows A to its end.
    a.commit(vec![item("4", "hot", "d"), item("2", "cold", "b2")]);
    let mut client = Client::default();
    let mut s = a.session(&[], Budgets::default());
    step(&a, &mut s, &mut client, usize::MAX, Some(&a.truth()));
    assert_eq!(client.completions, 1);
    let positions = client.positions();
    assert!(
        positions.iter().all(|p| p.after > 3 && p.after < 10),
        "positions past the fork point, in B's gap: {positions:?}"
    );

    // The client moves to B: its positions lie in B's gap. Every bucket it held comes
    // again behind a CLEAR, and the checkpoint validates with exactly B's rows.
    client.reconnect();
    let mut s = b.session(&positions, Budgets::default());
    let lines = json_lines(&b, &mut s, None);
    let data: Vec<&Value> = lines.iter().filter(|l| kind(l) == "data").collect();
    assert!(!data.is_empty());
    for held in positions.iter().filter(|p| p.after > 0) {
        let first = data
            .iter()
            .find(|l| l["data"]["bucket"] == held.name.as_str())
            .unwrap_or_else(|| panic!("{} is sent again: {lines:?}", held.name));
        assert_eq!(first["data"]["after"], "0");
        assert_eq!(first["data"]["data"][0]["op"], "CLEAR", "{first}");
    }
    let mut s = b.session(&positions, Budgets::default());
    let kinds = step(&b, &mut s, &mut client, usize::MAX, Some(&b.truth()));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert_eq!(client.completions, 2);

    // A client that synced before the fork (from a third store of the history) keeps
    // its positions on B.
    let mut early = Client::default();
    let mut c = Db::new();
    c.commit(vec![item("1", "cold", "a"), item("2", "hot", "b")]);
    c.commit(vec![item("3", "cold", "c")]);
    let mut s = c.session(&[], Budgets::default());
    step(&c, &mut s, &mut early, usize::MAX, None);
    early.reconnect();
    let mut s = b.session(&early.positions(), Budgets::default());
    let lines = json_lines(&b, &mut s, None);
    assert!(
        !lines.iter().any(|l| l["data"]["data"][0]["op"] == "CLEAR"),
        "positions of the shared history are kept: {lines:?}"
    );
    let mut s = b.session(&early.positions(), Budgets::default());
    step(&b, &mut s, &mut early, usize::MAX, Some(&b.truth()));
    assert_eq!(early.completions, 2);
}

#[test]
fn a_reset_survives_a_checkpoint_that_supersedes_the_first_before_its_data() {
    let (mut a, mut b) = forked_pair(&[vec![item("1", "cold", "a"), item("2", "hot", "b")]]);
    a.commit(vec![item("3", "hot", "c")]);
    let mut client = Client::default();
    let mut s = a.session(&[], Budgets::default());
    step(&a, &mut s, &mut client, usize::MAX, None);
    client.reconnect();
    // On B the first checkpoint is announced, then superseded before any data is read.
    let mut s = b.session(&client.positions(), Budgets::default());
    let first = s.checkpoint(&b.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    b.commit(vec![item("4", "cold", "d")]);
    let truth = b.truth();
    let kinds = step(&b, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds.first().map(String::as_str), Some("checkpoint_diff"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert_eq!(client.completions, 2, "the client validates B's checkpoint");
}
