//! The buckets a store holds, replayed as a client would, against an independent
//! evaluation of the primary's rows with the rules library (feature `buckets`: it needs
//! the engine's rules, source and store crates).

// Test support: a failed query or a damaged store fails the test that asked.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use config::SourceConnection;
use rules::{BucketRow, OwnedSourceRow, PgType, SyncRules};
use source::connect;
use store::{OpKind, Store};

/// Bucket → (object type, object id) → data, for every bucket with live rows.
pub type Contents = BTreeMap<String, BTreeMap<(String, String), String>>;

/// Parses an LSN as PostgreSQL prints it (`16/B374D848`).
#[allow(dead_code)]
pub fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.trim().split_once('/').unwrap();
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Every bucket membership the rows of `tables` (schema `public`) on the primary produce,
/// evaluated with `rules` independently of the engine (plain `SELECT *`, not COPY).
pub async fn evaluate_primary_rows(
    conn: &SourceConnection,
    rules: &SyncRules,
    tables: &[&str],
) -> Vec<BucketRow> {
    let client = connect(conn).await.unwrap();
    let mut out = Vec::new();
    for table in tables {
        let Some(plan) = rules.plan_for("public", table) else {
            continue;
        };
        let sql = format!("SELECT * FROM {table}");
        let statement = client.prepare(&sql).await.unwrap();
        let types: Vec<(String, u32)> = statement
            .columns()
            .iter()
            .map(|c| (c.name().to_owned(), c.type_().oid()))
            .collect();
        for message in client.simple_query(&sql).await.unwrap() {
            let tokio_postgres::SimpleQueryMessage::Row(row) = message else {
                continue;
            };
            let mut source = OwnedSourceRow::new("public", table);
            for (i, (name, oid)) in types.iter().enumerate() {
                source = source.column(name, PgType::from_oid(*oid), row.get(i));
            }
            let columns = source.source_columns();
            out.extend(plan.evaluate(&source.view(&columns)).unwrap().buckets);
        }
    }
    out
}

/// `text` compiled as the engine compiles it for `store`: bucket names derived from the
/// store's history id (generation 1's names for a store without one).
pub fn rules_for(store: &Store, text: &str) -> SyncRules {
    let version = store.read(|v| v.history()).unwrap().map_or(
        rules::BucketVersion::Versioned(1),
        rules::BucketVersion::Derived,
    );
    SyncRules::parse_with_version(text, version).unwrap()
}

/// A bucket name without its tag or generation (`by_list["l1"]` for `<tag>#by_list["l1"]`):
/// what tests compare when the two sides name buckets of different histories.
pub fn untagged(name: &str) -> &str {
    name.split_once('#').map_or(name, |(_, rest)| rest)
}

/// Bucket → live rows, from the rows of `tables` (schema `public`) on the primary,
/// evaluated with `rules`.
pub async fn expected(conn: &SourceConnection, rules: &SyncRules, tables: &[&str]) -> Contents {
    let mut out = Contents::new();
    for b in evaluate_primary_rows(conn, rules, tables).await {
        out.entry(b.bucket.clone()).or_default().insert(
            (b.object_type.to_string(), b.object_id.to_string()),
            b.data.to_string(),
        );
    }
    out
}

/// Bucket → live rows, by replaying every stored op up to the checkpoint as a client
/// would. Also checks, per bucket: the ops add up to the announced count and checksum,
/// and no row has two PUTs (a superseded PUT is rewritten as a MOVE, so a second live
/// PUT of the same row would be a duplicate apply).
pub fn stored(store: &Store) -> Contents {
    stored_where(store, |_| true)
}

/// [`stored`] for the buckets whose names `keep` accepts (one user's, say: a client's view,
/// read quickly enough to be read again after every commit).
pub fn stored_where(store: &Store, keep: impl Fn(&str) -> bool) -> Contents {
    store
        .read(|view| {
            let checkpoint = view.checkpoint()?;
            let mut out = Contents::new();
            for (id, name) in view.bucket_names()? {
                if !keep(&name) {
                    continue;
                }
                let state = view.bucket(&name)?.unwrap();
                let page = view.ops(id, 0, checkpoint.op_id, usize::MAX)?;
                assert!(!page.has_more);
                let sum = page
                    .ops
                    .iter()
                    .fold(0u32, |s, op| s.wrapping_add(op.checksum));
                assert_eq!(
                    (page.ops.len() as u64, sum),
                    (state.count, state.checksum),
                    "{name}: ops against the bucket's count and checksum"
                );
                let mut rows: BTreeMap<(String, String, String), String> = BTreeMap::new();
                let mut puts: BTreeMap<(String, String, String), u32> = BTreeMap::new();
                for op in page.ops {
                    let Some(object) = op.object else { continue };
                    let key = (object.object_type, object.object_id, object.subkey);
                    match op.kind {
                        OpKind::Put => {
                            *puts.entry(key.clone()).or_default() += 1;
                            rows.insert(key, object.data.unwrap());
                        }
                        OpKind::Remove => {
                            rows.remove(&key);
                        }
                        OpKind::Move | OpKind::Clear => {}
                    }
                }
                let doubled: Vec<_> = puts.iter().filter(|(_, n)| **n > 1).collect();
                assert!(
                    doubled.is_empty(),
                    "{name}: rows with two live PUTs: {doubled:?}"
                );
                let live: BTreeMap<(String, String), String> =
                    rows.into_iter().map(|((t, i, _), d)| ((t, i), d)).collect();
                if !live.is_empty() {
                    out.insert(name, live);
                }
            }
            Ok(out)
        })
        .unwrap()
}

/// A readable difference between two contents (first few differing buckets), for
/// assertion messages that would otherwise print thousands of rows.
#[allow(dead_code)]
pub fn diff(stored: &Contents, expected: &Contents) -> String {
    let mut lines = Vec::new();
    let names: std::collections::BTreeSet<&String> = stored.keys().chain(expected.keys()).collect();
    for name in names {
        let (s, e) = (stored.get(name), expected.get(name));
        if s == e {
            continue;
        }
        let empty = BTreeMap::new();
        let (s, e) = (s.unwrap_or(&empty), e.unwrap_or(&empty));
        let missing = e.keys().filter(|k| !s.contains_key(*k)).count();
        let extra = s.keys().filter(|k| !e.contains_key(*k)).count();
        let changed = e
            .iter()
            .filter(|(k, v)| s.get(*k).is_some_and(|sv| sv != *v))
            .count();
        let sample: Vec<_> = e
            .iter()
            .filter(|(k, v)| s.get(*k) != Some(*v))
            .take(3)
            .map(|(k, _)| k)
            .collect();
        lines.push(format!(
            "{name}: {} stored, {} expected, {missing} missing, {extra} extra, {changed} \
             different (e.g. {sample:?})",
            s.len(),
            e.len()
        ));
        if lines.len() == 5 {
            break;
        }
    }
    lines.join("\n")
}
