//! When a checkpoint completes: withheld while a move or compaction past it is in the
//! range handed out, and a small download read with its checkpoint.

use super::*;

/// `rows` rows of the `cold` bucket, a session that announced its first checkpoint, then
/// row 1 changed before any data was handed out: the lines the rest of that checkpoint
/// gives.
fn change_after_the_first_checkpoint(rows: usize) -> (Db, SyncSession, Client, Vec<String>) {
    let mut db = Db::new();
    db.commit(
        (1..=rows)
            .map(|i| item(&i.to_string(), "cold", "a"))
            .collect(),
    );
    let mut s = db.session(&[], Budgets::default());
    let mut client = Client::default();
    let first = s.checkpoint(&db.store, None).unwrap().unwrap();
    client.apply(&first.to_bytes(Encoding::Ndjson), None);
    db.commit(vec![item("1", "cold", "changed")]);
    let kinds = drain(&db, &mut s, &mut client, usize::MAX, None);
    (db, s, client, kinds)
}

#[test]
fn a_move_beyond_the_checkpoint_withholds_its_completion() {
    // More ops than a small download: its data is read after the checkpoint's own read,
    // and row 1's PUT has become a MOVE targeting a newer op by then.
    let (db, mut s, mut client, kinds) = change_after_the_first_checkpoint(300);
    assert_eq!(
        kinds,
        ["data"],
        "no completion for the invalidated checkpoint"
    );
    assert!(!s.is_downloading());
    let truth = db.truth();
    let kinds = step(&db, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds, ["checkpoint_diff", "data", "checkpoint_complete"]);
    assert_eq!(client.completions, 1);
}

#[test]
fn a_compaction_past_the_checkpoint_withholds_its_completion() {
    // 300 rows; the client takes the first of the first checkpoint's data lines.
    let every_row =
        |v: &str| -> Vec<Change> { (1..=300).map(|i| item(&i.to_string(), "cold", v)).collect() };
    let mut db = Db::new();
    db.commit(every_row("a"));
    let mut s = db.session(&[], tiny());
    let mut client = Client::default();
    assert_eq!(
        step(&db, &mut s, &mut client, 1, None),
        ["checkpoint", "data"]
    );
    // Every row updated twice, then the bucket compacted: the ops up to the checkpoint
    // and the first update's are folded into one CLEAR past the checkpoint, so the rest
    // of the download finds none of the ops it was to send.
    db.commit(every_row("b"));
    db.commit(every_row("c"));
    let id = db
        .store
        .read(|v| Ok(v.bucket("1#global[]")?.unwrap().id))
        .unwrap();
    let (folded, _) = db.store.write(db.lsn, |w| w.compact_bucket(id)).unwrap();
    assert_eq!(folded, 599);
    let kinds = drain(&db, &mut s, &mut client, usize::MAX, None);
    assert!(
        !kinds.iter().any(|k| k == "checkpoint_complete"),
        "no completion for a checkpoint whose ops were folded past it: {kinds:?}"
    );
    let truth = db.truth();
    let kinds = step(&db, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds.first().map(String::as_str), Some("checkpoint_diff"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("checkpoint_complete")
    );
    assert_eq!(client.completions, 1);
}

#[test]
fn a_small_download_is_read_with_its_checkpoint() {
    // Two ops, read in the checkpoint's own view: the checkpoint completes with exactly
    // what it announced, whatever changed after.
    let (db, mut s, mut client, kinds) = change_after_the_first_checkpoint(2);
    assert_eq!(kinds, ["data", "checkpoint_complete"]);
    assert_eq!(client.completions, 1);
    let truth = db.truth();
    let kinds = step(&db, &mut s, &mut client, usize::MAX, Some(&truth));
    assert_eq!(kinds, ["checkpoint_diff", "data", "checkpoint_complete"]);
    assert_eq!(client.completions, 2);
}
