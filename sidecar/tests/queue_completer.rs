//! The worker's completer against a real PostgreSQL: a completion write that does not end holds up
//! no other job's outcome.

mod queue_support;

use std::{sync::Arc, time::Duration};

use queue_support::*;
use sluice_queue::{NewJob, QueueSettings, QueueStore};
use sluice_sidecar::queue::{Outcome, Worker};
use sluice_testsupport::wait_for_async;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_writes_a_finished_job_while_another_jobs_write_waits_on_a_row_lock() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    // A long lease: the held job is not rescued while the test holds its row.
    store
        .upsert_queue(&QueueSettings {
            lease_ms: 60_000,
            ..settings("held")
        })
        .await
        .unwrap();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let handler = FnHandler::new(move |job, _| {
        let hold = job.payload["hold"].as_bool().unwrap_or(false);
        let (started_tx, g) = (started_tx.clone(), g.clone());
        async move {
            if hold {
                let _ = started_tx.send(job.id);
                g.notified().await;
            }
            Outcome::Succeeded
        }
    });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(
        Worker::new(
            store.clone(),
            handler,
            sluice_sidecar::queue::WorkerOptions {
                concurrency: 4,
                claim_batch: 10,
                ..opts("held", "w1")
            },
        )
        .run(shutdown.clone()),
    );

    // The first job's row is locked by another transaction while its handler runs: its completion
    // write then waits on the lock for as long as the test holds it.
    let held = store
        .enqueue("held", &NewJob::new("k", serde_json::json!({"hold": true})))
        .await
        .unwrap()
        .id;
    let running = tokio::time::timeout(DEADLINE, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(running, held);
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR UPDATE")
        .bind(held)
        .execute(&mut *lock)
        .await
        .unwrap();
    gate.notify_one();
    wait_for_async("the held job's write to wait on its row lock", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (waiting > 0).then_some(())
        }
    })
    .await;

    // A job finishing meanwhile is written by the other write slot, one outcome alone.
    let quick = store
        .enqueue("held", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    wait_state(&store, quick, "succeeded").await;
    assert_eq!(state(&store, held).await, "running");

    lock.rollback().await.unwrap();
    wait_state(&store, held, "succeeded").await;
    shutdown.cancel();
    w.await.unwrap().unwrap();
}
