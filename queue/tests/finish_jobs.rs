//! `sluice.finish_jobs` on a real PostgreSQL: a batch finishing parents waits for an enqueue naming two
//! of its jobs, or one of its jobs and a child waiting on another, as parents instead of deadlocking
//! with it, and the store runs a batch PostgreSQL aborted as a deadlock once more.

mod support;

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    ClaimedJob, NewJob, QueueStore, sql,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;
use sqlx::PgPool;
use uuid::Uuid;

async fn setup() -> (PgServer, PgPool, QueueStore) {
    support::server_with_queue(10).await
}

/// Returns once a call of `sluice.finish_jobs` waits for a row lock.
async fn wait_for_a_finish_waiting_on_a_lock(pool: &PgPool) {
    support::wait_for_a_statement_waiting_on_a_lock(pool, "sluice.finish_jobs", "the batch").await;
}

/// Finishes `claimed` as succeeded by calling the function directly: the store would run a batch
/// PostgreSQL aborted as a deadlock once more, which would hide one.
fn finish_directly(
    pool: &PgPool,
    claimed: &[ClaimedJob],
) -> tokio::task::JoinHandle<Result<Vec<(Uuid, String)>, sqlx::Error>> {
    let ids: Vec<Uuid> = claimed.iter().map(|j| j.id).collect();
    let attempts: Vec<i32> = claimed.iter().map(|j| j.attempt).collect();
    let finisher = pool.clone();
    tokio::spawn(async move {
        sqlx::query_as::<_, (Uuid, String)>(sql::JOB_FINISH)
            .bind(&ids)
            .bind(&attempts)
            .bind(vec!["s"; ids.len()])
            .bind(vec![0_i64; ids.len()])
            .bind(vec![""; ids.len()])
            .bind("w")
            .fetch_all(&finisher)
            .await
    })
}

async fn state(store: &QueueStore, id: Uuid) -> String {
    store.get(id).await.unwrap().expect("job exists").state
}

/// An enqueue naming parents X < P locks X, then P (id order). A batch finishing X and P, where only P
/// has a waiting child, used to lock P first and then wait for X in its update: with the enqueue holding
/// X and waiting for P, PostgreSQL aborted one of them as a deadlock. The batch now locks X before P.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finishing_batch_waits_for_an_enqueue_naming_its_jobs_as_parents() {
    let (_pg, pool, store) = setup().await;
    let mut ids = Vec::new();
    for kind in ["x", "p"] {
        ids.push(
            store
                .enqueue("q", &NewJob::new(kind, json!({})))
                .await
                .unwrap()
                .id,
        );
    }
    ids.sort();
    let (x, p) = (ids[0], ids[1]);
    let waiting = store
        .enqueue("q", &NewJob::new("c", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    let claimed = store
        .claim_batch("q", "w", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);

    // The enqueue's first step: X locked, in a transaction that stays open.
    let mut enqueuer = support::locked_in_an_open_transaction(&pool, x).await;

    // The batch starts and waits for X. The function is called directly: the store would run a batch
    // PostgreSQL aborted as a deadlock once more, which would hide one.
    let batch = finish_directly(&pool, &claimed);
    wait_for_a_finish_waiting_on_a_lock(&pool).await;

    // The whole enqueue, naming X and P: P is not held by the waiting batch, so it goes through.
    let child = sluice_queue::store::enqueue(
        &mut *enqueuer,
        "q",
        &NewJob::new("child", json!({})).depends_on([x, p]),
    )
    .await
    .expect("the enqueue is not aborted as a deadlock");
    enqueuer.commit().await.unwrap();

    let finished = batch
        .await
        .unwrap()
        .expect("the batch is not aborted as a deadlock");
    assert_eq!(finished.len(), 2);
    assert_eq!(state(&store, waiting).await, "pending");
    assert_eq!(
        state(&store, child.id).await,
        "pending",
        "the batch finished both parents after the enqueue committed, and released the child"
    );
}

/// A batch finishing P and X, where a child Y waits on P and P < Y < X, and an enqueue naming Y and X
/// as parents, which locks Y, then X (id order). The batch used to lock its own jobs P and X first and
/// then wait for the child Y: with the enqueue holding Y and waiting for X, PostgreSQL aborted one of
/// them as a deadlock. The batch now takes P, Y and X in one id order, so it waits for Y before X.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finishing_batch_waits_for_an_enqueue_naming_a_waiting_child_and_a_batch_job() {
    let (_pg, pool, store) = setup().await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    support::past_the_millisecond_of(&pool, p).await;
    let y = store
        .enqueue("q", &NewJob::new("y", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    support::past_the_millisecond_of(&pool, y).await;
    let x = store.enqueue("q", &NewJob::new("x", json!({}))).await.unwrap().id;
    assert!(p < y && y < x, "ids in the order of their enqueues");
    let claimed = store
        .claim_batch("q", "w", 10, Duration::from_secs(60))
        .await
        .unwrap();
    let mut claimed_ids: Vec<Uuid> = claimed.iter().map(|j| j.id).collect();
    claimed_ids.sort();
    assert_eq!(claimed_ids, [p, x], "the batch is P and X; Y waits on P");

    // The enqueue's first step: Y locked, in a transaction that stays open.
    let mut enqueuer = support::locked_in_an_open_transaction(&pool, y).await;

    // The batch starts and waits for Y, called directly so that no retry hides a deadlock.
    let batch = finish_directly(&pool, &claimed);
    wait_for_a_finish_waiting_on_a_lock(&pool).await;

    // The whole enqueue, naming Y and X: X comes after Y, so the waiting batch does not hold it yet.
    let child = sluice_queue::store::enqueue(
        &mut *enqueuer,
        "q",
        &NewJob::new("child", json!({})).depends_on([y, x]),
    )
    .await
    .expect("the enqueue is not aborted as a deadlock");
    enqueuer.commit().await.unwrap();

    let finished = batch
        .await
        .unwrap()
        .expect("the batch is not aborted as a deadlock");
    assert_eq!(finished.len(), 2);
    assert_eq!(state(&store, p).await, "succeeded");
    assert_eq!(state(&store, x).await, "succeeded");
    assert_eq!(state(&store, y).await, "pending", "P released Y");
    assert_eq!(
        state(&store, child.id).await,
        "blocked",
        "the child still waits on Y"
    );
}

/// Two transactions hold the batch's second job `FOR SHARE`: `sharer`, then `other`. The batch writes
/// its first job and waits for the second: for `sharer`, then for `other`. `other` asks for the first
/// job and waits for the batch; `sharer` commits; the batch's wait for `other` begins, and its deadlock
/// check, `deadlock_timeout` later, finds the cycle (the check runs once per wait, so the batch's wait
/// must begin after `other`'s; `other`'s own check is an hour away). PostgreSQL aborts the batch,
/// `other` takes the first job and commits, and `finish_batch` runs the batch once more: one deadlock
/// counted, two runs, and both jobs finished. The second run takes the pool's connection only once
/// `other` holds the first job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_aborted_as_a_deadlock_is_run_once_more() {
    let (pg, pool, store) = setup().await;
    for kind in ["a", "b"] {
        store.enqueue("q", &NewJob::new(kind, json!({}))).await.unwrap();
    }
    let mut claimed = store
        .claim_batch("q", "w", 10, Duration::from_secs(60))
        .await
        .unwrap();
    claimed.sort_by_key(|j| j.id);
    assert_eq!(claimed.len(), 2);
    let (first, second) = (claimed[0].id, claimed[1].id);
    let deadlocks_before = support::deadlocks(&pool).await;

    let share = "SELECT 1 FROM sluice.jobs WHERE id = $1 FOR SHARE";
    let mut sharer = pool.begin().await.unwrap();
    let sharer_pid = support::backend_pid(&mut sharer).await;
    sqlx::query(share)
        .bind(second)
        .execute(&mut *sharer)
        .await
        .unwrap();
    let mut other = pool.begin().await.unwrap();
    let other_pid = support::backend_pid(&mut other).await;
    sqlx::raw_sql("SET LOCAL deadlock_timeout = '1h'; SET LOCAL lock_timeout = '20s'")
        .execute(&mut *other)
        .await
        .unwrap();
    sqlx::query(share)
        .bind(second)
        .execute(&mut *other)
        .await
        .unwrap();

    let session = support::RetriedSession::connect(&pg.url(), "100ms").await;
    let finisher = QueueStore::new(session.pool.clone());
    let done: Vec<Finished> = claimed
        .iter()
        .map(|j| Finished {
            id: j.id,
            attempt: j.attempt,
            finish: Finish::Succeeded,
        })
        .collect();
    let batch = tokio::spawn(async move { finisher.finish_batch("w", &done).await });
    support::wait_until_blocked_by(&pool, session.pid, sharer_pid, "the batch").await;

    let other = tokio::spawn(async move {
        sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR NO KEY UPDATE")
            .bind(first)
            .execute(&mut *other)
            .await
            .expect("the batch, not this transaction, is aborted as a deadlock");
        other
    });
    support::wait_until_blocked_by(&pool, other_pid, session.pid, "the other transaction").await;
    sharer.commit().await.unwrap();
    let other = other.await.unwrap();
    session.open_the_gate();
    other.commit().await.unwrap();

    let finished = batch.await.unwrap().expect("the batch is run once more");
    assert_eq!(finished.len(), 2);
    assert_eq!(session.runs(), 2, "the batch ran twice");
    support::wait_for_deadlocks(&pool, deadlocks_before + 1).await;
    assert_eq!(state(&store, first).await, "succeeded");
    assert_eq!(state(&store, second).await, "succeeded");
}
