//! Percentiles of measured times, and the worker's anonymous memory.

/// The `p` quantile (0–1) of sorted `values` by nearest rank.
pub fn quantile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted.get(rank.min(sorted.len()) - 1).copied()
}

/// `{count, p50, p99, max}` of `values`, rounded to `digits` decimals (nulls when empty).
pub fn summary(values: &[f64], digits: i32) -> serde_json::Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |p| quantile(&sorted, p).map(|v| crate::streams::round(v, digits));
    serde_json::json!({
        "count": sorted.len(),
        "p50": at(0.5),
        "p99": at(0.99),
        "max": at(1.0),
    })
}

/// `RssAnon` of process `pid` in KiB (`None` when unreadable).
pub fn rss_anon_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), Some(50.0));
        assert_eq!(quantile(&values, 0.99), Some(99.0));
        assert_eq!(quantile(&values, 1.0), Some(100.0));
        assert_eq!(quantile(&[7.0], 0.99), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn this_process_has_anonymous_memory() {
        assert!(rss_anon_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }
}
