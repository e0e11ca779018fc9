//! A store's answer deadline against a real PostgreSQL: every statement of a store made
//! `with_answer_deadline` is given up on a database gone silent (its backend frozen), and a depth read
//! that the server is slow to finish is stopped by the server itself.

mod support;

use std::time::Duration;

use sluice_queue::{
    Error, GraphJob, JobState, NewJob, QueueStore, error::Unanswered, schedule::MissedRuns, store::Schedule,
};
use sluice_testsupport::{PgServer, wait_for_async};
use sqlx::{PgPool, postgres::PgPoolOptions};

/// The answer deadline of the store under test.
const ANSWER: Duration = Duration::from_millis(500);
/// How long a call given up after [`ANSWER`] may take in all: the deadline, and room for a loaded
/// machine; a call that waits on the silent server fails this.
const BOUND: Duration = Duration::from_secs(5);

/// A pool of one connection that is handed out unchecked (a check before use would find a silent
/// idle connection by itself, within the acquire deadline): the statements under test meet the frozen
/// backend themselves, as they do when a server goes silent while they run.
async fn unchecked_pool(pg: &PgServer) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(3))
        .connect(&pg.url())
        .await
        .unwrap()
}

/// Runs `call` with the pool's one connection frozen, and checks that it failed as unanswered within
/// [`BOUND`]. The backend is thawed afterwards; its connection was closed by the store, so it exits.
async fn assert_given_up<T: std::fmt::Debug>(
    pg: &PgServer,
    pool: &PgPool,
    what: &str,
    call: impl Future<Output = sluice_queue::Result<T>>,
) {
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(pool)
        .await
        .unwrap();
    // The pool pings a connection it takes back: freezing before that ping is answered would leave the
    // connection stuck in the pool's hands, not in the call's.
    wait_for_async("the connection back in the pool", BOUND, || async {
        (pool.num_idle() == 1).then_some(())
    })
    .await;
    let _frozen = pg.freeze_backends([pid as u32]);
    let done = tokio::time::timeout(BOUND, call)
        .await
        .unwrap_or_else(|_| panic!("{what} waited on the silent database past {BOUND:?}"));
    match done {
        Err(Error::Database(e)) if Unanswered::is(&e) => {}
        other => panic!("{what}: expected the unanswered error, got {other:?}"),
    }
}

// Each statement of the store, reads and writes, meets a backend that does not answer (the socket stays
// open, as a failover or a dropped NAT entry leaves it): without an answer deadline of its own it would
// wait for ever, as sqlx has no statement deadline and sets no TCP keepalive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_statement_is_given_up_when_the_database_does_not_answer() {
    let (pg, admin, admin_store) = support::server_with_queue(2).await;
    let id = admin_store
        .enqueue("q", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap()
        .id;
    let pool = unchecked_pool(&pg).await;
    let store = QueueStore::new(pool.clone()).with_answer_deadline(ANSWER);
    let job = || NewJob::new("k", serde_json::json!({})).idempotency_key("once");
    let schedule = Schedule::new(
        "tick",
        "* * * * *",
        None,
        NewJob::new("k", serde_json::json!({})),
        MissedRuns::Skip,
    )
    .unwrap();

    assert_given_up(&pg, &pool, "enqueue", store.enqueue("q", &job())).await;
    assert_given_up(&pg, &pool, "enqueue_many", store.enqueue_many("q", &[job()])).await;
    assert_given_up(
        &pg,
        &pool,
        "enqueue_graph",
        store.enqueue_graph("q", &[GraphJob::new("a", job())]),
    )
    .await;
    assert_given_up(&pg, &pool, "depth", store.depth("q")).await;
    assert_given_up(&pg, &pool, "depth_all", store.depth_all()).await;
    assert_given_up(&pg, &pool, "parents", store.parents(id)).await;
    assert_given_up(&pg, &pool, "queues_of", store.queues_of(&[id])).await;
    assert_given_up(&pg, &pool, "get", store.get(id)).await;
    assert_given_up(
        &pg,
        &pool,
        "list",
        store.list("q", Some(JobState::Pending), None, 10),
    )
    .await;
    assert_given_up(&pg, &pool, "cancel", store.cancel(id)).await;
    assert_given_up(&pg, &pool, "retry_dead", store.retry_dead(id)).await;
    assert_given_up(
        &pg,
        &pool,
        "subscribe_events",
        store.subscribe_events("s", &["q".to_owned()], Duration::from_secs(60)),
    )
    .await;
    assert_given_up(&pg, &pool, "job_status", store.job_status(id)).await;
    assert_given_up(&pg, &pool, "fire_schedule", store.fire_schedule("q", &schedule)).await;
    assert_given_up(
        &pg,
        &pool,
        "ensure_tenant",
        store.ensure_tenant("tenant_shop", "shop", "secret"),
    )
    .await;

    // Nothing the given-up writes sent reached the server (each met its frozen backend at BEGIN).
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(&admin)
        .await
        .unwrap();
    assert_eq!(jobs, 1);
    assert_eq!(admin_store.get(id).await.unwrap().unwrap().state, "pending");
}

// A depth read on a huge backlog can take longer than the answer deadline; given up by the client
// alone, the server would count on (it notices the closed connection only when it next answers). Made
// slow here by a lock it must wait for, the read is ended by the server's own statement timeout, just
// under the answer deadline: the caller gets the server's error (SQLSTATE 57014), not the unanswered
// one, and no backend is left waiting for the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_depth_read_past_the_deadline_is_stopped_by_the_server() {
    let (_pg, admin, admin_store) = support::server_with_queue(2).await;
    admin_store
        .enqueue("q", &NewJob::new("k", serde_json::json!({})))
        .await
        .unwrap();
    let store = QueueStore::new(admin.clone()).with_answer_deadline(Duration::from_secs(2));
    let mut lock = admin.begin().await.unwrap();
    sqlx::query("LOCK TABLE sluice.jobs IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();

    let done = tokio::time::timeout(BOUND, store.depth("q"))
        .await
        .expect("the depth read ended");
    match &done {
        Err(Error::Database(sqlx::Error::Database(db))) if db.code().as_deref() == Some("57014") => {}
        other => panic!("expected the server's statement timeout, got {other:?}"),
    }
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
          WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut *lock)
    .await
    .unwrap();
    assert_eq!(waiting, 0, "no backend still waits to count");
    lock.rollback().await.unwrap();

    // Once the lock is let go the read answers, on the connection it kept.
    assert_eq!(store.depth("q").await.unwrap().unwrap().ready, 1);
}
