//! What the commits since the last look changed, for the sync service's wakeups: a stream
//! needs a new checkpoint line only when a bucket it holds changed, its parameter lookups
//! may resolve differently, or its write-checkpoint record was written. The store records
//! this after each commit; one consumer takes it when a checkpoint is published.

use std::collections::HashSet;

/// Bucket names kept before the log gives up naming them and reports everything changed
/// (nobody took the changes for long: no stream is open).
const MAX_NAMED_BUCKETS: usize = 100_000;

/// The changes of the commits since the last [`super::Store::take_changes`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// Buckets that received ops (or accumulator changes).
    pub buckets: HashSet<String>,
    /// Some parameter lookup was written or removed.
    pub lookups: bool,
    /// Stage records written (write-checkpoint requests among them), by key.
    pub stage_keys: HashSet<String>,
    /// Too much, or something no list describes (the store emptied, the history forked):
    /// every reader should look again.
    pub everything: bool,
}

impl Changes {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        !self.everything && !self.lookups && self.buckets.is_empty() && self.stage_keys.is_empty()
    }

    /// Adds `other`'s changes.
    pub(crate) fn merge(&mut self, other: Changes) {
        self.lookups |= other.lookups;
        self.everything |= other.everything;
        if self.buckets.is_empty() {
            self.buckets = other.buckets;
        } else {
            self.buckets.extend(other.buckets);
        }
        self.stage_keys.extend(other.stage_keys);
        if self.buckets.len() + self.stage_keys.len() > MAX_NAMED_BUCKETS {
            self.everything = true;
            self.buckets = HashSet::new();
            self.stage_keys = HashSet::new();
        }
    }

    /// Everything changed.
    pub(crate) fn everything() -> Self {
        Self {
            everything: true,
            ..Self::default()
        }
    }
}

/// The changes recorded since the consumer last took them.
#[derive(Debug, Default)]
pub(crate) struct ChangeLog(parking_lot::Mutex<Changes>);

impl ChangeLog {
    pub(crate) fn record(&self, changes: Changes) {
        if !changes.is_empty() {
            self.0.lock().merge(changes);
        }
    }

    pub(crate) fn take(&self) -> Changes {
        std::mem::take(&mut *self.0.lock())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_changes_name_their_buckets_until_there_are_too_many() {
        let log = ChangeLog::default();
        log.record(Changes {
            buckets: ["a".to_owned()].into(),
            ..Changes::default()
        });
        log.record(Changes {
            buckets: ["b".to_owned()].into(),
            stage_keys: ["k".to_owned()].into(),
            ..Changes::default()
        });
        let taken = log.take();
        assert_eq!(taken.buckets, ["a".to_owned(), "b".to_owned()].into());
        assert_eq!(taken.stage_keys, ["k".to_owned()].into());
        assert!(!taken.everything && !taken.lookups);
        assert!(log.take().is_empty(), "taken once");

        log.record(Changes {
            buckets: (0..=MAX_NAMED_BUCKETS).map(|i| i.to_string()).collect(),
            ..Changes::default()
        });
        let taken = log.take();
        assert!(taken.everything && taken.buckets.is_empty());
    }
}
