//! The gRPC worker API with callers checked (`queue.api.auth.mode: kubernetes`), over real gRPC and a
//! real PostgreSQL, with a stand-in for the API server's reviews: who is refused with
//! `UNAUTHENTICATED`, `PERMISSION_DENIED` or `UNAVAILABLE` and with which message, who takes jobs
//! (a token with the right, the worker pod itself by its bound token or tokenless on loopback), that
//! health stays open, and that an open stream whose caller is refused at a re-check takes no more jobs
//! and ends with the refusal; and that a caller with no right on the queues, by opening streams it never
//! subscribes on or that are refused, cannot keep authorized workers out (a stream takes a slot only
//! once authorized; until then it is pending, at most two of one caller); that an API server that
//! never answers cannot hold a stream past the admission deadline, that on a listener of every address
//! the worker pod's own stream is let in while others fill the room to wait, and that the pending gauge
//! and refusal counters move (a worker that goes away while its stream waits, in a review or before
//! `subscribe`, is counted `gone`). The reviews themselves against a real kube-apiserver, with the Python
//! example sending its projected token, are in the e2e scenario `grpc_queue`.

mod queue_support;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst},
    },
    time::{Duration, Instant},
};

use futures::future::BoxFuture;
use queue_support::*;
use sluice_crds::sidecar_config::LoopbackCallers;
use sluice_sidecar::queue::{
    NewJob, QueueStore, WorkerOptions,
    auth::{
        ALLOW_TTL, Access, Authenticator, Decision, POD_NAME_EXTRA, Reviews, TokenAnswer, Unavailable, User,
    },
    grpc::{
        self, ADMISSION_TIMEOUT, Admission, GrpcOptions, MAX_PENDING_PER_CALLER,
        proto::{
            self, SidecarMessage, WorkerMessage, outcome, sidecar_message::Msg as Out,
            worker_client::WorkerClient, worker_message::Msg as In,
        },
    },
    metrics::QueueMetrics,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, Streaming, transport::Channel};

const DEADLINE: Duration = Duration::from_secs(15);
/// The worker pod the sidecar runs in.
const POD: &str = "emails-worker-7d9f-abcde";

/// Token `t-<sa>` is ServiceAccount `<sa>` of `shop`, `t-<sa>@<pod>` the same bound to pod `<pod>`,
/// while `tokens_valid`; `unreachable` cannot be checked. `(sa, verb, subresource, queue)` in `grants`
/// is allowed unless `revoked`; every access asked is kept in `asked`, and every token review counted in
/// `tokens_asked`.
struct Rbac {
    grants: BTreeSet<(String, String, String, String)>,
    tokens_valid: AtomicBool,
    revoked: AtomicBool,
    /// SubjectAccessReviews cannot be asked.
    down: AtomicBool,
    /// TokenReviews, and SubjectAccessReviews, are never answered (an API server that hangs).
    tokens_hang: AtomicBool,
    access_hangs: AtomicBool,
    asked: Mutex<Vec<String>>,
    tokens_asked: AtomicUsize,
    /// SubjectAccessReviews begun (answered or not).
    accesses_begun: AtomicUsize,
}

impl Rbac {
    fn new(grants: &[(&str, &str, &str, &str)]) -> Arc<Self> {
        Arc::new(Self {
            grants: grants
                .iter()
                .map(|(a, b, c, d)| ((*a).into(), (*b).into(), (*c).into(), (*d).into()))
                .collect(),
            tokens_valid: true.into(),
            revoked: false.into(),
            down: false.into(),
            tokens_hang: false.into(),
            access_hangs: false.into(),
            asked: Mutex::default(),
            tokens_asked: AtomicUsize::new(0),
            accesses_begun: AtomicUsize::new(0),
        })
    }
}

impl Reviews for Rbac {
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<TokenAnswer, Unavailable>> {
        Box::pin(async move {
            self.tokens_asked.fetch_add(1, SeqCst);
            if self.tokens_hang.load(SeqCst) {
                futures::future::pending::<()>().await;
            }
            if token == "unreachable" {
                return Err(Unavailable(
                    "connecting to the API server: connection refused".into(),
                ));
            }
            let Some(rest) = token.strip_prefix("t-") else {
                return Ok(TokenAnswer::Invalid("invalid bearer token".into()));
            };
            if !self.tokens_valid.load(SeqCst) {
                return Ok(TokenAnswer::Invalid("token has expired".into()));
            }
            let (sa, pod) = rest.split_once('@').map_or((rest, None), |(s, p)| (s, Some(p)));
            let mut user = User::service_account("shop", sa);
            user.uid = format!("uid-{sa}");
            if let Some(pod) = pod {
                user.extra.insert(POD_NAME_EXTRA.into(), vec![pod.into()]);
            }
            Ok(TokenAnswer::Valid(user))
        })
    }
    fn review_access<'a>(
        &'a self,
        user: &'a User,
        namespace: &'a str,
        access: &'a Access,
    ) -> BoxFuture<'a, Result<Decision, Unavailable>> {
        Box::pin(async move {
            assert_eq!(namespace, "shop");
            self.accesses_begun.fetch_add(1, SeqCst);
            if self.access_hangs.load(SeqCst) {
                futures::future::pending::<()>().await;
            }
            if self.down.load(SeqCst) {
                return Err(Unavailable(
                    "connecting to the API server: connection refused".into(),
                ));
            }
            let sa = user.name.rsplit(':').next().unwrap_or_default().to_owned();
            self.asked.lock().unwrap().push(format!(
                "{sa} {} {} {}",
                access.verb, access.subresource, access.queue
            ));
            let key = (
                sa,
                access.verb.to_owned(),
                access.subresource.to_owned(),
                access.queue.clone(),
            );
            Ok(Decision {
                allowed: !self.revoked.load(SeqCst) && self.grants.contains(&key),
                reason: String::new(),
            })
        })
    }
}

struct Server {
    addr: SocketAddr,
    metrics: Arc<QueueMetrics>,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves `shop/emails` and `shop/reports` (namespace `shop`) to gRPC workers checked by `auth`, in
/// pod [`POD`].
async fn serve(url: &str, auth: Authenticator) -> Server {
    admitting(url, Some(auth), 16, Admission::default()).await
}

/// [`serve`] with `max_streams` and `admission`; `auth` `None`: callers are not checked.
async fn admitting(url: &str, auth: Option<Authenticator>, max_streams: u32, admission: Admission) -> Server {
    admitting_on("127.0.0.1:0", url, auth, max_streams, admission).await
}

/// [`admitting`] with the listener bound to `bind`; its address as reached on 127.0.0.1.
async fn admitting_on(
    bind: &str,
    url: &str,
    auth: Option<Authenticator>,
    max_streams: u32,
    admission: Admission,
) -> Server {
    let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
    let addr = SocketAddr::from(([127, 0, 0, 1], listener.local_addr().unwrap().port()));
    let metrics = Arc::new(QueueMetrics::with_grpc_streams());
    let shutdown = CancellationToken::new();
    let engine = WorkerOptions {
        heartbeat_interval: Some(Duration::from_millis(100)),
        ..opts("shop/emails", "unused")
    };
    let opts = GrpcOptions {
        database_url: url.to_owned(),
        queues: vec!["shop/emails".into(), "shop/reports".into()],
        namespace: Some("shop".into()),
        engine,
        max_streams,
        max_message_bytes: 1 << 20,
        auth: auth.map(Arc::new),
        pod_name: Some(POD.into()),
    };
    tokio::spawn(grpc::serve_with_admission(
        listener,
        opts,
        admission,
        metrics.clone(),
        shutdown.clone(),
    ));
    Server {
        addr,
        metrics,
        shutdown,
    }
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A worker's stream, opened with `token` (if any) in the `authorization` metadata.
struct Stream {
    tx: mpsc::Sender<WorkerMessage>,
    rx: Streaming<SidecarMessage>,
}

/// A `subscribe` for `queues`, one slot.
fn subscribe(queues: &[&str]) -> WorkerMessage {
    WorkerMessage {
        msg: Some(In::Subscribe(proto::Subscribe {
            queues: queues.iter().map(|q| q.to_string()).collect(),
            kinds: vec![],
            slots: 1,
            worker_name: "test".into(),
        })),
    }
}

impl Stream {
    async fn open(addr: SocketAddr, token: Option<&str>, queues: &[&str]) -> Result<Self, Status> {
        Self::open_with(addr, token, subscribe(queues)).await
    }

    /// Opens a stream whose first message is `first`.
    async fn open_with(addr: SocketAddr, token: Option<&str>, first: WorkerMessage) -> Result<Self, Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(first).await.unwrap();
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(t) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        let rx = WorkerClient::new(channel(addr).await)
            .work(request)
            .await?
            .into_inner();
        let mut s = Self { tx, rx };
        match s.next().await {
            Out::Subscribed(_) => Ok(s),
            other => panic!("expected subscribed, got {other:?}"),
        }
    }

    async fn next(&mut self) -> Out {
        tokio::time::timeout(DEADLINE, self.rx.message())
            .await
            .expect("a message within the deadline")
            .expect("the stream is healthy")
            .expect("the stream is open")
            .msg
            .expect("a message with content")
    }

    async fn job(&mut self) -> proto::Job {
        match self.next().await {
            Out::Job(j) => j,
            other => panic!("expected a job, got {other:?}"),
        }
    }

    /// The status the stream ends with, and every message before it.
    async fn ended_with(&mut self) -> (Status, Vec<Out>) {
        let mut seen = Vec::new();
        loop {
            match tokio::time::timeout(DEADLINE, self.rx.message())
                .await
                .expect("the stream ends within the deadline")
            {
                Err(s) => return (s, seen),
                Ok(None) => return (Status::ok(""), seen),
                Ok(Some(m)) => seen.extend(m.msg),
            }
        }
    }
}

/// A stream opened by [`open_silent`].
struct Silent {
    /// Nothing is sent until this sends; dropping it ends the worker's side of the stream.
    tx: mpsc::Sender<WorkerMessage>,
    /// The call; aborting it drops the connection, as a worker that goes away.
    call: tokio::task::JoinHandle<()>,
}

/// Opens a stream with `token` on which nothing is sent; how the call is answered (refused, or `OK` if
/// let in) goes to `answers`.
async fn open_silent(
    addr: SocketAddr,
    token: Option<&str>,
    answers: &mpsc::UnboundedSender<Status>,
) -> Silent {
    let (tx, rx) = mpsc::channel(64);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(t) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let mut client = WorkerClient::new(channel(addr).await);
    let answers = answers.clone();
    let call = tokio::spawn(async move {
        let answer = match client.work(request).await {
            Ok(_) => Status::ok("let in"),
            Err(s) => s,
        };
        let _ = answers.send(answer);
    });
    Silent { tx, call }
}

/// The next `n` answers to streams opened by [`open_silent`], each within the deadline.
async fn answers(rx: &mut mpsc::UnboundedReceiver<Status>, n: usize) -> Vec<Status> {
    let mut got = Vec::new();
    for _ in 0..n {
        let s = tokio::time::timeout(DEADLINE, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{} of {n} answers within the deadline: {got:?}", got.len()))
            .expect("answers are sent");
        got.push(s);
    }
    got
}

/// A message that is no `WorkerMessage`: its field 1 (`subscribe`, a message) as a number, which a
/// `WorkerMessage` cannot be decoded from.
#[derive(Clone, PartialEq, prost::Message)]
struct NotAWorkerMessage {
    #[prost(uint64, tag = "1")]
    subscribe: u64,
}

/// Opens a stream with `token` whose first message is bytes that decode to no `WorkerMessage`; the
/// status it is refused with.
async fn open_undecodable(addr: SocketAddr, token: &str) -> Status {
    let mut grpc = tonic::client::Grpc::new(channel(addr).await);
    grpc.ready().await.expect("the channel is ready");
    let mut request = tonic::Request::new(tokio_stream::once(NotAWorkerMessage { subscribe: 7 }));
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let codec = tonic_prost::ProstCodec::<NotAWorkerMessage, SidecarMessage>::default();
    let path = http::uri::PathAndQuery::from_static("/sluice.v1.Worker/Work");
    match grpc.streaming(request, path, codec).await {
        Ok(_) => panic!("a stream of undecodable bytes was let in"),
        Err(s) => s,
    }
}

/// The message of a stream refused because `user` already has as many streams pending as one caller
/// may.
fn per_caller_cap(user: &str) -> String {
    format!(
        "at most {MAX_PENDING_PER_CALLER} worker streams of one caller may wait for subscribe and \
         authorization at once; {user} has {MAX_PENDING_PER_CALLER}"
    )
}

fn refused(r: Result<Stream, Status>) -> Status {
    match r {
        Ok(_) => panic!("the stream was let in"),
        Err(s) => s,
    }
}

async fn enqueue(store: &QueueStore, queue: &str) -> uuid::Uuid {
    store
        .enqueue(queue, &NewJob::new("noop", serde_json::json!({})))
        .await
        .unwrap()
        .id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_need_a_token_and_update_on_the_jobs_of_each_queue_unless_they_are_the_worker_pod() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    queue(&store, "shop/reports").await;
    let rbac = Rbac::new(&[
        ("ops", "update", "jobs", "emails"),
        ("web", "get", "jobs", "emails"),
    ]);
    // A host-network pod: even its loopback callers need a token.
    let gate = Authenticator::new(rbac.clone(), "shop", Some("worker"), LoopbackCallers::Token);
    let server = serve(&pgs.url(), gate).await;
    let addr = server.addr;

    let s = refused(Stream::open(addr, None, &["emails"]).await);
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert!(
        s.message()
            .starts_with("no token: send `Authorization: Bearer <token>`"),
        "{s:?}"
    );
    let s = refused(Stream::open(addr, Some("forged"), &["emails"]).await);
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    assert!(
        s.message()
            .contains("not a valid ServiceAccount token for audience \"sluice\": invalid bearer token"),
        "{s:?}"
    );
    let s = refused(Stream::open(addr, Some("unreachable"), &["emails"]).await);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert!(s.message().contains("connection refused"), "{s:?}");

    // `get` is not enough to take jobs; the message names user, verb, subresource and JobQueue.
    let s = refused(Stream::open(addr, Some("t-web"), &["emails"]).await);
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(
        s.message().starts_with(
            "system:serviceaccount:shop:web may not update jobqueues/jobs of JobQueue \"emails\" in \
             namespace \"shop\" (group sluice.dev)"
        ),
        "{s:?}"
    );
    // Every queue subscribed to is authorized: no subscribe.queues is all the sidecar serves.
    let s = refused(Stream::open(addr, Some("t-ops"), &[]).await);
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(s.message().contains("JobQueue \"reports\""), "{s:?}");
    let s = refused(Stream::open(addr, Some("t-ops"), &["shop/emails", "reports"]).await);
    assert!(s.message().contains("JobQueue \"reports\""), "{s:?}");
    // A queue not served is refused without naming the queues served, which the caller is not yet
    // authorized for.
    let s = refused(Stream::open(addr, Some("t-web"), &["nope"]).await);
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert_eq!(
        s.message(),
        "subscribe.queues: this sidecar does not serve queue \"shop/nope\""
    );

    // With the right, jobs come.
    let id = enqueue(&store, "shop/emails").await;
    let mut ops = Stream::open(addr, Some("t-ops"), &["emails"]).await.unwrap();
    let job = ops.job().await;
    assert_eq!(job.job_id, id.to_string());
    ops.tx
        .send(WorkerMessage {
            msg: Some(In::Outcome(proto::Outcome {
                job_id: job.job_id.clone(),
                attempt: job.attempt,
                result: Some(outcome::Result::Succeeded(proto::Succeeded {})),
            })),
        })
        .await
        .unwrap();
    wait_state(&store, id, "succeeded").await;
    drop(ops);

    // The worker pod itself, by its token bound to the pod: every queue served, without asking RBAC.
    // The same ServiceAccount's token bound to another pod is anyone else.
    rbac.asked.lock().unwrap().clear();
    let own = format!("t-worker@{POD}");
    let mut pod = Stream::open(addr, Some(&own), &[]).await.unwrap();
    let id = enqueue(&store, "shop/reports").await;
    assert_eq!(pod.job().await.job_id, id.to_string());
    assert_eq!(
        *rbac.asked.lock().unwrap(),
        Vec::<String>::new(),
        "no SubjectAccessReview"
    );
    let s = refused(Stream::open(addr, Some("t-worker@emails-worker-other"), &["emails"]).await);
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    assert!(
        s.message()
            .starts_with("system:serviceaccount:shop:worker may not update"),
        "{s:?}"
    );
    drop(pod);

    // Health and reflection answer anyone.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(addr).await);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "sluice.v1.Worker".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(
        status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let mut reflection = ServerReflectionClient::new(channel(addr).await);
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([ask]))
        .await
        .unwrap()
        .into_inner();
    assert!(answers.message().await.unwrap().is_some());

    // A pod off the host network: a tokenless caller on its loopback is the pod itself.
    let gate = Authenticator::new(rbac.clone(), "shop", Some("worker"), LoopbackCallers::Pod);
    let server = serve(&pgs.url(), gate).await;
    let mut pod = Stream::open(server.addr, None, &["emails"]).await.unwrap();
    let id = enqueue(&store, "shop/emails").await;
    assert_eq!(pod.job().await.job_id, id.to_string());
}

/// A sidecar serving `shop/emails` to `t-ops` (allowed to update its jobs) that checks open streams again
/// every 20 ms, its gatekeeper's clock moved by hand through the returned `now`.
async fn rechecking(url: &str, rbac: Arc<Rbac>) -> (Server, Arc<Mutex<Instant>>) {
    let now = Arc::new(Mutex::new(Instant::now()));
    let clock = now.clone();
    let gate = Authenticator::new(rbac, "shop", Some("worker"), LoopbackCallers::Token)
        .with_clock(Arc::new(move || *clock.lock().unwrap()))
        .with_recheck_every(Duration::from_millis(20));
    (serve(url, gate).await, now)
}

/// Sends that the worker finished `job`.
async fn succeed(w: &Stream, job: &proto::Job) {
    w.tx.send(WorkerMessage {
        msg: Some(In::Outcome(proto::Outcome {
            job_id: job.job_id.clone(),
            attempt: job.attempt,
            result: Some(outcome::Result::Succeeded(proto::Succeeded {})),
        })),
    })
    .await
    .unwrap();
}

/// Opens a stream as `t-ops`, takes a job, then `refuse`s it (the cached answers expired by the
/// gatekeeper's clock); the stream must say `draining`, still take the outcome of the job in hand, push
/// no other job, and end with `code` and a message containing `says`.
async fn an_open_stream_is_drained_and_ended_once(refuse: impl FnOnce(&Rbac), code: Code, says: &str) {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[("ops", "update", "jobs", "emails")]);
    let (server, now) = rechecking(&pgs.url(), rbac.clone()).await;
    let first = enqueue(&store, "shop/emails").await;
    let mut w = Stream::open(server.addr, Some("t-ops"), &["emails"])
        .await
        .unwrap();
    let job = w.job().await;
    assert_eq!(job.job_id, first.to_string());
    let second = enqueue(&store, "shop/emails").await;

    refuse(&rbac);
    *now.lock().unwrap() += ALLOW_TTL;
    match w.next().await {
        Out::Draining(_) => {}
        other => panic!("expected draining, got {other:?}"),
    }
    succeed(&w, &job).await;
    let (status, seen) = w.ended_with().await;
    assert_eq!(status.code(), code, "{status:?}");
    assert!(status.message().contains(says), "{status:?}");
    assert!(!seen.iter().any(|m| matches!(m, Out::Job(_))), "{seen:?}");
    wait_state(&store, first, "succeeded").await;
    assert_eq!(
        state(&store, second).await,
        "pending",
        "handed back, never pushed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_right_is_revoked_takes_no_more_jobs_and_ends_permission_denied() {
    an_open_stream_is_drained_and_ended_once(
        |r| r.revoked.store(true, SeqCst),
        Code::PermissionDenied,
        "system:serviceaccount:shop:ops may not update",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_whose_right_cannot_be_checked_again_three_times_in_a_row_ends_unavailable() {
    an_open_stream_is_drained_and_ended_once(
        |r| r.down.store(true, SeqCst),
        Code::Unavailable,
        "could not be authorized again 3 times in a row",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_outlives_its_token_while_its_user_is_still_authorized() {
    // The token presented at the start stops being valid (the kubelet rotated it, or it expired): the
    // stream was authenticated when it opened, and re-checks authorize that user again, so jobs keep
    // coming.
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[("ops", "update", "jobs", "emails")]);
    let (server, now) = rechecking(&pgs.url(), rbac.clone()).await;
    let first = enqueue(&store, "shop/emails").await;
    let mut w = Stream::open(server.addr, Some("t-ops"), &["emails"])
        .await
        .unwrap();
    let job = w.job().await;
    assert_eq!(job.job_id, first.to_string());

    rbac.tokens_valid.store(false, SeqCst);
    rbac.asked.lock().unwrap().clear();
    *now.lock().unwrap() += ALLOW_TTL;
    // A re-check asked the API server again, for the user the token named at the start.
    sluice_testsupport::wait_for_async("a re-check", DEADLINE, || {
        let asked = !rbac.asked.lock().unwrap().is_empty();
        async move { asked.then_some(()) }
    })
    .await;
    assert_eq!(rbac.asked.lock().unwrap()[0], "ops update jobs emails");
    succeed(&w, &job).await;
    wait_state(&store, first, "succeeded").await;
    let second = enqueue(&store, "shop/emails").await;
    match w.next().await {
        Out::Job(j) => assert_eq!(j.job_id, second.to_string()),
        other => panic!("expected the next job, got {other:?}"),
    }
}

/// Takes `n` jobs of `shop/emails` one after another on `w` (one slot) and finishes each.
async fn drain_jobs(store: &QueueStore, w: &mut Stream, n: usize) {
    let ids: Vec<_> = futures::future::join_all((0..n).map(|_| enqueue(store, "shop/emails"))).await;
    for _ in 0..n {
        let job = w.job().await;
        succeed(w, &job).await;
    }
    for id in ids {
        wait_state(store, id, "succeeded").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_the_right_cannot_keep_authorized_workers_out() {
    const SLOTS: u32 = 4;
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[
        ("ops", "update", "jobs", "emails"),
        ("web", "get", "jobs", "emails"),
    ]);
    let gate = Authenticator::new(rbac, "shop", Some("worker"), LoopbackCallers::Token);
    let server = admitting(&pgs.url(), Some(gate), SLOTS, Admission::default()).await;
    let addr = server.addr;

    // `web`, a ServiceAccount with no right to take jobs, opens more streams than the sidecar has slots
    // and never subscribes on them.
    let (answered, mut answers_rx) = mpsc::unbounded_channel();
    let mut silent = Vec::new();
    for _ in 0..SLOTS + 2 {
        silent.push(open_silent(addr, Some("t-web"), &answered).await);
    }
    // Two were refused, so the others are held open (they would hold every slot if a stream took one
    // before its caller was authorized).
    let mut refusals = answers(&mut answers_rx, 2).await;

    // An authorized worker gets in and takes jobs.
    let mut ops = Stream::open(addr, Some("t-ops"), &["emails"])
        .await
        .expect("an authorized worker is let in while another caller holds streams open");
    drain_jobs(&store, &mut ops, 2).await;

    // Another caller with no right is refused time after time: its refused streams hold nothing.
    for _ in 0..SLOTS + 1 {
        let s = refused(Stream::open(addr, Some("t-guest"), &["emails"]).await);
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    }
    // (No job is enqueued any more: `ops` would take it as well.)
    let second = Stream::open(addr, Some("t-ops"), &["emails"]).await;
    assert!(second.is_ok(), "{:?}", second.as_ref().err());

    // `web` was let wait with two streams at most; every other one was refused, naming the cap.
    refusals.extend(answers(&mut answers_rx, SLOTS as usize - 2).await);
    for s in &refusals {
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert_eq!(s.message(), per_caller_cap("system:serviceaccount:shop:web"));
    }
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_may_have_two_streams_waiting_to_be_let_in_whatever_its_tokens() {
    const SLOTS: u32 = 4;
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[("ops", "update", "jobs", "emails")]);
    let gate = Authenticator::new(rbac, "shop", Some("worker"), LoopbackCallers::Token);
    let server = admitting(&pgs.url(), Some(gate), SLOTS, Admission::default()).await;
    let addr = server.addr;

    // One user, a different token for each stream (bound to different pods): one caller.
    let (answered, mut answers_rx) = mpsc::unbounded_channel();
    let mut web = Vec::new();
    for i in 0..5 {
        web.push(open_silent(addr, Some(&format!("t-web@web-{i}")), &answered).await);
    }
    for s in answers(&mut answers_rx, 3).await {
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert_eq!(s.message(), per_caller_cap("system:serviceaccount:shop:web"));
    }
    assert_eq!(refusals(&server.metrics, "caller_pending_full"), 3.0);
    pending_reads(&server.metrics, 2.0).await;
    // Other callers are not held up by it.
    let ops = Stream::open(addr, Some("t-ops"), &["emails"]).await.unwrap();
    drop(ops);

    // A second caller waiting with two streams as well fills the room to wait (as many streams as
    // slots): its third stream, and anyone's, is refused.
    let mut guest = Vec::new();
    for _ in 0..3 {
        guest.push(open_silent(addr, Some("t-guest"), &answered).await);
    }
    let full = "at most 4 worker streams may wait for subscribe and authorization at once";
    let s = answers(&mut answers_rx, 1).await.remove(0);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(s.message(), full);
    let s = refused(Stream::open(addr, Some("t-ops"), &["emails"]).await);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(s.message(), full);
    // The worker pod itself waits in no line: it is let in while the room to wait is full.
    let own = Stream::open(addr, Some(&format!("t-worker@{POD}")), &["emails"]).await;
    assert!(own.is_ok(), "{:?}", own.as_ref().err());
    drop(own);
    // `web` closes its streams before subscribing: they end, and the room they took comes back.
    drop(web);
    for s in answers(&mut answers_rx, 2).await {
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert_eq!(s.message(), "the stream ended before subscribe");
    }
    let ops = Stream::open(addr, Some("t-ops"), &["emails"]).await;
    assert!(ops.is_ok(), "{:?}", ops.as_ref().err());
    drop(guest);
    for s in answers(&mut answers_rx, 2).await {
        assert_eq!(s.message(), "the stream ended before subscribe", "{s:?}");
    }

    // Workers that go away while waiting (their connection dropped): their room comes back as soon as
    // the sidecar notices, well before the subscribe timeout.
    let (answered, mut answers_rx) = mpsc::unbounded_channel();
    for _ in 0..2 {
        let mut silent = Vec::new();
        for _ in 0..3 {
            silent.push(open_silent(addr, Some("t-web"), &answered).await);
        }
        let s = answers(&mut answers_rx, 1).await.remove(0);
        assert_eq!(s.message(), per_caller_cap("system:serviceaccount:shop:web"));
        for s in &silent {
            s.call.abort();
        }
        let soon = ADMISSION_TIMEOUT / 2;
        sluice_testsupport::wait_for_async("the room of streams gone to come back", soon, || async {
            match Stream::open(addr, Some("t-web"), &["emails"]).await {
                Err(s) if s.code() == Code::PermissionDenied => Some(()),
                Err(s) if s.code() == Code::Unavailable => None,
                Err(s) => panic!("{s:?}"),
                Ok(_) => panic!("let in"),
            }
        })
        .await;
    }
    pending_reads(&server.metrics, 0.0).await;

    // With callers not checked there is no caller to tell apart: the total alone applies (a pod's own
    // workers may all start at once).
    let server = admitting(&pgs.url(), None, SLOTS, Admission::default()).await;
    let (answered, mut answers_rx) = mpsc::unbounded_channel();
    let mut anyone = Vec::new();
    for _ in 0..=SLOTS {
        anyone.push(open_silent(server.addr, None, &answered).await);
    }
    let s = answers(&mut answers_rx, 1).await.remove(0);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(
        s.message(),
        format!("at most {SLOTS} worker streams may wait for subscribe and authorization at once")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_slots_come_back_after_refusals_timeouts_and_bad_starts() {
    const SLOTS: u32 = 2;
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[
        ("ops", "update", "jobs", "emails"),
        ("web", "get", "jobs", "emails"),
    ]);
    let gate = Authenticator::new(rbac, "shop", Some("worker"), LoopbackCallers::Token);
    let admission = Admission {
        timeout: Duration::from_secs(1),
        ..Admission::default()
    };
    let server = admitting(&pgs.url(), Some(gate), SLOTS, admission).await;
    let addr = server.addr;

    // Each way a stream may end before it is let in, more times in a row than there are slots or room
    // to wait: a slot or room held after any of them would refuse the next with RESOURCE_EXHAUSTED.
    for _ in 0..3 * SLOTS {
        let s = refused(Stream::open(addr, Some("t-web"), &["emails"]).await);
        assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    }
    let (answered, mut answers_rx) = mpsc::unbounded_channel();
    for _ in 0..3 {
        let mut silent = Vec::new();
        for _ in 0..SLOTS {
            silent.push(open_silent(addr, Some("t-web"), &answered).await);
        }
        for s in answers(&mut answers_rx, SLOTS as usize).await {
            assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
            assert_eq!(s.message(), "no subscribe within 1s");
        }
    }
    let heartbeat = || WorkerMessage {
        msg: Some(In::Heartbeat(proto::Heartbeat { jobs: vec![] })),
    };
    let no_slots = || {
        let mut m = subscribe(&["emails"]);
        if let Some(In::Subscribe(s)) = &mut m.msg {
            s.slots = 0;
        }
        m
    };
    for _ in 0..3 * SLOTS {
        let s = refused(Stream::open_with(addr, Some("t-web"), heartbeat()).await);
        assert_eq!(s.message(), "the first message must be subscribe", "{s:?}");
        let s = refused(Stream::open_with(addr, Some("t-web"), no_slots()).await);
        assert!(s.message().starts_with("subscribe.slots: 0"), "{s:?}");
        let s = refused(Stream::open(addr, Some("t-web"), &["nope"]).await);
        assert!(s.message().contains("does not serve queue"), "{s:?}");
        let s = open_undecodable(addr, "t-web").await;
        assert_eq!(s.code(), Code::Internal, "{s:?}");
        drop(open_silent(addr, Some("t-web"), &answered).await);
        let s = answers(&mut answers_rx, 1).await.remove(0);
        assert_eq!(s.message(), "the stream ended before subscribe", "{s:?}");
    }

    // Every slot is free: authorized workers take them all, and the jobs.
    let mut a = Stream::open(addr, Some("t-ops"), &["emails"]).await.unwrap();
    let mut b = Stream::open(addr, Some("t-ops"), &["emails"]).await.unwrap();
    let s = refused(Stream::open(addr, Some("t-ops"), &["emails"]).await);
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert_eq!(
        s.message(),
        "this sidecar serves at most 2 worker streams at once"
    );
    let ids = [
        enqueue(&store, "shop/emails").await,
        enqueue(&store, "shop/emails").await,
    ];
    let (ja, jb) = (a.job().await, b.job().await);
    succeed(&a, &ja).await;
    succeed(&b, &jb).await;
    for id in ids {
        wait_state(&store, id, "succeeded").await;
    }

    // Each refusal was counted once, by its reason.
    let m = &server.metrics;
    let n = f64::from(3 * SLOTS);
    assert_eq!(refusals(m, "forbidden"), n);
    assert_eq!(
        refusals(m, "no_subscribe"),
        2.0 * n,
        "timed out, or ended before subscribe"
    );
    assert_eq!(
        refusals(m, "invalid"),
        4.0 * n,
        "not subscribe, bad slots, a queue not served, undecodable"
    );
    assert_eq!(refusals(m, "streams_full"), 1.0);
    pending_reads(m, 0.0).await;
}

/// The value of the sample `name` (with its labels, as rendered) in `metrics`; 0 when absent.
fn sample(metrics: &QueueMetrics, name: &str) -> f64 {
    metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn refusals(metrics: &QueueMetrics, reason: &str) -> f64 {
    sample(
        metrics,
        &format!("sluice_grpc_streams_refused_total{{reason=\"{reason}\"}}"),
    )
}

/// Waits until `counter` is past `before`.
async fn passed(counter: &AtomicUsize, before: usize, what: &str) {
    sluice_testsupport::wait_for_async(what, DEADLINE, || {
        let now = counter.load(SeqCst);
        async move { (now > before).then_some(()) }
    })
    .await;
}

/// Waits until `n` streams were counted refused for `reason`.
async fn refusals_read(metrics: &QueueMetrics, reason: &str, n: f64) {
    sluice_testsupport::wait_for_async(&format!("{n} streams refused {reason}"), DEADLINE, || {
        let now = refusals(metrics, reason);
        async move { (now == n).then_some(()) }
    })
    .await;
}

/// Waits until the gauge of streams waiting to be let in reads `n`.
async fn pending_reads(metrics: &QueueMetrics, n: f64) {
    sluice_testsupport::wait_for_async(&format!("{n} streams pending"), DEADLINE, || {
        let now = sample(metrics, "sluice_grpc_streams_pending");
        async move { (now == n).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviews_that_never_come_back_end_the_stream_at_the_admission_deadline_naming_them() {
    const SLOTS: u32 = 2;
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[
        ("ops", "update", "jobs", "emails"),
        ("qa", "update", "jobs", "emails"),
    ]);
    let gate = Authenticator::new(rbac.clone(), "shop", Some("worker"), LoopbackCallers::Token);
    let admission = Admission {
        timeout: Duration::from_secs(1),
        ..Admission::default()
    };
    let server = admitting(&pgs.url(), Some(gate), SLOTS, admission).await;
    let addr = server.addr;
    let answered = |r| async move {
        refused(
            tokio::time::timeout(DEADLINE, r)
                .await
                .expect("the stream is answered within the deadline"),
        )
    };

    // The API server takes the token but never answers a SubjectAccessReview: each stream ends at the
    // deadline, and gives back its room to wait (more streams in a row than there is room: one held
    // would refuse the next with UNAVAILABLE).
    rbac.access_hangs.store(true, SeqCst);
    for _ in 0..2 * SLOTS {
        let s = answered(Stream::open(addr, Some("t-ops"), &["emails"])).await;
        assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
        assert_eq!(
            s.message(),
            "the caller was not authorized within 1s: the API server did not answer the \
             SubjectAccessReview in time"
        );
    }
    rbac.access_hangs.store(false, SeqCst);

    // Nor a TokenReview.
    rbac.tokens_hang.store(true, SeqCst);
    let s = answered(Stream::open(addr, Some("t-dev"), &["emails"])).await;
    assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
    assert_eq!(
        s.message(),
        "the caller's token was not checked within 1s: the API server did not answer the TokenReview \
         in time"
    );
    rbac.tokens_hang.store(false, SeqCst);

    // Answering again, the API server lets a caller in (one whose reviews are not the ones left
    // hanging).
    let qa = Stream::open(addr, Some("t-qa"), &["emails"]).await;
    assert!(qa.is_ok(), "{:?}", qa.as_ref().err());
    let m = &server.metrics;
    assert_eq!(refusals(m, "review_timeout"), f64::from(2 * SLOTS + 1));
    pending_reads(m, 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_listener_of_every_address_the_worker_pod_is_let_in_while_the_room_to_wait_is_full() {
    const SLOTS: u32 = 2;
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[("web", "get", "jobs", "emails")]);
    let gate = Authenticator::new(rbac.clone(), "shop", Some("worker"), LoopbackCallers::Token);
    // Bound to every address, as on the pod network: no caller is the pod's own loopback caller, and
    // the pod's workers send a token bound to the pod.
    let server = admitting_on("0.0.0.0:0", &pgs.url(), Some(gate), SLOTS, Admission::default()).await;
    let (addr, m) = (server.addr, &server.metrics);

    // `web` waits with two streams, never subscribing: the room to wait (as many as the slots) is full.
    // Its third is refused for that, so both are counted by then.
    let (answered, mut answers_rx) = mpsc::unbounded_channel();
    let mut web = Vec::new();
    for _ in 0..=SLOTS {
        web.push(open_silent(addr, Some("t-web"), &answered).await);
    }
    let full = "at most 2 worker streams may wait for subscribe and authorization at once";
    let s = answers(&mut answers_rx, 1).await.remove(0);
    assert_eq!(s.message(), full);
    pending_reads(m, 2.0).await;

    // The worker pod's own stream is reviewed, and let in: it waits in no line.
    let asked = rbac.tokens_asked.load(SeqCst);
    let own = Stream::open(addr, Some(&format!("t-worker@{POD}")), &["emails"]).await;
    assert!(own.is_ok(), "{:?}", own.as_ref().err());
    assert_eq!(
        rbac.tokens_asked.load(SeqCst),
        asked + 1,
        "its token was reviewed"
    );
    // Anyone else is refused for the room once known.
    let s = refused(Stream::open(addr, Some("junk-0"), &["emails"]).await);
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");
    let s = refused(Stream::open(addr, Some("t-guest"), &["emails"]).await);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(s.message(), full);

    drop(web);
    for s in answers(&mut answers_rx, 2).await {
        assert_eq!(s.message(), "the stream ended before subscribe", "{s:?}");
    }
    assert_eq!(refusals(m, "pending_full"), 2.0);
    assert_eq!(refusals(m, "unauthenticated"), 1.0);
    assert_eq!(refusals(m, "no_subscribe"), 2.0);
    pending_reads(m, 0.0).await;
    drop(own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_goes_away_while_its_stream_waits_to_be_let_in_is_counted_gone() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    let rbac = Rbac::new(&[("ops", "update", "jobs", "emails")]);
    let gate = Authenticator::new(rbac.clone(), "shop", Some("worker"), LoopbackCallers::Token);
    // The default admission deadline (10 s) is far off: what ends these streams is the worker going
    // away (its call dropped, the stream reset), not the deadline.
    let server = serve(&pgs.url(), gate).await;
    let (addr, m) = (server.addr, &server.metrics);
    let (answered, mut answers_rx) = mpsc::unbounded_channel();

    // Going away while its `subscribe` is awaited breaks the stream the sidecar reads: `no_subscribe`,
    // as a stream that ends or breaks then.
    let waiting = open_silent(addr, Some("t-ops"), &answered).await;
    pending_reads(m, 1.0).await;
    waiting.call.abort();
    refusals_read(m, "no_subscribe", 1.0).await;
    pending_reads(m, 0.0).await;
    assert_eq!(refusals(m, "gone"), 0.0);

    // Waiting for its TokenReview, which never comes back.
    rbac.tokens_hang.store(true, SeqCst);
    let before = rbac.tokens_asked.load(SeqCst);
    let waiting = open_silent(addr, Some("t-dev"), &answered).await;
    passed(&rbac.tokens_asked, before, "the TokenReview to begin").await;
    pending_reads(m, 1.0).await;
    waiting.call.abort();
    refusals_read(m, "gone", 1.0).await;
    pending_reads(m, 0.0).await;
    rbac.tokens_hang.store(false, SeqCst);

    // Subscribed, waiting for its SubjectAccessReview, which never comes back.
    rbac.access_hangs.store(true, SeqCst);
    let before = rbac.accesses_begun.load(SeqCst);
    let waiting = open_silent(addr, Some("t-ops"), &answered).await;
    waiting.tx.send(subscribe(&["emails"])).await.unwrap();
    passed(&rbac.accesses_begun, before, "the SubjectAccessReview to begin").await;
    pending_reads(m, 1.0).await;
    waiting.call.abort();
    refusals_read(m, "gone", 2.0).await;
    pending_reads(m, 0.0).await;

    // Counted as said and nothing else; none was answered: no one was left to answer.
    for reason in [
        "review_timeout",
        "unauthenticated",
        "forbidden",
        "unavailable",
        "invalid",
    ] {
        assert_eq!(refusals(m, reason), 0.0, "{reason}");
    }
    assert!(answers_rx.try_recv().is_err(), "a stream gone was answered");
}
