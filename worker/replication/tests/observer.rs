//! A client's view of a store, read again and again while the stream or a rebuild writes:
//! every state a client connecting (or resuming at its last checkpoint) could have
//! completed a checkpoint on. The law of whole checkpoints (`docs/correctness.md`) says
//! each of these is a state the primary had.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use store::Store;
use testkit::buckets::{stored_where, Contents};

/// Reads the buckets a client holds on its own thread until stopped.
pub(crate) struct Observer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Contents>>,
}

impl Observer {
    /// Starts reading the buckets of `store` whose names contain `user` (quoted, as a
    /// bucket parameter), after every commit as near as a tight loop gets.
    pub(crate) fn start(store: &Arc<Store>, user: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (store, user, stopped) = (store.clone(), format!("\"{user}\""), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut seen: Vec<Contents> = Vec::new();
            let read = |seen: &mut Vec<Contents>| {
                let now = stored_where(&store, |name| name.contains(&user));
                if seen.last() != Some(&now) {
                    seen.push(now);
                }
            };
            while !stopped.load(Ordering::Acquire) {
                read(&mut seen);
                std::thread::sleep(Duration::from_micros(200));
            }
            // Once more after the stop: a commit published while the last read was under
            // way (a read of 20,000 rows takes a while on a loaded machine) is the state the
            // caller waited for, and is seen here.
            read(&mut seen);
            seen
        });
        Self { stop, thread }
    }

    /// Stops; returns the distinct states seen, in order, the last read after the stop.
    pub(crate) fn stop(self) -> Vec<Contents> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap()
    }
}

/// `contents` restricted to the buckets whose names contain `user` (quoted).
pub(crate) fn of_user(contents: Contents, user: &str) -> Contents {
    let user = format!("\"{user}\"");
    contents
        .into_iter()
        .filter(|(name, _)| name.contains(&user))
        .collect()
}

/// Fails, naming the first, when a state `seen` is none of the states the primary `had`.
pub(crate) fn assert_each_was_had(seen: &[Contents], had: &[Contents], what: &str) {
    for (i, state) in seen.iter().enumerate() {
        assert!(
            had.contains(state),
            "{what}: state {i} of {} a client could see is none of the primary's {} \
             states:\n{state:#?}\nthe primary had:\n{had:#?}",
            seen.len(),
            had.len()
        );
    }
}
