//! `POST /sync/stream`: authenticate, parse the request, then stream lines for every new
//! checkpoint that concerns the connection until the token expires, the client leaves or
//! the engine stops (spec §5). A stream wakes only for checkpoints that concern it
//! (`service::wakeups`). Store reads run one batch at a time: small ones (a diff of a few
//! recent ops) on the runtime's thread, others on blocking threads under a process-wide
//! limit; nothing holds a read transaction between batches.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{header, Request, Response, StatusCode};
use tokio::sync::mpsc::{self, OwnedPermit};

use super::accept::quality;
use super::authorization::authenticate;
use super::compress::{Coding, Compressor};
use super::error::ApiError;
use super::Body;
use service::write_checkpoint::{record_key, requested, to_report};
use service::Registration;
use service::SyncService;
use service::{Encoding, SyncError, SyncLine, SyncRequest, SyncSession, MAX_BODY_BYTES};
use store::Checkpoint;

/// Encoded bytes gathered before one send (whole lines only). With [`SEND_QUEUE`] and
/// the connection's write buffer it bounds what a client that stops reading holds.
const CHUNK_BYTES: usize = 64 << 10;
/// Keepalive period (spec §5.6: 20 s ± 10 %).
const KEEPALIVE: Duration = Duration::from_secs(20);
/// Before expiry, the line that lets clients fetch a new token in time.
const EXPIRY_WARNING: Duration = Duration::from_secs(20);
/// Chunks buffered toward a slow client (besides the one being written).
const SEND_QUEUE: usize = 1;

/// One queued chunk of a stream's response, boxed: tokio's channel allocates its slots 32
/// at a time, and a pointer-sized slot makes that block, kept beside each open stream,
/// 256 bytes instead of 1 KiB.
pub(super) type Chunk = Box<Bytes>;

/// Answers one `/sync/stream` request.
pub async fn handle(req: Request<Incoming>, service: Arc<SyncService>) -> Response<Body> {
    let response = match start(req, &service).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    service.sync_responses.add(response.status().as_u16());
    response
}

async fn start(
    req: Request<Incoming>,
    service: &Arc<SyncService>,
) -> Result<Response<Body>, ApiError> {
    if !service.status.snapshot().ready {
        return Err(ApiError::not_ready());
    }
    let user = authenticate(service, req.headers()).await?;
    let encoding = negotiate(req.headers().get(header::ACCEPT));
    let coding = Coding::negotiate(req.headers().get(header::ACCEPT_ENCODING));
    let compressor = coding.compressor();
    let body = Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|_| {
            sync_error(SyncError::BodyTooLarge {
                bytes: MAX_BODY_BYTES + 1,
                max: MAX_BODY_BYTES,
            })
        })?
        .to_bytes();
    let (encoding, rx) = open(service, user, encoding, compressor, &body, None)?;
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::convert::Infallible>(Frame::data(*chunk)), rx))
    }));
    let mut response = Response::new(BodyExt::boxed(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(encoding.content_type()),
    );
    headers.insert("x-accel-buffering", header::HeaderValue::from_static("no"));
    headers.insert(
        header::VARY,
        header::HeaderValue::from_static("accept, accept-encoding"),
    );
    if let Some(value) = coding.header() {
        headers.insert(header::CONTENT_ENCODING, value);
    }
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    *response.status_mut() = StatusCode::OK;
    Ok(response)
}

/// Opens a sync stream for `user` with the request `body`, whatever the transport: its
/// lines, encoded (`encoding`, adjusted to the request's `raw_data`, returned) and
/// compressed, as they are produced. The queue holds [`SEND_QUEUE`] chunks: a transport
/// that stops taking them holds the stream. `permit` is the stream's place when the
/// transport took it already (a WebSocket, from its upgrade on).
pub(super) fn open(
    service: &Arc<SyncService>,
    user: auth::AuthenticatedUser,
    encoding: Encoding,
    compressor: Compressor,
    body: &[u8],
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) -> Result<(Encoding, mpsc::Receiver<Chunk>), ApiError> {
    let permit = match permit {
        Some(permit) => permit,
        None => service
            .streams
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::too_many_streams())?,
    };
    let request = SyncRequest::parse(body).map_err(sync_error)?;
    // As the official service: JSON for a client that did not ask for `raw_data` carries
    // the rows as objects.
    let encoding = match (encoding, request.raw_data) {
        (Encoding::Ndjson, Some(true)) | (Encoding::Bson, _) => encoding,
        _ => Encoding::NdjsonNestedData,
    };
    let context = request.context(user.claims.clone());
    let served = service.current();
    let session = SyncSession::new(served.rules.clone(), context, &request.buckets)
        .with_limits(service.limits.request);
    let key = record_key(&user.user_id, request.client_id.as_deref());
    let expires = user
        .expires_at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let registration = service
        .registry
        .register(
            &user.user_id,
            request.client_id.as_deref(),
            expires,
            service.limits.max_streams_per_user,
        )
        .map_err(|full| ApiError::too_many_user_streams(full.max))?;

    let (tx, rx) = mpsc::channel::<Chunk>(SEND_QUEUE);
    let expires_at = Instant::now()
        + user
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
    let service = service.clone();
    tokio::spawn(async move {
        let mut stream = Stream {
            service,
            served,
            producer: Some(Producer {
                session,
                compressor,
            }),
            encoding,
            key,
            reported: None,
            registration,
            tx,
            expires_at,
        };
        let ended = stream.run().await;
        // The stream's place is free before its body ends (with `stream`'s sender): a
        // client that sees the end and opens another stream at once is not refused for it.
        drop(permit);
        stream.finish();
        drop(stream);
        match ended {
            Err(End::Failed(reason)) => tracing::warn!(%reason, "a sync stream failed"),
            Err(end) => tracing::debug!(reason = ?end, "sync stream ended"),
            Ok(()) => {}
        }
    });
    Ok((encoding, rx))
}

/// BSON when the client ranks it at least as high as NDJSON (every SDK asks for it
/// first); NDJSON otherwise and without an `Accept` header.
fn negotiate(accept: Option<&header::HeaderValue>) -> Encoding {
    match (
        quality(accept, Encoding::Bson.content_type()),
        quality(accept, Encoding::Ndjson.content_type()),
    ) {
        (Some(b), n) if b > 0.0 && b >= n.unwrap_or(0.0) => Encoding::Bson,
        _ => Encoding::Ndjson,
    }
}

fn sync_error(e: SyncError) -> ApiError {
    ApiError {
        status: StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST),
        code: e.code(),
        name: "SyncRequestError",
        description: e.to_string(),
    }
}

/// Why a stream ended (for the debug log).
#[derive(Debug)]
enum End {
    ClientGone,
    TokenExpired,
    Shutdown,
    Failed(String),
}

/// What a stream's blocking calls work on.
struct Producer {
    session: SyncSession,
    /// Response compression: each chunk compressed whole (a few bytes between chunks).
    compressor: Compressor,
}

impl From<SyncError> for End {
    fn from(e: SyncError) -> Self {
        End::Failed(e.to_string())
    }
}

impl From<store::StoreError> for End {
    fn from(e: store::StoreError) -> Self {
        SyncError::from(e).into()
    }
}

struct Stream {
    service: Arc<SyncService>,
    /// The generation the session's rules belong to.
    served: Arc<service::Served>,
    /// Taken out while a blocking call works on it.
    producer: Option<Producer>,
    encoding: Encoding,
    key: String,
    /// The `write_checkpoint` of the last checkpoint-type line.
    reported: Option<u64>,
    /// This stream's entry in `streams()`.
    registration: Registration,
    tx: mpsc::Sender<Chunk>,
    /// When the token expires: the stream ends then, even inside a send to a client that
    /// stopped reading.
    expires_at: Instant,
}

impl Stream {
    async fn run(&mut self) -> Result<(), End> {
        let expires_at = self.expires_at;
        if expires_at <= Instant::now() {
            // Still accepted thanks to the clock tolerance: tell the client to renew.
            return self.send_line(&SyncLine::TokenExpiresIn(0)).await;
        }
        let mut generations = self.service.subscribe();
        let mut wakeups = self.served.wakeups.register(&self.key);
        let mut shutdown = self.service.shutdown.clone();
        let mut next_keepalive = Instant::now() + jittered(KEEPALIVE);
        loop {
            let served = generations.borrow_and_update().clone();
            if !Arc::ptr_eq(&served, &self.served) {
                self.follow(served);
                if !wakeups.is_of(&self.served.wakeups) {
                    wakeups = self.served.wakeups.register(&self.key);
                }
            }
            let checkpoint = *self.served.checkpoints.borrow();
            self.announce(checkpoint, &wakeups).await?;
            loop {
                let wake = next_keepalive.min(if Instant::now() + EXPIRY_WARNING < expires_at {
                    expires_at - EXPIRY_WARNING
                } else {
                    expires_at
                });
                tokio::select! {
                    () = wakeups.woken() => {
                        // A generation left behind closes its channel once replaced.
                        if wakeups.is_closed() && Arc::ptr_eq(&generations.borrow(), &self.served) {
                            return Err(End::Shutdown);
                        }
                        break;
                    }
                    changed = generations.changed() => {
                        if changed.is_err() {
                            return Err(End::Shutdown);
                        }
                        break;
                    }
                    _ = tokio::time::sleep_until(wake.into()) => {
                        let left = expires_at.saturating_duration_since(Instant::now());
                        let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
                        let seconds = i32::try_from(seconds).unwrap_or(i32::MAX);
                        self.send_line(&SyncLine::TokenExpiresIn(seconds)).await?;
                        if seconds == 0 {
                            return Err(End::TokenExpired);
                        }
                        next_keepalive = Instant::now() + jittered(KEEPALIVE);
                        // A first checkpoint held for the store to catch up with the
                        // client is decided again, in case the hold ran out.
                        if self.producer.as_ref().is_some_and(|p| p.session.is_unannounced()) {
                            break;
                        }
                    }
                    _ = async { shutdown.wait_for(|s| *s).await.map(|_| ()) } => {
                        return Err(End::Shutdown)
                    }
                    _ = self.tx.closed() => return Err(End::ClientGone),
                }
            }
        }
    }

    /// Moves the session to a newly served generation: its next line is a
    /// `checkpoint_diff` that removes the old generation's buckets and adds the new ones
    /// (spec §7.6), and the client keeps its data until that checkpoint completes.
    fn follow(&mut self, served: Arc<service::Served>) {
        if served.generation != self.served.generation
            || !Arc::ptr_eq(&served.rules, &self.served.rules)
        {
            if let Some(producer) = self.producer.as_mut() {
                producer.session.switch_rules(served.rules.clone());
            }
        }
        self.served = served;
    }

    /// Sends the line for `checkpoint` (if it concerns this connection) and its data, and
    /// tells `wakeups` which later checkpoints concern it: those changing a bucket it
    /// announced or its write-checkpoint record, or every one while its first checkpoint
    /// is held or its write checkpoint waits for the LSN to pass.
    async fn announce(
        &mut self,
        checkpoint: Checkpoint,
        wakeups: &service::Subscription,
    ) -> Result<(), End> {
        // One call per checkpoint that concerns the stream, one read: the write-checkpoint
        // request, then the line.
        let store = self.served.store.clone();
        let key = self.key.clone();
        let reported = self.reported;
        let read_after = wakeups.dispatches();
        let small = self
            .producer
            .as_ref()
            .is_some_and(|p| p.session.checkpoint_is_small());
        let (line, (report, pending)) = self
            .store_work(small, move |producer| {
                Ok(producer.session.checkpoint_with(&store, |view| {
                    let wanted = requested(view, &key)?;
                    let pending = wanted.is_some_and(|w| w.lsn > checkpoint.lsn);
                    let report = to_report(wanted, checkpoint.lsn, reported);
                    Ok((report, (report, pending)))
                })?)
            })
            .await?;
        if let Some(Producer { session, .. }) = &self.producer {
            wakeups.watch(
                session.announced_buckets(),
                pending || session.is_unannounced(),
                read_after,
            );
        }
        let Some(line) = line else { return Ok(()) };
        self.reported = report;
        if let Some(Producer { session, .. }) = &self.producer {
            self.registration
                .checkpoint_sent(session.last_op_id().unwrap_or(0), session.bucket_count());
        }
        let mut head = Vec::new();
        line.encode(self.encoding, &mut head);
        if !self
            .producer
            .as_ref()
            .is_some_and(|p| p.session.is_downloading())
        {
            return self.send(head).await;
        }
        // The data: a chunk of whole lines per call, read, encoded and compressed (off the
        // runtime's threads unless small). The checkpoint line opens the first chunk: one
        // write for a change's checkpoint, data and completion.
        let mut head = Some(head);
        while self
            .producer
            .as_ref()
            .is_some_and(|p| p.session.is_downloading())
        {
            // Room in the queue first: a client that stops reading then holds no chunk
            // that waits to be queued.
            let room = self.room().await?;
            let store = self.served.store.clone();
            let encoding = self.encoding;
            let small = self
                .producer
                .as_ref()
                .is_some_and(|p| p.session.download_is_small());
            let opening = head.take().unwrap_or_default();
            let (chunk, ops, lines) = self
                .store_work(small, move |producer| {
                    producer.chunk(&store, encoding, opening)
                })
                .await?;
            self.service
                .ops_sent
                .fetch_add(ops, std::sync::atomic::Ordering::Relaxed);
            self.count_sent(lines, chunk.len());
            if !chunk.is_empty() {
                room.send(Box::new(Bytes::from(chunk)));
            }
        }
        Ok(())
    }

    /// Runs store work: `small` work (a diff of a few recent ops: microseconds, from
    /// memory) here on the runtime's thread, where a commit that concerns 10,000 streams
    /// costs no thread handoff per stream; other work on a blocking thread.
    async fn store_work<R: Send + 'static>(
        &mut self,
        small: bool,
        work: impl FnOnce(&mut Producer) -> Result<R, End> + Send + 'static,
    ) -> Result<R, End> {
        if !small {
            return self.blocking(work).await;
        }
        let producer = self
            .producer
            .as_mut()
            .ok_or_else(|| End::Failed("the session is gone".into()))?;
        work(producer)
    }

    /// Runs `work` on a blocking thread (store reads), under the process-wide limit.
    async fn blocking<R: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Producer) -> Result<R, End> + Send + 'static,
    ) -> Result<R, End> {
        let _permit = self
            .service
            .reads
            .acquire()
            .await
            .map_err(|_| End::Shutdown)?;
        let mut producer = self
            .producer
            .take()
            .ok_or_else(|| End::Failed("the session is gone".into()))?;
        let (producer, result) = tokio::task::spawn_blocking(move || {
            let result = work(&mut producer);
            (producer, result)
        })
        .await
        .map_err(|e| End::Failed(format!("a sync read panicked: {e}")))?;
        self.producer = Some(producer);
        result
    }

    async fn send_line(&mut self, line: &SyncLine) -> Result<(), End> {
        self.send(line.to_bytes(self.encoding)).await
    }

    async fn send(&mut self, bytes: Vec<u8>) -> Result<(), End> {
        let room = self.room().await?;
        self.queue(room, bytes)
    }

    /// Waits for room in the send queue. A client that stops reading holds the stream
    /// here; its token still ends the stream (and the connection's write timeout ends the
    /// connection).
    async fn room(&self) -> Result<OwnedPermit<Chunk>, End> {
        match tokio::time::timeout_at(self.expires_at.into(), self.tx.clone().reserve_owned()).await
        {
            Ok(room) => room.map_err(|_| End::ClientGone),
            Err(_) => Err(End::TokenExpired),
        }
    }

    /// Compresses `bytes` and queues them in the `room` made for them.
    fn queue(&mut self, room: OwnedPermit<Chunk>, bytes: Vec<u8>) -> Result<(), End> {
        let producer = self
            .producer
            .as_mut()
            .ok_or_else(|| End::Failed("the session is gone".into()))?;
        let lines = bytes.len();
        let compressed = producer.compress(bytes)?;
        self.count_sent(lines, compressed.len());
        room.send(Box::new(Bytes::from(compressed)));
        Ok(())
    }

    /// Queues the end of the response's compression (the gzip member's last block and
    /// trailer) if the queue has room for it now: the body ends either way, and a client
    /// that stopped reading does not hold the stream for it (its decoder then sees the
    /// body end without the trailer, every line before it decoded).
    fn finish(&mut self) {
        let Some(producer) = self.producer.take() else {
            return;
        };
        let end = producer.compressor.finish();
        if end.is_empty() {
            return;
        }
        if let Ok(room) = self.tx.try_reserve() {
            self.count_sent(0, end.len());
            room.send(Box::new(Bytes::from(end)));
        }
    }

    /// Counts `lines` bytes of sync lines queued as `sent` bytes (after compression).
    fn count_sent(&self, lines: usize, sent: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.service.bytes_synced.fetch_add(lines as u64, Relaxed);
        self.service.bytes_sent.fetch_add(sent as u64, Relaxed);
    }
}

impl Producer {
    /// The next chunk of the download after the encoded lines `opening`, compressed:
    /// whole lines of about [`CHUNK_BYTES`] (empty when there is nothing to send), the
    /// bucket ops in it, and the bytes of its lines before compression.
    fn chunk(
        &mut self,
        store: &store::Store,
        encoding: Encoding,
        opening: Vec<u8>,
    ) -> Result<(Vec<u8>, u64, usize), End> {
        // Grown as lines come: most chunks (a change or two) are a few hundred bytes, and
        // 10,000 streams each touching a chunk-sized buffer at once cost more in page
        // faults than a large download's few reallocations.
        let mut out = opening;
        let mut ops = 0u64;
        while out.len() < CHUNK_BYTES {
            match self.session.next_line(store)? {
                Some(line) => {
                    if let SyncLine::Data(data) = &line {
                        ops += data.ops.len() as u64;
                    }
                    line.encode(encoding, &mut out)
                }
                None => break,
            }
        }
        if out.is_empty() {
            return Ok((out, 0, 0));
        }
        let lines = out.len();
        Ok((self.compress(out)?, ops, lines))
    }

    /// `bytes` through the response's compression, flushed.
    fn compress(&mut self, bytes: Vec<u8>) -> Result<Vec<u8>, End> {
        self.compressor
            .chunk(bytes)
            .map_err(|e| End::Failed(format!("compression: {e}")))
    }
}

/// `period` ± 10 %, from the clock's nanoseconds (no randomness source needed).
fn jittered(period: Duration) -> Duration {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let factor = 0.9 + f64::from(nanos % 1000) / 5000.0;
    period.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bson_is_chosen_when_ranked_first_ndjson_otherwise() {
        let sdk = header::HeaderValue::from_static(
            "application/vnd.powersync.bson-stream;q=0.9,application/x-ndjson;q=0.8",
        );
        assert_eq!(negotiate(Some(&sdk)), Encoding::Bson);
        let json_first = header::HeaderValue::from_static(
            "application/vnd.powersync.bson-stream;q=0.5, application/x-ndjson",
        );
        assert_eq!(negotiate(Some(&json_first)), Encoding::Ndjson);
        assert_eq!(negotiate(None), Encoding::Ndjson);
        let other = header::HeaderValue::from_static("*/*");
        assert_eq!(negotiate(Some(&other)), Encoding::Ndjson);
    }

    #[test]
    fn keepalive_jitter_stays_within_ten_percent() {
        for _ in 0..100 {
            let d = jittered(KEEPALIVE);
            assert!(d >= Duration::from_secs(18) && d <= Duration::from_secs(22));
        }
    }
}
