//! What the queue benchmarks share: filling a queue, awaiting its burn-down, the raw SQL limit's pgbench
//! run, a process's and PostgreSQL's CPU time and PostgreSQL's programs.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use sluice_queue::{NewJob, QueueSettings, QueueStore, sql};
use sluice_testsupport::PgServer;

/// Registers `queue` and inserts `n` no-op jobs in batches, then refreshes the table's statistics.
pub async fn fill(store: &QueueStore, queue: &str, n: usize) {
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

/// Longest a burn-down may take before the bench gives up on it (a worker that stopped, a job that
/// never succeeds): a failed run rather than one that never ends.
pub const BURN_DOWN_DEADLINE: Duration = Duration::from_secs(600);

/// Waits until `count()` reaches `n`, looking every millisecond: first the jobs a bench's handler has
/// seen (counted in memory), then the jobs its worker has recorded ([`succeeded_in`]), which is asked
/// only in the last moments of a burn-down (the last completion batch). Panics, naming `what`, after
/// [`BURN_DOWN_DEADLINE`].
pub async fn wait_counted<F: Future<Output = u64>>(what: &str, mut count: impl FnMut() -> F, n: usize) {
    let deadline = Instant::now() + BURN_DOWN_DEADLINE;
    loop {
        let seen = count().await as usize;
        if seen >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {seen} of {n} after {BURN_DOWN_DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Jobs of `queue` a worker has recorded as succeeded, from its metrics text (Prometheus exposition):
/// the sum of its `sluice_jobs_succeeded_total` series for that queue. A worker counts a job there once
/// the statement writing its outcome has committed, so this reaching N is the end of a burn-down, found
/// without asking PostgreSQL (a probe of the table would take its time from the workers measured).
pub fn succeeded_in(metrics: &str, queue: &str) -> u64 {
    let label = format!("queue=\"{queue}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("sluice_jobs_succeeded_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Asserts that no job of `queue` is waiting or running: checked once a worker's own count says the
/// burn-down is over, after its timing.
pub async fn assert_drained(store: &QueueStore, queue: &str) {
    assert!(
        !busy(store, queue).await,
        "queue {queue} not drained when its worker counted every job"
    );
}

async fn busy(store: &QueueStore, queue: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM sluice.jobs WHERE queue = $1 AND state IN ('pending', 'retrying')) \
             OR EXISTS (SELECT 1 FROM sluice.jobs WHERE queue = $1 AND state = 'running')",
    )
    .bind(queue)
    .fetch_one(store.pool())
    .await
    .unwrap()
}

/// Waits until no job of `queue` is waiting or running, looking every 10 ms. The probe is an EXISTS over
/// the partial indexes (a count would steal more CPU from the workers measured), but it still reads past
/// the claimed jobs' index entries: about 1 ms of PostgreSQL's time per probe at 100k jobs (more just
/// after a burn-down, before vacuum: 15-150 ms).
pub async fn wait_drained(store: &QueueStore, queue: &str) {
    while busy(store, queue).await {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// CPU seconds (user + system) process `pid` has used so far.
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th fields.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// Where PostgreSQL's `name` program is (Debian's versioned directories first).
pub fn pg_bin(name: &str) -> String {
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

/// CPU seconds of the children `pid` has waited for (cutime and cstime, the 16th and 17th fields).
fn exited_children_cpu_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(13).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(14).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    ticks / 100.0
}

/// CPU seconds PostgreSQL has used so far: the postmaster, its children that exited (backends of
/// closed connections) and its live children (backends, autovacuum, background writers).
pub fn pg_cpu(pg: &PgServer) -> f64 {
    let Some(master) = pg.pid() else { return 0.0 };
    let mut total = cpu_secs(master) + exited_children_cpu_secs(master);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok());
        if ppid == Some(master) {
            total += cpu_secs(pid);
        }
    }
    total
}

/// The raw SQL limit on `queue`'s `n` jobs: 4 pgbench clients claim 100 jobs with the worker's claim
/// statement and complete them, one autocommit statement each. Returns pgbench's wall time in seconds.
pub fn pgbench_claim_complete(pg: &PgServer, queue: &str, n: usize) -> f64 {
    let script = std::env::temp_dir().join(format!("sluice-bench-{queue}-{}.sql", std::process::id()));
    // The worker's claim statement, its parameters as pgbench variables, on one line.
    let claim = sql::JOB_CLAIM_BATCH
        .replace("$1", &format!("'{queue}'"))
        .replace("$2", "'pgbench-' || :client_id")
        .replace("$3", "100")
        .replace("$4", "30000")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    std::fs::write(
        &script,
        format!(
            "{claim};\n\
             UPDATE sluice.jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL, \
             lease_expires_at = NULL WHERE queue = '{queue}' AND state = 'running' \
             AND lease_owner = 'pgbench-' || :client_id;\n"
        ),
    )
    .unwrap();
    let clients = 4;
    let t0 = Instant::now();
    let out = Command::new(pg_bin("pgbench"))
        .args(["-n", "-M", "prepared", "-c", &clients.to_string(), "-j", "2"])
        .args(["-t", &n.div_ceil(100 * clients).to_string(), "-f"])
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
    secs
}
