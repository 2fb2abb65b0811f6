//! A connection whose writes fail once the client has taken nothing for a while, or once
//! the response being written may no longer be sent.
//!
//! A client that stops reading fills the socket's buffers; every later write stays
//! pending, and without a bound the connection (its descriptor, its buffers and the stream
//! behind it) would be held until the client goes away, which it may never do. A write
//! that stays pending for the limit fails with `TimedOut`, which ends the connection. So
//! does a write still pending at the connection's [`WriteDeadline`]: a sync stream sets it
//! to its token's expiry, since a client that stops reading no longer asks the stream for
//! its next chunk, and the stream could not end itself then.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// When a connection's pending writes fail whatever the write timeout: set by the
/// response being written, shared with the connection's [`WriteTimeout`].
#[derive(Clone, Default)]
pub struct WriteDeadline(Arc<Mutex<Option<Instant>>>);

impl WriteDeadline {
    /// From now on (`Some`), or no longer (`None`), writes pending at `at` fail.
    pub fn set(&self, at: Option<Instant>) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = at;
    }

    fn get(&self) -> Option<Instant> {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// `inner` with writes bounded by `limit` of no progress and by the `deadline`.
pub struct WriteTimeout<S> {
    inner: S,
    limit: Duration,
    deadline: WriteDeadline,
    /// Armed while a write is pending: fires `limit` after the last progress, or at the
    /// deadline if that comes first.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteTimeout<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, limit: Duration, deadline: WriteDeadline) -> Self {
        Self {
            inner,
            limit,
            deadline,
            stalled: None,
        }
    }

    /// Passes on a write-side poll of the inner stream: any progress disarms the timer;
    /// while it stays pending, it fails once the client took nothing for `limit` or the
    /// deadline passed.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let now = Instant::now();
        let deadline = self.deadline.get();
        let passed = |now: Instant| deadline.is_some_and(|at| at <= now);
        if passed(now) {
            return Poll::Ready(Err(ended_by_deadline()));
        }
        let at = deadline.map_or(now + self.limit, |at| at.min(now + self.limit));
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if timer.deadline() > at {
            timer.as_mut().reset(at);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) if passed(Instant::now()) => Poll::Ready(Err(ended_by_deadline())),
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no data for {} s", self.limit.as_secs()),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn ended_by_deadline() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the response's time ran out (its token expired) while the client took no data",
    )
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.bounded(cx, poll)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.bounded(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.bounded(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.bounded(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_write_the_peer_never_takes_fails_after_the_limit() {
        let (client, server) = tokio::io::duplex(64);
        let mut server =
            WriteTimeout::new(server, Duration::from_secs(5), WriteDeadline::default());
        let error = server.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_pending_at_the_deadline_fails_before_the_limit() {
        let (client, server) = tokio::io::duplex(64);
        let deadline = WriteDeadline::default();
        let mut server = WriteTimeout::new(server, Duration::from_secs(3600), deadline.clone());
        let started = Instant::now();
        deadline.set(Some(started + Duration::from_secs(7)));
        let error = server.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(7));
        // Cleared, the deadline no longer bounds the connection's writes.
        deadline.set(None);
        let (_client, server) = tokio::io::duplex(64);
        let mut server = WriteTimeout::new(server, Duration::from_secs(5), deadline);
        let started = Instant::now();
        server.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_keeps_reading_is_never_cut() {
        let (mut client, server) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let mut total = 0;
            while total < 4096 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                total += tokio::io::AsyncReadExt::read(&mut client, &mut buf)
                    .await
                    .unwrap();
            }
        });
        let mut server =
            WriteTimeout::new(server, Duration::from_secs(5), WriteDeadline::default());
        server.write_all(&[0u8; 4096]).await.unwrap();
        reader.await.unwrap();
    }
}
