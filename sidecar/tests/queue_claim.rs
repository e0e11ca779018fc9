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

/// A claim the worker gave up unanswered that the server commits after all (a server too slow to answer
/// within the answer deadline, not gone) leases its job to the worker, which does not know it. Here the
/// claim is held up mid-statement, holding the job's row, by a trigger waiting for an advisory lock the
/// test holds; the worker gives the claim up after its answer deadline and claims again on another
/// connection (skipping the held row), and only then does the test let the first claim go on and commit.
/// The worker hands the job back with its attempt not counted (before, it stayed leased until its lease
/// lapsed, and the rescue counted an attempt no handler ran: the job ran on its second attempt), and it
/// then runs once, on its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_commits_after_it_was_given_up_is_handed_back_and_its_job_runs_once() {
    const HOLD: i64 = 4242;
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    store
        .upsert_queue(&sluice_queue::QueueSettings {
            // Long enough that the rescue does not take the job before the worker hands it back.
            lease_ms: 6_000,
            ..settings("late")
        })
        .await
        .unwrap();
    sqlx::raw_sql(
        "CREATE FUNCTION public.hold_claims() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_catalog.pg_advisory_xact_lock(4242); RETURN NEW; END $$; \
         CREATE TRIGGER hold_claims BEFORE UPDATE ON sluice.jobs FOR EACH ROW \
         WHEN (OLD.state = 'pending' AND NEW.state = 'running') EXECUTE FUNCTION public.hold_claims()",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(HOLD)
        .execute(&mut *holder)
        .await
        .unwrap();

    let runs: Arc<Mutex<Vec<(uuid::Uuid, i32)>>> = Arc::default();
    let seen = runs.clone();
    let handler = FnHandler::new(move |job, _| {
        seen.lock().unwrap().push((job.id, job.attempt));
        async { Outcome::Succeeded }
    });
    let worker = Worker::new(
        QueueStore::new(pool_for(&pool).await),
        handler,
        sluice_sidecar::queue::WorkerOptions {
            concurrency: 1,
            claim_batch: 1,
            // One claim loop: a claim started after the held one means the held one was given up.
            claimers: 1,
            answer_deadline: Duration::from_millis(500),
            ..opts("late", "w1")
        },
    );
    let metrics = worker.metrics();
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(worker.run(shutdown.clone()));
    let id = store
        .enqueue("late", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;

    wait_for_async(
        "the claim to be held up, then given up and followed by another claim",
        Duration::from_secs(20),
        || {
            let pool = pool.clone();
            async move {
                let given_up: bool = sqlx::query_scalar(
                    "SELECT EXISTS (SELECT 1 FROM pg_stat_activity held, pg_stat_activity later \
                      WHERE held.wait_event_type = 'Lock' AND held.wait_event = 'advisory' \
                        AND strpos(held.query, 'WITH picked AS') > 0 \
                        AND later.pid <> held.pid AND later.query = held.query \
                        AND later.query_start > held.query_start AND later.state = 'idle')",
                )
                .fetch_one(&pool)
                .await
                .unwrap();
                given_up.then_some(())
            }
        },
    )
    .await;
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(HOLD)
        .execute(&mut *holder)
        .await
        .unwrap();

    wait_state(&store, id, "succeeded").await;
    assert_eq!(
        *runs.lock().unwrap(),
        [(id, 1)],
        "the job ran once, on its first attempt"
    );
    assert_eq!(store.get(id).await.unwrap().unwrap().attempt, 1);
    let text = metrics.render();
    assert!(
        text.contains(r#"sluice_jobs_claims_returned_total{queue="late"} 1"#),
        "{text}"
    );
    shutdown.cancel();
    w.await.unwrap().unwrap();
}
