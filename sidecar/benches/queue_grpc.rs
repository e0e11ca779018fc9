//! gRPC worker benchmark (a benchmark, not a test): `cargo bench -p sluice-sidecar --bench queue_grpc`.
//!
//! One throwaway PostgreSQL; three rounds, each burning down N pre-inserted no-op jobs first at the raw
//! SQL limit (pgbench clients claiming and completing batches of 100 with the worker's claim statement,
//! as in the queue benchmark) and then through the sidecar's gRPC worker API (the `sluice-sidecar worker`
//! binary with `SLUICE_GRPC_LISTEN`, one stream from a no-op worker in this process that answers each job
//! `succeeded` at once). The medians go into the section between `<!-- bench:queue-grpc:start -->` and
//! `<!-- bench:queue-grpc:end -->` of BENCHMARKS.md. `-- --short` runs 10,000 jobs and only prints.

#[allow(dead_code)] // shared by the benchmarks; this one uses part of it
mod queue_setup;
mod report;

use queue_setup::{cpu_secs, fill, pgbench_claim_complete, wait_drained};

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use sluice_queue::{QueueStore, schema};
use sluice_sidecar::queue::grpc::proto::{
    self, SidecarMessage, WorkerMessage, outcome, sidecar_message::Msg as Out, worker_client::WorkerClient,
    worker_message::Msg as In,
};
use sluice_testsupport::PgServer;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const START: &str = "<!-- bench:queue-grpc:start -->";
const END: &str = "<!-- bench:queue-grpc:end -->";
/// Slots of the no-op worker's stream (the sidecar engine's concurrency).
const SLOTS: u32 = 512;
const ROUNDS: usize = 3;

#[tokio::main]
async fn main() {
    let short = std::env::args().any(|a| a == "--short");
    let n = if short { 10_000 } else { 100_000 };
    let started = chrono::Utc::now();
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect(&pg.url())
        .await
        .unwrap();
    schema::migrate(&pool).await.unwrap();
    let store = QueueStore::new(pool.clone());
    let pg_version: String = sqlx::query_scalar("SELECT version()")
        .fetch_one(&pool)
        .await
        .unwrap();

    let (mut raw, mut grpc) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let r = raw_sql_limit(&pg, &store, &format!("raw{round}"), n).await;
        eprintln!("round {round}: raw SQL limit {:.0} jobs/s", r.0);
        raw.push(r);
        let g = grpc_worker(&pg, &store, &format!("grpc{round}"), n).await;
        eprintln!("round {round}: gRPC no-op worker {:.0} jobs/s ({})", g.0, g.1);
        grpc.push(g);
    }
    let median = |v: &mut Vec<(f64, String)>| {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v[v.len() / 2].clone()
    };
    let (raw_m, grpc_m) = (median(&mut raw), median(&mut grpc));
    let all = |v: &[(f64, String)]| {
        v.iter()
            .map(|(r, _)| format!("{r:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let section = format!(
        "{START}\n## Job queue: gRPC worker API\n\n\
         Run: `cargo bench -p sluice-sidecar --bench queue_grpc` at {} UTC, {n} jobs per burn-down, {ROUNDS} interleaved rounds (raw, then gRPC, per round); medians.\n\n\
         Machine: {}, {} cores (shared: other builds may run; load average at the end {}). Versions: {}; {}; sluice-sidecar {} ({} profile).\n\n\
         | measurement | result (median) | rounds | where the time went (median round) |\n|---|---:|---|---|\n\
         | burn-down, raw SQL limit (pgbench, 4 clients, batches of 100) | {:.0} jobs/s | {} | {} |\n\
         | burn-down, sidecar gRPC worker API → one no-op worker stream, {SLOTS} slots | {:.0} jobs/s ({:.2}× the raw SQL limit) | {} | {} |\n\n\
         Method: the raw SQL limit is the queue benchmark's (above). The gRPC line starts `sluice-sidecar worker` with \
         `SLUICE_GRPC_LISTEN` (other settings default: claim batch 100, one claim loop per stream, the batch completer), \
         opens one `sluice.v1.Worker` stream from the bench process with {SLOTS} slots and answers every pushed job \
         `succeeded` at once; timed from `subscribed` until no job of the queue is waiting or running (the same \
         `EXISTS` probe, every 10 ms). Same throwaway PostgreSQL, same 2 cores for PostgreSQL, the sidecar and the worker.\n\
         {END}\n",
        started.format("%Y-%m-%d %H:%M"),
        report::cpu_model(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        report::load_average(),
        report::version_of("rustc", &["--version"]),
        pg_version.split(" on ").next().unwrap_or(&pg_version),
        env!("CARGO_PKG_VERSION"),
        if cfg!(debug_assertions) { "dev" } else { "release" },
        raw_m.0,
        all(&raw),
        raw_m.1,
        grpc_m.0,
        grpc_m.0 / raw_m.0,
        all(&grpc),
        grpc_m.1,
    );
    println!("{section}");
    if !short {
        report::write_section(START, END, &section);
    }
}

/// The queue benchmark's raw SQL limit: pgbench clients claim 100 jobs with the worker's claim statement
/// and complete them, one autocommit statement each.
async fn raw_sql_limit(pg: &PgServer, store: &QueueStore, queue: &str, n: usize) -> (f64, String) {
    fill(store, queue, n).await;
    let secs = pgbench_claim_complete(pg, queue, n);
    wait_drained(store, queue).await;
    (n as f64 / secs, format!("{secs:.1} s wall"))
}

/// The sidecar in gRPC mode and one no-op worker stream.
async fn grpc_worker(pg: &PgServer, store: &QueueStore, queue: &str, n: usize) -> (f64, String) {
    fill(store, queue, n).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let bin = std::env::var("SLUICE_BENCH_SIDECAR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice-sidecar").to_owned());
    let mut child = Command::new(bin)
        .arg("worker")
        .env("SLUICE_DATABASE_URL", pg.url())
        .env("SLUICE_QUEUES", queue)
        .env("SLUICE_GRPC_LISTEN", format!("127.0.0.1:{port}"))
        .env("SLUICE_METRICS_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start sluice-sidecar worker");
    let channel = loop {
        match tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
        {
            Ok(c) => break c,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let (tx, rx) = mpsc::channel::<WorkerMessage>(4096);
    tx.send(WorkerMessage {
        msg: Some(In::Subscribe(proto::Subscribe {
            queues: vec![queue.to_owned()],
            kinds: vec![],
            slots: SLOTS,
            worker_name: "bench".into(),
        })),
    })
    .await
    .unwrap();
    let mut stream = WorkerClient::new(channel)
        .work(ReceiverStream::new(rx))
        .await
        .expect("subscribe")
        .into_inner();
    let first: SidecarMessage = stream.message().await.unwrap().unwrap();
    assert!(matches!(first.msg, Some(Out::Subscribed(_))));
    let sidecar_cpu = cpu_secs(child.id());
    let t0 = Instant::now();
    let worker = tokio::spawn(async move {
        while let Ok(Some(m)) = stream.message().await {
            if let Some(Out::Job(j)) = m.msg {
                let done = WorkerMessage {
                    msg: Some(In::Outcome(proto::Outcome {
                        job_id: j.job_id,
                        attempt: j.attempt,
                        result: Some(outcome::Result::Succeeded(proto::Succeeded {})),
                    })),
                };
                if tx.send(done).await.is_err() {
                    return;
                }
            }
        }
    });
    wait_drained(store, queue).await;
    let secs = t0.elapsed().as_secs_f64();
    let used = cpu_secs(child.id()) - sidecar_cpu;
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    worker.abort();
    (
        n as f64 / secs,
        format!("{secs:.1} s wall; sidecar CPU {used:.1} s"),
    )
}
