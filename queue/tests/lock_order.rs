//! Every path that locks several jobs locks them in one statement in id order, the order an enqueue
//! locks the parents it names: a cancel and its cascade, a graph naming jobs outside it as parents or
//! resent with keys that find existing jobs, a batch replacing its unique keys' holders, an enqueue
//! replacing a unique key's holder or clearing an expired idempotency key, and the paths ending a job
//! with dependents (a cancel, a failing completion batch, a lease rescue, a shutdown release), which lock
//! the jobs the end cascades to with it, to the deepest level (migration 0024), wait for an enqueue
//! holding some of the same jobs instead of deadlocking with it (the rescue, which never waits, leaves
//! such a job for its next pass instead). Each test holds the first job an
//! enqueue naming two jobs locks, starts the other path on its own connection, waits until that session
//! waits for the holder's lock (`pg_blocking_pids`), and then runs the whole enqueue: had the other path
//! taken the enqueue's second job before asking for the first, PostgreSQL would abort one of them
//! (40P01). The other path runs once, not through the store's retrying methods, which would run it once
//! more and hide a deadlock (the release runs through the store, on a session that counts its runs). A
//! cancel that does meet another transaction in the other order is run once more by the store.
//!
//! The children and grandchildren below have smaller ids than their parents (explicit ids, as a graph
//! listing children first gives): an enqueue naming a child and its parent then locks the child first,
//! while a path locking a job before the jobs its end cascades to takes the parent first. Each test of
//! a rescue, a release, a failing batch or a cascade's deeper level was aborted as a deadlock before
//! migration 0024.

mod support;

use serde_json::json;
use sluice_queue::{CancelOutcome, Enqueued, GraphJob, NewJob, QueueStore, UniqueMode, sql};
use sluice_testsupport::PgServer;
use sqlx::{Connection, PgConnection, PgPool, Row};
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

/// A holder of the lock an enqueue naming two jobs takes first: its transaction (left open) and session.
async fn holding(pool: &PgPool, id: Uuid) -> (sqlx::Transaction<'static, sqlx::Postgres>, i32) {
    let mut tx = support::locked_in_an_open_transaction(pool, id).await;
    let pid = support::backend_pid(&mut tx).await;
    (tx, pid)
}

/// A connection of its own for the path under test, and its session.
async fn session(pg: &PgServer) -> (PgConnection, i32) {
    let mut conn = PgConnection::connect(&pg.url()).await.unwrap();
    let pid = support::backend_pid(&mut conn).await;
    (conn, pid)
}

/// Children A < B of `parent` (waiting on it), with unique keys; A replaced in place (a new priority),
/// so that its live row, and its index entries, come after B's in the table.
async fn two_children_the_first_replaced(store: &QueueStore, pool: &PgPool, parent: Uuid) -> (Uuid, Uuid) {
    let child = |key: &str| {
        NewJob::new("child", json!({}))
            .depends_on([parent])
            .unique(key, UniqueMode::Replace)
    };
    let mut children = Vec::new();
    for key in ["c1", "c2"] {
        children.push((store.enqueue("q", &child(key)).await.unwrap().id, key));
    }
    children.sort();
    let ((a, a_key), (b, _)) = (children[0], children[1]);
    let replaced = store.enqueue("q", &child(a_key).priority(1)).await.unwrap();
    assert_eq!((replaced.id, replaced.created), (a, false));
    let a_after_b: bool = sqlx::query_scalar(
        "SELECT (SELECT ctid FROM sluice.jobs WHERE id = $1) > (SELECT ctid FROM sluice.jobs WHERE id = $2)",
    )
    .bind(a)
    .bind(b)
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(a_after_b, "A's live row comes after B's in the table");
    (a, b)
}

/// A connection that plans as for a large table: with the statistics of a few hundred children,
/// PostgreSQL updates a level of children through a hash join that reads the table in its physical
/// order, which is what a statement that does not lock in id order first would lock them in.
async fn planning_as_for_a_large_table(pg: &PgServer) -> (PgConnection, i32) {
    let (mut conn, pid) = session(pg).await;
    sqlx::raw_sql("SET enable_nestloop = off; SET enable_mergejoin = off")
        .execute(&mut conn)
        .await
        .unwrap();
    (conn, pid)
}

/// Runs the cancel statement once (not through the store, which would run it again after a deadlock).
fn cancel_once(mut conn: PgConnection, id: Uuid) -> tokio::task::JoinHandle<Result<String, sqlx::Error>> {
    tokio::spawn(async move {
        let row = sqlx::query(sql::JOB_CANCEL).bind(id).fetch_one(&mut conn).await?;
        row.try_get::<String, _>("before")
    })
}

/// P has children A < B, waiting on it; an enqueue naming A and B locks A, then B. The cancel of P
/// locks P and the children waiting on it in one statement in id order (`sql::JOB_CANCEL`), A first,
/// even where A's row comes after B's in the table and the plan reads the table in its physical order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_waits_for_an_enqueue_naming_two_of_the_children() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    let (a, b) = two_children_the_first_replaced(&store, &pool, p).await;

    let (canceller, canceller_pid) = planning_as_for_a_large_table(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, a).await;
    let cancel = cancel_once(canceller, p);
    support::wait_until_blocked_by(&pool, canceller_pid, enqueuer_pid, "the cancel").await;

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

/// P0 has a waiting child P, and P has the children A < B; an enqueue naming A and B locks A, then B.
/// Cancelling P0 cancels P in the trigger on P0's update, and A and B on the cascade's next level. That
/// level used to be locked as the trigger's update read it: with the hash join the statistics of a few
/// hundred children give (forced here, where the table is small), in the table's physical order, where
/// A's row comes after B's once A was replaced in place through its unique key. The cancel held B and
/// waited for A, the enqueue held A and asked for B. The trigger now locks each level's children in one
/// statement in id order first (`sql::JOB_LOCK_CHILDREN`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_cascade_waits_for_an_enqueue_naming_two_children_of_a_cancelled_child() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let p0 = store
        .enqueue("q", &NewJob::new("p0", json!({})))
        .await
        .unwrap()
        .id;
    let p = store
        .enqueue("q", &NewJob::new("p", json!({})).depends_on([p0]))
        .await
        .unwrap()
        .id;
    let (a, b) = two_children_the_first_replaced(&store, &pool, p).await;

    let (canceller, canceller_pid) = planning_as_for_a_large_table(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, a).await;
    let cancel = cancel_once(canceller, p0);
    support::wait_until_blocked_by(&pool, canceller_pid, enqueuer_pid, "the cancel").await;

    let child = enqueue_and_commit(enqueuer, [a, b]).await;
    let before = cancel
        .await
        .unwrap()
        .expect("the cancel is not aborted as a deadlock");
    assert_eq!(before, "pending");
    for (name, id) in [("P0", p0), ("P", p), ("A", a), ("B", b), ("the new child", child)] {
        assert_eq!(state(&store, id).await, "cancelled", "{name} is cancelled");
    }
}

/// Child C waits on P and has the smaller id (an explicit id; a graph listing the child first does the
/// same); an enqueue naming C and P locks C, then P. The cancel of P used to lock P, then C in the
/// trigger on P's update: it held P and waited for C, the enqueue held C and asked for P. The cancel
/// now locks P and the children waiting on it in one statement in id order, C first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_waits_for_an_enqueue_naming_a_child_with_a_smaller_id_and_the_job() {
    let (pg, pool, store) = support::server_with_queue(10).await;
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

    let (canceller, canceller_pid) = session(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, c).await;
    let cancel = cancel_once(canceller, p);
    support::wait_until_blocked_by(&pool, canceller_pid, enqueuer_pid, "the cancel").await;

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

/// Runs a graph once on its own connection (the free function: no second run after a deadlock).
fn graph_once(
    mut conn: PgConnection,
    graph: Vec<GraphJob>,
) -> tokio::task::JoinHandle<sluice_queue::Result<Vec<(String, Enqueued)>>> {
    tokio::spawn(async move { sluice_queue::store::enqueue_graph(&mut conn, "q", &graph).await })
}

/// Runs `graph` on its own connection while an enqueue holding A (`parents[0]`) names A and B, so that
/// the graph waits for it, then lets the enqueue lock B and commit: the graph's result (it must not be
/// aborted as a deadlock) and the enqueued child of A and B.
async fn graph_against_an_enqueue(
    pg: &PgServer,
    pool: &PgPool,
    parents: [Uuid; 2],
    graph: Vec<GraphJob>,
) -> (Vec<(String, Enqueued)>, Uuid) {
    let (grapher, grapher_pid) = session(pg).await;
    let (enqueuer, enqueuer_pid) = holding(pool, parents[0]).await;
    let enqueued = graph_once(grapher, graph);
    support::wait_until_blocked_by(pool, grapher_pid, enqueuer_pid, "the graph").await;
    let child = enqueue_and_commit(enqueuer, parents).await;
    let enqueued = enqueued
        .await
        .unwrap()
        .expect("the graph is not aborted as a deadlock");
    (enqueued, child)
}

/// Asserts that each of `jobs` was made by the graph and waits on its parent.
async fn new_and_waiting<'a>(store: &QueueStore, jobs: impl IntoIterator<Item = &'a (String, Enqueued)>) {
    for (reference, job) in jobs {
        assert!(job.created, "{reference} is a new job");
        assert_eq!(
            state(store, job.id).await,
            "blocked",
            "{reference} waits on its parent"
        );
    }
}

/// A graph whose first job names B outside it as parent and whose second names A < B, and an enqueue
/// naming A and B, which locks A, then B. The graph used to lock each job's parents as it enqueued that
/// job: B, then A, crossing the enqueue. It now locks A and B in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_waits_for_an_enqueue_naming_two_of_its_outside_parents() {
    let (pg, pool, store) = support::server_with_queue(10).await;
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

    let graph = vec![
        GraphJob::new("first", NewJob::new("first", json!({}))).depends_on([b.to_string()]),
        GraphJob::new("second", NewJob::new("second", json!({}))).depends_on([a.to_string()]),
    ];
    let (enqueued, child) = graph_against_an_enqueue(&pg, &pool, [a, b], graph).await;
    assert_eq!(enqueued.len(), 2);
    new_and_waiting(&store, &enqueued).await;
    assert_eq!(state(&store, child).await, "blocked");
}

/// A graph of A and B (idempotency keys), sent again with C depending on B and D depending on A; A has
/// the smaller id, and an enqueue naming A and B locks A, then B. The resent graph's keys find A and B,
/// and each job used to lock its parents as it was enqueued, B for C, then A for D, crossing the
/// enqueue. The graph now locks the jobs its idempotency keys find with its outside parents and unique
/// keys' holders, in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resent_graph_waits_for_an_enqueue_naming_two_jobs_its_idempotency_keys_find() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let keyed = |key: &str| NewJob::new("keyed", json!({ "key": key })).idempotency_key(key);
    let sent = store
        .enqueue_graph(
            "q",
            &[GraphJob::new("x", keyed("x")), GraphJob::new("y", keyed("y"))],
        )
        .await
        .unwrap();
    let mut sent: Vec<(Uuid, String)> = sent.into_iter().map(|(r, e)| (e.id, r)).collect();
    sent.sort();
    let ((a, a_ref), (b, b_ref)) = (sent[0].clone(), sent[1].clone());

    let graph = vec![
        GraphJob::new(a_ref.clone(), keyed(&a_ref)),
        GraphJob::new(b_ref.clone(), keyed(&b_ref)),
        GraphJob::new("c", NewJob::new("c", json!({}))).depends_on([b_ref.clone()]),
        GraphJob::new("d", NewJob::new("d", json!({}))).depends_on([a_ref.clone()]),
    ];
    let (enqueued, child) = graph_against_an_enqueue(&pg, &pool, [a, b], graph).await;
    let got: Vec<(&str, Uuid, bool)> = enqueued
        .iter()
        .map(|(r, e)| (r.as_str(), e.id, e.created))
        .collect();
    assert_eq!(
        &got[..2],
        &[(a_ref.as_str(), a, false), (b_ref.as_str(), b, false)]
    );
    new_and_waiting(&store, &enqueued[2..]).await;
    assert_eq!(state(&store, child).await, "blocked");
}

/// Holder H of unique key `k` is running; a job replacing it names A > H as parent; an enqueue naming H
/// and A locks H, then A. The replacing enqueue used to lock its parent A first and the holder H after
/// it, crossing the other enqueue. It now locks H and A in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_of_a_running_holder_waits_for_an_enqueue_naming_the_holder_and_its_parent() {
    let (pg, pool, store) = support::server_with_queue(10).await;
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

    let (mut replacer, replacer_pid) = session(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, h).await;
    let replacement = tokio::spawn(async move {
        sluice_queue::store::enqueue(&mut replacer, "q", &keyed("replacement").depends_on([a])).await
    });
    support::wait_until_blocked_by(&pool, replacer_pid, enqueuer_pid, "the replacement").await;

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

/// Holders H1 of unique key `a` and H2 < H1 of key `b` wait to run; an enqueue naming H2 and H1 locks
/// H2, then H1. A batch replacing both keys enqueues its keyed jobs in key order, and each used to lock
/// its key's holder as it came: H1, then H2, crossing the enqueue. The batch now locks its keys' holders
/// in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_waits_for_an_enqueue_naming_two_holders_of_its_unique_keys() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let keyed = |key: &str, n: i32| NewJob::new("keyed", json!({ "n": n })).unique(key, UniqueMode::Replace);
    let h2 = store.enqueue("q", &keyed("b", 1)).await.unwrap().id;
    support::past_the_millisecond_of(&pool, h2).await;
    let h1 = store.enqueue("q", &keyed("a", 1)).await.unwrap().id;
    assert!(h2 < h1, "ids in the order of their enqueues");

    let (mut batcher, batcher_pid) = session(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, h2).await;
    let batch = tokio::spawn(async move {
        sluice_queue::store::enqueue_many(&mut batcher, "q", &[keyed("a", 2), keyed("b", 2)]).await
    });
    support::wait_until_blocked_by(&pool, batcher_pid, enqueuer_pid, "the batch").await;

    let child = enqueue_and_commit(enqueuer, [h2, h1]).await;
    let batch = batch
        .await
        .unwrap()
        .expect("the batch is not aborted as a deadlock");
    assert_eq!(batch, vec![h1, h2], "each holder is replaced in place");
    for (name, id) in [("H1", h1), ("H2", h2)] {
        let job = store.get(id).await.unwrap().expect("job exists");
        assert_eq!(
            job.payload,
            json!({ "n": 2 }),
            "{name} carries the batch's payload"
        );
    }
    assert_eq!(state(&store, child).await, "blocked");
}

/// Job H holds idempotency key `k` past the queue's window; a new request with key `k` names A > H as
/// parent; an enqueue naming H and A locks H, then A. The request used to lock its parent A first and
/// then clear the expired key on H, crossing the other enqueue. It now locks the key's holder with its
/// parents, in one statement in id order first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_clearing_an_expired_idempotency_key_waits_for_an_enqueue_naming_the_holder_and_its_parent()
 {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let keyed = || NewJob::new("keyed", json!({})).idempotency_key("k");
    let h = store.enqueue("q", &keyed()).await.unwrap().id;
    sqlx::query("UPDATE sluice.jobs SET idempotency_at = now() - interval '400 days' WHERE id = $1")
        .bind(h)
        .execute(&pool)
        .await
        .unwrap();
    support::past_the_millisecond_of(&pool, h).await;
    let a = store.enqueue("q", &NewJob::new("a", json!({}))).await.unwrap().id;
    assert!(h < a, "ids in the order of their enqueues");

    let (mut requester, requester_pid) = session(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, h).await;
    let request = tokio::spawn(async move {
        sluice_queue::store::enqueue(&mut requester, "q", &keyed().depends_on([a])).await
    });
    support::wait_until_blocked_by(&pool, requester_pid, enqueuer_pid, "the request").await;

    let child = enqueue_and_commit(enqueuer, [h, a]).await;
    let request = request
        .await
        .unwrap()
        .expect("the request is not aborted as a deadlock");
    assert!(request.created, "the expired key is taken by a new job");
    assert_eq!(state(&store, request.id).await, "blocked", "it waits for A");
    let key: Option<String> = sqlx::query_scalar("SELECT idempotency_key FROM sluice.jobs WHERE id = $1")
        .bind(h)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(key, None, "H gave the key up");
    assert_eq!(state(&store, child).await, "blocked");
}

/// P's waiting child C has the greater id. Two transactions hold C `FOR SHARE`: `first`, then `other`.
/// The cancel of P locks P, then waits for C: for `first`, then for `other`. `other` asks for P and
/// waits for the cancel; `first` commits; the cancel's wait for `other` begins, and its deadlock check,
/// `deadlock_timeout` later, finds the cycle (the check runs once per wait, so the cancel's wait must
/// begin after `other`'s; `other`'s own check is an hour away). PostgreSQL aborts the cancel, `other`
/// takes P and commits, and `QueueStore::cancel` runs the cancel once more: one deadlock counted, two
/// runs, and the cancel done. The second run takes the pool's connection only once `other` holds P:
/// had it taken P first, it would have waited for C while `other` waited for it, a second deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_aborted_as_a_deadlock_is_run_once_more() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    support::past_the_millisecond_of(&pool, p).await;
    let child = store
        .enqueue("q", &NewJob::new("child", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    assert!(p < child, "ids in the order of their enqueues");
    let deadlocks_before = support::deadlocks(&pool).await;

    let share = "SELECT 1 FROM sluice.jobs WHERE id = $1 FOR SHARE";
    let mut first = pool.begin().await.unwrap();
    let first_pid = support::backend_pid(&mut first).await;
    sqlx::query(share).bind(child).execute(&mut *first).await.unwrap();
    let mut other = pool.begin().await.unwrap();
    let other_pid = support::backend_pid(&mut other).await;
    sqlx::raw_sql("SET LOCAL deadlock_timeout = '1h'; SET LOCAL lock_timeout = '20s'")
        .execute(&mut *other)
        .await
        .unwrap();
    sqlx::query(share).bind(child).execute(&mut *other).await.unwrap();

    let session = support::RetriedSession::connect(&pg.url(), "100ms").await;
    let (canceller, canceller_pid) = (QueueStore::new(session.pool.clone()), session.pid);
    let cancel = tokio::spawn(async move { canceller.cancel(p).await });
    support::wait_until_blocked_by(&pool, canceller_pid, first_pid, "the cancel").await;

    let other = tokio::spawn(async move {
        sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR NO KEY UPDATE")
            .bind(p)
            .execute(&mut *other)
            .await
            .expect("the cancel, not this transaction, is aborted as a deadlock");
        other
    });
    support::wait_until_blocked_by(&pool, other_pid, canceller_pid, "the other transaction").await;
    first.commit().await.unwrap();
    let other = other.await.unwrap();
    session.open_the_gate();
    other.commit().await.unwrap();

    assert_eq!(
        cancel.await.unwrap().expect("the cancel is run once more"),
        CancelOutcome::Cancelled
    );
    assert_eq!(session.runs(), 2, "the cancel ran twice");
    support::wait_for_deadlocks(&pool, deadlocks_before + 1).await;
    assert_eq!(state(&store, p).await, "cancelled");
    assert_eq!(state(&store, child).await, "cancelled");
}

/// Enqueues job `id` (an explicit id, as a graph listing children first makes ids smaller than their
/// parents') waiting on `parent`.
async fn with_id_waiting_on(pool: &PgPool, id: Uuid, parent: Uuid) {
    let created: Uuid = sqlx::query_scalar(
        "SELECT id FROM sluice.enqueue_job('q', 'c', '{}', p_id => $1, p_depends_on => ARRAY[$2::uuid])",
    )
    .bind(id)
    .bind(parent)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(created, id);
}

/// An id smaller than every job's enqueued from now on.
async fn a_smaller_id(pool: &PgPool) -> Uuid {
    let id = Uuid::now_v7();
    support::past_the_millisecond_of(pool, id).await;
    id
}

/// Claims `p`, the only ready job, for worker `w`: its attempt.
async fn running(store: &QueueStore, p: Uuid) -> i32 {
    let claimed = store
        .claim_batch("q", "w", 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [p], "P runs");
    claimed[0].attempt
}

/// Makes running job `p` one whose lease expired on its last attempt: a rescue makes it dead.
async fn expired_on_its_last_attempt(pool: &PgPool, p: Uuid) {
    sqlx::query(
        "UPDATE sluice.jobs SET max_attempts = attempt, lease_expires_at = now() - interval '1 minute' \
          WHERE id = $1",
    )
    .bind(p)
    .execute(pool)
    .await
    .unwrap();
}

/// Asserts the states of named jobs.
async fn states_are(store: &QueueStore, expected: &[(&str, Uuid, &str)]) {
    for (name, id, want) in expected {
        assert_eq!(state(store, *id).await, *want, "{name} is {want}");
    }
}

/// Runs the rescue once, with `limit`, and asserts that it returns without waiting for any lock.
async fn rescued_without_waiting(pg: &PgServer, limit: i64) -> Vec<Uuid> {
    let (mut conn, _) = session(pg).await;
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        sqlx::query_scalar(sql::JOB_RESCUE_EXPIRED)
            .bind(vec!["q".to_owned()])
            .bind(limit)
            .fetch_all(&mut conn),
    )
    .await
    .expect("the rescue does not wait for a held job")
    .expect("the rescue succeeds")
}

/// Running job P's lease expired on its last attempt; its waiting child C has the smaller id; an
/// enqueue naming C and P locks C, then P. The rescue used to take P (`SKIP LOCKED`) and then, in the
/// trigger making P's children follow it, wait for C: it held P and waited for C, the enqueue held C
/// and asked for P, and PostgreSQL aborted the rescue as a deadlock. `sluice.rescue_expired` (migration
/// 0024) now locks P with its whole cascade in one statement in id order, skipping held rows, and
/// rescues P only when it locked all of them: while the enqueue holds C, the rescue leaves P for the
/// next one without waiting; once the enqueue committed, the next rescue takes P and its cascade.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_leaves_a_job_whose_child_an_enqueue_holds_for_the_next_rescue() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let c = a_smaller_id(&pool).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    with_id_waiting_on(&pool, c, p).await;
    assert!(c < p, "the child's id is the smaller");
    running(&store, p).await;
    expired_on_its_last_attempt(&pool, p).await;

    let (enqueuer, _) = holding(&pool, c).await;
    assert!(
        rescued_without_waiting(&pg, 10).await.is_empty(),
        "P is left for the next rescue"
    );
    assert_eq!(state(&store, p).await, "running");

    let child = enqueue_and_commit(enqueuer, [c, p]).await;
    assert_eq!(rescued_without_waiting(&pg, 10).await, [p]);
    states_are(
        &store,
        &[
            ("P", p, "dead"),
            ("C", c, "cancelled"),
            ("the new child", child, "cancelled"),
        ],
    )
    .await;
}

/// Job P (running, its lease expired on its last attempt) has a waiting child C, and C a waiting child
/// G with the smallest id; an enqueue naming G and C locks G, then C. Rescued dead, P cancels C, and C
/// cancels G on the cascade's next level. That level used to be locked only when the trigger reached
/// it: the rescue held C and waited for G, the enqueue held G and asked for C. The rescue now locks
/// every job the cascade can reach with P, in one statement in id order, skipping held rows: with G
/// held, it leaves P (and C, G) alone and returns; once the enqueue committed, it rescues P.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_leaves_a_job_whose_grandchild_an_enqueue_holds_for_the_next_rescue() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let g = a_smaller_id(&pool).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    let c = store
        .enqueue("q", &NewJob::new("c", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    with_id_waiting_on(&pool, g, c).await;
    assert!(g < p && g < c, "the grandchild's id is the smallest");
    running(&store, p).await;
    expired_on_its_last_attempt(&pool, p).await;

    let (enqueuer, _) = holding(&pool, g).await;
    assert!(
        rescued_without_waiting(&pg, 10).await.is_empty(),
        "P is left for the next rescue"
    );
    states_are(&store, &[("P", p, "running"), ("C", c, "blocked")]).await;

    let child = enqueue_and_commit(enqueuer, [g, c]).await;
    assert_eq!(rescued_without_waiting(&pg, 10).await, [p]);
    states_are(
        &store,
        &[
            ("P", p, "dead"),
            ("C", c, "cancelled"),
            ("G", g, "cancelled"),
            ("the new child", child, "cancelled"),
        ],
    )
    .await;
}

/// Expired jobs P (its last attempt, with a waiting child) and Q: while another transaction holds P
/// (an application's enqueue naming P, P's own outcome write), the rescue does not wait for it (every
/// worker's maintenance runs the rescue): it rescues Q and returns. Once P is free, the next rescue
/// takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_rescues_the_other_jobs_and_returns_while_an_ending_job_is_held() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    let c = store
        .enqueue("q", &NewJob::new("c", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    let q = store.enqueue("q", &NewJob::new("q", json!({}))).await.unwrap().id;
    let claimed = store
        .claim_batch("q", "w", 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2, "P and Q run");
    expired_on_its_last_attempt(&pool, p).await;
    sqlx::query("UPDATE sluice.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = $1")
        .bind(q)
        .execute(&pool)
        .await
        .unwrap();

    let (holder, _) = holding(&pool, p).await;
    assert_eq!(rescued_without_waiting(&pg, 10).await, [q]);
    states_are(
        &store,
        &[("P", p, "running"), ("C", c, "blocked"), ("Q", q, "retrying")],
    )
    .await;

    holder.rollback().await.unwrap();
    assert_eq!(rescued_without_waiting(&pg, 10).await, [p]);
    states_are(&store, &[("P", p, "dead"), ("C", c, "cancelled")]).await;
}

/// More expired jobs than the rescue's limit, one of them (P, enqueued last) ending with a waiting
/// child: the rescue takes P first, under the locks it took for P's cascade, and fills the limit with
/// the others, so that it does not lock a cascade and then rescue other jobs instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_takes_the_ending_jobs_it_locked_before_filling_its_limit() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let mut others = Vec::new();
    for i in 0..3 {
        others.push(
            store
                .enqueue("q", &NewJob::new(format!("o{i}"), json!({})))
                .await
                .unwrap()
                .id,
        );
    }
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    let c = store
        .enqueue("q", &NewJob::new("c", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    let claimed = store
        .claim_batch("q", "w", 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4, "P and the others run");
    sqlx::query(
        "UPDATE sluice.jobs SET lease_expires_at = now() - interval '1 minute' WHERE state = 'running'",
    )
    .execute(&pool)
    .await
    .unwrap();
    expired_on_its_last_attempt(&pool, p).await;

    assert_eq!(
        rescued_without_waiting(&pg, 2).await.first(),
        Some(&p),
        "P is rescued first"
    );
    states_are(&store, &[("P", p, "dead"), ("C", c, "cancelled")]).await;
    let mut rest = rescued_without_waiting(&pg, 10).await;
    assert_eq!(rest.len(), 2, "the limit was filled with one other job");
    rest.sort();
    assert!(rest.iter().all(|id| others.contains(id)));
}

/// Job P0 waits to run; P waits on it, C on P, and G on C with the smallest id; an enqueue naming G and
/// C locks G, then C. The cancel of P0 locked P0 with its children (P), then C and G level by level as
/// its trigger reached them: it held C and waited for G, crossing the enqueue. It now locks the whole
/// cascade with P0 in one statement in id order (`sql::JOB_CANCEL`), G first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_cascade_waits_for_an_enqueue_naming_a_grandchild_with_a_smaller_id_and_its_parent() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let g = a_smaller_id(&pool).await;
    let p0 = store
        .enqueue("q", &NewJob::new("p0", json!({})))
        .await
        .unwrap()
        .id;
    let p = store
        .enqueue("q", &NewJob::new("p", json!({})).depends_on([p0]))
        .await
        .unwrap()
        .id;
    let c = store
        .enqueue("q", &NewJob::new("c", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    with_id_waiting_on(&pool, g, c).await;
    assert!(g < p0, "the grandchild's id is the smallest");

    let (canceller, canceller_pid) = session(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, g).await;
    let cancel = cancel_once(canceller, p0);
    support::wait_until_blocked_by(&pool, canceller_pid, enqueuer_pid, "the cancel").await;

    let child = enqueue_and_commit(enqueuer, [g, c]).await;
    let before = cancel
        .await
        .unwrap()
        .expect("the cancel is not aborted as a deadlock");
    assert_eq!(before, "pending");
    for (name, id) in [("P0", p0), ("P", p), ("C", c), ("G", g), ("the new child", child)] {
        assert_eq!(state(&store, id).await, "cancelled", "{name} is cancelled");
    }
}

/// Running job P fails for good; its waiting child C has a waiting child G with the smallest id; an
/// enqueue naming G and C locks G, then C. The finishing batch locked P with its waiting children (C),
/// and its trigger then cancelled C and locked G on the cascade's next level: it held C and waited for
/// G, crossing the enqueue. `sluice.finish_jobs` (migration 0024) now locks the deeper cascade of a job
/// whose outcome is not a success with the batch, in one statement in id order, G first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_batch_waits_for_an_enqueue_naming_a_grandchild_with_a_smaller_id_and_its_parent() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let g = a_smaller_id(&pool).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    let c = store
        .enqueue("q", &NewJob::new("c", json!({})).depends_on([p]))
        .await
        .unwrap()
        .id;
    with_id_waiting_on(&pool, g, c).await;
    assert!(g < p, "the grandchild's id is the smallest");
    let attempt = running(&store, p).await;

    let (mut finisher, finisher_pid) = session(&pg).await;
    let (enqueuer, enqueuer_pid) = holding(&pool, g).await;
    let finish = tokio::spawn(async move {
        sqlx::query(sql::JOB_FINISH)
            .bind(vec![p])
            .bind(vec![attempt])
            .bind(vec!["p"])
            .bind(vec![0_i64])
            .bind(vec!["failed for good"])
            .bind("w")
            .fetch_all(&mut finisher)
            .await
            .map(|rows| rows.len())
    });
    support::wait_until_blocked_by(&pool, finisher_pid, enqueuer_pid, "the finish").await;

    let child = enqueue_and_commit(enqueuer, [g, c]).await;
    let finished = finish
        .await
        .unwrap()
        .expect("the finish is not aborted as a deadlock");
    assert_eq!(finished, 1);
    states_are(
        &store,
        &[
            ("P", p, "dead"),
            ("C", c, "cancelled"),
            ("G", g, "cancelled"),
            ("the new child", child, "cancelled"),
        ],
    )
    .await;
}

/// Running job P's cancellation was requested; its waiting child C has the smaller id; an enqueue
/// naming C and P locks C, then P. Handing P back at shutdown cancels it, and the release used to lock
/// P in its update and C in the trigger after it: it held P and waited for C, crossing the enqueue, and
/// PostgreSQL aborted one of them. The release now locks its jobs with the cascades of those it cancels
/// in one statement in id order (`sql::JOB_LOCK_RELEASING`), C first, and runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelling_a_job_waits_for_an_enqueue_naming_a_child_with_a_smaller_id_and_the_job() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let c = a_smaller_id(&pool).await;
    let p = store.enqueue("q", &NewJob::new("p", json!({}))).await.unwrap().id;
    with_id_waiting_on(&pool, c, p).await;
    assert!(c < p, "the child's id is the smaller");
    let attempt = running(&store, p).await;
    assert_eq!(store.cancel(p).await.unwrap(), CancelOutcome::Requested);

    let session = support::RetriedSession::connect(&pg.url(), "1s").await;
    let (releaser, releaser_pid) = (QueueStore::new(session.pool.clone()), session.pid);
    let (enqueuer, enqueuer_pid) = holding(&pool, c).await;
    let release = tokio::spawn(async move { releaser.release("w", &[(p, attempt)]).await });
    support::wait_until_blocked_by(&pool, releaser_pid, enqueuer_pid, "the release").await;

    let child = enqueue_and_commit(enqueuer, [c, p]).await;
    session.open_the_gate();
    let released = release.await.unwrap().expect("the release is done");
    assert_eq!(released, [p]);
    assert_eq!(
        session.runs(),
        1,
        "the release ran once: it was not aborted as a deadlock"
    );
    states_are(
        &store,
        &[
            ("P", p, "cancelled"),
            ("C", c, "cancelled"),
            ("the new child", child, "cancelled"),
        ],
    )
    .await;
}

/// Claims the only ready job of `q` for `owner`: its id and attempt.
async fn claimed_by(store: &QueueStore, owner: &str) -> (Uuid, i32) {
    let claimed = store
        .claim_batch("q", owner, 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "one job was ready");
    (claimed[0].id, claimed[0].attempt)
}

/// (state, attempt, lease owner) of job `id`.
async fn lease_of(pool: &PgPool, id: Uuid) -> (String, i32, Option<String>) {
    sqlx::query_as("SELECT state, attempt, lease_owner FROM sluice.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Hands back `w`'s unknown claims once, on a connection of its own, and asserts that it returns
/// without waiting for any lock: the ids handed back.
async fn handed_back_without_waiting(pg: &PgServer, held: &[(Uuid, i32)]) -> Vec<Uuid> {
    let (ids, attempts): (Vec<Uuid>, Vec<i32>) = held.iter().copied().unzip();
    let (mut conn, _) = session(pg).await;
    sqlx::query("SET lock_timeout = '20s'")
        .execute(&mut conn)
        .await
        .unwrap();
    let rows = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        sqlx::query(sql::JOB_RETURN_UNKNOWN)
            .bind("w")
            .bind(vec!["q".to_owned()])
            .bind(ids)
            .bind(attempts)
            .fetch_all(&mut conn),
    )
    .await
    .expect("handing back unknown claims waits for no lock")
    .unwrap();
    rows.iter().map(|r| r.get("id")).collect()
}

/// `sluice.return_unknown_claims` (migration 0029) hands back the running jobs leased to its owner that
/// the owner does not name: ready again as if never claimed (`pending` after a first attempt, `retrying`
/// after a later one, the claim's attempt taken back). It leaves alone a job the owner names at its
/// attempt (one it runs), a job it names at an earlier attempt only (the later attempt is handed back),
/// another owner's job, a job whose lease lapsed (the rescue's) and one whose cancellation was
/// requested. It never waits for a lock: a job another transaction holds (an enqueue naming it as a
/// parent, a completion writing it) is skipped, so it can take part in no deadlock, and the next call
/// hands it back once it is free.
#[tokio::test]
async fn handing_back_unknown_claims_takes_only_the_owners_unnamed_jobs_and_waits_for_no_lock() {
    let (pg, pool, store) = support::server_with_queue(10).await;
    let job = NewJob::new("k", json!({}));
    let enqueue = || store.enqueue("q", &job);
    enqueue().await.unwrap();
    let running = claimed_by(&store, "w").await;
    enqueue().await.unwrap();
    let (first, _) = claimed_by(&store, "w").await;
    // A job on its second attempt, of which the owner still names the first.
    enqueue().await.unwrap();
    let second = claimed_by(&store, "w").await;
    store.release("w", &[second]).await.unwrap();
    sqlx::query("UPDATE sluice.jobs SET attempt = 1, state = 'retrying' WHERE id = $1")
        .bind(second.0)
        .execute(&pool)
        .await
        .unwrap();
    let second_attempt = claimed_by(&store, "w").await;
    assert_eq!(second_attempt, (second.0, 2));
    enqueue().await.unwrap();
    let (others, _) = claimed_by(&store, "other").await;
    enqueue().await.unwrap();
    let (lapsed, _) = claimed_by(&store, "w").await;
    sqlx::query("UPDATE sluice.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1")
        .bind(lapsed)
        .execute(&pool)
        .await
        .unwrap();
    enqueue().await.unwrap();
    let (cancelling, _) = claimed_by(&store, "w").await;
    assert_eq!(store.cancel(cancelling).await.unwrap(), CancelOutcome::Requested);
    enqueue().await.unwrap();
    let (held, _) = claimed_by(&store, "w").await;

    let holder = support::locked_in_an_open_transaction(&pool, held).await;
    let named = [running, (second.0, 1)];
    let mut back = handed_back_without_waiting(&pg, &named).await;
    back.sort();
    let mut want = vec![first, second.0];
    want.sort();
    assert_eq!(back, want, "the unnamed jobs not held by another transaction");
    assert_eq!(lease_of(&pool, first).await, ("pending".into(), 0, None));
    assert_eq!(lease_of(&pool, second.0).await, ("retrying".into(), 1, None));
    assert_eq!(
        lease_of(&pool, running.0).await,
        ("running".into(), 1, Some("w".into()))
    );
    assert_eq!(
        lease_of(&pool, others).await,
        ("running".into(), 1, Some("other".into()))
    );
    assert_eq!(
        lease_of(&pool, lapsed).await,
        ("running".into(), 1, Some("w".into()))
    );
    assert_eq!(
        lease_of(&pool, cancelling).await,
        ("running".into(), 1, Some("w".into()))
    );
    assert_eq!(
        lease_of(&pool, held).await,
        ("running".into(), 1, Some("w".into()))
    );

    holder.rollback().await.unwrap();
    assert_eq!(handed_back_without_waiting(&pg, &named).await, [held]);
    assert_eq!(lease_of(&pool, held).await, ("pending".into(), 0, None));
    // Handed back jobs are claimed again as if they had never been: on the attempt they had left.
    let again = store
        .claim_batch("q", "w", 10, std::time::Duration::from_secs(60))
        .await
        .unwrap();
    let mut attempts: Vec<(Uuid, i32)> = again.iter().map(|j| (j.id, j.attempt)).collect();
    attempts.sort();
    let mut want = vec![(first, 1), (second.0, 2), (held, 1)];
    want.sort();
    assert_eq!(attempts, want);
}
