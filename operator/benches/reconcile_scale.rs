//! The operator at scale (a benchmark, not a test): `cargo bench -p sluice-operator --bench
//! reconcile_scale [-- --quick]`.
//!
//! The in-memory test API server runs in this process; the operator is the `sluice-operator` binary in a
//! process of its own (so its memory and CPU are its own), reconciling against one Redis and one
//! PostgreSQL. N RateLimitPolicies and N JobQueues (N = 1,000; `--quick`: 100) are created at once, and
//! the run measures the time until every object's `status.observedGeneration` has caught up, the
//! operator's reconcile time per object from its own `/metrics`, its CPU, and its RSS; then the operator
//! is restarted over the same objects and the time until it has started a reconcile of every one is measured.
//! A full run rewrites the section between `<!-- bench:cost-growth-operator:start -->` and
//! `<!-- bench:cost-growth-operator:end -->` in BENCHMARKS.md.
//!
//! To see why each object was reconciled: `SLUICE_BENCH_RUST_LOG=warn,sluice_operator::controller=debug,kube_runtime::controller=info`
//! logs every reconcile with kube-runtime's reason for it, and `SLUICE_BENCH_LOG_FILE=<path>` keeps a
//! copy of the operator's log.

#![allow(missing_docs)] // a benchmark binary: its items are not an API

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::BufRead as _,
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::{StreamExt, stream};
use kube::api::{ListParams, PostParams};
use serde_json::json;
use sluice_crds::{job_queue::JobQueue, rate_limit_policy::RateLimitPolicy};
use sluice_e2e::{Env, TestNamespace};
use sluice_testsupport::{PgServer, RedisServer, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const START: &str = "<!-- bench:cost-growth-operator:start -->";
const END: &str = "<!-- bench:cost-growth-operator:end -->";
const OPERATOR_NS: &str = "sluice-system";
/// How long every object may take to be reconciled before the run fails.
const DEADLINE: Duration = Duration::from_secs(600);

/// A child process killed on drop, with the failed reconciles its log reported (see [`failures`]).
struct Proc(Child, Failures);

/// Failed reconciles the operator logged, by controller and error with digits blanked (so that the
/// errors of `api-1` and `api-2` count together).
type Failures = Arc<Mutex<BTreeMap<(String, String), u64>>>;

/// Reads the operator's JSON log from `log`, counting its failed reconciles (`reconcile failed` at
/// warn, `not ready` at info: what `error_policy` logs) into the returned map; other lines at warn
/// and above are passed on to the bench's stderr.
fn failures(log: impl std::io::Read + Send + 'static) -> Failures {
    let failures = Failures::default();
    let counts = failures.clone();
    // `SLUICE_BENCH_LOG_FILE`: every line of the operator's log is also appended there.
    let mut copy = std::env::var_os("SLUICE_BENCH_LOG_FILE").map(|path| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("open SLUICE_BENCH_LOG_FILE")
    });
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(log).lines().map_while(Result::ok) {
            if let Some(f) = copy.as_mut() {
                use std::io::Write as _;
                let _ = writeln!(f, "{line}");
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                eprintln!("{line}");
                continue;
            };
            let f = &v["fields"];
            let message = f["message"].as_str().unwrap_or_default();
            if message == "reconcile failed" || message == "not ready" {
                let error = f["error"].as_str().unwrap_or_default();
                let blanked = digits_blanked(error);
                let controller = f["controller"].as_str().unwrap_or_default().to_owned();
                *counts.lock().unwrap().entry((controller, blanked)).or_default() += 1;
            } else if v["level"] != "INFO" {
                eprintln!("{line}");
            }
        }
    });
    failures
}

/// `text` with every run of digits replaced by `N`.
fn digits_blanked(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('N') {
                out.push('N');
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn status_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// How many sockets process `pid` holds open (its connections to the API server, Redis, PostgreSQL,
/// and its listeners).
fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.filter_map(Result::ok)
                .filter(|fd| {
                    std::fs::read_link(fd.path()).is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

fn cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    [11, 12]
        .iter()
        .filter_map(|i| f.get(*i).and_then(|v| v.parse::<f64>().ok()))
        .sum::<f64>()
        / 100.0
}

fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

async fn http_body(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Some(text.split_once("\r\n\r\n")?.1.to_owned())
}

/// A metric of controller `controller` from the operator's `/metrics`: the sum of the samples named
/// `name` with that label.
fn metric(text: &str, name: &str, controller: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(&format!("controller=\"{controller}\"")))
        .filter(|l| l[name.len()..].starts_with('{'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn start_operator(kubeconfig: &Path, webhook_port: u16, metrics: SocketAddr) -> Proc {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-operator"))
        .args(["run", "--namespace", OPERATOR_NS, "--pod-name", "operator-0"])
        .args(["--webhook-listen", &format!("127.0.0.1:{webhook_port}")])
        .args(["--metrics-listen", &metrics.to_string()])
        .args(["--external-metrics-listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--sidecar-image", "sluice-sidecar:bench", "--log-format", "json"])
        .env("KUBECONFIG", kubeconfig)
        // `not ready` (a failure the user must fix) is logged at info; `SLUICE_BENCH_RUST_LOG` replaces
        // the filter (e.g. to see every reconcile and its trigger at debug).
        .env(
            "RUST_LOG",
            std::env::var("SLUICE_BENCH_RUST_LOG")
                .unwrap_or_else(|_| "warn,sluice_operator::controller=info".into()),
        )
        // The log is written to stdout.
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn sluice-operator");
    let log = child.stdout.take().expect("the operator's stdout");
    Proc(child, failures(log))
}

/// The samples of metric `name` by their labels (`controller="…",reason="…"`), summed.
fn by_labels(text: &str, name: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with(name)) {
        let Some(labels) = l[name.len()..].strip_prefix('{').and_then(|r| r.split_once('}')) else {
            continue;
        };
        if let Ok(v) = labels.1.trim().parse::<f64>() {
            *out.entry(labels.0.to_owned()).or_default() += v;
        }
    }
    out
}

/// How many RateLimitPolicies and JobQueues in `ns` have a status that caught up with their generation.
async fn caught_up(ns: &TestNamespace) -> (usize, usize) {
    let lp = ListParams::default();
    let rlp = ns
        .api::<RateLimitPolicy>()
        .list(&lp)
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation)
                .count()
        })
        .unwrap_or(0);
    let jq = ns
        .api::<JobQueue>()
        .list(&lp)
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|q| q.status.as_ref().and_then(|s| s.observed_generation) == q.metadata.generation)
                .count()
        })
        .unwrap_or(0);
    (rlp, jq)
}

struct Measured {
    n: usize,
    create_secs: f64,
    all_secs: f64,
    rlp_secs: f64,
    jq_secs: f64,
    rlp_mean_ms: f64,
    jq_mean_ms: f64,
    rlp_reconciles: f64,
    jq_reconciles: f64,
    errors: f64,
    /// Failed reconciles by `controller="…",reason="…"` (the operator's metric).
    errors_by_reason: BTreeMap<String, f64>,
    /// Failed reconciles by controller and logged error (digits blanked).
    failures: BTreeMap<(String, String), u64>,
    cpu_secs: f64,
    rss_idle_kb: u64,
    rss_kb: u64,
    hwm_kb: u64,
    sockets_peak: usize,
    sockets: usize,
    restart_secs: f64,
    restart_rss_kb: u64,
    restart_cpu_secs: f64,
    load: String,
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 100 } else { 1000 };
    let started = chrono::Utc::now();
    let env = Env::in_memory(Default::default())
        .await
        .expect("in-memory API server");
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    env.apply_yaml(
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OPERATOR_NS}}}\n"),
        None,
    )
    .await
    .unwrap();
    let webhook_port = free_port();
    env.server().expect("in-memory API server").route_service(
        OPERATOR_NS,
        "sluice-webhook",
        443,
        SocketAddr::from(([127, 0, 0, 1], webhook_port)),
    );
    let ns = env.namespace("scale").await.unwrap();
    let redis = RedisServer::start();
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    ns.apply_yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: redis}}\nstringData: {{url: \"{}\"}}\n---\n\
         apiVersion: v1\nkind: Secret\nmetadata: {{name: pg}}\nstringData: {{url: \"{}\"}}\n",
        redis.url(),
        pg.url()
    ))
    .await
    .unwrap();

    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let op = start_operator(env.kubeconfig_path(), webhook_port, metrics_addr);
    let pid = op.0.id();
    // Up and leading before the objects come: the run times reconciles, not startup.
    let t_start = Instant::now();
    loop {
        if let Some(text) = http_body(metrics_addr, "/metrics").await
            && text
                .lines()
                .any(|l| l.starts_with("sluice_operator_leader ") && l.ends_with(" 1"))
        {
            break;
        }
        assert!(
            t_start.elapsed() < Duration::from_secs(60),
            "the operator never led"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let rss_idle_kb = status_kb(pid, "VmRSS:");
    let cpu0 = cpu_secs(pid);
    eprintln!("operator leading; RSS {rss_idle_kb} kB; creating {n} RateLimitPolicies and {n} JobQueues");

    let t0 = Instant::now();
    let rlps = ns.api::<RateLimitPolicy>();
    let jqs = ns.api::<JobQueue>();
    stream::iter(0..2 * n)
        .for_each_concurrent(16, |i| {
            let (rlps, jqs) = (rlps.clone(), jqs.clone());
            async move {
                if i % 2 == 0 {
                    let p: RateLimitPolicy = serde_json::from_value(json!({
                        "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
                        "metadata": {"name": format!("api-{}", i / 2)},
                        "spec": {"selector": {"matchLabels": {"app": format!("api-{}", i / 2)}},
                                 "redis": {"secretRef": {"name": "redis"}},
                                 "rules": [{"name": "all", "limit": {"requests": 100, "window": "1s"}}]}
                    }))
                    .unwrap();
                    rlps.create(&PostParams::default(), &p).await.unwrap();
                } else {
                    let q: JobQueue = serde_json::from_value(json!({
                        "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
                        "metadata": {"name": format!("jobs-{}", i / 2)},
                        "spec": {"database": {"secretRef": {"name": "pg"}},
                                 "worker": {"template": {"spec": {"containers": [
                                     {"name": "handler", "image": "handler:1"}]}},
                                            "concurrency": 4}}
                    }))
                    .unwrap();
                    jqs.create(&PostParams::default(), &q).await.unwrap();
                }
            }
        })
        .await;
    let create_secs = t0.elapsed().as_secs_f64();
    eprintln!("created in {create_secs:.1} s");
    let (mut rlp_secs, mut jq_secs) = (None, None);
    let mut hwm_kb = 0;
    let mut sockets_peak = 0;
    loop {
        let (r, q) = caught_up(&ns).await;
        hwm_kb = hwm_kb.max(status_kb(pid, "VmHWM:"));
        sockets_peak = sockets_peak.max(sockets(pid));
        if r == n && rlp_secs.is_none() {
            rlp_secs = Some(t0.elapsed().as_secs_f64());
        }
        if q == n && jq_secs.is_none() {
            jq_secs = Some(t0.elapsed().as_secs_f64());
        }
        if r == n && q == n {
            break;
        }
        assert!(
            t0.elapsed() < DEADLINE,
            "not reconciled in time: {r} policies, {q} JobQueues of {n}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_secs(pid) - cpu0;
    let text = http_body(metrics_addr, "/metrics").await.unwrap_or_default();
    let mean_ms = |c: &str| {
        1000.0 * metric(&text, "sluice_operator_reconcile_time_seconds_sum", c)
            / metric(&text, "sluice_operator_reconcile_time_seconds_count", c)
    };
    let errors = metric(&text, "sluice_operator_reconcile_errors_total", "ratelimitpolicy")
        + metric(&text, "sluice_operator_reconcile_errors_total", "jobqueue");
    let rss_kb = status_kb(pid, "VmRSS:");
    let hwm_kb = hwm_kb.max(status_kb(pid, "VmHWM:"));
    let sockets_end = sockets(pid);
    let m_rlp_reconciles = metric(&text, "sluice_operator_reconcile_total", "ratelimitpolicy");
    let m_jq_reconciles = metric(&text, "sluice_operator_reconcile_total", "jobqueue");
    eprintln!(
        "all reconciled in {all_secs:.1} s; operator CPU {cpu:.1} s; RSS {rss_kb} kB (peak {hwm_kb} kB); \
         sockets {sockets_end} (peak {sockets_peak}); reconciles {m_rlp_reconciles} + {m_jq_reconciles}, \
         errors {errors}"
    );
    let rlp_mean_ms = mean_ms("ratelimitpolicy");
    let jq_mean_ms = mean_ms("jobqueue");
    let errors_by_reason = by_labels(&text, "sluice_operator_reconcile_errors_total");
    for (labels, n) in &errors_by_reason {
        eprintln!("  errors {{{labels}}}: {n}");
    }
    let failures = op.1.lock().unwrap().clone();
    for ((controller, error), n) in &failures {
        eprintln!("  {controller}: {n} × {error}");
    }
    drop(op);

    // A restart over the same objects: until each controller has started a reconcile of every object.
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let t1 = Instant::now();
    let op = start_operator(env.kubeconfig_path(), webhook_port, metrics_addr);
    let pid = op.0.id();
    loop {
        let text = http_body(metrics_addr, "/metrics").await.unwrap_or_default();
        // Reconciles started (the counter counts each as it begins), less failed ones.
        let begun = |c: &str| {
            metric(&text, "sluice_operator_reconcile_total", c)
                - metric(&text, "sluice_operator_reconcile_errors_total", c)
        };
        if begun("ratelimitpolicy") >= n as f64 && begun("jobqueue") >= n as f64 {
            break;
        }
        assert!(
            t1.elapsed() < DEADLINE,
            "the restarted operator did not start a reconcile of every object"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let restart_secs = t1.elapsed().as_secs_f64();
    let restart_rss_kb = status_kb(pid, "VmRSS:");
    let restart_cpu_secs = cpu_secs(pid);
    eprintln!("restart: every object's reconcile started in {restart_secs:.1} s; RSS {restart_rss_kb} kB");
    drop(op);

    let m = Measured {
        n,
        create_secs,
        all_secs,
        rlp_secs: rlp_secs.unwrap_or(all_secs),
        jq_secs: jq_secs.unwrap_or(all_secs),
        rlp_mean_ms,
        jq_mean_ms,
        rlp_reconciles: m_rlp_reconciles,
        jq_reconciles: m_jq_reconciles,
        errors,
        errors_by_reason,
        failures,
        cpu_secs: cpu,
        rss_idle_kb,
        rss_kb,
        hwm_kb,
        sockets_peak,
        sockets: sockets_end,
        restart_secs,
        restart_rss_kb,
        restart_cpu_secs,
        load: load_average(),
    };
    let section = render(&m, quick, started);
    println!("{section}");
    if quick {
        eprintln!("--quick: BENCHMARKS.md left as it is");
    } else {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../BENCHMARKS.md");
        let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
        let new = match (old.find(START), old.find(END)) {
            (Some(a), Some(b)) if b > a => {
                format!("{}{}{}", &old[..a], section.trim_end(), &old[b + END.len()..])
            }
            _ => format!("{}\n\n{}", old.trim_end(), section),
        };
        std::fs::write(&path, new).expect("write BENCHMARKS.md");
        eprintln!("wrote {}", path.display());
    }
    // Deleting the namespace would make the in-memory server collect its thousands of objects one by
    // one, each write copying its object map: many minutes of a core at the end of a throwaway run.
    std::mem::forget(ns);
}

fn render(m: &Measured, quick: bool, started: chrono::DateTime<chrono::Utc>) -> String {
    let mb = |kb: u64| kb as f64 / 1024.0;
    let mut out = String::new();
    let _ = writeln!(out, "{START}");
    let _ = writeln!(
        out,
        "### Operator: {} RateLimitPolicies and {} JobQueues\n",
        m.n, m.n
    );
    let _ = writeln!(
        out,
        "Run: `cargo bench -p sluice-operator --bench reconcile_scale{}` at {} UTC (load average at the end \
         {}). The in-memory test API server in the bench process; the `sluice-operator` binary (release \
         profile) in its own, leading, with one Redis and one PostgreSQL behind every object (one namespace). \
         The objects are created 16 at a time; \"reconciled\" is every object's `status.observedGeneration` \
         equal to its `metadata.generation` (polled with a list every 200 ms). Mean reconcile time from the \
         operator's `sluice_operator_reconcile_time_seconds`; CPU and RSS from `/proc`. Restart: the operator \
         stopped and started again over the same objects, timed until each controller has started a \
         reconcile of every object (`sluice_operator_reconcile_total` less errors).\n",
        if quick { " -- --quick" } else { "" },
        started.format("%Y-%m-%d %H:%M"),
        m.load
    );
    let _ = writeln!(out, "| measurement | result |");
    let _ = writeln!(out, "|---|---:|");
    let rows = [
        ("objects created (API server)", format!("{:.1} s", m.create_secs)),
        (
            "every RateLimitPolicy reconciled, from the first create",
            format!("{:.1} s", m.rlp_secs),
        ),
        (
            "every JobQueue reconciled, from the first create",
            format!("{:.1} s", m.jq_secs),
        ),
        (
            "every object reconciled, from the first create",
            format!("{:.1} s", m.all_secs),
        ),
        (
            "reconciles (RateLimitPolicy / JobQueue), errors",
            format!(
                "{:.0} / {:.0}, {:.0}",
                m.rlp_reconciles,
                m.jq_reconciles,
                m.errors.abs()
            ),
        ),
        (
            "mean reconcile time (RateLimitPolicy / JobQueue)",
            format!("{:.1} / {:.1} ms", m.rlp_mean_ms, m.jq_mean_ms),
        ),
        (
            "operator CPU, create to all reconciled",
            format!(
                "{:.1} s ({:.2} ms per object)",
                m.cpu_secs,
                1000.0 * m.cpu_secs / (2 * m.n) as f64
            ),
        ),
        (
            "operator RSS, idle before the objects",
            format!("{:.1} MB", mb(m.rss_idle_kb)),
        ),
        ("operator RSS, all reconciled", format!("{:.1} MB", mb(m.rss_kb))),
        ("operator peak RSS (VmHWM)", format!("{:.1} MB", mb(m.hwm_kb))),
        (
            "operator's open sockets, all reconciled (most seen while polling)",
            format!("{} ({})", m.sockets, m.sockets_peak),
        ),
        (
            "restart: a reconcile of every object started",
            format!(
                "{:.1} s (CPU {:.1} s, RSS {:.1} MB)",
                m.restart_secs,
                m.restart_cpu_secs,
                mb(m.restart_rss_kb)
            ),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    if m.errors > 0.0 {
        let _ = writeln!(
            out,
            "\nFailed reconciles until all were reconciled, by the operator's \
             `sluice_operator_reconcile_errors_total` and by the error its log gave (digits as N):\n"
        );
        for (labels, n) in &m.errors_by_reason {
            let _ = writeln!(out, "- `{{{labels}}}`: {n:.0}");
        }
        for ((controller, error), n) in &m.failures {
            let _ = writeln!(out, "- {controller}, {n}×: `{error}`");
        }
    }
    let _ = writeln!(out, "\n{END}");
    out
}
