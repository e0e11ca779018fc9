//! The worker's pipeline: jobs claimed ahead of the handler slots, outcomes written behind them. Handlers
//! never run more than `concurrency` at once, and at shutdown a job claimed ahead but not started is handed
//! back at once, its attempt not counted.

mod queue_support;

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use queue_support::*;
use sluice_sidecar::queue::{NewJob, Outcome, QueueStore, Worker};
use sluice_testsupport::wait_for_async;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_never_outnumber_the_slots_while_claims_run_ahead() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "slots").await;
    let jobs: Vec<NewJob> = (0..600)
        .map(|i| NewJob::new("quick", serde_json::json!({ "n": i })))
        .collect();
    store.enqueue_many("slots", &jobs).await.unwrap();

    let (running, most, handled) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let (r, m, h) = (running.clone(), most.clone(), handled.clone());
    let handler = FnHandler::new(move |_, _| {
        let (r, m, h) = (r.clone(), m.clone(), h.clone());
        async move {
            let now = r.fetch_add(1, Ordering::SeqCst) + 1;
            m.fetch_max(now, Ordering::SeqCst);
            tokio::task::yield_now().await;
            r.fetch_sub(1, Ordering::SeqCst);
            h.fetch_add(1, Ordering::SeqCst);
            Outcome::Succeeded
        }
    });
    let mut o = opts("slots", "w1");
    o.concurrency = 3;
    o.claim_batch = 50;
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, o).run(shutdown.clone()));
    wait_for_async("all 600 jobs to succeed", DEADLINE, || {
        let store = store.clone();
        async move {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE state = 'succeeded'")
                .fetch_one(store.pool())
                .await
                .ok()?;
            (n == 600).then_some(())
        }
    })
    .await;
    shutdown.cancel();
    w.await.unwrap().unwrap();
    assert_eq!(handled.load(Ordering::SeqCst), 600, "each job handled once");
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=3).contains(&most),
        "{most} handlers ran at once with 3 slots"
    );
    let max_attempt: i32 = sqlx::query_scalar("SELECT max(attempt) FROM sluice.jobs")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(max_attempt, 1, "no job was claimed twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_hands_back_the_jobs_claimed_ahead_at_once() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "ahead").await;
    let jobs: Vec<NewJob> = (0..400)
        .map(|i| NewJob::new("quick", serde_json::json!({ "n": i })))
        .collect();
    store.enqueue_many("ahead", &jobs).await.unwrap();

    let started = Arc::new(AtomicUsize::new(0));
    let s = started.clone();
    let handler = FnHandler::new(move |_, _| {
        let s = s.clone();
        async move {
            s.fetch_add(1, Ordering::SeqCst);
            // Quick, but slower than nothing: the worker claims ahead of its two slots.
            tokio::time::sleep(Duration::from_millis(2)).await;
            Outcome::Succeeded
        }
    });
    let mut o = opts("ahead", "w1");
    o.concurrency = 2;
    o.claim_batch = 50;
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, o).run(shutdown.clone()));
    wait_for_async("some jobs to be handled", DEADLINE, || {
        let n = started.load(Ordering::SeqCst);
        async move { (n >= 40).then_some(()) }
    })
    .await;
    shutdown.cancel();
    w.await.unwrap().unwrap();

    let rows: Vec<(String, i32, Option<String>, i64)> = sqlx::query_as(
        "SELECT state, attempt, lease_owner, count(*) FROM sluice.jobs GROUP BY 1, 2, 3 ORDER BY 1",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    let total: i64 = rows.iter().map(|r| r.3).sum();
    assert_eq!(total, 400, "{rows:?}");
    for (state, attempt, owner, _) in &rows {
        match state.as_str() {
            "succeeded" => assert_eq!(*attempt, 1, "{rows:?}"),
            "pending" => assert_eq!(
                (*attempt, owner.as_deref()),
                (0, None),
                "handed back, the attempt not counted: {rows:?}"
            ),
            other => panic!("a job left {other} after shutdown: {rows:?}"),
        }
    }
    let succeeded: i64 = rows.iter().filter(|r| r.0 == "succeeded").map(|r| r.3).sum();
    assert_eq!(
        succeeded as usize,
        started.load(Ordering::SeqCst),
        "every started job finished within the grace and no other job ran"
    );
}
