//! The sidecar worker as a real process: HTTP dispatch with headers and status mapping, the gRPC worker
//! API's stream metrics listed only by a worker serving that API, kill -9 mid-job
//! (the job is retried after its lease expires and completes once), SIGTERM hand-back, and PostgreSQL
//! restarted under load (no acknowledged enqueue lost).

mod queue_support;

use std::{
    collections::HashMap,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, extract::State, http::HeaderMap, routing::post};
use queue_support::*;
use sluice_sidecar::queue::{NewJob, Outcome, QueueStore, Worker};
use sluice_testsupport::wait_for_async;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(15);

/// What the test handler saw: per job id, the attempts it was called with.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<String, Vec<HeaderMap>>>>);

impl Seen {
    fn calls(&self, id: uuid::Uuid) -> Vec<HeaderMap> {
        self.0
            .lock()
            .unwrap()
            .get(&id.to_string())
            .cloned()
            .unwrap_or_default()
    }
}

/// A handler on 127.0.0.1: kind `hang-first` hangs on attempt 1 and succeeds later; `status-N` answers N.
async fn start_handler(seen: Seen) -> String {
    async fn handle(
        State(seen): State<Seen>,
        headers: HeaderMap,
        _body: String,
    ) -> (http::StatusCode, String) {
        let id = headers["sluice-job-id"].to_str().unwrap().to_owned();
        let kind = headers["sluice-job-kind"].to_str().unwrap().to_owned();
        let attempt: u32 = headers["sluice-job-attempt"].to_str().unwrap().parse().unwrap();
        seen.0.lock().unwrap().entry(id).or_default().push(headers);
        if kind == "hang-first" && attempt == 1 {
            std::future::pending::<()>().await;
        }
        if let Some(code) = kind.strip_prefix("status-") {
            return (
                http::StatusCode::from_u16(code.parse().unwrap()).unwrap(),
                format!("said {code}"),
            );
        }
        (http::StatusCode::OK, "done".into())
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jobs", listener.local_addr().unwrap());
    let app = Router::new().route("/jobs", post(handle)).with_state(seen);
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

/// The `/metrics` response of a worker serving it on `port`; `None` while it does not answer.
async fn metrics_text(port: u16) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).await.ok()?;
    Some(body)
}

/// A worker process, killed when dropped (a failed assertion leaves none behind).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sluice-sidecar worker` from env vars alone.
fn spawn_worker(db: &str, queue: &str, handler: &str, pod: &str) -> Child {
    spawn_worker_with_metrics(db, queue, handler, pod, 0)
}

/// Starts `sluice-sidecar worker` serving `/metrics` on `metrics_port` (0: any).
fn spawn_worker_with_metrics(db: &str, queue: &str, handler: &str, pod: &str, metrics_port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .arg("worker")
        .env("SLUICE_DATABASE_URL", db)
        .env("SLUICE_QUEUES", queue)
        .env("SLUICE_HANDLER_URL", handler)
        .env("SLUICE_WORKER_CONCURRENCY", "4")
        .env("SLUICE_METRICS_LISTEN", format!("127.0.0.1:{}", metrics_port))
        .env("SLUICE_POD_NAME", pod)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start sluice-sidecar worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_worker_posts_jobs_with_headers_and_maps_statuses() {
    let (pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "http").await; // 3 attempts
    let seen = Seen::default();
    let url = start_handler(seen.clone()).await;
    let metrics_port = sluice_testsupport::free_port();
    let mut child = spawn_worker_with_metrics(&pg.url(), "http", &url, "pod-a", metrics_port);

    let ok = store
        .enqueue("http", &NewJob::new("ok", serde_json::json!({"x": 1})))
        .await
        .unwrap()
        .id;
    let unprocessable = store
        .enqueue("http", &NewJob::new("status-422", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let broken = store
        .enqueue("http", &NewJob::new("status-500", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    wait_state(&store, ok, "succeeded").await;
    wait_state(&store, unprocessable, "dead").await;
    wait_state(&store, broken, "dead").await;

    let h = &seen.calls(ok)[0];
    assert_eq!(h["sluice-job-kind"], "ok");
    assert_eq!(h["sluice-job-attempt"], "1");
    assert_eq!(h["sluice-job-queue"], "http");
    assert!(h.contains_key("sluice-job-deadline"));
    assert_eq!(seen.calls(unprocessable).len(), 1, "422 fails permanently");
    assert_eq!(seen.calls(broken).len(), 3, "500 is retried up to max attempts");
    let last = store.get(broken).await.unwrap().unwrap().last_error.unwrap();
    assert!(last.contains("500") && last.contains("said 500"), "{last}");

    let metrics = wait_for_async("the metrics endpoint", DEADLINE, || async move {
        metrics_text(metrics_port)
            .await
            .filter(|body| body.contains("sluice_jobs_dead_total"))
    })
    .await;
    assert!(
        metrics.contains(r#"sluice_jobs_succeeded_total{queue="http",kind="ok"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"sluice_jobs_failed_total{queue="http",kind="status-500"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_job_handler_duration_seconds_bucket"),
        "{metrics}"
    );
    assert!(metrics.contains("sluice_claim_batch_size_count"), "{metrics}");

    // SIGTERM ends the process cleanly (hand-back of running jobs is tested in queue_semantics).
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "worker exits 0 on SIGTERM: {status}");
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_worker_serving_the_grpc_worker_api_lists_its_stream_metrics() {
    let (pg, _pool) = pg().await;
    let (http_metrics, grpc_metrics) = (sluice_testsupport::free_port(), sluice_testsupport::free_port());
    // Nothing is enqueued: the handler is never called.
    let _http = Running(spawn_worker_with_metrics(
        &pg.url(),
        "posted",
        "http://127.0.0.1:9/jobs",
        "pod-http",
        http_metrics,
    ));
    let _grpc = Running(
        Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
            .arg("worker")
            .env("SLUICE_DATABASE_URL", pg.url())
            .env("SLUICE_QUEUES", "streamed")
            .env(
                "SLUICE_GRPC_LISTEN",
                format!("127.0.0.1:{}", sluice_testsupport::free_port()),
            )
            .env("SLUICE_METRICS_LISTEN", format!("127.0.0.1:{grpc_metrics}"))
            .env("SLUICE_POD_NAME", "pod-grpc")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start sluice-sidecar worker"),
    );
    // A whole exposition (it ends with `# EOF`); metrics with no sample yet (the job counters here)
    // are not in it, a gauge is.
    let listed = |port| {
        wait_for_async("the metrics endpoint", DEADLINE, move || async move {
            metrics_text(port).await.filter(|body| body.contains("# EOF"))
        })
    };

    let http = listed(http_metrics).await;
    assert!(!http.contains("sluice_grpc_streams"), "{http}");

    let grpc = listed(grpc_metrics).await;
    assert!(grpc.contains("sluice_grpc_streams_pending 0"), "{grpc}");
    drop(pg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_aborts_its_http_request_and_cancels_it() {
    let (pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "abort").await;
    let seen = Seen::default();
    let url = start_handler(seen.clone()).await;
    let mut child = spawn_worker(&pg.url(), "abort", &url, "pod-c");
    let id = store
        .enqueue("abort", &NewJob::new("hang-first", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    wait_for_async("the request to reach the handler", DEADLINE, || {
        let n = seen.calls(id).len();
        async move { (n == 1).then_some(()) }
    })
    .await;
    assert_eq!(
        store.cancel(id).await.unwrap(),
        sluice_queue::CancelOutcome::Requested
    );
    wait_state(&store, id, "cancelled").await;
    assert_eq!(seen.calls(id).len(), 1, "a cancelled job is not retried");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_worker_is_killed_is_retried_after_its_lease_and_completes_once() {
    let (pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "crash").await; // lease 1s
    let seen = Seen::default();
    let url = start_handler(seen.clone()).await;
    let mut doomed = spawn_worker(&pg.url(), "crash", &url, "pod-doomed");
    let id = store
        .enqueue("crash", &NewJob::new("hang-first", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    wait_for_async("the first attempt to reach the handler", DEADLINE, || {
        let n = seen.calls(id).len();
        async move { (n == 1).then_some(()) }
    })
    .await;
    let owner = store.get(id).await.unwrap().unwrap().lease_owner.unwrap();
    assert!(
        owner.starts_with("pod-doomed-"),
        "lease owner names the pod: {owner}"
    );

    doomed.kill().unwrap(); // SIGKILL
    doomed.wait().unwrap();
    let mut rescuer = spawn_worker(&pg.url(), "crash", &url, "pod-rescuer");
    wait_state(&store, id, "succeeded").await;
    let job = store.get(id).await.unwrap().unwrap();
    assert_eq!(job.attempt, 2);
    assert!(job.last_error.unwrap_or_default().contains("lease expired"));
    let calls = seen.calls(id);
    assert_eq!(calls.len(), 2, "one hung attempt, one that completed");
    assert_eq!(calls[1]["sluice-job-attempt"], "2");
    rescuer.kill().unwrap();
    rescuer.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarted_under_load_loses_no_acknowledged_enqueue() {
    let (pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "load").await;
    let handler = FnHandler::new(|_, _| async { Outcome::Succeeded });
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(store.clone(), handler, opts("load", "w1")).run(shutdown.clone()));

    let acked: Arc<Mutex<Vec<uuid::Uuid>>> = Arc::default();
    let stop_enqueue = CancellationToken::new();
    let producers: Vec<_> = (0..4)
        .map(|p| {
            let (store, acked, stop) = (store.clone(), acked.clone(), stop_enqueue.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.is_cancelled() {
                    n += 1;
                    let job = NewJob::new("k", serde_json::json!({"p": p, "n": n}));
                    match store.enqueue("load", &job).await {
                        Ok(e) => acked.lock().unwrap().push(e.id),
                        Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            })
        })
        .collect();
    let count = |acked: &Arc<Mutex<Vec<uuid::Uuid>>>| acked.lock().unwrap().len();
    wait_for_async("some enqueues before the restart", DEADLINE, || {
        let n = count(&acked);
        async move { (n >= 200).then_some(()) }
    })
    .await;

    let mut pg = pg;
    let before = count(&acked);
    tokio::task::block_in_place(|| {
        pg.kill();
        pg.restart();
    });
    wait_for_async(
        "enqueues to be acknowledged again after the restart",
        DEADLINE,
        || {
            let n = count(&acked);
            async move { (n >= before + 200).then_some(()) }
        },
    )
    .await;
    stop_enqueue.cancel();
    for p in producers {
        p.await.unwrap();
    }

    let acked = acked.lock().unwrap().clone();
    wait_for_async(
        "every acknowledged job to succeed",
        Duration::from_secs(30),
        || {
            let (pool, acked) = (pool.clone(), acked.clone());
            async move {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM sluice.jobs WHERE id = ANY($1) AND state = 'succeeded'",
                )
                .bind(&acked)
                .fetch_one(&pool)
                .await
                .ok()?;
                (n == acked.len() as i64).then_some(())
            }
        },
    )
    .await;
    shutdown.cancel();
    worker.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_a_hanging_job_back_after_the_grace_period() {
    let (pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "term").await;
    let seen = Seen::default();
    let url = start_handler(seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sidecar.yaml");
    std::fs::write(
        &config,
        format!(
            "version: 1\nqueue:\n  queues: [term]\n  handler: {{url: \"{url}\"}}\n  \
             worker: {{shutdownGrace: 300ms, metricsListen: \"127.0.0.1:0\"}}\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .args(["worker", "--config"])
        .arg(&config)
        .env("SLUICE_DATABASE_URL", pg.url())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let id = store
        .enqueue("term", &NewJob::new("hang-first", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    wait_for_async("the job to reach the handler", DEADLINE, || {
        let n = seen.calls(id).len();
        async move { (n == 1).then_some(()) }
    })
    .await;
    let t0 = std::time::Instant::now();
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "exited in {:?}",
        t0.elapsed()
    );
    let job = store.get(id).await.unwrap().unwrap();
    assert_eq!(
        (job.state.as_str(), job.attempt, job.lease_owner),
        ("pending", 0, None),
        "handed back at once, the attempt not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrate_command_prepares_the_schema_and_can_run_again() {
    let pg = tokio::task::spawn_blocking(sluice_testsupport::PgServer::start)
        .await
        .unwrap();
    for _ in 0..2 {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
            .arg("migrate")
            .env("SLUICE_DATABASE_URL", pg.url())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    assert_eq!(
        pg.psql("SELECT count(*) FROM sluice._sqlx_migrations"),
        sluice_queue::schema::latest_version().to_string()
    );
    assert_eq!(pg.psql("SELECT to_regclass('sluice.jobs') IS NOT NULL"), "t");
}
