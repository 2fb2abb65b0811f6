//! `GET /peer/store?after_lsn=<LSN>`: a consistent copy of the served store for a sync
//! replica that seeds itself from this one (`docs/operations.md`, "A fleet of replicas").
//!
//! The endpoint exists only when `powersync_mdbx.peer_secret_file` is set. On the peer
//! listener (`peer_tls`, TLS) it answers any address. On the sync port (plain HTTP) it
//! answers only loopback connections, only when `powersync_mdbx.peer_loopback` is on, and
//! never a request a proxy forwarded (`Forwarded`, `X-Forwarded-*`, `X-Real-IP`): behind a
//! local proxy every client is loopback. It takes the secret as
//! `Authorization: Bearer <secret>` ([`PeerGate`]: checked in constant time, failures
//! throttled per address and logged), then a copy slot. It waits until the store has
//! applied `after_lsn` (the seeding replica's slot starts there), then streams
//! `store::Store::export_copy` (the data file, page for page, from one read transaction) on
//! a blocking thread; the writer goes on meanwhile. A peer that takes nothing for
//! [`PEER_STALL`] ends the copy and its read transaction. A copy that stops midway ends the
//! body before the copy's last frame, which the receiver refuses.
//!
//! `GET /peer/store?probe`, admitted the same way, answers at once what a seeding replica
//! checks before it creates its slot: whether this replica is ready, busy with work a copy
//! must not catch, and the hash of the rules it serves.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{header, HeaderMap, Request, Response, StatusCode};
use tokio::sync::mpsc;

use super::body::Body;
use super::error::ApiError;
use super::peer_gate::{PeerGate, SecretRefusal};
use super::state::HttpState;

/// The endpoint's path.
pub const PATH: &str = "/peer/store";
/// How long a request waits for the store to apply the LSN it asks for.
const CATCH_UP_WAIT: Duration = Duration::from_secs(60);
/// Bytes of the copy sent per body chunk, and chunks queued toward a slow peer.
const CHUNK_BYTES: usize = 256 << 10;
const QUEUED_CHUNKS: usize = 16;
/// How long a copy waits for a peer that takes none of it before it ends (and gives back
/// its read transaction, which would otherwise keep the store from reusing pages).
pub const PEER_STALL: Duration = Duration::from_secs(30);
/// Headers a proxy adds to a request it forwards.
const FORWARDING_HEADERS: [&str; 5] = [
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
];

/// How a request reached the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The sync port, in clear: loopback peers only, when the operator allows them.
    Plain,
    /// The peer listener, over TLS.
    Tls,
}

/// Answers a peer's request for a copy of the store.
pub async fn handle(
    req: Request<Incoming>,
    state: &HttpState,
    peer: SocketAddr,
    transport: Transport,
) -> Response<Body> {
    let Some(gate) = state.peer.as_ref() else {
        return ApiError::not_found(PATH).into_response();
    };
    let after_lsn = match admit(gate, peer, transport, req.headers(), req.uri().query()) {
        Ok(Asked::Copy(lsn)) => lsn,
        Ok(Asked::Probe) => return probe_answer(&state.status.snapshot()),
        Err(refusal) => return refusal.into_response(),
    };
    let status = state.status.snapshot();
    if !status.ready {
        return ApiError::not_ready().into_response();
    }
    if let Some(busy) = busy(&status) {
        // The receiver would refuse such a copy once it holds all of it (`PSM_B1027`).
        return ApiError::unavailable(format!(
            "this replica {busy}: a copy now would hold work only it finishes; retry once it \
             is done"
        ))
        .into_response();
    }
    let served = state.sync.current();
    let mut checkpoints = served.checkpoints.clone();
    let caught_up = tokio::time::timeout(
        CATCH_UP_WAIT,
        checkpoints.wait_for(|cp| cp.lsn >= after_lsn),
    )
    .await;
    if !matches!(caught_up, Ok(Ok(_))) {
        return ApiError::unavailable(format!(
            "this replica has not applied {} within {CATCH_UP_WAIT:?} (it is at {}); retry",
            source::format_lsn(after_lsn),
            source::format_lsn(served.checkpoints.borrow().lsn)
        ))
        .into_response();
    }
    let Some(slot) = gate.copy_slot() else {
        return ApiError::unavailable(format!(
            "this replica is serving {} store copies already; retry",
            super::peer_gate::MAX_COPIES
        ))
        .into_response();
    };
    let (tx, rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
    let store = served.store.clone();
    let mut out = ChunkWriter::new(tx, PEER_STALL);
    tokio::task::spawn_blocking(move || {
        let _slot = slot;
        match store.export_copy(&mut out) {
            Ok(cp) => tracing::info!(
                %peer,
                lsn = %source::format_lsn(cp.lsn),
                op_id = cp.op_id,
                "a peer copied the store"
            ),
            Err(e) => tracing::warn!(%peer, error = %e, "a peer's copy of the store stopped"),
        }
    });
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|bytes| (Ok::<_, std::convert::Infallible>(Frame::data(bytes)), rx))
    }));
    let mut response = Response::new(BodyExt::boxed(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/octet-stream"),
    );
    response
}

/// What an admitted request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asked {
    /// A copy once the store has applied this LSN.
    Copy(u64),
    /// What the seeding replica checks before it creates its slot.
    Probe,
}

/// The answer to `?probe`: `{"ready", "busy", "rules_hash"}`.
fn probe_answer(status: &status::Status) -> Response<Body> {
    super::error::json_response(
        StatusCode::OK,
        &serde_json::json!({
            "ready": status.ready,
            "busy": busy(status),
            "rules_hash": status.rules_hash,
        }),
    )
}

/// What this replica is in the middle of that a copy must not catch it in: a rebuild
/// from a new slot, or tables copied again (a schema change, an in-place deploy).
fn busy(status: &status::Status) -> Option<String> {
    let replication = status.replication.as_ref()?;
    if replication.rebuilding {
        Some("is rebuilding from a new slot".into())
    } else if replication.recopying > 0 {
        Some(format!(
            "is copying {} table(s) again",
            replication.recopying
        ))
    } else {
        None
    }
}

/// The LSN a request may have a copy after: it came over TLS, or from this host on the
/// sync port when the operator allows that and no proxy forwarded it; it carries the
/// secret ([`PeerGate::check_secret`]) and names `after_lsn` (or asks for a probe).
fn admit(
    gate: &PeerGate,
    peer: SocketAddr,
    transport: Transport,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Asked, ApiError> {
    if transport == Transport::Plain {
        admit_plain(gate, peer, headers)?;
    }
    let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match gate.check_secret(peer.ip(), authorization) {
        Ok(()) => {}
        Err(SecretRefusal::Wrong) => {
            return Err(refusal(
                StatusCode::UNAUTHORIZED,
                "PSM_H1461",
                "the peer secret is missing or wrong: send Authorization: Bearer <the secret \
                 in powersync_mdbx.peer_secret_file of this replica>"
                    .into(),
            ))
        }
        Err(SecretRefusal::Throttled(wait)) => {
            return Err(refusal(
                StatusCode::TOO_MANY_REQUESTS,
                "PSM_H1464",
                format!(
                    "{} presented a wrong peer secret {} times within {:?}; it is refused for \
                     another {} s",
                    peer.ip(),
                    super::peer_gate::MAX_FAILURES,
                    super::peer_gate::FAILURE_WINDOW,
                    wait.as_secs() + 1
                ),
            ))
        }
    }
    let mut pairs = query.into_iter().flat_map(|q| q.split('&'));
    if pairs.clone().any(|pair| pair == "probe") {
        return Ok(Asked::Probe);
    }
    pairs
        .find_map(|pair| pair.strip_prefix("after_lsn="))
        .and_then(|v| source::parse_lsn(v).or_else(|| v.parse().ok()))
        .map(Asked::Copy)
        .ok_or_else(|| {
            refusal(
                StatusCode::BAD_REQUEST,
                "PSM_H1462",
                "ask for /peer/store?after_lsn=<LSN> (hex X/Y or decimal): the LSN the \
                 seeding replica's slot starts at"
                    .into(),
            )
        })
}

/// A request in clear on the sync port: only from this host, only when the operator
/// allows it, and never through a proxy.
fn admit_plain(gate: &PeerGate, peer: SocketAddr, headers: &HeaderMap) -> Result<(), ApiError> {
    let over_tls = "seed from https://<this replica>:<its powersync_mdbx.peer_listen port> \
                    instead";
    if !peer.ip().is_loopback() {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "PSM_H1460",
            format!(
                "on the sync port the peer endpoint answers only connections from this host \
                 ({} is not a loopback address): a store copy must not cross a network in \
                 clear; {over_tls}",
                peer.ip()
            ),
        ));
    }
    if !gate.serves_loopback() {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "PSM_H1460",
            format!(
                "this replica serves store copies on its sync port only with \
                 powersync_mdbx.peer_loopback = on (a peer on this host); {over_tls}"
            ),
        ));
    }
    if let Some(name) = FORWARDING_HEADERS
        .iter()
        .find(|h| headers.contains_key(**h))
    {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "PSM_H1463",
            format!(
                "a proxy forwarded this request ({name}): on the sync port store copies are \
                 served only to peers on this host connecting directly; {over_tls}"
            ),
        ));
    }
    Ok(())
}

fn refusal(status: StatusCode, code: &'static str, description: String) -> ApiError {
    ApiError {
        status,
        code,
        name: "PeerRefused",
        description,
    }
}

/// Hands the copy to the response body in chunks; a peer that takes nothing for `stall`
/// ends the copy (and its read transaction), one that went away ends it at once.
struct ChunkWriter {
    tx: mpsc::Sender<Bytes>,
    buffer: Vec<u8>,
    stall: Duration,
    runtime: tokio::runtime::Handle,
}

impl ChunkWriter {
    /// A writer into `tx`; made on the runtime, written on a blocking thread.
    fn new(tx: mpsc::Sender<Bytes>, stall: Duration) -> Self {
        Self {
            tx,
            buffer: Vec::with_capacity(CHUNK_BYTES),
            stall,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        // The timer is made inside `block_on`: the store may write from a thread of its
        // own, outside the runtime's context.
        let (tx, stall) = (&self.tx, self.stall);
        let sent = self.runtime.block_on(async move {
            tokio::time::timeout(stall, tx.send(Bytes::from(chunk))).await
        });
        match sent {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(std::io::Error::other("the peer went away")),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the peer took nothing for {:?}", self.stall),
            )),
        }
    }
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= CHUNK_BYTES {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"a-peer-secret-of-enough-bytes";

    fn headers(authorization: Option<&str>, extra: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        if let Some(value) = authorization {
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
        }
        for (name, value) in extra {
            headers.insert(*name, value.parse().unwrap());
        }
        headers
    }

    #[test]
    fn peers_over_tls_or_allowed_from_this_host_with_the_secret_and_an_lsn_are_admitted() {
        let gate = PeerGate::new(SECRET, true);
        let here: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let good = headers(Some("Bearer a-peer-secret-of-enough-bytes"), &[]);
        let query = Some("after_lsn=16/B374D848");
        let plain = Transport::Plain;
        assert_eq!(
            admit(&gate, here, plain, &good, query).unwrap(),
            Asked::Copy(0x16_B374_D848)
        );
        assert_eq!(
            admit(&gate, here, plain, &good, Some("probe")).unwrap(),
            Asked::Probe
        );
        let v6: SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(
            admit(&gate, v6, plain, &good, Some("after_lsn=7")).unwrap(),
            Asked::Copy(7)
        );
        let remote: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        assert_eq!(
            admit(&gate, remote, Transport::Tls, &good, query).unwrap(),
            Asked::Copy(0x16_B374_D848)
        );
        let code = |gate: &PeerGate, peer: &str, transport, headers: &HeaderMap, query| {
            admit(gate, peer.parse().unwrap(), transport, headers, query)
                .unwrap_err()
                .code
        };
        assert_eq!(
            code(&gate, "10.1.2.3:5000", plain, &good, query),
            "PSM_H1460"
        );
        assert_eq!(code(&gate, "127.0.0.1:1", plain, &good, None), "PSM_H1462");
        assert_eq!(
            code(&gate, "127.0.0.1:1", plain, &good, Some("after_lsn=zz")),
            "PSM_H1462"
        );
        // Each address's wrong secrets count toward its throttle: a fresh gate per case.
        for wrong in [
            headers(None, &[]),
            headers(Some("Bearer a-peer-secret-of-enough-byteS"), &[]),
            headers(Some("a-peer-secret-of-enough-bytes"), &[]),
        ] {
            let gate = PeerGate::new(SECRET, true);
            assert_eq!(
                code(&gate, "127.0.0.1:1", plain, &wrong, query),
                "PSM_H1461"
            );
            assert_eq!(
                code(&gate, "10.1.2.3:5000", Transport::Tls, &wrong, query),
                "PSM_H1461"
            );
        }
    }

    #[test]
    fn the_sync_port_serves_no_copy_unless_allowed_nor_through_a_proxy() {
        let query = Some("after_lsn=7");
        let good = headers(Some("Bearer a-peer-secret-of-enough-bytes"), &[]);
        let here: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let closed = PeerGate::new(SECRET, false);
        let refused = admit(&closed, here, Transport::Plain, &good, query).unwrap_err();
        assert_eq!(refused.code, "PSM_H1460");
        assert!(
            refused.description.contains("peer_loopback = on"),
            "{}",
            refused.description
        );
        assert_eq!(
            admit(&closed, here, Transport::Tls, &good, query).unwrap(),
            Asked::Copy(7),
            "the TLS listener is not the sync port"
        );
        let open = PeerGate::new(SECRET, true);
        for forwarded in [
            ("forwarded", "for=203.0.113.9"),
            ("x-forwarded-for", "203.0.113.9"),
            ("x-real-ip", "203.0.113.9"),
        ] {
            let through_proxy = headers(Some("Bearer a-peer-secret-of-enough-bytes"), &[forwarded]);
            let refused = admit(&open, here, Transport::Plain, &through_proxy, query).unwrap_err();
            assert_eq!(refused.code, "PSM_H1463", "{forwarded:?}");
        }
    }

    #[test]
    fn an_address_guessing_the_secret_is_throttled() {
        let gate = PeerGate::new(SECRET, true);
        let here: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let wrong = headers(Some("Bearer guess"), &[]);
        let good = headers(Some("Bearer a-peer-secret-of-enough-bytes"), &[]);
        let query = Some("after_lsn=7");
        for _ in 0..crate::peer_gate::MAX_FAILURES {
            let refused = admit(&gate, here, Transport::Plain, &wrong, query).unwrap_err();
            assert_eq!(refused.code, "PSM_H1461");
        }
        let refused = admit(&gate, here, Transport::Plain, &good, query).unwrap_err();
        assert_eq!(
            (refused.code, refused.status),
            ("PSM_H1464", StatusCode::TOO_MANY_REQUESTS)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_peer_that_takes_nothing_ends_the_copy_after_the_stall_bound() {
        use std::io::Write;
        let (tx, _rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
        let mut out = ChunkWriter::new(tx, Duration::from_millis(300));
        let started = std::time::Instant::now();
        // A thread outside the runtime's context, as the store's copy may write from.
        let copy = tokio::task::spawn_blocking(move || {
            std::thread::scope(|scope| {
                scope
                    .spawn(|| {
                        let page = vec![7u8; CHUNK_BYTES];
                        (0..QUEUED_CHUNKS * 4).try_for_each(|_| out.write_all(&page))
                    })
                    .join()
                    .unwrap()
            })
        });
        let ended = tokio::time::timeout(Duration::from_secs(20), copy)
            .await
            .expect("the copy ends while the peer takes nothing")
            .unwrap();
        assert_eq!(ended.unwrap_err().kind(), std::io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_replica_rebuilding_or_copying_tables_again_hands_out_no_copy() {
        let mut status = status::StatusCell::new(1).snapshot();
        assert_eq!(busy(&status), None);
        status.replication = Some(status::ReplicationStatus::default());
        assert_eq!(busy(&status), None);
        let replication = status.replication.as_mut().unwrap();
        replication.recopying = 2;
        assert_eq!(
            busy(&status).as_deref(),
            Some("is copying 2 table(s) again")
        );
        let replication = status.replication.as_mut().unwrap();
        replication.rebuilding = true;
        assert_eq!(
            busy(&status).as_deref(),
            Some("is rebuilding from a new slot")
        );
    }
}
