//! Giving the allocator's free memory back when a runtime thread goes idle.
//!
//! The worker serves bursts (thousands of streams opening, a commit sent to all of them)
//! and then idles. An allocator with per-thread heaps (mimalloc, the extension's) keeps
//! the pages a burst freed on a thread until that thread allocates again, and an idle
//! thread does not: 10,000 streams whose first chunks were large left about 0.5 KiB per
//! stream of such pages in the worker (`docs/benchmark.md`, "Fan-out"). The extension,
//! which chooses the allocator, installs how to give them back ([`set_release`]); a
//! runtime thread that parks calls it at most once per [`RELEASE_INTERVAL`].

use std::cell::Cell;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The least time between two releases on one thread: a thread that parks thousands of
/// times a second under load releases twice.
pub const RELEASE_INTERVAL: Duration = Duration::from_millis(500);

/// How long an idle thread of the blocking pool waits for work before it exits (tokio's
/// default: 10 s): its stack and its allocator's pages are given back within a second of
/// a burst (the streams' reads have threads of their own, `service::readers`).
pub(crate) const BLOCKING_THREAD_KEEP_ALIVE: Duration = Duration::from_secs(1);

static RELEASE: OnceLock<fn()> = OnceLock::new();

thread_local! {
    static LAST_RELEASE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Installs `release` (once per process; false if one was installed already).
pub fn set_release(release: fn()) -> bool {
    RELEASE.set(release).is_ok()
}

/// Called by a runtime thread about to park: releases if the last release on this
/// thread is [`RELEASE_INTERVAL`] old.
pub(crate) fn on_park() {
    let Some(release) = RELEASE.get() else { return };
    let now = Instant::now();
    let due = LAST_RELEASE.with(|last| {
        let due = last
            .get()
            .is_none_or(|at| now.duration_since(at) >= RELEASE_INTERVAL);
        if due {
            last.set(Some(now));
        }
        due
    });
    if due {
        release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Releases on this thread (other tests' runtimes may park meanwhile).
        static RELEASES: Cell<usize> = const { Cell::new(0) };
    }

    fn count() {
        RELEASES.with(|n| n.set(n.get() + 1));
    }

    #[test]
    fn a_parking_thread_releases_at_most_once_per_interval() {
        assert!(set_release(count));
        assert!(!set_release(count), "installed once");
        let on_a_fresh_thread = |parks: fn()| {
            std::thread::spawn(move || {
                parks();
                RELEASES.with(Cell::get)
            })
        };
        // Its first park releases, the next ones within the interval do not.
        let releases = on_a_fresh_thread(|| (0..1_000).for_each(|_| on_park()));
        assert_eq!(releases.join().unwrap(), 1);
        let releases = on_a_fresh_thread(|| {
            on_park();
            LAST_RELEASE.with(|last| last.set(Some(Instant::now() - RELEASE_INTERVAL)));
            on_park();
        });
        assert_eq!(
            releases.join().unwrap(),
            2,
            "again once the interval passed"
        );
    }
}
