//! `open`: many idle streams of one bucket set. Opens them, waits quietly, reads the
//! worker's memory per stream, then (optionally) runs one commit command and times, for
//! every stream, its start until that stream's next `checkpoint_complete`.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::conn::Target;
use crate::flags::{Common, Flags};
use crate::stats::{round, rss_anon_kib, summary, Cpu};
use crate::streams::Streams;

/// The scenario's own settings.
pub struct Open {
    /// How long the streams sit idle before the memory is read.
    pub quiet: Duration,
    /// A shell command that commits a change every stream's buckets hold.
    pub commit_cmd: Option<String>,
}

impl Open {
    /// Reads the flags of `open`.
    pub fn from_flags(flags: &mut Flags) -> Result<Self, String> {
        Ok(Self {
            quiet: Duration::from_secs_f64(flags.parsed("--quiet-seconds")?.unwrap_or(5.0)),
            commit_cmd: flags.take("--commit-cmd"),
        })
    }

    /// Runs the scenario and returns its report.
    pub async fn run(self, common: &Common, target: Target) -> serde_json::Value {
        let before = common.worker_pid.and_then(rss_anon_kib);
        let (mut streams, opening) = Streams::open(common, target).await;
        eprintln!(
            "psm-fanout: {} of {} streams opened in {:.2} s; {} s of quiet",
            streams.opened(),
            common.streams,
            opening.seconds,
            self.quiet.as_secs_f64()
        );
        let completes_before_quiet = streams.completes;
        streams.drain_until(Instant::now() + self.quiet).await;
        let after = common.worker_pid.and_then(rss_anon_kib);
        let mut report = streams.report(&opening);
        let opened = streams.opened();
        let memory = match (before, after) {
            (Some(before), Some(after)) => serde_json::json!({
                "rss_anon_kib_before": before,
                "rss_anon_kib_after": after,
                "kib_per_stream": (opened > 0).then(|| {
                    round((after as f64 - before as f64) / opened as f64, 2)
                }),
            }),
            _ => serde_json::json!({}),
        };
        merge(&mut report, memory);
        merge(
            &mut report,
            serde_json::json!({
                "scenario": "open",
                "coding": common.coding,
                "quiet_seconds": self.quiet.as_secs_f64(),
                "completes_during_quiet": streams.completes - completes_before_quiet,
            }),
        );
        if let Some(cmd) = &self.commit_cmd {
            let cpu = Cpu::now(common.worker_pid);
            let mut commit = commit_reaches_all(&mut streams, cmd, common.timeout).await;
            merge(&mut commit, cpu.since());
            merge(&mut report, serde_json::json!({ "commit": commit }));
        }
        report
    }
}

/// Runs `cmd` and waits until every opened stream completed a checkpoint after its start
/// (or `timeout`); the times from the command's start.
async fn commit_reaches_all(
    streams: &mut Streams,
    cmd: &str,
    timeout: Duration,
) -> serde_json::Value {
    let started = Instant::now();
    streams.mark(started);
    let cmd = cmd.to_owned();
    let mut command = tokio::task::spawn_blocking(move || {
        let status = Command::new("sh").arg("-c").arg(&cmd).status();
        (status, Instant::now())
    });
    let mut command_result = None;
    let deadline = started + timeout;
    let opened = streams.opened();
    while (command_result.is_none() || streams.reached() < opened) && Instant::now() < deadline {
        if command_result.is_none() {
            tokio::select! {
                done = &mut command => command_result = Some(done),
                _ = streams.next_event(deadline) => {}
            }
        } else {
            streams.next_event(deadline).await;
        }
    }
    let (status, command_seconds) = match command_result {
        Some(Ok((Ok(status), ended))) => (
            status.code().map_or("signal".to_owned(), |c| c.to_string()),
            Some(round((ended - started).as_secs_f64(), 4)),
        ),
        Some(Ok((Err(e), _))) => (format!("not run: {e}"), None),
        Some(Err(e)) => (format!("not run: {e}"), None),
        None => ("still running".to_owned(), None),
    };
    let latencies: Vec<f64> = streams
        .since_mark
        .iter()
        .flatten()
        .map(|at| (*at - started).as_secs_f64())
        .collect();
    serde_json::json!({
        "command_exit": status,
        "command_seconds": command_seconds,
        "streams_open": opened,
        "streams_reached": latencies.len(),
        "seconds_from_command_start": summary(&latencies, 4),
    })
}

/// Adds `more`'s fields to `report`.
pub fn merge(report: &mut serde_json::Value, more: serde_json::Value) {
    if let (Some(report), serde_json::Value::Object(more)) = (report.as_object_mut(), more) {
        report.extend(more);
    }
}
