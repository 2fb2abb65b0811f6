//! Telling a quiet replication connection from a dead one. A network that stops
//! forwarding (a stalled proxy, a NAT that forgot the flow) leaves both sockets open, so
//! neither TCP keepalives nor a read ever report it. While the stream is silent, the
//! primary is asked over an ordinary connection whether it still hears this worker: its
//! walsender asks an idle client to reply every `wal_sender_timeout / 2`, so a walsender
//! that has heard nothing for longer than that (or none holding the slot) means the
//! stream is gone, and it is started again. An idle stream says nothing either way (this
//! worker reports progress only when there is some), so before that verdict a logical
//! message is sent through the primary: a stream that receives it is alive.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pg_walstream::CancellationToken;

use crate::plan::SourcePlan;
use crate::progress::StreamProgress;
use source::{connect, emit_marker, slot_walsender};

/// How long one question to the primary over an ordinary connection may take: a network
/// that stops forwarding leaves it unanswered and closes nothing.
pub(super) const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// `question`'s answer, or `None` when it did not come within [`ASK_TIMEOUT`].
pub(super) async fn asked<T>(question: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(ASK_TIMEOUT, question).await.ok()
}

/// When a silent stream is checked and when it counts as dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// A stream silent this long is checked with the primary.
    pub quiet_after: Duration,
    /// How often a silent stream is checked.
    pub check_every: Duration,
    /// The primary having heard nothing from this worker for this long means the stream
    /// is dead. `None`: the primary's `wal_sender_timeout`, at least 30 s (10 min when
    /// the primary sets it to 0 and so never asks an idle client to reply).
    pub dead_after: Option<Duration>,
    /// How long the checks before a stream and its start may take. The liveness check
    /// runs only once a stream runs: a network that stops forwarding during its setup
    /// (nothing closes) would otherwise hold it forever.
    pub setup_within: Duration,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            quiet_after: Duration::from_secs(10),
            check_every: Duration::from_secs(5),
            dead_after: None,
            setup_within: Duration::from_secs(60),
        }
    }
}

impl Liveness {
    /// The bound for a primary whose `wal_sender_timeout` is `sender_timeout`.
    pub fn dead_after(&self, sender_timeout: Duration) -> Duration {
        self.dead_after.unwrap_or(if sender_timeout.is_zero() {
            Duration::from_secs(600)
        } else {
            sender_timeout.max(Duration::from_secs(30))
        })
    }
}

/// When the stream last delivered something, shared by the reader and the monitor; what
/// it heard also goes to `status()` (`source`, with what the primary says of its
/// walsender).
pub(super) struct Heard {
    since: Instant,
    millis: AtomicU64,
    source: Arc<StreamProgress>,
}

impl Heard {
    /// A stream just set up: its connection answered.
    pub(super) fn new(source: Arc<StreamProgress>) -> Self {
        source.heard.now();
        Self {
            since: Instant::now(),
            millis: AtomicU64::new(0),
            source,
        }
    }

    /// The stream delivered a message now.
    pub(super) fn now(&self) {
        let millis = u64::try_from(self.since.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.millis.store(millis, Relaxed);
        self.source.heard.now();
    }

    /// The primary says its walsender hears this worker within the liveness bound: the
    /// stream counts as heard for `status()`, not for the silence the check measures.
    fn confirmed(&self) {
        self.source.heard.now();
    }

    fn silent_for(&self) -> Duration {
        self.since
            .elapsed()
            .saturating_sub(Duration::from_millis(self.millis.load(Relaxed)))
    }
}

/// Watches a silent stream; when the primary no longer hears this worker, records why in
/// `dead` and cancels the reader through `cancel`.
pub(super) async fn watch_liveness(
    plan: SourcePlan,
    liveness: Liveness,
    dead_after: Duration,
    heard: Arc<Heard>,
    dead: Arc<Mutex<Option<String>>>,
    cancel: CancellationToken,
) {
    let mut client: Option<tokio_postgres::Client> = None;
    // When a message was sent through the primary to test a quiet stream.
    let mut probe: Option<Instant> = None;
    loop {
        tokio::time::sleep(liveness.check_every).await;
        let silent = heard.silent_for();
        if silent < liveness.quiet_after || probe.is_some_and(|sent| silent < sent.elapsed()) {
            probe = None; // something arrived (after the probe, if one was sent)
            continue;
        }
        let answer = asked(async {
            let connected = match client.take() {
                Some(c) => c,
                None => connect(&plan.connection).await?,
            };
            let asked = slot_walsender(&connected, &plan.slot).await;
            if asked.is_ok() {
                client = Some(connected);
            }
            asked
        })
        .await;
        let verdict = match answer {
            Some(Ok(None)) => Some(format!(
                "no walsender on the primary holds slot \"{}\" any more although this worker \
                 has been connected (silent for {:.0} s)",
                plan.slot,
                silent.as_secs_f64()
            )),
            Some(Ok(Some(w))) if w.silent_for.is_some_and(|s| s >= dead_after) => {
                let unheard = format!(
                    "the primary has heard nothing from this worker for {:.0} s (its \
                     walsender, pid {}, waits for replies the network no longer delivers)",
                    w.silent_for.unwrap_or_default().as_secs_f64(),
                    w.pid
                );
                match probe {
                    // Sent at the last check and still nothing arrived.
                    Some(_) => Some(format!(
                        "{unheard}; a logical message sent through it did not arrive"
                    )),
                    // Perhaps only idle: test it with a message through the primary. Its
                    // answer is bounded like a question: a network that stops while it is
                    // on its way must not hold the check.
                    None => match &client {
                        Some(c)
                            if matches!(asked(emit_marker(c, "liveness")).await, Some(Ok(()))) =>
                        {
                            probe = Some(Instant::now());
                            None
                        }
                        _ => Some(format!(
                            "{unheard}; a logical message to test it got no answer within {} s \
                             (or could not be sent)",
                            ASK_TIMEOUT.as_secs()
                        )),
                    },
                }
            }
            Some(Ok(Some(_))) => {
                heard.confirmed();
                None
            }
            Some(Err(_)) | None => {
                client = None;
                (silent >= dead_after).then(|| {
                    format!(
                        "nothing arrived on the replication connection for {:.0} s and the \
                         primary cannot be asked why",
                        silent.as_secs_f64()
                    )
                })
            }
        };
        if let Some(reason) = verdict {
            *dead.lock() = Some(reason);
            cancel.cancel();
            return;
        }
    }
}
