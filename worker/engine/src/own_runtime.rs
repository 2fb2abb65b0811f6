//! A task on a runtime of its own, with one worker thread.
//!
//! The stream decodes a bulk change as fast as the walsender sends it, on a machine whose
//! other core the walsender holds. On the engine's runtime (two workers) its reads, its
//! hand-offs to the applier and its timers woke the other worker, which stole the stream's
//! task back and forth: tens of context switches per 1,000 rows, 4 per 1,000 updated rows
//! on a runtime of its own (`docs/benchmark.md`, "The current build: the stream on a
//! runtime of its own"). There its tasks stay on one thread, and the engine's workers stay
//! free for HTTP. It stays a multi-threaded runtime: `pg_walstream` drives its connection
//! from a thread of its own on any other kind.

use std::future::Future;

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// Runs `task` to its end on a new runtime whose one worker thread is named `name`. A
/// panic in `task` is resumed here. When this future is dropped first, `task` is aborted
/// and its runtime shut down in the background: the task is dropped on its own thread
/// soon after, not before this drop returns.
pub(crate) async fn run<F>(name: &str, task: F) -> std::io::Result<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .thread_keep_alive(crate::idle_release::BLOCKING_THREAD_KEEP_ALIVE)
        .on_thread_park(crate::idle_release::on_park)
        .enable_all()
        .build()?;
    let mut running = Running {
        task: runtime.spawn(task),
        runtime: Some(runtime),
    };
    match (&mut running.task).await {
        Ok(output) => Ok(output),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(std::io::Error::other(e)),
    }
}

/// A task and its runtime; dropping it aborts the one and shuts down the other (a runtime
/// cannot be dropped, which blocks, inside another runtime).
struct Running<T> {
    task: JoinHandle<T>,
    runtime: Option<Runtime>,
}

impl<T> Drop for Running<T> {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn engine_runtime() -> Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_task_runs_on_its_own_named_thread_and_its_timers_and_io_work() {
        let output = engine_runtime().block_on(run("psm-own-test", async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let address = listener.local_addr().unwrap();
            let (_accepted, connected) =
                tokio::join!(listener.accept(), tokio::net::TcpStream::connect(address));
            connected.unwrap();
            std::thread::current().name().map(str::to_owned)
        }));
        assert_eq!(output.unwrap().as_deref(), Some("psm-own-test"));
    }

    #[test]
    #[should_panic(expected = "a bug in the task")]
    fn a_panic_in_the_task_is_resumed_in_the_caller() {
        let _ = engine_runtime().block_on(run("psm-own-test", async {
            panic!("a bug in the task");
        }));
    }

    /// Says so when dropped.
    struct Dropped(std::sync::mpsc::Sender<()>);

    impl Drop for Dropped {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    #[test]
    fn dropping_the_caller_drops_the_task() {
        let (dropped, told) = std::sync::mpsc::channel();
        let held = Dropped(dropped);
        engine_runtime().block_on(async {
            let pending = run("psm-own-test", async move {
                let _held = held;
                std::future::pending::<()>().await
            });
            // The caller gives up first (as a generation's stop past its grace does).
            let gave_up = tokio::time::timeout(Duration::from_millis(20), pending).await;
            assert!(gave_up.is_err());
        });
        // Bounded only so that a failure ends the test.
        told.recv_timeout(Duration::from_secs(30))
            .expect("the task was not dropped after its caller");
    }
}
