//! The single writer's sweep of old write-checkpoint requests.
//!
//! The sync service records one request per user and client (`store::write_checkpoints`);
//! a client that invents client ids would grow the store without bound. The applier
//! thread, the store's one writer during streaming, looks at them in its own
//! transactions: when a sweep is due (every minute, or as often as the age when that is
//! shorter) it removes, in the transaction it is about to commit anyway, requests older
//! than the age whose LSN a published checkpoint has passed, looking at no more than
//! [`SWEEP_BUDGET`] records per transaction, so replication is never held up; a sweep
//! that did not finish goes on in the next transaction. Every request causes one (its
//! ping reaches the applier as a message), so requests never pile up unswept.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::progress::StreamProgress;
use store::{Expiry, StoreError, WriteTxn};

/// How long a write-checkpoint request is kept by default (`docs/operations.md` §4.5).
pub const WRITE_CHECKPOINT_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// A sweep starts at most this often.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// Records one transaction looks at, at most.
const SWEEP_BUDGET: usize = 1_000;

/// Where the sweep stands.
#[derive(Debug)]
pub(super) struct Sweep {
    max_age: Duration,
    next_at: Instant,
    resume: Option<Vec<u8>>,
}

impl Default for Sweep {
    fn default() -> Self {
        Self::new(WRITE_CHECKPOINT_MAX_AGE)
    }
}

impl Sweep {
    /// A sweep of requests older than `max_age`, due at the first transaction.
    pub fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            next_at: Instant::now(),
            resume: None,
        }
    }

    /// When due, one bounded pass in `w`'s transaction; `reached_lsn` is the last
    /// published checkpoint's LSN.
    pub fn run(
        &mut self,
        w: &WriteTxn<'_, '_>,
        reached_lsn: u64,
        progress: &StreamProgress,
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        if now < self.next_at {
            return Ok(());
        }
        let expiry = Expiry {
            now: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            max_age: self.max_age.as_secs(),
            reached_lsn,
            budget: SWEEP_BUDGET,
        };
        let pass = w.expire_write_checkpoints(&expiry, self.resume.as_deref())?;
        if pass.expired > 0 {
            tracing::debug!(
                expired = pass.expired,
                examined = pass.examined,
                "expired old write-checkpoint requests"
            );
        }
        progress
            .write_checkpoints_expired
            .fetch_add(pass.expired as u64, Relaxed);
        self.resume = pass.resume;
        if self.resume.is_none() {
            self.next_at = now + SWEEP_EVERY.min(self.max_age);
        }
        Ok(())
    }
}
