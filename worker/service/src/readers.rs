//! The threads that run the streams' store reads (a download's batches, a large
//! checkpoint): a fixed set, not tokio's blocking pool.
//!
//! With the blocking pool, many streams opening at once ran their reads on a few dozen
//! threads (a read's turn is free before its thread is idle again, so another starts),
//! each with its stack, its allocator's pages and its compression contexts (up to 310 KiB
//! for gzip), given back only some seconds after the threads exit. A fixed set holds the
//! same memory however many streams open, and its threads' pages and contexts are used
//! again by the next reads. Reads wait their turn in order of arrival.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{JoinHandle, ThreadId};

use tokio::sync::oneshot;

/// A read's work, with where its result goes.
type Job = Box<dyn FnOnce() + Send>;

/// A fixed set of threads for store reads; dropped, it lets them finish their reads and
/// joins them.
pub struct Readers {
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

/// A read that could not give its result: it panicked, or the readers stopped.
#[derive(Debug)]
pub struct ReadFailed(pub String);

impl std::fmt::Display for ReadFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Readers {
    /// `count` threads (at least one), named `psm-sync-read`. They start with the signal
    /// mask of the calling thread (the engine's: all blocked).
    pub fn new(count: usize) -> std::io::Result<Self> {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let threads = (0..count.max(1))
            .map(|_| {
                let queue = queue.clone();
                std::thread::Builder::new()
                    .name("psm-sync-read".into())
                    .spawn(move || run_jobs(&queue))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self {
            jobs: Some(jobs),
            threads,
        })
    }

    /// Runs `work` on one of the threads once its turn comes, and returns its result. The
    /// work is queued here, not when the future is first polled, so the future holds only
    /// where the result comes (a stream keeps it inline while it waits).
    pub fn run<R: Send + 'static>(
        &self,
        work: impl FnOnce() -> R + Send + 'static,
    ) -> impl std::future::Future<Output = Result<R, ReadFailed>> + Send + 'static {
        let (done, result) = oneshot::channel();
        let job: Job = Box::new(move || {
            let outcome = catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic".to_owned());
                ReadFailed(format!("a sync read panicked: {what}"))
            });
            // The stream that asked may have ended meanwhile.
            let _ = done.send(outcome);
        });
        let queued = self
            .jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok());
        async move {
            let stopped = || ReadFailed("the sync readers stopped".into());
            if !queued {
                return Err(stopped());
            }
            result.await.map_err(|_| stopped())?
        }
    }

    fn thread_ids(&self) -> impl Iterator<Item = ThreadId> + '_ {
        self.threads.iter().map(|t| t.thread().id())
    }
}

/// A reader thread's life: the next job in turn, until the queue closes.
fn run_jobs(queue: &Mutex<Receiver<Job>>) {
    loop {
        // The lock is held only while waiting for a job, not while it runs.
        let job = match queue.lock() {
            Ok(queue) => queue.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        self.jobs = None;
        // Never join from a reader itself (a job that held the last reference).
        let current = std::thread::current().id();
        if self.thread_ids().any(|id| id == current) {
            return;
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_run_on_the_fixed_threads_and_a_panic_is_an_error() {
        let readers = Readers::new(2).unwrap();
        let ids: Vec<ThreadId> = readers.thread_ids().collect();
        for i in 0..20 {
            let (value, on) = readers
                .run(move || (i * 2, std::thread::current().id()))
                .await
                .unwrap();
            assert_eq!(value, i * 2);
            assert!(ids.contains(&on), "read {i} ran on another thread");
        }
        let failed = readers.run(|| -> u8 { panic!("broken page") }).await;
        assert!(
            failed.as_ref().is_err_and(|e| e.0.contains("broken page")),
            "{failed:?}"
        );
        // The thread that caught it still reads.
        assert_eq!(readers.run(|| 7).await.unwrap(), 7);
    }

    #[test]
    fn dropped_readers_finish_the_queued_reads_and_join_their_threads() {
        let readers = Readers::new(1).unwrap();
        let (finished, done) = std::sync::mpsc::channel();
        for i in 0..3 {
            let finished = finished.clone();
            let job: Job = Box::new(move || {
                std::thread::sleep(std::time::Duration::from_millis(20));
                finished.send(i).unwrap();
            });
            readers.jobs.as_ref().unwrap().send(job).unwrap();
        }
        drop(readers);
        assert_eq!(done.try_iter().collect::<Vec<_>>(), [0, 1, 2]);
    }
}
