//! Free loopback ports, unique within this process and checked against the machine.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

static NEXT: AtomicU16 = AtomicU16::new(0);

/// A port on 127.0.0.1 that nothing listens on now and that this process has not handed
/// out before. Ports start at a per-process offset so parallel test binaries rarely meet.
pub fn free_port() -> u16 {
    let _ = NEXT.compare_exchange(
        0,
        20_000 + (std::process::id() % 400) as u16 * 50,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(port < 60_000, "ran out of test ports");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
