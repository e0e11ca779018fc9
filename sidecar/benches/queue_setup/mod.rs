//! What the queue benchmarks share: filling a queue, awaiting its burn-down, a process's CPU time and
//! PostgreSQL's programs.

use std::time::Duration;

use sluice_queue::{NewJob, QueueSettings, QueueStore};

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

/// Waits until no job of `queue` is waiting or running. The probe is an EXISTS over the partial indexes,
/// so polling costs the database next to nothing (a count would steal CPU from the workers measured).
pub async fn wait_drained(store: &QueueStore, queue: &str) {
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
