//! Queue semantics against a real PostgreSQL: backoff and dead-lettering, cancellation, idempotency keys,
//! lease fencing, graceful hand-back, depth, retention, the SQL API and concurrent migrations.

mod queue_support;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use queue_support::*;
use sluice_queue::{
    CancelOutcome, Error, JobState, NewJob, QueueSettings, QueueStore, schema,
    store::{Finish, Finished},
};
use sluice_sidecar::queue::{Outcome, Worker};
use sluice_testsupport::wait_for_async;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_jobs_back_off_then_are_dead_lettered_and_can_be_retried_by_api() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "flaky").await; // 3 attempts, backoff 20ms base, 200ms cap
    let times: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let t = times.clone();
    let handler = FnHandler::new(move |_, _| {
        t.lock().unwrap().push(Instant::now());
        async { Outcome::Retry("boom".into()) }
    });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, opts("flaky", "w1")).run(shutdown.clone()));
    let id = store
        .enqueue("flaky", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;

    wait_state(&store, id, "dead").await;
    let job = store.get(id).await.unwrap().unwrap();
    assert_eq!(job.attempt, 3);
    assert_eq!(job.last_error.as_deref(), Some("boom"));
    assert!(job.finished_at.is_some() && job.lease_owner.is_none());
    let times = times.lock().unwrap().clone();
    assert_eq!(times.len(), 3);
    // Attempt 1 fails → wait ≥ half of 20ms; attempt 2 → ≥ half of 40ms.
    assert!(
        times[1] - times[0] >= Duration::from_millis(10),
        "{:?}",
        times[1] - times[0]
    );
    assert!(
        times[2] - times[1] >= Duration::from_millis(20),
        "{:?}",
        times[2] - times[1]
    );

    store.retry_dead(id).await.unwrap();
    wait_state(&store, id, "dead").await;
    let job = store.get(id).await.unwrap().unwrap();
    assert_eq!(
        (job.attempt, job.max_attempts),
        (4, 4),
        "a retried dead job gets one more attempt"
    );
    assert!(matches!(
        store.retry_dead(uuid::Uuid::now_v7()).await,
        Err(Error::NotFound(_))
    ));
    shutdown.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_dead_at_once_and_a_live_job_cannot_be_retried() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "perm").await;
    let handler = FnHandler::new(|_, _| async { Outcome::Permanent("bad input".into()) });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, opts("perm", "w1")).run(shutdown.clone()));
    let id = store
        .enqueue("perm", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    wait_state(&store, id, "dead").await;
    assert_eq!(store.get(id).await.unwrap().unwrap().attempt, 1);
    shutdown.cancel();
    w.await.unwrap().unwrap();

    let waiting = store
        .enqueue("perm", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    assert!(matches!(store.retry_dead(waiting).await, Err(Error::Conflict(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_has_three_outcomes_waiting_running_and_finished() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "cancel").await;

    // Waiting: cancelled at once.
    let later = NewJob::new("k", serde_json::json!({})).delay(Duration::from_secs(3600));
    let waiting = store.enqueue("cancel", &later).await.unwrap().id;
    assert_eq!(store.cancel(waiting).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(state(&store, waiting).await, "cancelled");

    // Running: requested, delivered to the handler, then cancelled.
    let saw_cancel = Arc::new(tokio::sync::Notify::new());
    let started = Arc::new(tokio::sync::Notify::new());
    let (s, c) = (started.clone(), saw_cancel.clone());
    let handler = FnHandler::new(move |_, cancel: CancellationToken| {
        let (s, c) = (s.clone(), c.clone());
        async move {
            s.notify_one();
            cancel.cancelled().await;
            c.notify_one();
            Outcome::Cancelled
        }
    });
    let mut o = opts("cancel", "w1");
    o.heartbeat_interval = Some(Duration::from_millis(50));
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, o).run(shutdown.clone()));
    let running = store
        .enqueue("cancel", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    tokio::time::timeout(DEADLINE, started.notified())
        .await
        .expect("handler started");
    assert_eq!(store.cancel(running).await.unwrap(), CancelOutcome::Requested);
    tokio::time::timeout(DEADLINE, saw_cancel.notified())
        .await
        .expect("the handler saw the cancellation");
    wait_state(&store, running, "cancelled").await;

    // Finished: nothing changes.
    assert!(matches!(
        store.cancel(running).await.unwrap(),
        CancelOutcome::AlreadyFinished(JobState::Cancelled)
    ));
    assert!(matches!(
        store.cancel(uuid::Uuid::now_v7()).await,
        Err(Error::NotFound(_))
    ));
    shutdown.cancel();
    w.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_enqueues_with_one_idempotency_key_make_one_job() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "idem").await;
    let job = NewJob::new("charge", serde_json::json!({"amount": 42})).idempotency_key("order-7");
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (store, job) = (store.clone(), job.clone());
            tokio::spawn(async move { store.enqueue("idem", &job).await.unwrap() })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    assert_eq!(
        results.iter().filter(|r| r.created).count(),
        1,
        "one request made the job"
    );
    assert!(
        results.iter().all(|r| r.id == results[0].id),
        "all got the same job"
    );
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(n, 1);

    // Same key, different payload: conflict, nothing stored.
    let other = NewJob::new("charge", serde_json::json!({"amount": 43})).idempotency_key("order-7");
    assert!(matches!(
        store.enqueue("idem", &other).await,
        Err(Error::Conflict(_))
    ));

    // After the key's window, the key makes a new job.
    let expiring = QueueSettings {
        idempotency_window_ms: 0,
        ..settings("expiring")
    };
    store.upsert_queue(&expiring).await.unwrap();
    let first = store.enqueue("expiring", &job).await.unwrap();
    let second = store.enqueue("expiring", &other).await.unwrap();
    assert!(first.created && second.created && first.id != second.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_lost_its_lease_cannot_complete_the_rescued_job() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "lease").await;
    let id = store
        .enqueue("lease", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let a = store
        .claim_batch("lease", "a", 10, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(a.len(), 1);
    wait_for_async("the lease to expire and the job to be rescued", DEADLINE, || {
        let store = store.clone();
        async move { (store.rescue_expired(&["lease".into()], 10).await.unwrap() == 1).then_some(()) }
    })
    .await;
    let b = store
        .claim_batch("lease", "b", 10, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!((b.len(), b[0].attempt), (1, 2));

    let late = [Finished {
        id,
        attempt: 1,
        finish: Finish::Succeeded,
    }];
    assert!(
        store.finish_batch("a", &late).await.unwrap().is_empty(),
        "the late worker is fenced out"
    );
    assert!(
        store
            .heartbeat("a", &[(id, 1)], Duration::from_secs(1))
            .await
            .unwrap()
            .is_empty()
    );
    let now = [Finished {
        id,
        attempt: 2,
        finish: Finish::Succeeded,
    }];
    assert_eq!(
        store.finish_batch("b", &now).await.unwrap(),
        vec![(id, "succeeded".to_owned())]
    );
    assert!(
        store.finish_batch("b", &now).await.unwrap().is_empty(),
        "completed once only"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_quick_jobs_finish_and_hands_the_rest_back_at_once() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "drain").await;
    let quick = store
        .enqueue("drain", &NewJob::new("quick", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let slow = store
        .enqueue("drain", &NewJob::new("slow", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let s = started.clone();
    let handler = FnHandler::new(move |job, _| {
        let s = s.clone();
        async move {
            s.add_permits(1);
            if job.kind == "slow" {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            Outcome::Succeeded
        }
    });
    let mut o = opts("drain", "w1");
    o.shutdown_grace = Duration::from_millis(500);
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, o).run(shutdown.clone()));
    let _ = tokio::time::timeout(DEADLINE, started.acquire_many(2))
        .await
        .expect("both started");
    let t0 = Instant::now();
    shutdown.cancel();
    w.await.unwrap().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "shutdown took {:?}",
        t0.elapsed()
    );
    assert_eq!(
        state(&store, quick).await,
        "succeeded",
        "in-flight work finished within the grace"
    );
    let job = store.get(slow).await.unwrap().unwrap();
    assert_eq!(job.state, "pending", "the slow job was handed back");
    assert_eq!(
        (job.attempt, job.lease_owner),
        (0, None),
        "its attempt was not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn depth_counts_each_state_and_retention_deletes_only_old_finished_jobs() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    let s = QueueSettings {
        retention_succeeded_ms: 0,
        retention_dead_ms: 3_600_000,
        ..settings("depth")
    };
    store.upsert_queue(&s).await.unwrap();
    let job = |n: i32| NewJob::new("k", serde_json::json!({ "n": n }));
    for n in 0..5 {
        store.enqueue("depth", &job(n)).await.unwrap();
    }
    store
        .enqueue("depth", &job(9).delay(Duration::from_secs(3600)))
        .await
        .unwrap();
    let claimed = store
        .claim_batch("depth", "w", 3, Duration::from_secs(60))
        .await
        .unwrap();
    let done: Vec<Finished> = claimed
        .iter()
        .zip([
            Finish::Succeeded,
            Finish::Permanent { error: "x".into() },
            Finish::Retry {
                delay: Duration::from_secs(3600),
                error: "y".into(),
            },
        ])
        .map(|(c, finish)| Finished {
            id: c.id,
            attempt: c.attempt,
            finish,
        })
        .collect();
    store.finish_batch("w", &done).await.unwrap();
    store
        .claim_batch("depth", "w", 1, Duration::from_secs(60))
        .await
        .unwrap();

    let d = store.depth("depth").await.unwrap().unwrap();
    assert_eq!(
        (d.ready, d.scheduled, d.retrying, d.running, d.dead),
        (1, 1, 1, 1, 1),
        "{d:?}"
    );
    assert_eq!(d.demand(), 2);
    assert!(store.depth("nope").await.unwrap().is_none());
    assert_eq!(store.depth_all().await.unwrap().len(), 1);

    let deleted = store.delete_expired("depth", 100).await.unwrap();
    assert_eq!(deleted, 1, "only the succeeded job is past its retention");
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sql_api_enqueues_inside_the_callers_transaction() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "sql").await;

    let mut tx = pool.begin().await.unwrap();
    let id: uuid::Uuid = sqlx::query_scalar("SELECT sluice.enqueue('sql', '{\"a\":1}'::jsonb, kind => 'x')")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        store.get(id).await.unwrap().is_none(),
        "rolled back with the caller"
    );

    let mut tx = pool.begin().await.unwrap();
    let e = sluice_sidecar::queue::client::enqueue(&mut *tx, "sql", &NewJob::new("x", serde_json::json!({})))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(state(&store, e.id).await, "pending");

    let ids: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT sluice.enqueue_many('sql', ARRAY['{}'::jsonb, '{}'::jsonb, '{}'::jsonb], ARRAY['bulk'])",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(ids.len(), 3);
    let err = sqlx::query("SELECT sluice.enqueue('missing', '{}'::jsonb)")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(err.as_database_error().unwrap().code().as_deref(), Some("SL404"));
    let created: bool = sqlx::query_scalar("SELECT sluice.create_queue('made-by-sql', lease_ms => 5000)")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(created);
    assert_eq!(store.queue("made-by-sql").await.unwrap().unwrap().lease_ms, 5000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrations_are_idempotent_under_concurrency() {
    let (_pg, pool) = pg().await;
    let runs: Vec<_> = (0..6)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { schema::migrate(&pool).await })
        })
        .collect();
    for r in runs {
        r.await.unwrap().unwrap();
    }
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice._sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(applied, schema::latest_version());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_job_longer_than_its_lease_from_being_rescued() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    let s = QueueSettings {
        lease_ms: 300,
        ..settings("long")
    };
    store.upsert_queue(&s).await.unwrap();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    let handler = FnHandler::new(move |_, _| {
        c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_millis(1200)).await; // four leases
            Outcome::Succeeded
        }
    });
    let shutdown = CancellationToken::new();
    // Two workers, so a missed heartbeat would let the other one rescue and rerun the job.
    let a =
        tokio::spawn(Worker::new(store.clone(), handler.clone(), opts("long", "a")).run(shutdown.clone()));
    let b = tokio::spawn(Worker::new(store.clone(), handler, opts("long", "b")).run(shutdown.clone()));
    let id = store
        .enqueue("long", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    wait_state(&store, id, "succeeded").await;
    assert_eq!(store.get(id).await.unwrap().unwrap().attempt, 1);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    shutdown.cancel();
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_take_higher_priority_first_and_never_jobs_scheduled_for_later() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "prio").await;
    let low = store
        .enqueue("prio", &NewJob::new("low", serde_json::json!({})).priority(-5))
        .await
        .unwrap()
        .id;
    let high = store
        .enqueue("prio", &NewJob::new("high", serde_json::json!({})).priority(7))
        .await
        .unwrap()
        .id;
    let mid = store
        .enqueue("prio", &NewJob::new("mid", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let later = NewJob::new("later", serde_json::json!({}))
        .priority(100)
        .delay(Duration::from_secs(3600));
    store.enqueue("prio", &later).await.unwrap();
    let mut order = Vec::new();
    for _ in 0..4 {
        order.extend(
            store
                .claim_batch("prio", "w", 1, Duration::from_secs(30))
                .await
                .unwrap()
                .into_iter()
                .map(|j| j.id),
        );
    }
    assert_eq!(
        order,
        vec![high, mid, low],
        "priority order; the scheduled job is not due"
    );

    // Within one batch too: a handler slot never goes to a lower priority first.
    let ids: Vec<_> = [("low", -5), ("high", 7), ("mid", 0), ("high2", 7)]
        .into_iter()
        .map(|(kind, p)| NewJob::new(kind, serde_json::json!({})).priority(p))
        .collect();
    store.enqueue_many("prio", &ids).await.unwrap();
    let batch: Vec<String> = store
        .claim_batch("prio", "w", 10, Duration::from_secs(30))
        .await
        .unwrap()
        .into_iter()
        .map(|j| j.kind)
        .collect();
    assert_eq!(batch, ["high", "high2", "mid", "low"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_creates_the_queues_it_serves_with_default_settings() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    assert!(store.queue("fresh").await.unwrap().is_none());
    let shutdown = CancellationToken::new();
    let handler = FnHandler::new(|_, _| async { Outcome::Succeeded });
    let w = tokio::spawn(Worker::new(store.clone(), handler, opts("fresh", "w")).run(shutdown.clone()));
    let created = wait_for_async("the worker to create its queue", DEADLINE, || {
        let store = store.clone();
        async move { store.queue("fresh").await.unwrap() }
    })
    .await;
    assert_eq!(created, QueueSettings::defaults("fresh"));
    shutdown.cancel();
    w.await.unwrap().unwrap();
}
