//! The worker's completer against a real PostgreSQL: a completion write that does not end holds up
//! no other job's outcome.

mod queue_support;

use std::{sync::Arc, time::Duration};

use queue_support::*;
use sluice_queue::{NewJob, QueueSettings, QueueStore};
use sluice_sidecar::queue::{Outcome, Worker};
use sluice_testsupport::{PgServer, wait_for_async};
use sqlx::PgPool;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(10);

/// A fresh PostgreSQL with the queue of `settings` made: its server (kept until dropped), pool and store.
async fn setup(settings: QueueSettings) -> (PgServer, PgPool, QueueStore) {
    let (pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    store.upsert_queue(&settings).await.unwrap();
    (pg, pool, store)
}

/// Waits until a completion write (`sluice.finish_jobs`) waits for a row lock.
async fn completion_write_waiting(pool: &PgPool, what: &str) {
    wait_for_async(what, DEADLINE, || {
        let pool = pool.clone();
        async move {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
                  WHERE wait_event_type = 'Lock' AND strpos(query, 'finish_jobs') > 0",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (waiting > 0).then_some(())
        }
    })
    .await;
}

/// Waits until job `id`, still on its first attempt and running, holds a lease past the one it has now:
/// it was renewed after that lease would have lapsed.
async fn renewed_past_its_lease(pool: &PgPool, id: uuid::Uuid, what: &str) {
    let first_expiry = lease_expiry(pool, id).await.expect("leased");
    wait_for_async(what, DEADLINE, || {
        let pool = pool.clone();
        async move {
            let renewed: bool = sqlx::query_scalar(
                "SELECT now() > $2 AND state = 'running' AND attempt = 1 AND lease_expires_at > now() \
                   FROM sluice.jobs WHERE id = $1",
            )
            .bind(id)
            .bind(first_expiry)
            .fetch_one(&pool)
            .await
            .unwrap();
            renewed.then_some(())
        }
    })
    .await;
}

/// When job `id`'s lease expires; None when it is not leased (rescued or finished, say).
async fn lease_expiry(pool: &PgPool, id: uuid::Uuid) -> Option<chrono::DateTime<chrono::Utc>> {
    sqlx::query_scalar("SELECT lease_expires_at FROM sluice.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

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

/// A job whose handler returned but whose outcome waits to be written is still running in the
/// database: the heartbeat keeps renewing its lease, so no worker rescues it and runs it again however
/// long the write waits. Job P has a waiting child C with the smaller id, which a transaction holds:
/// P's finish locks its batch with the waiting children in id order, so it waits for C before it takes
/// P, and P's row stays free for the heartbeat (and for a rescue, were its lease to lapse). The worker
/// rescues expired leases itself, every heartbeat interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_whose_write_waits_keeps_its_lease_and_runs_once() {
    let (_pg, pool, store) = setup(QueueSettings {
        // Long enough that a stall of the runtime or the database on busy shared cores does not
        // let a lease lapse between two heartbeats (every third of it); the checks compare against
        // the first expiry, whatever the length.
        lease_ms: 2_000,
        ..settings("slow")
    })
    .await;
    let mut ids = [uuid::Uuid::now_v7(), uuid::Uuid::now_v7()];
    ids.sort();
    let [c, p] = ids;
    let enqueue = "SELECT id FROM sluice.enqueue_job('slow', 'k', '{}', p_id => $1, p_depends_on => $2)";
    for (id, parents) in [(p, None), (c, Some(vec![p]))] {
        sqlx::query(enqueue)
            .bind(id)
            .bind(parents)
            .execute(&pool)
            .await
            .unwrap();
    }
    let mut hold = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR NO KEY UPDATE")
        .bind(c)
        .execute(&mut *hold)
        .await
        .unwrap();

    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = calls.clone();
    // Runs of P (C runs too, once P has succeeded).
    let handler = FnHandler::new(move |job, _| {
        if job.id == p {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        async { Outcome::Succeeded }
    });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, opts("slow", "w1")).run(shutdown.clone()));

    completion_write_waiting(&pool, "P's outcome write to wait for C").await;
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    // P's lease as the write began to wait: from now on only a heartbeat of a finishing job renews it.
    renewed_past_its_lease(
        &pool,
        p,
        "P's first attempt to hold its lease past the lease it had when its write began to wait",
    )
    .await;
    hold.rollback().await.unwrap();
    wait_state(&store, p, "succeeded").await;
    assert_eq!(store.get(p).await.unwrap().unwrap().attempt, 1);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "P ran once");
    shutdown.cancel();
    w.await.unwrap().unwrap();
}

/// The heartbeat of finished jobs waiting to be written never holds up the running jobs' leases. Job P
/// has a waiting child C with the greater id, which a transaction holds: P's finish locks P, then waits
/// for C. A heartbeat waiting for P's row would wait with it, and job R, still running, would lose its
/// lease meanwhile; the finishing jobs' heartbeat skips rows another transaction holds, and R's lease is
/// renewed as ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_job_whose_write_holds_its_row_does_not_hold_up_the_running_jobs_heartbeat() {
    let (_pg, pool, store) = setup(QueueSettings {
        // Long enough that a stall of the runtime or the database on busy shared cores does not
        // let a lease lapse between two heartbeats (every third of it); the checks compare against
        // the first expiry, whatever the length.
        lease_ms: 2_000,
        ..settings("slow")
    })
    .await;
    let mut ids = [uuid::Uuid::now_v7(), uuid::Uuid::now_v7()];
    ids.sort();
    let [p, c] = ids;
    let enqueue = "SELECT id FROM sluice.enqueue_job('slow', 'k', '{}', p_id => $1, p_depends_on => $2)";
    for (id, parents) in [(p, None), (c, Some(vec![p]))] {
        sqlx::query(enqueue)
            .bind(id)
            .bind(parents)
            .execute(&pool)
            .await
            .unwrap();
    }
    let r = store
        .enqueue("slow", &NewJob::new("r", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let mut hold = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR NO KEY UPDATE")
        .bind(c)
        .execute(&mut *hold)
        .await
        .unwrap();

    // R runs until the gate opens; P returns at once. Runs of each are counted.
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(Notify::new());
    let (counted, g) = (runs.clone(), gate.clone());
    let handler = FnHandler::new(move |job, _| {
        counted.lock().unwrap().push(job.id);
        let (started_tx, g) = (started_tx.clone(), g.clone());
        async move {
            if job.id == r {
                let _ = started_tx.send(job.id);
                g.notified().await;
            }
            Outcome::Succeeded
        }
    });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, opts("slow", "w1")).run(shutdown.clone()));

    let running = tokio::time::timeout(DEADLINE, started.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(running, r);
    completion_write_waiting(&pool, "P's outcome write to wait for C").await;
    renewed_past_its_lease(
        &pool,
        r,
        "R's first attempt to hold its lease past the lease it had while P's write waited",
    )
    .await;

    hold.rollback().await.unwrap();
    gate.notify_one();
    for id in [p, r] {
        wait_state(&store, id, "succeeded").await;
        assert_eq!(store.get(id).await.unwrap().unwrap().attempt, 1);
    }
    let runs = runs.lock().unwrap().clone();
    for (name, id) in [("P", p), ("R", r)] {
        assert_eq!(runs.iter().filter(|&&j| j == id).count(), 1, "{name} ran once");
    }
    shutdown.cancel();
    w.await.unwrap().unwrap();
}

/// The running jobs' heartbeat never waits for a row another transaction holds. An application enqueues
/// a child under running job R1 in a transaction it keeps open (which locks R1 until it ends): the
/// heartbeat skips R1 (still the worker's, not lost) and renews R2's lease as ever. A heartbeat waiting
/// for R1's row would leave R2's lease, and every other of its statement, unrenewed until the
/// application commits, for as long as it likes: other workers would rescue those jobs and run them
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_an_application_holds_does_not_hold_up_the_other_running_jobs_heartbeat() {
    let (_pg, pool, store) = setup(QueueSettings {
        // A heartbeat every second (set below): R1, unrenewed while held, keeps at least five
        // seconds of its lease when the hold begins, which the test ends as soon as R2 has been
        // renewed once.
        lease_ms: 6_000,
        ..settings("slow")
    })
    .await;
    let r1 = store
        .enqueue("slow", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let r2 = store
        .enqueue("slow", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (counted, g) = (runs.clone(), gate.clone());
    let handler = FnHandler::new(move |job, _| {
        counted.lock().unwrap().push(job.id);
        let (started_tx, g) = (started_tx.clone(), g.clone());
        async move {
            let _ = started_tx.send(job.id);
            g.acquire().await.unwrap().forget();
            Outcome::Succeeded
        }
    });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(
        Worker::new(
            store.clone(),
            handler,
            sluice_sidecar::queue::WorkerOptions {
                heartbeat_interval: Some(Duration::from_secs(1)),
                ..opts("slow", "w1")
            },
        )
        .run(shutdown.clone()),
    );
    for _ in 0..2 {
        tokio::time::timeout(DEADLINE, started.recv())
            .await
            .unwrap()
            .unwrap();
    }

    let mut app = pool.begin().await.unwrap();
    sqlx::query("SELECT sluice.enqueue_job('slow', 'child', '{}', p_depends_on => ARRAY[$1]::uuid[])")
        .bind(r1)
        .execute(&mut *app)
        .await
        .unwrap();
    let r2_before = lease_expiry(&pool, r2).await.expect("R2 is leased");
    wait_for_async("R2's lease renewed while R1's row is held", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let lease = lease_expiry(&pool, r2).await;
            lease.is_some_and(|l| l > r2_before).then_some(())
        }
    })
    .await;
    app.rollback().await.unwrap();

    gate.add_permits(2);
    for (name, id) in [("R1", r1), ("R2", r2)] {
        wait_state(&store, id, "succeeded").await;
        assert_eq!(store.get(id).await.unwrap().unwrap().attempt, 1, "{name}");
        assert_eq!(
            runs.lock().unwrap().iter().filter(|&&j| j == id).count(),
            1,
            "{name} ran once"
        );
    }
    shutdown.cancel();
    w.await.unwrap().unwrap();
}

/// A completion write that fails every time gives its jobs up one lease after its first failure: they
/// leave the batch (their lease permits and the completer's write slot are freed), their leases lapse
/// and a rescue runs them again. Without the cap, two such writes filled both completer slots for good,
/// and a job finishing behind them stayed `running`, renewed by the heartbeat, never written and never
/// rescued. Here `sluice.finish_jobs` is renamed away (every completion fails; leases, claims and rescues
/// still work): job A's write and job B's take both slots, and C's outcome queues behind them. Each job
/// must come back for a second attempt while writes fail, and all succeed once they work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_write_that_always_fails_gives_its_jobs_up_and_frees_the_completer() {
    let (_pg, pool, store) = setup(QueueSettings {
        max_attempts: 25,
        ..settings("broken")
    })
    .await;
    sqlx::query(
        "ALTER FUNCTION sluice.finish_jobs(uuid[], integer[], text[], bigint[], text[], text) \
         RENAME TO finish_jobs_away",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut ids = Vec::new();
    for name in ["A", "B", "C"] {
        let id = store
            .enqueue("broken", &NewJob::new("k", serde_json::json!({ "name": name })))
            .await
            .unwrap()
            .id;
        ids.push((name, id));
    }
    let handler = FnHandler::new(|_, _| async { Outcome::Succeeded });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(
        Worker::new(
            store.clone(),
            handler,
            sluice_sidecar::queue::WorkerOptions {
                // One at a time, so that each outcome is a batch of its own: A's write, then B's, fill
                // both slots, and C's waits.
                concurrency: 1,
                claim_batch: 1,
                ..opts("broken", "w1")
            },
        )
        .run(shutdown.clone()),
    );
    for (name, id) in &ids {
        wait_for_async(
            &format!("{name} given up, rescued and claimed again while writes fail"),
            Duration::from_secs(30),
            || {
                let store = store.clone();
                async move {
                    let job = store.get(*id).await.unwrap().unwrap();
                    (job.attempt >= 2).then_some(())
                }
            },
        )
        .await;
    }
    sqlx::query(
        "ALTER FUNCTION sluice.finish_jobs_away(uuid[], integer[], text[], bigint[], text[], text) \
         RENAME TO finish_jobs",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (_, id) in &ids {
        wait_state(&store, *id, "succeeded").await;
    }
    shutdown.cancel();
    w.await.unwrap().unwrap();
}

/// A running job whose row application transactions keep locking for a moment each (the holder of a
/// unique key they enqueue with, which each locks until it commits) is still renewed: the heartbeat
/// waits briefly for a row it found held. Skipped at every heartbeat instead, its lease lapsed within a lease or two under such a
/// stream, and the worker's own rescue ran it a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_that_enqueues_keep_locking_keeps_its_lease_and_runs_once() {
    let (_pg, pool, store) = setup(QueueSettings {
        lease_ms: 2_000,
        ..settings("keyed")
    })
    .await;
    let holder = NewJob::new("k", serde_json::json!({})).unique("report", sluice_queue::UniqueMode::Preserve);
    let r = store.enqueue("keyed", &holder).await.unwrap().id;
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let gate = Arc::new(Notify::new());
    let (counted, g) = (runs.clone(), gate.clone());
    let handler = FnHandler::new(move |_, _| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let (started_tx, g) = (started_tx.clone(), g.clone());
        async move {
            let _ = started_tx.send(());
            g.notified().await;
            Outcome::Succeeded
        }
    });
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(Worker::new(store.clone(), handler, opts("keyed", "w1")).run(shutdown.clone()));
    tokio::time::timeout(DEADLINE, started.recv())
        .await
        .unwrap()
        .unwrap();

    // Three streams of application transactions, each enqueueing a job with R's key (which finds R the
    // holder, locks it and returns R) and then working 20 ms before it commits: R's row is held
    // nearly all the time, by one transaction after another.
    let stop = CancellationToken::new();
    let streams: Vec<_> = (0..3)
        .map(|_| {
            let (pool, stop) = (pool.clone(), stop.clone());
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.is_cancelled() {
                    let mut app = pool.begin().await.unwrap();
                    let id: uuid::Uuid = sqlx::query_scalar(
                        "SELECT id FROM sluice.enqueue_job('keyed', 'k', '{}', \
                                p_unique_key => 'report', p_unique_mode => 'preserve')",
                    )
                    .fetch_one(&mut *app)
                    .await
                    .unwrap();
                    assert_eq!(id, r);
                    sqlx::query("SELECT pg_sleep(0.02)")
                        .execute(&mut *app)
                        .await
                        .unwrap();
                    app.commit().await.unwrap();
                    n += 1;
                }
                n
            })
        })
        .collect();
    let first_expiry = lease_expiry(&pool, r).await.expect("leased");
    // Two leases past the lease R had when the streams began: renewed throughout, never rescued.
    wait_for_async(
        "two leases to pass with R still on its first attempt",
        DEADLINE,
        || {
            let pool = pool.clone();
            async move {
                let (past, running): (bool, bool) = sqlx::query_as(
                    "SELECT now() > $2 + interval '2 seconds', \
                        state = 'running' AND attempt = 1 AND lease_expires_at > now() \
                   FROM sluice.jobs WHERE id = $1",
                )
                .bind(r)
                .bind(first_expiry)
                .fetch_one(&pool)
                .await
                .unwrap();
                assert!(
                    running,
                    "R's lease lapsed or R was rescued while enqueues locked it"
                );
                past.then_some(())
            }
        },
    )
    .await;
    stop.cancel();
    for s in streams {
        assert!(s.await.unwrap() > 0, "the stream enqueued");
    }
    gate.notify_one();
    wait_state(&store, r, "succeeded").await;
    assert_eq!(store.get(r).await.unwrap().unwrap().attempt, 1);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1, "R ran once");
    shutdown.cancel();
    w.await.unwrap().unwrap();
}

/// One job of the worker's queue running: its handler waits for `gate`, then succeeds.
struct GatedJob {
    id: uuid::Uuid,
    gate: Arc<Notify>,
    shutdown: CancellationToken,
    worker: tokio::task::JoinHandle<sluice_sidecar::Result<()>>,
}

impl GatedJob {
    /// Starts a worker on `worker_store` with `opts` (its first queue the job's), enqueues the job
    /// through `store`, and returns once its handler runs.
    async fn start(
        worker_store: QueueStore,
        store: &QueueStore,
        opts: sluice_sidecar::queue::WorkerOptions,
    ) -> Self {
        let queue = opts.queues[0].clone();
        let (started_tx, mut started) = mpsc::unbounded_channel();
        let gate = Arc::new(Notify::new());
        let g = gate.clone();
        let handler = FnHandler::new(move |job, _| {
            let (started_tx, g) = (started_tx.clone(), g.clone());
            async move {
                let _ = started_tx.send(job.id);
                g.notified().await;
                Outcome::Succeeded
            }
        });
        let shutdown = CancellationToken::new();
        let worker = tokio::spawn(Worker::new(worker_store, handler, opts).run(shutdown.clone()));
        let id = store
            .enqueue(&queue, &NewJob::new("k", serde_json::json!({})))
            .await
            .unwrap()
            .id;
        let running = tokio::time::timeout(DEADLINE, started.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(running, id);
        Self {
            id,
            gate,
            shutdown,
            worker,
        }
    }

    /// Stops the worker.
    async fn stop(self) {
        self.shutdown.cancel();
        self.worker.await.unwrap().unwrap();
    }
}

/// Job `id`'s attempt.
async fn attempt(pool: &PgPool, id: uuid::Uuid) -> i32 {
    sqlx::query_scalar("SELECT attempt FROM sluice.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A database that stops answering on a worker's connections (their backends frozen: the sockets stay
/// open and nothing answers, as a failover or a dropped NAT entry leaves them) holds up no outcome for
/// ever: each statement is given up after the worker's answer deadline, its connection closed, and the
/// completion written on a fresh connection. The worker's pool does not check a connection before
/// handing it out, so the statements themselves meet the silent backends (with the check, a silent
/// idle connection is caught within the acquire deadline, but not one that goes silent mid-statement,
/// which no test can time); it holds eight connections, more than the worker uses at once, all
/// frozen, so the completion write takes a frozen one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_write_the_database_stops_answering_is_written_on_another_connection() {
    const CONNECTIONS: usize = 8;
    const APP: &str = "sluice-silent-test";
    let (pg, pool, store) = setup(QueueSettings {
        lease_ms: 60_000,
        ..settings("silent")
    })
    .await;
    let worker_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(CONNECTIONS as u32)
        .min_connections(CONNECTIONS as u32)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(
            pg.url()
                .parse::<sqlx::postgres::PgConnectOptions>()
                .unwrap()
                .application_name(APP),
        )
        .await
        .unwrap();
    let job = GatedJob::start(
        QueueStore::new(worker_pool),
        &store,
        sluice_sidecar::queue::WorkerOptions {
            concurrency: 1,
            listen: false,
            answer_deadline: Duration::from_millis(500),
            ..opts("silent", "w1")
        },
    )
    .await;
    let pids: Vec<i32> = wait_for_async("the worker's pool to hold its connections", DEADLINE, || {
        let pool = pool.clone();
        async move {
            let pids: Vec<i32> =
                sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                    .bind(APP)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            (pids.len() == CONNECTIONS).then_some(pids)
        }
    })
    .await;
    let frozen = pg.freeze_backends(pids.into_iter().map(|p| p as u32));

    job.gate.notify_one();
    // Each frozen connection the write meets costs it the answer deadline and a backoff (50 ms,
    // doubling); the claim loops and the heartbeat meet some of them meanwhile.
    wait_for_async("the job's outcome to be written", Duration::from_secs(40), || {
        let store = store.clone();
        async move { (state(&store, job.id).await == "succeeded").then_some(()) }
    })
    .await;
    assert_eq!(
        attempt(&pool, job.id).await,
        1,
        "the job ran once, its outcome written on its first attempt"
    );
    drop(frozen);
    job.stop().await;
}

/// A completion given up unanswered while it waits for a row lock still waits on the server (a
/// backend notices its closed connection only when it next answers); its retries wait for the lock
/// half the answer deadline at most, so the database answers them with an error and each leaves
/// nothing behind: besides the retry, one backend waits for the lock however long it is held, where
/// each retry left one more. Once the lock is let go the job's outcome is written, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_given_up_on_a_row_lock_leaves_one_waiting_backend_behind() {
    let (_pg, pool, store) = setup(QueueSettings {
        lease_ms: 60_000,
        ..settings("locked")
    })
    .await;
    let job = GatedJob::start(
        store.clone(),
        &store,
        sluice_sidecar::queue::WorkerOptions {
            concurrency: 1,
            answer_deadline: Duration::from_secs(2),
            ..opts("locked", "w1")
        },
    )
    .await;
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR UPDATE")
        .bind(job.id)
        .execute(&mut *lock)
        .await
        .unwrap();
    let before = pg_stat_rolled_back(&pool).await;
    job.gate.notify_one();

    // Three retries refused by the lock's timeout (each a rolled-back transaction), and meanwhile
    // never more than two completions waiting for the lock: the try given up and the retry.
    wait_for_async(
        "three retries of the write to end on the lock's timeout",
        Duration::from_secs(30),
        || async {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity \
              WHERE wait_event_type = 'Lock' AND strpos(query, 'finish_jobs') > 0",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            assert!(waiting <= 2, "{waiting} completions wait for the lock");
            (pg_stat_rolled_back(&pool).await - before >= 3).then_some(())
        },
    )
    .await;
    assert_eq!(state(&store, job.id).await, "running");

    lock.rollback().await.unwrap();
    wait_state(&store, job.id, "succeeded").await;
    assert_eq!(attempt(&pool, job.id).await, 1, "the job ran once");
    job.stop().await;
}

/// Transactions of the current database rolled back so far (the statistics lag by up to half a second).
async fn pg_stat_rolled_back(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Jobs of `queue` rescued after their lease lapsed (the worker gave their outcome up).
async fn rescued(pool: &PgPool, queue: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM sluice.jobs WHERE queue = $1 AND last_error LIKE 'lease expired%'",
    )
    .bind(queue)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// While the database refuses to record finished jobs (here `sluice.finish_jobs` is renamed away: every
/// completion fails, claims and rescues still work), the worker stops taking new work: each job it
/// claimed would run, its outcome be refused, and the job run again later. Claims pause at the first
/// refusal; once the refused outcomes are given up (one lease later) the worker claims one job at a
/// time, only while it holds no other, until a write succeeds. So two leases after the first given-up
/// job was rescued, the handler has run at most the jobs the worker could hold when the first refusal
/// came (`2 × (concurrency + claim batch)`) and a probe a lease; without the pause, the worker claimed
/// a whole new round of jobs each time outcomes were given up (33 runs and more here, against at most
/// 24). Once writes are accepted again, claims resume and the backlog drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_pause_while_the_database_refuses_to_record_finished_jobs_and_resume_once_it_does() {
    const JOBS: usize = 200;
    const CONCURRENCY: usize = 4;
    const CLAIM_BATCH: u32 = 4;
    let (_pg, pool, store) = setup(QueueSettings {
        max_attempts: 25,
        ..settings("refused")
    })
    .await;
    sqlx::query(
        "ALTER FUNCTION sluice.finish_jobs(uuid[], integer[], text[], bigint[], text[], text) \
         RENAME TO finish_jobs_away",
    )
    .execute(&pool)
    .await
    .unwrap();
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|n| NewJob::new("k", serde_json::json!({ "n": n })))
        .collect();
    store.enqueue_many("refused", &jobs).await.unwrap();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let handler = FnHandler::new(move |_, _| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async { Outcome::Succeeded }
    });
    let worker = Worker::new(
        store.clone(),
        handler,
        sluice_sidecar::queue::WorkerOptions {
            concurrency: CONCURRENCY,
            claim_batch: CLAIM_BATCH,
            ..opts("refused", "w1")
        },
    );
    let metrics = worker.metrics();
    let shutdown = CancellationToken::new();
    let w = tokio::spawn(worker.run(shutdown.clone()));

    wait_for_async(
        "a job whose outcome was refused to be given up and rescued",
        Duration::from_secs(20),
        || async { (rescued(&pool, "refused").await > 0).then_some(()) },
    )
    .await;
    // Two leases more, over which the worker without the pause claimed a new round of jobs at each
    // give-up, and the one with it probes with one job a lease.
    let first_rescue: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now()").fetch_one(&pool).await.unwrap();
    wait_for_async("two leases to pass", Duration::from_secs(20), || async {
        let past: bool = sqlx::query_scalar("SELECT now() > $1 + interval '2 seconds'")
            .bind(first_rescue)
            .fetch_one(&pool)
            .await
            .unwrap();
        past.then_some(())
    })
    .await;
    let held_at_most = 2 * (CONCURRENCY + CLAIM_BATCH as usize);
    let ran = runs.load(std::sync::atomic::Ordering::SeqCst);
    // A probe a lease, with room for a slow machine's timing; without the pause each give-up
    // claimed another `held_at_most`.
    let probes_at_most = 8;
    assert!(
        ran <= held_at_most + probes_at_most,
        "the handler ran {ran} times while no outcome could be recorded; at most {} expected",
        held_at_most + probes_at_most
    );
    let text = metrics.render();
    assert!(text.contains("sluice_worker_claims_paused 1"), "{text}");

    sqlx::query(
        "ALTER FUNCTION sluice.finish_jobs_away(uuid[], integer[], text[], bigint[], text[], text) \
         RENAME TO finish_jobs",
    )
    .execute(&pool)
    .await
    .unwrap();
    wait_for_async(
        "every job to succeed once writes are accepted",
        Duration::from_secs(30),
        || async {
            let done: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM sluice.jobs WHERE queue = 'refused' AND state = 'succeeded'",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            (done == JOBS as i64).then_some(())
        },
    )
    .await;
    let text = metrics.render();
    assert!(text.contains("sluice_worker_claims_paused 0"), "{text}");
    shutdown.cancel();
    w.await.unwrap().unwrap();
}
