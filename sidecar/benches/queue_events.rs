//! Event streams benchmark (a benchmark, not a test): `cargo bench -p sluice-sidecar --bench queue_events`.
//!
//! What a thousand open Server-Sent Events streams cost the sidecar. The queue API runs in a process of
//! its own (this binary, started again with `--serve`), so that its memory and CPU time are its own; this
//! process opens the streams and reads them. Measured, on one throwaway PostgreSQL:
//! 1. resident memory of the API process before and after opening N job streams (one job each), then N
//!    queue streams (over 10 queues), per stream;
//! 2. CPU time of the API process over 10 s with all of them open and nothing happening (queue streams
//!    still get their counts every second: 10 queue reads per second in all);
//! 3. how long N job streams take to open, and how long until all N have seen their job go `running`
//!    after one statement claims all N jobs (N notifications fanned out to N streams).
//!
//! A full run rewrites the section between `<!-- bench:queue-events:start -->` and
//! `<!-- bench:queue-events:end -->` in BENCHMARKS.md; `-- --short` (200 streams) only prints.

#[allow(dead_code)] // shared by the benchmarks; this one uses part of it
mod queue_setup;
#[allow(dead_code)]
mod report;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use queue_setup::cpu_secs;
use sluice_queue::{NewJob, QueueSettings, QueueStore, schema};
use sluice_sidecar::queue::api;
use sluice_testsupport::PgServer;
use sqlx::postgres::PgPoolOptions;
use tokio::io::AsyncReadExt;

const START: &str = "<!-- bench:queue-events:start -->";
const END: &str = "<!-- bench:queue-events:end -->";
const QUEUES: usize = 10;
const IDLE: Duration = Duration::from_secs(10);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve") {
        serve(&args[i + 1]);
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench(args.iter().any(|a| a == "--short")));
}

/// The API process: serves the queue API on a free loopback port, prints the address, and stops when
/// its stdin closes. Two worker threads, like the sidecar on a small node.
fn serve(url: &str) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let pool = sluice_queue::pool::connect_lazy(url, 10).unwrap();
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            println!("{}", listener.local_addr().unwrap());
            let stop = async {
                let mut buf = [0u8; 1];
                let _ = tokio::io::stdin().read(&mut buf).await;
            };
            api::serve(listener, api::ApiState::new(QueueStore::new(pool)), stop)
                .await
                .unwrap();
        });
}

/// Resident memory of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Opens a stream and counts, on `seen`, each event whose data contains `want` (the first one only
/// per stream). Returns once the response headers are in; the body is read by a task of its own.
async fn open(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>,
    url: String,
    counters: Vec<(&'static str, Arc<AtomicUsize>)>,
) {
    let resp = client
        .request(hyper::Request::get(url).body(Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    tokio::spawn(async move {
        let mut counted = vec![false; counters.len()];
        while let Some(Ok(frame)) = body.frame().await {
            let Ok(data) = frame.into_data() else { continue };
            let text = String::from_utf8_lossy(&data);
            for (i, (want, n)) in counters.iter().enumerate() {
                if !counted[i] && text.contains(want) {
                    counted[i] = true;
                    n.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
}

async fn until(what: &str, n: &AtomicUsize, want: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while n.load(Ordering::SeqCst) < want {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {want}",
            n.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn bench(short: bool) {
    let n = if short { 200 } else { 1000 };
    let started = chrono::Utc::now();
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&pg.url())
        .await
        .unwrap();
    schema::migrate(&pool).await.unwrap();
    let store = QueueStore::new(pool.clone());
    store.upsert_queue(&QueueSettings::defaults("ev")).await.unwrap();
    for q in 0..QUEUES {
        store
            .upsert_queue(&QueueSettings::defaults(format!("ev{q}")))
            .await
            .unwrap();
    }
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new("noop", serde_json::json!({ "i": i })))
        .collect();
    let ids = store.enqueue_many("ev", &jobs).await.unwrap();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--serve", &pg.url()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut addr = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut addr)
        .unwrap();
    let base = format!("http://{}", addr.trim());
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<Empty<Bytes>>();

    // Warm up: one stream of each kind opened and read, so the hub's LISTEN connection, its renewal
    // task and the pool are there before the baseline.
    let warm = Arc::new(AtomicUsize::new(0));
    open(
        &client,
        format!("{base}/v1/queues/ev/jobs/{}/events", ids[0]),
        vec![("pending", warm.clone())],
    )
    .await;
    open(
        &client,
        format!("{base}/v1/queues/ev0/events"),
        vec![("counts", warm.clone())],
    )
    .await;
    until("warm-up", &warm, 2).await;
    let rss0 = rss_kib(pid);

    let first = Arc::new(AtomicUsize::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    for chunk in ids[1..].chunks(100) {
        let opens = chunk.iter().map(|id| {
            open(
                &client,
                format!("{base}/v1/queues/ev/jobs/{id}/events"),
                vec![("pending", first.clone()), ("running", running.clone())],
            )
        });
        futures::future::join_all(opens).await;
    }
    until("first events", &first, n - 1).await;
    let open_secs = t0.elapsed().as_secs_f64();
    let rss1 = rss_kib(pid);
    let cpu = cpu_secs(pid);
    tokio::time::sleep(IDLE).await;
    let idle_jobs = (cpu_secs(pid) - cpu) / IDLE.as_secs_f64();

    let t1 = Instant::now();
    let claimed = store
        .claim_batch("ev", "bench", n as u32, Duration::from_secs(600))
        .await
        .unwrap();
    assert_eq!(claimed.len(), n);
    until("running events", &running, n - 1).await;
    let fanout_ms = t1.elapsed().as_secs_f64() * 1000.0;

    let counts = Arc::new(AtomicUsize::new(0));
    for q in 0..n {
        open(
            &client,
            format!("{base}/v1/queues/ev{}/events", q % QUEUES),
            vec![("counts", counts.clone())],
        )
        .await;
    }
    until("first counts", &counts, n).await;
    let rss2 = rss_kib(pid);
    let cpu = cpu_secs(pid);
    tokio::time::sleep(IDLE).await;
    let idle_all = (cpu_secs(pid) - cpu) / IDLE.as_secs_f64();
    drop(child.stdin.take());
    let _ = child.wait();

    let per = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / n as f64;
    let mut out = String::new();
    out.push_str(&format!(
        "{START}\n## Job and queue status streams (Server-Sent Events)\n\n"
    ));
    out.push_str(&format!(
        "Run: `cargo bench -p sluice-sidecar --bench queue_events` at {}, {n} streams of each kind. Host: {}, load average {}.\n\n",
        started.format("%Y-%m-%d %H:%M UTC"),
        report::cpu_model(),
        report::load_average()
    ));
    out.push_str("| measurement | result |\n|---|---|\n");
    out.push_str(&format!(
        "| API process memory, baseline (one stream of each kind open) | {:.1} MiB |\n",
        rss0 as f64 / 1024.0
    ));
    out.push_str(&format!(
        "| memory per open job stream | {:.1} KiB ({n} streams: +{:.1} MiB) |\n",
        per(rss0, rss1),
        (rss1.saturating_sub(rss0)) as f64 / 1024.0
    ));
    out.push_str(&format!(
        "| memory per open queue stream | {:.1} KiB ({n} streams over {QUEUES} queues: +{:.1} MiB) |\n",
        per(rss1, rss2),
        (rss2.saturating_sub(rss1)) as f64 / 1024.0
    ));
    out.push_str(&format!(
        "| CPU at idle, {n} job streams open | {:.2} % of one core |\n",
        idle_jobs * 100.0
    ));
    out.push_str(&format!(
        "| CPU at idle, {n} job and {n} queue streams open | {:.2} % of one core (counts sent every second) |\n",
        idle_all * 100.0
    ));
    out.push_str(&format!(
        "| opening {n} job streams (100 at a time) | {:.2} s |\n",
        open_secs
    ));
    out.push_str(&format!(
        "| one statement claims the {n} jobs → every stream has sent `running` | {fanout_ms:.0} ms |\n"
    ));
    out.push_str(&format!(
        "\nMethod: the queue API runs in a process of its own (the bench binary started with `--serve`, a 2-thread Tokio runtime, a pool of 10 connections); the bench process opens the streams over HTTP/1.1 (one connection each) and reads them. Memory is the API process's resident set (`VmRSS`) after every stream has sent its first event, against the baseline; CPU is its user + system time over {}s with the streams open. Queue streams read each queue's counts once a second (one reader per queue, however many streams), so the second idle line includes {QUEUES} depth queries a second. Same throwaway PostgreSQL and 2 cores for PostgreSQL, the API process and the bench.\n{END}\n",
        IDLE.as_secs()
    ));
    println!("{out}");
    if !short {
        report::write_section(START, END, &out);
    }
}
