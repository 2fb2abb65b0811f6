//! Counters split by one label: HTTP status codes, or a fixed list of error codes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// First and last HTTP status counted.
const FIRST_STATUS: u16 = 100;
const LAST_STATUS: u16 = 599;

/// One counter per HTTP status (100–599).
pub struct StatusCounts {
    counts: Box<[AtomicU64]>,
}

impl Default for StatusCounts {
    fn default() -> Self {
        Self {
            counts: (FIRST_STATUS..=LAST_STATUS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }
}

impl StatusCounts {
    /// Counts one answer with `status` (outside 100–599: ignored).
    pub fn add(&self, status: u16) {
        if let Some(c) = self
            .counts
            .get(usize::from(status.wrapping_sub(FIRST_STATUS)))
        {
            c.fetch_add(1, Relaxed);
        }
    }

    /// `(status, count)` for every status seen at least once, ascending.
    pub fn nonzero(&self) -> Vec<(u16, u64)> {
        (FIRST_STATUS..=LAST_STATUS)
            .zip(self.counts.iter())
            .map(|(s, c)| (s, c.load(Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect()
    }
}

/// One counter per label of a fixed list, plus `other` for anything else.
pub struct LabelCounts {
    labels: &'static [&'static str],
    /// `labels.len() + 1` counters; the last is `other`.
    counts: Box<[AtomicU64]>,
}

impl LabelCounts {
    /// Counters for `labels`, all zero.
    pub fn new(labels: &'static [&'static str]) -> Self {
        Self {
            labels,
            counts: (0..=labels.len()).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one event labelled `label`.
    pub fn add(&self, label: &str) {
        let index = self
            .labels
            .iter()
            .position(|l| *l == label)
            .unwrap_or(self.labels.len());
        if let Some(c) = self.counts.get(index) {
            c.fetch_add(1, Relaxed);
        }
    }

    /// `(label, count)` for every label of the list (zeros included, so the series exist
    /// from the start) and `other` when it counted anything.
    pub fn all(&self) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = self
            .labels
            .iter()
            .zip(self.counts.iter())
            .map(|(l, c)| (*l, c.load(Relaxed)))
            .collect();
        let other = self.counts.last().map_or(0, |c| c.load(Relaxed));
        if other > 0 {
            out.push(("other", other));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_count_and_list_only_what_was_seen() {
        let s = StatusCounts::default();
        s.add(200);
        s.add(401);
        s.add(200);
        s.add(99);
        s.add(600);
        assert_eq!(s.nonzero(), vec![(200, 2), (401, 1)]);
    }

    #[test]
    fn labels_outside_the_list_are_other() {
        let c = LabelCounts::new(&["a", "b"]);
        c.add("b");
        assert_eq!(c.all(), vec![("a", 0), ("b", 1)]);
        c.add("zzz");
        assert_eq!(c.all(), vec![("a", 0), ("b", 1), ("other", 1)]);
    }
}
