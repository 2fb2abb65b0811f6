//! Waits bounded by progress, not by the clock.
//!
//! A live test waits while what it waits for still advances, and fails only when that
//! stops advancing for the stall limit, or when the overall limit passes. A slow machine
//! then makes a test slower, never red; a worker that hangs still fails it, with the last
//! progress it showed. Both limits are generous by default and can be set for a run:
//! `PSM_TEST_STALL_S` (default 60) and `PSM_TEST_OVERALL_S` (default 900).

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::Value;

/// How often a probe is asked again.
const POLL: Duration = Duration::from_millis(50);

/// The two limits of every wait.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    /// Fail when no progress marker new to the wait was seen for this long.
    pub stall: Duration,
    /// Fail when the wait took this long, progress or not.
    pub overall: Duration,
}

impl Patience {
    /// The limits of this run: `PSM_TEST_STALL_S`, `PSM_TEST_OVERALL_S`, else 60 s and 15 min.
    pub fn of_run() -> Self {
        let seconds = |name: &str, default: u64| {
            let value = std::env::var(name).ok().map(|v| {
                v.parse::<u64>()
                    .unwrap_or_else(|_| panic!("{name}={v:?} is not a number of seconds"))
            });
            Duration::from_secs(value.unwrap_or(default))
        };
        Self {
            stall: seconds("PSM_TEST_STALL_S", 60),
            overall: seconds("PSM_TEST_OVERALL_S", 900),
        }
    }
}

/// One wait in progress: fed the latest progress marker, it panics once no marker new to
/// this wait was seen for the stall limit, or the overall limit has passed. Progress is a
/// marker never seen before, not merely a changed one: a worker that restarts in a loop
/// shows the same phases and counters again and again, and that is no progress. For
/// loops that poll by themselves (async tests); [`wait_for`] wraps it for the rest.
pub struct Waiting<P> {
    what: String,
    patience: Patience,
    started: Instant,
    /// Hashes of the markers seen (of their `Debug` text).
    seen: HashSet<u64>,
    last: Option<P>,
    last_change: Instant,
}

impl<P: PartialEq + Debug> Waiting<P> {
    /// Starts waiting for `what` (named in the failure) with the run's limits.
    pub fn new(what: impl Into<String>) -> Self {
        Self::with_patience(what, Patience::of_run())
    }

    /// Starts waiting for `what` with the given limits.
    pub fn with_patience(what: impl Into<String>, patience: Patience) -> Self {
        let now = Instant::now();
        Self {
            what: what.into(),
            patience,
            started: now,
            seen: HashSet::new(),
            last: None,
            last_change: now,
        }
    }

    /// Records the current progress; panics when the wait stalled or ran out.
    pub fn progress(&mut self, marker: P) {
        if let Err(message) = self.check(marker) {
            panic!("{message}");
        }
    }

    /// Records the current progress; the failure, when the wait stalled or ran out.
    pub fn check(&mut self, marker: P) -> Result<(), String> {
        let now = Instant::now();
        if self.last.as_ref() != Some(&marker) {
            let mut hasher = DefaultHasher::new();
            format!("{marker:?}").hash(&mut hasher);
            if self.seen.insert(hasher.finish()) {
                self.last_change = now;
            }
            self.last = Some(marker);
        }
        let Patience { stall, overall } = self.patience;
        let last = &self.last;
        if now.duration_since(self.last_change) >= stall {
            return Err(format!(
                "stalled: no progress for {stall:?} waiting for {} (after {:.1?}); last \
                 progress: {last:?}",
                self.what,
                self.started.elapsed()
            ));
        }
        if now.duration_since(self.started) >= overall {
            return Err(format!(
                "timed out after {overall:?} waiting for {} (still advancing); last progress: \
                 {last:?}",
                self.what
            ));
        }
        Ok(())
    }

    /// Time since the wait began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// Calls `probe` every 50 ms until it returns `Ok`; while not done it returns `Err` with
/// what the awaited thing shows of its advance (a worker's status fields, an LSN, a row
/// count). Fails when that stood still for the stall limit, or after the overall limit.
pub fn wait_for<T, P: PartialEq + Debug>(what: &str, probe: impl FnMut() -> Result<T, P>) -> T {
    wait_for_explained(what, probe, |failure| failure)
}

/// [`wait_for`] whose failure message `explain` extends (a server's log, say).
pub fn wait_for_explained<T, P: PartialEq + Debug>(
    what: &str,
    mut probe: impl FnMut() -> Result<T, P>,
    explain: impl FnOnce(String) -> String,
) -> T {
    let mut waiting = Waiting::new(what);
    loop {
        match probe() {
            Ok(value) => return value,
            Err(progress) => {
                if let Err(failure) = waiting.check(progress) {
                    panic!("{}", explain(failure));
                }
            }
        }
        std::thread::sleep(POLL);
    }
}

/// [`wait_for`] for a condition with no progress of its own to show (a process gone, a
/// phase entered): it may take up to the stall limit.
pub fn wait_until<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    wait_for(what, || probe().ok_or(()))
}

/// Awaits `future` (a stream reaching a checkpoint, a task ending) while `progress`
/// advances; fails like [`wait_for`] when it stood still for the stall limit, or after
/// the overall limit. Needs a tokio runtime with its timer.
pub async fn wait_for_future<F: std::future::Future, P: PartialEq + Debug>(
    what: &str,
    mut progress: impl FnMut() -> P,
    future: F,
) -> F::Output {
    let mut waiting = Waiting::new(what);
    let mut future = std::pin::pin!(future);
    loop {
        match tokio::time::timeout(POLL, future.as_mut()).await {
            Ok(output) => return output,
            Err(_) => waiting.progress(progress()),
        }
    }
}

/// The fields of a worker's `status()` JSON that move while it works: its phase, snapshot
/// rows and tables, applied LSN and op id, changes applied, received and uncommitted, a
/// deploy's phase and rows, the last error. Clocks and the primary's position are left
/// out (they move while the worker stands still), and so are its pid and start count (a
/// worker restarting in a loop makes no progress).
pub fn worker_progress(status: &Value) -> Value {
    let r = &status["replication"];
    let d = &status["deploy"];
    serde_json::json!([
        status["phase"],
        status["last_error"]["code"],
        r["tables_done"],
        r["rows"],
        r["applied_lsn"],
        r["last_op_id"],
        r["changes"],
        r["changes_received"],
        r["uncommitted_changes"],
        d["phase"],
        d["rows"],
        d["tables_done"],
        d["applied_lsn"],
    ])
}

/// Prints how long a live test took when dropped (on stderr, past the test harness's
/// capture, so passing tests show it too). Every cluster's [`crate::TestDir`] holds one.
pub struct LiveTestTimer {
    name: String,
    started: Instant,
}

impl LiveTestTimer {
    /// Times the test running on this thread (the harness names the thread after it).
    pub fn start() -> Self {
        let name = std::thread::current()
            .name()
            .unwrap_or("a live test")
            .to_owned();
        Self {
            name,
            started: Instant::now(),
        }
    }
}

impl Drop for LiveTestTimer {
    fn drop(&mut self) {
        let outcome = if std::thread::panicking() {
            "failed"
        } else {
            "done"
        };
        // Straight to the file descriptor: `eprintln!` is captured for passing tests.
        let line = format!(
            "live test {} {outcome} in {:.1} s\n",
            self.name,
            self.started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SHORT: Patience = Patience {
        stall: Duration::from_millis(200),
        overall: Duration::from_secs(60),
    };

    fn poll_for(
        duration: Duration,
        mut step: impl FnMut(u64) -> Result<(), String>,
    ) -> Result<(), String> {
        let started = Instant::now();
        let mut i = 0;
        while started.elapsed() < duration {
            step(i)?;
            i += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    #[test]
    fn a_marker_that_keeps_advancing_is_never_a_stall() {
        let mut waiting = Waiting::with_patience("rows", SHORT);
        assert_eq!(
            poll_for(Duration::from_millis(600), |i| waiting.check(i)),
            Ok(())
        );
    }

    #[test]
    fn a_marker_that_stands_still_fails_after_the_stall_limit() {
        let mut waiting = Waiting::with_patience("the commit", SHORT);
        let failure = poll_for(Duration::from_millis(600), |_| waiting.check(7)).unwrap_err();
        assert!(failure.starts_with("stalled: no progress"), "{failure}");
        assert!(
            failure.contains("the commit") && failure.contains('7'),
            "{failure}"
        );
        assert!(waiting.elapsed() < Duration::from_millis(400));
    }

    #[test]
    fn markers_that_repeat_are_no_progress() {
        // A worker restarting in a loop shows the same phases again and again.
        let mut waiting = Waiting::with_patience("streaming", SHORT);
        let phases = ["starting", "validating", "failed"];
        let failure = poll_for(Duration::from_millis(800), |i| {
            waiting.check(phases[i as usize % 3])
        })
        .unwrap_err();
        assert!(failure.starts_with("stalled"), "{failure}");
    }

    #[test]
    fn the_overall_limit_ends_even_an_advancing_wait() {
        let patience = Patience {
            stall: Duration::from_secs(60),
            overall: Duration::from_millis(200),
        };
        let mut waiting = Waiting::with_patience("forever", patience);
        let failure = poll_for(Duration::from_millis(600), |i| waiting.check(i)).unwrap_err();
        assert!(failure.starts_with("timed out after"), "{failure}");
    }

    #[test]
    fn worker_progress_ignores_clocks_and_restarts() {
        let status = |pid: u64, seconds: f64, lsn: &str| {
            serde_json::json!({
                "phase": "streaming", "worker_pid": pid, "engine_starts": pid,
                "replication": {"applied_lsn": lsn, "snapshot_seconds": seconds,
                                "primary_lsn": "0/FF"}
            })
        };
        let a = worker_progress(&status(1, 1.0, "0/10"));
        assert_eq!(a, worker_progress(&status(2, 9.0, "0/10")));
        assert_ne!(a, worker_progress(&status(1, 1.0, "0/20")));
    }
}
