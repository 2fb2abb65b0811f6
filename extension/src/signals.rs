//! Threads must never run PostgreSQL's signal handlers: every engine thread is created
//! while the calling thread has all signals blocked, and inherits that mask.

/// Runs `f` (which spawns threads) with every signal blocked on the calling thread, then
/// restores the previous mask. Signals arriving meanwhile stay pending and are delivered
/// to the main thread afterwards.
pub fn with_all_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: sigset_t is plain data; sigfillset/pthread_sigmask only write to the sets we
    // pass and change the mask of the calling thread.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut previous);
        let result = f();
        libc::pthread_sigmask(libc::SIG_SETMASK, &previous, std::ptr::null_mut());
        result
    }
}
