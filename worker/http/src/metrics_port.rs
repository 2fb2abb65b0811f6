//! `telemetry.prometheus_port`: `GET /metrics` alone on a port of its own, as the official
//! service serves it, so Prometheus can scrape without reaching the sync endpoints.
//!
//! A scrape is one small request: each connection serves one request and closes (a body
//! is never read), lasts at most [`CONNECTION_TIMEOUT`] in all, and at most
//! [`MAX_CONNECTIONS`] are open at once; one more is closed at once, so clients that
//! connect and send nothing cannot make the scraper wait in the listen queue.

use std::sync::Arc;
use std::time::Duration;

use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use super::body::Body;
use super::error::ApiError;
use super::metrics;
use super::state::HttpState;

/// Connections open at once; one more is closed without an answer.
const MAX_CONNECTIONS: usize = 64;
/// How long a scraper may take to send its request's head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// What a scrape's request head may be (hyper's least; its default is about 400 KiB).
const HEAD_BYTES: usize = 8 << 10;
/// How long a connection may last in all (its request sent, its answer taken).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `GET /metrics` (and `HEAD`) on every listener until `shutdown` turns true;
/// every other path is 404.
pub async fn serve_metrics(
    listeners: Vec<TcpListener>,
    state: HttpState,
    shutdown: watch::Receiver<bool>,
) {
    let scrapes = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut serving = tokio::task::JoinSet::new();
    for listener in listeners {
        serving.spawn(accept(
            listener,
            state.clone(),
            scrapes.clone(),
            shutdown.clone(),
        ));
    }
    while serving.join_next().await.is_some() {}
}

async fn accept(
    listener: TcpListener,
    state: HttpState,
    scrapes: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(HEAD_BYTES)
        .keep_alive(false);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => return,
            accepted = listener.accept() => accepted,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = scrapes.clone().try_acquire_owned() else {
            drop(tcp);
            continue;
        };
        let state = state.clone();
        let service = hyper::service::service_fn(move |req| {
            let state = state.clone();
            async move { Ok::<_, std::convert::Infallible>(answer(&req, &state)) }
        });
        let connection = http1.serve_connection(TokioIo::new(tcp), service);
        tokio::spawn(async move {
            if tokio::time::timeout(CONNECTION_TIMEOUT, connection)
                .await
                .is_err()
            {
                tracing::debug!("a metrics connection was closed after {CONNECTION_TIMEOUT:?}");
            }
            drop(slot);
        });
    }
}

fn answer(req: &Request<hyper::body::Incoming>, state: &HttpState) -> Response<Body> {
    let path = req.uri().path();
    match (req.method(), path == metrics::PATH) {
        (&Method::GET | &Method::HEAD, true) => metrics::answer(state),
        (method, true) => ApiError::method_not_allowed(method, path).into_response(),
        _ => ApiError::not_found(path).into_response(),
    }
}
