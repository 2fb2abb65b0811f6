//! The stream's handling of pgoutput without a primary or a store, for the fuzz targets
//! (`worker/fuzz/fuzz_targets/pgoutput.rs`). Not part of the crate's API.
//!
//! Each message goes the way a streamed one does: the wire bytes through the stream's
//! [`Decoder`](super::stream) (`source::Pgoutput`, relation checks included), and each row change through the
//! applier's store-independent steps: tuple → values, TOAST values filled from the old
//! tuple or from the values kept with the row, evaluation by the rules, identity, the
//! values kept for later. An in-memory map stands in for the rows' kept values.

use std::collections::HashMap;

use crate::change::Change;
use crate::error::ReplicationError;
use crate::intent::IntentTable;
use crate::row::{evaluate_row, fill_unchanged, identity_of, old_identity_of, values_of};
use crate::store_input::StoreInput;
use crate::stream::Decoder;
use crate::table::{rebind, StreamTable};
use metrics::PendingCommits;
use rules::SyncRules;
use store::Stash;

/// Runs `messages` (pgoutput message bodies) through the stream's decoding and the
/// applier's row handling for `tables` (as a snapshot recorded them). Returns the number
/// of row changes handled, or the first error the stream would stop on. `None` when a
/// table record is unusable for streaming.
pub fn pgoutput_session<'m>(
    rules: &SyncRules,
    tables: &[IntentTable],
    messages: impl IntoIterator<Item = &'m [u8]>,
) -> Option<Result<u64, ReplicationError>> {
    let tables = tables
        .iter()
        .map(|t| StreamTable::from_intent(t, rules))
        .collect::<Option<Vec<_>>>()?;
    let pending = PendingCommits::default();
    let mut decoder = Decoder::new(&pending, tables.clone(), rules);
    // The applier's copy, rebound by Relation changes.
    let mut applied = tables;
    let mut kept: HashMap<(usize, Vec<u8>), Stash> = HashMap::new();
    let mut handled = 0u64;
    for body in messages {
        let Ok(message) = decoder.read(bytes::Bytes::copy_from_slice(body)) else {
            // The stream stops on a message it cannot read, and reconnects.
            continue;
        };
        let change = match decoder.decode_message(message) {
            Ok(Some(change)) => change,
            Ok(None) => continue,
            Err(e) => return Some(Err(e)),
        };
        match apply(rules, &mut applied, &mut kept, change) {
            Ok(rows) => handled += rows,
            Err(e) => return Some(Err(e)),
        }
    }
    Some(Ok(handled))
}

/// The applier's `apply` with the map `kept` in place of the store.
fn apply(
    rules: &SyncRules,
    tables: &mut Vec<StreamTable>,
    kept: &mut HashMap<(usize, Vec<u8>), Stash>,
    change: Change,
) -> Result<u64, ReplicationError> {
    let table_of = |index: usize| {
        tables.get(index).ok_or_else(|| {
            crate::error::stream_error(format!("a change for unknown table #{index}"))
        })
    };
    let (index, old, new) = match change {
        Change::Insert { table, new, .. } => (table, None, new),
        Change::Update {
            table, old, new, ..
        } => (table, old.map(|old| *old), new),
        Change::Delete { table, old } => {
            let values = values_of(table_of(table)?, &old);
            kept.remove(&(table, identity_of(table_of(table)?, &values)));
            return Ok(1);
        }
        Change::Truncate { tables: truncated } => {
            kept.retain(|(table, _), _| !truncated.contains(table));
            return Ok(truncated.len() as u64);
        }
        Change::Gone { table: gone } => {
            kept.retain(|(table, _), _| *table != gone);
            if let Some(table) = tables.get_mut(gone) {
                table.gone = true;
            }
            return Ok(0);
        }
        Change::Relation {
            table,
            oid,
            identity,
            columns,
            repartitioned,
            ..
        } => {
            rebind(tables, table, oid, identity, columns, repartitioned, rules)?;
            return Ok(0);
        }
        Change::Added { table, .. } => {
            tables.push(*table);
            return Ok(0);
        }
        Change::Begin { .. }
        | Change::Commit { .. }
        | Change::Advance { .. }
        | Change::Passed { .. }
        | Change::Recopy(_) => return Ok(0),
    };
    let table = table_of(index)?;
    let old_values = old.as_ref().map(|old| values_of(table, old));
    let mut values = values_of(table, &new);
    let old_identity = old_identity_of(table, old_values.as_deref(), &values)?;
    let used_stash = fill_unchanged(table, old_values.as_deref(), &mut values, || {
        Ok(kept
            .get(&(index, old_identity.clone()))
            .cloned()
            .unwrap_or_default())
    })?;
    let filled: Vec<Option<&[u8]>> = values.iter().map(|v| v.as_deref()).collect();
    let row = evaluate_row(table, &filled, used_stash)?;
    // What the writer would be handed.
    let input = StoreInput::of(&row.eval);
    let _ = input.lookup_puts();
    kept.remove(&(index, old_identity));
    kept.insert((index, row.identity), row.stash);
    Ok(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use source::ColumnMeta;

    fn table() -> IntentTable {
        let column = |name: &str, type_oid, typlen| ColumnMeta {
            name: name.into(),
            type_oid,
            element_oid: None,
            typlen,
            attnum: 0,
        };
        IntentTable {
            id: 1,
            schema: "public".into(),
            name: "t".into(),
            columns: vec![
                column("id", 25, -1),
                column("n", 23, 4),
                column("body", 25, -1),
            ],
            identity: vec!["id".into()],
            oid: 16384,
            recopy: false,
            rekey_from: Vec::new(),
            gone: false,
            partitions: None,
        }
    }

    fn rules() -> SyncRules {
        SyncRules::parse("bucket_definitions:\n  all:\n    data: [SELECT * FROM t]\n").unwrap()
    }

    /// pgoutput v1 bodies, as the primary sends them.
    fn relation() -> Vec<u8> {
        let mut m = b"R".to_vec();
        m.extend(16384u32.to_be_bytes());
        m.extend(b"public\0t\0d");
        m.extend(3u16.to_be_bytes());
        for (key, name, oid) in [(1u8, "id", 25u32), (0, "n", 23), (0, "body", 25)] {
            m.push(key);
            m.extend(name.as_bytes());
            m.push(0);
            m.extend(oid.to_be_bytes());
            m.extend((-1i32).to_be_bytes());
        }
        m
    }

    fn begin() -> Vec<u8> {
        let mut m = b"B".to_vec();
        m.extend(0x100u64.to_be_bytes());
        m.extend(0i64.to_be_bytes());
        m.extend(7u32.to_be_bytes());
        m
    }

    fn commit() -> Vec<u8> {
        let mut m = b"C\0".to_vec();
        m.extend(0x100u64.to_be_bytes());
        m.extend(0x108u64.to_be_bytes());
        m.extend(0i64.to_be_bytes());
        m
    }

    /// `tag` (I or U) of a new tuple; `None` is an unchanged TOAST value.
    fn change(tag: u8, values: &[Option<&str>]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend(16384u32.to_be_bytes());
        m.push(b'N');
        m.extend((values.len() as u16).to_be_bytes());
        for value in values {
            match value {
                None => m.push(b'u'),
                Some(v) => {
                    m.push(b't');
                    m.extend((v.len() as u32).to_be_bytes());
                    m.extend(v.as_bytes());
                }
            }
        }
        m
    }

    fn run(messages: &[Vec<u8>]) -> Result<u64, ReplicationError> {
        pgoutput_session(&rules(), &[table()], messages.iter().map(Vec::as_slice)).unwrap()
    }

    #[test]
    fn an_unchanged_toast_value_comes_from_the_values_kept_with_the_row() {
        let long = "x".repeat(2000);
        let handled = run(&[
            relation(),
            begin(),
            change(b'I', &[Some("a"), Some("1"), Some(&long)]),
            change(b'U', &[Some("a"), Some("2"), None]),
            commit(),
        ]);
        assert_eq!(handled.unwrap(), 2);
    }

    #[test]
    fn an_unchanged_toast_value_the_store_does_not_hold_is_refused_with_its_code() {
        let handled = run(&[
            relation(),
            begin(),
            change(b'U', &[Some("a"), Some("2"), None]),
            commit(),
        ]);
        assert!(
            matches!(
                handled,
                Err(ReplicationError::Stream {
                    code: "PSM_R2003",
                    ..
                })
            ),
            "{handled:?}"
        );
    }
}
