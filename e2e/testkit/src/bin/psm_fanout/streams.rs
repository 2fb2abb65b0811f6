//! The streams of a run: opened with bounded concurrency over several source addresses,
//! and what their events said so far (first checkpoints, refusals, failures, the first
//! checkpoint after a moment a scenario marks).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Semaphore;

use crate::conn::{self, Event, Target};
use crate::flags::Common;
use crate::stats::{round, Cpu};

/// How often opening reports its progress on stderr.
const PROGRESS: Duration = Duration::from_secs(5);

/// Every stream's state as its events told it.
pub struct Streams {
    /// When each stream completed its first checkpoint.
    pub first: Vec<Option<Instant>>,
    /// Per stream, its first `checkpoint_complete` at or after [`Streams::mark`]'s moment.
    pub since_mark: Vec<Option<Instant>>,
    mark: Option<Instant>,
    /// Streams with a `since_mark` entry: counted as they come (a fan-out waits for all
    /// of them, event by event).
    reached: usize,
    /// Refusals by status, and the body of the first of each.
    pub refused: BTreeMap<u16, (usize, String)>,
    /// Streams that failed before their first checkpoint, and the first reason.
    pub failed: (usize, Option<String>),
    /// Streams that ended after their first checkpoint, and the first reason.
    pub ended: (usize, Option<String>),
    /// `checkpoint_complete` lines received in all.
    pub completes: u64,
    /// Streams opened, refused or failed.
    settled: usize,
    events: UnboundedReceiver<Event>,
}

/// What opening the streams took.
pub struct Opening {
    /// When the first connection was started.
    pub started: Instant,
    /// From the start until the last stream's first checkpoint.
    pub seconds: f64,
    /// The CPU time the worker and this process took meanwhile (JSON fields).
    pub cpu: serde_json::Value,
}

impl Streams {
    /// Opens `count` streams for users `first_user..` (stream `i` is user `first_user + i`)
    /// and waits until each one completed its first checkpoint, was refused or failed, or
    /// `common.timeout` passed.
    pub async fn open(common: &Common, target: Target) -> (Self, Opening) {
        let (tx, events) = unbounded_channel();
        let connecting = Arc::new(Semaphore::new(common.connects));
        let target = Arc::new(target);
        let count = common.streams;
        let requests: Vec<Vec<u8>> = (0..count)
            .map(|stream| {
                let token = powersync_mdbx_testkit::hs256_token(
                    common.secret.as_bytes(),
                    &common.audience,
                    &common.user(stream),
                    common.token_seconds,
                );
                conn::request(&target, &token)
            })
            .collect();
        let cpu = Cpu::now(common.worker_pid);
        let started = Instant::now();
        for (stream, request) in requests.into_iter().enumerate() {
            let source = source_address(stream, common.sources);
            let (connecting, target, tx) = (connecting.clone(), target.clone(), tx.clone());
            tokio::spawn(async move {
                let Ok(permit) = connecting.acquire_owned().await else {
                    return;
                };
                conn::run(stream, source, &target, request, permit, tx).await;
            });
        }
        let mut streams = Self {
            first: vec![None; count],
            since_mark: vec![None; count],
            mark: None,
            reached: 0,
            refused: BTreeMap::new(),
            failed: (0, None),
            ended: (0, None),
            completes: 0,
            settled: 0,
            events,
        };
        let deadline = started + common.timeout;
        let mut report_at = started + PROGRESS;
        while streams.settled < count {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if now >= report_at {
                report_at = now + PROGRESS;
                eprintln!(
                    "psm-fanout: {} of {count} streams opened, {} refused, {} failed",
                    streams.opened(),
                    streams.refused_count(),
                    streams.failed.0
                );
            }
            streams.next_event(deadline.min(report_at)).await;
        }
        let last = streams.first.iter().flatten().max().copied();
        let seconds = last.map_or(0.0, |last| (last - started).as_secs_f64());
        let cpu = cpu.since();
        (
            streams,
            Opening {
                started,
                seconds,
                cpu,
            },
        )
    }

    /// Streams that completed their first checkpoint.
    pub fn opened(&self) -> usize {
        self.first.iter().filter(|f| f.is_some()).count()
    }

    /// Streams answered with another status than 200.
    pub fn refused_count(&self) -> usize {
        self.refused.values().map(|(n, _)| n).sum()
    }

    /// From now on, records each stream's first `checkpoint_complete` at or after `at`.
    pub fn mark(&mut self, at: Instant) {
        self.mark = Some(at);
        self.since_mark.iter_mut().for_each(|s| *s = None);
        self.reached = 0;
    }

    /// Streams that completed a checkpoint since the mark.
    pub fn reached(&self) -> usize {
        self.reached
    }

    /// Applies the next event, waiting for it until `deadline`; returns it (after it was
    /// applied), or `None` when the deadline passed first.
    pub async fn next_event(&mut self, deadline: Instant) -> Option<Event> {
        match tokio::time::timeout_at(deadline.into(), self.events.recv()).await {
            Ok(Some(event)) => {
                self.apply(&event);
                Some(event)
            }
            Ok(None) => {
                // Every connection ended: nothing more will come.
                tokio::time::sleep_until(deadline.into()).await;
                None
            }
            Err(_) => None,
        }
    }

    /// Applies every event that arrives until `deadline`.
    pub async fn drain_until(&mut self, deadline: Instant) {
        while self.next_event(deadline).await.is_some() {}
    }

    fn apply(&mut self, event: &Event) {
        match event {
            Event::Complete { stream, at, .. } => {
                self.completes += 1;
                if let Some(first) = self.first.get_mut(*stream) {
                    if first.is_none() {
                        *first = Some(*at);
                        self.settled += 1;
                    }
                }
                if self.mark.is_some_and(|mark| *at >= mark) {
                    if let Some(since @ None) = self.since_mark.get_mut(*stream) {
                        *since = Some(*at);
                        self.reached += 1;
                    }
                }
            }
            Event::Refused {
                stream,
                status,
                body,
            } => {
                self.settled += 1;
                let entry = self
                    .refused
                    .entry(*status)
                    .or_insert_with(|| (0, format!("stream {stream}: {body}")));
                entry.0 += 1;
            }
            Event::Ended {
                stream,
                opened,
                reason,
            } => {
                let (count, first) = if *opened {
                    &mut self.ended
                } else {
                    self.settled += 1;
                    &mut self.failed
                };
                *count += 1;
                first.get_or_insert_with(|| format!("stream {stream}: {reason}"));
            }
        }
    }

    /// The opening's facts as JSON fields.
    pub fn report(&self, opening: &Opening) -> serde_json::Value {
        let refused: serde_json::Map<String, serde_json::Value> = self
            .refused
            .iter()
            .map(|(status, (n, _))| (status.to_string(), (*n).into()))
            .collect();
        let samples: serde_json::Map<String, serde_json::Value> = self
            .refused
            .iter()
            .map(|(status, (_, body))| (status.to_string(), body.clone().into()))
            .collect();
        let since_start: Vec<f64> = self
            .first
            .iter()
            .flatten()
            .map(|at| (*at - opening.started).as_secs_f64())
            .collect();
        serde_json::json!({
            "streams_requested": self.first.len(),
            "streams_opened": self.opened(),
            "open_seconds": round(opening.seconds, 3),
            "first_checkpoint_seconds": crate::stats::summary(&since_start, 3),
            "refused": refused,
            "refused_sample": samples,
            "failed": self.failed.0,
            "failed_sample": self.failed.1,
            "ended_after_open": self.ended.0,
            "ended_sample": self.ended.1,
            "opening": opening.cpu,
        })
    }
}

/// Stream `i`'s source address: 127.0.0.2, 127.0.0.3, ... in turn (`sources` of them),
/// each with its own range of ephemeral ports.
fn source_address(stream: usize, sources: usize) -> IpAddr {
    let offset = u8::try_from(stream % sources.clamp(1, 250)).unwrap_or(0);
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + offset))
}
