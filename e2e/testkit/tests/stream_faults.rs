//! Live fault tests with the real extension: a PostgreSQL 16 primary and a sync replica
//! whose background worker follows the slot. The worker is killed with SIGKILL while it
//! applies a 300,000-row transaction, and the whole replica is stopped with
//! `pg_ctl -m immediate` while changes stream; the worker is killed during the snapshot; the
//! primary is restarted while the worker streams. After each fault the worker comes back,
//! more changes follow, and the store (a copy of its data file, taken with the replica
//! stopped) is compared bucket by bucket with an independent evaluation of the
//! primary's rows: no duplicates, no lost or extra rows, ops adding up to every bucket's
//! count and checksum. The worker's peak memory during the large transaction is printed.
//! Also: the worker killed while a table's re-copy holds the stream's writes.
use testkit::buckets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use buckets::{diff, expected, lsn, stored};
use config::SourceConnection;
use rules::SyncRules;
use serde_json::Value;
use store::Store;
use testkit::{free_port, wait_until, Cluster, ClusterKind, PgInstall, TestDir};

const SCHEMA: &str = "
CREATE TABLE lists (id text PRIMARY KEY, owner_id text NOT NULL, name text);
CREATE TABLE todos (id text PRIMARY KEY, list_id text, title text, done boolean);
CREATE PUBLICATION powersync FOR ALL TABLES;
INSERT INTO lists VALUES ('l1', 'u1', 'groceries'), ('l2', 'u2', 'chores'), ('l3', 'u1', 'misc');
INSERT INTO todos SELECT 't' || g, 'l' || (g % 3 + 1), 'todo ' || g, false
  FROM generate_series(1, 100) g;
";

const RULES: &str = "bucket_definitions:
  by_list:
    parameters: SELECT id AS list_id FROM lists WHERE owner_id = request.user_id()
    data:
      - SELECT * FROM todos WHERE list_id = bucket.list_id
  lists:
    data:
      - SELECT id, owner_id, name FROM lists
";

const TABLES: &[&str] = &["lists", "todos"];

struct Rig {
    install: PgInstall,
    replica: Cluster,
    primary: Cluster,
    connection: SourceConnection,
    rules: SyncRules,
    runtime: tokio::runtime::Runtime,
    /// Last: fields drop in order, and a cluster stops by the pid in its data directory.
    _dir: TestDir,
}

impl Rig {
    fn new() -> Self {
        Self::with_rows("")
    }

    /// [`Rig::new`] with `rows_sql` run on the primary before the replica starts (so the
    /// snapshot copies those rows).
    fn with_rows(rows_sql: &str) -> Self {
        let install = PgInstall::pg16();
        let dir = TestDir::new(&install);
        let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
        primary.sql(SCHEMA);
        if !rows_sql.is_empty() {
            primary.sql(rows_sql);
        }
        let rules_yaml: String = RULES.lines().map(|l| format!("    {l}\n")).collect();
        let config = format!(
            "replication:\n  connections:\n    - type: postgresql\n      uri: {}\n\
             sync_config:\n  content: |\n{rules_yaml}\
             client_auth:\n  audience: [powersync-test]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, k: c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldA}}\n\
             port: {}\n",
            primary.uri("postgres"),
            free_port()
        );
        let path = dir.write("config.yaml", &config);
        let replica = Cluster::start_new(
            &install,
            &dir,
            "replica",
            ClusterKind::SyncReplica,
            &[format!("powersync_mdbx.config_file = '{}'", path.display())],
        );
        replica.sql("CREATE EXTENSION powersync_mdbx");
        let connection = SourceConnection::from_uri(&primary.uri("postgres")).unwrap();
        Self {
            _dir: dir,
            install,
            primary,
            replica,
            connection,
            rules: SyncRules::parse(RULES).unwrap(),
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    /// The worker's status, once the replica answers.
    fn status(&self) -> Option<Value> {
        self.replica.worker_status()
    }

    /// Waits for phase `streaming` from a worker other than `not_pid`; returns its pid.
    fn wait_streaming(&self, not_pid: Option<i64>) -> i64 {
        self.replica.wait_worker("a streaming worker", |s| {
            let pid = s["worker_pid"].as_i64()?;
            (s["phase"] == "streaming" && Some(pid) != not_pid).then_some(pid)
        })
    }

    /// Waits until everything committed on the primary so far is applied (a logical
    /// message moves an idle source's LSN).
    fn sync_point(&self) {
        let head = lsn(&self.primary.sql("SELECT pg_current_wal_lsn()"));
        self.primary
            .sql("SELECT pg_logical_emit_message(false, 'powersync', 'sync point')");
        self.replica
            .wait_worker("the worker applying up to the primary's head", |s| {
                let applied = lsn(s["replication"]["applied_lsn"].as_str()?);
                (applied >= head).then_some(())
            });
    }

    /// Stops the replica, compares a copy of its store with the primary, starts it again.
    /// Returns how many ops of each kind the buckets hold.
    fn assert_store_matches_primary(&self, when: &str) -> BTreeMap<String, u64> {
        self.replica.stop_fast();
        let copy = tempfile::tempdir().unwrap();
        let store_copy = copy.path().join("store");
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&store_copy)
            .unwrap();
        std::fs::copy(
            store_dir(&self.replica).join("mdbx.dat"),
            store_copy.join("mdbx.dat"),
        )
        .unwrap();
        let store = Store::open(&store_copy).unwrap();
        let stored = stored(&store);
        let rules = buckets::rules_for(&store, self.rules.text());
        let expected = self
            .runtime
            .block_on(expected(&self.connection, &rules, TABLES));
        assert!(
            stored == expected,
            "store differs from the primary after {when}:\n{}",
            diff(&stored, &expected)
        );
        let rows: usize = stored.values().map(|b| b.len()).sum();
        eprintln!(
            "after {when}: {} buckets, {rows} bucket rows match the primary",
            stored.len()
        );
        let kinds = op_kinds(&store);
        drop(store);
        self.replica.start();
        kinds
    }
}

/// Op kind → number of ops, over every bucket up to the checkpoint.
fn op_kinds(store: &Store) -> BTreeMap<String, u64> {
    store
        .read(|view| {
            let checkpoint = view.checkpoint()?;
            let mut kinds = BTreeMap::new();
            for (id, _) in view.bucket_names()? {
                for op in view.ops(id, 0, checkpoint.op_id, usize::MAX)?.ops {
                    *kinds.entry(format!("{:?}", op.kind)).or_insert(0) += 1;
                }
            }
            Ok(kinds)
        })
        .unwrap()
}

fn store_dir(replica: &Cluster) -> PathBuf {
    let mut dir = replica.data_dir().as_os_str().to_owned();
    dir.push(".powersync_mdbx");
    dir.into()
}

/// `VmHWM`, `VmRSS`, `RssAnon` of `pid` in KiB.
fn memory_kib(pid: i64) -> Option<(u64, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((field("VmHWM:")?, field("VmRSS:")?, field("RssAnon:")?))
}

/// Peak memory of a process seen while sampling.
#[derive(Debug, Default, Clone, Copy)]
struct Peak {
    hwm: u64,
    rss: u64,
    anon: u64,
}

impl Peak {
    fn sample(&mut self, pid: i64) {
        if let Some((hwm, rss, anon)) = memory_kib(pid) {
            self.hwm = self.hwm.max(hwm);
            self.rss = self.rss.max(rss);
            self.anon = self.anon.max(anon);
        }
    }

    fn print(&self, what: &str) {
        eprintln!(
            "MEASUREMENT worker memory {what}: peak VmHWM {} MiB, peak VmRSS {} MiB, peak RssAnon {} MiB",
            self.hwm / 1024,
            self.rss / 1024,
            self.anon / 1024
        );
    }
}

fn alive(pid: i64) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

fn pg_ctl_immediate_stop(install: &PgInstall, data: &Path) {
    let out = install
        .command("pg_ctl")
        .args(["-w", "-t", "30", "-m", "immediate", "-D"])
        .arg(data)
        .arg("stop")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_worker_killed_inside_a_large_transaction_applies_it_once_after_restart() {
    let rig = Rig::new();
    let first = rig.wait_streaming(None);
    rig.primary
        .sql("UPDATE todos SET done = true WHERE id IN ('t1', 't2', 't3')");
    rig.sync_point();
    let applied_before = lsn(rig.status().unwrap()["replication"]["applied_lsn"]
        .as_str()
        .unwrap());

    let mut idle = Peak::default();
    idle.sample(first);
    idle.print("idle, streaming (lifetime peak so far)");

    // One 300,000-row transaction; the worker receives it only after it commits.
    let started = Instant::now();
    rig.primary.sql(
        "INSERT INTO todos SELECT 'big' || g, 'l' || (g % 3 + 1), repeat('x', 40) || g, false \
         FROM generate_series(1, 300000) g",
    );
    let commit = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    eprintln!(
        "300k-row INSERT committed on the primary in {:?}",
        started.elapsed()
    );

    // Kill the worker inside the transaction: once it wrote part of it to its open store
    // transaction (status() shows the uncommitted changes) and before it committed it.
    let mut peak = Peak::default();
    let in_flight = rig
        .replica
        .wait_worker("the worker inside the transaction", |s| {
            peak.sample(first);
            let applied = lsn(s["replication"]["applied_lsn"].as_str()?);
            assert!(
                applied < commit,
                "the worker committed the transaction before status() showed it inside: {s}"
            );
            let uncommitted = s["replication"]["uncommitted_changes"].as_u64()?;
            (uncommitted > 0).then(|| s.clone())
        });
    // SAFETY: signalling the worker process of our own test cluster.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    peak.print("until the SIGKILL (partial transaction)");
    let applied = lsn(in_flight["replication"]["applied_lsn"].as_str().unwrap());
    let uncommitted = in_flight["replication"]["uncommitted_changes"]
        .as_u64()
        .unwrap();
    eprintln!(
        "killed worker {first} with {uncommitted} of the transaction's 300,000 changes \
         uncommitted (applied LSN {applied:X} before {applied_before:X}..{commit:X})"
    );
    wait_until("the killed worker gone", || (!alive(first)).then_some(()));

    // The postmaster restarts after the crash; the new worker applies the transaction
    // again, from its beginning, once.
    let second = rig.wait_streaming(Some(first));
    let mut peak = Peak::default();
    let started = Instant::now();
    rig.replica
        .wait_worker("the restarted worker applying the transaction", |s| {
            peak.sample(second);
            let applied = lsn(s["replication"]["applied_lsn"].as_str()?);
            (applied >= commit).then_some(())
        });
    peak.print("applying the whole 300k-row transaction after the restart");
    eprintln!("restarted worker applied it in {:?}", started.elapsed());
    // The kill came inside the transaction: the restarted worker applied all of it.
    let s = rig.status().unwrap();
    assert!(
        s["replication"]["changes"].as_u64().unwrap() >= 300_000,
        "the restarted worker applied the transaction itself: {s}"
    );

    // Applied once: the only superseded ops are the three updates made before the
    // kill; a second apply of the transaction would have turned 300,000 PUTs into MOVEs.
    rig.sync_point();
    let kinds = rig.assert_store_matches_primary("a SIGKILL inside a 300k-row transaction");
    eprintln!("ops by kind: {kinds:?}");
    assert_eq!(kinds.get("Move"), Some(&3), "{kinds:?}");
    assert_eq!(kinds.get("Remove"), None, "{kinds:?}");
    rig.wait_streaming(None);

    // More changes after the restart: updates moving rows between buckets, deletes, a
    // parameter row.
    rig.primary
        .sql("UPDATE todos SET list_id = 'l3' WHERE id LIKE 'big%' AND id LIKE '%77'");
    rig.primary.sql("DELETE FROM todos WHERE id LIKE 'big1%5'");
    rig.primary
        .sql("UPDATE lists SET owner_id = 'u3' WHERE id = 'l2'");
    rig.sync_point();
    rig.assert_store_matches_primary("more changes after the restart");
}

/// Whole checkpoints through a crash (`docs/correctness.md`, section 5): the worker is
/// killed with SIGKILL while the store holds the stream's writes for a table's re-copy (a
/// column added under `SELECT *` and a write after it; an open transaction keeps the
/// re-copy's snapshot waiting). Nothing held was published or acknowledged: the restarted
/// worker receives the write again, copies the table again and publishes it whole.
#[test]
fn a_worker_killed_while_a_recopy_holds_its_writes_starts_over_from_the_last_checkpoint() {
    let rig = Rig::with_rows(
        "INSERT INTO todos SELECT 'seed' || g, 'l' || (g % 3 + 1), 'seeded ' || g, false \
         FROM generate_series(1, 5000) g",
    );
    let first = rig.wait_streaming(None);
    rig.sync_point();
    let published = lsn(rig.status().unwrap()["replication"]["applied_lsn"]
        .as_str()
        .unwrap());

    let applied_before = rig.status().unwrap()["replication"]["transactions"]
        .as_u64()
        .unwrap();
    let blocker = rig.primary.hold_transaction("SELECT txid_current()");
    rig.primary
        .sql("ALTER TABLE todos ADD COLUMN priority int DEFAULT 3");
    let before_write = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    rig.primary
        .sql("UPDATE todos SET title = 'after the column' WHERE id = 't1'");
    // The re-copy waits for its snapshot; the write is applied, and must not be published.
    let holding = rig
        .replica
        .wait_worker("the write applied while the re-copy holds", |s| {
            let recopying = s["replication"]["recopying"].as_u64()?;
            let applied = s["replication"]["transactions"].as_u64()?;
            (recopying > 0 && applied > applied_before).then(|| s.clone())
        });
    let applied = lsn(holding["replication"]["applied_lsn"].as_str().unwrap());
    assert!(
        applied <= before_write,
        "the write in the table's new shape was published before its re-copy: {holding}"
    );
    eprintln!("holding since {published:X}; killing worker {first} during the re-copy");
    // SAFETY: signalling the worker process of our own test cluster.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    wait_until("the killed worker gone", || (!alive(first)).then_some(()));
    blocker.commit();

    rig.wait_streaming(Some(first));
    rig.primary
        .sql("UPDATE todos SET done = true WHERE id = 'seed7'");
    rig.sync_point();
    rig.replica
        .wait_worker("the re-copy merged after the restart", |s| {
            (s["replication"]["recopying"].as_u64()? == 0).then_some(())
        });
    rig.assert_store_matches_primary("a SIGKILL while a re-copy held the stream's writes");
}

#[test]
fn an_immediate_stop_of_the_replica_mid_stream_loses_and_duplicates_nothing() {
    let rig = Rig::new();
    let first = rig.wait_streaming(None);
    rig.sync_point();

    // A steady flow on another connection until told to stop: small transactions, and
    // every 300th round a 30,000-row one.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut psql = std::process::Command::new(rig.install.program("psql"))
        .arg(rig.primary.uri("postgres"))
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut input = psql.stdin.take().unwrap();
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            use std::io::Write;
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let mut batch = format!(
                    "INSERT INTO todos VALUES ('s{i}', 'l{}', 'small {i}', false);\n\
                     UPDATE todos SET title = title || '+' WHERE id = 't{}';\n",
                    i % 3 + 1,
                    i % 100 + 1
                );
                if i % 300 == 50 {
                    batch.push_str(&format!(
                        "INSERT INTO todos SELECT 'mid{i}-' || g, 'l' || (g % 3 + 1), 'mid', \
                         false FROM generate_series(1, 30000) g;\n"
                    ));
                }
                input.write_all(batch.as_bytes()).unwrap();
                i += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            input.write_all(b"\\q\n").unwrap();
            i
        })
    };

    // Stop the replica hard once small transactions and a large one were applied and the
    // worker keeps working on the stream.
    let initial = lsn(rig.status().unwrap()["replication"]["applied_lsn"]
        .as_str()
        .unwrap());
    rig.replica.wait_worker("a large transaction applied", |s| {
        (s["replication"]["changes"].as_u64()? > 30_000).then_some(())
    });
    let changes_before = rig.status().unwrap()["replication"]["changes"]
        .as_u64()
        .unwrap();
    rig.replica
        .wait_worker("the worker applying more of the stream", |s| {
            (s["replication"]["changes"].as_u64()? > changes_before + 1_000).then_some(())
        });
    let applied = lsn(rig.status().unwrap()["replication"]["applied_lsn"]
        .as_str()
        .unwrap());
    pg_ctl_immediate_stop(&rig.install, rig.replica.data_dir());
    let head = lsn(&rig.primary.sql("SELECT pg_current_wal_lsn()"));
    assert!(!alive(first));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let rounds = writer.join().unwrap();
    assert!(psql.wait().unwrap().success());
    eprintln!(
        "immediate stop at applied LSN {applied:X} (stream started at {initial:X}, primary at \
         {head:X}); the writer ran {rounds} rounds"
    );
    assert!(applied > initial && applied < head);

    rig.replica.start();
    rig.wait_streaming(Some(first));
    rig.primary
        .sql("UPDATE todos SET done = true WHERE id LIKE 'mid%' AND id LIKE '%3'");
    rig.primary.sql("DELETE FROM todos WHERE id LIKE 's1%'");
    rig.sync_point();
    rig.assert_store_matches_primary("an immediate stop mid-stream");
}

#[test]
fn a_worker_killed_during_the_snapshot_starts_it_over_and_matches_the_primary() {
    // Enough rows that the snapshot is observably under way when the kill comes.
    let rig = Rig::with_rows(
        "INSERT INTO todos SELECT 'snap' || g, 'l' || (g % 3 + 1), repeat('y', 40) || g, false \
         FROM generate_series(1, 300000) g",
    );
    let first = rig
        .replica
        .wait_worker("the worker copying the snapshot", |s| {
            assert_ne!(
                s["phase"], "streaming",
                "the snapshot ended before the kill: {s}"
            );
            let rows = s["replication"]["rows"].as_u64()?;
            let pid = s["worker_pid"].as_i64()?;
            (s["phase"] == "snapshotting" && rows > 0).then_some(pid)
        });
    // SAFETY: signalling the worker process of our own test cluster.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    wait_until("the killed worker gone", || (!alive(first)).then_some(()));

    // The postmaster restarts after the crash; the new worker starts the snapshot over.
    rig.wait_streaming(Some(first));
    rig.primary
        .sql("UPDATE todos SET done = true WHERE id IN ('snap1', 'snap2', 't3')");
    rig.sync_point();
    rig.assert_store_matches_primary("a SIGKILL during the snapshot");
}

#[test]
fn the_primary_restarted_while_streaming_loses_and_duplicates_nothing() {
    let rig = Rig::new();
    let worker = rig.wait_streaming(None);
    rig.primary
        .sql("UPDATE todos SET done = true WHERE id IN ('t1', 't2')");
    rig.sync_point();

    // The primary goes away and comes back; changes before and after.
    rig.primary.sql(
        "INSERT INTO todos SELECT 'before' || g, 'l1', 'x', false FROM generate_series(1, 500) g",
    );
    rig.primary.stop_fast();
    rig.primary.start();
    rig.primary.sql(
        "INSERT INTO todos SELECT 'after' || g, 'l2', 'x', false FROM generate_series(1, 500) g",
    );
    rig.primary
        .sql("DELETE FROM todos WHERE id LIKE 'before1%'");
    rig.sync_point();
    let s = rig.status().unwrap();
    assert_eq!(
        s["worker_pid"].as_i64(),
        Some(worker),
        "the worker reconnected instead of being restarted: {s}"
    );
    rig.assert_store_matches_primary("a restart of the primary while streaming");
}
