//! A fixed-bucket histogram of durations: one relaxed add per bucket, sum and count.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds (seconds) for the checkpoint publish latency: a durable MDBX commit takes
/// about a millisecond on fast disks, tens of milliseconds on slow ones.
pub const PUBLISH_SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Observations of durations.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket (not cumulative), then one for values above the last bound.
    counts: Box<[AtomicU64]>,
    sum_nanos: AtomicU64,
}

/// A histogram as read for one scrape: cumulative counts per upper bound.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound, observations ≤ bound)`, ascending; `+Inf` is `count`.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of the observations, seconds.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new(PUBLISH_SECONDS_BUCKETS)
    }
}

impl Histogram {
    /// An empty histogram with these ascending upper bounds (seconds).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        let index = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        if let Some(c) = self.counts.get(index) {
            c.fetch_add(1, Relaxed);
        }
        let nanos = u64::try_from(value.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Relaxed);
    }

    /// Cumulative counts; `count` is their total, so `+Inf` always equals it.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Relaxed);
            if let Some(&bound) = self.bounds.get(i) {
                buckets.push((bound, total));
            }
        }
        HistogramSnapshot {
            buckets,
            sum: self.sum_nanos.load(Relaxed) as f64 / 1e9,
            count: total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_count_includes_the_overflow() {
        let h = Histogram::new(&[0.01, 0.1, 1.0]);
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(10)); // on the bound: `le` includes it
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_secs(3));
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(0.01, 2), (0.1, 3), (1.0, 3)]);
        assert_eq!(s.count, 4);
        assert!((s.sum - 3.065).abs() < 1e-9);
    }
}
