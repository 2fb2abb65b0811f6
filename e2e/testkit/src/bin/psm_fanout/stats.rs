//! Percentiles and rounding of measured times, and the worker's anonymous memory and CPU
//! time.

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
    let at = |p| quantile(&sorted, p).map(|v| round(v, digits));
    serde_json::json!({
        "count": sorted.len(),
        "p50": at(0.5),
        "p99": at(0.99),
        "max": at(1.0),
    })
}

/// `x` rounded to `digits` decimals.
pub fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// `RssAnon` of process `pid` in KiB (`None` when unreadable).
pub fn rss_anon_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// User plus system CPU seconds of process `pid` (`None` when unreadable).
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.get(stat.rfind(')')? + 2..)?.split(' ').collect();
    let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Some((ticks(11)? + ticks(12)?) / clock_ticks())
}

/// Clock ticks per second of `/proc/<pid>/stat`.
fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// CPU time of the worker and of this process from a moment on.
pub struct Cpu {
    worker: Option<(u32, f64)>,
    own: Option<f64>,
    at: std::time::Instant,
}

impl Cpu {
    /// Starts counting now.
    pub fn now(worker: Option<u32>) -> Self {
        Self {
            worker: worker.and_then(|pid| Some((pid, cpu_seconds(pid)?))),
            own: cpu_seconds(std::process::id()),
            at: std::time::Instant::now(),
        }
    }

    /// The CPU seconds each took since [`Cpu::now`], and the wall-clock seconds.
    pub fn since(&self) -> serde_json::Value {
        let round = |x: f64| round(x, 2);
        serde_json::json!({
            "wall_seconds": round(self.at.elapsed().as_secs_f64()),
            "worker_cpu_seconds": self.worker
                .and_then(|(pid, before)| Some(round(cpu_seconds(pid)? - before))),
            "psm_fanout_cpu_seconds": self.own
                .and_then(|before| Some(round(cpu_seconds(std::process::id())? - before))),
        })
    }
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
    fn this_process_counts_its_cpu_time() {
        let before = cpu_seconds(std::process::id()).unwrap();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
        assert!(cpu_seconds(std::process::id()).unwrap() > before, "{x}");
    }

    #[test]
    fn this_process_has_anonymous_memory() {
        assert!(rss_anon_kib(std::process::id()).is_some_and(|kib| kib > 0));
    }
}
