//! The hand-off of decoded changes from the stream's task to the applier thread, in
//! batches: one channel message (and at most one wake-up of the other side) per batch,
//! not per change. A bulk transaction otherwise cost two thread switches per row, as
//! the applier freed one slot at a time for a decoder waiting on a full queue.
//!
//! A batch's buffer is made once with room for a full batch and goes back to the stream
//! when the applier has taken its changes out, with the changes the applier is done with
//! ([`ChangeReceiver::spent`]): a batch is not grown change by change, and what the stream
//! allocated (a change's rows, their evaluation and packed outputs) is freed on the
//! stream's thread, where the allocator takes it back at once, instead of on the applier's
//! (a free across threads, which the allocator collects later at a cost to the stream).

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use tokio::sync::mpsc;

use crate::change::Change;

/// Changes per batch at most.
const BATCH: usize = 256;
/// Batches queued between the two sides at most (with [`BATCH`]: 2,048 changes).
const QUEUED_BATCHES: usize = 8;
/// Emptied batch buffers kept for the stream at most (more are freed).
const SPARE_BATCHES: usize = 2;

/// A pair of ends.
pub(super) fn channel() -> (ChangeSender, ChangeReceiver) {
    let (sender, receiver) = mpsc::channel(QUEUED_BATCHES);
    let (spare_sender, spares) = mpsc::channel(SPARE_BATCHES);
    (
        ChangeSender {
            sender,
            batch: Vec::with_capacity(BATCH),
            spares,
        },
        ChangeReceiver {
            receiver,
            batch: VecDeque::with_capacity(BATCH),
            spent: Vec::with_capacity(BATCH),
            spares: spare_sender,
        },
    )
}

/// The applier stopped (its error is reported where it is joined).
#[derive(Debug)]
pub(super) struct Closed;

/// The stream's end: changes are collected into a batch, sent when it is full, when a
/// transaction's commit ends it (a commit is never held back behind later changes), or
/// on [`ChangeSender::flush`], which the stream calls before it waits between transactions.
pub(super) struct ChangeSender {
    sender: mpsc::Sender<Vec<Change>>,
    batch: Vec<Change>,
    /// Buffers of batches the applier emptied.
    spares: mpsc::Receiver<Vec<Change>>,
}

impl ChangeSender {
    /// Adds a change; waits only when a full batch finds the queue full. A commit sends
    /// the batch when the queue has room; when it has none the applier is busy and will
    /// take what follows together with it (many small transactions then share a batch,
    /// and the applier one store commit).
    pub async fn push(&mut self, change: Change) -> Result<(), Closed> {
        let commit = matches!(change, Change::Commit { .. });
        self.batch.push(change);
        if self.batch.len() >= BATCH {
            return self.flush().await;
        }
        if commit {
            // Room first: a full queue leaves the batch where it is, untouched.
            match self.sender.try_reserve() {
                Ok(permit) => permit.send(take_batch(&mut self.batch, &mut self.spares)),
                Err(mpsc::error::TrySendError::Full(())) => {}
                Err(mpsc::error::TrySendError::Closed(())) => return Err(Closed),
            }
        }
        Ok(())
    }

    /// Sends what is collected (nothing when empty).
    pub async fn flush(&mut self) -> Result<(), Closed> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = take_batch(&mut self.batch, &mut self.spares);
        self.sender.send(batch).await.map_err(|_| Closed)
    }

    /// Resolves when the applier is gone.
    pub async fn closed(&self) {
        self.sender.closed().await;
    }
}

/// The collected `batch`, replaced by a buffer of `spares` (the changes the applier left in
/// it dropped here) or a new one when none came back.
fn take_batch(batch: &mut Vec<Change>, spares: &mut mpsc::Receiver<Vec<Change>>) -> Vec<Change> {
    let empty = match spares.try_recv() {
        Ok(mut spent) => {
            spent.clear();
            spent
        }
        Err(_) => Vec::with_capacity(BATCH),
    };
    std::mem::replace(batch, empty)
}

/// The applier's end: one change at a time, as sent.
pub(super) struct ChangeReceiver {
    receiver: mpsc::Receiver<Vec<Change>>,
    /// The batch being taken apart (a `Vec` turned into a deque and back keeps its buffer).
    batch: VecDeque<Change>,
    /// Changes applied since the batch before this one ended, in the buffer that batch came
    /// in: sent back to the stream with the next batch.
    spent: Vec<Change>,
    spares: mpsc::Sender<Vec<Change>>,
}

impl ChangeReceiver {
    /// The next change, waiting for one; `None` once the stream's end is gone and every
    /// change sent was received.
    pub fn blocking_recv(&mut self) -> Option<Change> {
        loop {
            if let Some(change) = self.batch.pop_front() {
                return Some(change);
            }
            let next = self.receiver.blocking_recv()?;
            self.replace_batch(next);
        }
    }

    /// The next change if one was sent already.
    pub fn try_recv(&mut self) -> Option<Change> {
        loop {
            if let Some(change) = self.batch.pop_front() {
                return Some(change);
            }
            let next = self.receiver.try_recv().ok()?;
            self.replace_batch(next);
        }
    }

    /// The next change if one is sent by `deadline` (at once when it has passed); `None`
    /// past it, or once the stream's end is gone and every change sent was received.
    pub fn recv_until(&mut self, deadline: Instant) -> Option<Change> {
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut context = Context::from_waker(&waker);
        loop {
            if let Some(change) = self.batch.pop_front() {
                return Some(change);
            }
            match self.receiver.poll_recv(&mut context) {
                Poll::Ready(Some(next)) => self.replace_batch(next),
                Poll::Ready(None) => return None,
                Poll::Pending => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    // Woken by the waker when a batch is sent (or spuriously: polled again).
                    std::thread::park_timeout(left);
                }
            }
        }
    }

    /// Hands back a change the applier is done with, to be dropped on the stream's thread
    /// (see the module's note). Held until the next batch arrives: at most a batch of them.
    pub fn spent(&mut self, change: Change) {
        if self.spent.len() < self.spent.capacity() {
            self.spent.push(change);
        }
    }

    /// Takes `next` apart from here on. The changes spent so far go back to the stream in
    /// their buffer (dropped here if the stream has enough buffers, or is gone); the
    /// emptied batch's buffer collects the next ones.
    fn replace_batch(&mut self, next: Vec<Change>) {
        let emptied = std::mem::replace(&mut self.batch, VecDeque::from(next));
        let spent = std::mem::replace(&mut self.spent, Vec::from(emptied));
        if spent.capacity() > 0 {
            let _ = self.spares.try_send(spent);
        }
    }
}

/// Wakes a thread parked in [`ChangeReceiver::recv_until`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advance(lsn: u64) -> Change {
        Change::Advance {
            lsn,
            write_checkpoint: None,
        }
    }

    fn lsn_of(change: Option<Change>) -> Option<u64> {
        lsn_of_ref(change.as_ref())
    }

    fn lsn_of_ref(change: Option<&Change>) -> Option<u64> {
        match change {
            Some(Change::Advance { lsn, .. }) => Some(*lsn),
            _ => None,
        }
    }

    #[tokio::test]
    async fn changes_arrive_in_order_once_flushed_committed_or_a_batch_is_full() {
        let (mut sender, mut receiver) = channel();
        sender.push(advance(1)).await.unwrap();
        assert!(receiver.try_recv().is_none(), "held until flushed");
        sender.flush().await.unwrap();
        assert_eq!(lsn_of(receiver.try_recv()), Some(1));
        for lsn in 0..BATCH as u64 {
            sender.push(advance(lsn)).await.unwrap();
        }
        for lsn in 0..BATCH as u64 {
            assert_eq!(
                lsn_of(receiver.try_recv()),
                Some(lsn),
                "a full batch goes at once"
            );
        }
        assert!(receiver.try_recv().is_none());
        sender.push(advance(5)).await.unwrap();
        let received = std::time::Instant::now();
        sender
            .push(Change::Commit {
                end_lsn: 6,
                received,
            })
            .await
            .unwrap();
        assert_eq!(
            lsn_of(receiver.try_recv()),
            Some(5),
            "a commit sends its batch"
        );
        assert!(matches!(
            receiver.try_recv(),
            Some(Change::Commit { end_lsn: 6, .. })
        ));
        sender.push(advance(7)).await.unwrap();
        sender.flush().await.unwrap();
        drop(sender);
        let received = tokio::task::spawn_blocking(move || {
            let first = lsn_of(receiver.blocking_recv());
            (first, receiver.blocking_recv().is_none())
        })
        .await
        .unwrap();
        assert_eq!(received, (Some(7), true));
    }

    /// A change sent while the applier waits wakes it before its deadline; with nothing
    /// sent it returns at the deadline (at once when that has passed), and once the
    /// stream's end is gone.
    #[test]
    fn a_wait_until_a_deadline_ends_with_a_change_or_at_the_deadline() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (mut sender, mut receiver) = channel();
        assert!(
            receiver.recv_until(Instant::now()).is_none(),
            "nothing sent"
        );
        let sending = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            runtime.block_on(async {
                sender.push(advance(7)).await.unwrap();
                sender.flush().await.unwrap();
            });
            sender
        });
        let far = Instant::now() + std::time::Duration::from_secs(600);
        assert_eq!(
            lsn_of(receiver.recv_until(far)),
            Some(7),
            "woken by the send"
        );
        drop(sending.join().unwrap());
        assert!(
            receiver.recv_until(far).is_none(),
            "the stream's end is gone"
        );
    }

    #[tokio::test]
    async fn commits_share_a_batch_while_the_queue_is_full() {
        let (mut sender, mut receiver) = channel();
        let received = std::time::Instant::now();
        let commit = |end_lsn| Change::Commit { end_lsn, received };
        for lsn in 0..QUEUED_BATCHES as u64 {
            sender.push(commit(lsn)).await.unwrap();
        }
        // The queue is full: these wait in one batch instead of waiting for room.
        for lsn in 100..110 {
            sender.push(commit(lsn)).await.unwrap();
        }
        for lsn in (0..QUEUED_BATCHES as u64).chain(100..110) {
            if lsn == 100 {
                assert!(
                    receiver.try_recv().is_none(),
                    "held while the queue was full"
                );
                sender.flush().await.unwrap();
            }
            let got = receiver.try_recv();
            assert!(matches!(got, Some(Change::Commit { end_lsn, .. }) if end_lsn == lsn));
        }
    }

    #[tokio::test]
    async fn batch_buffers_go_back_to_the_stream_with_the_changes_spent() {
        let (mut sender, mut receiver) = channel();
        assert!(
            sender.batch.capacity() >= BATCH,
            "made with room for a batch"
        );
        let first = sender.batch.as_ptr();
        for lsn in 1..=3 {
            sender.push(advance(lsn)).await.unwrap();
            sender.flush().await.unwrap();
            let change = receiver.try_recv();
            assert_eq!(lsn_of_ref(change.as_ref()), Some(lsn));
            receiver.spent(change.unwrap());
        }
        // The buffer the first batch came in collected the changes applied from the second
        // batch on, and went back when the third arrived; the stream drops them when it
        // takes the buffer up for a batch of its own.
        let back = sender.spares.try_recv().expect("a buffer came back");
        assert_eq!(back.as_ptr(), first);
        let spent: Vec<_> = back.iter().map(|c| lsn_of_ref(Some(c))).collect();
        assert_eq!(spent, [Some(2)]);
        receiver.spares.try_send(back).unwrap();
        sender.push(advance(4)).await.unwrap();
        sender.flush().await.unwrap();
        assert_eq!(sender.batch.as_ptr(), first, "the buffer taken up again");
        assert!(sender.batch.is_empty(), "its spent changes dropped");
    }

    #[tokio::test]
    async fn a_gone_applier_is_reported() {
        let (mut sender, receiver) = channel();
        drop(receiver);
        sender.push(advance(1)).await.unwrap();
        assert!(sender.flush().await.is_err());
        sender.closed().await;
    }
}
