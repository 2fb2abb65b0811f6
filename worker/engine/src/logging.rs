//! Log events leave the engine over a channel, so that only the thread that owns the
//! PostgreSQL process writes to the server log.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// One formatted log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEvent {
    /// Severity.
    pub level: Level,
    /// Module path of the event's origin.
    pub target: String,
    /// The message with its fields, `key=value` after the text.
    pub message: String,
}

/// The receiving end: drain it from the thread that may write to the log.
pub struct LogReceiver {
    rx: Receiver<LogEvent>,
    dropped: Arc<AtomicU64>,
}

impl LogReceiver {
    /// Takes every queued event without blocking.
    pub fn drain(&self) -> impl Iterator<Item = LogEvent> + '_ {
        self.rx.try_iter()
    }

    /// Events lost because the queue was full, since the last call.
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }
}

/// A `tracing` layer that formats events at `max_level` or more severe and queues them.
/// A full queue drops events (and counts them) rather than blocking the engine.
pub struct ChannelLayer {
    tx: SyncSender<LogEvent>,
    dropped: Arc<AtomicU64>,
    max_level: Level,
}

/// Creates the layer and its receiver with room for `capacity` queued events.
pub fn channel(capacity: usize, max_level: Level) -> (ChannelLayer, LogReceiver) {
    let (tx, rx) = sync_channel(capacity);
    let dropped = Arc::new(AtomicU64::new(0));
    (
        ChannelLayer {
            tx,
            dropped: dropped.clone(),
            max_level,
        },
        LogReceiver { rx, dropped },
    )
}

impl<S: Subscriber> Layer<S> for ChannelLayer {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: Context<'_, S>) -> bool {
        *metadata.level() <= self.max_level
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() > self.max_level {
            return;
        }
        let mut visitor = MessageVisitor::default();
        event.record(&mut visitor);
        // Libraries' warnings (pg_walstream's "slot already exists, continuing") are
        // context, not operator news: the engine reports real failures itself.
        let level = if meta.target().starts_with("powersync_mdbx") {
            *meta.level()
        } else {
            (*meta.level()).max(Level::INFO)
        };
        let log = LogEvent {
            level,
            target: meta.target().to_owned(),
            message: visitor.finish(),
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(log) {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[derive(Default)]
struct MessageVisitor {
    message: String,
    fields: String,
}

impl MessageVisitor {
    fn finish(self) -> String {
        if self.fields.is_empty() {
            self.message
        } else {
            format!("{}{}", self.message, self.fields)
        }
    }
}

impl Visit for MessageVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn events_are_formatted_filtered_and_bounded() {
        let (layer, rx) = channel(2, Level::INFO);
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            tracing::debug!("not wanted");
            tracing::info!(port = 8080, "listening");
            tracing::warn!(path = "/x", "slow");
            tracing::error!("dropped: queue full");
        });
        let events: Vec<_> = rx.drain().collect();
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].message, "listening port=8080");
        assert_eq!(events[0].level, Level::INFO);
        assert_eq!(events[1].message, "slow path=/x");
        assert_eq!(rx.take_dropped(), 1);
        assert_eq!(rx.take_dropped(), 0);
    }
}
