//! A full disk under the store (a small file system mounted as the storage directory's
//! parent): the failed commit is reported with its code, the last checkpoint is still
//! served (to the stream open before and to a new client) while the ingest waits for
//! space (no exit, no tight loop), and once space is freed it resumes by itself, the store
//! opened again in place; afterwards the store holds exactly what the rules make of the
//! primary's rows.
//! Once on tmpfs and once on ext4 through a loop device, the file system a sync replica
//! most likely runs on. On tmpfs the store writes its pages with file writes, which return
//! `ENOSPC`; on ext4 the stream writes through a writable map (`MDBX_WRITEMAP`), whose
//! data file's space is reserved whenever the store opens it so: without that reservation
//! the ext4 case ends the test process with `SIGBUS` (measured).
//!
//! Mounting needs root (the CI runs as root), and ext4 a loop device and `mkfs.ext4`;
//! without them the test fails and says so.
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use config::SourceConnection;
use engine::host::{Host, HostSettings, Tick};
use status::{Phase, StatusCell};
use store::Store;
use testkit::{
    buckets, free_port, wait_for, worker_progress, Cluster, ClusterKind, PgInstall, SmallDisk,
    TestDir,
};

use crate::engine_rig;
use crate::reads_stay_up::still_open;
use crate::sync_client::{first_checkpoint, rows_of};

pub(crate) const SCHEMA: &str = "
CREATE TABLE notes (id text PRIMARY KEY, body text NOT NULL);
CREATE PUBLICATION powersync FOR TABLE notes;
INSERT INTO notes SELECT 'n' || g, 'small ' || g FROM generate_series(1, 50) g;
";

pub(crate) const RULES: &str =
    "bucket_definitions:\n  everything:\n    data:\n      - SELECT * FROM notes\n";

pub(crate) fn tick_until<T>(
    host: &mut Host,
    what: &str,
    mut done: impl FnMut(&Host) -> Option<T>,
) -> T {
    wait_for(what, || {
        assert_eq!(
            host.tick(),
            Tick::Continue,
            "the worker never exits on a full disk"
        );
        std::thread::sleep(Duration::from_millis(20));
        done(host).ok_or_else(|| {
            worker_progress(&serde_json::to_value(host.status().snapshot()).unwrap())
        })
    })
}

#[test]
fn a_full_tmpfs_is_reported_retried_and_recovered_from_without_loss() {
    let root = tempfile::tempdir().unwrap();
    let disk = SmallDisk::tmpfs(&root.path().join("disk"), "160m");
    full_disk_is_recovered_from(&disk, &root, false);
}

#[test]
fn a_full_ext4_is_reported_retried_and_recovered_from_without_loss() {
    let root = tempfile::tempdir().unwrap();
    let disk = SmallDisk::ext4(
        &root.path().join("disk.img"),
        &root.path().join("disk"),
        160,
    );
    full_disk_is_recovered_from(&disk, &root, true);
}

/// The configuration file at `path`: `primary`, the rules, the sync port `port` and the
/// engine rig's HS256 key.
pub(crate) fn write_config(path: &Path, primary: &Cluster, port: u16) {
    std::fs::write(
        path,
        format!(
            "replication:\n  connections:\n    - uri: {}\n      sslmode: disable\n\
             sync_config:\n  content: |\n{}\nport: {port}\n\
             client_auth:\n  audience: [{}]\n  jwks:\n    keys:\n      - {{kty: oct, alg: HS256, kid: k1, k: '{}'}}\n",
            primary.uri("postgres"),
            RULES
                .lines()
                .map(|l| format!("    {l}"))
                .collect::<Vec<_>>()
                .join("\n"),
            engine_rig::AUDIENCE,
            engine_rig::base64_url(engine_rig::SECRET),
        ),
    )
    .unwrap();
}

/// The settings of a host on `config_file` and `storage_dir`, owning `slot`.
pub(crate) fn host_settings(
    config_file: std::path::PathBuf,
    storage_dir: std::path::PathBuf,
    slot: &str,
) -> HostSettings {
    HostSettings {
        config_file: Some(config_file),
        storage_dir,
        listen_addresses: vec!["127.0.0.1".into()],
        runtime_threads: 2,
        slot_name: slot.into(),
        admin_socket: None,
        peer_secret_file: None,
        peer_secret_in_setting: false,
        peer_loopback: false,
        seed_from: None,
        peer_listen: None,
        peer_tls: Default::default(),
        in_rotation: true,
    }
}

/// A host started with `settings`, once its engine streams.
pub(crate) fn streaming_host(settings: HostSettings) -> Host {
    let no_guard: fn(&mut dyn FnMut()) = |f| f();
    let mut host = Host::new(settings, Arc::new(StatusCell::new(1)), no_guard);
    host.start();
    tick_until(&mut host, "the engine streaming", |h| {
        (h.status().snapshot().phase == Phase::Streaming).then_some(())
    });
    host
}

/// The disk is full: the failed commit is reported, the last checkpoint is still served
/// (to `open`, the stream opened before, and to a new client), and the ingest waits for
/// space without a tight loop.
fn served_while_full(host: &mut Host, port: u16, open: &mut crate::sync_client::Lines) {
    let error = tick_until(host, "the full disk reported", |h| {
        let snap = h.status().snapshot();
        let error = snap.last_error?;
        (snap.phase == Phase::Failed && !snap.ingest.running).then_some(error)
    });
    assert!(error.code.starts_with("PSM_S100"), "{error:?}");
    assert!(!error.needs_operator, "{error:?}");
    assert!(
        error.message.contains("(0 MiB free on its file system)"),
        "the error says the disk is full: {error:?}"
    );
    assert!(
        error
            .message
            .contains("the last checkpoint is still served"),
        "{error:?}"
    );
    // Still served: the stream open before stays open, a new client gets the last
    // checkpoint whole, and the ingest waits for space without a tight loop.
    assert!(host.status().snapshot().ready);
    let (took, client, _) = first_checkpoint(port, "u2");
    println!("disk full: a new client's first checkpoint took {took:?}");
    assert_eq!(
        rows_of(&client, "everything[]").len(),
        50,
        "the last checkpoint, whole"
    );
    assert!(still_open(open), "the open stream was closed");
    let waiting = tick_until(host, "the ingest waiting for space", |h| {
        let ingest = h.status().snapshot().ingest;
        ingest
            .stopped_because
            .filter(|why| why.contains("less than"))
            .map(|_| ingest.failures)
    });
    assert!(waiting >= 1);
}

/// The scenario on `disk`, where the stream writes through the store's map when `map`.
fn full_disk_is_recovered_from(disk: &SmallDisk, root: &tempfile::TempDir, map: bool) {
    let install = PgInstall::pg16();
    let dir = TestDir::new(&install);
    let primary = Cluster::start_new(&install, &dir, "primary", ClusterKind::Primary, &[]);
    primary.sql(SCHEMA);
    let storage = disk.path().join("store");
    let config_file = root.path().join("config.yaml");
    let port = free_port();
    write_config(&config_file, &primary, port);
    let mut host = streaming_host(host_settings(config_file, storage.clone(), "psm_disk_full"));
    let store_status =
        |h: &Host| serde_json::to_value(h.status().snapshot()).unwrap()["store"].clone();
    tick_until(&mut host, "the store's write mode shown", |h| {
        (store_status(h)["writes_through_map"] == map).then_some(())
    });

    let (_, mut kept, mut open) = first_checkpoint(port, "u1");
    // The disk fills up; then 40 MB of rows arrive, more than the store can write. (The
    // file system is larger than the store's file may grow to: libmdbx extends its file
    // in steps, and a store whose file cannot fit the file system at all fails for good.)
    let filler = disk.fill();
    primary.sql(
        "INSERT INTO notes SELECT 'big' || g, repeat(md5(g::text), 3125) \
         FROM generate_series(1, 400) g",
    );
    served_while_full(&mut host, port, &mut open);

    // Space is freed: the worker resumes by itself and catches up.
    std::fs::remove_file(&filler).unwrap();
    let head = primary.sql("SELECT pg_current_wal_lsn()");
    primary.sql("SELECT pg_logical_emit_message(false, 'powersync', 'disk freed')");
    tick_until(
        &mut host,
        "the engine applied past the primary's head",
        |h| {
            let snap = serde_json::to_value(h.status().snapshot()).unwrap();
            let applied = snap["replication"]["applied_lsn"].as_str()?;
            (snap["phase"] == "streaming" && buckets::lsn(applied) >= buckets::lsn(&head))
                .then_some(())
        },
    );
    // The stream open throughout, across the store's reopen, gets every row.
    let resumed = std::time::Instant::now();
    while rows_of(&kept, "everything[]").len() < 450 {
        kept.apply(&open.until_complete());
    }
    println!(
        "disk freed: the stream open throughout held every row {:?} after the ingest caught up",
        resumed.elapsed()
    );
    assert!(host.shutdown());

    // Nothing lost, nothing twice: the store equals the rules applied to the rows.
    let conn = SourceConnection::from_uri(&primary.uri("postgres")).unwrap();
    let store = Store::open(&storage).unwrap();
    let rules = buckets::rules_for(&store, RULES);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let expected = runtime.block_on(buckets::expected(&conn, &rules, &["notes"]));
    let stored = buckets::stored(&store);
    assert_eq!(
        stored.values().map(|rows| rows.len()).sum::<usize>(),
        450,
        "every row"
    );
    let diff = buckets::diff(&stored, &expected);
    assert!(diff.is_empty(), "{diff}");
    drop(store);
}

/// The switch to writing through the map on a full disk: the data file has a hole (space
/// libmdbx does not use, here punched past its last used page while the store is open) that
/// the reservation cannot fill, so the store stays open with file writes and goes on
/// serving what it holds; once space is free it switches. (Closed on that full disk, the
/// store would not open again.)
#[test]
fn a_store_whose_space_cannot_be_reserved_keeps_file_writes() {
    let root = tempfile::tempdir().unwrap();
    let disk = SmallDisk::ext4(&root.path().join("disk.img"), &root.path().join("disk"), 64);
    let dir = disk.path().join("store");
    let put = |store: &Store, lsn: u64, id: &str| {
        let row = store::RowPut {
            bucket: "1#everything[]",
            object_type: "notes",
            object_id: id,
            data: "{}",
            checksum: 1,
        };
        store.write(lsn, |w| w.upsert_row(1, id.as_bytes(), &[row], &[]))
    };
    let store = Store::open(&dir).unwrap();
    put(&store, 10, "a").unwrap();
    let (unused_from, file) = (
        store.used_bytes().next_multiple_of(4096),
        store.file_bytes(),
    );
    assert!(
        file >= unused_from + (128 << 10),
        "a file larger than its pages ({unused_from} of {file})"
    );
    let punched = Command::new("fallocate")
        .args(["--punch-hole", "--offset", &unused_from.to_string()])
        .args(["--length", &(file - unused_from).to_string()])
        .arg(dir.join("mdbx.dat"))
        .status()
        .expect("fallocate runs");
    assert!(punched.success(), "fallocate --punch-hole");
    let filler = disk.fill();

    assert!(!store.write_through_map().unwrap(), "no space to reserve");
    assert!(!store.writes_through_map());
    let checkpoint = store.read(|v| v.checkpoint()).unwrap();
    assert_eq!(checkpoint.lsn, 10, "what it holds is still read");

    std::fs::remove_file(&filler).unwrap();
    assert!(store.write_through_map().unwrap(), "space again: the map");
    put(&store, 11, "b").unwrap();
    assert_eq!(store.read(|v| v.checkpoint()).unwrap().lsn, 11);
}
