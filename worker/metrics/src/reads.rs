//! Open MDBX read transactions: a small array of start times claimed with one
//! compare-and-swap, so the age of the oldest open read costs a scan of 64 words.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Reads tracked at once; more run untracked (the store caps sync reads at 8).
const SLOTS: usize = 64;

/// Start times of the reads in progress, and how many started.
#[derive(Debug)]
pub struct ReadTracker {
    epoch: Instant,
    /// Microseconds since `epoch` plus one; 0 is a free slot.
    slots: [AtomicU64; SLOTS],
    total: AtomicU64,
}

/// Holds a slot while a read is open; frees it when dropped.
pub struct ReadGuard<'a> {
    slot: Option<&'a AtomicU64>,
}

impl Default for ReadTracker {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
            total: AtomicU64::new(0),
        }
    }
}

impl ReadTracker {
    /// Records a read starting now.
    pub fn start(&self) -> ReadGuard<'_> {
        self.total.fetch_add(1, Relaxed);
        let now = self.micros(Instant::now()) + 1;
        let slot = self
            .slots
            .iter()
            .find(|s| s.compare_exchange(0, now, Relaxed, Relaxed).is_ok());
        ReadGuard { slot }
    }

    /// Reads started since the store opened.
    pub fn total(&self) -> u64 {
        self.total.load(Relaxed)
    }

    /// How long the oldest read still open has been open (zero when none is).
    pub fn oldest_age(&self) -> Duration {
        let oldest = self
            .slots
            .iter()
            .map(|s| s.load(Relaxed))
            .filter(|&v| v > 0)
            .min();
        match oldest {
            Some(start) => {
                let now = self.micros(Instant::now()) + 1;
                Duration::from_micros(now.saturating_sub(start))
            }
            None => Duration::ZERO,
        }
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX - 1)
    }
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            slot.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_open_read_counts_until_it_ends() {
        let t = ReadTracker::default();
        assert_eq!(t.oldest_age(), Duration::ZERO);
        let first = t.start();
        std::thread::sleep(Duration::from_millis(20));
        let second = t.start();
        assert!(t.oldest_age() >= Duration::from_millis(20));
        drop(first);
        assert!(t.oldest_age() < Duration::from_millis(20));
        drop(second);
        assert_eq!(t.oldest_age(), Duration::ZERO);
        assert_eq!(t.total(), 2);
        // More reads than slots: the extra ones are counted, not tracked.
        let guards: Vec<_> = (0..SLOTS + 3).map(|_| t.start()).collect();
        assert_eq!(t.total(), 2 + SLOTS as u64 + 3);
        drop(guards);
        assert_eq!(t.oldest_age(), Duration::ZERO);
    }
}
