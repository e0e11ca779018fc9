//! The rate-limit overhead benchmark: `cargo bench -p sluice-sidecar --bench ratelimit [-- --quick]`.
//!
//! One upstream app (a small hyper server in its own process), one load generator, one run, eight
//! setups, all running at once and measured in turn in interleaved rounds (each row is the median round): direct to the app; nginx `proxy_pass`; nginx with `limit_req`; the sidecar with limiting off;
//! the sidecar with a fixed-window rule and with a token-bucket rule kept in Redis (limits never hit);
//! the sidecar with a token-bucket rule while Redis is down. For each: saturation throughput and
//! latency (wrk, closed loop), and latency at a fixed 2,000 req/s (an open-loop Rust client: each request
//! is sent on schedule in its own task whatever earlier ones are doing, so a stall is not hidden by
//! coordinated omission). The
//! sidecar's RSS is read at a fixed 1,000 req/s. Results replace the section between
//! `<!-- bench:ratelimit:start -->` and `<!-- bench:ratelimit:end -->` in BENCHMARKS.md.
//!
//! `SLUICE_BENCH_SIDECAR_BIN=path` runs another build of the sidecar, to compare two builds in the same
//! conditions (such a run only prints). `--open-loop ADDR RATE SECS` runs the fixed-rate client alone
//! against `ADDR` and prints its p50 and p99, for measuring by hand.
//!
//! nginx and wrk come from Debian (`nginx-light`, `wrk`); when missing they are installed with apt-get,
//! and the run says so. Redis is a throwaway `redis-server` (sluice_testsupport).

#![allow(missing_docs)] // a benchmark binary: its items are not an API

mod proxy_setup;
mod report;

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use proxy_setup::{Proc, http_get_blocking, local, serve_upstream, start_nginx, wait_port, which};
use sluice_testsupport::{RedisServer, free_port};

const START: &str = "<!-- bench:ratelimit:start -->";
const END: &str = "<!-- bench:ratelimit:end -->";

struct Settings {
    quick: bool,
    /// Interleaved rounds: every setup is measured once per round, and each row reports the median.
    rounds: usize,
    /// wrk's run per setup and round.
    saturate: Duration,
    /// The fixed-rate run per setup and round.
    fixed: Duration,
    connections: u32,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--serve-upstream") {
        serve_upstream(args[i + 1].parse().expect("upstream address"));
        return;
    }
    if let Some(i) = args.iter().position(|a| a == "--open-loop") {
        open_loop_alone(&args[i + 1..]);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick") || std::env::var_os("SLUICE_BENCH_QUICK").is_some();
    let settings = Settings {
        quick,
        rounds: if quick { 1 } else { 3 },
        saturate: if quick {
            Duration::from_secs(3)
        } else {
            Duration::from_secs(8)
        },
        fixed: if quick {
            Duration::from_secs(3)
        } else {
            Duration::from_secs(7)
        },
        connections: 64,
    };
    let notes = ensure_tools();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let report = rt.block_on(run(&settings, notes));
    if quick || std::env::var_os("SLUICE_BENCH_SIDECAR_BIN").is_some() {
        eprintln!("quick mode or SLUICE_BENCH_SIDECAR_BIN: BENCHMARKS.md left as it is");
    } else {
        report::write_section(START, END, &report);
    }
    println!("{report}");
}

/// `--open-loop ADDR RATE SECS`: the fixed-rate client alone, after half a second at a quarter of the rate
/// to open connections; prints `p50_us p99_us errors`.
fn open_loop_alone(args: &[String]) {
    let [addr, rate, secs, ..] = args else {
        panic!("--open-loop ADDR RATE SECS");
    };
    let addr: SocketAddr = addr.parse().expect("address");
    let rate: u32 = rate.parse().expect("rate");
    let secs: u64 = secs.parse().expect("seconds");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let r = rt.block_on(async {
        let _ = open_loop(addr, rate / 4, Duration::from_millis(500)).await;
        open_loop(addr, rate, Duration::from_secs(secs)).await
    });
    println!("{} {} {}", r.p50_us, r.p99_us, r.errors);
}

/// The sidecar binary: `SLUICE_BENCH_SIDECAR_BIN` runs another build of it (see the crate docs).
fn sidecar_bin() -> String {
    std::env::var("SLUICE_BENCH_SIDECAR_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice-sidecar").to_owned())
}

/// Installs nginx-light and wrk from Debian when missing; returns what it did.
fn ensure_tools() -> Vec<String> {
    let mut notes = Vec::new();
    let missing: Vec<&str> = [("nginx", "nginx-light"), ("wrk", "wrk")]
        .into_iter()
        .filter(|(bin, _)| !on_path(bin))
        .map(|(_, pkg)| pkg)
        .collect();
    if !missing.is_empty() {
        let msg = format!("installed from Debian by the benchmark: {}", missing.join(", "));
        eprintln!("{msg} (apt-get install -y {})", missing.join(" "));
        let ok = Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "apt-get install {} failed (run apt-get update first?)",
            missing.join(" ")
        );
        notes.push(msg);
    }
    notes
}

fn on_path(bin: &str) -> bool {
    which(bin).is_some()
}

#[derive(Default, Clone)]
struct Row {
    name: String,
    rps: f64,
    sat_p50: String,
    sat_p99: String,
    fixed_p50_us: u64,
    fixed_p99_us: u64,
    fixed_errors: u64,
    non_2xx: u64,
    rss_kb: Option<u64>,
}

async fn run(s: &Settings, notes: Vec<String>) -> String {
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
    let mut redis = RedisServer::start();

    // Every setup runs at once (idle ones cost nothing) and is measured once per round, in turn, so
    // a noisy minute on this shared machine hits one round of every setup rather than all of one.
    let (_nginx, nginx_addr) = start_nginx(work.path(), upstream, false);
    let (_nginx_limit, nginx_limit_addr) = start_nginx(work.path(), upstream, true);
    let mut sidecars = Vec::new();
    let setups: [(&str, &str, bool); 3] = [
        ("sidecar, limiting off", NO_RULE, false),
        ("sidecar, fixedWindow in Redis", FIXED_WINDOW, true),
        ("sidecar, tokenBucket in Redis", TOKEN_BUCKET, true),
    ];
    for (name, yaml, with_redis) in setups {
        let (p, addr) = start_sidecar(
            work.path(),
            yaml,
            upstream,
            with_redis.then(|| redis.url()),
            !with_redis && yaml == NO_RULE,
        );
        if with_redis {
            wait_redis_healthy(&p);
        }
        sidecars.push((name, p, addr));
    }
    // Many clients: every request names one of 10,000 keys, so few arrive while a call for their own key
    // is in flight (saturation only: the fixed-rate client sends no key header).
    let (many_keys, many_keys_addr) =
        start_sidecar(work.path(), MANY_KEYS, upstream, Some(redis.url()), false);
    wait_redis_healthy(&many_keys);
    let script = work.path().join("many-keys.lua");
    std::fs::write(&script, MANY_KEYS_WRK).expect("write wrk script");

    let mut targets: Vec<(&str, SocketAddr, Option<&Proc>)> = vec![
        ("direct to the app", upstream, None),
        ("nginx proxy_pass", nginx_addr, None),
        ("nginx limit_req (not hit)", nginx_limit_addr, None),
    ];
    targets.extend(sidecars.iter().map(|(name, p, addr)| (*name, *addr, Some(p))));
    let mut samples: Vec<Vec<Row>> = vec![Vec::new(); targets.len() + 2];
    for round in 0..s.rounds {
        eprintln!("-- round {} of {}", round + 1, s.rounds);
        for (i, (name, addr, _)) in targets.iter().enumerate() {
            samples[i].push(measure(s, name, *addr).await);
        }
        samples[targets.len()].push(measure_saturation(s, NGINX_MANY_KEYS_ROW, nginx_addr, &script));
        samples[targets.len() + 1].push(measure_saturation(s, MANY_KEYS_ROW, many_keys_addr, &script));
    }
    let mut rows: Vec<Row> = samples.iter().map(|rounds| median(rounds)).collect();
    for (row, (_, addr, sidecar)) in rows.iter_mut().zip(&targets) {
        if let Some(p) = sidecar {
            let _ = open_loop(*addr, 1_000, Duration::from_secs(5)).await;
            row.rss_kb = rss(p.0.id());
        }
    }
    drop(many_keys);
    drop(sidecars);

    let url = redis.url();
    redis.kill();
    let (p, addr) = start_sidecar(work.path(), TOKEN_BUCKET, upstream, Some(url), false);
    let down: Vec<Row> = {
        let mut v = Vec::new();
        for _ in 0..s.rounds {
            v.push(measure(s, "sidecar, tokenBucket, Redis down", addr).await);
        }
        v
    };
    let mut down = median(&down);
    let _ = open_loop(addr, 1_000, Duration::from_secs(5)).await;
    down.rss_kb = rss(p.0.id());
    rows.push(down);
    drop(p);

    render(s, &rows, &notes)
}

const NO_RULE: &str = "version: 1\n";
/// The counter key sidecars with Redis run with (40 characters, as the operator writes them).
const BENCH_COUNTER_KEY: &str = "bench-counter-key-0123456789abcdefghijkl";
const FIXED_WINDOW: &str = r#"
version: 1
policy: {namespace: bench, name: bench, generation: 1}
limits:
  rules:
  - name: fixed
    key: [{type: clientIp}]
    algorithm: fixedWindow
    limit: {requests: 1000000000, window: 1h}
"#;
const TOKEN_BUCKET: &str = r#"
version: 1
policy: {namespace: bench, name: bench, generation: 1}
limits:
  rules:
  - name: bucket
    key: [{type: clientIp}]
    algorithm: tokenBucket
    limit: {requests: 1000000000, window: 1h, burst: 1000000}
"#;

const MANY_KEYS_ROW: &str = "sidecar, fixedWindow in Redis, 10,000 keys (wrk script)";
const NGINX_MANY_KEYS_ROW: &str = "nginx proxy_pass, 10,000 keys (same wrk script)";
// 10^8 per hour and key: never hit, and the default ceiling per client IP (10× the limit) still fits the
// scripts' exact counts (validation refuses 10^9: 10^10 × 3.6·10^6 ms is over 2^53).
const MANY_KEYS: &str = r#"
version: 1
policy: {namespace: bench, name: bench, generation: 1}
limits:
  rules:
  - name: per-client
    key: [{type: header, name: x-client}]
    algorithm: fixedWindow
    limit: {requests: 100000000, window: 1h}
"#;
const MANY_KEYS_WRK: &str = r#"
math.randomseed(42)
request = function()
  return wrk.format(nil, nil, {["X-Client"] = tostring(math.random(1, 10000))})
end
"#;

fn start_sidecar(
    dir: &Path,
    yaml: &str,
    upstream: SocketAddr,
    redis: Option<String>,
    limiting_off: bool,
) -> (Proc, SocketAddr) {
    let file = dir.join(format!("sidecar-{}.yaml", free_port()));
    let yaml = yaml.to_owned();
    std::fs::write(&file, yaml).expect("write config");
    let addr = local(free_port());
    let admin = local(free_port());
    let mut cmd = Command::new(sidecar_bin());
    cmd.arg("--config")
        .arg(&file)
        .env("SLUICE_LISTEN", addr.to_string())
        .env("SLUICE_ADMIN_LISTEN", admin.to_string())
        .env("SLUICE_UPSTREAM", format!("http://{upstream}"))
        .env("RUST_LOG", "warn")
        .env_remove("SLUICE_REDIS_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(url) = redis {
        // As the webhook injects it: counter names keyed with the namespace's counter key.
        cmd.env("SLUICE_REDIS_URL", url)
            .env("SLUICE_COUNTER_KEY", BENCH_COUNTER_KEY);
    }
    if limiting_off {
        cmd.env("RATE_LIMIT__ENABLED", "false");
    }
    let p = Proc(cmd.spawn().expect("spawn sidecar"));
    wait_port(addr);
    wait_port(admin);
    ADMIN.lock().unwrap().insert(p.0.id(), admin);
    (p, addr)
}

static ADMIN: Mutex<std::collections::BTreeMap<u32, SocketAddr>> =
    Mutex::new(std::collections::BTreeMap::new());

fn wait_redis_healthy(p: &Proc) {
    let admin = ADMIN.lock().unwrap()[&p.0.id()];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let body = http_get_blocking(admin, "/readyz");
        if body.contains("\"redisHealthy\":true") {
            return;
        }
        assert!(Instant::now() < deadline, "sidecar never reached Redis: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One round of one setup: saturation, then the fixed rate.
async fn measure(s: &Settings, name: &str, addr: SocketAddr) -> Row {
    eprintln!("== {name} ({addr})");
    // Warm up connections and pools.
    let _ = open_loop(addr, 500, Duration::from_millis(500)).await;
    let (rps, sat_p50, sat_p99, non_2xx) = wrk(addr, s.saturate, s.connections, None);
    let fixed = open_loop(addr, 2_000, s.fixed).await;
    let row = Row {
        name: name.into(),
        rps,
        sat_p50,
        sat_p99,
        fixed_p50_us: fixed.p50_us,
        fixed_p99_us: fixed.p99_us,
        fixed_errors: fixed.errors,
        non_2xx,
        rss_kb: None,
    };
    eprintln!(
        "   {:.0} req/s; at 2,000 req/s p50 {} µs p99 {} µs; errors {}; non-2xx {}",
        row.rps, row.fixed_p50_us, row.fixed_p99_us, row.fixed_errors, row.non_2xx
    );
    row
}

/// The median of a setup's rounds: throughput and its wrk latencies from the median-throughput round,
/// fixed-rate p50 and p99 each the median of the rounds', errors summed.
fn median(rounds: &[Row]) -> Row {
    let mid = |mut v: Vec<u64>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let mut by_rps: Vec<&Row> = rounds.iter().collect();
    by_rps.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    let middle = by_rps[by_rps.len() / 2];
    Row {
        fixed_p50_us: mid(rounds.iter().map(|r| r.fixed_p50_us).collect()),
        fixed_p99_us: mid(rounds.iter().map(|r| r.fixed_p99_us).collect()),
        fixed_errors: rounds.iter().map(|r| r.fixed_errors).sum(),
        non_2xx: rounds.iter().map(|r| r.non_2xx).sum(),
        ..middle.clone()
    }
}

/// Saturation only, with a wrk script shaping the requests (no fixed-rate or RSS columns).
fn measure_saturation(s: &Settings, name: &str, addr: SocketAddr, script: &Path) -> Row {
    eprintln!("== {name} ({addr})");
    let _ = wrk(addr, Duration::from_secs(1), s.connections, Some(script));
    let (rps, sat_p50, sat_p99, non_2xx) = wrk(addr, s.saturate, s.connections, Some(script));
    eprintln!("   {rps:.0} req/s; non-2xx {non_2xx}");
    Row {
        name: name.into(),
        rps,
        sat_p50,
        sat_p99,
        non_2xx,
        ..Row::default()
    }
}

/// wrk at saturation: requests/s, p50, p99 (as wrk prints them), non-2xx responses.
fn wrk(
    addr: SocketAddr,
    duration: Duration,
    connections: u32,
    script: Option<&Path>,
) -> (f64, String, String, u64) {
    let mut cmd = Command::new(which("wrk").expect("wrk"));
    cmd.args(["-t", "1", "-c", &connections.to_string(), "-d"])
        .arg(format!("{}s", duration.as_secs()))
        .arg("--latency");
    if let Some(script) = script {
        cmd.arg("-s").arg(script);
    }
    let out = cmd.arg(format!("http://{addr}/")).output().expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |prefix: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .unwrap_or_else(|| "?".into())
    };
    let rps = field("Requests/sec:").parse().unwrap_or(0.0);
    let non_2xx = text
        .lines()
        .find(|l| l.contains("Non-2xx or 3xx responses:"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    (rps, field("50%"), field("99%"), non_2xx)
}

struct FixedRate {
    p50_us: u64,
    p99_us: u64,
    errors: u64,
}

/// Keep-alive connections the open-loop client opens before it measures.
const WARM_CONNECTIONS: usize = 32;

/// Open loop: one request every 1/rate s on a pooled keep-alive client, each in its own task, so a slow
/// response never delays the next send. Latency is counted from the actual send: tokio's timer has 1 ms
/// granularity, so counting from the scheduled time would add up to 1 ms of the client's own lag to
/// every sample.
async fn open_loop(addr: SocketAddr, rate: u32, duration: Duration) -> FixedRate {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(512)
        .build_http();
    let uri: hyper::Uri = format!("http://{addr}/").parse().expect("uri");
    // Open the pool's connections before measuring, so no measured request pays a TCP handshake: 32
    // requests at once leave 32 idle keep-alive connections (at 2,000 req/s a few are in use at a time).
    let warm: Vec<_> = (0..WARM_CONNECTIONS)
        .map(|_| {
            let (client, uri) = (client.clone(), uri.clone());
            tokio::spawn(async move {
                if let Ok(resp) = client.get(uri).await {
                    let _ = resp.into_body().collect().await;
                }
            })
        })
        .collect();
    for t in warm {
        let _ = t.await;
    }
    let samples = Arc::new(Mutex::new(Vec::<u64>::with_capacity(
        (rate as usize) * duration.as_secs().max(1) as usize,
    )));
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let gap = Duration::from_secs_f64(1.0 / f64::from(rate));
    let start = tokio::time::Instant::now();
    let total = (duration.as_secs_f64() * f64::from(rate)) as u64;
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let scheduled = start + gap.mul_f64(i as f64);
        tokio::time::sleep_until(scheduled).await;
        let (client, uri, samples, errors) = (client.clone(), uri.clone(), samples.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let sent = tokio::time::Instant::now();
            let ok = match client.get(uri).await {
                Ok(resp) => {
                    let ok = resp.status().is_success();
                    ok && resp.into_body().collect().await.is_ok()
                }
                Err(_) => false,
            };
            if ok {
                let us = sent.elapsed().as_micros() as u64;
                samples.lock().unwrap().push(us);
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
    let pct = |p: f64| {
        v.get(((v.len() as f64 * p) as usize).min(v.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    FixedRate {
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        errors: errors.load(std::sync::atomic::Ordering::Relaxed),
    }
}

fn rss(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The version line of tool `cmd`, found like the benchmark runs it.
fn tool_version(cmd: &str, args: &[&str]) -> String {
    report::version_of(which(cmd).unwrap_or_else(|| PathBuf::from(cmd)), args)
}

fn render(s: &Settings, rows: &[Row], notes: &[String]) -> String {
    let cpu = report::cpu_model();
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
                    / 1024
                    / 1024
            })
        })
        .unwrap_or(0);
    let load = report::load_average();
    let mut out = String::new();
    let _ = writeln!(out, "{START}");
    let _ = writeln!(out, "## Rate-limit overhead (sidecar vs nginx)\n");
    let _ = writeln!(
        out,
        "Run: `cargo bench -p sluice-sidecar --bench ratelimit{}` at {} UTC.\n",
        if s.quick { " -- --quick" } else { "" },
        chrono::Utc::now().format("%Y-%m-%d %H:%M")
    );
    if s.quick {
        let _ = writeln!(
            out,
            "> **Quick mode** ({}s per phase): a smoke run proving the harness works, on a machine shared \
             with other builds (load average at the end: {}). These numbers are noisy and are not the \
             result; the real run happens on a quiet machine without `--quick`.\n",
            s.saturate.as_secs(),
            load
        );
    }
    let _ = writeln!(
        out,
        "Machine: {cpu}, {cores} cores, {mem} GiB; kernel {}; load average at the end {}.",
        tool_version("uname", &["-r"]),
        load
    );
    let _ = writeln!(
        out,
        "Versions: {}; {}; {}; {}; sluice-sidecar {} (release profile).\n",
        tool_version("rustc", &["-V"]),
        tool_version("nginx", &["-v"]),
        tool_version("wrk", &["-v"]).split(" [").next().unwrap_or("?"),
        tool_version("redis-server", &["--version"])
            .split(" sha=")
            .next()
            .unwrap_or("?"),
        env!("CARGO_PKG_VERSION"),
    );
    for n in notes {
        let _ = writeln!(out, "Note: {n}.\n");
    }
    let _ = writeln!(
        out,
        "Method: one upstream (a hyper server answering 200 with 19 bytes, its own process), every proxy on \
         127.0.0.1, all running at once and measured in turn, in {} interleaved rounds; each row is the median \
         round (a noisy minute on this shared machine hits one round of every setup, not all of one). \
         *Saturation*: wrk, 1 thread, {} keep-alive connections, {}s per round; the row shows the round with \
         the median throughput. *Fixed rate*: an open-loop Rust client at 2,000 req/s for {}s per round (32 \
         keep-alive connections opened before measuring; each request sent on schedule in its own task, \
         never waiting for earlier ones; latency from its actual send, since tokio's 1 ms timer would add the \
         client's own lag); p50 and p99 are the medians of the \
         rounds'. RSS: the sidecar's VmRSS after 5s at 1,000 req/s, after the rounds. The \"Redis down\" row \
         is measured after the others, in rounds of its own. \
         nginx: `worker_processes auto`, upstream keepalive 128, access log off; `limit_req` at 1,000,000 r/s \
         burst 1,000,000 nodelay (never hit). Sidecar: default config (tokio on all cores), limits never hit \
         (10⁹ per hour; 10⁸ per key for the 10,000-key rule, a header key, which nginx is measured against \
         with the same wrk script), client-IP key, `failureMode: local`, counter names keyed with a \
         `SLUICE_COUNTER_KEY` as injected sidecars are; \"Redis down\" = the redis-server killed before \
         the sidecar starts, so the circuit breaker is open and decisions come from the local fallback. The \
         load generator, the upstream and the proxy share the machine's cores.\n",
        s.rounds,
        s.connections,
        s.saturate.as_secs(),
        s.fixed.as_secs(),
    );
    let _ = writeln!(
        out,
        "| setup | saturation req/s | sat. p50 | sat. p99 | 2,000 req/s p50 | 2,000 req/s p99 | errors / non-2xx | RSS at 1,000 req/s |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let fixed_rate = if r.name == MANY_KEYS_ROW || r.name == NGINX_MANY_KEYS_ROW {
            "– | – | – / ".to_owned()
        } else {
            format!(
                "{:.2} ms | {:.2} ms | {} / ",
                r.fixed_p50_us as f64 / 1000.0,
                r.fixed_p99_us as f64 / 1000.0,
                r.fixed_errors
            )
        };
        let _ = writeln!(
            out,
            "| {} | {:.0} | {} | {} | {fixed_rate}{} | {} |",
            r.name,
            r.rps,
            r.sat_p50,
            r.sat_p99,
            r.non_2xx,
            r.rss_kb
                .map_or("–".into(), |kb| format!("{:.1} MB", kb as f64 / 1024.0))
        );
    }
    let find = |n: &str| rows.iter().find(|r| r.name == n).cloned().unwrap_or_default();
    let direct = find("direct to the app");
    let nginx = find("nginx proxy_pass");
    let nginx_lr = find("nginx limit_req (not hit)");
    let fixed = find("sidecar, fixedWindow in Redis");
    let bucket = find("sidecar, tokenBucket in Redis");
    let down = find("sidecar, tokenBucket, Redis down");
    let off = find("sidecar, limiting off");
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let added = |r: &Row| (r.fixed_p99_us as f64 - direct.fixed_p99_us as f64) / 1000.0;
    let _ = writeln!(out, "\nRatios and targets (2-core goal):\n");
    let _ = writeln!(out, "| measure | value | target |");
    let _ = writeln!(out, "|---|---:|---|");
    let _ = writeln!(
        out,
        "| sidecar (limiting off) / nginx proxy_pass throughput | {:.2}× | – |",
        ratio(off.rps, nginx.rps)
    );
    let _ = writeln!(
        out,
        "| sidecar fixedWindow in Redis / nginx proxy_pass throughput | {:.2}× | ≥ 1.2× |",
        ratio(fixed.rps, nginx.rps)
    );
    let _ = writeln!(
        out,
        "| sidecar tokenBucket in Redis / nginx proxy_pass throughput | {:.2}× | ≥ 1.2× |",
        ratio(bucket.rps, nginx.rps)
    );
    let _ = writeln!(
        out,
        "| sidecar tokenBucket in Redis / nginx limit_req throughput | {:.2}× | – |",
        ratio(bucket.rps, nginx_lr.rps)
    );
    let _ = writeln!(
        out,
        "| sidecar fixedWindow in Redis, 10,000 keys / nginx proxy_pass throughput, same wrk script | {:.2}× | ≥ 0.8× |",
        ratio(find(MANY_KEYS_ROW).rps, find(NGINX_MANY_KEYS_ROW).rps)
    );
    let _ = writeln!(
        out,
        "| p99 added over direct at 2,000 req/s, fixedWindow in Redis | {:.2} ms | ≤ 0.3 ms |",
        added(&fixed)
    );
    let _ = writeln!(
        out,
        "| p99 added over direct at 2,000 req/s, tokenBucket in Redis | {:.2} ms | ≤ 0.3 ms |",
        added(&bucket)
    );
    let _ = writeln!(
        out,
        "| p99 added over direct at 2,000 req/s, Redis down | {:.2} ms | ≤ 5 ms |",
        added(&down)
    );
    let max_rss = rows.iter().filter_map(|r| r.rss_kb).max().unwrap_or(0);
    let _ = writeln!(
        out,
        "| largest sidecar RSS at 1,000 req/s | {:.1} MB | < 20 MB |",
        max_rss as f64 / 1024.0
    );
    let _ = writeln!(out, "\n{END}");
    out
}
