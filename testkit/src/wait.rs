//! Polling with a deadline, for conditions a test waits on.

use std::time::{Duration, Instant};

/// Calls `probe` every 50 ms until it returns `Some`, or panics after `timeout` with
/// `what` and the last value `describe` gives.
pub fn wait_until<T>(timeout: Duration, what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
