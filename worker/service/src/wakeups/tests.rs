use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use super::*;
use store::{LookupPut, RowPut};

/// A row shown in `bucket` alone.
fn put<'a>(bucket: &'a str, id: &'a str) -> RowPut<'a> {
    RowPut {
        bucket,
        object_type: "t",
        object_id: id,
        data: id,
        checksum: id.len() as u32,
    }
}

/// A store, its checkpoint channel and the wakeups over them.
struct Rig {
    store: Arc<Store>,
    publish: watch::Sender<Checkpoint>,
    hub: Arc<Wakeups>,
    _dir: tempfile::TempDir,
}

impl Rig {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(&dir.path().join("store")).unwrap());
        let publish = watch::Sender::new(Checkpoint::default());
        let hub = Wakeups::new(&store, publish.subscribe());
        Self {
            store,
            publish,
            hub,
            _dir: dir,
        }
    }

    /// Commits `change` and publishes its checkpoint, as replication does.
    fn commit(&self, lsn: u64, change: impl FnOnce(&mut store::WriteTxn<'_, '_>)) {
        let ((), checkpoint) = self
            .store
            .write(lsn, |w| {
                change(w);
                Ok(())
            })
            .unwrap();
        self.publish.send_replace(checkpoint);
    }
}

/// True when the stream has a wake waiting (consumes it).
fn was_woken(subscription: &Subscription) -> bool {
    let mut woken = pin!(subscription.woken());
    matches!(
        woken.as_mut().poll(&mut Context::from_waker(Waker::noop())),
        Poll::Ready(())
    )
}

/// Waits until the dispatcher handled `n` checkpoints in all. The test's runtime has one
/// thread: the dispatcher runs whenever the test yields, and needs a few polls per
/// checkpoint however fast the machine.
async fn dispatched(hub: &Wakeups, n: u64) {
    for _ in 0..1_000 {
        if hub.registry.lock().dispatches >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "the dispatcher handled {} of {n} checkpoints in 1,000 turns",
        hub.registry.lock().dispatches
    );
}

#[tokio::test]
async fn a_commit_wakes_only_the_streams_holding_a_changed_bucket() {
    let rig = Rig::new();
    let global = rig.hub.register("key-a");
    let user = rig.hub.register("key-b");
    let read = global.dispatches();
    global.watch(["g"], false, read);
    user.watch(["u1", "g2"], false, read);
    assert!(!was_woken(&global) && !was_woken(&user));

    rig.commit(1, |w| {
        w.upsert_row(1, b"r1", &[put("u1", "r1")], &[]).unwrap();
    });
    dispatched(&rig.hub, 1).await;
    assert!(was_woken(&user), "the bucket it holds changed");
    assert!(!was_woken(&global), "nothing it holds changed");

    rig.commit(2, |w| {
        w.upsert_row(1, b"r2", &[put("g", "r2")], &[]).unwrap();
    });
    dispatched(&rig.hub, 2).await;
    assert!(was_woken(&global) && !was_woken(&user));
}

#[tokio::test]
async fn lookups_records_and_held_streams_wake_whom_they_concern() {
    let rig = Rig::new();
    let a = rig.hub.register("key-a");
    let b = rig.hub.register("key-b");
    let held = rig.hub.register("key-c");
    let read = a.dispatches();
    a.watch(["g"], false, read);
    b.watch(["g"], false, read);
    held.watch(["g"], true, read);

    // A lookup changed: any bucket set may resolve differently.
    rig.commit(1, |w| {
        let lookup = [LookupPut {
            key: b"[\"k\"]",
            outputs: b"o",
        }];
        w.upsert_row(2, b"acc", &[], &lookup).unwrap();
    });
    dispatched(&rig.hub, 1).await;
    assert!(was_woken(&a) && was_woken(&b) && was_woken(&held));

    // A's write-checkpoint record, written beside the stream: A alone (and the held one).
    rig.store.put_stage_record("key-a", b"x").unwrap();
    rig.commit(2, |_| {});
    dispatched(&rig.hub, 2).await;
    assert!(was_woken(&a) && !was_woken(&b) && was_woken(&held));

    // The history forked (or the store emptied): everyone.
    rig.store.clear_data().unwrap();
    rig.commit(3, |_| {});
    dispatched(&rig.hub, 3).await;
    assert!(was_woken(&a) && was_woken(&b) && was_woken(&held));
}

#[tokio::test]
async fn a_stream_that_read_before_a_dispatch_wakes_itself() {
    let rig = Rig::new();
    let stream = rig.hub.register("key");
    let read = stream.dispatches();
    // A change of its bucket is dispatched while the stream reads the store (its
    // buckets not registered yet).
    rig.commit(1, |w| {
        w.upsert_row(1, b"r1", &[put("g", "r1")], &[]).unwrap();
    });
    dispatched(&rig.hub, 1).await;
    assert!(was_woken(&stream), "new streams look at every checkpoint");
    stream.watch(["g"], false, read);
    assert!(was_woken(&stream), "it may have missed that change");
    stream.watch(["g"], false, stream.dispatches());
    assert!(!was_woken(&stream));
}

#[tokio::test]
async fn streams_see_the_channel_close_and_leave_no_trace() {
    let rig = Rig::new();
    let stream = rig.hub.register("key");
    stream.watch(["g", "h"], false, stream.dispatches());
    let other = rig.hub.register("key");
    other.watch(["g"], false, other.dispatches());
    assert_eq!(rig.hub.registered(), 2);
    drop(other);
    assert_eq!(rig.hub.registered(), 1);
    {
        let registry = rig.hub.registry.lock();
        assert_eq!(registry.by_bucket.len(), 2);
        assert_eq!(registry.by_bucket["g"].len(), 1);
        assert_eq!(registry.by_key["key"].len(), 1);
    }

    let Rig { publish, hub, .. } = rig;
    drop(publish);
    stream.woken().await;
    assert!(stream.is_closed());
    drop(stream);
    let registry = hub.registry.lock();
    assert!(
        registry.streams.is_empty() && registry.by_bucket.is_empty() && registry.by_key.is_empty()
    );
}

#[test]
fn a_bucket_or_key_of_one_stream_keeps_it_inline_and_of_many_in_a_set() {
    let mut index: HashMap<Arc<str>, Ids> = HashMap::new();
    let name: Arc<str> = Arc::from("b");
    link(&mut index, name.clone(), 1);
    assert!(matches!(index["b"], Ids::One(1)));
    link(&mut index, name.clone(), 1);
    link(&mut index, name.clone(), 2);
    assert_eq!(index["b"].len(), 2);
    let mut ids: Vec<u64> = index["b"].iter().copied().collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 2]);
    unlink(&mut index, &name, 7);
    unlink(&mut index, &name, 1);
    assert_eq!(index["b"].iter().copied().collect::<Vec<_>>(), [2]);
    unlink(&mut index, &name, 2);
    assert!(index.is_empty());
    link(&mut index, name.clone(), 3);
    unlink(&mut index, &name, 4);
    assert!(matches!(index["b"], Ids::One(3)), "another id leaves it");
    unlink(&mut index, &name, 3);
    assert!(index.is_empty());
}
