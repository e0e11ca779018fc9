//! Queue benchmark (a benchmark, not a test): `cargo bench -p sluice-sidecar --bench queue`.
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
//! A full run rewrites the section between `<!-- bench:queue:start -->` and `<!-- bench:queue:end -->` in
//! BENCHMARKS.md. `-- --short` shrinks every size ~10× and `-- --only raw,inproc,...` runs a subset; both
//! only print, leaving BENCHMARKS.md alone. `SLUICE_BENCH_PICKUP_TRACE=1` prints every pickup over 10 ms.

#[allow(dead_code)] // shared by the benchmarks; this one uses part of it
mod proxy_setup;
#[allow(dead_code)] // shared by the benchmarks; this one uses part of it
mod queue_setup;
mod report;

use queue_setup::{
    assert_drained, cpu_secs, fill, pg_bin, pg_cpu, pgbench_claim_complete, succeeded_in, wait_counted,
    wait_drained,
};

use std::{
    fmt::Write as _,
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, routing::post};
use sluice_queue::{ClaimedJob, NewJob, QueueSettings, QueueStore, schema};
use sluice_sidecar::queue::{Handler, Outcome, Worker, WorkerOptions};
use sluice_testsupport::PgServer;
use sqlx::{PgPool, postgres::PgPoolOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

const START: &str = "<!-- bench:queue:start -->";
const END: &str = "<!-- bench:queue:end -->";

/// graphile-worker's release with the batching options (`localQueue`, `completeJobBatchDelay`; 0.16 and
/// older ignore them silently).
const GRAPHILE_VERSION: &str = "0.18.0";

/// The in-process worker's settings in the burn-down.
const INPROC_CONCURRENCY: usize = 1000;
const INPROC_CLAIM_BATCH: u32 = 250;
const INPROC_CLAIMERS: usize = 2;
/// The sidecar worker's concurrency in the burn-down (SLUICE_WORKER_CONCURRENCY); other settings are
/// the worker's defaults.
const SIDECAR_CONCURRENCY: usize = 512;
/// The sidecar worker's default concurrency, measured on its own.
const DEFAULT_CONCURRENCY: usize = 16;
/// Jobs of the smaller cold-start burn-downs of the sidecar worker.
const SMALL_BURN_DOWN: usize = 20_000;

struct Sizes {
    burn_down: usize,
    small: usize,
    bulk: usize,
    latency_secs: u64,
    pickups: usize,
}

/// One burn-down: jobs/s and what the run says about where the time went.
struct BurnDown {
    jobs_per_sec: f64,
    detail: String,
}

#[derive(Default)]
struct Results {
    raw: Option<BurnDown>,
    inproc: Option<BurnDown>,
    sidecar: Option<BurnDown>,
    sidecar_small: Option<BurnDown>,
    sidecar_default: Option<(BurnDown, Overhead)>,
    graphile: Option<Result<BurnDown, String>>,
    bulk: Option<f64>,
    enqueue: Option<(f64, f64)>,
    pickup: Option<Pickup>,
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let short = args.iter().any(|a| a == "--short") || std::env::var_os("SLUICE_BENCH_SHORT").is_some();
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_owned).collect());
    let on = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    let sizes = if short {
        Sizes {
            burn_down: 10_000,
            small: 5_000,
            bulk: 20_000,
            latency_secs: 2,
            pickups: 30,
        }
    } else {
        Sizes {
            burn_down: 100_000,
            small: SMALL_BURN_DOWN,
            bulk: 200_000,
            latency_secs: 10,
            pickups: 200,
        }
    };
    let started = chrono::Utc::now();
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(32)
        .connect(&pg.url())
        .await
        .unwrap();
    schema::migrate(&pool).await.unwrap();
    let mut pg = pg;
    let mut pool = pool;
    if statements_diagnostics() {
        // Diagnostics only: pg_stat_statements needs a restart and costs a little on every statement.
        sqlx::query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
        tokio::task::block_in_place(|| pg.restart());
        pool = PgPoolOptions::new()
            .max_connections(32)
            .connect(&pg.url())
            .await
            .unwrap();
        sqlx::query("CREATE EXTENSION pg_stat_statements")
            .execute(&pool)
            .await
            .unwrap();
    }
    let store = QueueStore::new(pool.clone());
    let pg_version = pg_version(&pool).await;
    eprintln!("{pg_version}");

    let mut r = Results::default();
    if on("raw") {
        let b = raw_sql_limit(&pg, &store, sizes.burn_down).await;
        print_statements(&store, "raw").await;
        eprintln!("raw SQL limit: {:.0} jobs/s; {}", b.jobs_per_sec, b.detail);
        r.raw = Some(b);
    }
    if on("inproc") {
        let b = in_process(&pg, &store, sizes.burn_down).await;
        print_statements(&store, "in-process").await;
        eprintln!("in-process: {:.0} jobs/s; {}", b.jobs_per_sec, b.detail);
        r.inproc = Some(b);
    }
    if on("sidecar16") {
        let (b, o) = sidecar_worker(&pg, &store, "sidecar16", sizes.small, DEFAULT_CONCURRENCY).await;
        print_statements(&store, "sidecar16").await;
        eprintln!(
            "sidecar at 16: {:.0} jobs/s; {}; {}",
            b.jobs_per_sec,
            b.detail,
            o.render()
        );
        r.sidecar_default = Some((b, o));
    }
    if on("sidecar20k") {
        let concurrency = env_or("SLUICE_BENCH_SIDECAR_CONCURRENCY", SIDECAR_CONCURRENCY);
        let (b, _) = sidecar_worker(&pg, &store, "sidecar20k", sizes.small, concurrency).await;
        eprintln!(
            "sidecar, {} jobs: {:.0} jobs/s; {}",
            sizes.small, b.jobs_per_sec, b.detail
        );
        r.sidecar_small = Some(b);
    }
    if on("sidecar") {
        let concurrency = env_or("SLUICE_BENCH_SIDECAR_CONCURRENCY", SIDECAR_CONCURRENCY);
        let (b, _) = sidecar_worker(&pg, &store, "sidecar", sizes.burn_down, concurrency).await;
        print_statements(&store, "sidecar").await;
        eprintln!("sidecar: {:.0} jobs/s; {}", b.jobs_per_sec, b.detail);
        r.sidecar = Some(b);
    }
    if on("graphile") {
        let g = graphile(&pg, sizes.burn_down).await;
        match &g {
            Ok(b) => eprintln!("graphile-worker: {:.0} jobs/s; {}", b.jobs_per_sec, b.detail),
            Err(e) => eprintln!("graphile-worker not measured: {e}"),
        }
        r.graphile = Some(g);
    }
    if on("bulk") {
        let b = bulk_enqueue(&store, sizes.bulk).await;
        eprintln!("bulk enqueue: {b:.0} rows/s");
        r.bulk = Some(b);
    }
    if on("latency") {
        let l = enqueue_latency(&store, sizes.latency_secs).await;
        eprintln!("enqueue latency: p50 {:.2} ms, p99 {:.2} ms", l.0, l.1);
        r.enqueue = Some(l);
    }
    if on("pickup") {
        let l = pickup_latency(&store, sizes.pickups).await;
        eprintln!(
            "pickup latency: p50 {:.2} ms, p99 {:.2} ms (the enqueue call: p50 {:.2} ms, p99 {:.2} ms; \
             its return → handler start: p50 {:.2} ms, p99 {:.2} ms)",
            l.p50, l.p99, l.enqueue_p50, l.enqueue_p99, l.after_p50, l.after_p99
        );
        r.pickup = Some(l);
    }
    drop(pool);
    drop(pg);
    let section = render(&r, &sizes, short, started, &pg_version);
    println!("{section}");
    if short || only.is_some() {
        eprintln!("--short/--only: BENCHMARKS.md left as it is");
    } else {
        report::write_section(START, END, &section);
    }
}

fn render(
    r: &Results,
    sizes: &Sizes,
    short: bool,
    started: chrono::DateTime<chrono::Utc>,
    pg_version: &str,
) -> String {
    let na = || "not run".to_owned();
    let rate = |b: &Option<BurnDown>| {
        b.as_ref()
            .map(|b| format!("{:.0} jobs/s", b.jobs_per_sec))
            .unwrap_or_else(na)
    };
    let raw = r.raw.as_ref().map(|b| b.jobs_per_sec).unwrap_or(f64::NAN);
    let graphile = match &r.graphile {
        Some(Ok(b)) => b.jobs_per_sec,
        _ => f64::NAN,
    };
    let inproc = r.inproc.as_ref().map(|b| b.jobs_per_sec).unwrap_or(f64::NAN);
    let sidecar = r.sidecar.as_ref().map(|b| b.jobs_per_sec).unwrap_or(f64::NAN);
    let sidecar_small = r
        .sidecar_small
        .as_ref()
        .map(|b| b.jobs_per_sec)
        .unwrap_or(f64::NAN);
    let sidecar_default = r
        .sidecar_default
        .as_ref()
        .map(|(b, _)| b.jobs_per_sec)
        .unwrap_or(f64::NAN);
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    let load = report::load_average();
    let cpu = report::cpu_model();

    let mut out = String::new();
    let _ = writeln!(out, "{START}");
    let _ = writeln!(out, "## Job queue\n");
    let _ = writeln!(
        out,
        "Run: `cargo bench -p sluice-sidecar --bench queue{}` at {} UTC, {} jobs per burn-down.\n",
        if short { " -- --short" } else { "" },
        started.format("%Y-%m-%d %H:%M"),
        sizes.burn_down
    );
    let _ = writeln!(
        out,
        "Machine: {cpu}, {} cores (shared: other builds may run; load average at the end {}). \
         Versions: {}; {}; node {}; graphile-worker {GRAPHILE_VERSION}; sluice-sidecar {} (release profile).\n",
        cores(),
        load,
        report::version_of("rustc", &["-V"]),
        pg_version.split(" on ").next().unwrap_or(pg_version),
        report::version_of("node", &["--version"]),
        env!("CARGO_PKG_VERSION"),
    );
    let _ = writeln!(out, "| measurement | result | where the time went |");
    let _ = writeln!(out, "|---|---:|---|");
    let detail = |b: &Option<BurnDown>| b.as_ref().map(|b| b.detail.clone()).unwrap_or_default();
    let _ = writeln!(
        out,
        "| burn-down, raw SQL limit (pgbench, 4 clients, batches of 100) | {} | {} |",
        rate(&r.raw),
        detail(&r.raw)
    );
    let _ = writeln!(
        out,
        "| burn-down, in-process worker (no-op handler) | {} | {} |",
        rate(&r.inproc),
        detail(&r.inproc)
    );
    let _ = writeln!(
        out,
        "| burn-down, sidecar worker → no-op HTTP handler, default concurrency {DEFAULT_CONCURRENCY}, {} jobs | {} | {} |",
        sizes.small,
        r.sidecar_default
            .as_ref()
            .map(|(b, _)| format!("{:.0} jobs/s", b.jobs_per_sec))
            .unwrap_or_else(na),
        r.sidecar_default
            .as_ref()
            .map(|(b, o)| format!("{}; {}", b.detail, o.render()))
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "| burn-down, sidecar worker → no-op HTTP handler, concurrency {SIDECAR_CONCURRENCY}, {} jobs | {} | {} |",
        sizes.small,
        rate(&r.sidecar_small),
        detail(&r.sidecar_small)
    );
    let _ = writeln!(
        out,
        "| burn-down, sidecar worker → no-op HTTP handler, concurrency {SIDECAR_CONCURRENCY}, {} jobs | {} | {} |",
        sizes.burn_down,
        rate(&r.sidecar),
        detail(&r.sidecar)
    );
    let _ = writeln!(
        out,
        "| burn-down, graphile-worker {GRAPHILE_VERSION} (localQueue 500, batched completes) | {} | {} |",
        match &r.graphile {
            Some(Ok(b)) => format!("{:.0} jobs/s", b.jobs_per_sec),
            Some(Err(e)) => format!("not measured: {e}"),
            None => na(),
        },
        match &r.graphile {
            Some(Ok(b)) => b.detail.clone(),
            _ => String::new(),
        }
    );
    let _ = writeln!(
        out,
        "| bulk enqueue (5,000 rows per statement) | {} | |",
        r.bulk.map(|b| format!("{b:.0} rows/s")).unwrap_or_else(na)
    );
    let _ = writeln!(
        out,
        "| enqueue latency at 1,000 jobs/s | {} | |",
        r.enqueue
            .map(|(a, b)| format!("p50 {a:.2} ms, p99 {b:.2} ms"))
            .unwrap_or_else(na)
    );
    let _ = writeln!(
        out,
        "| pickup latency, idle queue | {} | {} |",
        r.pickup
            .map(|l| format!("p50 {:.2} ms, p99 {:.2} ms", l.p50, l.p99))
            .unwrap_or_else(na),
        r.pickup
            .map(|l| format!(
                "the enqueue call: p50 {:.2} ms, p99 {:.2} ms; its return → handler start: \
                 p50 {:.2} ms, p99 {:.2} ms",
                l.enqueue_p50, l.enqueue_p99, l.after_p50, l.after_p99
            ))
            .unwrap_or_default()
    );
    let _ = writeln!(out, "\nTargets (2 cores):\n");
    let _ = writeln!(out, "| target | this run | |");
    let _ = writeln!(out, "|---|---:|---|");
    let _ = writeln!(
        out,
        "| in-process worker ≥ 0.85× the raw SQL limit | {:.2}× | {} |",
        inproc / raw,
        verdict(inproc / raw >= 0.85)
    );
    let _ = writeln!(
        out,
        "| in-process worker ≥ 1.5× graphile-worker | {:.2}× | {} |",
        inproc / graphile,
        verdict(inproc / graphile >= 1.5)
    );
    let _ = writeln!(
        out,
        "| sidecar worker at the default concurrency ≥ 6,000 jobs/s | {sidecar_default:.0} jobs/s | {} |",
        verdict(sidecar_default >= 6_000.0)
    );
    let _ = writeln!(
        out,
        "| sidecar worker at {SIDECAR_CONCURRENCY} ≥ 0.5× the raw SQL limit, {} jobs | {:.2}× | {} |",
        sizes.small,
        sidecar_small / raw,
        verdict(sidecar_small / raw >= 0.5)
    );
    let _ = writeln!(
        out,
        "| sidecar worker at {SIDECAR_CONCURRENCY} ≥ 0.5× the raw SQL limit, {} jobs | {:.2}× | {} |",
        sizes.burn_down,
        sidecar / raw,
        verdict(sidecar / raw >= 0.5)
    );
    let p99 = r.enqueue.map(|e| e.1).unwrap_or(f64::NAN);
    let _ = writeln!(
        out,
        "| enqueue p99 < 5 ms at 1,000 jobs/s | {p99:.2} ms | {} |",
        verdict(p99 < 5.0)
    );
    let pickup99 = r.pickup.map(|e| e.p99).unwrap_or(f64::NAN);
    let _ = writeln!(
        out,
        "| idle pickup p99 < 10 ms | {pickup99:.2} ms | {} |",
        verdict(pickup99 < 10.0)
    );
    let _ = writeln!(out, "\n{METHOD}");
    let _ = writeln!(out, "{END}");
    out
}

const METHOD: &str = "\
### Method

All measurements run one after another in one process against one throwaway PostgreSQL started by the
bench (`sluice_testsupport::PgServer`: `fsync=off`, `full_page_writes=off`, `shared_buffers=32MB`,
synchronous commit on), on the same 2 cores as the workers, the load generator and the handler, so every
worker's CPU comes out of PostgreSQL's budget. CPU seconds in the table are user+system time read from
`/proc` over the burn-down (PostgreSQL: the postmaster's children).

| measurement | method |
|---|---|
| burn-down, raw SQL limit | N jobs pre-inserted into `sluice.jobs` (5,000-row `enqueue_many` statements, then `VACUUM ANALYZE`). `pgbench -n -M prepared -c 4 -j 2`, script: the worker's claim statement for 100 jobs, then one `UPDATE … SET state = 'succeeded'` of the client's running jobs, one autocommit transaction each. jobs/s = N / pgbench wall time. No worker at all: the ceiling for this schema on this box. |
| burn-down, in-process worker | Same N, `queue::Worker` with a no-op `Handler` (concurrency 1,000, claim batch 250, 2 claim loops, the batch completer). Timed from start until the worker has recorded N jobs as succeeded (its `sluice_jobs_succeeded_total`, counted once the statement writing an outcome has committed; read every 1 ms once the handler has seen all N jobs), as pgbench's wall time ends with its last commit; then, untimed, an `EXISTS` probe over the partial indexes checks that no job is waiting or running. |
| burn-down, sidecar worker | The `sluice-sidecar worker` binary from env vars (`SLUICE_WORKER_CONCURRENCY` 16 — the default — or 512, other settings default) POSTing each job to a no-op axum handler in the bench process, over 20,000 jobs and over N. Timed from process start (a cold start: includes startup and the migration check) until the worker's `/metrics` count N jobs succeeded (read every 1 ms once the handler has seen all N jobs), then the same untimed check as the in-process line. At 16, the per-job overhead: handler start − `started_at` (PostgreSQL's `now()` of the claim) and `finished_at` (`now()` of the completion's transaction, taken when its write begins) − handler end, p50 and p99 over every job. |
| burn-down, graphile-worker | graphile-worker (npm, installed into a temp dir at bench time) with a no-op task and a silent logger; N jobs inserted with one `graphile_worker.add_jobs` call before timing, `run()` with `concurrentJobs: 24`, `maxPoolSize: 25`, `localQueue: {size: 500}`, `completeJobBatchDelay: 0`, `failJobBatchDelay: 0` (its documented batching). Timed from `run()` until `graphile_worker.jobs` is empty (graphile-worker deletes a job when it records it done): probed every 1 ms once its task has run N times (counted in memory); unlike the Sluice lines, that last probe or few is inside its timing, as graphile-worker has no count of recorded jobs to read. |
| bulk enqueue | `QueueStore::enqueue_many`: 5,000 rows per statement (`sluice.enqueue_many`, an UNNEST insert), 2×N rows. |
| enqueue latency at 1,000 jobs/s | open loop: one `QueueStore::enqueue` (one `sluice.enqueue_job` call, its own transaction) started every 1 ms for 10 s regardless of earlier ones; pool warmed first; latency per call. |
| pickup latency, idle queue | one in-process worker (defaults: LISTEN on, poll backing off 50 ms → 2 s) on an empty queue; a job is enqueued every 50 ms and the time from the enqueue call to the handler's start is recorded (200 jobs), and split in two: the enqueue call itself (one `sluice.enqueue_job` statement, committed, NOTIFY sent) and from its return to the handler's start (NOTIFY delivery → wake-up → claim → dispatch). |

Needs PostgreSQL server binaries (`postgres`, `initdb`, `psql`, `pgbench`) and, for the graphile line,
`node` + `npm` with network access (without them that line says why it was not measured).";

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

async fn pg_version(pool: &PgPool) -> String {
    sqlx::query_scalar::<_, String>("SELECT version()")
        .fetch_one(pool)
        .await
        .unwrap_or_default()
}

/// CPU used between two points: the measured process (if any) and PostgreSQL.
struct CpuMeter {
    pid: Option<u32>,
    own: f64,
    pg: f64,
}

impl CpuMeter {
    fn start(pg: &PgServer, pid: Option<u32>) -> Self {
        Self {
            pid,
            own: pid.map(cpu_secs).unwrap_or(0.0),
            pg: pg_cpu(pg),
        }
    }

    /// "worker X s CPU, PostgreSQL Y s CPU" over `secs` of wall time.
    fn report(&self, pg: &PgServer, who: &str, secs: f64) -> String {
        let pg_used = pg_cpu(pg) - self.pg;
        match self.pid {
            Some(pid) => format!(
                "{secs:.1} s wall; CPU: {who} {:.1} s, PostgreSQL {pg_used:.1} s",
                cpu_secs(pid) - self.own
            ),
            None => format!("{secs:.1} s wall; CPU: PostgreSQL {pg_used:.1} s"),
        }
    }
}

/// SLUICE_BENCH_STATEMENTS=1: print the statements that took the database's time in each worker
/// burn-down (pg_stat_statements), to see where a slow run spends it.
fn statements_diagnostics() -> bool {
    std::env::var_os("SLUICE_BENCH_STATEMENTS").is_some()
}

async fn reset_statements(store: &QueueStore) {
    if statements_diagnostics() {
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(store.pool())
            .await
            .unwrap();
    }
}

async fn print_statements(store: &QueueStore, what: &str) {
    if !statements_diagnostics() {
        return;
    }
    let rows: Vec<(f64, i64, i64, String)> = sqlx::query_as(
        "SELECT total_exec_time, calls, rows, left(regexp_replace(query, '\\s+', ' ', 'g'), 110) \
         FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 8",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    eprintln!("{what}: statements by database time (ms, calls, rows, query):");
    for (ms, calls, n, q) in rows {
        eprintln!("  {ms:9.0} {calls:7} {n:8}  {q}");
    }
}

/// pgbench clients each claim 100 jobs with the worker's claim statement and complete them, one
/// transaction per statement, as a worker with a no-op handler would: the most the table and statements
/// allow without any worker overhead.
async fn raw_sql_limit(pg: &PgServer, store: &QueueStore, n: usize) -> BurnDown {
    fill(store, "raw", n).await;
    reset_statements(store).await;
    // PostgreSQL's CPU alone: pgbench's own is not the queue's.
    let cpu = CpuMeter::start(pg, None);
    let secs = pgbench_claim_complete(pg, "raw", n);
    let detail = cpu.report(pg, "", secs);
    wait_drained(store, "raw").await;
    BurnDown {
        jobs_per_sec: n as f64 / secs,
        detail,
    }
}

/// A no-op handler counting the jobs it has seen.
struct Noop(Arc<AtomicUsize>);
impl Handler for Noop {
    async fn handle(&self, _job: ClaimedJob, _cancel: CancellationToken) -> Outcome {
        self.0.fetch_add(1, Ordering::Relaxed);
        Outcome::Succeeded
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn in_process(pg: &PgServer, store: &QueueStore, n: usize) -> BurnDown {
    fill(store, "inproc", n).await;
    reset_statements(store).await;
    let shutdown = CancellationToken::new();
    // SLUICE_BENCH_* override the settings, for tuning runs (`--only inproc`).
    let opts = WorkerOptions {
        concurrency: env_or("SLUICE_BENCH_CONCURRENCY", INPROC_CONCURRENCY),
        claim_batch: env_or("SLUICE_BENCH_CLAIM_BATCH", INPROC_CLAIM_BATCH),
        claimers: env_or("SLUICE_BENCH_CLAIMERS", INPROC_CLAIMERS),
        ..WorkerOptions::new(["inproc"])
    };
    let cpu = CpuMeter::start(pg, Some(std::process::id()));
    let t0 = Instant::now();
    let handled = Arc::new(AtomicUsize::new(0));
    let worker = Worker::new(store.clone(), Noop(handled.clone()), opts);
    let metrics = worker.metrics();
    let w = tokio::spawn(worker.run(shutdown.clone()));
    let seen = || std::future::ready(handled.load(Ordering::Relaxed) as u64);
    wait_counted("jobs the handler saw", seen, n).await;
    let recorded = || std::future::ready(succeeded_in(&metrics.render(), "inproc"));
    wait_counted("jobs the worker recorded", recorded, n).await;
    let secs = t0.elapsed().as_secs_f64();
    let detail = cpu.report(pg, "bench process (worker)", secs);
    assert_drained(store, "inproc").await;
    shutdown.cancel();
    w.await.unwrap().unwrap();
    let text = metrics.render();
    let metric = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let claims = metric("sluice_claim_batch_size_count");
    BurnDown {
        jobs_per_sec: n as f64 / secs,
        detail: format!(
            "{detail}; {claims:.0} claims of {:.0} jobs on average",
            metric("sluice_claim_batch_size_sum") / claims
        ),
    }
}

/// Per-job overhead of a sidecar burn-down, in ms: p50/p99 of (handler start − claim) and of
/// (completion − handler end), from the job's `started_at` and `finished_at` (PostgreSQL's `now()` of the
/// claim and of the completion transaction) and the handler's own clock readings.
#[derive(Clone, Copy, Default)]
struct Overhead {
    start_p50: f64,
    start_p99: f64,
    written_p50: f64,
    written_p99: f64,
}

impl Overhead {
    fn render(&self) -> String {
        format!(
            "handler start − claim p50 {:.2} / p99 {:.2} ms; completion − handler end p50 {:.2} / p99 {:.2} ms",
            self.start_p50, self.start_p99, self.written_p50, self.written_p99
        )
    }
}

/// When the no-op handler saw each job: (job id, start, end), seconds since the epoch.
type Seen = Arc<std::sync::Mutex<Vec<(String, f64, f64)>>>;

fn epoch_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// The sidecar worker binary (`SLUICE_BENCH_SIDECAR_BIN` runs another build of it, to compare two
/// builds side by side) with `concurrency`, from a cold start over `n` jobs of `queue`.
async fn sidecar_worker(
    pg: &PgServer,
    store: &QueueStore,
    queue: &str,
    n: usize,
    concurrency: usize,
) -> (BurnDown, Overhead) {
    fill(store, queue, n).await;
    reset_statements(store).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jobs", listener.local_addr().unwrap());
    let seen: Seen = Arc::default();
    let record = seen.clone();
    let handled = Arc::new(AtomicUsize::new(0));
    let counted = handled.clone();
    let app = Router::new().route(
        "/jobs",
        post(move |headers: axum::http::HeaderMap| {
            let start = epoch_secs();
            let id = headers
                .get("sluice-job-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let mut seen = record.lock().unwrap();
            seen.push((id, start, epoch_secs()));
            handled.store(seen.len(), Ordering::Relaxed);
            async { "" }
        }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    // A free port for the worker's metrics, read to find the end of the burn-down.
    let metrics_addr = proxy_setup::local(sluice_testsupport::free_port());
    let own = CpuMeter::start(pg, Some(std::process::id()));
    let bin = std::env::var("SLUICE_BENCH_SIDECAR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice-sidecar").to_owned());
    let t0 = Instant::now();
    let mut child = Command::new(bin)
        .arg("worker")
        .env("SLUICE_DATABASE_URL", pg.url())
        .env("SLUICE_QUEUES", queue)
        .env("SLUICE_HANDLER_URL", &url)
        .env("SLUICE_WORKER_CONCURRENCY", concurrency.to_string())
        .env("SLUICE_METRICS_LISTEN", metrics_addr.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("start sluice-sidecar worker");
    // A worker that exited (its metrics port taken meanwhile, say) fails the run instead of hanging it.
    let mut alive = || {
        let exited = child.try_wait().ok().flatten();
        assert!(exited.is_none(), "the sidecar worker exited: {exited:?}");
    };
    let handled = || {
        alive();
        std::future::ready(counted.load(Ordering::Relaxed) as u64)
    };
    wait_counted("jobs the handler saw", handled, n).await;
    let recorded = || {
        alive();
        let text = tokio::task::block_in_place(|| proxy_setup::http_get_blocking(metrics_addr, "/metrics"));
        std::future::ready(succeeded_in(&text, queue))
    };
    wait_counted("jobs the worker recorded", recorded, n).await;
    let secs = t0.elapsed().as_secs_f64();
    let sidecar_cpu = cpu_secs(child.id());
    let detail = own.report(pg, "bench process (HTTP handler)", secs);
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    let _ = child.wait();
    server.abort();
    assert_drained(store, queue).await;
    let overhead = overhead(store, queue, &seen).await;
    (
        BurnDown {
            jobs_per_sec: n as f64 / secs,
            detail: format!("{detail}, sidecar {sidecar_cpu:.1} s"),
        },
        overhead,
    )
}

async fn overhead(store: &QueueStore, queue: &str, seen: &Seen) -> Overhead {
    let rows: Vec<(String, f64, f64)> = sqlx::query_as(
        "SELECT id::text, extract(epoch FROM started_at)::float8, extract(epoch FROM finished_at)::float8 \
         FROM sluice.jobs WHERE queue = $1 AND state = 'succeeded'",
    )
    .bind(queue)
    .fetch_all(store.pool())
    .await
    .unwrap();
    let db: std::collections::HashMap<String, (f64, f64)> =
        rows.into_iter().map(|(id, s, f)| (id, (s, f))).collect();
    let (mut start, mut written) = (Vec::new(), Vec::new());
    for (id, handler_start, handler_end) in seen.lock().unwrap().iter() {
        if let Some((claimed, finished)) = db.get(id) {
            start.push((handler_start - claimed) * 1000.0);
            written.push((finished - handler_end) * 1000.0);
        }
    }
    start.sort_by(f64::total_cmp);
    written.sort_by(f64::total_cmp);
    Overhead {
        start_p50: percentile(&start, 0.5),
        start_p99: percentile(&start, 0.99),
        written_p50: percentile(&written, 0.5),
        written_p99: percentile(&written, 0.99),
    }
}

const GRAPHILE_SCRIPT: &str = r#"
const { run, makeWorkerUtils, Logger } = require("graphile-worker");
const { Pool } = require("pg");
// graphile-worker logs every job at INFO by default; that would measure console output.
const logger = new Logger(() => () => {});
(async () => {
  const connectionString = process.env.DATABASE_URL;
  const n = parseInt(process.env.JOBS, 10);
  const utils = await makeWorkerUtils({ connectionString, logger });
  await utils.migrate();
  await utils.release();
  const pool = new Pool({ connectionString });
  // One bulk add_jobs call: n add_job calls in one statement take time quadratic in n (100k: > 10 min).
  await pool.query(
    "select count(*) from graphile_worker.add_jobs((select array_agg(('noop', json_build_object('i', i), " +
      "null, null, null, null, null, null)::graphile_worker.job_spec) from generate_series(1, $1) i))",
    [n]);
  await pool.query("vacuum analyze");
  const t0 = process.hrtime.bigint();
  let handled = 0;
  const runner = await run({
    noHandleSignals: true,
    logger,
    taskList: { noop: async () => { handled += 1; } },
    preset: { worker: { connectionString, concurrentJobs: 24, maxPoolSize: 25, pollInterval: 1000,
                        localQueue: { size: 500 }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } },
  });
  // Its table is probed only once every job has run (as the Sluice lines read their worker's count
  // only then): a probe throughout would take PostgreSQL's time from it.
  while (handled < n) await new Promise((r) => setTimeout(r, 1));
  for (;;) {
    const { rows } = await pool.query("select exists (select 1 from graphile_worker.jobs) as busy");
    if (!rows[0].busy) break;
    await new Promise((r) => setTimeout(r, 1));
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await runner.stop();
  await pool.end();
  console.log(JSON.stringify({ jobsPerSec: n / secs, secs }));
  process.exit(0);
})().catch((e) => { console.error(e); process.exit(1); });
"#;

/// graphile-worker from npm, installed into a temp dir now (needs `npm` and network access).
async fn graphile(pg: &PgServer, n: usize) -> Result<BurnDown, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let install = Command::new("npm")
        .args(["install", "--silent", "--no-audit", "--no-fund"])
        .arg(format!("graphile-worker@{GRAPHILE_VERSION}"))
        .arg("pg")
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
    let cpu = CpuMeter::start(pg, None);
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(last).map_err(|e| format!("{e}: {stdout}"))?;
    let secs = v["secs"].as_f64().unwrap_or(f64::NAN);
    Ok(BurnDown {
        jobs_per_sec: v["jobsPerSec"].as_f64().ok_or("no result")?,
        // PostgreSQL's CPU here also covers the insert before timing; only the wall time is comparable.
        detail: format!(
            "{secs:.1} s wall; CPU: PostgreSQL {:.1} s including the insert",
            pg_cpu(pg) - cpu.pg
        ),
    })
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
async fn pickup_latency(store: &QueueStore, n: usize) -> Pickup {
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
    let (mut v, mut calls, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        store
            .enqueue("pickup", &NewJob::new("noop", serde_json::json!({})))
            .await
            .unwrap();
        let enqueued = Instant::now();
        let started = rx.recv().await.unwrap();
        v.push((started - t0).as_secs_f64() * 1000.0);
        calls.push((enqueued - t0).as_secs_f64() * 1000.0);
        after.push((started - enqueued).as_secs_f64() * 1000.0);
        if std::env::var_os("SLUICE_BENCH_PICKUP_TRACE").is_some() && *v.last().unwrap() > 10.0 {
            eprintln!(
                "pickup {}: {:.2} ms (enqueue call {:.2} ms)",
                v.len(),
                v.last().unwrap(),
                calls.last().unwrap()
            );
        }
    }
    shutdown.cancel();
    w.await.unwrap().unwrap();
    v.sort_by(f64::total_cmp);
    calls.sort_by(f64::total_cmp);
    after.sort_by(f64::total_cmp);
    Pickup {
        p50: percentile(&v, 0.5),
        p99: percentile(&v, 0.99),
        enqueue_p50: percentile(&calls, 0.5),
        enqueue_p99: percentile(&calls, 0.99),
        after_p50: percentile(&after, 0.5),
        after_p99: percentile(&after, 0.99),
    }
}

/// Idle pickup latency, ms: enqueue call → handler start, the enqueue call's own part of it, and the
/// rest (the enqueue call's return → handler start).
#[derive(Clone, Copy)]
struct Pickup {
    p50: f64,
    p99: f64,
    enqueue_p50: f64,
    enqueue_p99: f64,
    after_p50: f64,
    after_p99: f64,
}
