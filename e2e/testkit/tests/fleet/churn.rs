//! Three replicas of one history announce equal checksums at every checkpoint op id
//! they share, through a churn that makes compactions land.
use testkit::{free_port, Cluster, ClusterKind, PgInstall, TestDir};

use super::{config, start_replica, AUDIENCE, SCHEMA, SECRET};

/// What one replica announced on a sync stream: per checkpoint op id, every bucket's
/// checksum and count; and whether a compaction showed (a count that fell, or a CLEAR).
#[derive(Debug, Default)]
struct Announced {
    at: std::collections::BTreeMap<u64, std::collections::BTreeMap<String, (i64, u64)>>,
    compacted: bool,
    /// Buckets whose announced count fell (a compaction landed in them).
    count_fell: std::collections::BTreeSet<String>,
}

/// Reads `stream` until `stop`, keeping what it announced; `latest` follows the last
/// checkpoint op id.
fn watch_announcements(
    stream: testkit::SyncStreamReader,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    latest: std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> std::thread::JoinHandle<Announced> {
    use serde_json::Value;
    std::thread::spawn(move || {
        let mut seen = Announced::default();
        let mut current: std::collections::BTreeMap<String, (i64, u64)> = Default::default();
        let entry = |b: &Value| {
            (
                b["bucket"].as_str().unwrap().to_owned(),
                (
                    b["checksum"].as_i64().unwrap(),
                    b["count"].as_u64().unwrap(),
                ),
            )
        };
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Some(line) = stream.next_line(std::time::Duration::from_millis(100)) else {
                continue;
            };
            let op_id = if let Some(cp) = line.get("checkpoint") {
                current = cp["buckets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(entry)
                    .collect();
                &cp["last_op_id"]
            } else if let Some(diff) = line.get("checkpoint_diff") {
                for removed in diff["removed_buckets"].as_array().unwrap() {
                    current.remove(removed.as_str().unwrap());
                }
                for (name, (checksum, count)) in diff["updated_buckets"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(entry)
                {
                    let before = current.insert(name.clone(), (checksum, count));
                    if before.is_some_and(|(_, c)| c > count) {
                        seen.compacted = true;
                        seen.count_fell.insert(name);
                    }
                }
                &diff["last_op_id"]
            } else {
                if let Some(ops) = line["data"]["data"].as_array() {
                    seen.compacted |= ops.iter().any(|op| op["op"] == "CLEAR");
                }
                continue;
            };
            let op_id = op_id.as_str().unwrap().parse().unwrap();
            seen.at.insert(op_id, current.clone());
            latest.store(op_id, std::sync::atomic::Ordering::Relaxed);
        }
        seen
    })
}

#[test]
fn three_replicas_of_one_history_announce_equal_checksums_throughout_a_churn() {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let ports = [free_port(), free_port(), free_port()];
    let replica = |name: &str, port: u16, peer: Option<u16>| {
        start_replica(&install, &dir, name, &config(&primary, port), peer)
    };
    let a = replica("churn_a", ports[0], None);
    let b = replica("churn_b", ports[1], Some(ports[0]));
    let c = replica("churn_c", ports[2], Some(ports[0]));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let token = testkit::hs256_token(SECRET, AUDIENCE, "u3", 600);
    let latest: Vec<_> = ports
        .iter()
        .map(|_| std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)))
        .collect();
    let watchers: Vec<_> = ports
        .iter()
        .zip(&latest)
        .map(|(&port, latest)| {
            let stream = testkit::SyncStreamReader::open(port, &token);
            watch_announcements(stream, stop.clone(), latest.clone())
        })
        .collect();

    churn(&primary);
    for r in [&a, &b, &c] {
        r.wait_applied(&primary);
    }
    let head: u64 = a
        .sql("SELECT last_op_id FROM powersync_mdbx.replication()")
        .parse()
        .unwrap();
    testkit::wait_for("every stream announcing the last checkpoint", || {
        let announced: Vec<u64> = latest
            .iter()
            .map(|l| l.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        if announced.iter().all(|&op_id| op_id >= head) {
            Ok(())
        } else {
            Err(announced)
        }
    });
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen: Vec<Announced> = watchers.into_iter().map(|w| w.join().unwrap()).collect();

    assert_equal_announcements(&seen, head);
}

/// Six rounds of inserts, updates, deletes, single-row changes and a TRUNCATE on `primary`.
fn churn(primary: &Cluster) {
    // Inserts, updates, deletes, single-row changes and a TRUNCATE (which makes every op
    // of the todo buckets compactable: CLEAR compaction folds them).
    for round in 0..6 {
        let mut statements = vec![
            format!(
                "INSERT INTO todos SELECT 'c{round}_' || g, 'l' || (g % 50 + 1), 'churn' \
                 FROM generate_series(1, 300) g"
            ),
            format!(
                "UPDATE todos SET title = title || '.', done = NOT done \
                 WHERE id LIKE 't%' AND substr(id, 2)::int % 6 = {round}"
            ),
            format!(
                "UPDATE lists SET name = name || '+' WHERE id = 'l{}'",
                round + 1
            ),
            format!("DELETE FROM todos WHERE id LIKE 'c{round}_%' AND length(id) = 4"),
            format!(
                "UPDATE todos SET list_id = 'l3' WHERE id = 't{}'",
                round * 7 + 3
            ),
        ];
        if round == 3 {
            statements.push("TRUNCATE todos".to_owned());
            statements.push(
                "INSERT INTO todos SELECT 't' || g, 'l' || (g % 50 + 1), 'again ' || g \
                 FROM generate_series(1, 2000) g"
                    .to_owned(),
            );
        }
        let statements: Vec<&str> = statements.iter().map(String::as_str).collect();
        primary.sql_each(&statements);
        // Rounds apart, so the streams announce checkpoints between them too.
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
}

/// Wherever two replicas announced the same op id, they announced the same checksums (and
/// counts, but where a compaction landed); and enough op ids were shared during the churn.
fn assert_equal_announcements(seen: &[Announced], head: u64) {
    // Wherever two replicas announced the same op id, they announced the same buckets
    // with the same checksums and counts, but for the count of a bucket where a compaction
    // landed: a CLEAR compaction commits after the transaction that made it due and makes
    // no new op id, so a replica that announced the checkpoint before it counts the folded
    // ops and one that announced it after counts one CLEAR (a count is "used only for
    // progress", and drops at the same checkpoint when a compaction lands).
    let checksums = |buckets: &std::collections::BTreeMap<String, (i64, u64)>| {
        buckets
            .iter()
            .map(|(name, (checksum, _))| (name.clone(), *checksum))
            .collect::<Vec<_>>()
    };
    let mut common_during = 0;
    for (i, x) in seen.iter().enumerate() {
        assert!(x.compacted, "replica {i} showed no compaction");
        assert!(
            x.at.contains_key(&head),
            "replica {i} announced the last checkpoint {head}"
        );
        for y in &seen[i + 1..] {
            for (op_id, buckets) in &x.at {
                if let Some(other) = y.at.get(op_id) {
                    assert_eq!(
                        checksums(buckets),
                        checksums(other),
                        "announced at op id {op_id}: {buckets:?} against {other:?}"
                    );
                    for (name, (_, count)) in buckets {
                        let compacted = x.count_fell.contains(name) || y.count_fell.contains(name);
                        assert!(
                            compacted || other.get(name).map(|(_, c)| c) == Some(count),
                            "announced at op id {op_id}: {name} counts {count} against {:?}, \
                             no compaction seen in it",
                            other.get(name)
                        );
                    }
                    common_during += usize::from(*op_id < head);
                }
            }
        }
    }
    eprintln!(
        "checkpoints announced: {:?}; op ids announced by two replicas during the churn: \
         {common_during}",
        seen.iter().map(|s| s.at.len()).collect::<Vec<_>>()
    );
    assert!(
        common_during >= 3,
        "too few points to compare during the churn ({common_during})"
    );
}
