//! Accepting connections and routing requests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::body::Body;
use super::connection::Connection;
use super::error::ApiError;
use super::limits::HttpLimits;
use super::probes::{self, Probe};
use super::state::HttpState;
use super::write_timeout::{WriteDeadline, WriteTimeout};
use super::{admin_api, cors, metrics, peer_copy, sync_socket, sync_stream, write_checkpoint};

/// How long open connections get to finish when the engine stops.
const DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// Raises this process's soft limit of open files to its hard limit: every sync stream
/// holds a socket, and PostgreSQL's children start with the common soft limit of 1,024.
/// Returns the limit in force.
pub fn raise_open_files_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    limit.rlim_cur
}

/// What one connection buffers, each way: a request's head may be this long, and
/// response chunks queued for a client that stops reading hold at most this much (with
/// the sync stream's own queue, `docs/operations.md` 4.5). hyper's default is ~400 KiB.
const CONNECTION_BUFFER_BYTES: usize = 64 << 10;

/// Bytes a connection's socket may hold that the client has not been sent yet before it
/// stops taking more (`TCP_NOTSENT_LOWAT`). Without it the kernel takes up to its
/// autotuned send buffer (megabytes on loopback) toward a client that stopped reading, and
/// the worker reads and compresses that much for nothing while reading clients wait
/// (`docs/benchmark.md`, "Clients that stop reading"). Bytes in flight are not counted, so
/// a long, fast link still fills its window.
const UNSENT_BYTES: u32 = 16 << 10;

/// Binds `port` on every address in `hosts`. `*` means every IPv4 and every IPv6 address:
/// the IPv6 wildcard is bound IPv6-only (on a dual-stack host it would otherwise claim
/// IPv4 too and collide with the IPv4 wildcard), and is left out on a host without IPv6.
pub async fn bind(
    hosts: &[String],
    port: u16,
) -> Result<Vec<TcpListener>, (String, std::io::Error)> {
    let mut listeners = Vec::new();
    for host in hosts {
        if host == "*" {
            let ipv4 = SocketAddr::from(([0, 0, 0, 0], port));
            listeners.push(listen(ipv4).map_err(|e| (ipv4.to_string(), e))?);
            let ipv6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
            match listen(ipv6) {
                Ok(listener) => listeners.push(listener),
                Err(e) if no_ipv6(&e) => {
                    tracing::info!("this host has no IPv6; listening on IPv4 only");
                }
                Err(e) => return Err((ipv6.to_string(), e)),
            }
            continue;
        }
        let target = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let listener = TcpListener::bind(&target)
            .await
            .map_err(|e| (target.clone(), e))?;
        listeners.push(listener);
    }
    Ok(listeners)
}

/// A listening socket on `address`, IPv6-only when it is an IPv6 address.
fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if address.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// The host has no IPv6 (disabled, or no address of the family).
fn no_ipv6(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL | libc::EPROTONOSUPPORT)
    )
}

/// Serves every listener under `limits` until `shutdown` turns true, then drains open
/// connections for at most `DRAIN_TIMEOUT`.
pub async fn serve(
    listeners: Vec<TcpListener>,
    state: HttpState,
    mut shutdown: watch::Receiver<bool>,
    limits: HttpLimits,
) {
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let setups = Arc::new(Semaphore::new(sync_socket::MAX_SOCKETS_WAITING_FOR_SETUP));
    let connections_stop = shutdown.clone();
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(CONNECTION_BUFFER_BYTES);
    let (conn_tx, mut conn_rx) =
        tokio::sync::mpsc::channel::<(tokio::net::TcpStream, SocketAddr)>(64);
    let mut acceptors = tokio::task::JoinSet::new();
    for listener in listeners {
        let tx = conn_tx.clone();
        acceptors.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok(conn) => {
                        if tx.send(conn).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting an HTTP connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
    }
    drop(conn_tx);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => break,
            conn = conn_rx.recv() => {
                let Some((stream, peer)) = conn else { break };
                let Ok(permit) = connections.clone().try_acquire_owned() else {
                    tokio::spawn(refuse(stream));
                    continue;
                };
                // Stream lines are small writes flushed one by one: with Nagle's algorithm a
                // line waits for the ACK of the previous one, which the client delays by up
                // to 40 ms.
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY not set");
                }
                if let Err(e) = socket2::SockRef::from(&stream).set_tcp_notsent_lowat(UNSENT_BYTES) {
                    tracing::debug!(error = %e, "TCP_NOTSENT_LOWAT not set");
                }
                let state = state.clone();
                // Shared with a WebSocket the connection upgrades to: the place is given
                // back when both ended.
                let permit = Arc::new(permit);
                let connection = Connection {
                    place: permit.clone(),
                    limits,
                    setups: setups.clone(),
                };
                let deadline = WriteDeadline::default();
                let io = TokioIo::new(WriteTimeout::new(stream, limits.write_timeout, deadline.clone()));
                // The request's future is boxed: hyper keeps a place for the service's
                // future for the connection's whole life, and the answer's future (every
                // route inlined, about 12 KiB) would otherwise stay allocated beside each
                // open stream. Boxed, it is freed once the response is made.
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    let deadline = deadline.clone();
                    let connection = connection.clone();
                    let answer: std::pin::Pin<Box<dyn std::future::Future<Output = _> + Send>> =
                        Box::pin(async move {
                            Ok::<_, std::convert::Infallible>(
                                route(req, &state, peer, deadline, connection).await,
                            )
                        });
                    answer
                });
                // Upgrades (the sync stream over a WebSocket) are served; at shutdown a
                // connection finishes its answer and closes.
                let mut conn = http1.serve_connection(io, service).with_upgrades();
                let mut stop = connections_stop.clone();
                // The connection is polled where the task holds it (it is `Unpin`): moved
                // into a pinned local, it would take its place twice in the task.
                tokio::spawn(async move {
                    let stopping = async move {
                        let _ = stop.wait_for(|stop| *stop).await;
                    };
                    let ended = tokio::select! {
                        ended = &mut conn => ended,
                        () = stopping => {
                            std::pin::Pin::new(&mut conn).graceful_shutdown();
                            (&mut conn).await
                        }
                    };
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "HTTP connection ended with an error");
                    }
                    drop(permit);
                });
            }
        }
    }
    acceptors.shutdown().await;
    // Every connection holds a permit until it ends.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(DRAIN_TIMEOUT, connections.acquire_many(all))
        .await
        .is_err()
    {
        tracing::debug!("HTTP connections still open at shutdown were closed");
    }
}

/// Answers a connection over the cap with 503 and closes it, without reading its request:
/// a bounded write (it gives up after [`REFUSAL_WRITE_TIMEOUT`]) on a task of its own.
async fn refuse(mut stream: TcpStream) {
    let error = ApiError::too_many_connections();
    let body = error.json_body();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 5\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&body).await?;
        stream.shutdown().await
    };
    if tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write)
        .await
        .is_err()
    {
        tracing::debug!("a refused connection did not take its 503 in time");
    }
}

/// How long a refused connection gets to take its 503.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// The endpoints browsers call from other origins (the web SDK); only their answers
/// carry CORS headers.
const SYNC_ENDPOINTS: [&str; 3] = [
    "/sync/stream",
    "/write-checkpoint2.json",
    write_checkpoint::REQUEST_PATH,
];

/// Answers `req`; `deadline` bounds the writes of its connection (see [`WriteDeadline`]).
async fn route(
    req: Request<Incoming>,
    state: &HttpState,
    peer: SocketAddr,
    deadline: WriteDeadline,
    connection: Connection,
) -> Response<Body> {
    let cors = SYNC_ENDPOINTS.contains(&req.uri().path());
    let mut response = dispatch(req, state, peer, deadline, connection).await;
    if cors {
        cors::allow_origin(&mut response);
    }
    response
}

async fn dispatch(
    req: Request<Incoming>,
    state: &HttpState,
    peer: SocketAddr,
    deadline: WriteDeadline,
    connection: Connection,
) -> Response<Body> {
    let body_within = connection.limits.body_read_timeout;
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    if let Some(probe) = Probe::from_path(&path) {
        return if method == Method::GET || method == Method::HEAD {
            probes::answer(probe, state)
        } else {
            ApiError::method_not_allowed(&method, &path).into_response()
        };
    }
    if path == metrics::PATH {
        return if method == Method::GET || method == Method::HEAD {
            metrics::answer(state)
        } else {
            ApiError::method_not_allowed(&method, &path).into_response()
        };
    }
    if admin_api::is_admin_path(&path) {
        return admin_api::handle(req, &state.admin, body_within).await;
    }
    let known = SYNC_ENDPOINTS.contains(&path.as_str());
    match (method, path.as_str()) {
        (Method::OPTIONS, _) if known => cors::preflight(req.headers()),
        (Method::POST, "/sync/stream") => {
            sync_stream::handle(req, state.sync.clone(), deadline, body_within).await
        }
        (Method::GET, "/sync/stream") if sync_socket::is_upgrade(&req) => {
            sync_socket::handle(req, state.sync.clone(), connection)
        }
        (Method::POST, write_checkpoint::REQUEST_PATH) => {
            write_checkpoint::handle_request(req, state.sync.clone(), body_within).await
        }
        (Method::GET, "/write-checkpoint2.json") => {
            write_checkpoint::handle(req, state.sync.clone()).await
        }
        (Method::GET, peer_copy::PATH) => {
            peer_copy::handle(req, state, peer, peer_copy::Transport::Plain).await
        }
        (method, _) if known => ApiError::method_not_allowed(&method, &path).into_response(),
        _ => ApiError::not_found(&path).into_response(),
    }
}

#[cfg(test)]
mod tests;
