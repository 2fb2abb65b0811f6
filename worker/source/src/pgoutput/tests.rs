//! Row messages read here against `pg_walstream`'s encoder and parser of the same bytes.

use std::sync::Arc;

use bytes::Bytes;
use pg_walstream::{
    encode_message_to_bytes, ColumnData, ColumnInfo, LogicalReplicationMessage as M,
    LogicalReplicationParser, TupleData,
};

use super::*;

fn encode(message: &M) -> Bytes {
    encode_message_to_bytes(message, 1).freeze()
}

/// A deterministic mix of null, unchanged, text (empty, ASCII, multibyte) and binary values.
fn tuple_data(seed: u64, width: usize) -> TupleData {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    TupleData::new(
        (0..width)
            .map(|i| match next() % 5 {
                0 => ColumnData::null(),
                1 => ColumnData::unchanged(),
                2 => ColumnData::binary(vec![0, 255, i as u8]),
                3 => ColumnData::text(Vec::new()),
                _ => ColumnData::text(format!("värde {i} {}", next() % 1000).into_bytes()),
            })
            .collect(),
    )
}

/// The values `pg_walstream` reads from a tuple, as [`Value`]s.
fn expected(tuple: &TupleData) -> Vec<Value<'_>> {
    tuple
        .columns
        .iter()
        .map(|c| match c.data_type {
            b'n' => Value::Null,
            b'u' => Value::Unchanged,
            _ => Value::Bytes(c.as_bytes()),
        })
        .collect()
}

fn values(tuple: &Tuple) -> Vec<Value<'_>> {
    tuple.values().collect()
}

#[test]
fn row_messages_read_as_pg_walstream_reads_them() {
    for seed in 0..200u64 {
        let width = (seed % 40) as usize;
        let new = tuple_data(seed, width);
        let old = tuple_data(seed + 1000, width);
        let relation = 16384 + seed as u32;
        let insert = encode(&M::Insert {
            relation_id: relation,
            tuple: new.clone(),
        });
        match Pgoutput::default().read(insert).unwrap() {
            Message::Insert {
                relation: r,
                new: n,
            } => {
                assert_eq!(r, relation);
                assert_eq!(values(&n), expected(&new));
            }
            other => panic!("{other:?}"),
        }
        for key_type in [None, Some('K'), Some('O')] {
            let update = encode(&M::Update {
                relation_id: relation,
                old_tuple: key_type.map(|_| old.clone()),
                new_tuple: new.clone(),
                key_type,
            });
            // The same bytes through pg_walstream's parser: the same message.
            let parsed = LogicalReplicationParser::with_protocol_version(1)
                .parse_wal_message_bytes(update.clone())
                .unwrap();
            let M::Update {
                old_tuple,
                new_tuple,
                ..
            } = parsed.message
            else {
                panic!("{parsed:?}")
            };
            match Pgoutput::default().read(update).unwrap() {
                Message::Update {
                    relation: r,
                    old: o,
                    new: n,
                } => {
                    assert_eq!(r, relation);
                    assert_eq!(values(&n), expected(&new_tuple));
                    assert_eq!(
                        o.as_ref().map(values),
                        old_tuple.as_ref().map(expected),
                        "{key_type:?}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        let delete = encode(&M::Delete {
            relation_id: relation,
            old_tuple: old.clone(),
            key_type: 'K',
        });
        match Pgoutput::default().read(delete).unwrap() {
            Message::Delete {
                relation: r,
                old: o,
            } => {
                assert_eq!(r, relation);
                assert_eq!(values(&o), expected(&old));
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_cut_or_damaged_row_message_is_an_error() {
    let update = encode(&M::Update {
        relation_id: 7,
        old_tuple: Some(tuple_data(1, 6)),
        new_tuple: tuple_data(2, 6),
        key_type: Some('O'),
    });
    for end in 1..update.len() {
        let cut = update.slice(..end);
        assert!(Pgoutput::default().read(cut).is_err(), "cut at {end}");
    }
    let mut longer = update.to_vec();
    longer.push(0);
    let e = Pgoutput::default().read(Bytes::from(longer)).unwrap_err();
    assert!(e.to_string().contains("after the end"), "{e}");
    // A column kind pgoutput does not send.
    let mut odd = encode(&M::Insert {
        relation_id: 7,
        tuple: TupleData::new(vec![ColumnData::null()]),
    })
    .to_vec();
    *odd.last_mut().unwrap() = b'x';
    let e = Pgoutput::default().read(Bytes::from(odd)).unwrap_err();
    assert!(e.to_string().contains("n, u, t or b"), "{e}");
    // A length past the message's end.
    let mut long = encode(&M::Insert {
        relation_id: 7,
        tuple: TupleData::new(vec![ColumnData::text(b"abc".to_vec())]),
    })
    .to_vec();
    let at = long.len() - 7;
    long[at..at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(Pgoutput::default().read(Bytes::from(long)).is_err());
}

fn relation(oid: u32, name: &str, columns: &[(&str, bool)]) -> Bytes {
    encode(&M::Relation {
        relation_id: oid,
        namespace: Arc::from("public"),
        relation_name: Arc::from(name),
        replica_identity: b'd',
        columns: columns
            .iter()
            .map(|(name, key)| ColumnInfo {
                flags: u8::from(*key),
                name: Arc::from(*name),
                type_id: 25,
                type_modifier: -1,
            })
            .collect(),
    })
}

#[test]
fn a_relation_is_reported_when_it_changes_and_names_truncated_tables() {
    let mut reader = Pgoutput::default();
    let todos = relation(10, "todos", &[("id", true), ("title", false)]);
    let Message::Relation(first) = reader.read(todos.clone()).unwrap() else {
        panic!("the first Relation message is reported")
    };
    assert_eq!(first.qualified(), "public.todos");
    assert_eq!(
        first
            .columns
            .iter()
            .map(|c| (c.name.as_str(), c.is_key))
            .collect::<Vec<_>>(),
        [("id", true), ("title", false)]
    );
    // pgoutput repeats it after an invalidation: nothing changed.
    assert!(matches!(
        reader.read(todos).unwrap(),
        Message::Redescribed { oid: 10 }
    ));
    let changed = relation(10, "todos", &[("id", true), ("heading", false)]);
    assert!(matches!(
        reader.read(changed).unwrap(),
        Message::Relation(r) if r.columns[1].name == "heading"
    ));
    assert_eq!(reader.relation(10).unwrap().columns[1].name, "heading");
    let truncate = encode(&M::Truncate {
        relation_ids: vec![10, 99],
        flags: 0,
    });
    match reader.read(truncate).unwrap() {
        Message::Truncate { relations } => assert_eq!(relations, ["public.todos"]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn begin_commit_and_logical_messages_carry_their_positions() {
    let mut reader = Pgoutput::default();
    let begin = encode(&M::Begin {
        final_lsn: 0x1_0000_0010,
        timestamp: 1_000_000,
        xid: 5,
    });
    match reader.read(begin).unwrap() {
        Message::Begin {
            final_lsn,
            commit_micros,
        } => {
            assert_eq!(final_lsn, 0x1_0000_0010);
            // 2000-01-01 00:00:01 UTC.
            assert_eq!(commit_micros, 946_684_801_000_000);
        }
        other => panic!("{other:?}"),
    }
    let commit = encode(&M::Commit {
        flags: 0,
        commit_lsn: 0x20,
        end_lsn: 0x48,
        timestamp: 0,
    });
    assert!(matches!(
        reader.read(commit).unwrap(),
        Message::Commit { end_lsn: 0x48 }
    ));
    let logical = encode(&M::Message {
        flags: 0,
        lsn: 0x99,
        prefix: "powersync".into(),
        content: Bytes::from_static(b"write-checkpoint"),
    });
    match reader.read(logical).unwrap() {
        Message::Logical {
            transactional,
            lsn,
            prefix,
            content,
        } => {
            assert!(!transactional);
            assert_eq!((lsn, prefix.as_str()), (0x99, "powersync"));
            assert_eq!(&content[..], b"write-checkpoint");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(reader.read(Bytes::new()).unwrap(), Message::Other));
}

#[test]
fn a_tuple_is_rearranged_by_positions_sharing_its_buffer() {
    let tuple = Tuple::of(&[
        Value::Bytes(b"1"),
        Value::Null,
        Value::Unchanged,
        Value::Bytes(b"x"),
    ]);
    let arranged = tuple.arranged(&[Some(3), None, Some(0), Some(1), Some(9), Some(2)]);
    assert_eq!(
        values(&arranged),
        [
            Value::Bytes(b"x"),
            Value::Unchanged,
            Value::Bytes(b"1"),
            Value::Null,
            Value::Unchanged,
            Value::Unchanged
        ]
    );
    assert_eq!(tuple.get(17), Value::Unchanged);
    assert_eq!(
        format!("{tuple:?}"),
        r#"["\"1\"", "Null", "Unchanged", "\"x\""]"#
    );
}
