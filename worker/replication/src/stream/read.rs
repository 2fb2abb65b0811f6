//! Reading the replication connection in the stream's own task.
//!
//! The library's read must not be dropped midway (a message would be lost), and the
//! stream's loop also waits on other things (the catalog, re-copies, timers). So a read
//! owns the connection and is kept, unfinished, across those waits until it ends; the
//! connection comes back with what it read, and the next read starts. It is raced only by
//! `cancel` (the library checks it only between messages, and over TLS the next message
//! can be the primary's next keepalive, half of wal_sender_timeout away); a message cut off
//! by the stop is never applied.
//!
//! Reading where the messages are decoded, rather than in a task of its own that hands
//! each one over, costs no wake-up of another thread per message: a bulk change's
//! messages are read and decoded as they come, one thread's turn per batch of them.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use pg_walstream::{CancellationToken, LogicalReplicationStream, RawXLogData};

/// What one read gives: a message, or why there is none.
pub(super) type Event = Result<RawXLogData, pg_walstream::ReplicationError>;

type Read = Pin<Box<dyn Future<Output = (Box<LogicalReplicationStream>, Event)> + Send>>;

/// The connection with a read in progress.
pub(super) struct Reader {
    read: Read,
    cancel: CancellationToken,
}

impl Reader {
    pub fn new(stream: LogicalReplicationStream, cancel: CancellationToken) -> Self {
        let read = read(Box::new(stream), cancel.clone());
        Self { read, cancel }
    }

    /// The next event, waited for. Cancel-safe: an unfinished read stays for the next call.
    pub async fn next(&mut self) -> Event {
        let (stream, event) = self.read.as_mut().await;
        self.read = read(stream, self.cancel.clone());
        event
    }

    /// The next event if it is there without waiting (the read goes on otherwise).
    pub async fn ready(&mut self) -> Option<Event> {
        let polled = std::future::poll_fn(|cx| Poll::Ready(self.read.as_mut().poll(cx))).await;
        match polled {
            Poll::Ready((stream, event)) => {
                self.read = read(stream, self.cancel.clone());
                Some(event)
            }
            Poll::Pending => None,
        }
    }

    /// The connection, once the read in progress ended (at once after `cancel`).
    pub async fn into_stream(self) -> LogicalReplicationStream {
        let (stream, _) = self.read.await;
        *stream
    }
}

/// One read: feedback first, then the next message (or `Cancelled`).
fn read(mut stream: Box<LogicalReplicationStream>, cancel: CancellationToken) -> Read {
    Box::pin(async move {
        // Report what the applier made durable (throttled to the feedback interval) before
        // waiting: without it the primary learns only at its next keepalive request.
        stream.maybe_send_feedback().await;
        let next = tokio::select! {
            biased;
            () = cancel.cancelled() => Err(pg_walstream::ReplicationError::Cancelled(
                "the stream stopped".into(),
            )),
            next = stream.next_raw_event(&cancel) => next,
        };
        (stream, next)
    })
}
