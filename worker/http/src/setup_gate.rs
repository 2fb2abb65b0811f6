//! The upgraded connection of a WebSocket as its frames are read from it: until the
//! socket's SETUP is accepted ([`SetupGate::open`]), at most a budget of bytes is read, so
//! a socket that has not authenticated never makes the server buffer more than that (the
//! WebSocket library reserves room for a frame as soon as its header announces it, and
//! reads it whole before handing it over). Past the budget a read fails with
//! [`SetupTooLarge`]; after `open` reads pass through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes read at a time while the budget holds.
const STEP: usize = 4 << 10;

/// A read past the budget before SETUP was accepted.
#[derive(Debug)]
pub(crate) struct SetupTooLarge(pub usize);

impl std::fmt::Display for SetupTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a SETUP frame larger than {} bytes", self.0)
    }
}

impl std::error::Error for SetupTooLarge {}

/// `inner`, read within a budget until opened.
pub(crate) struct SetupGate<S> {
    inner: S,
    budget: usize,
    /// Bytes still to be read before the budget is spent; `None` once opened.
    left: Option<usize>,
}

impl<S> SetupGate<S> {
    /// `inner`, of which at most `budget` bytes are read until [`Self::open`].
    pub(crate) fn new(inner: S, budget: usize) -> Self {
        Self {
            inner,
            budget,
            left: Some(budget),
        }
    }

    /// Lifts the budget: the socket's SETUP was accepted.
    pub(crate) fn open(&mut self) {
        self.left = None;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for SetupGate<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let Some(left) = this.left else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        if left == 0 {
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::InvalidData,
                SetupTooLarge(this.budget),
            )));
        }
        let mut step = [0u8; STEP];
        let want = left.min(buf.remaining()).min(STEP);
        let mut limited = ReadBuf::new(&mut step[..want]);
        match Pin::new(&mut this.inner).poll_read(cx, &mut limited) {
            Poll::Ready(Ok(())) => {
                let read = limited.filled();
                buf.put_slice(read);
                this.left = Some(left - read.len());
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for SetupGate<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn reads_stop_at_the_budget_until_opened() {
        let (mut client, server) = tokio::io::duplex(64 << 10);
        client.write_all(&[7u8; 10_000]).await.unwrap();
        let mut gate = SetupGate::new(server, 6_000);
        let mut buf = vec![0u8; 10_000];
        let mut read = 0;
        let error = loop {
            match gate.read(&mut buf[read..]).await {
                Ok(n) => read += n,
                Err(e) => break e,
            }
        };
        assert_eq!(read, 6_000);
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(error.to_string().contains("6000 bytes"), "{error}");
        gate.open();
        gate.read_exact(&mut buf[read..]).await.unwrap();
        assert!(buf.iter().all(|&b| b == 7));
    }
}
