//! A TCP proxy on loopback in front of a server, for faults of the network between: its
//! open connections can be stalled (they stay open and swallow everything, in both
//! directions, as a network that stopped forwarding does) while new connections pass,
//! and it can be pointed at another server. As a blackhole every connection, open or new,
//! stops forwarding until it is lifted; the connections open during it stay stalled after
//! (what they sent is gone, as a NAT that forgot the flow leaves them).
//!
//! The kernel of this host still acknowledges what the proxy swallows, so TCP keepalives
//! and `TCP_USER_TIMEOUT` never end these connections: what notices them is the engine's
//! own bounds (the stream's liveness check, a copy's progress bound, deadlines).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// A proxy from a free loopback port to `127.0.0.1:<target>`.
pub struct TcpProxy {
    port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    target: AtomicU16,
    /// Connections accepted before this epoch are stalled.
    stalled_before: AtomicU64,
    /// Connections accepted while this is set pass the server's first answer (a
    /// PostgreSQL handshake) and nothing after it.
    handshake_only: AtomicBool,
    /// While set, new connections are accepted and never forwarded (nothing reaches the
    /// server), and [`TcpProxy::blackhole`] stalled those open when it began.
    blackhole: AtomicBool,
    /// A connection whose client sends these bytes stops forwarding from then on.
    stall_on: Mutex<Option<Vec<u8>>>,
    /// Connections stalled by `stall_on`.
    stalled_on_sending: AtomicUsize,
    epoch: AtomicU64,
    closing: AtomicBool,
    /// Every socket, so that dropping the proxy ends every pump.
    sockets: Mutex<Vec<TcpStream>>,
}

impl TcpProxy {
    /// Starts forwarding to `target_port` on loopback.
    pub fn start(target_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared {
            target: AtomicU16::new(target_port),
            stalled_before: AtomicU64::new(0),
            handshake_only: AtomicBool::new(false),
            blackhole: AtomicBool::new(false),
            stall_on: Mutex::new(None),
            stalled_on_sending: AtomicUsize::new(0),
            epoch: AtomicU64::new(1),
            closing: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.closing.load(SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if accepting.blackhole.load(SeqCst) {
                    swallow(&accepting, client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", accepting.target.load(SeqCst)))
                else {
                    continue;
                };
                let epoch = accepting.epoch.load(SeqCst);
                let answers = accepting.handshake_only.load(SeqCst).then_some(1);
                if let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) {
                    accepting
                        .sockets
                        .lock()
                        .expect("proxy sockets")
                        .extend([c, s]);
                }
                let link = Arc::new(Link {
                    epoch,
                    stalled: AtomicBool::new(false),
                });
                pump(&accepting, &client, &server, &link, Direction::ToServer);
                pump(
                    &accepting,
                    &server,
                    &client,
                    &link,
                    Direction::ToClient(answers),
                );
            }
        });
        Self { port, shared }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection URI to the `postgres` database as `postgres` through the proxy.
    pub fn uri(&self) -> String {
        format!(
            "postgresql://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// Every connection open now stops forwarding (both directions; it stays open and
    /// swallows what it is sent). Connections made later are forwarded.
    pub fn stall_open_connections(&self) {
        let next = self.shared.epoch.fetch_add(1, SeqCst) + 1;
        self.shared.stalled_before.store(next, SeqCst);
    }

    /// While `on`, nothing is forwarded: the connections open now stop forwarding for
    /// good (both directions; they stay open and swallow what they are sent), and new
    /// ones are accepted and swallowed likewise. Turned off, new connections are
    /// forwarded again.
    pub fn blackhole(&self, on: bool) {
        if on {
            self.shared.blackhole.store(true, SeqCst);
            self.stall_open_connections();
        } else {
            self.shared.blackhole.store(false, SeqCst);
        }
    }

    /// While `on`, new connections stop forwarding the server's answers after its first
    /// (a PostgreSQL handshake completes, the first query's answer never arrives): a
    /// network that stopped forwarding just after a client connected. Connections made
    /// after it is turned off again are forwarded.
    pub fn answer_only_handshakes(&self, on: bool) {
        self.shared.handshake_only.store(on, SeqCst);
    }

    /// While `Some`, a connection whose client sends `pattern` (within one read, as a
    /// short query arrives) stops forwarding from that moment, both directions: a network
    /// that fails exactly while that request is on its way. Counted by
    /// [`stalled_on_sending`](Self::stalled_on_sending).
    pub fn stall_when_client_sends(&self, pattern: Option<&str>) {
        *self.shared.stall_on.lock().expect("proxy pattern") =
            pattern.map(|p| p.as_bytes().to_vec());
    }

    /// How many connections [`stall_when_client_sends`](Self::stall_when_client_sends)
    /// has stalled.
    pub fn stalled_on_sending(&self) -> usize {
        self.shared.stalled_on_sending.load(SeqCst)
    }

    /// New connections go to `target_port` from now on.
    pub fn retarget(&self, target_port: u16) {
        self.shared.target.store(target_port, SeqCst);
    }
}

/// Holds `client` open and reads (and drops) what it sends, on a thread of its own, until
/// it closes or the proxy is dropped.
fn swallow(shared: &Arc<Shared>, client: TcpStream) {
    if let Ok(held) = client.try_clone() {
        shared.sockets.lock().expect("proxy sockets").push(held);
    }
    std::thread::spawn(move || {
        let mut client = client;
        let mut buf = [0u8; 16 << 10];
        while matches!(client.read(&mut buf), Ok(n) if n > 0) {}
    });
}

/// One proxied connection.
struct Link {
    /// When it was accepted: stalled by `stall_open_connections` after it.
    epoch: u64,
    /// Stalled by `stall_when_client_sends`.
    stalled: AtomicBool,
}

impl Link {
    fn stalled(&self, shared: &Shared) -> bool {
        self.epoch < shared.stalled_before.load(SeqCst) || self.stalled.load(SeqCst)
    }
}

/// Which way a pump copies.
#[derive(Clone, Copy)]
enum Direction {
    /// The client's requests (watched for `stall_on`).
    ToServer,
    /// The server's answers, only this many reads of them when given.
    ToClient(Option<usize>),
}

/// Copies `from` → `to` on a thread of its own until either side closes, swallowing
/// instead once the connection is stalled, or after the reads `direction` allows.
fn pump(
    shared: &Arc<Shared>,
    from: &TcpStream,
    to: &TcpStream,
    link: &Arc<Link>,
    direction: Direction,
) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let shared = shared.clone();
    let link = link.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 << 10];
        let mut forwarded = 0usize;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Direction::ToServer = direction {
                let stall_on = shared.stall_on.lock().expect("proxy pattern");
                if let Some(pattern) = stall_on.as_deref() {
                    if buf[..n].windows(pattern.len()).any(|w| w == pattern)
                        && !link.stalled.swap(true, SeqCst)
                    {
                        shared.stalled_on_sending.fetch_add(1, SeqCst);
                    }
                }
            }
            let answers = match direction {
                Direction::ToClient(answers) => answers,
                Direction::ToServer => None,
            };
            if link.stalled(&shared) || answers.is_some_and(|r| forwarded >= r) {
                continue; // a network that stopped forwarding: nothing arrives
            }
            forwarded += 1;
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        if !link.stalled(&shared) {
            let _ = to.shutdown(Shutdown::Write);
        }
    });
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.closing.store(true, SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for socket in self.shared.sockets.lock().expect("proxy sockets").drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }
}
