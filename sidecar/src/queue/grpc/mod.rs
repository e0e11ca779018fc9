//! The gRPC worker API (`sluice.v1.Worker`, proto/sluice/v1/worker.proto): workers in any language open
//! a bidirectional stream, and the sidecar pushes them jobs as their slots free up.
//!
//! Each stream runs the worker engine of [`super::worker`] with a handler that hands jobs to the stream
//! ([`StreamHandler`]): claims, lease renewal, cancellation, fenced batch completion, retries and backoff,
//! lease rescue and shutdown are the engine's, exactly as for the HTTP push worker; this module only
//! carries jobs and outcomes over the stream. On top of the engine's lease renewal, the worker must name
//! each job in a heartbeat at least once per the queue's lease: a job it goes silent about is taken back
//! (its attempt fails and is retried), so a hung worker does not hold jobs for ever.
//!
//! Fencing: a job the stream stopped holding (lease lost to a rescue, deadline passed, heartbeat missed,
//! cancel unanswered, or the stream's shutdown grace over) is announced with `lease_lost`, and an outcome
//! or heartbeat for it is answered with `refused` naming why. An outcome taken is written fenced on
//! (id, owner, attempt) like every other: if the lease was lost after the sidecar's last renewal the
//! write matches no row and the result is discarded (`sluice_jobs_lease_lost_total`).
//!
//! Callers: with an [`Authenticator`] (`queue.api.auth.mode: kubernetes`), a `Work` stream is let in as
//! the queue HTTP API lets in a request ([`super::auth`]): the token in the `authorization` metadata
//! (`Bearer <token>`, audience `sluice`) is checked by TokenReview, else a tokenless caller from loopback
//! to a loopback listener is the pod's own ServiceAccount unless `loopback: token` (host-network pods);
//! refused: `UNAUTHENTICATED`. Once `subscribe` names its queues, the caller needs `update` on
//! `jobqueues/jobs` of each queue's JobQueue (a SubjectAccessReview; refused: `PERMISSION_DENIED`
//! naming user, verb and JobQueue), except the worker pod itself, which the operator made the
//! JobQueue's worker: a tokenless loopback caller, or one whose token is bound to this pod
//! (`SLUICE_POD_NAME`), may take the jobs of the queues this sidecar serves. The caller is authenticated
//! once, when the stream opens (as the Kubernetes API server does for a long watch): a projected token
//! the kubelet rotates while the stream is open does not end it. Every
//! [`Authenticator::recheck_every`] an open stream's user, as authenticated at the start, is authorized
//! again on each queue (a SubjectAccessReview unless cached; the worker pod itself is not checked again:
//! its identity cannot change, and its deletion stops the sidecar); once refused, the stream takes no
//! more jobs (`draining`), the jobs in hand may still finish within the shutdown grace, and the stream
//! ends with the refusal's code. Re-checks run alongside the stream's other work (heartbeats and
//! outcomes are read meanwhile). An API server that cannot be asked is `UNAVAILABLE` at the start; at a
//! re-check it is let pass until [`MAX_UNAVAILABLE_RECHECKS`] re-checks in a row could not be answered,
//! then the stream is drained and ended `UNAVAILABLE` like a refused one.
//!
//! Stream slots: a stream takes one of [`GrpcOptions::max_streams`] only once `subscribe` was read and
//! the caller authorized on its queues (else `RESOURCE_EXHAUSTED`). Until then it is *pending*
//! ([`Admission`]): the TokenReview, reading `subscribe` and the SubjectAccessReviews must all be done
//! within [`ADMISSION_TIMEOUT`] of the stream's start, else `DEADLINE_EXCEEDED` naming what was slow
//! (starting the engine of a stream let in, which reads its queues' settings, comes after and is not
//! under it); at most `max_streams` streams wait at once, and at most [`MAX_PENDING_PER_CALLER`] of
//! one checked caller (refused: `UNAVAILABLE` naming the cap, for the caller to try again), so that a
//! caller with no right on the queues cannot keep the workers out by opening streams it never subscribes
//! on, or that are refused. The worker pod itself is not counted: it needs no review, and others'
//! waiting streams must not keep it out: a stream takes room to wait only once its caller is known
//! (`Admitter::admit`).
//!
//! Each stream's engine claims at most `min(slots, claim_batch)` jobs per query, and so holds at most
//! that many claimed ahead of its slots (`stream_engine`): a one-slot stream does not lease a
//! sidecar's claim batch of jobs it will run one at a time.
//!
//! Metrics: `sluice_grpc_streams_pending` (streams opened and not yet let in or refused) and
//! `sluice_grpc_streams_refused_total{reason}` (`RefuseReason`), listed only by a sidecar serving this
//! API ([`QueueMetrics::with_grpc_streams`]).
//!
//! Also served, to anyone: `grpc.health.v1.Health` (`sluice.v1.Worker` and `""` are `SERVING` until
//! shutdown) and server reflection (v1). Plaintext HTTP/2, meant for loopback or the pod network, like
//! the queue HTTP API.
//!
//! Layout: `admission` lets a stream in or refuses it (who is calling, `subscribe`, whether the caller
//! may take the jobs, the room to wait, the stream slot; why a stream was refused), and knows nothing
//! of what follows; this module serves the streams let in ([`GrpcWorker`]: each stream's engine, its
//! session and the worker's messages).

use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use chrono::Utc;
use futures::{StreamExt as _, future::OptionFuture};
use tokio::sync::{Notify, OwnedSemaphorePermit, mpsc, oneshot};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use uuid::Uuid;

use sluice_queue::{ClaimedJob, QueueSettings, QueueStore};

use super::{
    auth::{Authenticator, Refusal},
    metrics::QueueMetrics,
    worker::{CANCEL_GRACE, Handler, Outcome, Worker, WorkerOptions, default_owner},
};
use crate::error::Result;

mod admission;

pub use admission::{
    ADMISSION_TIMEOUT, Admission, MAX_KINDS, MAX_PENDING_PER_CALLER, MAX_SLOTS, WORK_VERB, refusal_status,
};
use admission::{Admitted, Admitter, Admitting, Guard, RefuseReason, Refused};

/// The code generated from proto/sluice/v1/worker.proto by proto/update.sh (checked in; no protoc at
/// build time).
#[allow(missing_docs, clippy::all)]
pub mod proto {
    include!("generated/sluice.v1.rs");

    /// The encoded `FileDescriptorSet` of the `sluice.v1` package, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!("generated/sluice.v1.bin");
}

use proto::{
    JobRef, SidecarMessage, WorkerMessage, outcome,
    sidecar_message::Msg as Out,
    worker_message::Msg as In,
    worker_server::{Worker as WorkerService, WorkerServer},
};

/// Connections of the database pool each stream's engine uses (claims, completions, heartbeats,
/// maintenance); its LISTEN connection is one more, made with the pool's settings.
pub const STREAM_POOL_SIZE: u32 = 4;
/// Longest wait for room on a stream the worker does not read before the stream is ended.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a finished stream's last messages (an error saying why it ended) wait to be read.
const FINAL_MESSAGES_GRACE: Duration = Duration::from_secs(5);
/// Longest wait for room on a full stream for the status that ends it.
const FINAL_STATUS_TIMEOUT: Duration = Duration::from_secs(1);
/// Most characters of a worker's error kept as the job's `last_error` (as for the HTTP handler).
const ERROR_LIMIT: usize = 2048;
/// Ended jobs whose reason a stream remembers, to say why a late outcome is refused.
const ENDED_MEMORY: usize = 4096;
/// Longest retry delay a worker may ask for.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(366 * 86_400);

/// How the gRPC worker API runs.
#[derive(Clone, Debug)]
pub struct GrpcOptions {
    /// Each stream's engine connects here (a pool of [`STREAM_POOL_SIZE`] per stream).
    pub database_url: String,
    /// Queues the sidecar serves; a stream takes all of them or a subset.
    pub queues: Vec<String>,
    /// The namespace a `subscribe.queues` name without one is in (`emails` is `<namespace>/emails`).
    pub namespace: Option<String>,
    /// The engine's options for each stream (`queues`, `concurrency` and `owner` are set per stream).
    pub engine: WorkerOptions,
    /// Most streams at once.
    pub max_streams: u32,
    /// Largest message either way, bytes.
    pub max_message_bytes: usize,
    /// Checks callers (`queue.api.auth.mode: kubernetes`); `None`: anyone who reaches the listener may
    /// take jobs.
    pub auth: Option<Arc<Authenticator>>,
    /// The worker pod's name (`SLUICE_POD_NAME`): a caller whose token is bound to this pod is the pod
    /// itself. `None`: only a tokenless loopback caller is.
    pub pod_name: Option<String>,
}

/// The engine options of a stream subscribed with `slots` to `queues` (and `kinds`): the sidecar's
/// `engine`, with the stream's slots as its concurrency, one claim loop, an owner of its own, and claims
/// of at most `min(slots, claim_batch)` jobs. The engine claims ahead of its free slots up to one claim
/// batch (`Ahead::reserve` in [`super::worker`]); with the sidecar's batch (100 by default) a one-slot
/// stream would lease up to 100 jobs it runs one at a time, jobs other streams and pods could be
/// running. Capped, a stream holds at most `slots` jobs claimed ahead, `2 × slots` unanswered in all.
fn stream_engine(
    engine: &WorkerOptions,
    queues: Vec<String>,
    kinds: Vec<String>,
    slots: u32,
) -> WorkerOptions {
    WorkerOptions {
        queues,
        concurrency: slots as usize,
        claim_batch: engine.claim_batch.min(slots).max(1),
        claimers: 1,
        owner: default_owner(),
        kinds,
        ..engine.clone()
    }
}

/// Consecutive re-checks the API server could not answer before an open stream is drained and ended
/// `UNAVAILABLE` (about 30 s at the default [`Authenticator::recheck_every`]): a caller whose right
/// was revoked must not keep its stream by an outage.
pub const MAX_UNAVAILABLE_RECHECKS: u32 = 3;

struct Inner {
    opts: GrpcOptions,
    /// Lets new streams in, and holds the stream slots.
    admitter: Admitter,
    metrics: Arc<QueueMetrics>,
    shutdown: CancellationToken,
}

/// The `sluice.v1.Worker` service.
#[derive(Clone)]
pub struct GrpcWorker {
    inner: Arc<Inner>,
}

impl GrpcWorker {
    /// A service whose streams stop (drain, then end) when `shutdown` fires, served by a listener bound
    /// to `bound`, letting streams in by the default [`Admission`]. `metrics` lists the streams'
    /// admission only if made by [`QueueMetrics::with_grpc_streams`].
    pub fn new(
        opts: GrpcOptions,
        bound: Option<SocketAddr>,
        metrics: Arc<QueueMetrics>,
        shutdown: CancellationToken,
    ) -> Self {
        Self::with_admission(opts, Admission::default(), bound, metrics, shutdown)
    }

    /// [`GrpcWorker::new`], letting streams in by `admission`.
    pub fn with_admission(
        opts: GrpcOptions,
        admission: Admission,
        bound: Option<SocketAddr>,
        metrics: Arc<QueueMetrics>,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                admitter: Admitter::new(&opts, admission, bound),
                opts,
                metrics,
                shutdown,
            }),
        }
    }

    /// The tonic service, with the message size limits applied.
    pub fn into_server(self) -> WorkerServer<Self> {
        let max = self.inner.opts.max_message_bytes;
        WorkerServer::new(self)
            .max_decoding_message_size(max)
            .max_encoding_message_size(max)
    }
}

/// Serves `sluice.v1.Worker`, health and reflection on `listener` until `shutdown`; returns once the
/// streams have drained. `metrics` lists the streams' admission only if made by
/// [`QueueMetrics::with_grpc_streams`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    opts: GrpcOptions,
    metrics: Arc<QueueMetrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    serve_with_admission(listener, opts, Admission::default(), metrics, shutdown).await
}

/// [`serve`], letting streams in by `admission`.
pub async fn serve_with_admission(
    listener: tokio::net::TcpListener,
    opts: GrpcOptions,
    admission: Admission,
    metrics: Arc<QueueMetrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    let max_streams = opts.max_streams;
    let addr: Option<SocketAddr> = listener.local_addr().ok();
    let service = GrpcWorker::with_admission(opts, admission, addr, metrics, shutdown.clone());
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<WorkerServer<GrpcWorker>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| crate::Error::Config(format!("gRPC reflection: {e}")))?;
    tracing::info!(?addr, "gRPC worker API serving");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let stop = shutdown.clone();
    let health_stop = health.clone();
    let signal = async move {
        stop.cancelled().await;
        health_stop.set_not_serving::<WorkerServer<GrpcWorker>>().await;
    };
    tonic::transport::Server::builder()
        // A worker that vanished without closing its connection (a partition, a frozen node) is noticed
        // by the keepalive, which ends its stream: its jobs are retried.
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(max_streams.saturating_add(4))
        .tcp_nodelay(true)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(service.into_server())
        .serve_with_incoming_shutdown(incoming, signal)
        .await
        .map_err(|e| crate::Error::Io(std::io::Error::other(format!("gRPC server: {e}"))))?;
    Ok(())
}

type Outbound = mpsc::Sender<std::result::Result<SidecarMessage, Status>>;

/// A job pushed to the worker and not yet answered.
struct Held {
    attempt: i32,
    outcome: oneshot::Sender<Outcome>,
    beat: Arc<Notify>,
}

/// Why recently ended jobs are no longer held, by (id, attempt), and the order to forget them in.
type Ended = (HashMap<(Uuid, i32), String>, VecDeque<(Uuid, i32)>);

/// One worker stream.
struct Session {
    tx: Outbound,
    held: Mutex<HashMap<Uuid, Held>>,
    /// Why recently ended jobs are no longer held, by (id, attempt).
    ended: Mutex<Ended>,
    /// The worker's side of the stream is gone (closed, broken or refused).
    gone: CancellationToken,
    /// Draining: no more jobs come; a job taken back now is handed back.
    draining: AtomicBool,
    leases: HashMap<String, Duration>,
    job_timeout: Duration,
    max_message_bytes: usize,
}

impl Session {
    fn send(&self, msg: Out) {
        // Informational messages must not wait behind a full stream (callers hold no lock, but a
        // worker that stopped reading would stall them); they are sent from a task of their own.
        // Such a task ends with the stream, so that a worker that never reads cannot keep it alive.
        let (tx, gone) = (self.tx.clone(), self.gone.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = tx.send(Ok(SidecarMessage { msg: Some(msg) })) => {}
                () = gone.cancelled() => {}
            }
        });
    }

    fn remember(&self, id: Uuid, attempt: i32, reason: String) {
        let mut ended = self.ended.lock().expect("ended lock");
        let (map, order) = &mut *ended;
        if map.insert((id, attempt), reason).is_none() {
            order.push_back((id, attempt));
        }
        while order.len() > ENDED_MEMORY {
            if let Some(k) = order.pop_front() {
                map.remove(&k);
            }
        }
    }

    fn why_not_held(&self, id: Uuid, attempt: i32) -> String {
        let ended = self.ended.lock().expect("ended lock");
        match ended.0.get(&(id, attempt)) {
            Some(reason) => reason.clone(),
            None => format!("job {id} attempt {attempt} is not held by this stream"),
        }
    }

    /// Takes the worker's outcome for a held job; false when the job is not held.
    fn deliver(&self, id: Uuid, attempt: i32, outcome: Outcome) -> bool {
        let mut held = self.held.lock().expect("held lock");
        match held.get(&id) {
            Some(h) if h.attempt == attempt => {
                let h = held.remove(&id).expect("present");
                self.remember(
                    id,
                    attempt,
                    format!("job {id} attempt {attempt} already has an outcome"),
                );
                let _ = h.outcome.send(outcome);
                true
            }
            _ => false,
        }
    }

    fn beat(&self, id: Uuid, attempt: i32) -> bool {
        let held = self.held.lock().expect("held lock");
        match held.get(&id) {
            Some(h) if h.attempt == attempt => {
                h.beat.notify_one();
                true
            }
            _ => false,
        }
    }
}

/// Hands each job to the stream and waits for the worker's outcome.
pub struct StreamHandler {
    session: Arc<Session>,
}

/// Takes a job back when its handler future ends without the worker's outcome (returned or dropped by
/// the engine), and tells the worker.
struct Release<'a> {
    session: &'a Session,
    id: Uuid,
    attempt: i32,
    reason: Option<String>,
    deadline: tokio::time::Instant,
    cancelled_at: Option<tokio::time::Instant>,
}

impl Release<'_> {
    fn default_reason(&self) -> String {
        let now = tokio::time::Instant::now();
        if self.session.draining.load(Ordering::SeqCst) {
            "handed back: the stream is draining and its grace period is over".into()
        } else if now >= self.deadline {
            "its deadline passed: the attempt failed and will be retried".into()
        } else if self.cancelled_at.is_some_and(|t| now >= t + CANCEL_GRACE) {
            format!("cancelled: no outcome within {CANCEL_GRACE:?} of the cancel")
        } else {
            "lease lost: the job's lease expired and another worker may hold it now".into()
        }
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let removed = {
            let mut held = self.session.held.lock().expect("held lock");
            match held.get(&self.id) {
                Some(h) if h.attempt == self.attempt => held.remove(&self.id).is_some(),
                _ => false,
            }
        };
        if !removed {
            return; // the worker's outcome was taken
        }
        let reason = self.reason.take().unwrap_or_else(|| self.default_reason());
        let (id, attempt) = (self.id, self.attempt);
        self.session
            .remember(id, attempt, format!("job {id} attempt {attempt}: {reason}"));
        if !self.session.gone.is_cancelled() {
            self.session.send(Out::LeaseLost(proto::LeaseLost {
                job_id: id.to_string(),
                attempt,
                reason,
            }));
        }
    }
}

impl Handler for StreamHandler {
    async fn handle(&self, job: ClaimedJob, cancel: CancellationToken) -> Outcome {
        let s = &*self.session;
        let (id, attempt) = (job.id, job.attempt);
        let payload_json = match serde_json::to_string(&job.payload) {
            Ok(p) => p,
            Err(e) => return Outcome::Permanent(format!("payload is not serialisable: {e}")),
        };
        // The message carries the payload plus a few hundred bytes of fields.
        let size = payload_json.len() + job.queue.len() + job.kind.len() + 256;
        if size > s.max_message_bytes {
            return Outcome::Permanent(format!(
                "the job's message ({size} bytes) exceeds the gRPC worker API's largest message ({} bytes)",
                s.max_message_bytes
            ));
        }
        let lease = s
            .leases
            .get(&job.queue)
            .copied()
            .unwrap_or_else(|| QueueSettings::defaults(&job.queue).lease());
        let now = tokio::time::Instant::now();
        let deadline_unix_ms = Utc::now().timestamp_millis() + s.job_timeout.as_millis() as i64;
        let (otx, mut orx) = oneshot::channel();
        let beat = Arc::new(Notify::new());
        s.held.lock().expect("held lock").insert(
            id,
            Held {
                attempt,
                outcome: otx,
                beat: beat.clone(),
            },
        );
        let mut release = Release {
            session: s,
            id,
            attempt,
            reason: None,
            deadline: now + s.job_timeout,
            cancelled_at: None,
        };
        let msg = SidecarMessage {
            msg: Some(Out::Job(proto::Job {
                job_id: id.to_string(),
                queue: job.queue,
                kind: job.kind,
                payload_json,
                attempt,
                max_attempts: job.max_attempts,
                deadline_unix_ms,
                heartbeat_within_ms: lease.as_millis() as i64,
            })),
        };
        tokio::select! {
            r = tokio::time::timeout(SEND_TIMEOUT, s.tx.send(Ok(msg))) => match r {
                Ok(Ok(())) => {}
                Ok(Err(_)) => {
                    release.reason = Some("the stream ended before the job was sent".into());
                    return Outcome::Retry("the gRPC worker's stream ended before the job was sent".into());
                }
                Err(_) => {
                    // The worker has not read its stream for that long: it loses the stream.
                    s.gone.cancel();
                    release.reason = Some(format!("the worker has not read its stream for {SEND_TIMEOUT:?}"));
                    return Outcome::Retry(format!("the gRPC worker has not read its stream for {SEND_TIMEOUT:?}"));
                }
            },
            _ = s.gone.cancelled() => {
                release.reason = Some("the stream ended before the job was sent".into());
                return Outcome::Retry("the gRPC worker's stream ended before the job was sent".into());
            }
        }
        let mut beat_deadline = tokio::time::Instant::now() + lease;
        loop {
            // An outcome the worker sent wins over a deadline or the stream's end in the same poll: it
            // was taken from the jobs held (so never refused) and must not be dropped in favour of a
            // retry.
            tokio::select! {
                biased;
                o = &mut orx => {
                    return match o {
                        Ok(o) => o,
                        Err(_) => Outcome::Retry("the gRPC worker's outcome was lost".into()),
                    };
                }
                _ = beat.notified() => beat_deadline = tokio::time::Instant::now() + lease,
                _ = tokio::time::sleep_until(beat_deadline) => {
                    if let Ok(o) = orx.try_recv() {
                        return o;
                    }
                    release.reason = Some(format!("no heartbeat within the lease ({lease:?}): the attempt failed and will be retried"));
                    return Outcome::Retry(format!("the gRPC worker sent no heartbeat for the job within its lease ({lease:?})"));
                }
                _ = cancel.cancelled(), if release.cancelled_at.is_none() => {
                    release.cancelled_at = Some(tokio::time::Instant::now());
                    s.send(Out::Cancel(proto::Cancel { job_id: id.to_string(), attempt }));
                }
                _ = s.gone.cancelled() => {
                    if let Ok(o) = orx.try_recv() {
                        return o;
                    }
                    release.reason = Some("the stream ended before its outcome".into());
                    return Outcome::Retry("the gRPC worker's stream ended before it sent an outcome".into());
                }
            }
        }
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > ERROR_LIMIT {
        let mut end = ERROR_LIMIT;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The engine's outcome for a worker's `outcome` message; Err names what is wrong with it.
fn outcome_of(result: Option<outcome::Result>) -> std::result::Result<Outcome, &'static str> {
    Ok(match result.ok_or("outcome without a result")? {
        outcome::Result::Succeeded(_) => Outcome::Succeeded,
        outcome::Result::Retry(r) => match r.delay_ms {
            Some(ms) => {
                Outcome::RetryAfter(Duration::from_millis(ms).min(MAX_RETRY_DELAY), truncate(r.error))
            }
            None => Outcome::Retry(truncate(r.error)),
        },
        outcome::Result::Fail(f) => Outcome::Permanent(truncate(f.error)),
        outcome::Result::Cancelled(_) => Outcome::Cancelled,
    })
}

type WorkStream = Pin<Box<dyn Stream<Item = std::result::Result<SidecarMessage, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerService for GrpcWorker {
    type WorkStream = WorkStream;

    async fn work(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> std::result::Result<Response<WorkStream>, Status> {
        let admitting = Admitting::start(&self.inner.metrics);
        let admitted = match self.inner.admitter.admit(request).await {
            Ok(a) => a,
            Err(refused) => {
                tracing::debug!(reason = refused.reason.as_str(), status = %refused.status, "gRPC worker stream refused");
                admitting.settle(Some(refused.reason));
                return Err(refused.status);
            }
        };
        // Let in: no longer pending, whatever starting its engine then meets. A failure there (the
        // queue database) is still counted by its reason, after the stream was let in.
        admitting.settle(None);
        self.start(admitted).await.map_err(|refused| {
            tracing::debug!(reason = refused.reason.as_str(), status = %refused.status, "gRPC worker stream could not start");
            self.inner.metrics.grpc_refused(refused.reason.as_str());
            refused.status
        })
    }
}

impl GrpcWorker {
    /// Starts the engine of a stream let in, and answers `subscribed`.
    async fn start(&self, admitted: Admitted) -> std::result::Result<Response<WorkStream>, Refused> {
        let Admitted {
            inbound,
            sub,
            queues,
            kinds,
            caller: caller_name,
            guard,
            permit,
        } = admitted;
        let opts = &self.inner.opts;
        let pool = sluice_queue::pool::connect_lazy(&opts.database_url, STREAM_POOL_SIZE).map_err(|e| {
            Refused::new(
                RefuseReason::Database,
                Status::internal(format!("database pool: {e}")),
            )
        })?;
        let store = QueueStore::new(pool).with_answer_deadline(opts.engine.answer_deadline);
        let mut leases = HashMap::new();
        for q in &queues {
            let lease = match store.queue(q).await {
                Ok(Some(s)) => s.lease(),
                Ok(None) => QueueSettings::defaults(q).lease(),
                Err(e) => {
                    tracing::warn!(error = %e, "gRPC worker stream: reading queue settings failed");
                    return Err(Refused::new(
                        RefuseReason::Database,
                        Status::unavailable("the queue database is unavailable"),
                    ));
                }
            };
            leases.insert(q.clone(), lease);
        }
        let engine_opts = stream_engine(&opts.engine, queues.clone(), kinds.clone(), sub.slots);
        let (tx, rx) = mpsc::channel(2 * sub.slots as usize + 16);
        let session = Arc::new(Session {
            tx: tx.clone(),
            held: Mutex::new(HashMap::new()),
            ended: Mutex::new((HashMap::new(), VecDeque::new())),
            gone: CancellationToken::new(),
            draining: AtomicBool::new(false),
            leases,
            job_timeout: engine_opts.job_timeout,
            max_message_bytes: opts.max_message_bytes,
        });
        let _ = tx
            .send(Ok(SidecarMessage {
                msg: Some(Out::Subscribed(proto::Subscribed {
                    owner: engine_opts.owner.clone(),
                    queues,
                    slots: sub.slots,
                    kinds,
                })),
            }))
            .await;
        tracing::info!(owner = %engine_opts.owner, worker = %sub.worker_name, slots = sub.slots, queues = ?engine_opts.queues, caller = caller_name.as_deref().unwrap_or("unchecked"), "gRPC worker subscribed");
        let engine = Worker::new(
            store,
            StreamHandler {
                session: session.clone(),
            },
            engine_opts,
        )
        .with_metrics(self.inner.metrics.clone());
        let gone = session.gone.clone();
        tokio::spawn(run_session(
            session,
            inbound,
            engine,
            self.inner.shutdown.clone(),
            guard,
            permit,
        ));
        drop(tx);
        // The reply stream ends shortly after the session does, read or not: a worker that stopped
        // reading cannot keep what is queued for it in memory by keeping its connection open.
        let ended = async move {
            gone.cancelled().await;
            tokio::time::sleep(FINAL_MESSAGES_GRACE).await;
        };
        Ok(Response::new(Box::pin(ReceiverStream::new(rx).take_until(ended))))
    }
}

/// Runs one stream: the engine, and the worker's messages, until both are done; with a `guard`, checks
/// the caller again every [`Authenticator::recheck_every`], draining the stream and ending it with the
/// refusal once refused.
async fn run_session(
    session: Arc<Session>,
    mut inbound: Streaming<WorkerMessage>,
    engine: Worker<StreamHandler>,
    shutdown: CancellationToken,
    guard: Option<Guard>,
    _permit: OwnedSemaphorePermit,
) {
    let stop = CancellationToken::new();
    let mut engine = tokio::spawn(engine.run(stop.clone()));
    let drain = |session: &Session, stop: &CancellationToken| {
        if !session.draining.swap(true, Ordering::SeqCst) {
            session.send(Out::Draining(proto::Draining {}));
        }
        stop.cancel();
    };
    let mut reading = true;
    let every = guard
        .as_ref()
        .map_or(Duration::from_secs(3600), |g| g.auth.recheck_every());
    let mut rechecks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    rechecks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut refused: Option<Status> = None;
    // The re-check under way, polled with the stream's other work: reviews can wait for a slot and for
    // the API server, and the worker's heartbeats and outcomes must be read meanwhile.
    let mut check: Option<futures::future::BoxFuture<'_, std::result::Result<(), Refusal>>> = None;
    let mut unavailable = 0u32;
    loop {
        tokio::select! {
            r = &mut engine => {
                if let Ok(Err(e)) = r {
                    tracing::warn!(error = %e, "gRPC worker stream: the engine stopped");
                }
                break;
            }
            _ = shutdown.cancelled(), if !stop.is_cancelled() => drain(&session, &stop),
            _ = rechecks.tick(), if guard.is_some() && refused.is_none() && check.is_none() => {
                check = guard.as_ref().map(|g| Box::pin(g.recheck()) as _);
            }
            Some(r) = OptionFuture::from(check.as_mut()), if check.is_some() => {
                check = None;
                match r {
                    Ok(()) => unavailable = 0,
                    Err(Refusal::Unavailable(why)) => {
                        unavailable += 1;
                        tracing::debug!(reason = %why, unavailable, "gRPC worker stream not rechecked");
                        if unavailable >= MAX_UNAVAILABLE_RECHECKS {
                            tracing::info!(reason = %why, "gRPC worker stream not rechecked {unavailable} times in a row: draining it");
                            refused = Some(Status::unavailable(format!(
                                "the caller could not be authorized again {unavailable} times in a row: {why}"
                            )));
                            drain(&session, &stop);
                        }
                    }
                    Err(refusal) => {
                        tracing::info!(reason = refusal.message(), "gRPC worker stream refused at a re-check: draining it");
                        refused = Some(refusal_status(refusal));
                        drain(&session, &stop);
                    }
                }
            }
            m = inbound.message(), if reading => match m {
                Ok(Some(m)) => {
                    if let Err(status) = on_message(&session, m, &stop, &drain).await {
                        end_with(&session, status).await;
                        reading = false;
                        session.gone.cancel();
                        stop.cancel();
                    }
                }
                Ok(None) | Err(_) => {
                    // The worker closed its side or the stream broke (or sent what could not be
                    // decoded, which it is told): no outcome can come any more.
                    if let Err(status) = m {
                        end_with(&session, status).await;
                    }
                    reading = false;
                    session.gone.cancel();
                    stop.cancel();
                }
            },
        }
    }
    if let Some(status) = refused {
        end_with(&session, status).await;
    }
    session.gone.cancel();
}

/// Queues the status the stream ends with, waiting a little for room (a worker slow to read still learns
/// why its stream ended).
async fn end_with(session: &Session, status: Status) {
    let _ = tokio::time::timeout(FINAL_STATUS_TIMEOUT, session.tx.send(Err(status))).await;
}

async fn on_message(
    s: &Session,
    m: WorkerMessage,
    stop: &CancellationToken,
    drain: &impl Fn(&Session, &CancellationToken),
) -> std::result::Result<(), Status> {
    let mut refused = Vec::new();
    let mut refuse = |job_id: String, attempt: i32, reason: String| {
        refused.push(proto::Refused {
            job_id,
            attempt,
            reason,
        })
    };
    match m.msg {
        None => return Err(Status::invalid_argument("a message without content")),
        Some(In::Subscribe(_)) => return Err(Status::invalid_argument("subscribe was sent twice")),
        Some(In::Drain(_)) => drain(s, stop),
        Some(In::Heartbeat(h)) => {
            for JobRef { job_id, attempt } in h.jobs {
                match Uuid::parse_str(&job_id) {
                    Ok(id) if s.beat(id, attempt) => {}
                    Ok(id) => refuse(job_id, attempt, s.why_not_held(id, attempt)),
                    Err(_) => refuse(job_id, attempt, "job_id is not a UUID".into()),
                }
            }
        }
        Some(In::Outcome(o)) => {
            let Ok(id) = Uuid::parse_str(&o.job_id) else {
                refuse(o.job_id, o.attempt, "job_id is not a UUID".into());
                return Ok(());
            };
            match outcome_of(o.result) {
                Err(why) => refuse(o.job_id, o.attempt, why.into()),
                Ok(outcome) => {
                    if !s.deliver(id, o.attempt, outcome) {
                        refuse(o.job_id, o.attempt, s.why_not_held(id, o.attempt));
                    }
                }
            }
        }
    }
    // Refusals wait for room on the stream: a worker that keeps sending without reading is read no
    // further, and one that stops reading altogether loses its stream.
    for r in refused {
        let msg = SidecarMessage {
            msg: Some(Out::Refused(r)),
        };
        match tokio::time::timeout(SEND_TIMEOUT, s.tx.send(Ok(msg))).await {
            Ok(_) => {}
            Err(_) => {
                return Err(Status::resource_exhausted(format!(
                    "the worker has not read its stream for {SEND_TIMEOUT:?}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(claim_batch: u32) -> WorkerOptions {
        WorkerOptions {
            claim_batch,
            ..WorkerOptions::new(["q"])
        }
    }

    #[test]
    fn a_stream_claims_at_most_its_slots_at_once_and_at_most_the_sidecars_claim_batch() {
        let sidecar = engine(16);
        let claims = |slots| stream_engine(&sidecar, vec!["q".into()], vec![], slots).claim_batch;
        assert_eq!(claims(1), 1);
        assert_eq!(claims(8), 8);
        assert_eq!(claims(16), 16);
        assert_eq!(claims(64), 16);
        let one = stream_engine(&sidecar, vec!["q".into()], vec!["k".into()], 1);
        assert_eq!((one.concurrency, one.claimers), (1, 1));
        assert_eq!(one.kinds, ["k"]);
    }
}
