//! Source transactions received from the primary and not yet published, for the
//! replication lag in seconds: the stream adds each at its Begin, the applier removes
//! them when it publishes a checkpoint past them.

use std::collections::VecDeque;

use parking_lot::Mutex;

/// `(commit LSN, commit time on the primary in Unix microseconds)`, in commit order.
/// Bounded by the change queue between the stream and the applier, except while the store
/// holds its writes for a re-copy: then every transaction applied waits here for the
/// merge (16 bytes each: 1 MiB for a minute at 1,000 transactions a second).
#[derive(Debug, Default)]
pub struct PendingCommits {
    queue: Mutex<VecDeque<(u64, i64)>>,
}

impl PendingCommits {
    /// A transaction that commits at `commit_lsn` arrived (its Begin).
    pub fn received(&self, commit_lsn: u64, commit_unix_micros: i64) {
        self.queue
            .lock()
            .push_back((commit_lsn, commit_unix_micros));
    }

    /// A checkpoint at `lsn` is published: every transaction committed below it is done.
    pub fn published(&self, lsn: u64) {
        let mut queue = self.queue.lock();
        while queue.front().is_some_and(|&(commit, _)| commit < lsn) {
            queue.pop_front();
        }
    }

    /// Forgets everything (a new stream delivers again from the durable LSN).
    pub fn clear(&self) {
        self.queue.lock().clear();
    }

    /// The primary's commit time of the oldest transaction not yet published.
    pub fn oldest_commit_unix_micros(&self) -> Option<i64> {
        self.queue.lock().front().map(|&(_, at)| at)
    }

    /// The replication lag at `now_unix_ms`: how long ago the oldest transaction not yet
    /// published committed on the primary; 0 when every one received is published.
    pub fn lag_seconds(&self, now_unix_ms: u64) -> f64 {
        self.oldest_commit_unix_micros().map_or(0.0, |commit| {
            (now_unix_ms as f64 / 1e3 - commit as f64 / 1e6).max(0.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishing_removes_what_committed_below_the_checkpoint() {
        let p = PendingCommits::default();
        assert_eq!(p.oldest_commit_unix_micros(), None);
        p.received(100, 1);
        p.received(200, 2);
        p.published(150);
        assert_eq!(p.oldest_commit_unix_micros(), Some(2));
        p.published(200); // the checkpoint's LSN is the commit's end, above the commit
        assert_eq!(p.oldest_commit_unix_micros(), Some(2));
        p.published(201);
        assert_eq!(p.oldest_commit_unix_micros(), None);
        p.received(300, 3);
        p.clear();
        assert_eq!(p.oldest_commit_unix_micros(), None);
    }
}
