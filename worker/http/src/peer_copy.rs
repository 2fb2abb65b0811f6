//! `GET /peer/store?after_lsn=<LSN>`: a consistent copy of the served store for a sync
//! replica that seeds itself from this one (`docs/operations.md`, "A fleet of replicas").
//!
//! The endpoint exists only when `powersync_mdbx.peer_secret` is set. On the sync port
//! (plain HTTP) it answers only loopback peers, since a store must not cross a network in
//! clear; on the peer listener (`peer_tls`, TLS) it answers any address. It takes the
//! secret as `Authorization: Bearer <secret>`, compared in
//! constant time. It waits until the store has applied `after_lsn` (the seeding replica's
//! slot starts there), then streams `store::Store::export_copy` (the data file, page for page,
//! from one read transaction) on a blocking thread; the writer goes on meanwhile. A copy
//! that stops midway ends the body before the copy's last frame, which the receiver
//! refuses.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{header, Request, Response, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::mpsc;

use super::body::Body;
use super::error::ApiError;
use super::state::HttpState;

/// The endpoint's path.
pub const PATH: &str = "/peer/store";
/// How long a request waits for the store to apply the LSN it asks for.
const CATCH_UP_WAIT: Duration = Duration::from_secs(60);
/// Bytes of the copy sent per body chunk, and chunks queued toward a slow peer.
const CHUNK_BYTES: usize = 256 << 10;
const QUEUED_CHUNKS: usize = 16;

/// How a request reached the endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The sync port, in clear: loopback peers only.
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
    let Some(secret) = state.peer_secret.as_ref() else {
        return ApiError::not_found(PATH).into_response();
    };
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    let after_lsn = match admit(secret, peer, transport, authorization, req.uri().query()) {
        Ok(lsn) => lsn,
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
    let (tx, rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
    let store = served.store.clone();
    tokio::task::spawn_blocking(move || {
        let mut out = ChunkWriter {
            tx,
            buffer: Vec::with_capacity(CHUNK_BYTES),
        };
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

/// What [`HttpState::peer_secret`](super::HttpState) holds of the secret: its SHA-256.
pub fn peer_secret_digest(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// The LSN a request may have a copy after: it came over TLS or from this host, carries
/// the secret whose SHA-256 is `secret` (the digests are compared in constant time, so neither the
/// secret's bytes nor its length show in the answer's timing) and names `after_lsn`.
fn admit(
    secret: &[u8; 32],
    peer: SocketAddr,
    transport: Transport,
    authorization: Option<&[u8]>,
    query: Option<&str>,
) -> Result<u64, ApiError> {
    if transport == Transport::Plain && !peer.ip().is_loopback() {
        return Err(refusal(
            StatusCode::FORBIDDEN,
            "PSM_H1460",
            format!(
                "on the sync port the peer endpoint answers only connections from this host \
                 ({} is not a loopback address): a store copy must not cross a network in \
                 clear; seed from https://<this replica>:<its powersync_mdbx.peer_listen \
                 port> instead",
                peer.ip()
            ),
        ));
    }
    let given = authorization.and_then(|v| v.strip_prefix(b"Bearer ".as_slice()));
    let authorized =
        given.is_some_and(|given| bool::from(Sha256::digest(given).as_slice().ct_eq(secret)));
    if !authorized {
        return Err(refusal(
            StatusCode::UNAUTHORIZED,
            "PSM_H1461",
            "the peer secret is missing or wrong: send Authorization: Bearer <the \
             powersync_mdbx.peer_secret of this replica>"
                .into(),
        ));
    }
    query
        .and_then(|q| {
            q.split('&')
                .find_map(|pair| pair.strip_prefix("after_lsn="))
        })
        .and_then(|v| source::parse_lsn(v).or_else(|| v.parse().ok()))
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

fn refusal(status: StatusCode, code: &'static str, description: String) -> ApiError {
    ApiError {
        status,
        code,
        name: "PeerRefused",
        description,
    }
}

/// Hands the copy to the response body in chunks; a peer that stops reading blocks the
/// copy (holding its read transaction), one that went away ends it.
struct ChunkWriter {
    tx: mpsc::Sender<Bytes>,
    buffer: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        self.tx
            .blocking_send(Bytes::from(chunk))
            .map_err(|_| std::io::Error::other("the peer went away"))
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

    #[test]
    fn peers_in_clear_from_this_host_or_over_tls_with_the_secret_and_an_lsn_are_admitted() {
        let secret = peer_secret_digest(b"a-peer-secret-of-enough-bytes");
        let here: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let good = Some(b"Bearer a-peer-secret-of-enough-bytes".as_slice());
        let query = Some("after_lsn=16/B374D848");
        let plain = Transport::Plain;
        assert_eq!(
            admit(&secret, here, plain, good, query).unwrap(),
            0x16_B374_D848
        );
        assert_eq!(
            admit(
                &secret,
                "[::1]:1".parse().unwrap(),
                plain,
                good,
                Some("after_lsn=7")
            )
            .unwrap(),
            7
        );
        let remote: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        assert_eq!(
            admit(&secret, remote, Transport::Tls, good, query).unwrap(),
            0x16_B374_D848
        );
        assert_eq!(
            admit(&secret, remote, Transport::Tls, None, query)
                .unwrap_err()
                .code,
            "PSM_H1461"
        );
        let code = |peer: &str, auth: Option<&[u8]>, query| {
            admit(&secret, peer.parse().unwrap(), plain, auth, query)
                .unwrap_err()
                .code
        };
        assert_eq!(code("10.1.2.3:5000", good, query), "PSM_H1460");
        assert_eq!(code("127.0.0.1:1", None, query), "PSM_H1461");
        assert_eq!(
            code(
                "127.0.0.1:1",
                Some(b"Bearer a-peer-secret-of-enough-byteS"),
                query
            ),
            "PSM_H1461"
        );
        assert_eq!(
            code("127.0.0.1:1", Some(b"a-peer-secret-of-enough-bytes"), query),
            "PSM_H1461"
        );
        assert_eq!(code("127.0.0.1:1", good, None), "PSM_H1462");
        assert_eq!(code("127.0.0.1:1", good, Some("after_lsn=zz")), "PSM_H1462");
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
