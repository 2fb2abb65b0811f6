//! `POST /sync/stream`: authenticate, parse the request, then stream lines for every new checkpoint
//! that concerns the connection until the token expires, the client leaves or the engine stops
//! (`docs/spec/protocol.md` §5). A stream wakes only for checkpoints that concern it
//! (`service::wakeups`). Its lines are produced as the transport takes them: the stream is the
//! response body itself, polled by the connection's task (no task or queue of its own), and a
//! client that stops reading stops its production. Store reads run one chunk at a time: small ones
//! (a diff of a few recent ops) on the runtime's thread, others on the service's fixed set of
//! reader threads (`service::readers`), in turn; nothing holds a read transaction between chunks.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{header, Request, Response, StatusCode};
use tokio::sync::{watch, OwnedSemaphorePermit};

use super::accept::quality;
use super::admission::{admit, Admission};
use super::authorization::authenticate;
use super::body::Body;
use super::compress::{Coding, Compressor};
use super::error::ApiError;
use super::request_body::read_body;
use super::stream_log::{CloseReason, StreamLog};
use super::write_timeout::WriteDeadline;
use service::write_checkpoint::{record_key, requested, to_report};
use service::Registration;
use service::SyncService;
use service::{Encoding, SyncError, SyncLine, SyncRequest, SyncSession, MAX_BODY_BYTES};

/// Encoded bytes gathered into one chunk of the response (whole lines only).
const CHUNK_BYTES: usize = 64 << 10;
/// Keepalive period (`docs/spec/protocol.md` §5.6: 20 s ± 10 %).
const KEEPALIVE: Duration = Duration::from_secs(20);
/// Before expiry, the line that lets clients fetch a new token in time.
const EXPIRY_WARNING: Duration = Duration::from_secs(20);

/// Answers one `/sync/stream` request.
/// `deadline` is set to the token's expiry while the stream is written: a client that
/// stops reading stops asking for chunks, and the connection's pending writes then end it.
/// The request's body must arrive whole within `body_within` of its headers.
pub async fn handle(
    req: Request<Incoming>,
    service: Arc<SyncService>,
    deadline: WriteDeadline,
    body_within: Duration,
) -> Response<Body> {
    let response = match start(req, &service, deadline, body_within).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    service.sync_responses.add(response.status().as_u16());
    if response.status() != StatusCode::OK {
        service.connection_outcomes.add("refused");
    }
    response
}

/// Authenticates the request from its headers and admits the stream (the server's and
/// the user's stream limits) before its body is read, within `body_within`.
async fn start(
    req: Request<Incoming>,
    service: &Arc<SyncService>,
    deadline: WriteDeadline,
    body_within: Duration,
) -> Result<Response<Body>, ApiError> {
    refuse_unless_serving(service)?;
    let user = authenticate(service, req.headers()).await?;
    let admission = admit(service, &user)?;
    let encoding = negotiate(req.headers().get(header::ACCEPT));
    let coding = Coding::negotiate(req.headers().get(header::ACCEPT_ENCODING));
    let compressor = coding.compressor();
    let body = read_body(req.into_body(), MAX_BODY_BYTES, body_within)
        .await
        .map_err(|e| {
            e.answer().unwrap_or_else(|| {
                sync_error(SyncError::BodyTooLarge {
                    bytes: MAX_BODY_BYTES + 1,
                    max: MAX_BODY_BYTES,
                })
            })
        })?;
    let Opened {
        encoding, chunks, ..
    } = open(
        service,
        user,
        encoding,
        compressor,
        &body,
        admission,
        Some(deadline),
    )?;
    let body = StreamBody::new(futures_util::StreamExt::map(chunks, |chunk| {
        Ok::<_, std::convert::Infallible>(Frame::data(chunk))
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

/// Refuses a new sync connection while the store is not served (not ready) or the
/// operator took the replica out of rotation.
pub(super) fn refuse_unless_serving(service: &SyncService) -> Result<(), ApiError> {
    let status = service.status.snapshot();
    if !status.ready {
        return Err(ApiError::not_ready());
    }
    if !status.in_rotation {
        return Err(ApiError::out_of_rotation());
    }
    Ok(())
}

/// An opened stream.
pub(super) struct Opened<S> {
    /// The lines' encoding (the request's `raw_data` taken into account).
    pub encoding: Encoding,
    /// Its chunks of encoded and compressed lines, each produced when the transport asks
    /// for it; they end when the token expires or the engine stops.
    pub chunks: S,
    /// When the token expires. A transport that stops asking for chunks ends the stream
    /// itself a little after ([`EXPIRY_GRACE`]).
    pub expires_at: Instant,
}

/// How long past the token's expiry a stream whose chunks are not taken is ended by its
/// transport: the stream's own last line (`token_expires_in` 0) goes first to a client
/// that reads.
pub(super) const EXPIRY_GRACE: Duration = Duration::from_secs(2);

/// Opens a sync stream for `user`, admitted with `admission`, with the request `body`,
/// whatever the transport. `deadline`, the connection's, is set while the stream lives.
pub(super) fn open(
    service: &Arc<SyncService>,
    user: auth::AuthenticatedUser,
    encoding: Encoding,
    compressor: Compressor,
    body: &[u8],
    admission: Admission,
    deadline: Option<WriteDeadline>,
) -> Result<Opened<impl futures_util::Stream<Item = Bytes> + Send + 'static>, ApiError> {
    let Admission {
        permit,
        registration,
    } = admission;
    let request = SyncRequest::parse(body).map_err(sync_error)?;
    registration.set_client_id(request.client_id.as_deref());
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
    // Shared with the stream's wakeups entry.
    let key: Arc<str> = record_key(&user.user_id, request.client_id.as_deref()).into();
    let expires_at = Instant::now()
        + user
            .expires_at
            .duration_since(SystemTime::now())
            .unwrap_or_default();
    if let Some(deadline) = &deadline {
        deadline.set(Some((expires_at + EXPIRY_GRACE).into()));
    }
    let log = StreamLog::new(user.user_id.as_str().into(), compressor.name());
    let stream = Stream {
        log,
        deadline,
        generations: service.subscribe(),
        wakeups: served.wakeups.register(key.clone()),
        shutdown: service.shutdown.clone(),
        rotation: service.status.rotation(),
        service: service.clone(),
        served,
        producer: Some(Producer {
            session,
            compressor,
        }),
        encoding,
        key,
        reported: None,
        registration: Some(registration),
        permit: Some(permit),
        expires_at,
        next_keepalive: Instant::now() + jittered(KEEPALIVE),
        due: true,
        closing: None,
    };
    // The stream moves in and out of each chunk's future: one allocation (the body's)
    // holds it, and only the wait's small state while it is idle.
    let chunks = futures_util::stream::unfold(stream, |mut stream| async move {
        let chunk = stream.next_chunk().await?;
        Some((chunk, stream))
    });
    Ok(Opened {
        encoding,
        chunks,
        expires_at,
    })
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
    TokenExpired,
    Shutdown,
    OutOfRotation,
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

/// One open stream: the session and what it waits on, owned by the response body.
struct Stream {
    service: Arc<SyncService>,
    /// The generation the session's rules belong to.
    served: Arc<service::Served>,
    /// The served generation, as it changes.
    generations: watch::Receiver<Arc<service::Served>>,
    /// Wakes the stream for the checkpoints that concern it.
    wakeups: service::Subscription,
    shutdown: watch::Receiver<bool>,
    /// Turns false when the operator takes the replica out of rotation: the stream ends,
    /// and its client reconnects through its load balancer to a replica in rotation.
    rotation: watch::Receiver<bool>,
    /// Taken out while a blocking call works on it, and at the end.
    producer: Option<Producer>,
    encoding: Encoding,
    key: Arc<str>,
    /// The `write_checkpoint` of the last checkpoint-type line.
    reported: Option<u64>,
    /// This stream's entry in `streams()`, and its place among the streams: both are
    /// given back when it ends, before the body's last chunk, so a client that sees the
    /// end and opens another stream at once is not refused for it.
    registration: Option<Registration>,
    permit: Option<OwnedSemaphorePermit>,
    /// When the token expires: no chunk is produced past it but the line saying so.
    expires_at: Instant,
    /// The connection's write deadline, set to a little past `expires_at` while the
    /// stream lives.
    deadline: Option<WriteDeadline>,
    next_keepalive: Instant,
    /// The served checkpoint is announced before the stream waits again: at the start,
    /// after a wakeup or a new generation, and after a keepalive while the first
    /// checkpoint is held.
    due: bool,
    /// How the stream ends once the chunk produced last was taken.
    closing: Option<End>,
    /// What it logs and counts of itself (`stream_log`).
    log: StreamLog,
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(deadline) = &self.deadline {
            deadline.set(None);
        }
        self.log.finish(&self.service);
    }
}

impl Stream {
    /// The response's next chunk; `None` once it ended (the compression's end, if any,
    /// was the last chunk).
    async fn next_chunk(&mut self) -> Option<Bytes> {
        self.log.chunk_asked();
        while self.producer.is_some() {
            match self.produce().await {
                Ok(Some(chunk)) => {
                    self.log.chunk_handed_out();
                    return Some(chunk);
                }
                Ok(None) => {}
                Err(end) => return self.end(end),
            }
        }
        None
    }

    /// One step of the stream: the token's expiry, the next chunk of a download, else the
    /// wait for what comes next (a keepalive, or a checkpoint to announce with the start of
    /// its data). `None` when the step has nothing to send.
    async fn produce(&mut self) -> Result<Option<Bytes>, End> {
        if let Some(end) = self.closing.take() {
            return Err(end);
        }
        if self.expires_at <= Instant::now() {
            // Also right at the start, for a token still accepted thanks to the clock
            // tolerance: the client is told to renew.
            self.closing = Some(End::TokenExpired);
            return self.line(&SyncLine::TokenExpiresIn(0)).map(Some);
        }
        if self
            .producer
            .as_ref()
            .is_some_and(|p| p.session.is_downloading())
        {
            return self.data(Vec::new()).await;
        }
        if !self.due {
            if let Some(keepalive) = self.wait().await? {
                return Ok(Some(keepalive));
            }
        }
        self.due = false;
        let served = self.generations.borrow_and_update().clone();
        if !Arc::ptr_eq(&served, &self.served) {
            self.follow(served);
            if !self.wakeups.is_of(&self.served.wakeups) {
                self.wakeups = self.served.wakeups.register(self.key.clone());
            }
        }
        let checkpoint = *self.served.checkpoints.borrow();
        // Boxed: a checkpoint's reads are the largest state of the stream, and an idle
        // stream keeps only the wait's.
        Box::pin(self.announce(checkpoint)).await
    }

    /// Waits for a checkpoint that concerns the stream (`None`: announce it) or the next
    /// keepalive, which it returns.
    async fn wait(&mut self) -> Result<Option<Bytes>, End> {
        let expires_at = self.expires_at;
        let wake = self
            .next_keepalive
            .min(if Instant::now() + EXPIRY_WARNING < expires_at {
                expires_at - EXPIRY_WARNING
            } else {
                expires_at
            });
        enum Woke {
            Checkpoint,
            Keepalive,
        }
        let woke = tokio::select! {
            () = self.wakeups.woken() => {
                // A generation left behind closes its channel once replaced.
                if self.wakeups.is_closed()
                    && Arc::ptr_eq(&self.generations.borrow(), &self.served)
                {
                    return Err(End::Shutdown);
                }
                Woke::Checkpoint
            }
            changed = self.generations.changed() => match changed {
                Ok(()) => Woke::Checkpoint,
                Err(_) => return Err(End::Shutdown),
            },
            _ = tokio::time::sleep_until(wake.into()) => Woke::Keepalive,
            _ = self.shutdown.wait_for(|s| *s) => return Err(End::Shutdown),
            _ = self.rotation.wait_for(|in_rotation| !*in_rotation) => {
                return Err(End::OutOfRotation)
            }
        };
        if let Woke::Checkpoint = woke {
            return Ok(None);
        }
        let left = expires_at.saturating_duration_since(Instant::now());
        let seconds = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        let seconds = i32::try_from(seconds).unwrap_or(i32::MAX);
        if seconds == 0 {
            self.closing = Some(End::TokenExpired);
        }
        self.next_keepalive = Instant::now() + jittered(KEEPALIVE);
        // A first checkpoint held for the store to catch up with the client is decided
        // again, in case the hold ran out.
        self.due = self
            .producer
            .as_ref()
            .is_some_and(|p| p.session.is_unannounced());
        self.line(&SyncLine::TokenExpiresIn(seconds)).map(Some)
    }

    /// Moves the session to a newly served generation: its next line is a `checkpoint_diff` that
    /// removes the old generation's buckets and adds the new ones (`docs/spec/protocol.md` §7.6),
    /// and the client keeps its data until that checkpoint completes.
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

    /// The line for `checkpoint` (if it concerns this connection) with the first chunk of
    /// its data, and tells the wakeups which later checkpoints concern the stream: those
    /// changing a bucket it announced or its write-checkpoint record, or every one while
    /// its first checkpoint is held or its write checkpoint waits for the LSN to pass.
    async fn announce(&mut self, checkpoint: store::Checkpoint) -> Result<Option<Bytes>, End> {
        // One call per checkpoint that concerns the stream, one read: the write-checkpoint
        // request, then the line.
        let store = self.served.store.clone();
        let key = self.key.clone();
        let reported = self.reported;
        let read_after = self.wakeups.dispatches();
        let started = Instant::now();
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
        let Some(Producer { session, .. }) = &self.producer else {
            return Err(End::Failed("the session is gone".into()));
        };
        self.wakeups.watch(
            session.announced_buckets(),
            pending || session.is_unannounced(),
            read_after,
        );
        let Some(line) = line else { return Ok(None) };
        self.log.checkpoint_started(started);
        self.reported = report;
        if let Some(registration) = &self.registration {
            registration.checkpoint_sent(session.last_op_id().unwrap_or(0), session.bucket_count());
        }
        let mut head = Vec::new();
        line.encode(self.encoding, &mut head);
        // The checkpoint line opens the data's first chunk: one write for a change's
        // checkpoint, data and completion.
        self.data(head).await
    }

    /// The download's next chunk after the encoded lines `opening`: read, encoded and
    /// compressed (off the runtime's threads unless small).
    async fn data(&mut self, opening: Vec<u8>) -> Result<Option<Bytes>, End> {
        let store = self.served.store.clone();
        let encoding = self.encoding;
        let small = self
            .producer
            .as_ref()
            .is_some_and(|p| !p.session.is_downloading() || p.session.download_is_small());
        let reading = Instant::now();
        let (chunk, ops, lines) = self
            .store_work(small, move |producer| {
                producer.chunk(&store, encoding, opening)
            })
            .await?;
        self.log.add_bucket_data_time(reading.elapsed());
        self.service
            .ops_sent
            .fetch_add(ops, std::sync::atomic::Ordering::Relaxed);
        self.count_sent(lines, chunk.len());
        self.log.sent(ops, 0, 0);
        if let Some(p) = self
            .producer
            .as_ref()
            .filter(|p| !p.session.is_downloading())
        {
            self.log
                .checkpoint_complete(p.session.last_op_id().unwrap_or(0));
        }
        Ok((!chunk.is_empty()).then(|| Bytes::from(chunk)))
    }

    /// Runs store work: `small` work (a diff of a few recent ops: microseconds, from
    /// memory) here on the runtime's thread, where a commit that concerns 10,000 streams
    /// costs no thread handoff per stream; other work on a reader thread.
    async fn store_work<R: Send + 'static>(
        &mut self,
        small: bool,
        work: impl FnOnce(&mut Producer) -> Result<R, End> + Send + 'static,
    ) -> Result<R, End> {
        if !small {
            return self.on_reader(work).await;
        }
        let producer = self
            .producer
            .as_mut()
            .ok_or_else(|| End::Failed("the session is gone".into()))?;
        work(producer)
    }

    /// Runs `work` on one of the service's reader threads, in turn with every stream's.
    async fn on_reader<R: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut Producer) -> Result<R, End> + Send + 'static,
    ) -> Result<R, End> {
        let mut producer = self
            .producer
            .take()
            .ok_or_else(|| End::Failed("the session is gone".into()))?;
        let (producer, result) = self
            .service
            .readers
            .run(move || {
                let result = work(&mut producer);
                (producer, result)
            })
            .await
            .map_err(|e| End::Failed(e.to_string()))?;
        self.producer = Some(producer);
        result
    }

    /// `line`, encoded and compressed.
    fn line(&mut self, line: &SyncLine) -> Result<Bytes, End> {
        let producer = self
            .producer
            .as_mut()
            .ok_or_else(|| End::Failed("the session is gone".into()))?;
        let bytes = line.to_bytes(self.encoding);
        let lines = bytes.len();
        let compressed = producer.compress(bytes)?;
        self.count_sent(lines, compressed.len());
        Ok(Bytes::from(compressed))
    }

    /// Ends the stream: its place and registration are given back, and the end of the
    /// response's compression (the gzip member's last block and trailer) is its last
    /// chunk.
    fn end(&mut self, end: End) -> Option<Bytes> {
        self.permit = None;
        self.registration = None;
        self.log.closing(match &end {
            End::TokenExpired | End::OutOfRotation => CloseReason::Service,
            End::Shutdown => CloseReason::Shutdown,
            End::Failed(_) => CloseReason::Error,
        });
        match &end {
            End::Failed(reason) => tracing::warn!(%reason, "a sync stream failed"),
            end => tracing::debug!(reason = ?end, "sync stream ended"),
        }
        let producer = self.producer.take()?;
        let trailer = producer.compressor.finish();
        if trailer.is_empty() {
            return None;
        }
        self.count_sent(0, trailer.len());
        Some(Bytes::from(trailer))
    }

    /// Counts `lines` bytes of sync lines as `sent` bytes (after compression).
    fn count_sent(&mut self, lines: usize, sent: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.log.sent(0, lines, sent);
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
