//! Which open streams a published checkpoint concerns. Each stream registers the buckets
//! it announced and its write-checkpoint key; when replication publishes a checkpoint, one
//! task per store takes what the commits since the last one changed
//! ([`store::Store::take_changes`]) and wakes only the streams holding a changed bucket or
//! whose record was written; all of them when parameter lookups changed (a bucket set may
//! resolve differently) or when the changes are not described (the store emptied, the
//! history forked). A stream that must look at every checkpoint (its first one is held,
//! or its write checkpoint waits for the LSN to pass) says so. A commit touching one user's
//! bucket thus costs one stream's work, not one per open stream.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use store::{Changes, Checkpoint, Store};

/// The wakeups of one store's streams.
pub struct Wakeups {
    store: Weak<Store>,
    checkpoints: watch::Receiver<Checkpoint>,
    /// The task that dispatches the store's changes runs (started by the first stream).
    started: AtomicBool,
    /// The store's checkpoint channel closed (its replication stopped): every stream
    /// was woken to see it.
    closed: AtomicBool,
    registry: Mutex<Registry>,
}

#[derive(Default)]
struct Registry {
    next_id: u64,
    /// Dispatches so far: a stream that registers buckets read before the last dispatch
    /// wakes itself (it may have missed a change of them).
    dispatches: u64,
    streams: HashMap<u64, Entry>,
    /// Streams that look at every checkpoint.
    every: HashSet<u64>,
    by_bucket: HashMap<Arc<str>, Ids>,
    by_key: HashMap<Arc<str>, Ids>,
}

/// The streams of one bucket or key. Most have one (a user's own bucket, a connection's
/// write-checkpoint key): kept inline, without a table of its own.
#[derive(Debug)]
enum Ids {
    One(u64),
    Many(HashSet<u64>),
}

impl Ids {
    fn insert(&mut self, id: u64) {
        match self {
            Self::One(one) if *one == id => {}
            Self::One(one) => *self = Self::Many(HashSet::from([*one, id])),
            Self::Many(ids) => {
                ids.insert(id);
            }
        }
    }

    /// Removes `id`; true when none is left.
    fn remove(&mut self, id: u64) -> bool {
        match self {
            Self::One(one) => *one == id,
            Self::Many(ids) => {
                ids.remove(&id);
                ids.is_empty()
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(ids) => ids.len(),
        }
    }

    fn iter(&self) -> impl Iterator<Item = &u64> {
        let (one, many) = match self {
            Self::One(one) => (Some(one), None),
            Self::Many(ids) => (None, Some(ids.iter())),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

struct Entry {
    notify: Arc<Notify>,
    key: Arc<str>,
    buckets: Vec<Arc<str>>,
}

impl Wakeups {
    /// The wakeups of `store`, whose published checkpoints `checkpoints` follows.
    pub fn new(store: &Arc<Store>, checkpoints: watch::Receiver<Checkpoint>) -> Arc<Self> {
        Arc::new(Self {
            store: Arc::downgrade(store),
            checkpoints,
            started: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            registry: Mutex::default(),
        })
    }

    /// Registers a stream whose write-checkpoint record is `key`; it is woken at every
    /// checkpoint until it says which buckets it holds ([`Subscription::watch`]). Starts
    /// the dispatching task on first use (call it inside the runtime).
    pub fn register(self: &Arc<Self>, key: impl Into<Arc<str>>) -> Subscription {
        if !self.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(dispatch_changes(Arc::downgrade(self)));
        }
        let notify = Arc::new(Notify::new());
        let key: Arc<str> = key.into();
        let mut registry = self.registry.lock();
        let id = registry.next_id;
        registry.next_id += 1;
        link(&mut registry.by_key, key.clone(), id);
        registry.every.insert(id);
        registry.streams.insert(
            id,
            Entry {
                notify: notify.clone(),
                key,
                buckets: Vec::new(),
            },
        );
        Subscription {
            id,
            notify,
            hub: self.clone(),
        }
    }

    /// Streams registered now.
    pub fn registered(&self) -> usize {
        self.registry.lock().streams.len()
    }

    /// Wakes the streams `changes` concern.
    fn dispatch(&self, changes: &Changes) {
        let mut registry = self.registry.lock();
        registry.dispatches += 1;
        if changes.everything || changes.lookups {
            for entry in registry.streams.values() {
                entry.notify.notify_one();
            }
            return;
        }
        // A stream named twice is notified twice: it keeps one wake, so no set is built.
        let concerned = changes
            .buckets
            .iter()
            .filter_map(|name| registry.by_bucket.get(name.as_str()))
            .chain(
                changes
                    .stage_keys
                    .iter()
                    .filter_map(|key| registry.by_key.get(key.as_str())),
            )
            .flat_map(Ids::iter)
            .chain(&registry.every);
        for id in concerned {
            if let Some(entry) = registry.streams.get(id) {
                entry.notify.notify_one();
            }
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for entry in self.registry.lock().streams.values() {
            entry.notify.notify_one();
        }
    }
}

/// Takes the store's changes at each published checkpoint and wakes the streams they
/// concern; ends, waking every stream, when the checkpoint channel closes.
async fn dispatch_changes(hub: Weak<Wakeups>) {
    let Some(mut checkpoints) = hub.upgrade().map(|h| h.checkpoints.clone()) else {
        return;
    };
    loop {
        let open = checkpoints.changed().await.is_ok();
        let Some(hub) = hub.upgrade() else { return };
        if !open {
            hub.close();
            return;
        }
        let changes = match hub.store.upgrade() {
            Some(store) => store.take_changes(),
            None => {
                hub.close();
                return;
            }
        };
        hub.dispatch(&changes);
    }
}

/// One stream's place in [`Wakeups`]; unregistered on drop.
pub struct Subscription {
    id: u64,
    notify: Arc<Notify>,
    hub: Arc<Wakeups>,
}

impl Subscription {
    /// True when it belongs to `hub`.
    pub fn is_of(&self, hub: &Arc<Wakeups>) -> bool {
        Arc::ptr_eq(&self.hub, hub)
    }

    /// The dispatches so far: take it before reading the store for a checkpoint, and
    /// give it to [`Self::watch`] afterwards.
    pub fn dispatches(&self) -> u64 {
        self.hub.registry.lock().dispatches
    }

    /// From now on wakes the stream when one of `buckets` or its write-checkpoint record
    /// changes, or at every checkpoint when `every_checkpoint`. `read_after` is
    /// [`Self::dispatches`] from before the store read that gave `buckets`: when a
    /// dispatch came since, the stream is woken at once (it may have missed a change).
    pub fn watch<'a, I>(&self, buckets: I, every_checkpoint: bool, read_after: u64)
    where
        I: IntoIterator<Item = &'a str>,
        I::IntoIter: Clone,
    {
        let buckets = buckets.into_iter();
        let mut registry = self.hub.registry.lock();
        let registry = &mut *registry;
        let Some(entry) = registry.streams.get_mut(&self.id) else {
            return;
        };
        // Most checkpoints leave a stream's set as it was: compared before anything is
        // allocated.
        if !buckets.clone().eq(entry.buckets.iter().map(|b| &**b)) {
            let wanted: Vec<Arc<str>> = buckets
                .map(|name| {
                    registry
                        .by_bucket
                        .get_key_value(name)
                        .map_or_else(|| Arc::from(name), |(shared, _)| shared.clone())
                })
                .collect();
            for old in &entry.buckets {
                unlink(&mut registry.by_bucket, old, self.id);
            }
            for name in &wanted {
                link(&mut registry.by_bucket, name.clone(), self.id);
            }
            entry.buckets = wanted;
        }
        if every_checkpoint {
            registry.every.insert(self.id);
        } else {
            registry.every.remove(&self.id);
        }
        if registry.dispatches != read_after {
            entry.notify.notify_one();
        }
    }

    /// Waits until a checkpoint concerns the stream (a wake while it was busy counts).
    pub async fn woken(&self) {
        self.notify.notified().await;
    }

    /// True once the store's checkpoint channel closed.
    pub fn is_closed(&self) -> bool {
        self.hub.closed.load(Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut registry = self.hub.registry.lock();
        let registry = &mut *registry;
        registry.every.remove(&self.id);
        if let Some(entry) = registry.streams.remove(&self.id) {
            for name in &entry.buckets {
                unlink(&mut registry.by_bucket, name, self.id);
            }
            unlink(&mut registry.by_key, &entry.key, self.id);
        }
    }
}

fn link(index: &mut HashMap<Arc<str>, Ids>, name: Arc<str>, id: u64) {
    index
        .entry(name)
        .and_modify(|ids| ids.insert(id))
        .or_insert(Ids::One(id));
}

fn unlink(index: &mut HashMap<Arc<str>, Ids>, name: &Arc<str>, id: u64) {
    if index.get_mut(name).is_some_and(|ids| ids.remove(id)) {
        index.remove(name);
    }
}

#[cfg(test)]
mod tests;
