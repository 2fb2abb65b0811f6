//! The sync stream over a WebSocket, as the official SDKs open it with
//! `connectionMethod: WEB_SOCKET` (React Native without streaming `fetch`): RSocket frames
//! in binary messages (`rsocket`). The SETUP frame's metadata carries the token
//! (`{"token": "Token <jwt>"}`); a REQUEST_STREAM on `/sync/stream` carries the sync
//! request; every line goes back as one BSON document in a PAYLOAD frame, only as far as
//! the client's request-N credit allows (the stream is asked for no more lines otherwise,
//! and the socket holds at most one chunk of them). Keepalives are answered, CANCEL ends
//! the stream, an expired token completes it (a socket that takes nothing then is closed a
//! little after).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::{header, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use super::body::Body;
use super::compress::Coding;
use super::error::ApiError;
use super::rsocket::{self, Inbound};
use super::sync_stream::{open, EXPIRY_GRACE};
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

/// How long a client has to send its SETUP and then its REQUEST_STREAM.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Answers the upgrade (101) and serves the socket once hyper hands it over.
pub fn handle(req: Request<Incoming>, service: Arc<SyncService>) -> Response<Body> {
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
    // The socket holds a stream's place from its upgrade on: sockets waiting for their
    // SETUP count against the limit of streams too.
    let Ok(permit) = service.streams.clone().try_acquire_owned() else {
        service.sync_responses.add(429);
        return ApiError::too_many_streams().into_response();
    };
    let accept = derive_accept_key(key.as_bytes());
    // Counted as the stream's answer (`powersync_mdbx_sync_responses_total{status="101"}`).
    service.sync_responses.add(101);
    let upgrading = hyper::upgrade::on(req);
    tokio::spawn(async move {
        match upgrading.await {
            Ok(upgraded) => {
                let mut config = WebSocketConfig::default();
                config.max_message_size = Some(MAX_BODY_BYTES + (64 << 10));
                config.max_frame_size = Some(MAX_BODY_BYTES + (64 << 10));
                let socket = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                serve(socket, service, permit).await;
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

type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Why a socket ends early: an RSocket error to send first.
struct Refusal {
    stream: u32,
    code: u32,
    message: String,
}

async fn serve(
    mut socket: Socket,
    service: Arc<SyncService>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let ended =
        match tokio::time::timeout(SETUP_TIMEOUT, start(&mut socket, &service, permit)).await {
            Err(_) => Err(Refusal {
                stream: 0,
                code: rsocket::INVALID_SETUP,
                message: format!("no SETUP and REQUEST_STREAM within {SETUP_TIMEOUT:?}"),
            }),
            Ok(Err(refusal)) => Err(refusal),
            Ok(Ok(None)) => Ok(()),
            Ok(Ok(Some((stream, credit, lines)))) => {
                let ends = (lines.expires_at + EXPIRY_GRACE).into();
                let following = follow(&mut socket, stream, credit, lines.chunks);
                tokio::time::timeout_at(ends, following)
                    .await
                    .unwrap_or(Ok(()))
            }
        };
    if let Err(refusal) = ended {
        let frame = rsocket::error(refusal.stream, refusal.code, &refusal.message);
        let _ = socket.send(Message::binary(frame)).await;
    }
    let _ = socket.close(None).await;
}

/// Reads SETUP (authenticating its token) and the first REQUEST_STREAM, and opens the
/// sync stream: its id, the client's first credit and the lines. `None` when the client
/// left first.
async fn start(
    socket: &mut Socket,
    service: &Arc<SyncService>,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Result<Option<(u32, u64, Lines)>, Refusal> {
    let mut user = None;
    let mut permit = Some(permit);
    loop {
        let Some(frame) = next_frame(socket).await? else {
            return Ok(None);
        };
        match frame {
            Inbound::Setup { metadata, .. } => {
                let token = metadata_field(&metadata, "token");
                match service.authenticate(token.as_deref()).await {
                    Ok(verified) => user = Some(verified),
                    Err(e) => {
                        return Err(Refusal {
                            stream: 0,
                            code: rsocket::REJECTED_SETUP,
                            message: format!("{}: {e}", e.code()),
                        })
                    }
                }
            }
            Inbound::RequestStream {
                stream,
                credit,
                metadata,
                data,
            } => {
                let Some(user) = user.take() else {
                    return Err(Refusal {
                        stream: 0,
                        code: rsocket::INVALID_SETUP,
                        message: "REQUEST_STREAM before SETUP".into(),
                    });
                };
                let path = metadata_field(&metadata, "path");
                let refuse = |error: ApiError| Refusal {
                    stream,
                    code: rsocket::APPLICATION_ERROR,
                    message: format!("{}: {}", error.code, error.description),
                };
                if path.as_deref() != Some("/sync/stream") {
                    return Err(refuse(ApiError::not_found(path.as_deref().unwrap_or(""))));
                }
                if !service.status.snapshot().ready {
                    return Err(refuse(ApiError::not_ready()));
                }
                let compressor = Coding::negotiate(None).compressor();
                let opened = open(
                    service,
                    user,
                    Encoding::Bson,
                    compressor,
                    &data,
                    permit.take(),
                    None,
                )
                .map_err(refuse)?;
                let lines = Lines {
                    chunks: Box::pin(opened.chunks),
                    expires_at: opened.expires_at,
                };
                return Ok(Some((stream, u64::from(credit), lines)));
            }
            Inbound::Keepalive { respond: true } => send(socket, rsocket::keepalive(false)).await?,
            Inbound::Error { .. } | Inbound::Cancel { .. } => return Ok(None),
            Inbound::Keepalive { .. } | Inbound::RequestN { .. } | Inbound::Other => {}
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
