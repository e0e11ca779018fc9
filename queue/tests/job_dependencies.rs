//! Job dependencies on a real PostgreSQL: a child is `blocked` until every parent succeeded and ready in
//! the transaction that finishes the last one (with a NOTIFY), a failed parent cancels its children (or
//! not, with `onParentFailure: run`), concurrent completions of two parents release a child once, and a
//! graph of jobs with refs is enqueued all or nothing.

mod support;

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    Error, GraphJob, JobState, NewJob, OnParentFailure, QueueStore,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;
use uuid::Uuid;

async fn setup() -> (PgServer, QueueStore) {
    let (server, _, store) = support::server_with_queue(20).await;
    (server, store)
}

fn job(kind: &str) -> NewJob {
    NewJob::new(kind, json!({}))
}

async fn state(store: &QueueStore, id: Uuid) -> String {
    store.get(id).await.unwrap().expect("job exists").state
}

/// Claims every ready job of `q` as `owner`, returning (id, attempt) by kind order of the claim.
async fn claim_all(store: &QueueStore, owner: &str) -> Vec<(Uuid, i32)> {
    store
        .claim_batch("q", owner, 100, Duration::from_secs(60))
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j.attempt))
        .collect()
}

async fn finish(store: &QueueStore, owner: &str, (id, attempt): (Uuid, i32), finish: Finish) {
    let done = store
        .finish_batch(owner, &[Finished { id, attempt, finish }])
        .await
        .unwrap();
    assert_eq!(done.len(), 1, "{id} finished");
}

#[tokio::test]
async fn a_child_is_blocked_until_every_parent_succeeded_then_ready_at_once() {
    let (_pg, store) = setup().await;
    let a = store.enqueue("q", &job("a")).await.unwrap().id;
    let b = store.enqueue("q", &job("b")).await.unwrap().id;
    let child = store
        .enqueue("q", &job("child").depends_on([a, b]))
        .await
        .unwrap();
    assert!(child.created);
    assert_eq!(state(&store, child.id).await, "blocked");
    let depth = store.depth("q").await.unwrap().unwrap();
    assert_eq!(
        (depth.ready, depth.blocked, depth.demand()),
        (2, 1, 2),
        "blocked is not demand"
    );
    let parents = store.parents(child.id).await.unwrap();
    assert_eq!(parents.len(), 2);
    assert!(parents.iter().all(|p| p.state.as_deref() == Some("pending")));

    let claimed = claim_all(&store, "w1").await;
    assert_eq!(claimed.len(), 2, "the blocked child is not claimed");
    let (first, second) = (claimed[0], claimed[1]);
    finish(&store, "w1", first, Finish::Succeeded).await;
    assert_eq!(state(&store, child.id).await, "blocked", "one parent left");

    // LISTEN before the last parent finishes: its completion notifies the queue.
    let mut listener = sqlx::postgres::PgListener::connect_with(store.pool())
        .await
        .unwrap();
    listener.listen(sluice_queue::NOTIFY_CHANNEL).await.unwrap();
    finish(&store, "w1", second, Finish::Succeeded).await;
    assert_eq!(
        state(&store, child.id).await,
        "pending",
        "ready in the same transaction"
    );
    let note = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(note.payload(), "q");
    let claimed = claim_all(&store, "w1").await;
    assert_eq!(claimed.iter().map(|c| c.0).collect::<Vec<_>>(), vec![child.id]);

    // A parent that already succeeded counts as done: the new child is ready at once.
    let late = store.enqueue("q", &job("late").depends_on([a])).await.unwrap();
    assert_eq!(state(&store, late.id).await, "pending");
}

#[tokio::test]
async fn a_failure_cascades_down_a_long_chain_without_nesting_a_call_per_level() {
    let (_pg, store) = setup().await;
    let root = store.enqueue("q", &job("root")).await.unwrap().id;
    // 1,000 levels: far past what one nested trigger call per level fits in PostgreSQL's default stack.
    let pool = sqlx::PgPool::connect(&_pg.url()).await.unwrap();
    let last: Uuid = sqlx::query_scalar(
        "WITH RECURSIVE chain(n, id) AS (SELECT 0, $1::uuid UNION ALL \
         SELECT n + 1, (SELECT e.id FROM sluice.enqueue_job('q', 'link', '{}'::jsonb, \
                        p_depends_on => ARRAY[chain.id]) e) FROM chain WHERE n < 1000) \
         SELECT id FROM chain WHERE n = 1000",
    )
    .bind(root)
    .fetch_one(&pool)
    .await
    .unwrap();
    let claimed = claim_all(&store, "w1").await;
    assert_eq!(claimed.len(), 1, "only the root is ready");
    finish(
        &store,
        "w1",
        claimed[0],
        Finish::Permanent {
            error: "broken".into(),
        },
    )
    .await;
    let cancelled: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE state = 'cancelled'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(cancelled, 1000, "every link cancelled");
    let reason = store.get(last).await.unwrap().unwrap().last_error.unwrap();
    assert!(reason.starts_with("cancelled: parent job "), "{reason}");
    assert!(reason.ends_with(" is cancelled"), "{reason}");
}

#[tokio::test]
async fn a_failed_parent_cancels_its_descendants_naming_it_unless_they_run_anyway() {
    let (_pg, store) = setup().await;
    let parent = store.enqueue("q", &job("parent")).await.unwrap().id;
    let child = store
        .enqueue("q", &job("child").depends_on([parent]))
        .await
        .unwrap()
        .id;
    let grandchild = store
        .enqueue("q", &job("grandchild").depends_on([child]))
        .await
        .unwrap()
        .id;
    let cleanup = store
        .enqueue(
            "q",
            &job("cleanup")
                .depends_on([parent])
                .on_parent_failure(OnParentFailure::Run),
        )
        .await
        .unwrap()
        .id;
    let claimed = claim_all(&store, "w1").await;
    finish(
        &store,
        "w1",
        claimed[0],
        Finish::Permanent {
            error: "broken".into(),
        },
    )
    .await;
    for id in [child, grandchild] {
        let j = store.get(id).await.unwrap().unwrap();
        assert_eq!(j.state, "cancelled");
        assert!(
            j.last_error.as_deref().unwrap_or_default().contains("parent job"),
            "{j:?}"
        );
    }
    let reason = store.get(child).await.unwrap().unwrap().last_error.unwrap();
    assert_eq!(reason, format!("cancelled: parent job {parent} is dead"));
    assert_eq!(state(&store, cleanup).await, "pending", "onParentFailure: run");

    // A dead parent named at enqueue cancels the new child at once.
    let again = store
        .enqueue("q", &job("again").depends_on([parent]))
        .await
        .unwrap();
    assert_eq!(state(&store, again.id).await, "cancelled");

    // Cancelling a blocked job cascades too.
    let p2 = store.enqueue("q", &job("p2")).await.unwrap().id;
    let c2 = store.enqueue("q", &job("c2").depends_on([p2])).await.unwrap().id;
    let g2 = store.enqueue("q", &job("g2").depends_on([c2])).await.unwrap().id;
    store.cancel(c2).await.unwrap();
    assert_eq!(state(&store, c2).await, "cancelled");
    assert_eq!(state(&store, g2).await, "cancelled");
    assert_eq!(state(&store, p2).await, "pending", "parents are not touched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_completions_of_the_last_two_parents_release_the_child_once() {
    let (_pg, store) = setup().await;
    for round in 0..20 {
        let a = store.enqueue("q", &job("a")).await.unwrap().id;
        let b = store.enqueue("q", &job("b")).await.unwrap().id;
        let child = store
            .enqueue("q", &job("child").depends_on([a, b]))
            .await
            .unwrap()
            .id;
        let ca = store
            .claim_batch("q", "wa", 1, Duration::from_secs(60))
            .await
            .unwrap();
        let cb = store
            .claim_batch("q", "wb", 1, Duration::from_secs(60))
            .await
            .unwrap();
        let (ja, jb) = ((ca[0].id, ca[0].attempt), (cb[0].id, cb[0].attempt));
        let (s1, s2) = (store.clone(), store.clone());
        let t1 = tokio::spawn(async move { finish(&s1, "wa", ja, Finish::Succeeded).await });
        let t2 = tokio::spawn(async move { finish(&s2, "wb", jb, Finish::Succeeded).await });
        t1.await.unwrap();
        t2.await.unwrap();
        let j = store.get(child).await.unwrap().unwrap();
        assert_eq!((j.state.as_str(), j.blocked_by), ("pending", 0), "round {round}");
        let claimed = claim_all(&store, "w1").await;
        assert_eq!(claimed.len(), 1, "round {round}");
        finish(&store, "w1", claimed[0], Finish::Succeeded).await;
    }
}

fn node(r: &str, deps: &[&str]) -> GraphJob {
    GraphJob::new(r, job(r)).depends_on(deps.iter().copied())
}

#[tokio::test]
async fn a_graph_is_enqueued_parents_first_and_refused_whole_when_it_is_not_a_dag() {
    let (_pg, store) = setup().await;
    let existing = store.enqueue("q", &job("existing")).await.unwrap().id;
    let existing_ref = existing.to_string();
    // Listed children first: the function orders them.
    let graph = [
        node("bind", &["page-1", "page-2"]),
        node("page-2", &["cover"]),
        node("page-1", &["cover", existing_ref.as_str()]),
        node("cover", &[]),
    ];
    let ids = store.enqueue_graph("q", &graph).await.unwrap();
    let refs: Vec<_> = ids.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(refs, ["bind", "page-2", "page-1", "cover"], "input order");
    let id = |r: &str| ids.iter().find(|(x, _)| x == r).unwrap().1.id;
    assert_eq!(state(&store, id("cover")).await, "pending");
    for r in ["bind", "page-1", "page-2"] {
        assert_eq!(state(&store, id(r)).await, "blocked", "{r}");
    }
    let bind = store.get(id("bind")).await.unwrap().unwrap();
    assert_eq!(bind.blocked_by, 2);
    let mut parents: Vec<_> = store
        .parents(id("page-1"))
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.id)
        .collect();
    parents.sort();
    let mut want = vec![id("cover"), existing];
    want.sort();
    assert_eq!(parents, want);

    let before: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let bad = [
        (
            vec![node("a", &["b"]), node("b", &["a"]), node("c", &[])],
            "form a cycle",
        ),
        (vec![node("a", &["a"])], "form a cycle"),
        (
            vec![node("a", &["nowhere"])],
            "neither a ref of this call nor a job id",
        ),
        (vec![node("a", &[]), node("a", &[])], "used twice"),
        (
            vec![
                node("a", &[]),
                node("b", &["a", "01890000-0000-7000-8000-000000000000"]),
            ],
            "does not exist",
        ),
    ];
    for (graph, want) in bad {
        match store.enqueue_graph("q", &graph).await {
            Err(Error::Invalid(m)) => assert!(m.contains(want), "{m:?} should say {want:?}"),
            other => panic!("expected invalid, got {other:?}"),
        }
    }
    let after: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(before, after, "nothing half-enqueued");
}

#[tokio::test]
async fn unknown_parents_and_dependencies_in_a_batch_are_refused() {
    let (_pg, store) = setup().await;
    let missing = Uuid::now_v7();
    match store.enqueue("q", &job("c").depends_on([missing])).await {
        Err(Error::Invalid(m)) => assert!(m.contains(&missing.to_string()), "{m}"),
        other => panic!("expected invalid, got {other:?}"),
    }
    let parent = store.enqueue("q", &job("p")).await.unwrap().id;
    assert!(matches!(
        store.enqueue_many("q", &[job("c").depends_on([parent])]).await,
        Err(Error::Invalid(_))
    ));
    assert!(JobState::ALL.contains(&JobState::Blocked));
}

/// Two completion batches (two workers) finishing parents of shared children: each batch's parents are
/// children-first in opposite orders (the first batch reaches the children from the lowest id up, the
/// second from the highest down), which used to deadlock: PostgreSQL aborted one after
/// `deadlock_timeout` and its worker retried the whole batch. The children are locked in id order before
/// any is released, so both batches now finish at the first try, every time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completion_batches_sharing_children_never_deadlock() {
    let (_pg, store) = setup().await;
    const N: usize = 40;
    for round in 0..5 {
        // Parents 0..2N in id order; the even ones go to worker "wa", the odd ones to "wb".
        let mut parents = Vec::new();
        for i in 0..2 * N {
            let p = job("p").priority(if i % 2 == 0 { 1 } else { 0 });
            parents.push(store.enqueue("q", &p).await.unwrap().id);
        }
        // Child k waits for wa's k-th parent and wb's (N-1-k)-th.
        let mut children = Vec::new();
        for k in 0..N {
            let c = job("c").depends_on([parents[2 * k], parents[2 * (N - 1 - k) + 1]]);
            children.push(store.enqueue("q", &c).await.unwrap().id);
        }
        let claim = |owner: &'static str| {
            let store = store.clone();
            async move {
                store
                    .claim_batch("q", owner, N as u32, Duration::from_secs(60))
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|j| Finished {
                        id: j.id,
                        attempt: j.attempt,
                        finish: Finish::Succeeded,
                    })
                    .collect::<Vec<_>>()
            }
        };
        let a = claim("wa").await;
        let b = claim("wb").await;
        assert!(a.iter().all(|f| parents.iter().step_by(2).any(|p| *p == f.id)));
        assert_eq!(b.len(), N);
        let (sa, sb) = (store.clone(), store.clone());
        let (ra, rb) = tokio::join!(
            tokio::spawn(async move { sa.finish_batch("wa", &a).await }),
            tokio::spawn(async move { sb.finish_batch("wb", &b).await }),
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(ra.is_ok() && rb.is_ok(), "round {round}: {ra:?} / {rb:?}");
        assert_eq!((ra.unwrap().len(), rb.unwrap().len()), (N, N));
        for c in &children {
            assert_eq!(state(&store, *c).await, "pending", "round {round}");
        }
        // Leave the queue empty for the next round.
        sqlx::query("DELETE FROM sluice.jobs")
            .execute(store.pool())
            .await
            .unwrap();
    }
}
