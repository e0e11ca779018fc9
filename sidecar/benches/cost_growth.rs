//! How cost grows with work (a benchmark, not a test): `cargo bench -p sluice-sidecar --bench cost_growth
//! [-- --quick] [-- --only keys,queue]`.
//!
//! 1. *Keys*: the sidecar with one fixed-window rule in Redis keyed by a header, at 1, 100, 10,000 and
//!    1,000,000 distinct keys (one sidecar per key count, all running at once, measured in turn in
//!    interleaved rounds; each request names a key chosen uniformly). Saturation throughput and p99 (wrk),
//!    p99 at a fixed 2,000 req/s (an open-loop client choosing keys the same way), CPU per request of the
//!    sidecar and of Redis, the sidecar's RSS. nginx `proxy_pass` with the 1,000,000-key wrk script is
//!    measured in the same rounds as the reference.
//! 2. *Retained jobs*: one queue with 10,000, 1,000,000 and 10,000,000 finished (succeeded) jobs already in
//!    `sluice.jobs` (generated with one `INSERT … SELECT generate_series` per step, the load timed), and at
//!    each size the burn-down of fresh jobs by the raw SQL limit (pgbench) and by the in-process worker,
//!    in rounds; each row is the median round.
//!
//! A full run rewrites the section between `<!-- bench:cost-growth:start -->` and
//! `<!-- bench:cost-growth:end -->` in BENCHMARKS.md; `scripts/cost-growth-plot.py` draws
//! `cost-growth.png` from it. The operator's part is `cargo bench -p sluice-operator --bench
//! reconcile_scale`. `--quick` and `--only` only print, as does a run of another sidecar build
//! (`SLUICE_BENCH_SIDECAR_BIN=path`, to compare two builds in the same conditions).

#![allow(missing_docs)] // a benchmark binary: its items are not an API

mod proxy_setup;
#[allow(dead_code)] // shared by the benchmarks; this one uses part of it
mod queue_setup;
mod report;

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use proxy_setup::{Proc, http_get_blocking, local, serve_upstream, start_nginx, wait_port, which};
use queue_setup::{cpu_secs, fill, pg_cpu, pgbench_claim_complete, wait_drained};
use sluice_queue::{ClaimedJob, QueueSettings, QueueStore, schema};
use sluice_sidecar::queue::{Handler, Outcome, Worker, WorkerOptions};
use sluice_testsupport::{PgServer, RedisServer, free_port};
use sqlx::postgres::PgPoolOptions;
use tokio_util::sync::CancellationToken;

const START: &str = "<!-- bench:cost-growth:start -->";
const END: &str = "<!-- bench:cost-growth:end -->";

/// Distinct keys per measurement of the sidecar.
const KEY_COUNTS: [u64; 4] = [1, 100, 10_000, 1_000_000];
/// The queue's retained finished jobs per measurement (`--quick`: a tenth).
const RETAINED: [u64; 3] = [10_000, 1_000_000, 10_000_000];
/// Fresh jobs per burn-down at each retained size.
const BURN_DOWN: usize = 20_000;
const QUEUE: &str = "growth";

struct Settings {
    quick: bool,
    rounds: usize,
    saturate: Duration,
    fixed: Duration,
    connections: u32,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve-upstream") {
        serve_upstream(args[i + 1].parse().expect("upstream address"));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_owned).collect());
    let on = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    let s = Settings {
        quick,
        rounds: if quick { 1 } else { 3 },
        saturate: Duration::from_secs(if quick { 3 } else { 8 }),
        fixed: Duration::from_secs(if quick { 2 } else { 5 }),
        connections: 64,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let started = chrono::Utc::now();
    let keys = on("keys").then(|| rt.block_on(keys(&s)));
    let queue = on("queue").then(|| rt.block_on(retained(&s)));
    let section = render(&s, started, keys.as_ref(), queue.as_ref());
    println!("{section}");
    if quick || only.is_some() || std::env::var_os("SLUICE_BENCH_SIDECAR_BIN").is_some() {
        eprintln!("--quick/--only/SLUICE_BENCH_SIDECAR_BIN: BENCHMARKS.md left as it is");
    } else {
        report::write_section(START, END, &section);
    }
}

// ---------------------------------------------------------------------------------------------------
// Keys

// 10^8 per hour and key: never hit in a run (see the ratelimit benchmark for why not 10^9).
const RULE: &str = r#"
version: 1
policy: {namespace: bench, name: growth, generation: 1}
limits:
  rules:
  - name: per-client
    key: [{type: header, name: x-client}]
    algorithm: fixedWindow
    limit: {requests: 100000000, window: 1h}
"#;

fn wrk_script(keys: u64) -> String {
    format!(
        "math.randomseed(42)\nrequest = function()\n  return wrk.format(nil, nil, {{[\"X-Client\"] = \
         tostring(math.random(1, {keys}))}})\nend\n"
    )
}

/// The sidecar binary: `SLUICE_BENCH_SIDECAR_BIN` runs another build of it, to compare two builds in the
/// same conditions (such a run only prints).
fn sidecar_bin() -> String {
    std::env::var("SLUICE_BENCH_SIDECAR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice-sidecar").to_owned())
}

fn start_sidecar(dir: &Path, upstream: SocketAddr, redis: &str) -> (Proc, SocketAddr) {
    let file = dir.join(format!("sidecar-{}.yaml", free_port()));
    std::fs::write(&file, RULE).expect("write config");
    let addr = local(free_port());
    let admin = local(free_port());
    let p = Proc(
        Command::new(sidecar_bin())
            .arg("--config")
            .arg(&file)
            .env("SLUICE_LISTEN", addr.to_string())
            .env("SLUICE_ADMIN_LISTEN", admin.to_string())
            .env("SLUICE_UPSTREAM", format!("http://{upstream}"))
            .env("SLUICE_REDIS_URL", redis)
            // As the webhook injects it: counter names keyed with the namespace's counter key.
            .env("SLUICE_COUNTER_KEY", "bench-counter-key-0123456789abcdefghijkl")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn sidecar"),
    );
    wait_port(addr);
    wait_port(admin);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !http_get_blocking(admin, "/readyz").contains("\"redisHealthy\":true") {
        assert!(Instant::now() < deadline, "the sidecar never reached Redis");
        std::thread::sleep(Duration::from_millis(50));
    }
    (p, addr)
}

/// wrk at saturation: requests/s, p99 in ms, non-2xx responses.
fn wrk(addr: SocketAddr, duration: Duration, connections: u32, script: &Path) -> (f64, f64, u64) {
    let out = Command::new(which("wrk").expect("wrk (Debian wrk)"))
        .args(["-t", "1", "-c", &connections.to_string(), "-d"])
        .arg(format!("{}s", duration.as_secs()))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(format!("http://{addr}/"))
        .output()
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |prefix: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap_or_default()
    };
    let non_2xx = text
        .lines()
        .find(|l| l.contains("Non-2xx or 3xx responses:"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (
        field("Requests/sec:").parse().unwrap_or(0.0),
        wrk_ms(&field("99%")),
        non_2xx,
    )
}

/// wrk's latency ("812.00us", "1.34ms", "2.01s") in ms.
fn wrk_ms(v: &str) -> f64 {
    let (num, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1000.0)
    } else {
        (v, f64::NAN)
    };
    num.parse::<f64>().map_or(f64::NAN, |n| n * scale)
}

/// Open loop at `rate` req/s, each request naming one of `keys` keys (a fixed pseudo-random sequence):
/// p99 in ms and failed requests. Latency from the actual send (see the ratelimit benchmark).
async fn open_loop(addr: SocketAddr, keys: u64, rate: u32, duration: Duration) -> (f64, u64) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(512)
        .build_http();
    let samples = Arc::new(Mutex::new(Vec::<u64>::new()));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let gap = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now();
    let total = (duration.as_secs_f64() * f64::from(rate)) as u64;
    let mut tasks = Vec::with_capacity(total as usize);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..total {
        tokio::time::sleep_until(start + gap.mul_f64(i as f64)).await;
        // xorshift64: uniform enough over `keys`, and the same sequence every run.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let req = Request::get(format!("http://{addr}/"))
            .header("x-client", (x % keys + 1).to_string())
            .body(Empty::new())
            .expect("request");
        let (client, samples, errors) = (client.clone(), samples.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let sent = tokio::time::Instant::now();
            let ok = match client.request(req).await {
                Ok(resp) => resp.status().is_success() && resp.into_body().collect().await.is_ok(),
                Err(_) => false,
            };
            if ok {
                samples.lock().unwrap().push(sent.elapsed().as_micros() as u64);
            } else {
                errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let mut v = std::mem::take(&mut *samples.lock().unwrap());
    v.sort_unstable();
    let p99 = v
        .get(((v.len() as f64 * 0.99) as usize).min(v.len().saturating_sub(1)))
        .map_or(f64::NAN, |us| *us as f64 / 1000.0);
    (p99, errors.load(std::sync::atomic::Ordering::Relaxed))
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[derive(Clone, Default)]
struct KeyRow {
    keys: u64,
    rps: f64,
    sat_p99_ms: f64,
    fixed_p99_ms: f64,
    errors: u64,
    /// CPU per request at saturation, µs: the sidecar, Redis.
    sidecar_us: f64,
    redis_us: f64,
    rss_kb: u64,
    /// Keys in Redis after the rounds (`DBSIZE`, every key count's keys together).
    load: String,
}

struct Keys {
    rows: Vec<KeyRow>,
    nginx: KeyRow,
    redis_keys: String,
}

async fn keys(s: &Settings) -> Keys {
    let upstream = local(free_port());
    let _app = Proc(
        Command::new(std::env::current_exe().expect("exe"))
            .args(["--serve-upstream", &upstream.to_string()])
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn upstream"),
    );
    wait_port(upstream);
    let work = tempfile::tempdir().expect("tempdir");
    let redis = RedisServer::start();
    let redis_pid = redis.pid().expect("redis pid");
    let (_nginx, nginx_addr) = start_nginx(work.path(), upstream, false);
    let mut setups = Vec::new();
    for k in KEY_COUNTS {
        let (p, addr) = start_sidecar(work.path(), upstream, &redis.url());
        let script = work.path().join(format!("keys-{k}.lua"));
        std::fs::write(&script, wrk_script(k)).expect("wrk script");
        setups.push((k, p, addr, script));
    }
    let mut samples: Vec<Vec<KeyRow>> = vec![Vec::new(); setups.len()];
    let mut nginx = Vec::new();
    let widest = &setups.last().expect("setups").3;
    for round in 0..s.rounds {
        eprintln!(
            "-- round {} of {} (load {})",
            round + 1,
            s.rounds,
            report::load_average()
        );
        let _ = wrk(nginx_addr, Duration::from_secs(1), s.connections, widest);
        let (rps, p99, errors) = wrk(nginx_addr, s.saturate, s.connections, widest);
        eprintln!("== nginx proxy_pass, 1,000,000-key script: {rps:.0} req/s, p99 {p99:.2} ms");
        nginx.push(KeyRow {
            rps,
            sat_p99_ms: p99,
            errors,
            load: report::load_average(),
            ..KeyRow::default()
        });
        for (i, (k, p, addr, script)) in setups.iter().enumerate() {
            let _ = wrk(*addr, Duration::from_secs(1), s.connections, script);
            let (own0, redis0) = (cpu_secs(p.0.id()), cpu_secs(redis_pid));
            let (rps, sat_p99_ms, non_2xx) = wrk(*addr, s.saturate, s.connections, script);
            let n = rps * s.saturate.as_secs_f64();
            let sidecar_us = (cpu_secs(p.0.id()) - own0) * 1e6 / n;
            let redis_us = (cpu_secs(redis_pid) - redis0) * 1e6 / n;
            let (fixed_p99_ms, errors) = open_loop(*addr, *k, 2_000, s.fixed).await;
            let row = KeyRow {
                keys: *k,
                rps,
                sat_p99_ms,
                fixed_p99_ms,
                errors: errors + non_2xx,
                sidecar_us,
                redis_us,
                rss_kb: rss_kb(p.0.id()),
                load: report::load_average(),
            };
            eprintln!(
                "== sidecar, {k} keys: {rps:.0} req/s, p99 {sat_p99_ms:.2} ms; at 2,000 req/s p99 \
                 {fixed_p99_ms:.2} ms; CPU/request sidecar {sidecar_us:.1} µs, Redis {redis_us:.1} µs; \
                 errors {}",
                row.errors
            );
            samples[i].push(row);
        }
    }
    let median = |rounds: &[KeyRow]| {
        let mut by: Vec<&KeyRow> = rounds.iter().collect();
        by.sort_by(|a, b| a.rps.total_cmp(&b.rps));
        let mut row = by[by.len() / 2].clone();
        let mut fixed: Vec<f64> = rounds.iter().map(|r| r.fixed_p99_ms).collect();
        fixed.sort_by(f64::total_cmp);
        row.fixed_p99_ms = fixed[fixed.len() / 2];
        row.errors = rounds.iter().map(|r| r.errors).sum();
        row
    };
    let mut rows: Vec<KeyRow> = samples.iter().map(|r| median(r)).collect();
    for (row, (_, p, _, _)) in rows.iter_mut().zip(&setups) {
        row.rss_kb = rss_kb(p.0.id());
    }
    Keys {
        rows,
        nginx: median(&nginx),
        redis_keys: redis.command("DBSIZE").trim().trim_start_matches(':').to_owned(),
    }
}

// ---------------------------------------------------------------------------------------------------
// Retained jobs

#[derive(Clone, Default)]
struct QueueRow {
    retained: u64,
    /// Seconds to generate this step's rows, and to VACUUM ANALYZE after.
    load_secs: f64,
    vacuum_secs: f64,
    table_mb: f64,
    raw: f64,
    inproc: f64,
    /// CPU per job of the in-process burn-down, µs: the bench process (worker), PostgreSQL.
    worker_us: f64,
    pg_us: f64,
    load: String,
}

struct Noop;
impl Handler for Noop {
    async fn handle(&self, _job: ClaimedJob, _cancel: CancellationToken) -> Outcome {
        Outcome::Succeeded
    }
}

/// Removes the burn-downs' own jobs, so the next round starts with the retained rows alone.
async fn clear_fresh(store: &QueueStore) {
    sqlx::query("DELETE FROM sluice.jobs WHERE queue = $1 AND kind = 'noop'")
        .bind(QUEUE)
        .execute(store.pool())
        .await
        .unwrap();
    sqlx::query("VACUUM ANALYZE sluice.jobs")
        .execute(store.pool())
        .await
        .unwrap();
}

/// pgbench clients claim 100 jobs with the worker's claim statement and complete them (the queue
/// benchmark's raw SQL limit, on this queue): jobs/s.
fn raw_sql_limit(pg: &PgServer, n: usize) -> f64 {
    n as f64 / pgbench_claim_complete(pg, QUEUE, n)
}

/// The queue benchmark's in-process worker (concurrency 1,000, claim batch 250, 2 claim loops) over the
/// queue's `n` fresh jobs: jobs/s, and CPU per job (µs) of this process and of PostgreSQL.
async fn in_process(pg: &PgServer, store: &QueueStore, n: usize) -> (f64, f64, f64) {
    let shutdown = CancellationToken::new();
    let opts = WorkerOptions {
        concurrency: 1000,
        claim_batch: 250,
        claimers: 2,
        ..WorkerOptions::new([QUEUE])
    };
    let (own0, pg0) = (cpu_secs(std::process::id()), pg_cpu(pg));
    let t0 = Instant::now();
    let w = tokio::spawn(Worker::new(store.clone(), Noop, opts).run(shutdown.clone()));
    wait_drained(store, QUEUE).await;
    let secs = t0.elapsed().as_secs_f64();
    let own = (cpu_secs(std::process::id()) - own0) * 1e6 / n as f64;
    let pg_used = (pg_cpu(pg) - pg0) * 1e6 / n as f64;
    shutdown.cancel();
    w.await.unwrap().unwrap();
    (n as f64 / secs, own, pg_used)
}

async fn retained(s: &Settings) -> (Vec<QueueRow>, String) {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(32)
        .connect(&pg.url())
        .await
        .unwrap();
    schema::migrate(&pool).await.unwrap();
    let version: String = sqlx::query_scalar("SELECT version()")
        .fetch_one(&pool)
        .await
        .unwrap_or_default();
    let store = QueueStore::new(pool.clone());
    store.upsert_queue(&QueueSettings::defaults(QUEUE)).await.unwrap();
    let mut rows = Vec::new();
    let mut have = 0u64;
    for target in RETAINED.map(|r| if s.quick { r / 10 } else { r }) {
        // Finished jobs as a worker leaves them (succeeded, lease cleared, finished recently so that
        // retention keeps them), time-ordered ids like every enqueue path's.
        let t0 = Instant::now();
        sqlx::query(
            "INSERT INTO sluice.jobs (id, queue, kind, payload, state, attempt, max_attempts, run_at, \
                                      created_at, started_at, finished_at) \
             SELECT sluice.uuid_v7(), $1, 'done', jsonb_build_object('i', g), 'succeeded', 1, 25, \
                    now(), now(), now(), now() \
               FROM generate_series($2::bigint + 1, $3::bigint) AS g",
        )
        .bind(QUEUE)
        .bind(have as i64)
        .bind(target as i64)
        .execute(&pool)
        .await
        .unwrap();
        let load_secs = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        sqlx::query("VACUUM ANALYZE sluice.jobs")
            .execute(&pool)
            .await
            .unwrap();
        let vacuum_secs = t1.elapsed().as_secs_f64();
        eprintln!(
            "retained {target}: {} rows generated in {load_secs:.1} s, VACUUM ANALYZE {vacuum_secs:.1} s",
            target - have
        );
        have = target;
        let table_mb: f64 = sqlx::query_scalar::<_, i64>("SELECT pg_total_relation_size('sluice.jobs')")
            .fetch_one(&pool)
            .await
            .unwrap() as f64
            / 1048576.0;
        let mut samples = Vec::new();
        for round in 0..s.rounds {
            fill(&store, QUEUE, BURN_DOWN).await;
            let raw = tokio::task::block_in_place(|| raw_sql_limit(&pg, BURN_DOWN));
            wait_drained(&store, QUEUE).await;
            clear_fresh(&store).await;
            fill(&store, QUEUE, BURN_DOWN).await;
            let (inproc, worker_us, pg_us) = in_process(&pg, &store, BURN_DOWN).await;
            clear_fresh(&store).await;
            eprintln!(
                "   round {}: raw {raw:.0} jobs/s, in-process {inproc:.0} jobs/s (CPU/job worker \
                 {worker_us:.0} µs, PostgreSQL {pg_us:.0} µs); load {}",
                round + 1,
                report::load_average()
            );
            samples.push(QueueRow {
                retained: target,
                load_secs,
                vacuum_secs,
                table_mb,
                raw,
                inproc,
                worker_us,
                pg_us,
                load: report::load_average(),
            });
        }
        samples.sort_by(|a, b| a.inproc.total_cmp(&b.inproc));
        let mut row = samples[samples.len() / 2].clone();
        let mut raws: Vec<f64> = samples.iter().map(|r| r.raw).collect();
        raws.sort_by(f64::total_cmp);
        row.raw = raws[raws.len() / 2];
        rows.push(row);
    }
    drop(pool);
    drop(pg);
    (rows, version)
}

// ---------------------------------------------------------------------------------------------------
// Report

fn render(
    s: &Settings,
    started: chrono::DateTime<chrono::Utc>,
    keys: Option<&Keys>,
    queue: Option<&(Vec<QueueRow>, String)>,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{START}");
    let _ = writeln!(out, "## How cost grows with work\n");
    let _ = writeln!(
        out,
        "Run: `cargo bench -p sluice-sidecar --bench cost_growth{}` at {} UTC; {} rounds, each row the \
         median round. Machine: {}, {} cores (shared; load average at the end {}). {}; {}; sluice-sidecar {} \
         (release profile). Plot: `python3 scripts/cost-growth-plot.py` draws [cost-growth.png](cost-growth.png) \
         from this section.\n",
        if s.quick { " -- --quick" } else { "" },
        started.format("%Y-%m-%d %H:%M"),
        s.rounds,
        report::cpu_model(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        report::load_average(),
        report::version_of("redis-server", &["--version"])
            .split(" sha=")
            .next()
            .unwrap_or("?"),
        queue.map_or("PostgreSQL not run".into(), |q| q
            .1
            .split(" on ")
            .next()
            .unwrap_or("?")
            .to_owned()),
        env!("CARGO_PKG_VERSION"),
    );
    if s.quick {
        let _ = writeln!(
            out,
            "> **Quick mode**: a smoke run with shorter phases and a tenth of the rows.\n"
        );
    }
    if let Some(k) = keys {
        let _ = writeln!(
            out,
            "### Sidecar: distinct keys\n\n\
             One fixed-window rule in Redis keyed by a header (10⁸ per hour and key, never hit); wrk, 1 thread, \
             {} connections, {}s per round, each request naming a key chosen uniformly; the fixed rate is an \
             open-loop client at 2,000 req/s for {}s choosing keys the same way. One sidecar per key count \
             (default config, `failureMode: local`), all running at once, sharing one Redis, measured in turn; \
             CPU per request from `/proc/PID/stat` over the saturation run; RSS after the rounds. Reference: \
             nginx `proxy_pass` with the 1,000,000-key wrk script, {:.0} req/s, p99 {:.2} ms (median round). \
             Keys in Redis at the end: {}.\n",
            s.connections,
            s.saturate.as_secs(),
            s.fixed.as_secs(),
            k.nginx.rps,
            k.nginx.sat_p99_ms,
            k.redis_keys
        );
        let _ = writeln!(
            out,
            "| keys | req/s | / nginx | sat. p99 ms | 2,000 req/s p99 ms | sidecar CPU µs/req | Redis CPU µs/req | RSS MB | errors | load average |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in &k.rows {
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.2}× | {:.2} | {:.2} | {:.1} | {:.1} | {:.1} | {} | {} |",
                r.keys,
                r.rps,
                r.rps / k.nginx.rps,
                r.sat_p99_ms,
                r.fixed_p99_ms,
                r.sidecar_us,
                r.redis_us,
                r.rss_kb as f64 / 1024.0,
                r.errors,
                r.load
            );
        }
        let _ = writeln!(out);
    }
    if let Some((rows, _)) = queue {
        let _ = writeln!(
            out,
            "### Queue: retained finished jobs\n\n\
             One queue holding N succeeded jobs (generated by one `INSERT … SELECT generate_series` per step, \
             on top of the previous step's, then `VACUUM ANALYZE`; both timed). At each N, {} rounds of: \
             {BURN_DOWN} fresh jobs burned down by the raw SQL limit (pgbench, 4 clients, the worker's claim \
             statement for 100 and one completion `UPDATE`), then {BURN_DOWN} more by the in-process worker \
             (no-op handler, concurrency 1,000, claim batch 250, 2 claim loops); the fresh jobs are deleted \
             after each. CPU per job of the in-process burn-down from `/proc` (PostgreSQL: the postmaster's \
             children). PostgreSQL from `sluice_testsupport::PgServer` (`fsync=off`, `shared_buffers=32MB`).\n",
            s.rounds
        );
        let _ = writeln!(
            out,
            "| retained jobs | load s | VACUUM ANALYZE s | table + indexes MB | raw SQL jobs/s | in-process jobs/s | in-process / raw | worker CPU µs/job | PostgreSQL CPU µs/job | load average |"
        );
        let _ = writeln!(out, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        for r in rows {
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {:.2}× | {:.0} | {:.0} | {} |",
                r.retained,
                r.load_secs,
                r.vacuum_secs,
                r.table_mb,
                r.raw,
                r.inproc,
                r.inproc / r.raw,
                r.worker_us,
                r.pg_us,
                r.load
            );
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "{END}");
    out
}
