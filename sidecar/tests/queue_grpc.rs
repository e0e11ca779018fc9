//! The gRPC worker API (`sluice.v1.Worker`) on real PostgreSQL: fencing (an outcome after the lease was
//! lost is refused and says why), heartbeats keeping a job past its lease (and their absence losing it),
//! a worker that disconnects mid-job (its jobs are retried and completed once by another), bad messages,
//! the stream limit, health and reflection, a one-slot stream's claims (never more than one job leased
//! ahead of the one in hand); and the Python example worker draining a queue against the real sidecar
//! process, every job completed exactly once.

mod queue_support;

use std::{net::SocketAddr, process::Command, sync::Arc, time::Duration};

use queue_support::*;
use sluice_sidecar::queue::{
    NewJob, QueueStore, WorkerOptions,
    grpc::{
        self, GrpcOptions,
        proto::{
            self, JobRef, SidecarMessage, WorkerMessage, outcome, sidecar_message::Msg as Out,
            worker_client::WorkerClient, worker_message::Msg as In,
        },
    },
    metrics::QueueMetrics,
};
use sluice_testsupport::wait_for_async;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Streaming, transport::Channel};
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(15);

struct Server {
    addr: SocketAddr,
    shutdown: CancellationToken,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Serves the gRPC worker API in process for `queues`.
async fn serve(url: &str, queues: &[&str], max_streams: u32, max_message_bytes: usize) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let engine = WorkerOptions {
        heartbeat_interval: Some(Duration::from_millis(100)),
        ..opts(queues[0], "unused")
    };
    let opts = GrpcOptions {
        database_url: url.to_owned(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        namespace: None,
        engine,
        max_streams,
        max_message_bytes,
        auth: None,
        pod_name: None,
    };
    tokio::spawn(grpc::serve(
        listener,
        opts,
        Arc::new(QueueMetrics::with_grpc_streams()),
        shutdown.clone(),
    ));
    Server { addr, shutdown }
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// A worker's stream: what it sends and what it receives.
struct Stream {
    tx: mpsc::Sender<WorkerMessage>,
    rx: Streaming<SidecarMessage>,
}

impl Stream {
    async fn open(addr: SocketAddr, first: WorkerMessage) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(64);
        tx.send(first).await.unwrap();
        let mut client = WorkerClient::new(channel(addr).await).max_decoding_message_size(64 << 20);
        let rx = client.work(ReceiverStream::new(rx)).await?.into_inner();
        Ok(Self { tx, rx })
    }

    /// Subscribes to `queues` with `slots`; panics unless `subscribed` comes back.
    async fn subscribe(addr: SocketAddr, queues: &[&str], slots: u32) -> Self {
        let mut s = Self::open(addr, subscribe(queues, slots)).await.unwrap();
        match s.next().await {
            Out::Subscribed(sub) => assert_eq!(sub.slots, slots),
            other => panic!("expected subscribed, got {other:?}"),
        }
        s
    }

    async fn send(&self, msg: In) {
        self.tx.send(WorkerMessage { msg: Some(msg) }).await.unwrap();
    }

    /// The next message, within the deadline.
    async fn next(&mut self) -> Out {
        tokio::time::timeout(DEADLINE, self.rx.message())
            .await
            .expect("a message within the deadline")
            .expect("the stream is healthy")
            .expect("the stream is open")
            .msg
            .expect("a message with content")
    }

    /// The next job pushed, skipping nothing else.
    async fn job(&mut self) -> proto::Job {
        match self.next().await {
            Out::Job(j) => j,
            other => panic!("expected a job, got {other:?}"),
        }
    }

    /// The status the stream ends with.
    async fn ended_with(&mut self) -> tonic::Status {
        loop {
            match tokio::time::timeout(DEADLINE, self.rx.message()).await.unwrap() {
                Err(s) => return s,
                Ok(None) => return tonic::Status::ok(""),
                Ok(Some(_)) => continue,
            }
        }
    }
}

/// The `lease_lost` of a job and its next attempt pushed, in whichever order they come (a `cancel`
/// ahead of a lost lease is skipped).
async fn lost_and_again(w: &mut Stream) -> (proto::LeaseLost, proto::Job) {
    let (mut lost, mut again) = (None, None);
    while lost.is_none() || again.is_none() {
        match w.next().await {
            Out::LeaseLost(l) => lost = Some(l),
            Out::Job(j) => again = Some(j),
            Out::Cancel(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    (lost.unwrap(), again.unwrap())
}

fn subscribe(queues: &[&str], slots: u32) -> WorkerMessage {
    WorkerMessage {
        msg: Some(In::Subscribe(proto::Subscribe {
            queues: queues.iter().map(|q| q.to_string()).collect(),
            kinds: vec![],
            slots,
            worker_name: "test".into(),
        })),
    }
}

fn succeeded(job: &proto::Job) -> In {
    In::Outcome(proto::Outcome {
        job_id: job.job_id.clone(),
        attempt: job.attempt,
        result: Some(outcome::Result::Succeeded(proto::Succeeded {})),
    })
}

async fn enqueue(store: &QueueStore, queue: &str, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for i in 0..n {
        let job = NewJob::new("noop", serde_json::json!({ "i": i }));
        ids.push(store.enqueue(queue, &job).await.unwrap().id);
    }
    ids
}

/// Waits until job `id` is in `state`; returns its (attempt, last_error).
async fn wait_state(store: &QueueStore, id: Uuid, state: &str) -> (i32, Option<String>) {
    wait_for_async(&format!("job {id} {state}"), DEADLINE, || async {
        let j = store.get(id).await.unwrap().unwrap();
        (j.state == state).then(|| (j.attempt, j.last_error.clone()))
    })
    .await
}

#[tokio::test]
async fn an_outcome_after_the_lease_was_lost_is_refused_naming_why() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "fence").await;
    let server = serve(&pgs.url(), &["fence"], 4, 1 << 20).await;
    let mut w = Stream::subscribe(server.addr, &["fence"], 1).await;
    let id = enqueue(&store, "fence", 1).await[0];
    let first = w.job().await;
    assert_eq!(
        (first.job_id.as_str(), first.attempt),
        (id.to_string().as_str(), 1)
    );

    // Another worker's maintenance rescues the job: its lease ran out (as after a long pause).
    sqlx::query("UPDATE sluice.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(store.rescue_expired(&["fence".to_owned()], 10).await.unwrap(), 1);

    // The stream is told (and the rescued job comes back as attempt 2, in whichever order).
    let (lost, second) = lost_and_again(&mut w).await;
    assert_eq!((lost.job_id.as_str(), lost.attempt), (first.job_id.as_str(), 1));
    assert!(lost.reason.contains("lease lost"), "{}", lost.reason);
    // The late outcome of attempt 1 is refused, saying why.
    w.send(succeeded(&first)).await;
    match w.next().await {
        Out::Refused(r) => {
            assert_eq!((r.job_id.as_str(), r.attempt), (first.job_id.as_str(), 1));
            assert!(r.reason.contains("lease lost"), "{}", r.reason);
        }
        other => panic!("expected refused, got {other:?}"),
    }
    // The rescued job comes back as attempt 2, and that attempt's outcome counts, once.
    assert_eq!(
        (second.job_id.as_str(), second.attempt),
        (first.job_id.as_str(), 2)
    );
    w.send(succeeded(&second)).await;
    assert_eq!(wait_state(&store, id, "succeeded").await.0, 2);
}

#[tokio::test]
async fn a_stream_subscribed_to_some_kinds_takes_only_jobs_of_those_kinds() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "mixed").await;
    let server = serve(&pgs.url(), &["mixed"], 4, 1 << 20).await;
    let mut first = subscribe(&["mixed"], 4);
    if let Some(In::Subscribe(s)) = &mut first.msg {
        s.kinds = vec!["resize".into(), "crop".into(), "resize".into()];
    }
    let mut w = Stream::open(server.addr, first).await.unwrap();
    match w.next().await {
        Out::Subscribed(sub) => assert_eq!(sub.kinds, ["resize", "crop"]),
        other => panic!("expected subscribed, got {other:?}"),
    }
    // Jobs of another kind, ahead of those the stream takes in claim order (higher priority).
    let mut others = Vec::new();
    for i in 0..3 {
        let job = NewJob {
            priority: 10,
            ..NewJob::new("email", serde_json::json!({ "i": i }))
        };
        others.push(store.enqueue("mixed", &job).await.unwrap().id);
    }
    let mut wanted = Vec::new();
    for kind in ["resize", "crop", "resize"] {
        let job = NewJob::new(kind, serde_json::json!({}));
        wanted.push(store.enqueue("mixed", &job).await.unwrap().id.to_string());
    }
    let mut got = Vec::new();
    while got.len() < wanted.len() {
        let job = w.job().await;
        assert_ne!(job.kind, "email", "a job of a kind the stream did not ask for");
        w.send(succeeded(&job)).await;
        got.push(job.job_id);
    }
    got.sort();
    wanted.sort();
    assert_eq!(got, wanted);
    for id in &wanted {
        wait_state(&store, id.parse().unwrap(), "succeeded").await;
    }
    // The other kind's jobs were left alone, waiting, for a worker that takes them: one that names no
    // kinds takes every kind.
    for id in &others {
        let job = store.get(*id).await.unwrap().unwrap();
        assert_eq!((job.state.as_str(), job.attempt), ("pending", 0));
    }
    let mut all = Stream::subscribe(server.addr, &["mixed"], 4).await;
    for _ in 0..others.len() {
        let job = all.job().await;
        assert_eq!(job.kind, "email");
        all.send(succeeded(&job)).await;
    }
    for id in &others {
        wait_state(&store, *id, "succeeded").await;
    }
}

#[tokio::test]
async fn heartbeats_keep_a_job_past_its_lease_and_silence_loses_it() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    let lease = Duration::from_millis(queue(&store, "beats").await.lease_ms as u64);
    let server = serve(&pgs.url(), &["beats"], 4, 1 << 20).await;
    let mut w = Stream::subscribe(server.addr, &["beats"], 1).await;

    // Heartbeats every fifth of the lease for three leases: the job stays this stream's.
    let id = enqueue(&store, "beats", 1).await[0];
    let job = w.job().await;
    assert_eq!(job.heartbeat_within_ms, lease.as_millis() as i64);
    let held_until = tokio::time::Instant::now() + 3 * lease;
    while tokio::time::Instant::now() < held_until {
        w.send(In::Heartbeat(proto::Heartbeat {
            jobs: vec![JobRef {
                job_id: job.job_id.clone(),
                attempt: job.attempt,
            }],
        }))
        .await;
        // Nothing but refusals could come now; none may.
        if let Ok(Ok(Some(m))) = tokio::time::timeout(lease / 5, w.rx.message()).await {
            panic!("unexpected message while heartbeating: {m:?}");
        }
    }
    w.send(succeeded(&job)).await;
    assert_eq!(wait_state(&store, id, "succeeded").await.0, 1);

    // A job the worker goes silent about is taken back after the lease and retried.
    let id = enqueue(&store, "beats", 1).await[0];
    let job = w.job().await;
    let (lost, again) = lost_and_again(&mut w).await;
    assert_eq!(lost.job_id, job.job_id);
    assert!(lost.reason.contains("no heartbeat"), "{}", lost.reason);
    assert_eq!(
        (again.job_id.as_str(), again.attempt),
        (id.to_string().as_str(), 2)
    );
    w.send(succeeded(&again)).await;
    let j = store.get(id).await.unwrap().unwrap();
    assert!(j.last_error.unwrap_or_default().contains("no heartbeat"));
    assert_eq!(wait_state(&store, id, "succeeded").await.0, 2);
}

#[tokio::test]
async fn a_worker_that_disconnects_mid_job_has_its_jobs_retried_and_done_once_by_another() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "drop").await;
    let server = serve(&pgs.url(), &["drop"], 4, 1 << 20).await;
    let ids = enqueue(&store, "drop", 2).await;
    let mut a = Stream::subscribe(server.addr, &["drop"], 2).await;
    let (j1, j2) = (a.job().await, a.job().await);
    assert_eq!((j1.attempt, j2.attempt), (1, 1));
    drop(a); // the worker process dies with both jobs in hand

    for id in &ids {
        let (attempt, error) = wait_state(&store, *id, "retrying").await;
        assert_eq!(attempt, 1);
        assert!(error.unwrap_or_default().contains("stream ended"));
    }
    let mut b = Stream::subscribe(server.addr, &["drop"], 2).await;
    for _ in 0..2 {
        let j = b.job().await;
        assert_eq!(j.attempt, 2);
        b.send(succeeded(&j)).await;
    }
    for id in &ids {
        assert_eq!(wait_state(&store, *id, "succeeded").await.0, 2);
    }
}

#[tokio::test]
async fn bad_messages_are_refused_and_say_why() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "bad").await;
    let server = serve(&pgs.url(), &["bad"], 2, 64 << 10).await;
    let refused = |r: Result<Stream, tonic::Status>| match r {
        Err(s) => s,
        Ok(_) => panic!("the stream was accepted"),
    };

    // Before subscribe, and malformed subscribes: the stream is refused, naming the field.
    let beat = WorkerMessage {
        msg: Some(In::Heartbeat(proto::Heartbeat { jobs: vec![] })),
    };
    let s = refused(Stream::open(server.addr, beat).await);
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("first message must be subscribe"), "{s:?}");
    let s = refused(Stream::open(server.addr, subscribe(&["bad"], 0)).await);
    assert!(
        s.code() == Code::InvalidArgument && s.message().contains("slots"),
        "{s:?}"
    );
    let s = refused(Stream::open(server.addr, subscribe(&["other"], 1)).await);
    assert!(
        s.code() == Code::InvalidArgument && s.message().contains("\"other\""),
        "{s:?}"
    );
    for bad_kinds in [
        vec![String::new()],
        vec!["k".repeat(201)],
        (0..101).map(|i| i.to_string()).collect(),
    ] {
        let mut kinds = subscribe(&["bad"], 1);
        if let Some(In::Subscribe(s)) = &mut kinds.msg {
            s.kinds = bad_kinds;
        }
        let s = refused(Stream::open(server.addr, kinds).await);
        assert!(
            s.code() == Code::InvalidArgument && s.message().contains("subscribe.kinds"),
            "{s:?}"
        );
    }

    // Outcomes and heartbeats for jobs the stream does not hold are refused; the stream goes on.
    let mut w = Stream::subscribe(server.addr, &["bad"], 1).await;
    let stranger = Uuid::now_v7().to_string();
    w.send(In::Outcome(proto::Outcome {
        job_id: stranger.clone(),
        attempt: 1,
        result: Some(outcome::Result::Succeeded(proto::Succeeded {})),
    }))
    .await;
    match w.next().await {
        Out::Refused(r) => assert!(r.job_id == stranger && r.reason.contains("not held"), "{r:?}"),
        other => panic!("expected refused, got {other:?}"),
    }
    w.send(In::Heartbeat(proto::Heartbeat {
        jobs: vec![JobRef {
            job_id: "not-a-uuid".into(),
            attempt: 1,
        }],
    }))
    .await;
    match w.next().await {
        Out::Refused(r) => assert!(r.reason.contains("not a UUID"), "{r:?}"),
        other => panic!("expected refused, got {other:?}"),
    }
    // A job the stream holds, answered without a result: refused; then answered properly.
    let id = enqueue(&store, "bad", 1).await[0];
    let job = w.job().await;
    w.send(In::Outcome(proto::Outcome {
        job_id: job.job_id.clone(),
        attempt: job.attempt,
        result: None,
    }))
    .await;
    match w.next().await {
        Out::Refused(r) => assert!(r.reason.contains("without a result"), "{r:?}"),
        other => panic!("expected refused, got {other:?}"),
    }
    // Retry with the worker's own delay: retried after it, error kept.
    w.send(In::Outcome(proto::Outcome {
        job_id: job.job_id.clone(),
        attempt: job.attempt,
        result: Some(outcome::Result::Retry(proto::Retry {
            error: "try later".into(),
            delay_ms: Some(300),
        })),
    }))
    .await;
    let (_, error) = wait_state(&store, id, "retrying").await;
    assert_eq!(error.as_deref(), Some("try later"));
    let again = w.job().await;
    assert_eq!(again.attempt, 2);
    w.send(In::Outcome(proto::Outcome {
        job_id: again.job_id.clone(),
        attempt: 2,
        result: Some(outcome::Result::Fail(proto::Fail {
            error: "never".into(),
        })),
    }))
    .await;
    assert_eq!(wait_state(&store, id, "dead").await.1.as_deref(), Some("never"));

    // The stream limit (2): a third stream is refused while two are open.
    let other = Stream::subscribe(server.addr, &["bad"], 1).await;
    let s = refused(Stream::open(server.addr, subscribe(&["bad"], 1)).await);
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    drop(other);

    // A message over the size limit, or a second subscribe, ends the stream with an error.
    w.send(In::Heartbeat(proto::Heartbeat {
        jobs: vec![JobRef {
            job_id: "x".repeat(100 << 10),
            attempt: 1,
        }],
    }))
    .await;
    let s = w.ended_with().await;
    assert!(
        matches!(
            s.code(),
            Code::OutOfRange | Code::ResourceExhausted | Code::Internal
        ),
        "{s:?}"
    );
    let mut w = wait_for_async("a stream slot", DEADLINE, || async {
        match Stream::open(server.addr, subscribe(&["bad"], 1)).await {
            Ok(s) => Some(s),
            Err(s) if s.code() == Code::ResourceExhausted => None,
            Err(s) => panic!("{s:?}"),
        }
    })
    .await;
    assert!(matches!(w.next().await, Out::Subscribed(_)));
    w.send(In::Subscribe(proto::Subscribe {
        queues: vec![],
        kinds: vec![],
        slots: 1,
        worker_name: String::new(),
    }))
    .await;
    let s = w.ended_with().await;
    assert!(
        s.code() == Code::InvalidArgument && s.message().contains("twice"),
        "{s:?}"
    );

    // Health answers SERVING for the service.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(server.addr).await);
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

    // Reflection lists the services.
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let mut reflection = ServerReflectionClient::new(channel(server.addr).await);
    let ask = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter([ask]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["sluice.v1.Worker", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == want), "{names:?}");
    }
}

/// The Python example (examples/grpc-worker) drains a queue through the real sidecar process.
#[tokio::test]
async fn the_python_example_worker_drains_a_queue_every_job_exactly_once() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "py").await;
    let ids = enqueue(&store, "py", 300).await;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut sidecar = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .arg("worker")
        .env("SLUICE_DATABASE_URL", pgs.url())
        .env("SLUICE_QUEUES", "py")
        .env("SLUICE_GRPC_LISTEN", format!("127.0.0.1:{port}"))
        .env("SLUICE_METRICS_LISTEN", "127.0.0.1:0")
        .env("SLUICE_POD_NAME", "py-worker")
        .spawn()
        .unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/grpc-worker/worker.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(example)
            .args([
                "--target",
                &format!("127.0.0.1:{port}"),
                "--queue",
                "py",
                "--slots",
                "16",
            ])
            .args(["--exit-when-idle", "2", "--connect-timeout", "15"])
            .output()
            .expect("python3 runs (.ci/deps.sh installs grpcio)")
    })
    .await
    .unwrap();
    let _ = sidecar.kill();
    let _ = sidecar.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "worker.py failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The worker printed each job it completed; each job once, and each succeeded at its first attempt.
    let mut done: Vec<&str> = stdout.lines().filter_map(|l| l.strip_prefix("done ")).collect();
    done.sort();
    let before = done.len();
    done.dedup();
    assert_eq!(before, done.len(), "some jobs were completed twice");
    let want: std::collections::BTreeSet<String> = ids.iter().map(|i| i.to_string()).collect();
    let got: std::collections::BTreeSet<String> = done.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        got.len(),
        ids.len(),
        "jobs completed: {} of {}",
        got.len(),
        ids.len()
    );
    assert!(got == want, "the completed jobs are not the enqueued ones");
    for id in &ids {
        let j = store.get(*id).await.unwrap().unwrap();
        assert_eq!((j.state.as_str(), j.attempt), ("succeeded", 1), "job {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_slot_stream_never_holds_more_than_one_job_ahead_of_the_one_in_hand() {
    let (pgs, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "q").await;
    // Claims made slow (30 ms per job claimed) against a worker that answers at once: the engine
    // measures that a claim takes many handlers' time and claims as far ahead as one claim batch allows
    // (the sidecar's is 16 here). Not a wait: the database is made slow at what the engine sizes its
    // claims by.
    sqlx::raw_sql(
        "CREATE FUNCTION slow_claim() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN PERFORM pg_sleep(0.03); RETURN NEW; END $$; \
         CREATE TRIGGER slow_claim BEFORE UPDATE ON sluice.jobs FOR EACH ROW \
         WHEN (NEW.state = 'running' AND OLD.state <> 'running') EXECUTE FUNCTION slow_claim();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let ids = enqueue(&store, "q", 40).await;
    let server = serve(&pgs.url(), &["q"], 2, 1 << 20).await;
    let mut w = Stream::subscribe(server.addr, &["q"], 1).await;

    // Each time the worker holds a job, the jobs leased in the database that it has not answered are
    // the one in hand and those claimed ahead: at most one slot's worth of them.
    let mut answered = std::collections::HashSet::new();
    let mut most = 0;
    for _ in 0..ids.len() {
        let job = w.job().await;
        let running: Vec<Uuid> = sqlx::query_scalar("SELECT id FROM sluice.jobs WHERE state = 'running'")
            .fetch_all(&pool)
            .await
            .unwrap();
        let unanswered = running.iter().filter(|id| !answered.contains(*id)).count();
        most = most.max(unanswered);
        assert!(
            unanswered <= 2,
            "{unanswered} jobs leased to a one-slot stream and not answered"
        );
        answered.insert(job.job_id.parse::<Uuid>().unwrap());
        w.send(succeeded(&job)).await;
    }
    for id in ids {
        wait_state(&store, id, "succeeded").await;
    }
    assert!(most >= 1, "the job in hand is leased");
}
