//! The worker role runs the schedules of its config: two workers on one database, a schedule firing
//! every second, and each fire time makes one job.

mod queue_support;

use queue_support::*;
use sluice_sidecar::queue::role;
use sluice_testsupport::wait_for_async;
use tokio_util::sync::CancellationToken;

/// Worker start (migrations, two processes' worth of tasks) plus two fire times, with room for a
/// loaded 2-core machine.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_run_a_configured_schedule_and_each_fire_time_makes_one_job() {
    let (pg, pool) = pg().await;
    let config = format!(
        r#"
queue:
  databaseUrl: {}
  queues: [ticks]
  worker: {{metricsListen: "127.0.0.1:0"}}
  handler: {{url: "http://127.0.0.1:9/jobs"}}
  schedules:
    - {{name: every-second, cron: "* * * * * *", kind: tick, payload: {{"from": "config"}}}}
"#,
        pg.url()
    );
    let shutdown = CancellationToken::new();
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let cfg = role::load_worker_config(Some(&config), &[] as &[(&str, &str); 0]).unwrap();
            tokio::spawn(role::run_worker(cfg, shutdown.clone()))
        })
        .collect();
    let keys = wait_for_async("two fire times enqueued", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let keys: Vec<String> = sqlx::query_scalar(
                "SELECT unique_key FROM sluice.jobs WHERE kind = 'tick' ORDER BY unique_key",
            )
            .fetch_all(&pool)
            .await
            .ok()?;
            (keys.len() >= 2).then_some(keys)
        }
    })
    .await;
    shutdown.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }
    let mut distinct = keys.clone();
    distinct.dedup();
    assert_eq!(
        distinct, keys,
        "one job per fire time, though two workers ran the schedule"
    );
    assert!(
        keys.iter().all(|k| k.starts_with("schedule:every-second:")),
        "{keys:?}"
    );
}
