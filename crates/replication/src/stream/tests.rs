//! The decoder against pgoutput messages built by hand: a catalog reading applies only
//! where the stream knows no later shape of the table.

use pg_walstream::{Lsn, PgOutputDecoder};

use super::Decoder;
use crate::apply::{Change, StreamTable};
use crate::catalog::CatalogTable;
use crate::IntentTable;
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
    let mut m = vec![b'R'];
    m.extend(OID.to_be_bytes());
    m.extend(b"public\0todos\0");
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
    }
}

fn decode(decoder: &mut Decoder<'_>, at: u64, message: Vec<u8>) -> Option<Change> {
    let event = PgOutputDecoder::with_protocol_version(1)
        .decode_message(message, Lsn::new(at))
        .unwrap()
        .unwrap();
    decoder.decode(event).unwrap()
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
    let rules = SyncRules::parse(RULES).unwrap();
    let pending = PendingCommits::default();
    let table = StreamTable::from_intent(&todos(&["id", "title"]), &rules).unwrap();
    let mut decoder = Decoder::new(&pending, vec![table], &rules);

    decode(&mut decoder, 190, begin(200));
    let renamed = decode(&mut decoder, 195, relation(&["id", "heading"]));
    assert!(
        matches!(renamed, Some(Change::Relation { recopy: true, .. })),
        "{renamed:?}"
    );
    decode(&mut decoder, 200, commit(200));
    assert_eq!(bound_columns(&decoder), ["id", "heading"]);

    let stale = decoder
        .check_catalog(0, &catalog(&["id", "title"]), 150)
        .unwrap();
    assert!(stale.is_none(), "{stale:?}");
    assert_eq!(bound_columns(&decoder), ["id", "heading"]);

    // A reading after the transaction shows what the primary holds now.
    let later = decoder
        .check_catalog(0, &catalog(&["id", "title"]), 300)
        .unwrap();
    assert!(
        matches!(later, Some(Change::Relation { recopy: true, .. })),
        "{later:?}"
    );
    assert_eq!(bound_columns(&decoder), ["id", "title"]);
}
