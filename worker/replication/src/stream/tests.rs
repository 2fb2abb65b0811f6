//! The decoder against pgoutput messages built by hand: a catalog reading applies only
//! where the stream knows no later shape of the table; a table gone under its name; a
//! partitioned table's partitions.

use std::time::Instant;

use super::Decoder;
use crate::catalog::CatalogTable;
use crate::change::Change;
use crate::intent::IntentTable;
use crate::table::StreamTable;
use metrics::PendingCommits;
use rules::SyncRules;
use source::ColumnMeta;

const RULES: &str = "
bucket_definitions:
  all_todos:
    data:
      - SELECT id, title FROM todos
";
const OID: u32 = 16384;
const TEXT: u32 = 25;

fn column(name: &str) -> ColumnMeta {
    ColumnMeta {
        name: name.to_owned(),
        type_oid: TEXT,
        element_oid: None,
        typlen: -1,
        attnum: 0,
    }
}

fn todos(columns: &[&str]) -> IntentTable {
    IntentTable {
        id: 1,
        schema: "public".into(),
        name: "todos".into(),
        columns: columns.iter().map(|c| column(c)).collect(),
        identity: vec!["id".into()],
        oid: OID,
        recopy: false,
        rekey_from: Vec::new(),
        gone: false,
        partitions: None,
    }
}

fn begin(final_lsn: u64) -> Vec<u8> {
    let mut m = vec![b'B'];
    m.extend(final_lsn.to_be_bytes());
    m.extend(0i64.to_be_bytes());
    m.extend(7u32.to_be_bytes());
    m
}

fn commit(commit_lsn: u64) -> Vec<u8> {
    let mut m = vec![b'C', 0];
    m.extend(commit_lsn.to_be_bytes());
    m.extend((commit_lsn + 8).to_be_bytes());
    m.extend(0i64.to_be_bytes());
    m
}

fn relation(columns: &[&str]) -> Vec<u8> {
    relation_named("todos", columns)
}

fn relation_named(name: &str, columns: &[&str]) -> Vec<u8> {
    relation_of(OID, name, columns)
}

fn relation_of(oid: u32, name: &str, columns: &[&str]) -> Vec<u8> {
    let mut m = vec![b'R'];
    m.extend(oid.to_be_bytes());
    m.extend(b"public\0");
    m.extend(name.as_bytes());
    m.push(0);
    m.push(b'd');
    m.extend((columns.len() as u16).to_be_bytes());
    for &name in columns {
        m.push(u8::from(name == "id"));
        m.extend(name.as_bytes());
        m.push(0);
        m.extend(TEXT.to_be_bytes());
        m.extend((-1i32).to_be_bytes());
    }
    m
}

/// The catalog as read at some LSN: todos with `columns`.
fn catalog(columns: &[&str]) -> CatalogTable {
    CatalogTable {
        oid: OID,
        columns: columns.iter().map(|c| column(c)).collect(),
        identity: vec!["id".into()],
        partitions: None,
    }
}

/// What a decoder borrows: the rules and the pending commits.
struct Fixture {
    rules: SyncRules,
    pending: PendingCommits,
}

impl Fixture {
    fn new() -> Self {
        Self {
            rules: SyncRules::parse(RULES).unwrap(),
            pending: PendingCommits::default(),
        }
    }

    /// A decoder of `todos` with `columns`, at attnums 1, 2, … when `numbered`.
    fn decoder(&self, columns: &[&str], numbered: bool) -> Decoder<'_> {
        let mut intent = todos(columns);
        if numbered {
            for (attnum, column) in (1..).zip(intent.columns.iter_mut()) {
                column.attnum = attnum;
            }
        }
        let table = StreamTable::from_intent(&intent, &self.rules).unwrap();
        Decoder::new(&self.pending, vec![table], &self.rules)
    }
}

fn decode(decoder: &mut Decoder<'_>, message: Vec<u8>) -> Option<Change> {
    decoder.decode(bytes::Bytes::from(message)).unwrap()
}

fn bound_columns(decoder: &Decoder<'_>) -> Vec<String> {
    decoder.tables[0]
        .columns
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

/// A transaction committed at 200 renamed `title` (its Relation message says so); a
/// catalog reading at 150 still shows `title`: applying it would put the stream back on
/// the old name, and a rename back would then look like no change.
#[test]
fn a_catalog_reading_older_than_the_streams_relation_is_not_applied() {
    let fixture = Fixture::new();
    let mut decoder = fixture.decoder(&["id", "title"], false);

    decode(&mut decoder, begin(200));
    let renamed = decode(&mut decoder, relation(&["id", "heading"]));
    assert!(
        matches!(renamed, Some(Change::Relation { recopy: true, .. })),
        "{renamed:?}"
    );
    decode(&mut decoder, commit(200));
    assert_eq!(bound_columns(&decoder), ["id", "heading"]);

    let stale = decoder
        .check_catalog(0, Some(&catalog(&["id", "title"])), 150)
        .unwrap();
    assert!(stale.is_none(), "{stale:?}");
    assert_eq!(bound_columns(&decoder), ["id", "heading"]);

    // A reading after the transaction shows what the primary holds now.
    let later = decoder
        .check_catalog(0, Some(&catalog(&["id", "title"])), 300)
        .unwrap();
    assert!(
        matches!(later, Some(Change::Relation { recopy: true, .. })),
        "{later:?}"
    );
    assert_eq!(bound_columns(&decoder), ["id", "title"]);
}

/// A Relation message under another name: the table is missing (its changes are no
/// longer followed, its rows still served); under its name again within the grace: copied,
/// nothing left the buckets. Missing for the whole grace (the catalog shows it dropped):
/// gone, once.
#[test]
fn a_renamed_table_is_missing_then_gone_unless_its_name_comes_back() {
    let fixture = Fixture::new();
    let mut decoder = fixture.decoder(&["id", "title"], false);

    decode(&mut decoder, begin(100));
    let renamed = decode(&mut decoder, relation_named("todos_old", &["id", "title"]));
    assert!(renamed.is_none(), "{renamed:?}");
    decode(&mut decoder, commit(100));
    let due = decoder.next_gone_at().expect("missing");
    assert!(decoder.due_gone(Instant::now()).is_empty());
    // Its next Relation message under the new name is not for a covered table.
    decode(&mut decoder, begin(200));
    let again = decode(&mut decoder, relation_named("todos_old", &["id", "title"]));
    assert!(again.is_none(), "{again:?}");
    decode(&mut decoder, commit(200));
    // The catalog agrees: nothing more to do.
    assert!(decoder.check_catalog(0, None, 300).unwrap().is_none());
    assert_eq!(decoder.next_gone_at(), Some(due));

    decode(&mut decoder, begin(400));
    let back = decode(&mut decoder, relation(&["id", "title"]));
    assert!(
        matches!(back, Some(Change::Relation { recopy: true, .. })),
        "{back:?}"
    );
    assert_eq!(decoder.next_gone_at(), None);
    decode(&mut decoder, commit(400));

    // Dropped, as the catalog shows it: gone once the grace has passed.
    assert!(decoder.check_catalog(0, None, 500).unwrap().is_none());
    let due = decoder.next_gone_at().expect("missing");
    let gone = decoder.due_gone(due);
    assert!(matches!(gone[..], [Change::Gone { table: 0 }]), "{gone:?}");
    assert!(decoder.tables[0].gone);
    assert!(decoder.check_catalog(0, None, 600).unwrap().is_none());
    assert_eq!(decoder.next_gone_at(), None);
}

/// A column the rules read dropped and added again under its name and type: its Relation
/// message looks the same (pgoutput does not say where a column sits); the catalog shows
/// its new attnum, and the table is copied again.
#[test]
fn a_column_dropped_and_added_again_is_seen_by_its_attnum() {
    let fixture = Fixture::new();
    let mut decoder = fixture.decoder(&["id", "title"], true);

    decode(&mut decoder, begin(100));
    let same = decode(&mut decoder, relation(&["id", "title"]));
    assert!(same.is_none(), "{same:?}");
    decode(&mut decoder, commit(100));

    let mut now = catalog(&["id", "title"]);
    now.columns[0].attnum = 1;
    now.columns[1].attnum = 2;
    assert!(decoder.check_catalog(0, Some(&now), 200).unwrap().is_none());
    now.columns[1].attnum = 3;
    let again = decoder.check_catalog(0, Some(&now), 300).unwrap();
    assert!(
        matches!(again, Some(Change::Relation { recopy: true, .. })),
        "{again:?}"
    );
    assert_eq!(decoder.tables[0].columns[1].attnum, 3);
    assert!(decoder.check_catalog(0, Some(&now), 400).unwrap().is_none());
}

/// A column a Relation message brought (where it sits unknown) learns its attnum from the
/// next catalog reading that agrees, so that dropping and adding it again is seen after.
#[test]
fn a_column_from_a_relation_message_learns_its_attnum() {
    let fixture = Fixture::new();
    let mut decoder = fixture.decoder(&["id", "heading"], true);

    decode(&mut decoder, begin(100));
    let renamed = decode(&mut decoder, relation(&["id", "title"]));
    assert!(
        matches!(renamed, Some(Change::Relation { recopy: true, .. })),
        "{renamed:?}"
    );
    decode(&mut decoder, commit(100));
    assert_eq!(decoder.tables[0].columns[1].attnum, 0);

    let mut now = catalog(&["id", "title"]);
    now.columns[0].attnum = 1;
    now.columns[1].attnum = 2;
    assert!(decoder.check_catalog(0, Some(&now), 200).unwrap().is_none());
    assert_eq!(decoder.tables[0].columns[1].attnum, 2);
    now.columns[1].attnum = 3;
    let again = decoder.check_catalog(0, Some(&now), 300).unwrap();
    assert!(
        matches!(again, Some(Change::Relation { recopy: true, .. })),
        "{again:?}"
    );
}

/// An Insert (`kind` `I`) or Update (`U`, no old tuple) of todos with `values`.
fn row_message(kind: u8, values: &[source::Value<'_>]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend(OID.to_be_bytes());
    m.push(b'N');
    m.extend((values.len() as u16).to_be_bytes());
    for value in values {
        match value {
            source::Value::Null => m.push(b'n'),
            source::Value::Unchanged => m.push(b'u'),
            source::Value::Bytes(b) => {
                m.push(b't');
                m.extend((b.len() as u32).to_be_bytes());
                m.extend(*b);
            }
        }
    }
    m
}

/// The values of a row change as the applier takes them, in the table's column order.
fn shown(decoder: &Decoder<'_>, change: Option<Change>) -> Vec<String> {
    use crate::row::{values_of, Presence};
    let (Some(Change::Insert { new, .. }) | Some(Change::Update { new, .. })) = change else {
        panic!("not a row change: {change:?}")
    };
    values_of(&decoder.tables[0], &new)
        .iter()
        .map(|v| match v {
            Presence::Unchanged => "unchanged".to_owned(),
            other => other.as_deref().map_or("null".to_owned(), |b| {
                String::from_utf8_lossy(b).into_owned()
            }),
        })
        .collect()
}

#[test]
fn a_tuple_s_values_reach_the_applier_in_the_table_s_column_order() {
    use source::Value::{Bytes as V, Null, Unchanged};
    let fixture = Fixture::new();
    let mut decoder = fixture.decoder(&["id", "title", "body", "done"], true);
    // A row before any Relation message describes its table cannot be placed.
    decode(&mut decoder, begin(100));
    let early = decoder.decode(bytes::Bytes::from(row_message(b'I', &[V(b"0")])));
    assert!(
        early.is_err_and(|e| e.to_string().contains("before a Relation message")),
        "a row of an undescribed table"
    );
    assert!(decode(&mut decoder, relation(&["id", "title", "body", "done"])).is_none());
    let inserted = decode(
        &mut decoder,
        row_message(b'I', &[V(b"1"), V(b"t"), Null, V(b"f")]),
    );
    assert_eq!(shown(&decoder, inserted), ["1", "t", "null", "f"]);
    // An unchanged TOAST value is not sent: the applier fills it.
    let updated = decode(
        &mut decoder,
        row_message(b'U', &[V(b"1"), V(b"t"), Unchanged, V(b"f")]),
    );
    assert_eq!(shown(&decoder, updated), ["1", "t", "unchanged", "f"]);
    decode(&mut decoder, commit(100));
    // The catalog lists the columns in another order (nothing the rules read changed):
    // the table is rebound to it while tuples keep the Relation message's order.
    let reordered = decoder
        .check_catalog(0, Some(&catalog(&["done", "id", "title", "body"])), 150)
        .unwrap();
    assert!(
        matches!(reordered, Some(Change::Relation { recopy: false, .. })),
        "{reordered:?}"
    );
    assert_eq!(bound_columns(&decoder), ["done", "id", "title", "body"]);
    decode(&mut decoder, begin(200));
    let inserted = decode(
        &mut decoder,
        row_message(b'I', &[V(b"2"), V(b"x"), V(b"b"), V(b"t")]),
    );
    assert_eq!(shown(&decoder, inserted), ["t", "2", "x", "b"]);
    // A column dropped (its Relation message): the tuples are shorter from here on.
    let dropped = decode(&mut decoder, relation(&["id", "title", "done"]));
    assert!(
        matches!(dropped, Some(Change::Relation { .. })),
        "{dropped:?}"
    );
    let inserted = decode(
        &mut decoder,
        row_message(b'I', &[V(b"3"), V(b"y"), V(b"f")]),
    );
    assert_eq!(shown(&decoder, inserted), ["3", "y", "f"]);
    decode(&mut decoder, commit(200));
}

#[test]
fn write_checkpoint_messages_name_only_write_checkpoint_records() {
    use crate::change::WriteCheckpointNote;
    let key = format!("write_checkpoint/{}", "0123456789abcdef".repeat(4));
    let message = source::write_checkpoint_message(&key, 500, 500);
    let note = WriteCheckpointNote::parse(message.as_bytes(), 900);
    assert_eq!(
        note,
        Some(WriteCheckpointNote {
            key: key.clone(),
            lsn: 500,
            id: 500
        })
    );
    // A checkpoint request's id beside its LSN.
    let message = source::write_checkpoint_message(&key, 500, 7_000);
    assert_eq!(message, format!("write-checkpoint {key} 500 7000"));
    let note = WriteCheckpointNote::parse(message.as_bytes(), 900).unwrap();
    assert_eq!((note.lsn, note.id), (500, 7_000));
    // A request for a position past the message is acknowledged at most at the message.
    let note = WriteCheckpointNote::parse(format!("write-checkpoint {key} 5000").as_bytes(), 900);
    assert_eq!(note.map(|n| n.lsn), Some(900));
    for forged in [
        "write-checkpoint bootstrap 5".to_owned(),
        "write-checkpoint write_checkpoint/../bootstrap 5".to_owned(),
        format!(
            "write-checkpoint write_checkpoint/{} 5",
            "0123456789ABCDEF".repeat(4)
        ),
        format!(
            "write-checkpoint write_checkpoint/{} 5",
            "0123456789abcdef".repeat(3)
        ),
        format!("write-checkpoint {key} 5 extra"),
        format!("write-checkpoint {key} 5 6 7"),
        format!("write-checkpoint {key} x"),
        "write-checkpoint".to_owned(),
        "sync point".to_owned(),
    ] {
        assert_eq!(
            WriteCheckpointNote::parse(forged.as_bytes(), 900),
            None,
            "{forged}"
        );
    }
}

/// A partition of the partitioned todos.
fn partition(oid: u32, filenode: u32, attached: u32) -> source::Partition {
    source::Partition {
        oid,
        filenode,
        attached,
    }
}

/// `publish_via_partition_root = true`: a partition's changes come under the partitioned
/// table, after its Relation message and the partition's. A partition the stream does not
/// know, named at its first write, was attached: the table is copied again before that
/// write is applied. The catalog's readings then see the same partitions (nothing more),
/// or one detached, or one emptied alone (a new data file), each copied again; a reading
/// older than what the stream learned is not applied.
#[test]
fn a_partition_attached_detached_or_emptied_copies_the_table_again() {
    let fixture = Fixture::new();
    let mut intent = todos(&["id", "title"]);
    intent.partitions = Some(vec![partition(20001, 5, 7)]);
    let table = StreamTable::from_intent(&intent, &fixture.rules).unwrap();
    let mut decoder = Decoder::new(&fixture.pending, vec![table], &fixture.rules);
    let insert = || row_message(b'I', &[source::Value::Bytes(b"1"), source::Value::Null]);

    decode(&mut decoder, begin(100));
    assert!(decode(&mut decoder, relation(&["id", "title"])).is_none());
    let known = decode(
        &mut decoder,
        relation_of(20001, "todos_a", &["id", "title"]),
    );
    assert!(known.is_none(), "a known partition: {known:?}");
    assert!(matches!(
        decode(&mut decoder, insert()),
        Some(Change::Insert { .. })
    ));
    // A relation described after a row is not a partition of the table before it.
    let other = decode(&mut decoder, relation_of(30000, "other", &["id"]));
    assert!(other.is_none(), "{other:?}");
    decode(&mut decoder, commit(100));

    decode(&mut decoder, begin(200));
    // The table's Relation message again (an invalidation), then a new partition's.
    assert!(decode(&mut decoder, relation(&["id", "title"])).is_none());
    let attached = decode(
        &mut decoder,
        relation_of(20002, "todos_b", &["id", "title"]),
    );
    let Some(Change::Relation {
        recopy: true,
        repartitioned: Some(partitions),
        why,
        ..
    }) = attached
    else {
        panic!("the table is copied again: {attached:?}")
    };
    assert_eq!(
        partitions.iter().map(|p| p.oid).collect::<Vec<_>>(),
        [20001, 20002]
    );
    assert!(why.contains("todos_b"), "{why}");
    assert!(matches!(
        decode(&mut decoder, insert()),
        Some(Change::Insert { .. })
    ));
    decode(&mut decoder, commit(200));

    let reading = |partitions: Vec<source::Partition>| {
        let mut seen = catalog(&["id", "title"]);
        seen.partitions = Some(partitions);
        seen
    };
    let recopied = |change: Option<Change>| {
        matches!(
            change,
            Some(Change::Relation {
                recopy: true,
                repartitioned: Some(_),
                ..
            })
        )
    };
    // Older than the stream's knowledge: not applied.
    let stale = reading(vec![partition(20001, 5, 7)]);
    assert!(decoder
        .check_catalog(0, Some(&stale), 150)
        .unwrap()
        .is_none());
    // The same partitions, the attached one now known in full.
    let same = reading(vec![partition(20001, 5, 7), partition(20002, 9, 11)]);
    assert!(decoder
        .check_catalog(0, Some(&same), 300)
        .unwrap()
        .is_none());
    let detached = reading(vec![partition(20002, 9, 11)]);
    assert!(recopied(
        decoder.check_catalog(0, Some(&detached), 400).unwrap()
    ));
    assert!(decoder
        .check_catalog(0, Some(&detached), 450)
        .unwrap()
        .is_none());
    let emptied = reading(vec![partition(20002, 12, 11)]);
    assert!(recopied(
        decoder.check_catalog(0, Some(&emptied), 500).unwrap()
    ));
    let again = reading(vec![partition(20002, 12, 13)]);
    assert!(recopied(
        decoder.check_catalog(0, Some(&again), 600).unwrap()
    ));
}

/// An ordinary table's next Relation message (of a table the rules do not read) is no
/// partition of it, and its catalog readings carry no partitions.
#[test]
fn an_ordinary_table_has_no_partitions() {
    let fixture = Fixture::new();
    let mut decoder = fixture.decoder(&["id", "title"], false);
    decode(&mut decoder, begin(100));
    assert!(decode(&mut decoder, relation(&["id", "title"])).is_none());
    let next = decode(
        &mut decoder,
        relation_of(20002, "todos_b", &["id", "title"]),
    );
    assert!(next.is_none(), "{next:?}");
    decode(&mut decoder, commit(100));
    let seen = catalog(&["id", "title"]);
    assert!(decoder
        .check_catalog(0, Some(&seen), 200)
        .unwrap()
        .is_none());
}

/// A partition of a partitioned table the rules do not read, published under that
/// table's name (its Relation message comes right after the table's), is not followed as
/// a table a wildcard matches (its changes never come under its own name); a table
/// described on its own is.
#[test]
fn a_partition_of_a_table_not_followed_is_not_taken_for_a_wildcard_table() {
    let rules = SyncRules::parse(
        "bucket_definitions:\n  all:\n    data:\n      - SELECT id FROM todos\n      - SELECT id FROM \"events_%\"\n",
    )
    .unwrap();
    let pending = PendingCommits::default();
    let table = StreamTable::from_intent(&todos(&["id", "title"]), &rules).unwrap();
    let mut decoder = Decoder::new(&pending, vec![table], &rules);
    decode(&mut decoder, begin(100));
    assert!(decode(&mut decoder, relation_of(40000, "archive", &["id"])).is_none());
    let partition = decode(&mut decoder, relation_of(40001, "events_2024", &["id"]));
    assert!(partition.is_none(), "{partition:?}");
    decode(&mut decoder, commit(100));
    decode(&mut decoder, begin(200));
    let table = decode(&mut decoder, relation_of(40002, "events_2025", &["id"]));
    assert!(matches!(table, Some(Change::Added { .. })), "{table:?}");
    decode(&mut decoder, commit(200));
}
