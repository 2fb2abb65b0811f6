//! Seeding: an empty store filled with a copy of a peer's store (`powersync_mdbx.seed_from`)
//! instead of a snapshot, so both replicas hold one history (`docs/storage.md`, "Copying a
//! store to a peer").
//!
//! The replica first probes the peer (`GET /peer/store?probe`: reachable, the secret
//! accepted, the certificate trusted, ready, serving the same rules), so that a peer it
//! cannot seed from leaves nothing on the primary. Then it records its intent, creates its
//! own slot (consistent point `S`), asks the peer for a copy taken once the peer has
//! applied `S` (`GET /peer/store?after_lsn=S`),
//! installs it with its own slot, timeline and generation in the bootstrap record, and
//! then streams its slot from the copy's applied LSN `A ≥ S` like any complete store (the
//! stream skips transactions committed before `A`). Restartable like the bootstrap: until
//! the last install commit the stored record says the seeding did not complete, and a
//! restart drops the slot it created and starts over. A seeding that fails after its slot
//! was created drops the slot at once (a retry creates a new one), so a slot waiting for
//! the operator never keeps WAL on the primary. Every step with the peer has a deadline,
//! and its connection has TCP keepalives and a user timeout.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{header, Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::deploy::KEY as DEPLOY_KEY;
use super::intent::{BootstrapIntent, BootstrapState};
use crate::bootstrap::foreign_slot;
use crate::error::ReplicationError;
use crate::plan::SourcePlan;
use crate::progress::Progress;
use config::{PeerSecret, SeedPeer};
use source::{connect, create_slot, drop_slot, format_lsn, slot_info, validate_primary};
use store::{CopiedMeta, Store, StoreError};

/// The largest error answer read from a peer.
const MAX_ERROR_BYTES: usize = 64 << 10;
/// How long the peer gets to accept a connection and finish the TLS handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the peer gets to answer a probe, or to start sending a copy (it waits up to
/// 60 s to apply the slot's consistent point first).
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);
const COPY_START_TIMEOUT: Duration = Duration::from_secs(90);
/// The longest the copy may send nothing before it is given up.
const COPY_STALL: Duration = Duration::from_secs(60);
/// TCP keepalive on the peer connection: first probe after this idle time, then every
/// [`KEEPALIVE_INTERVAL`], dead after [`KEEPALIVE_RETRIES`]; unacknowledged data gives up
/// after [`USER_TIMEOUT`].
const KEEPALIVE_IDLE: Duration = Duration::from_secs(15);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 4;
const USER_TIMEOUT: Duration = Duration::from_secs(30);
/// Body chunks queued between the connection and the installing thread (the peer's
/// chunks are 256 KiB): the copy keeps coming while the install commits.
const QUEUED_CHUNKS: usize = 32;

/// Where a replica seeds from, and the secret the peer expects.
#[derive(Debug, Clone)]
pub struct SeedSource {
    /// The peer.
    pub peer: SeedPeer,
    /// `powersync_mdbx.peer_secret`.
    pub secret: PeerSecret,
    /// `powersync_mdbx.peer_tls_ca_file`: the CAs an https peer's certificate must chain to.
    pub ca_file: Option<std::path::PathBuf>,
}

/// A completed seeding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seeded {
    /// This replica's slot's consistent point.
    pub consistent_point: u64,
    /// The LSN the copy had applied (the stream starts here).
    pub applied_lsn: u64,
    /// The copy's last op id.
    pub op_id: u64,
    /// Bytes received.
    pub bytes: u64,
}

/// Fills the store in `dir` (which holds no complete data, and which nothing else has
/// open) from `from`, for the rules whose content hash is `rules_hash` (the peer must
/// serve the same ones). The store is closed when this returns.
pub async fn seed(
    plan: &SourcePlan,
    from: &SeedSource,
    rules_text: &str,
    rules_hash: &str,
    generation: u64,
    dir: &Path,
    progress: Arc<Progress>,
) -> Result<Seeded, ReplicationError> {
    progress.reset();
    let store = open_store(dir).await?;
    let client = connect(&plan.connection).await?;
    let primary = validate_primary(&client, &[]).await?;
    let slot = slot_info(&client, &plan.slot).await?;
    let stored = store.read(|view| Ok(BootstrapIntent::load(view)))??;
    match (&stored, &slot) {
        (Some(intent), _) if intent.state == BootstrapState::Complete => {
            return Err(seed_error(
                "PSM_B1020",
                "the store is complete already; seeding fills only an empty store (this is a \
                 bug, please report it)"
                    .into(),
                true,
            ));
        }
        (Some(intent), Some(found)) if intent.slot == plan.slot && !found.active => {
            tracing::info!(slot = %plan.slot, "dropping the slot of an interrupted seeding");
            drop_slot(&client, &plan.slot).await?;
        }
        (_, Some(_)) => return Err(foreign_slot(&plan.slot)),
        _ => {}
    }
    // Nothing is created on the primary for a peer that cannot serve this replica.
    probe_peer(from, rules_hash).await?;
    store.clear_data()?;
    let started = Instant::now();
    // The tables come with the peer's record.
    let intent = BootstrapIntent::creating_slot(
        &primary,
        plan,
        rules_hash.to_owned(),
        generation,
        Vec::new(),
    );
    let encoded = intent.encode()?;
    store.write(0, |w| {
        BootstrapIntent::save_rules_text(rules_text, w)?;
        BootstrapIntent::save(&encoded, w)
    })?;
    let exported = create_slot(&plan.connection, &client, &plan.slot).await?;
    let consistent_point = exported.consistent_point;
    // The slot streams from the copy's position; its snapshot is not needed.
    drop(exported);
    let copied = copy_into(store, from, &client, consistent_point, intent, &progress).await;
    let (checkpoint, bytes) = match copied {
        Ok(copied) => copied,
        Err(e) => {
            // A retry creates a new slot; until then this one would only keep WAL.
            let dropped = tokio::time::timeout(CONNECT_TIMEOUT, drop_slot(&client, &plan.slot));
            match dropped.await {
                Ok(Ok(())) => {
                    tracing::info!(slot = %plan.slot, "dropped the slot of a failed seeding")
                }
                Ok(Err(drop_error)) => {
                    tracing::warn!(slot = %plan.slot, error = %drop_error, "the slot of a failed seeding could not be dropped; the next attempt drops it")
                }
                Err(_) => {
                    tracing::warn!(slot = %plan.slot, "dropping the slot of a failed seeding timed out; the next attempt drops it")
                }
            }
            return Err(e);
        }
    };
    tracing::info!(
        applied_lsn = %format_lsn(checkpoint.lsn),
        op_id = checkpoint.op_id,
        bytes,
        seconds = format!("{:.2}", started.elapsed().as_secs_f64()),
        "seeded from the peer"
    );
    Ok(Seeded {
        consistent_point,
        applied_lsn: checkpoint.lsn,
        op_id: checkpoint.op_id,
        bytes,
    })
}

/// After the slot exists at `consistent_point`: the marker the peer waits for, the intent
/// that names the slot, and the peer's copy installed.
async fn copy_into(
    store: Store,
    from: &SeedSource,
    client: &tokio_postgres::Client,
    consistent_point: u64,
    mut intent: BootstrapIntent,
    progress: &Progress,
) -> Result<(store::Checkpoint, u64), ReplicationError> {
    // A logical message past the consistent point: the peer's stream passes it even while
    // the primary writes nothing else, and the peer waits for that before it copies.
    source::emit_marker(client, "seed").await?;
    intent.state = BootstrapState::Snapshotting;
    intent.consistent_point = Some(consistent_point);
    let encoded = intent.encode()?;
    store.write(0, |w| BootstrapIntent::save(&encoded, w))?;
    tracing::info!(
        slot = %intent.slot,
        consistent_point = %format_lsn(consistent_point),
        peer = %from.peer,
        "slot created, copying the peer's store"
    );
    progress.start_copy();
    install_peer_copy(store, from, consistent_point, intent).await
}

/// Opens the store in `dir` (off the runtime threads).
async fn open_store(dir: &Path) -> Result<Store, ReplicationError> {
    let dir = dir.to_owned();
    tokio::task::spawn_blocking(move || Store::open(&dir))
        .await
        .map_err(|e| {
            seed_error(
                "PSM_B1021",
                format!("the opening thread failed: {e}"),
                false,
            )
        })?
        .map_err(ReplicationError::from)
}

/// Asks `from` for its copy at `consistent_point` and installs it in `store`, its
/// bootstrap record made this replica's (`intent`, see [`adopt`]). Returns the checkpoint
/// installed and the bytes received.
async fn install_peer_copy(
    store: Store,
    from: &SeedSource,
    consistent_point: u64,
    intent: BootstrapIntent,
) -> Result<(store::Checkpoint, u64), ReplicationError> {
    let (chunks, body) = request_copy(from, consistent_point).await?;
    let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let reader = ChunkReader {
        chunks,
        current: Bytes::new(),
        read: 0,
        received: received.clone(),
    };
    let install = tokio::task::spawn_blocking(move || {
        let mut reader = reader;
        store.install_copy(&mut reader, |meta| adopt(meta, intent))
    });
    let (installed, streamed) = tokio::join!(install, body);
    let installed = installed.map_err(|e| {
        seed_error(
            "PSM_B1021",
            format!("the installing thread failed: {e}"),
            false,
        )
    })?;
    let checkpoint = match installed {
        Ok(checkpoint) => checkpoint,
        // A copy cut short says more through the connection's error.
        Err(ReplicationError::Store(StoreError::BadCopy {
            cut_short: true, ..
        })) => {
            return Err(streamed.err().unwrap_or_else(|| {
                seed_error(
                    "PSM_B1022",
                    "the peer's copy ended early (the peer stopped or restarted); retrying".into(),
                    false,
                )
            }))
        }
        // Bytes changed on the way: another copy may arrive whole.
        Err(ReplicationError::Store(e @ StoreError::DamagedCopy { .. })) => {
            return Err(seed_error("PSM_B1031", format!("{e}; retrying"), false))
        }
        Err(e) => return Err(e),
    };
    let bytes = received.load(std::sync::atomic::Ordering::Relaxed);
    Ok((checkpoint, bytes))
}

/// Checks the peer's bootstrap record in the copy and makes it this replica's: its slot,
/// timeline, generation and consistent point; the tables, their columns and the rules
/// stay the peer's.
fn adopt(meta: &mut CopiedMeta, ours: BootstrapIntent) -> Result<(), ReplicationError> {
    let key = format!("stage.{}", BootstrapIntent::KEY).into_bytes();
    let Some(record) = meta.get(&key) else {
        return Err(seed_error(
            "PSM_B1023",
            "the peer's store has no bootstrap record; seed from a replica that serves".into(),
            true,
        ));
    };
    let theirs = BootstrapIntent::decode(record)?;
    if theirs.system_identifier != ours.system_identifier || theirs.database != ours.database {
        return Err(seed_error(
            "PSM_B1024",
            format!(
                "the peer replicates another primary (system identifier {}, database {}) than \
                 this replica ({}, {}); point powersync_mdbx.seed_from at a replica of the same \
                 primary and database",
                theirs.system_identifier, theirs.database, ours.system_identifier, ours.database
            ),
            true,
        ));
    }
    if theirs.rules_hash != ours.rules_hash {
        return Err(rules_differ(&theirs.rules_hash, &ours.rules_hash));
    }
    if !meta.contains_key(b"history".as_slice()) {
        return Err(seed_error(
            "PSM_B1026",
            "the peer's store names buckets by its generation (built before bucket names \
             were derived): run a rules deploy or reset() on the peer first"
                .into(),
            true,
        ));
    }
    let busy = if theirs.state != BootstrapState::Complete {
        Some("has not completed its snapshot".to_owned())
    } else if theirs.rebuilding {
        Some("is rebuilding from a new slot".to_owned())
    } else if meta.contains_key(format!("stage.{DEPLOY_KEY}").as_bytes()) {
        Some("is deploying new rules".to_owned())
    } else {
        theirs
            .tables
            .iter()
            .find(|t| t.recopy || !t.rekey_from.is_empty())
            .map(|t| format!("is copying table {}.{} again", t.schema, t.name))
    };
    if let Some(busy) = busy {
        return Err(peer_busy(&busy));
    }
    let adopted = BootstrapIntent {
        slot: ours.slot,
        timeline: ours.timeline,
        generation: ours.generation,
        consistent_point: ours.consistent_point,
        state: BootstrapState::Complete,
        ..theirs
    };
    meta.insert(key, adopted.encode()?);
    Ok(())
}

/// A TLS connection to the peer over `tcp`: its certificate must chain to a CA of
/// `powersync_mdbx.peer_tls_ca_file` (else to a public web root) and name the host of
/// `seed_from`. A refused certificate needs the operator.
async fn tls_to_peer(
    from: &SeedSource,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ReplicationError> {
    let ca = from.ca_file.as_ref().map(|p| p.display().to_string());
    let roots = source::root_store(ca.as_deref())?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| seed_error("PSM_B1030", format!("cannot set up TLS: {e}"), true))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls::pki_types::ServerName::try_from(from.peer.host.clone()).map_err(|e| {
        seed_error(
            "PSM_B1030",
            format!("{} names no usable TLS server name ({e})", from.peer),
            true,
        )
    })?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| {
            let trust = if from.ca_file.is_some() {
                "powersync_mdbx.peer_tls_ca_file"
            } else {
                "the public web roots (set powersync_mdbx.peer_tls_ca_file to the fleet's CA)"
            };
            seed_error(
                "PSM_B1030",
                format!(
                    "the TLS handshake with the peer at {} failed: {e}; its certificate \
                     (powersync_mdbx.peer_tls_cert_file there) must be signed by a CA of {trust} \
                     and name the host of powersync_mdbx.seed_from",
                    from.peer
                ),
                true,
            )
        })
}

/// The connection to the peer a request goes over, and the task that drives it.
struct PeerConnection {
    sender: hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    driver: tokio::task::JoinHandle<Result<(), hyper::Error>>,
}

/// The retryable error for a peer that cannot be reached or stops answering.
fn unreachable(from: &SeedSource, what: String) -> ReplicationError {
    seed_error(
        "PSM_B1028",
        format!("the peer at {} {what}; retrying", from.peer),
        false,
    )
}

/// Connects to the peer within [`CONNECT_TIMEOUT`] (TLS when `https://`), with TCP
/// keepalives and a user timeout, so a peer that vanishes is noticed in seconds.
async fn connect_to_peer(from: &SeedSource) -> Result<PeerConnection, ReplicationError> {
    let connect = TcpStream::connect((from.peer.host.as_str(), from.peer.port));
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(e)) => return Err(unreachable(from, format!("cannot be reached ({e})"))),
        Err(_) => {
            return Err(unreachable(
                from,
                format!("did not accept a connection within {CONNECT_TIMEOUT:?}"),
            ))
        }
    };
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_RETRIES);
    let socket = socket2::SockRef::from(&tcp);
    if let Err(e) = socket
        .set_tcp_keepalive(&keepalive)
        .and_then(|()| socket.set_tcp_user_timeout(Some(USER_TIMEOUT)))
    {
        tracing::debug!(error = %e, "TCP keepalive not set on the peer connection");
    }
    let speaks_http = |e: hyper::Error| unreachable(from, format!("does not speak HTTP ({e})"));
    let (sender, driver) = if from.peer.tls {
        let tls = tokio::time::timeout(CONNECT_TIMEOUT, tls_to_peer(from, tcp))
            .await
            .map_err(|_| {
                unreachable(
                    from,
                    format!("did not finish the TLS handshake within {CONNECT_TIMEOUT:?}"),
                )
            })??;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(speaks_http)?;
        (sender, tokio::spawn(connection))
    } else {
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(speaks_http)?;
        (sender, tokio::spawn(connection))
    };
    Ok(PeerConnection { sender, driver })
}

/// `GET path` on `connection` with the secret; the response head within `head_timeout`.
/// An answer other than 200 is an error that says why (see [`refused`]).
async fn get(
    from: &SeedSource,
    connection: &mut PeerConnection,
    path: &str,
    head_timeout: Duration,
) -> Result<hyper::Response<hyper::body::Incoming>, ReplicationError> {
    let request = Request::get(path)
        .header(
            header::HOST,
            format!("{}:{}", from.peer.host, from.peer.port),
        )
        .header(
            header::AUTHORIZATION,
            [b"Bearer ".as_slice(), from.secret.expose()].concat(),
        )
        .header(header::USER_AGENT, "powersync-mdbx")
        .body(Empty::<Bytes>::new())
        .map_err(|e| unreachable(from, format!("cannot be asked ({e})")))?;
    let response = tokio::time::timeout(head_timeout, connection.sender.send_request(request))
        .await
        .map_err(|_| unreachable(from, format!("did not answer within {head_timeout:?}")))?
        .map_err(|e| unreachable(from, format!("did not answer ({e})")))?;
    if response.status() == StatusCode::OK {
        return Ok(response);
    }
    let status = response.status();
    let body = read_small(response, head_timeout).await;
    connection.driver.abort();
    Err(refused(from, status, &body))
}

/// At most [`MAX_ERROR_BYTES`] of a response's body, within `timeout`, as text.
async fn read_small(response: hyper::Response<hyper::body::Incoming>, timeout: Duration) -> String {
    let read = http_body_util::Limited::new(response.into_body(), MAX_ERROR_BYTES).collect();
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(body)) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        _ => String::new(),
    }
}

/// The error for a peer's refusal: a wrong secret, no copies served, or a refused address
/// wait for the operator; the rest (busy, not caught up, throttled) are retried.
fn refused(from: &SeedSource, status: StatusCode, body: &str) -> ReplicationError {
    let operator = matches!(
        status,
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND
    );
    let hint = match status {
        StatusCode::NOT_FOUND => {
            " (the peer serves no copies: set powersync_mdbx.peer_secret_file on it too)"
        }
        StatusCode::UNAUTHORIZED => {
            " (put the same secret in powersync_mdbx.peer_secret_file on both replicas)"
        }
        _ => "",
    };
    seed_error(
        "PSM_B1029",
        format!(
            "the peer at {} refused the copy: HTTP {status}{hint}: {body}",
            from.peer
        ),
        operator,
    )
}

/// What the peer says before a slot is created (`GET /peer/store?probe`): it is reachable,
/// takes the secret, is ready and not busy, and serves the rules whose hash is
/// `rules_hash`.
async fn probe_peer(from: &SeedSource, rules_hash: &str) -> Result<(), ReplicationError> {
    let mut connection = connect_to_peer(from).await?;
    let response = get(from, &mut connection, "/peer/store?probe", PROBE_TIMEOUT).await?;
    let body = read_small(response, PROBE_TIMEOUT).await;
    connection.driver.abort();
    let answer: serde_json::Value = serde_json::from_str(&body).map_err(|_| {
        unreachable(
            from,
            format!("answered the probe with {body:?}, not its state (a build without probes?)"),
        )
    })?;
    let theirs = answer["rules_hash"].as_str().unwrap_or_default();
    if answer["ready"] != true {
        return Err(seed_error(
            "PSM_B1029",
            format!(
                "the peer at {} is not ready to hand out a copy (starting, or catching up); \
                 retrying",
                from.peer
            ),
            false,
        ));
    }
    if let Some(busy) = answer["busy"].as_str() {
        return Err(peer_busy(busy));
    }
    if theirs != rules_hash {
        return Err(rules_differ(theirs, rules_hash));
    }
    Ok(())
}

/// The peer is in the middle of work (`busy`) a copy must not catch: retried.
fn peer_busy(busy: &str) -> ReplicationError {
    seed_error(
        "PSM_B1027",
        format!("the peer {busy}: a copy now would hold what only the peer will finish; retrying"),
        false,
    )
}

/// The peer serves rules whose hash is `theirs`, this replica's configuration `ours`.
fn rules_differ(theirs: &str, ours: &str) -> ReplicationError {
    seed_error(
        "PSM_B1025",
        format!(
            "the peer serves other sync rules (hash {theirs}) than this replica's configuration \
             ({ours}); configure the same rules on both, or deploy them on the peer first"
        ),
        true,
    )
}

/// Asks for the copy after `after_lsn`; returns the body's chunks and the task that reads
/// them (its error says why a copy stopped). The peer has [`COPY_START_TIMEOUT`] to start
/// and [`COPY_STALL`] between chunks.
async fn request_copy(
    from: &SeedSource,
    after_lsn: u64,
) -> Result<
    (
        mpsc::Receiver<Bytes>,
        impl std::future::Future<Output = Result<(), ReplicationError>> + '_,
    ),
    ReplicationError,
> {
    let mut connection = connect_to_peer(from).await?;
    let path = format!("/peer/store?after_lsn={}", format_lsn(after_lsn));
    let response = get(from, &mut connection, &path, COPY_START_TIMEOUT).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(QUEUED_CHUNKS);
    let mut body = response.into_body();
    let read = async move {
        let result = loop {
            let frame = match tokio::time::timeout(COPY_STALL, body.frame()).await {
                Ok(frame) => frame,
                Err(_) => {
                    break Err(unreachable(
                        from,
                        format!("sent nothing of the copy for {COPY_STALL:?}"),
                    ))
                }
            };
            match frame {
                None => break Ok(()),
                Some(Err(e)) => {
                    break Err(unreachable(from, format!("stopped sending the copy ({e})")))
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        if tx.send(data).await.is_err() {
                            break Ok(()); // the install stopped; its error is reported
                        }
                    }
                }
            }
        };
        drop(tx);
        drop(connection.sender);
        let _ = connection.driver.await;
        result
    };
    Ok((rx, read))
}

/// The body's chunks as a blocking reader for the install.
struct ChunkReader {
    chunks: mpsc::Receiver<Bytes>,
    current: Bytes,
    /// Bytes of `current` already read (the install reads a few bytes at a time).
    read: usize,
    received: Arc<std::sync::atomic::AtomicU64>,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.read == self.current.len() {
            match self.chunks.blocking_recv() {
                Some(chunk) => {
                    self.received
                        .fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    self.current = chunk;
                    self.read = 0;
                }
                None => return Ok(0),
            }
        }
        let rest = &self.current[self.read..];
        let n = buf.len().min(rest.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.read += n;
        Ok(n)
    }
}

fn seed_error(code: &'static str, message: String, operator: bool) -> ReplicationError {
    ReplicationError::Seed {
        code,
        message,
        operator,
    }
}
