//! Tables that change identity on the primary: re-keyed, dropped and created again,
//! renamed away and back; and a dropped slot rebuilt from a new one.

use super::*;

/// A table whose replica identity changes is copied again under its new keys while the
/// stream goes on (each stored row moves to its new key with its ops: clients get no op
/// for it), and its rows are followed by the new keys after that; a slot dropped
/// on the primary is rebuilt by the next stream; a renamed table's rows leave the buckets
/// while the other tables stream on (a replica started now would not find it), and it is
/// copied again when renamed back; a dropped table's rows leave too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_keyed_table_is_copied_again_a_dropped_slot_rebuilt_a_renamed_one_left_and_copied_back(
) {
    let (rig, store) = seeded(5_000).await;
    let mut streaming = start_streaming(&rig, &store);
    rig.primary
        .sql("INSERT INTO todos VALUES ('a', 'l1', 'before', 'open')");
    let before = streaming.sync_point(&rig.primary).await;
    rig.primary.sql("ALTER TABLE todos REPLICA IDENTITY FULL");
    rig.primary
        .sql("INSERT INTO todos VALUES ('b', 'l1', 'after', 'open')");
    rig.primary
        .sql("UPDATE todos SET title = 'updated while copied' WHERE id = 'seed7'");
    rig.primary.sql("DELETE FROM todos WHERE id = 'seed8'");
    until_matches_primary(&rig, &store, &mut streaming, "the replica identity changed").await;
    // Rows move to their new keys with their ops: only the three changes wrote ops (a
    // PUT or REMOVE in the row's list bucket and in its status bucket each).
    let after = streaming.sync_point(&rig.primary).await;
    assert_eq!(after.op_id - before.op_id, 6, "{before:?} → {after:?}");
    rig.primary.sql(
        "UPDATE todos SET status = 'done' WHERE id IN ('a', 'seed9'); \
         DELETE FROM todos WHERE id = 'seed10'",
    );
    streaming.sync_point(&rig.primary).await;
    assert_matches_primary(&rig, &store, "changes under the new keys").await;
    streaming.stop().await.unwrap();

    // A slot dropped on the primary: the next stream rebuilds from a new one.
    rig.primary.drop_slot(SLOT);
    // A transaction left open holds the rebuild at its slot creation: meanwhile the
    // progress says why it rebuilds and how far it is.
    let held = rig
        .primary
        .hold_transaction("INSERT INTO lists VALUES ('held', 'u9')");
    let mut streaming = start_streaming(&rig, &store);
    let shown = wait_until("the rebuild in the progress", || {
        streaming.progress.rebuild.lock().clone()
    });
    assert!(shown.why.contains(SLOT), "{shown:?}");
    assert_eq!(
        (shown.tables_total, shown.tables_done, shown.rows_merged),
        (TABLES.len() as u64, 0, 0),
        "{shown:?}"
    );
    held.commit();
    streaming.sync_point(&rig.primary).await;
    assert_matches_primary(&rig, &store, "the rebuild from a new slot").await;
    assert!(streaming.progress.rebuild.lock().is_none());
    rig.primary
        .sql("UPDATE todos SET title = 'after the rebuild' WHERE id = 'b'");
    streaming.sync_point(&rig.primary).await;
    assert_matches_primary(&rig, &store, "a change after the rebuild").await;

    // Swapped for a copy in several transactions (renamed away, a new table of its name
    // filled and published): its rows never leave the buckets, even when the catalog
    // reading sees it missing meanwhile, and the copy writes no op (the new table is keyed
    // by its primary key again: rows move without ops).
    let before = streaming.sync_point(&rig.primary).await;
    rig.primary.sql("ALTER TABLE todos RENAME TO todos_old");
    wait_until("the catalog reading to see todos missing", || {
        (streaming.progress.tables_missing.load(Relaxed) == 1).then_some(())
    });
    rig.primary.sql_each(&[
        "CREATE TABLE todos (LIKE todos_old INCLUDING ALL)",
        "INSERT INTO todos SELECT * FROM todos_old",
        "ALTER PUBLICATION powersync ADD TABLE todos",
        "DROP TABLE todos_old",
    ]);
    until_tables_match(&rig, &store, &streaming, TABLES, "the table swapped").await;
    let after = streaming.sync_point(&rig.primary).await;
    assert_eq!(after.op_id, before.op_id, "{before:?} → {after:?}");
    assert_eq!(streaming.progress.tables_gone.load(Relaxed), 0);

    // Renamed: after a while its rows leave the buckets (a write of it under the new name
    // too), the other tables go on.
    let without_todos: Vec<&str> = TABLES.iter().copied().filter(|t| *t != "todos").collect();
    rig.primary.sql("ALTER TABLE todos RENAME TO todos_renamed");
    rig.primary
        .sql("INSERT INTO todos_renamed VALUES ('c', 'l1', 'renamed', 'open')");
    rig.primary.sql("INSERT INTO lists VALUES ('l3', 'u3')");
    until_tables_match(&rig, &store, &streaming, &without_todos, "a renamed table").await;
    assert_eq!(streaming.progress.tables_gone.load(Relaxed), 1);
    // A restart keeps it gone (the bootstrap does not refuse the missing table).
    streaming.stop().await.unwrap();
    let streaming = start_streaming(&rig, &store);
    rig.primary.sql("INSERT INTO lists VALUES ('l4', 'u4')");
    until_tables_match(&rig, &store, &streaming, &without_todos, "a restart").await;
    // Renamed back: copied again, the row written meanwhile included.
    rig.primary.sql("ALTER TABLE todos_renamed RENAME TO todos");
    until_tables_match(&rig, &store, &streaming, TABLES, "the table renamed back").await;
    assert_eq!(streaming.progress.tables_gone.load(Relaxed), 0);
    // Dropped: its rows leave the buckets, with no write after the DROP.
    rig.primary.sql("DROP TABLE notes");
    let without_notes: Vec<&str> = TABLES.iter().copied().filter(|t| *t != "notes").collect();
    until_tables_match(&rig, &store, &streaming, &without_notes, "a dropped table").await;
    streaming.stop().await.unwrap();
}

/// A covered table dropped, created again under its name and added back to the
/// publication: with its first change the stream copies the new table again; the rows of
/// the old one that the new one lacks go, a row the new one holds unchanged keeps its op.
/// While it is copied, its progress says which table, why and how far.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_dropped_and_created_again_is_copied_again() {
    let rig = Rig::new();
    rig.primary
        .sql("INSERT INTO docs VALUES (2, 'two', 'second'), (3, 'three', 'third')");
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming(&rig, &store);
    let before = streaming.sync_point(&rig.primary).await;
    // A transaction left open holds the re-copy at its slot creation: meanwhile the
    // progress shows the table, why it is copied, nothing merged yet.
    let held = rig
        .primary
        .hold_transaction("INSERT INTO lists VALUES ('held', 'u9')");
    rig.primary.sql(
        "BEGIN;
         DROP TABLE docs;
         CREATE TABLE docs (id integer PRIMARY KEY, title text, body text);
         INSERT INTO docs VALUES (1, 'small', 'tiny body'), (3, 'three again', 'third');
         ALTER PUBLICATION powersync ADD TABLE docs;
         COMMIT;",
    );
    rig.primary
        .sql("INSERT INTO docs VALUES (4, 'four', 'written after')");
    let shown = wait_until("the re-copy in the progress", || {
        let shown = streaming.progress.recopies.lock().clone();
        (!shown.is_empty()).then_some(shown)
    });
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert_eq!(shown[0].table, "public.docs");
    assert!(
        shown[0].why.contains("dropped and created again"),
        "{shown:?}"
    );
    assert_eq!(shown[0].rows_merged, 0, "{shown:?}");
    assert!(shown[0].started_at > 0, "{shown:?}");
    held.commit();
    until_matches_primary(&rig, &store, &mut streaming, "the table created again").await;
    let after = streaming.sync_point(&rig.primary).await;
    // Row 4's PUT, row 3's new PUT, row 2's REMOVE; row 1 is as it was (the held row is
    // a parameter row: no bucket op).
    // The re-copy's merge is this replica's own: the history forked before its ops.
    let forks = store.read(|v| v.forks()).unwrap();
    assert_eq!(forks.list().len(), 1, "{forks:?}");
    assert_eq!(
        forks.given_out(before.op_id, after.op_id),
        3,
        "{before:?} → {after:?}, {forks:?}"
    );
    assert!(streaming.progress.recopies.lock().is_empty());
    streaming.stop().await.unwrap();
}

/// Tables `todos_a`, `todos_b` (and `todosx`, which the prefix does not match).
const WILDCARD_SCHEMA: &str = "
        CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL);
        CREATE TABLE todos_a (id text PRIMARY KEY, list_id text, title text);
        CREATE TABLE todos_b (id text PRIMARY KEY, list_id text, title text);
        CREATE TABLE todosx (id text PRIMARY KEY, list_id text, title text);
        CREATE PUBLICATION powersync FOR TABLE lists, todos_a, todos_b, todosx;
        INSERT INTO lists VALUES ('l1', 'u1'), ('l2', 'u2');
        INSERT INTO todos_a VALUES ('a1', 'l1', 'one'), ('a2', 'l2', 'two');
        INSERT INTO todos_b VALUES ('b1', 'l1', 'three');
        INSERT INTO todosx VALUES ('x1', 'l1', 'not matched');
    ";
const WILDCARD_RULES: &str = r#"
bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT id, title, _table_suffix AS kind FROM "todos_%" WHERE list_id = bucket.list_id
"#;

/// A wildcard table (`"todos_%"`): the snapshot copies every published table it matches;
/// a matching table created later is followed from its first change without a restart,
/// its rows written before it was published copied too, and it stays followed after a
/// restart; a table the prefix does not match stays out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wildcard_table_follows_the_tables_it_matches_created_later_too() {
    const FIRST: &[&str] = &["lists", "todos_a", "todos_b", "todosx"];
    const THEN: &[&str] = &["lists", "todos_a", "todos_b", "todosx", "todos_c"];
    const ALL: &[&str] = &[
        "lists", "todos_a", "todos_b", "todosx", "todos_c", "todos_d",
    ];
    let rig = Rig::with(WILDCARD_SCHEMA, WILDCARD_RULES);
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming(&rig, &store);
    streaming.sync_point(&rig.primary).await;
    until_tables_match(&rig, &store, &streaming, FIRST, "the snapshot").await;

    // Created, filled and published in one transaction: followed from its Relation.
    rig.primary.sql(
        "BEGIN;
         CREATE TABLE todos_c (id text PRIMARY KEY, list_id text, title text);
         INSERT INTO todos_c VALUES ('c1', 'l1', 'new table'), ('c2', 'l2', 'new too');
         ALTER PUBLICATION powersync ADD TABLE todos_c;
         COMMIT;",
    );
    rig.primary
        .sql("INSERT INTO todosx VALUES ('x2', 'l2', 'still not matched')");
    streaming.sync_point(&rig.primary).await;
    until_tables_match(&rig, &store, &streaming, THEN, "a matching table created").await;

    // Filled before it was published (those rows never pass through the slot): its first
    // change after that copies them.
    rig.primary.sql_each(&[
        "CREATE TABLE todos_d (id text PRIMARY KEY, list_id text, title text)",
        "INSERT INTO todos_d VALUES ('d1', 'l1', 'written before it was published')",
        "ALTER PUBLICATION powersync ADD TABLE todos_d",
        "INSERT INTO todos_d VALUES ('d2', 'l2', 'its first change')",
    ]);
    streaming.sync_point(&rig.primary).await;
    until_tables_match(&rig, &store, &streaming, ALL, "todos_d copied").await;
    streaming.stop().await.unwrap();

    // A restart follows the tables added since the snapshot.
    let mut streaming = start_streaming(&rig, &store);
    rig.primary.sql_each(&[
        "UPDATE todos_c SET list_id = 'l2' WHERE id = 'c1'",
        "DELETE FROM todos_d WHERE id = 'd1'",
    ]);
    streaming.sync_point(&rig.primary).await;
    until_tables_match(&rig, &store, &streaming, ALL, "after a restart").await;
    streaming.stop().await.unwrap();
}

/// A new table the wildcard matches without a replica identity: the stream stops with
/// `PSM_R2012` naming it, before anything of it is applied, and the other tables' rows are
/// served as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_table_a_wildcard_matches_without_a_key_stops_the_stream_with_its_name() {
    let message = stream_end_for_a_new_table(&[
        "CREATE TABLE todos_nokey (id text, list_id text, title text)",
        "ALTER PUBLICATION powersync ADD TABLE todos_nokey",
        "INSERT INTO todos_nokey VALUES ('n1', 'l1', 'no key')",
    ])
    .await;
    assert!(
        message.starts_with("PSM_R2012") && message.contains("public.todos_nokey"),
        "{message}"
    );
}

/// A new table the wildcard matches, published with a row filter: the stream cannot follow
/// every row of it, so its copy is refused with the publication's error (`PSM_R1009`) and
/// nothing of it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_table_a_wildcard_matches_published_with_a_row_filter_is_refused() {
    if testkit::PgInstall::primary().major() < 15 {
        // Row filters came with PostgreSQL 15: an older primary refuses to publish one, so
        // no stream can meet it.
        let rig = Rig::with(WILDCARD_SCHEMA, WILDCARD_RULES);
        rig.primary
            .sql("CREATE TABLE todos_f (id text PRIMARY KEY, list_id text, title text)");
        let refused = rig
            .primary
            .try_sql("ALTER PUBLICATION powersync ADD TABLE todos_f WHERE (list_id = 'l1')")
            .unwrap_err();
        assert!(refused.contains("syntax error"), "{refused}");
        return;
    }
    let message = stream_end_for_a_new_table(&[
        "CREATE TABLE todos_f (id text PRIMARY KEY, list_id text, title text)",
        "ALTER PUBLICATION powersync ADD TABLE todos_f WHERE (list_id = 'l1')",
        "INSERT INTO todos_f VALUES ('f1', 'l1', 'published'), ('f2', 'l2', 'filtered out')",
    ])
    .await;
    assert!(
        message.contains("PSM_R1009") && message.contains("todos_f"),
        "{message}"
    );
}

/// Runs `statements` (a new table the wildcard matches) against a streaming store and
/// returns the error the stream ended with; the stored rows must be as they were.
async fn stream_end_for_a_new_table(statements: &[&str]) -> String {
    let rig = Rig::with(WILDCARD_SCHEMA, WILDCARD_RULES);
    let store = bootstrapped(&rig).await;
    let mut streaming = start_streaming(&rig, &store);
    streaming.sync_point(&rig.primary).await;
    let before = stored(&store);
    rig.primary.sql_each(statements);
    let ended = wait_for_future("the stream to end", || (), streaming.task)
        .await
        .unwrap();
    assert!(stored(&store) == before, "the stored rows changed");
    ended.unwrap_err().to_string()
}
