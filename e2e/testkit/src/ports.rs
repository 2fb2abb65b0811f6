//! Free loopback ports, unique within this process and checked against the machine.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

static NEXT: AtomicU16 = AtomicU16::new(0);

/// Lowest test port; below are the well-known and registered ports of the machine's services.
const FIRST: u16 = 10_000;
/// Ports each process may take before it reaches the next process's block.
const BLOCK: u16 = 50;

/// A port on 127.0.0.1 that nothing listens on now and that this process has not handed
/// out before. Ports start at a per-process offset so parallel test binaries rarely meet,
/// and stay below the kernel's ephemeral range: an outgoing connection (a walsender's
/// client, a peer copy) takes its local port from there, and a listener started later
/// cannot bind a port such a connection holds.
pub fn free_port() -> u16 {
    let end = ephemeral_start();
    let blocks = (end - FIRST) / BLOCK - 1;
    let _ = NEXT.compare_exchange(
        0,
        FIRST + (std::process::id() % u32::from(blocks)) as u16 * BLOCK,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(
            port < end,
            "ran out of test ports below the ephemeral range ({end}); \
             lower net.ipv4.ip_local_port_range's start or run fewer tests per process"
        );
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// The first port of `net.ipv4.ip_local_port_range` (Linux's default 32768 when unreadable).
fn ephemeral_start() -> u16 {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768);
    assert!(
        start >= FIRST + 4 * BLOCK,
        "net.ipv4.ip_local_port_range starts at {start}: tests need ports between {FIRST} \
         and the ephemeral range; raise its start to 32768"
    );
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..20).map(|_| free_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(
            ports
                .iter()
                .all(|&p| (FIRST..ephemeral_start()).contains(&p)),
            "{ports:?}"
        );
    }
}
