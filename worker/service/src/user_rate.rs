//! A request rate per user: a token bucket each, `burst` requests at once, refilled at
//! `per_second`. Users whose bucket is full again are forgotten when the table grows, so
//! its size follows the users active in the last few seconds.

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;

/// Past this many users, the ones at full allowance are dropped before adding another.
const PRUNE_AT: usize = 10_000;

/// Requests allowed per user.
#[derive(Debug)]
pub struct UserRate {
    per_second: f64,
    burst: f64,
    users: Mutex<HashMap<String, (f64, Instant)>>,
}

impl UserRate {
    /// `burst` requests at once, then `per_second`.
    pub fn new(per_second: f64, burst: f64) -> Self {
        Self {
            per_second,
            burst,
            users: Mutex::default(),
        }
    }

    /// Takes one request of `user`: false when the user is over the rate.
    pub fn allow(&self, user: &str) -> bool {
        let now = Instant::now();
        let refill = |tokens: f64, at: Instant| {
            (tokens + now.duration_since(at).as_secs_f64() * self.per_second).min(self.burst)
        };
        let mut users = self.users.lock();
        if users.len() >= PRUNE_AT && !users.contains_key(user) {
            users.retain(|_, (tokens, at)| refill(*tokens, *at) < self.burst);
        }
        let (tokens, at) = users.entry(user.to_owned()).or_insert((self.burst, now));
        *tokens = refill(*tokens, *at);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_gets_its_burst_then_waits_others_are_not_affected() {
        let rate = UserRate::new(0.001, 3.0);
        assert!((0..3).all(|_| rate.allow("u1")));
        assert!(!rate.allow("u1"));
        assert!(rate.allow("u2"));
    }

    #[test]
    fn the_allowance_refills() {
        let rate = UserRate::new(1_000.0, 1.0);
        assert!(rate.allow("u1"));
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(rate.allow("u1"));
    }
}
