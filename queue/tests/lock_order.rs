//! Every path that locks several jobs locks them in one statement in id order, the order an enqueue
//! locks the parents it names: a cancel cascade, a graph naming jobs outside it as parents, and an
//! enqueue replacing a unique key's holder wait for an enqueue holding some of the same jobs instead of
//! deadlocking with it. Each test holds the first job an enqueue naming two jobs locks, starts the other
//! path, waits until it waits for that job, and then runs the whole enqueue: had the other path taken
//! the enqueue's second job before asking for the first, PostgreSQL would abort one of them (40P01).
//! The other path runs once, not through the store, which would run it once more and hide a deadlock.
//! A cancel that does meet another transaction in the other order is run once more by the store.

mod support;

use std::str::FromStr;

use serde_json::json;
use sluice_queue::{CancelOutcome, GraphJob, NewJob, QueueStore, UniqueMode, sql};
use sqlx::{Connection, PgConnection, Row, postgres::PgConnectOptions};
use uuid::Uuid;

async fn state(store: &QueueStore, id: Uuid) -> String {
    store.get(id).await.unwrap().expect("job exists").state
}

/// The whole enqueue of a job naming `parents`, in the transaction that locked the first of them, then
/// committed.
async fn enqueue_and_commit(mut tx: sqlx::Transaction<'static, sqlx::Postgres>, parents: [Uuid; 2]) -> Uuid {
    let child = sluice_queue::store::enqueue(
        &mut *tx,
        "q",
        &NewJob::new("child", json!({})).depends_on(parents),
    )
    .await
    .expect("the enqueue is not aborted as a deadlock")
    .id;
    tx.commit().await.unwrap();
    child
}

/// P has children A < B, waiting on it; an enqueue naming A and B locks A, then B. Cancelling P cancels
/// A and B in the trigger on P's update, which used to lock them as its update read them: with the
/// hash join statistics of a few hundred children give (forced here, where the table is small), in the
/// table's physical order, where A's row comes after B's once A was replaced in place through its
/// unique key. The cancel held B and waited for A,
/// the enqueue held A and asked for B. The trigger now locks A and B in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_cascade_waits_for_an_enqueue_naming_two_of_the_children() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    let child_of_p = |key: &str| {
        NewJob::new("child", json!({}))
            .depends_on([p])
            .unique(key, UniqueMode::Replace)
    };
    let mut children = Vec::new();
    for key in ["c1", "c2"] {
        children.push((store.enqueue("q", &child_of_p(key)).await.unwrap().id, key));
    }
    children.sort();
    let ((a, a_key), (b, _)) = (children[0], children[1]);
    // A replaced in place (a new priority): its new row version comes after B's, and so do its index
    // entries.
    let replaced = store.enqueue("q", &child_of_p(a_key).priority(1)).await.unwrap();
    assert_eq!((replaced.id, replaced.created), (a, false));
    let a_after_b: bool = sqlx::query_scalar(
        "SELECT (SELECT ctid FROM sluice.jobs WHERE id = $1) > (SELECT ctid FROM sluice.jobs WHERE id = $2)",
    )
    .bind(a)
    .bind(b)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(a_after_b, "A's live row comes after B's in the table");

    // The cancel's own connection, planning the trigger's statements as for a large table.
    let mut canceller = PgConnection::connect(&pg.url()).await.unwrap();
    sqlx::raw_sql("SET enable_nestloop = off; SET enable_mergejoin = off")
        .execute(&mut canceller)
        .await
        .unwrap();

    let enqueuer = support::locked_in_an_open_transaction(&pool, a).await;
    let cancel = tokio::spawn(async move {
        let row = sqlx::query(sql::JOB_CANCEL)
            .bind(p)
            .fetch_one(&mut canceller)
            .await?;
        row.try_get::<String, _>("before")
    });
    support::wait_for_a_statement_waiting_on_a_lock(&pool, "cancel_requested", "the cancel").await;

    let child = enqueue_and_commit(enqueuer, [a, b]).await;
    let before = cancel
        .await
        .unwrap()
        .expect("the cancel is not aborted as a deadlock");
    assert_eq!(before, "pending");
    for (name, id) in [("P", p), ("A", a), ("B", b), ("the new child", child)] {
        assert_eq!(state(&store, id).await, "cancelled", "{name} is cancelled");
    }
}

/// Child C waits on P and has the smaller id (an explicit id; a graph listing the child first does the
/// same); an enqueue naming C and P locks C, then P. The cancel of P used to lock P, then C in the
/// trigger on P's update: it held P and waited for C, the enqueue held C and asked for P. The cancel
/// now locks P and the children waiting on it in one statement in id order, C first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_waits_for_an_enqueue_naming_a_child_with_a_smaller_id_and_the_job() {
    let (_pg, pool, store) = support::server_with_queue(10).await;
    let c = Uuid::now_v7();
    support::past_the_millisecond_of(&pool, c).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    assert!(c < p, "the child's id is the smaller");
    let created: Uuid = sqlx::query_scalar(
        "SELECT id FROM sluice.enqueue_job('q', 'c', '{}', p_id => $1, p_depends_on => ARRAY[$2::uuid])",
    )
    .bind(c)
    .bind(p)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(created, c);

    let enqueuer = support::locked_in_an_open_transaction(&pool, c).await;
    let cancel_pool = pool.clone();
    let cancel = tokio::spawn(async move {
        let row = sqlx::query(sql::JOB_CANCEL)
            .bind(p)
            .fetch_one(&cancel_pool)
            .await?;
        row.try_get::<String, _>("before")
    });
    support::wait_for_a_statement_waiting_on_a_lock(&pool, "cancel_requested", "the cancel").await;

    let child = enqueue_and_commit(enqueuer, [c, p]).await;
    let before = cancel
        .await
        .unwrap()
        .expect("the cancel is not aborted as a deadlock");
    assert_eq!(before, "pending");
    for (name, id) in [("P", p), ("C", c), ("the new child", child)] {
        assert_eq!(state(&store, id).await, "cancelled", "{name} is cancelled");
    }
}

/// A graph whose first job names B outside it as parent and whose second names A < B, and an enqueue
/// naming A and B, which locks A, then B. The graph used to lock each job's parents as it enqueued that
/// job: B, then A, crossing the enqueue. It now locks A and B in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_waits_for_an_enqueue_naming_two_of_its_outside_parents() {
    let (_pg, pool, store) = support::server_with_queue(10).await;
    let mut outside = Vec::new();
    for kind in ["o1", "o2"] {
        outside.push(
            store
                .enqueue("q", &NewJob::new(kind, json!({})))
                .await
                .unwrap()
                .id,
        );
    }
    outside.sort();
    let (a, b) = (outside[0], outside[1]);

    let enqueuer = support::locked_in_an_open_transaction(&pool, a).await;
    let graph = [
        GraphJob::new("first", NewJob::new("first", json!({}))).depends_on([b.to_string()]),
        GraphJob::new("second", NewJob::new("second", json!({}))).depends_on([a.to_string()]),
    ];
    let graph_pool = pool.clone();
    let enqueued =
        tokio::spawn(async move { sluice_queue::store::enqueue_graph(&graph_pool, "q", &graph).await });
    support::wait_for_a_statement_waiting_on_a_lock(&pool, "sluice.enqueue_graph", "the graph").await;

    let child = enqueue_and_commit(enqueuer, [a, b]).await;
    let enqueued = enqueued
        .await
        .unwrap()
        .expect("the graph is not aborted as a deadlock");
    assert_eq!(enqueued.len(), 2);
    for (reference, job) in &enqueued {
        assert!(job.created, "{reference} is a new job");
        assert_eq!(
            state(&store, job.id).await,
            "blocked",
            "{reference} waits on its parent"
        );
    }
    assert_eq!(state(&store, child).await, "blocked");
}

/// Holder H of unique key `k` is running; a job replacing it names A > H as parent; an enqueue naming H
/// and A locks H, then A. The replacing enqueue used to lock its parent A first and the holder H after
/// it, crossing the other enqueue. It now locks H and A in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_of_a_running_holder_waits_for_an_enqueue_naming_the_holder_and_its_parent() {
    let (_pg, pool, store) = support::server_with_queue(10).await;
    let keyed = |kind: &str| NewJob::new(kind, json!({})).unique("k", UniqueMode::Replace);
    let h = store.enqueue("q", &keyed("h")).await.unwrap().id;
    let claimed = store
        .claim_batch("q", "w", 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "H runs");
    support::past_the_millisecond_of(&pool, h).await;
    let a = store.enqueue("q", &NewJob::new("a", json!({}))).await.unwrap().id;
    assert!(h < a, "ids in the order of their enqueues");

    let enqueuer = support::locked_in_an_open_transaction(&pool, h).await;
    let replacing_pool = pool.clone();
    let replacement = tokio::spawn(async move {
        sluice_queue::store::enqueue(&replacing_pool, "q", &keyed("replacement").depends_on([a])).await
    });
    support::wait_for_a_statement_waiting_on_a_lock(&pool, "sluice.enqueue_job", "the replacement").await;

    let child = enqueue_and_commit(enqueuer, [h, a]).await;
    let replacement = replacement
        .await
        .unwrap()
        .expect("the replacement is not aborted as a deadlock");
    assert!(
        replacement.created,
        "a new job takes the key from the running holder"
    );
    assert_eq!(
        state(&store, replacement.id).await,
        "blocked",
        "it waits for H and A"
    );
    assert_eq!(state(&store, h).await, "running");
    assert_eq!(state(&store, child).await, "blocked");
}

/// Another transaction holds P's waiting child; the cancel of P locks P and waits for the child; the
/// other transaction then asks for P. PostgreSQL aborts the cancel (the other transaction's
/// `deadlock_timeout` is long, so the cancel's own check finds the cycle; the margin is the 3 s between
/// the cancel's wait beginning and the other's, as in the finish's test of the same), and
/// `QueueStore::cancel` runs it once more, after the other transaction committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_aborted_as_a_deadlock_is_run_once_more() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    let child = store
        .enqueue("q", &NewJob::new("child", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;

    let mut other = pool.begin().await.unwrap();
    sqlx::raw_sql("SET LOCAL deadlock_timeout = '1h'; SET LOCAL lock_timeout = '20s'")
        .execute(&mut *other)
        .await
        .unwrap();
    let lock = "SELECT 1 FROM sluice.jobs WHERE id = $1 FOR NO KEY UPDATE";
    sqlx::query(lock).bind(child).execute(&mut *other).await.unwrap();

    let canceller_pool = sluice_queue::pool::options(2)
        .connect_with(
            PgConnectOptions::from_str(&pg.url())
                .unwrap()
                .options([("deadlock_timeout", "3s")]),
        )
        .await
        .expect("connect");
    let canceller = QueueStore::new(canceller_pool);
    let cancel = tokio::spawn(async move { canceller.cancel(p).await });
    support::wait_for_a_statement_waiting_on_a_lock(&pool, "cancel_requested", "the cancel").await;

    sqlx::query(lock)
        .bind(p)
        .execute(&mut *other)
        .await
        .expect("the cancel, not this transaction, is aborted as a deadlock");
    other.commit().await.unwrap();

    assert_eq!(
        cancel.await.unwrap().expect("the cancel is run once more"),
        CancelOutcome::Cancelled
    );
    assert_eq!(state(&store, p).await, "cancelled");
    assert_eq!(state(&store, child).await, "cancelled");
}
