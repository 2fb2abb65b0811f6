//! A partitioned table read as one (`publish_via_partition_root = true`): its snapshot
//! holds every partition's rows, its partitions' changes stream under its name, and a
//! partition attached with rows, detached or emptied alone (none of them a row change on
//! the stream) copies it again, published in one checkpoint.

use super::*;
use crate::observer::{assert_each_was_had, of_user, Observer};
use replication::BootstrapIntent;
use testkit::buckets::Contents;

/// `items` in two partitions, 3,000 rows; two tables with rows of their own to attach.
const PARTS_SCHEMA: &str = "
CREATE TABLE items (id integer NOT NULL, part integer NOT NULL, owner text NOT NULL,
  body text, PRIMARY KEY (id, part)) PARTITION BY RANGE (part);
CREATE TABLE items_low PARTITION OF items FOR VALUES FROM (0) TO (100);
CREATE TABLE items_high PARTITION OF items FOR VALUES FROM (100) TO (200);
CREATE PUBLICATION powersync FOR ALL TABLES WITH (publish_via_partition_root = true);
INSERT INTO items SELECT g, g % 200, 'u' || (g % 3), 'body ' || g
  FROM generate_series(1, 3000) g;
CREATE TABLE items_more (LIKE items INCLUDING ALL);
INSERT INTO items_more SELECT g, 200 + g % 100, 'u' || (g % 3), 'more ' || g
  FROM generate_series(5001, 5600) g;
CREATE TABLE items_late (LIKE items INCLUDING ALL);
INSERT INTO items_late SELECT g, 300 + g % 100, 'u' || (g % 3), 'late ' || g
  FROM generate_series(6001, 6600) g;
CREATE TABLE items_restart (LIKE items INCLUDING ALL);
INSERT INTO items_restart SELECT g, 400 + g % 100, 'u' || (g % 3), 'restart ' || g
  FROM generate_series(7001, 7300) g;
";

const PARTS_RULES: &str = "
bucket_definitions:
  mine:
    parameters: SELECT request.user_id() AS owner
    data:
      - SELECT * FROM items WHERE owner = bucket.owner
";

const ITEMS: &[&str] = &["items"];

/// The primary's states the user `u1` had, as the test makes them.
struct History<'a> {
    rig: &'a Rig,
    had: Vec<Contents>,
}

impl History<'_> {
    /// `u1`'s rows on the primary now.
    async fn state(&self) -> Contents {
        let connection = self.rig.plan().connection;
        of_user(expected(&connection, &self.rig.rules, ITEMS).await, "u1")
    }

    /// Runs `sql` (one transaction) and notes the state it leaves.
    async fn run(&mut self, sql: &str) {
        self.rig.primary.sql(sql);
        let now = self.state().await;
        self.had.push(now);
    }
}

/// The snapshot holds both partitions' rows; inserts, updates, deletes and a row moved to
/// the other partition stream under the table's name; a partition attached with 600 rows
/// (with no write after it, then another with a write to its rows in the same
/// transaction), one detached and one emptied alone each reach the buckets, writing
/// nothing meanwhile; after each step the buckets equal the rules applied to the primary's
/// rows, and a client reading after every commit sees only states the primary had (no
/// partition's rows half there). The record keeps the partitions the last copy saw, no
/// re-copy pending, and a partition attached while the stream is stopped is copied at
/// its next start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_table_is_followed_as_one_table() {
    let rig = Rig::with(PARTS_SCHEMA, PARTS_RULES);
    let store = bootstrapped(&rig).await;
    let snapshot = expected(&rig.plan().connection, &rig.rules, ITEMS).await;
    let rows: usize = snapshot.values().map(|rows| rows.len()).sum();
    assert_eq!(rows, 3000, "every partition's rows are expected");
    assert!(
        stored(&store) == snapshot,
        "{}",
        diff(&stored(&store), &snapshot)
    );

    let mut streaming = start_streaming(&rig, &store);
    let mut history = History {
        rig: &rig,
        had: Vec::new(),
    };
    history.had.push(history.state().await);
    let observer = Observer::start(&store, "u1");
    stream_rows(&mut history, &store, &mut streaming).await;
    change_partitions(&mut history, &store, &streaming).await;
    let seen = observer.stop();
    assert_eq!(
        seen.last(),
        history.had.last(),
        "the client ends at the primary's state"
    );
    assert_each_was_had(&seen, &history.had, "while partitions changed");

    let intent = store
        .read(|view| Ok(BootstrapIntent::load(view)))
        .unwrap()
        .unwrap()
        .unwrap();
    let items = &intent.tables[0];
    assert!(!items.recopy, "no re-copy is left pending: {items:?}");
    let partitions = |rig: &Rig| {
        rig.primary.sql(
            "SELECT string_agg(relid::oid::text, ',' ORDER BY relid::oid) \
             FROM pg_partition_tree('items') WHERE relid <> 'items'::regclass",
        )
    };
    let recorded: Vec<String> = items
        .partitions
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| p.oid.to_string())
        .collect();
    assert_eq!(recorded.join(","), partitions(&rig));

    streaming.stop().await.unwrap();
    rig.primary
        .sql("ALTER TABLE items ATTACH PARTITION items_restart FOR VALUES FROM (400) TO (500)");
    let streaming = start_streaming(&rig, &store);
    until_tables_match(&rig, &store, &streaming, ITEMS, "an attach while stopped").await;
    streaming.stop().await.unwrap();
}

/// Row changes in both partitions, each followed until the buckets match.
async fn stream_rows(history: &mut History<'_>, store: &Store, streaming: &mut Streaming) {
    let steps = [
        (
            "rows inserted into both partitions",
            "INSERT INTO items VALUES (4001, 10, 'u1', 'new low'), (4002, 110, 'u1', 'new high')",
        ),
        (
            "rows updated in both partitions",
            "UPDATE items SET body = 'changed' WHERE id IN (1, 103, 4001)",
        ),
        (
            "a row moved to the other partition",
            "UPDATE items SET part = 150, body = 'moved' WHERE id = 4001",
        ),
        (
            "rows deleted from both partitions",
            "DELETE FROM items WHERE id IN (4, 106, 4002)",
        ),
    ];
    for (what, sql) in steps {
        history.run(sql).await;
        streaming.sync_point(&history.rig.primary).await;
        until_tables_match(history.rig, store, streaming, ITEMS, what).await;
    }
}

/// Partitions attached, detached and emptied, each followed until the buckets match
/// without a write to the primary (the catalog's reading, or the write in the attaching
/// transaction, shows the change).
async fn change_partitions(history: &mut History<'_>, store: &Store, streaming: &Streaming) {
    let steps = [
        (
            "a partition attached with rows",
            "ALTER TABLE items ATTACH PARTITION items_more FOR VALUES FROM (200) TO (300)",
        ),
        (
            "a partition attached, its rows written in the same transaction",
            "ALTER TABLE items ATTACH PARTITION items_late FOR VALUES FROM (300) TO (400); \
             UPDATE items SET body = 'late and changed' WHERE id IN (6001, 6002, 6003, 6004)",
        ),
        (
            "a partition detached",
            "ALTER TABLE items DETACH PARTITION items_high",
        ),
        ("a partition emptied alone", "TRUNCATE items_low"),
    ];
    for (what, sql) in steps {
        history.run(sql).await;
        until_tables_match(history.rig, store, streaming, ITEMS, what).await;
    }
    // The detached table's writes are its own now.
    history
        .run("UPDATE items_high SET body = 'away' WHERE id = 103")
        .await;
    until_tables_match(
        history.rig,
        store,
        streaming,
        ITEMS,
        "a detached table's write",
    )
    .await;
}
