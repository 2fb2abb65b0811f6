//! Writes the engine's log events into the PostgreSQL log, on the main thread.

use engine::logging::{self, LogReceiver};
use tracing::Level;
use tracing_subscriber::layer::SubscriberExt;

/// Events queued between two drains before new ones are dropped (and counted).
const QUEUE: usize = 4096;

/// Installs the channel as the process-wide `tracing` subscriber (once per worker
/// process) and returns its receiving end, to be drained on the main thread.
pub fn install() -> Option<LogReceiver> {
    let (layer, receiver) = logging::channel(QUEUE, Level::INFO);
    let subscriber = tracing_subscriber::registry().with(layer);
    // libmdbx reports through the `log` crate: route its warnings into the same channel.
    let _ = tracing_log::LogTracer::builder()
        .with_max_level(tracing_log::log::LevelFilter::Warn)
        .init();
    tracing::subscriber::set_global_default(subscriber)
        .ok()
        .map(|()| receiver)
}

/// Forwards every queued event. ERROR-level events are logged as WARNING: an `ereport`
/// at ERROR would abort the worker's main loop.
pub fn forward(receiver: Option<&LogReceiver>) {
    let Some(receiver) = receiver else { return };
    for event in receiver.drain() {
        let text = format!("powersync_mdbx: {}", event.message);
        match event.level {
            Level::ERROR | Level::WARN => pgrx::warning!("{text}"),
            Level::INFO => pgrx::log!("{text}"),
            _ => pgrx::debug1!("{text}"),
        }
    }
    let dropped = receiver.take_dropped();
    if dropped > 0 {
        pgrx::warning!("powersync_mdbx: {dropped} log events were dropped (queue full)");
    }
}
