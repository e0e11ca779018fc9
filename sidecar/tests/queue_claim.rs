//! Claiming under contention: many workers, each job handled exactly once.

mod queue_support;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use queue_support::*;
use sluice_sidecar::queue::{NewJob, Outcome, QueueStore, Worker};
use sluice_testsupport::wait_for_async;
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_workers_process_two_thousand_jobs_each_exactly_once() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "contended").await;
    let jobs: Vec<NewJob> = (0..2000)
        .map(|i| NewJob::new("work", serde_json::json!({ "n": i })))
        .collect();
    for chunk in jobs.chunks(500) {
        store.enqueue_many("contended", chunk).await.unwrap();
    }

    let seen: Arc<Mutex<HashMap<uuid::Uuid, Vec<String>>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..8 {
        let owner = format!("worker-{w}");
        let seen = seen.clone();
        let who = owner.clone();
        let handler = FnHandler::new(move |job, _| {
            let seen = seen.clone();
            let who = who.clone();
            async move {
                seen.lock().unwrap().entry(job.id).or_default().push(who);
                tokio::task::yield_now().await;
                Outcome::Succeeded
            }
        });
        // Each worker has its own pool, as separate processes would.
        let store = QueueStore::new(pool_for(&pool).await);
        let worker = Worker::new(store, handler, opts("contended", &owner));
        workers.push(tokio::spawn(worker.run(shutdown.clone())));
    }

    wait_for_async("all 2000 jobs to succeed", Duration::from_secs(40), || {
        let store = store.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE state = 'succeeded'")
                .fetch_one(store.pool())
                .await
                .ok()?;
            (n == 2000).then_some(())
        }
    })
    .await;
    shutdown.cancel();
    for w in workers {
        w.await.unwrap().unwrap();
    }

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2000, "every job was handled");
    let twice: Vec<_> = seen.iter().filter(|(_, v)| v.len() != 1).collect();
    assert!(twice.is_empty(), "jobs handled more than once: {twice:?}");
    let owners: HashSet<&String> = seen.values().flatten().collect();
    assert!(owners.len() > 1, "more than one worker took part: {owners:?}");
    let max_attempt: i32 = sqlx::query_scalar("SELECT max(attempt) FROM sluice.jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(max_attempt, 1, "no job was claimed twice");
}

async fn pool_for(pool: &sqlx::PgPool) -> sqlx::PgPool {
    let opts = pool.connect_options();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with((*opts).clone())
        .await
        .unwrap()
}
