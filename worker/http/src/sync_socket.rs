//! The sync stream over a WebSocket, as the official SDKs open it with
//! `connectionMethod: WEB_SOCKET` (React Native without streaming `fetch`): RSocket frames
//! in binary messages (`rsocket`). The SETUP frame's metadata carries the token
//! (`{"token": "Token <jwt>"}`); a REQUEST_STREAM on `/sync/stream` carries the sync
//! request; every line goes back as one BSON document in a PAYLOAD frame, only as far as
//! the client's request-N credit allows (the stream is asked for no more lines otherwise,
//! and the socket holds at most one chunk of them). Keepalives are answered, CANCEL ends
//! the stream, an expired token completes it (a socket that takes nothing then is closed a
//! little after).
//!
//! Until its SETUP is accepted a socket waits in a small pool of its own
//! ([`MAX_SOCKETS_WAITING_FOR_SETUP`]), for at most [`SETUP_TIMEOUT`], and is read at most
//! [`SETUP_MAX_BYTES`] (`setup_gate`); only an authenticated socket takes a stream's place
//! (and its user's), as an HTTP stream does before its body is read. The socket keeps its
//! connection's place for its life (hyper lets go of the connection at the upgrade).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::{header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::OwnedSemaphorePermit;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use super::admission::{admit, Admission};
use super::body::Body;
use super::compress::Coding;
use super::connection::Connection;
use super::error::ApiError;
use super::rsocket::{self, Inbound};
use super::setup_gate::{SetupGate, SetupTooLarge};
use super::sync_stream::{open, refuse_unless_serving, EXPIRY_GRACE};
use auth::AuthenticatedUser;
use service::{Encoding, SyncService, MAX_BODY_BYTES};

/// The stream's chunks of BSON documents, produced as the client's credit takes them.
type Chunks = std::pin::Pin<Box<dyn futures_util::Stream<Item = Bytes> + Send>>;

/// An opened stream, as the socket follows it.
struct Lines {
    chunks: Chunks,
    /// The token's expiry: a socket that has not taken its stream's last line a little
    /// after it ([`EXPIRY_GRACE`]) ends without it.
    expires_at: std::time::Instant,
}

/// Sockets that wait for their SETUP at once, per server; one more upgrade is answered
/// 503 (`PSM_H1505`). A client sends its SETUP with the upgrade, so a place is held for
/// about a round trip.
pub const MAX_SOCKETS_WAITING_FOR_SETUP: usize = 256;

/// How long a socket has from its upgrade to send its SETUP.
pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Bytes a socket may send before its SETUP is accepted. A SETUP carries the token and a
/// user agent (the SDKs' is a few hundred bytes with a common token); this lets a token be
/// as long as an HTTP request's head may be (the connection's 64 KiB buffer).
pub(crate) const SETUP_MAX_BYTES: usize = 64 << 10;

/// The largest frame once SETUP is accepted: a REQUEST_STREAM carries the sync request
/// (at most [`MAX_BODY_BYTES`]) and its metadata.
const MAX_FRAME_BYTES: usize = MAX_BODY_BYTES + (64 << 10);

/// A socket's read buffer, allocated with it (the library's default is 128 KiB).
const READ_BUFFER_BYTES: usize = 8 << 10;

/// True for a WebSocket upgrade request.
pub fn is_upgrade(req: &Request<Incoming>) -> bool {
    let has = |name: header::HeaderName, token: &str| {
        req.headers().get_all(name).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|part| part.trim().eq_ignore_ascii_case(token))
            })
        })
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket")
}

/// Answers the upgrade (101) and serves the socket once hyper hands it over, holding the
/// `connection`'s place until the socket ends.
pub(crate) fn handle(
    req: Request<Incoming>,
    service: Arc<SyncService>,
    connection: Connection,
) -> Response<Body> {
    let version_13 = req
        .headers()
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_some_and(|v| v == "13");
    let Some(key) = req.headers().get(header::SEC_WEBSOCKET_KEY).cloned() else {
        return ApiError::bad_request("a WebSocket upgrade needs Sec-WebSocket-Key".into())
            .into_response();
    };
    if !version_13 {
        return ApiError::bad_request("only WebSocket version 13 is spoken".into()).into_response();
    }
    let Ok(waiting) = connection.setups.clone().try_acquire_owned() else {
        service.sync_responses.add(503);
        service.connection_outcomes.add("refused");
        return ApiError::too_many_setups().into_response();
    };
    let accept = derive_accept_key(key.as_bytes());
    // Counted as the stream's answer (`powersync_mdbx_sync_responses_total{status="101"}`).
    service.sync_responses.add(101);
    let upgrading = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match upgrading.await {
            Ok(upgraded) => {
                let config = WebSocketConfig::default()
                    .read_buffer_size(READ_BUFFER_BYTES)
                    .max_message_size(Some(MAX_FRAME_BYTES))
                    .max_frame_size(Some(MAX_FRAME_BYTES));
                let gated = SetupGate::new(TokioIo::new(upgraded), SETUP_MAX_BYTES);
                let socket =
                    WebSocketStream::from_raw_socket(gated, Role::Server, Some(config)).await;
                serve(socket, service, waiting, connection).await;
            }
            Err(e) => tracing::debug!(error = %e, "a WebSocket upgrade failed"),
        }
    });
    let mut response = Response::new(super::body::empty_body());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(
        header::UPGRADE,
        header::HeaderValue::from_static("websocket"),
    );
    headers.insert(
        header::CONNECTION,
        header::HeaderValue::from_static("Upgrade"),
    );
    if let Ok(accept) = header::HeaderValue::from_str(&accept) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
    }
    response
}

type Socket = WebSocketStream<SetupGate<TokioIo<hyper::upgrade::Upgraded>>>;

/// Why a socket ends early: an RSocket error to send first.
struct Refusal {
    stream: u32,
    code: u32,
    message: String,
}

impl Refusal {
    fn on_setup(code: u32, message: String) -> Self {
        Self {
            stream: 0,
            code,
            message,
        }
    }
}

/// Serves the socket to its end; the `connection`'s place is given back with it.
async fn serve(
    mut socket: Socket,
    service: Arc<SyncService>,
    waiting: OwnedSemaphorePermit,
    connection: Connection,
) {
    let within = connection.limits.body_read_timeout;
    if let Err(refusal) = run(&mut socket, &service, waiting, within).await {
        service.connection_outcomes.add("refused");
        let frame = rsocket::error(refusal.stream, refusal.code, &refusal.message);
        let _ = socket.send(Message::binary(frame)).await;
    }
    let _ = socket.close(None).await;
    drop(connection);
}

/// The socket's life: its SETUP within [`SETUP_TIMEOUT`] (holding `waiting`, its place
/// in the pool of sockets waiting for SETUP), the stream's admission, its REQUEST_STREAM
/// within `request_within`, then the stream's lines.
async fn run(
    socket: &mut Socket,
    service: &Arc<SyncService>,
    waiting: OwnedSemaphorePermit,
    request_within: Duration,
) -> Result<(), Refusal> {
    let user = tokio::time::timeout(SETUP_TIMEOUT, setup(socket, service))
        .await
        .map_err(|_| {
            Refusal::on_setup(
                rsocket::INVALID_SETUP,
                format!("no SETUP within {SETUP_TIMEOUT:?}"),
            )
        })??;
    drop(waiting);
    let Some(user) = user else { return Ok(()) };
    socket.get_mut().open();
    let admission = admit(service, &user).map_err(|error| {
        Refusal::on_setup(
            rsocket::REJECTED_SETUP,
            format!("{}: {}", error.code, error.description),
        )
    })?;
    let requested = tokio::time::timeout(request_within, request(socket, service, user, admission))
        .await
        .map_err(|_| {
            Refusal::on_setup(
                rsocket::INVALID,
                format!("no REQUEST_STREAM within {request_within:?} of the SETUP"),
            )
        })??;
    let Some((stream, credit, lines)) = requested else {
        return Ok(());
    };
    let ends = (lines.expires_at + EXPIRY_GRACE).into();
    let following = follow(socket, stream, credit, lines.chunks);
    tokio::time::timeout_at(ends, following)
        .await
        .unwrap_or(Ok(()))
}

/// Reads frames until SETUP and authenticates its token; `None` when the client left
/// first.
async fn setup(
    socket: &mut Socket,
    service: &Arc<SyncService>,
) -> Result<Option<AuthenticatedUser>, Refusal> {
    loop {
        let Some(frame) = next_frame(socket).await? else {
            return Ok(None);
        };
        match frame {
            Inbound::Setup { metadata, .. } => {
                let token = metadata_field(&metadata, "token");
                return match service.authenticate(token.as_deref()).await {
                    Ok(user) => Ok(Some(user)),
                    Err(e) => Err(Refusal::on_setup(
                        rsocket::REJECTED_SETUP,
                        format!("{}: {e}", e.code()),
                    )),
                };
            }
            Inbound::RequestStream { .. } => {
                return Err(Refusal::on_setup(
                    rsocket::INVALID_SETUP,
                    "REQUEST_STREAM before SETUP".into(),
                ))
            }
            other => {
                if !answer_other(socket, other).await? {
                    return Ok(None);
                }
            }
        }
    }
}

/// Answers a frame the socket does not wait for: a keepalive asking for one back is
/// answered, others are passed over. False when the frame ends the socket (ERROR, CANCEL).
async fn answer_other(socket: &mut Socket, frame: Inbound) -> Result<bool, Refusal> {
    match frame {
        Inbound::Keepalive { respond: true } => send(socket, rsocket::keepalive(false)).await?,
        Inbound::Error { .. } | Inbound::Cancel { .. } => return Ok(false),
        _ => {}
    }
    Ok(true)
}

/// Reads the first REQUEST_STREAM and opens the sync stream of `user`, admitted with
/// `admission`: its id, the client's first credit and the lines. `None` when the client
/// left first.
async fn request(
    socket: &mut Socket,
    service: &Arc<SyncService>,
    user: AuthenticatedUser,
    admission: Admission,
) -> Result<Option<(u32, u64, Lines)>, Refusal> {
    loop {
        let Some(frame) = next_frame(socket).await? else {
            return Ok(None);
        };
        match frame {
            Inbound::RequestStream {
                stream,
                credit,
                metadata,
                data,
            } => {
                let path = metadata_field(&metadata, "path");
                let refuse = |error: ApiError| Refusal {
                    stream,
                    code: rsocket::APPLICATION_ERROR,
                    message: format!("{}: {}", error.code, error.description),
                };
                if path.as_deref() != Some("/sync/stream") {
                    return Err(refuse(ApiError::not_found(path.as_deref().unwrap_or(""))));
                }
                refuse_unless_serving(service).map_err(refuse)?;
                let compressor = Coding::negotiate(None).compressor();
                let opened = open(
                    service,
                    user,
                    Encoding::Bson,
                    compressor,
                    &data,
                    admission,
                    None,
                )
                .map_err(refuse)?;
                let lines = Lines {
                    chunks: Box::pin(opened.chunks),
                    expires_at: opened.expires_at,
                };
                return Ok(Some((stream, u64::from(credit), lines)));
            }
            Inbound::Setup { .. } => {
                return Err(Refusal::on_setup(
                    rsocket::INVALID,
                    "one SETUP per connection".into(),
                ))
            }
            other => {
                if !answer_other(socket, other).await? {
                    return Ok(None);
                }
            }
        }
    }
}

/// A string field of a frame's JSON metadata (`token` of SETUP, `path` of
/// REQUEST_STREAM); `None` when the metadata is not a JSON object holding one.
pub(crate) fn metadata_field(metadata: &[u8], field: &str) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(metadata)
        .ok()
        .and_then(|m| m[field].as_str().map(str::to_owned))
}

/// Sends the stream's lines as the client's credit allows, answering its frames meanwhile;
/// completes the stream when the lines end (an expired token, the engine stopping).
async fn follow(
    socket: &mut Socket,
    stream: u32,
    mut credit: u64,
    mut lines: Chunks,
) -> Result<(), Refusal> {
    // The BSON documents of the chunk being sent: at most one chunk waits here.
    let mut pending: VecDeque<Bytes> = VecDeque::new();
    let mut ended = false;
    loop {
        while credit > 0 {
            let Some(document) = pending.pop_front() else {
                break;
            };
            send(socket, rsocket::payload_next(stream, &document)).await?;
            credit -= 1;
        }
        if ended && pending.is_empty() {
            send(socket, rsocket::payload_complete(stream)).await?;
            return Ok(());
        }
        let want_lines = credit > 0 && pending.is_empty() && !ended;
        tokio::select! {
            frame = next_frame(socket) => match frame? {
                None => return Ok(()),
                Some(Inbound::RequestN { credit: more, .. }) => credit = credit.saturating_add(u64::from(more)),
                Some(Inbound::Keepalive { respond: true }) => send(socket, rsocket::keepalive(false)).await?,
                Some(Inbound::Cancel { .. } | Inbound::Error { .. }) => return Ok(()),
                Some(Inbound::Setup { .. } | Inbound::RequestStream { .. }) => {
                    return Err(Refusal {
                        stream: 0,
                        code: rsocket::INVALID,
                        message: "one sync stream per connection".into(),
                    })
                }
                Some(_) => {}
            },
            chunk = lines.next(), if want_lines => match chunk {
                Some(chunk) => pending.extend(documents(chunk)),
                None => ended = true,
            },
        }
    }
}

/// The BSON documents of a chunk (each starts with its length, little-endian).
fn documents(mut chunk: Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    while chunk.len() >= 4 {
        let len = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) as usize;
        if len < 5 || len > chunk.len() {
            break;
        }
        out.push(chunk.split_to(len));
    }
    out
}

async fn send(socket: &mut Socket, frame: Vec<u8>) -> Result<(), Refusal> {
    socket
        .send(Message::binary(frame))
        .await
        .map_err(|e| Refusal {
            stream: 0,
            code: rsocket::INVALID,
            message: format!("the socket failed: {e}"),
        })
}

/// The next RSocket frame; `None` when the client closed the socket.
async fn next_frame(socket: &mut Socket) -> Result<Option<Inbound>, Refusal> {
    loop {
        let message = match socket.next().await {
            Some(Err(WsError::Io(e)))
                if e.get_ref().is_some_and(|inner| inner.is::<SetupTooLarge>()) =>
            {
                return Err(Refusal::on_setup(rsocket::INVALID_SETUP, e.to_string()))
            }
            Some(Err(WsError::Capacity(e))) => {
                return Err(Refusal::on_setup(rsocket::INVALID, e.to_string()))
            }
            None | Some(Err(_)) => return Ok(None),
            Some(Ok(message)) => message,
        };
        match message {
            Message::Binary(frame) => {
                return rsocket::read(&frame).map(Some).map_err(|bad| Refusal {
                    stream: 0,
                    code: rsocket::INVALID,
                    message: bad.0,
                })
            }
            Message::Close(_) => return Ok(None),
            // Pings are answered by the library; text is not RSocket.
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_splits_into_its_bson_documents() {
        let doc = |n: u8| {
            let mut d = 6u32.to_le_bytes().to_vec();
            d.extend_from_slice(&[n, 0]);
            d
        };
        let chunk: Vec<u8> = [doc(1), doc(2), doc(3)].concat();
        let docs = documents(Bytes::from(chunk));
        assert_eq!(docs.len(), 3);
        assert_eq!(docs[1].as_ref(), doc(2).as_slice());
        assert!(documents(Bytes::from_static(&[9, 0, 0, 0, 1])).is_empty());
    }
}
