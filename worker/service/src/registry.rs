//! The open `/sync/stream` connections, for `powersync_mdbx.streams()`. A stream registers
//! once its token is accepted, before its request is read (one short lock: the per-user
//! limit applies before anything of the request is buffered), records its `client_id` once
//! the request is read, updates a few atomics when it sends a checkpoint line, and leaves
//! when it ends (the guard's drop).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use status::unix_now_ms;

/// No checkpoint line sent yet.
const NONE: u64 = u64::MAX;

/// What is known about one open stream.
#[derive(Debug)]
struct Entry {
    user_id: String,
    /// Set once the stream's request is read.
    client_id: OnceLock<Box<str>>,
    started_at_ms: u64,
    token_expires_at: u64,
    last_op_id: AtomicU64,
    last_checkpoint_at_ms: AtomicU64,
    buckets: AtomicU64,
}

/// A copy of one open stream's entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamInfo {
    /// Registry id (unique within the engine's life).
    pub id: u64,
    /// The token's `sub`.
    pub user_id: String,
    /// The request body's `client_id`, if sent (and once the request was read).
    pub client_id: Option<String>,
    /// Unix milliseconds when the stream started.
    pub started_at_ms: u64,
    /// Unix seconds when the token expires (the stream ends then).
    pub token_expires_at: u64,
    /// The op id of the last checkpoint-type line sent; `None` before the first.
    pub last_op_id: Option<u64>,
    /// Unix milliseconds of that line.
    pub last_checkpoint_at_ms: Option<u64>,
    /// Buckets in the set that line announced.
    pub buckets: u64,
}

/// Every open stream.
#[derive(Debug, Default)]
pub struct StreamRegistry {
    next_id: AtomicU64,
    entries: Mutex<Streams>,
}

/// The open streams, and how many each user holds.
#[derive(Debug, Default)]
struct Streams {
    by_id: HashMap<u64, Arc<Entry>>,
    per_user: HashMap<String, usize>,
}

/// A user already holds as many streams as one user may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserStreamsFull {
    /// The limit.
    pub max: usize,
}

impl StreamRegistry {
    /// Records a starting stream of `user_id`, unless the user already holds
    /// `max_per_user` streams; it stays listed while the returned guard lives.
    pub fn register(
        self: &Arc<Self>,
        user_id: &str,
        token_expires_at: u64,
        max_per_user: usize,
    ) -> Result<Registration, UserStreamsFull> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let entry = Arc::new(Entry {
            user_id: user_id.to_owned(),
            client_id: OnceLock::new(),
            started_at_ms: unix_now_ms(),
            token_expires_at,
            last_op_id: AtomicU64::new(NONE),
            last_checkpoint_at_ms: AtomicU64::new(0),
            buckets: AtomicU64::new(0),
        });
        {
            let mut streams = self.entries.lock();
            let held = streams.per_user.entry(user_id.to_owned()).or_insert(0);
            if *held >= max_per_user {
                return Err(UserStreamsFull { max: max_per_user });
            }
            *held += 1;
            streams.by_id.insert(id, entry.clone());
        }
        Ok(Registration {
            registry: self.clone(),
            id,
            entry,
        })
    }

    /// The open streams, oldest first.
    pub fn list(&self) -> Vec<StreamInfo> {
        let mut out: Vec<StreamInfo> = self
            .entries
            .lock()
            .by_id
            .iter()
            .map(|(id, e)| {
                let last = e.last_op_id.load(Ordering::Relaxed);
                StreamInfo {
                    id: *id,
                    user_id: e.user_id.clone(),
                    client_id: e.client_id.get().map(|c| c.to_string()),
                    started_at_ms: e.started_at_ms,
                    token_expires_at: e.token_expires_at,
                    last_op_id: (last != NONE).then_some(last),
                    last_checkpoint_at_ms: (last != NONE)
                        .then(|| e.last_checkpoint_at_ms.load(Ordering::Relaxed)),
                    buckets: e.buckets.load(Ordering::Relaxed),
                }
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }
}

/// A stream's place in the registry; dropping it removes the stream.
#[derive(Debug)]
pub struct Registration {
    registry: Arc<StreamRegistry>,
    id: u64,
    entry: Arc<Entry>,
}

impl Registration {
    /// Records the `client_id` of the stream's request, once it is read (a second call
    /// changes nothing).
    pub fn set_client_id(&self, client_id: Option<&str>) {
        if let Some(client_id) = client_id {
            let _ = self.entry.client_id.set(client_id.into());
        }
    }

    /// Records a checkpoint-type line announcing `buckets` buckets at `op_id`.
    pub fn checkpoint_sent(&self, op_id: u64, buckets: usize) {
        self.entry
            .last_checkpoint_at_ms
            .store(unix_now_ms(), Ordering::Relaxed);
        self.entry.buckets.store(buckets as u64, Ordering::Relaxed);
        self.entry.last_op_id.store(op_id, Ordering::Relaxed);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut streams = self.registry.entries.lock();
        streams.by_id.remove(&self.id);
        if let Some(held) = streams.per_user.get_mut(&self.entry.user_id) {
            *held -= 1;
            if *held == 0 {
                streams.per_user.remove(&self.entry.user_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_listed_while_registered() {
        let registry = Arc::new(StreamRegistry::default());
        let a = registry.register("u1", 100, 10).unwrap();
        let b = registry.register("u2", 200, 10).unwrap();
        assert_eq!(registry.list().len(), 2);
        assert_eq!(registry.list()[0].client_id, None, "no request read yet");
        a.set_client_id(Some("c1"));
        assert_eq!(registry.list()[0].last_op_id, None);
        a.checkpoint_sent(42, 3);
        let listed = registry.list();
        assert_eq!(
            (listed[0].user_id.as_str(), listed[0].client_id.as_deref()),
            ("u1", Some("c1"))
        );
        assert_eq!((listed[0].last_op_id, listed[0].buckets), (Some(42), 3));
        drop(a);
        let listed = registry.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].user_id, "u2");
        drop(b);
        assert!(registry.list().is_empty());
    }

    #[test]
    fn a_user_holds_at_most_its_limit_of_streams() {
        let registry = Arc::new(StreamRegistry::default());
        let first = registry.register("u1", 100, 2).unwrap();
        let _second = registry.register("u1", 100, 2).unwrap();
        assert_eq!(
            registry.register("u1", 100, 2).unwrap_err(),
            UserStreamsFull { max: 2 }
        );
        let _other = registry.register("u2", 100, 2).unwrap();
        drop(first);
        let _again = registry.register("u1", 100, 2).unwrap();
        assert_eq!(registry.list().len(), 3);
    }
}
