//! Queue benchmark (a benchmark, not a test): `cargo bench -p sluice-sidecar --bench queue [-- --short]`.
//!
//! One throwaway PostgreSQL, one run, five measurements (method in BENCHMARKS.md):
//! 1. burn-down of N pre-inserted no-op jobs by (a) the raw SQL limit — pgbench clients claiming and
//!    completing batches of 100 with SKIP LOCKED, (b) Sluice's in-process worker, (c) the sidecar worker
//!    binary dispatching to a no-op HTTP handler, (d) graphile-worker (npm, installed into a temp dir at
//!    bench time) with its documented batching (`localQueue`, `completeJobBatchDelay: 0`);
//! 2. bulk enqueue rows/s (`sluice.enqueue_many`, 5,000 rows per statement);
//! 3. enqueue latency p50/p99 at 1,000 jobs/s (single `sluice.enqueue_job` calls, open loop);
//! 4. pickup latency p50/p99 on an idle queue (enqueue → handler start, NOTIFY wake-up).
//!
//! `--short` (or SLUICE_BENCH_SHORT=1) shrinks every size ~10× to prove the harness works.

use std::{
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{Router, routing::post};
use sluice_sidecar::queue::{
    ClaimedJob, Handler, NewJob, Outcome, QueueSettings, QueueStore, Worker, WorkerOptions, schema,
};
use sluice_testsupport::PgServer;
use sqlx::{PgPool, postgres::PgPoolOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

struct Sizes {
    burn_down: usize,
    bulk: usize,
    latency_secs: u64,
    pickups: usize,
}

#[tokio::main]
async fn main() {
    let short = std::env::args().any(|a| a == "--short") || std::env::var_os("SLUICE_BENCH_SHORT").is_some();
    let sizes = if short {
        Sizes {
            burn_down: 10_000,
            bulk: 20_000,
            latency_secs: 2,
            pickups: 30,
        }
    } else {
        Sizes {
            burn_down: 100_000,
            bulk: 200_000,
            latency_secs: 10,
            pickups: 200,
        }
    };
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(32)
        .connect(&pg.url())
        .await
        .unwrap();
    schema::migrate(&pool).await.unwrap();
    let store = QueueStore::new(pool.clone());
    println!(
        "# Sluice queue benchmark ({})",
        if short { "short" } else { "full" }
    );
    println!("machine: {} cores; {}", cores(), pg_version(&pool).await);
    println!();
    println!("| measurement | result |");
    println!("|---|---|");

    let raw = raw_sql_limit(&pg, &store, sizes.burn_down).await;
    println!("| burn-down, raw SQL limit (pgbench, 4 clients, batches of 100) | {raw:.0} jobs/s |");
    let inproc = in_process(&store, sizes.burn_down).await;
    println!(
        "| burn-down, in-process worker (no-op) | {inproc:.0} jobs/s ({:.2}× raw) |",
        inproc / raw
    );
    let sidecar = sidecar_worker(&pg, &store, sizes.burn_down).await;
    println!("| burn-down, sidecar worker → no-op HTTP handler | {sidecar:.0} jobs/s |");
    match graphile(&pg, sizes.burn_down).await {
        Ok(g) => {
            println!("| burn-down, graphile-worker (localQueue 500, batched completes) | {g:.0} jobs/s |")
        }
        Err(e) => println!("| burn-down, graphile-worker | not measured: {e} |"),
    }
    let bulk = bulk_enqueue(&store, sizes.bulk).await;
    println!("| bulk enqueue (5,000 rows per statement) | {bulk:.0} rows/s |");
    let (p50, p99) = enqueue_latency(&store, sizes.latency_secs).await;
    println!("| enqueue latency at 1,000 jobs/s | p50 {p50:.2} ms, p99 {p99:.2} ms |");
    let (p50, p99) = pickup_latency(&store, sizes.pickups).await;
    println!("| pickup latency, idle queue | p50 {p50:.2} ms, p99 {p99:.2} ms |");
    drop(pool);
    drop(pg);
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

async fn pg_version(pool: &PgPool) -> String {
    sqlx::query_scalar::<_, String>("SELECT version()")
        .fetch_one(pool)
        .await
        .unwrap_or_default()
}

async fn fill(store: &QueueStore, queue: &str, n: usize) {
    store.upsert_queue(&QueueSettings::defaults(queue)).await.unwrap();
    let chunk: Vec<NewJob> = (0..5000)
        .map(|i| NewJob::new("noop", serde_json::json!({ "i": i })))
        .collect();
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        store.enqueue_many(queue, &chunk[..k]).await.unwrap();
        left -= k;
    }
    sqlx::query("VACUUM ANALYZE sluice.jobs")
        .execute(store.pool())
        .await
        .unwrap();
}

/// Waits until no job of `queue` is waiting or running. The probe is an EXISTS over the partial indexes,
/// so polling costs the database next to nothing (a count would steal CPU from the workers measured).
async fn wait_drained(store: &QueueStore, queue: &str) {
    loop {
        let busy: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sluice.jobs WHERE queue = $1 AND state IN ('pending', 'retrying')) \
                 OR EXISTS (SELECT 1 FROM sluice.jobs WHERE queue = $1 AND state = 'running')",
        )
        .bind(queue)
        .fetch_one(store.pool())
        .await
        .unwrap();
        if !busy {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn pg_bin(name: &str) -> String {
    [
        "/usr/lib/postgresql/15/bin",
        "/usr/lib/postgresql/16/bin",
        "/usr/lib/postgresql/17/bin",
        "/usr/bin",
    ]
    .iter()
    .map(|d| format!("{d}/{name}"))
    .find(|p| std::path::Path::new(p).exists())
    .unwrap_or_else(|| name.to_owned())
}

/// pgbench clients each claim 100 jobs and complete them, one transaction per statement, as a worker
/// with a no-op handler would: the most the table and statements allow without any worker overhead.
async fn raw_sql_limit(pg: &PgServer, store: &QueueStore, n: usize) -> f64 {
    fill(store, "raw", n).await;
    let script = std::env::temp_dir().join(format!("sluice-bench-{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "WITH picked AS (SELECT id FROM sluice.jobs WHERE queue = 'raw' AND state IN ('pending', 'retrying') \
         AND run_at <= now() ORDER BY priority DESC, run_at LIMIT 100 FOR UPDATE SKIP LOCKED) \
         UPDATE sluice.jobs j SET state = 'running', attempt = j.attempt + 1, lease_owner = 'pgbench-' || :client_id, \
         lease_expires_at = now() + interval '30 seconds', started_at = now() FROM picked WHERE j.id = picked.id;\n\
         UPDATE sluice.jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL \
         WHERE queue = 'raw' AND state = 'running' AND lease_owner = 'pgbench-' || :client_id;\n",
    )
    .unwrap();
    let clients = 4;
    let per_client = n.div_ceil(100 * clients);
    let t0 = Instant::now();
    let out = Command::new(pg_bin("pgbench"))
        .args(["-n", "-M", "prepared", "-c", &clients.to_string(), "-j", "2"])
        .args(["-t", &per_client.to_string(), "-f"])
        .arg(&script)
        .arg(pg.url())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run pgbench");
    let secs = t0.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&script);
    assert!(
        out.status.success(),
        "pgbench: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_drained(store, "raw").await;
    n as f64 / secs
}

struct Noop;
impl Handler for Noop {
    async fn handle(&self, _job: ClaimedJob, _cancel: CancellationToken) -> Outcome {
        Outcome::Succeeded
    }
}

async fn in_process(store: &QueueStore, n: usize) -> f64 {
    fill(store, "inproc", n).await;
    let shutdown = CancellationToken::new();
    let opts = WorkerOptions {
        concurrency: 400,
        claim_batch: 200,
        ..WorkerOptions::new(["inproc"])
    };
    let t0 = Instant::now();
    let worker = Worker::new(store.clone(), Noop, opts);
    let metrics = worker.metrics();
    let w = tokio::spawn(worker.run(shutdown.clone()));
    wait_drained(store, "inproc").await;
    let secs = t0.elapsed().as_secs_f64();
    shutdown.cancel();
    w.await.unwrap().unwrap();
    let text = metrics.render();
    let metric = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    eprintln!(
        "in-process: {:.0} claims, {:.1} jobs per claim",
        metric("sluice_claim_batch_size_count"),
        metric("sluice_claim_batch_size_sum") / metric("sluice_claim_batch_size_count")
    );
    n as f64 / secs
}

async fn sidecar_worker(pg: &PgServer, store: &QueueStore, n: usize) -> f64 {
    fill(store, "sidecar", n).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jobs", listener.local_addr().unwrap());
    let app = Router::new().route("/jobs", post(|| async { "" }));
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let t0 = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .arg("worker")
        .env("SLUICE_DATABASE_URL", pg.url())
        .env("SLUICE_QUEUES", "sidecar")
        .env("SLUICE_HANDLER_URL", &url)
        .env("SLUICE_WORKER_CONCURRENCY", "256")
        .env("SLUICE_METRICS_LISTEN", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start sluice-sidecar worker");
    wait_drained(store, "sidecar").await;
    let secs = t0.elapsed().as_secs_f64();
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    server.abort();
    n as f64 / secs
}

const GRAPHILE_SCRIPT: &str = r#"
const { run, makeWorkerUtils } = require("graphile-worker");
const { Pool } = require("pg");
(async () => {
  const connectionString = process.env.DATABASE_URL;
  const n = parseInt(process.env.JOBS, 10);
  const utils = await makeWorkerUtils({ connectionString });
  await utils.migrate();
  await utils.release();
  const pool = new Pool({ connectionString });
  await pool.query("select graphile_worker.add_job('noop', json_build_object('i', i)) from generate_series(1, $1) i", [n]);
  await pool.query("vacuum analyze");
  const t0 = process.hrtime.bigint();
  const runner = await run({
    noHandleSignals: true,
    taskList: { noop: async () => {} },
    preset: { worker: { connectionString, concurrentJobs: 24, maxPoolSize: 25, pollInterval: 1000,
                        localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
  });
  for (;;) {
    const { rows } = await pool.query("select exists (select 1 from graphile_worker.jobs) as busy");
    if (!rows[0].busy) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await runner.stop();
  await pool.end();
  console.log(JSON.stringify({ jobsPerSec: n / secs }));
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// graphile-worker from npm, installed into a temp dir now (needs `npm` and network access).
async fn graphile(pg: &PgServer, n: usize) -> Result<f64, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let install = Command::new("npm")
        .args([
            "install",
            "--silent",
            "--no-audit",
            "--no-fund",
            "graphile-worker@0.16",
            "pg",
        ])
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("npm: {e}"))?;
    if !install.status.success() {
        return Err(format!(
            "npm install failed: {}",
            String::from_utf8_lossy(&install.stderr)
        ));
    }
    std::fs::write(dir.path().join("bench.js"), GRAPHILE_SCRIPT).map_err(|e| e.to_string())?;
    let db = pg.url_for("graphile");
    Command::new(pg_bin("psql"))
        .args(["-q", "-d", &pg.url(), "-c", "CREATE DATABASE graphile"])
        .status()
        .map_err(|e| e.to_string())?;
    let out = Command::new("node")
        .arg("bench.js")
        .current_dir(dir.path())
        .env("DATABASE_URL", db)
        .env("JOBS", n.to_string())
        .output()
        .map_err(|e| format!("node: {e}"))?;
    if !out.status.success() {
        return Err(format!("node failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    // graphile-worker logs to stdout too; the result is the last line.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last).map_err(|e| format!("{e}: {stdout}"))?;
    v["jobsPerSec"].as_f64().ok_or_else(|| "no result".into())
}

async fn bulk_enqueue(store: &QueueStore, n: usize) -> f64 {
    store
        .upsert_queue(&QueueSettings::defaults("bulk"))
        .await
        .unwrap();
    let chunk: Vec<NewJob> = (0..5000)
        .map(|i| NewJob::new("noop", serde_json::json!({ "i": i })))
        .collect();
    let t0 = Instant::now();
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len());
        store.enqueue_many("bulk", &chunk[..k]).await.unwrap();
        left -= k;
    }
    n as f64 / t0.elapsed().as_secs_f64()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Open loop: one enqueue started every millisecond regardless of how long earlier ones take.
async fn enqueue_latency(store: &QueueStore, secs: u64) -> (f64, f64) {
    store
        .upsert_queue(&QueueSettings::defaults("latency"))
        .await
        .unwrap();
    // Warm the pool up first: opening connections is not what this measures.
    let warm_job = NewJob::new("noop", serde_json::json!({"x": 1}));
    for _ in 0..4 {
        let warm = (0..32).map(|_| store.enqueue("latency", &warm_job));
        for r in futures::future::join_all(warm).await {
            r.unwrap();
        }
    }
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        tick.tick().await;
        let (store, tx) = (store.clone(), tx.clone());
        tokio::spawn(async move {
            let t0 = Instant::now();
            store
                .enqueue("latency", &NewJob::new("noop", serde_json::json!({"x": 1})))
                .await
                .unwrap();
            let _ = tx.send(t0.elapsed().as_secs_f64() * 1000.0);
        });
    }
    drop(tx);
    let mut v = Vec::new();
    while let Some(ms) = rx.recv().await {
        v.push(ms);
    }
    v.sort_by(f64::total_cmp);
    (percentile(&v, 0.5), percentile(&v, 0.99))
}

struct Signal(mpsc::UnboundedSender<Instant>);
impl Handler for Signal {
    async fn handle(&self, _job: ClaimedJob, _cancel: CancellationToken) -> Outcome {
        let _ = self.0.send(Instant::now());
        Outcome::Succeeded
    }
}

/// Enqueue one job into an idle queue (the worker's poll has backed off to 2 s, so NOTIFY is what wakes
/// it) and time until its handler starts.
async fn pickup_latency(store: &QueueStore, n: usize) -> (f64, f64) {
    store
        .upsert_queue(&QueueSettings::defaults("pickup"))
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(
        Worker::new(store.clone(), Signal(tx), WorkerOptions::new(["pickup"])).run(shutdown.clone()),
    );
    let store = Arc::new(store.clone());
    tokio::time::sleep(Duration::from_millis(300)).await; // let the listener connect
    let mut v = Vec::new();
    for _ in 0..n {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        store
            .enqueue("pickup", &NewJob::new("noop", serde_json::json!({})))
            .await
            .unwrap();
        let started = rx.recv().await.unwrap();
        v.push((started - t0).as_secs_f64() * 1000.0);
    }
    shutdown.cancel();
    w.await.unwrap().unwrap();
    v.sort_by(f64::total_cmp);
    (percentile(&v, 0.5), percentile(&v, 0.99))
}
