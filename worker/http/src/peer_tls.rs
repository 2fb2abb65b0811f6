//! The peer listener (`powersync_mdbx.peer_listen`): `GET /peer/store` over TLS (rustls),
//! for replicas that seed from this one across a network. It serves nothing else; the sync
//! endpoints stay on the sync port. Without TLS the peer endpoint answers only loopback
//! connections, and only when the operator allows it (`peer_copy`). A connection takes a
//! place among [`MAX_PEER_CONNECTIONS`] for its handshake and request; a copy slot is taken
//! only once its secret is checked (`peer_gate`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;

use super::body::Body;
use super::error::ApiError;
use super::peer_copy;
use super::state::HttpState;

/// How long a connection gets to finish its TLS handshake and send its request head.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections the peer listener holds at once (handshakes, requests and copies); copies
/// themselves are fewer (`peer_gate::MAX_COPIES`).
const MAX_PEER_CONNECTIONS: usize = 64;

/// The TLS side of the peer listener: the certificate chain in `cert_file` and the private
/// key in `key_file` (PEM). The error says which file is wrong and how.
pub fn peer_tls_acceptor(cert_file: &Path, key_file: &Path) -> Result<TlsAcceptor, String> {
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            format!(
                "powersync_mdbx.peer_tls_cert_file {}: not a readable PEM certificate chain \
                 ({e})",
                cert_file.display()
            )
        })?;
    if certs.is_empty() {
        return Err(format!(
            "powersync_mdbx.peer_tls_cert_file {} holds no certificate",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
        format!(
            "powersync_mdbx.peer_tls_key_file {}: not a readable PEM private key ({e})",
            key_file.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot set up TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "powersync_mdbx.peer_tls_key_file {} does not fit the certificate in {}: {e}",
                key_file.display(),
                cert_file.display()
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `GET /peer/store` over TLS on `listener` until `shutdown` turns true.
pub async fn serve_peers(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    state: HttpState,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_PEER_CONNECTIONS));
    let mut http1 = hyper::server::conn::http1::Builder::new();
    http1
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|stop| *stop) => None,
            accepted = listener.accept() => Some(accepted),
        };
        match accepted {
            None => break,
            Some(Ok((tcp, peer))) => {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(%peer, "a peer connection over the limit was closed");
                    continue;
                };
                let (acceptor, state) = (acceptor.clone(), state.clone());
                tokio::spawn(serve_peer(tcp, peer, acceptor, state, http1.clone(), slot));
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "accepting a peer connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// One peer connection: the TLS handshake (bounded), then HTTP/1.1 until it ends.
async fn serve_peer(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    state: HttpState,
    http1: hyper::server::conn::http1::Builder,
    slot: tokio::sync::OwnedSemaphorePermit,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "a peer's TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "a peer's TLS handshake timed out");
            return;
        }
    };
    let service = hyper::service::service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, std::convert::Infallible>(route(req, &state, peer).await) }
    });
    if let Err(e) = http1.serve_connection(TokioIo::new(tls), service).await {
        tracing::debug!(%peer, error = %e, "a peer connection ended with an error");
    }
    drop(slot);
}

async fn route(req: Request<Incoming>, state: &HttpState, peer: SocketAddr) -> Response<Body> {
    let path = req.uri().path().to_owned();
    match (req.method(), path.as_str()) {
        (&Method::GET, peer_copy::PATH) => {
            peer_copy::handle(req, state, peer, peer_copy::Transport::Tls).await
        }
        (_, peer_copy::PATH) => ApiError::method_not_allowed(req.method(), &path).into_response(),
        _ => ApiError::not_found(&path).into_response(),
    }
}
