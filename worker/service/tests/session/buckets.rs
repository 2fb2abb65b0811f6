//! Which buckets a client gets and how: priority groups, a parameter row adding and
//! removing a bucket, a large bucket in bounded lines.

use super::*;

#[test]
fn priority_groups_complete_in_order_with_partial_completions() {
    let mut db = Db::new();
    db.commit(vec![
        item("1", "hot", "a"),
        item("2", "cold", "b"),
        list("L1", "u1"),
        todo("t1", "L1"),
    ]);
    let mut s = db.session(&[], Budgets::default());
    let lines = json_lines(&db, &mut s, None);
    let kinds: Vec<&str> = lines.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "checkpoint",
            "data",
            "partial_checkpoint_complete",
            "data",
            "partial_checkpoint_complete",
            "data",
            "checkpoint_complete"
        ]
    );
    assert_eq!(lines[1]["data"]["bucket"], "1#hot[]");
    assert_eq!(lines[2]["partial_checkpoint_complete"]["priority"], 0);
    assert_eq!(lines[3]["data"]["bucket"], "1#by_list[\"L1\"]");
    assert_eq!(lines[4]["partial_checkpoint_complete"]["priority"], 1);
    assert_eq!(lines[5]["data"]["bucket"], "1#global[]");
    let cp = &lines[0]["checkpoint"];
    let names: Vec<&str> = cp["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["by_list", "global", "hot"]);
    let hot = cp["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bucket"] == "1#hot[]")
        .unwrap();
    assert_eq!(hot["subscriptions"], json!([{"default": 2}]));
    assert_eq!(hot["priority"], 0);
    // Nothing new: no line; a write checkpoint alone: an empty diff and its completion.
    assert!(s.checkpoint(&db.store, None).unwrap().is_none());
    let lines = json_lines(&db, &mut s, Some(7));
    assert_eq!(
        lines[0],
        json!({"checkpoint_diff": {"last_op_id": cp["last_op_id"], "write_checkpoint": "7",
            "updated_buckets": [], "removed_buckets": []}})
    );
    assert_eq!(lines.len(), 2);
    assert_eq!(kind(&lines[1]), "checkpoint_complete");
}

#[test]
fn a_parameter_row_adds_and_removes_a_bucket() {
    let mut db = Db::new();
    db.commit(vec![
        item("1", "cold", "a"),
        todo("t1", "L1"),
        todo("t2", "L1"),
    ]);
    let mut s = db.session(&[], Budgets::default());
    let mut client = Client::default();
    step(&db, &mut s, &mut client, usize::MAX, Some(&db.truth()));
    assert!(!client.buckets.contains_key("1#by_list[\"L1\"]"));
    // The list becomes u1's: its bucket joins with its whole history.
    db.commit(vec![list("L1", "u1")]);
    let lines = json_lines(&db, &mut s, None);
    let diff = &lines[0]["checkpoint_diff"];
    assert_eq!(diff["updated_buckets"][0]["bucket"], "1#by_list[\"L1\"]");
    assert_eq!(diff["updated_buckets"][0]["count"], 2);
    assert_eq!(lines[1]["data"]["after"], "0");
    assert_eq!(lines[1]["data"]["data"].as_array().unwrap().len(), 2);
    assert_eq!(s.position("1#by_list[\"L1\"]"), s.last_op_id());
    // It goes to someone else: removed, position dropped.
    db.commit(vec![list("L1", "u2")]);
    let lines = json_lines(&db, &mut s, None);
    assert_eq!(
        lines[0]["checkpoint_diff"]["removed_buckets"],
        json!(["1#by_list[\"L1\"]"])
    );
    assert_eq!(lines[0]["checkpoint_diff"]["updated_buckets"], json!([]));
    assert_eq!(kind(&lines[1]), "checkpoint_complete");
    assert_eq!(s.position("1#by_list[\"L1\"]"), None);
    // And back: it starts again from 0.
    db.commit(vec![list("L1", "u1")]);
    let lines = json_lines(&db, &mut s, None);
    assert_eq!(lines[1]["data"]["after"], "0");
    assert_eq!(lines[1]["data"]["data"].as_array().unwrap().len(), 2);
}

#[test]
fn a_large_bucket_streams_in_bounded_lines() {
    let mut db = Db::new();
    let n = 2500;
    let changes: Vec<Change> = (0..n).map(|i| item(&i.to_string(), "cold", "v")).collect();
    db.commit(changes);
    // The op counts bound lines when the byte bounds do not.
    let by_count = Budgets {
        batch_bytes: usize::MAX,
        chunk_bytes: usize::MAX,
        ..Budgets::default()
    };
    let mut s = db.session(&[], by_count);
    let mut client = Client::default();
    let first = s.checkpoint(&db.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    let mut sizes = Vec::new();
    while let Some(line) = s.next_line(&db.store).unwrap() {
        if let SyncLine::Data(d) = &line {
            sizes.push((d.ops.len(), d.has_more));
        }
        client.apply(&line.to_bytes(Encoding::Ndjson), None);
    }
    assert_eq!(sizes, [(1000, true), (1000, true), (500, false)]);
    assert_eq!(client.completions, 1);
    // By default a line closes at 16 KiB of rows and a batch at 64 KiB (what a stream
    // holds toward a slow client): every line stays near 16 KiB, all rows arrive.
    let mut s = db.session(&[], Budgets::default());
    let mut client = Client::default();
    let first = s.checkpoint(&db.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    let mut rows = 0;
    while let Some(line) = s.next_line(&db.store).unwrap() {
        if let SyncLine::Data(d) = &line {
            let bytes: usize = d.ops.iter().map(store::OpRead::data_len).sum();
            assert!(bytes < (16 << 10) + 100, "a line of {bytes} bytes of rows");
            rows += d.ops.len();
        }
        client.apply(&line.to_bytes(Encoding::Ndjson), None);
    }
    assert_eq!(rows, n);
    assert_eq!(client.completions, 1);
    // A byte budget closes chunks early.
    let mut s = db.session(
        &[],
        Budgets {
            chunk_bytes: 10_000,
            ..Budgets::default()
        },
    );
    s.checkpoint(&db.store, None).unwrap();
    let first = s.next_line(&db.store).unwrap().unwrap();
    let SyncLine::Data(d) = first else {
        panic!("data expected")
    };
    assert!(d.ops.len() < 1000 && d.has_more);
}
