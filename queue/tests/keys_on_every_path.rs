//! Idempotency keys, unique keys and dependencies together, on every enqueue path (one job, a batch, a
//! graph, the SQL functions), on a real PostgreSQL: the idempotency key answers a retried request first,
//! then the unique key decides; a new job keeps its parents, an existing one answers without taking
//! them; concurrent batches sharing keys make one job per key.

mod support;

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    Error, GraphJob, NewJob, OnParentFailure, QueueSettings, QueueStore, UniqueMode,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;
use uuid::Uuid;

async fn setup() -> (PgServer, QueueStore) {
    let (server, _, store) = support::server_with_queue(40).await;
    (server, store)
}

fn job(n: i64) -> NewJob {
    NewJob::new("digest", json!({ "n": n }))
}

async fn state(store: &QueueStore, id: Uuid) -> String {
    store.get(id).await.unwrap().expect("job exists").state
}

async fn count(store: &QueueStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Claims the ready jobs of `q` as `w1`: (id, attempt).
async fn claim(store: &QueueStore) -> Vec<(Uuid, i32)> {
    store
        .claim_batch("q", "w1", 100, Duration::from_secs(60))
        .await
        .unwrap()
        .into_iter()
        .map(|j| (j.id, j.attempt))
        .collect()
}

async fn finish(store: &QueueStore, (id, attempt): (Uuid, i32), finish: Finish) {
    let done = store
        .finish_batch("w1", &[Finished { id, attempt, finish }])
        .await
        .unwrap();
    assert_eq!(done.len(), 1, "{id} finished");
}

#[tokio::test]
async fn a_unique_job_with_parents_waits_for_them_and_a_held_key_answers_without_taking_new_parents() {
    let (_pg, store) = setup().await;
    let p1 = store.enqueue("q", &job(1)).await.unwrap().id;
    let p2 = store.enqueue("q", &job(2)).await.unwrap().id;

    let first = store
        .enqueue("q", &job(10).unique("k", UniqueMode::Preserve).depends_on([p1]))
        .await
        .unwrap();
    assert!(first.created);
    assert_eq!(state(&store, first.id).await, "blocked");

    // Preserve: the holder answers; the new parent (p2) is not added to it.
    let again = store
        .enqueue("q", &job(11).unique("k", UniqueMode::Preserve).depends_on([p2]))
        .await
        .unwrap();
    assert_eq!((again.id, again.created), (first.id, false));
    // Replace of a waiting (blocked) holder: the payload changes, the parents stay as they were.
    let replaced = store
        .enqueue("q", &job(12).unique("k", UniqueMode::Replace).depends_on([p2]))
        .await
        .unwrap();
    assert_eq!((replaced.id, replaced.created), (first.id, false));
    let parents: Vec<Uuid> = store
        .parents(first.id)
        .await
        .unwrap()
        .iter()
        .map(|p| p.id)
        .collect();
    assert_eq!(parents, vec![p1], "only the parents it was created with");
    let held = store.get(first.id).await.unwrap().unwrap();
    assert_eq!(
        (held.state.as_str(), &held.payload),
        ("blocked", &json!({"n": 12}))
    );

    // p1 succeeds: the keyed child is ready.
    let claimed = claim(&store).await;
    let p1_claim = *claimed.iter().find(|c| c.0 == p1).unwrap();
    finish(&store, p1_claim, Finish::Succeeded).await;
    assert_eq!(state(&store, first.id).await, "pending");
}

#[tokio::test]
async fn replacing_a_running_holder_waits_for_it_whatever_its_outcome_and_for_its_own_parents() {
    let (_pg, store) = setup().await;
    let holder = store
        .enqueue("q", &job(1).unique("k", UniqueMode::Replace))
        .await
        .unwrap()
        .id;
    let running = claim(&store).await;
    assert_eq!(running[0].0, holder);
    let parent = store.enqueue("q", &job(2)).await.unwrap().id;

    let next = store
        .enqueue("q", &job(3).unique("k", UniqueMode::Replace).depends_on([parent]))
        .await
        .unwrap();
    assert!(next.created);
    assert_eq!(state(&store, next.id).await, "blocked");
    // The running holder dies: the new job is not cancelled by it, only waits for its own parent.
    finish(&store, running[0], Finish::Permanent { error: "boom".into() }).await;
    assert_eq!(state(&store, holder).await, "dead");
    assert_eq!(state(&store, next.id).await, "blocked");
    // Its own parent fails: that cancels it, naming the parent.
    let p = claim(&store).await;
    assert_eq!(p[0].0, parent);
    finish(&store, p[0], Finish::Permanent { error: "boom".into() }).await;
    let cancelled = store.get(next.id).await.unwrap().unwrap();
    assert_eq!(cancelled.state, "cancelled");
    assert!(
        cancelled
            .last_error
            .as_deref()
            .unwrap_or("")
            .contains(&parent.to_string()),
        "{:?}",
        cancelled.last_error
    );

    // And with onParentFailure: run, a failed parent lets it run once the holder is done.
    let holder = store
        .enqueue("q", &job(4).unique("j", UniqueMode::Replace))
        .await
        .unwrap()
        .id;
    let running = claim(&store).await;
    assert_eq!(running[0].0, holder);
    let parent = store.enqueue("q", &job(5)).await.unwrap().id;
    let next = store
        .enqueue(
            "q",
            &job(6)
                .unique("j", UniqueMode::Replace)
                .depends_on([parent])
                .on_parent_failure(OnParentFailure::Run),
        )
        .await
        .unwrap()
        .id;
    let p = claim(&store).await;
    assert_eq!(p[0].0, parent);
    finish(&store, p[0], Finish::Permanent { error: "boom".into() }).await;
    assert_eq!(state(&store, next).await, "blocked", "still waits for the holder");
    finish(&store, running[0], Finish::Succeeded).await;
    assert_eq!(state(&store, next).await, "pending");
}

#[tokio::test]
async fn the_idempotency_key_answers_a_retry_first_then_the_unique_key_decides() {
    let (_pg, store) = setup().await;
    let a = job(1).unique("k", UniqueMode::Preserve).idempotency_key("req-1");
    let made = store.enqueue("q", &a).await.unwrap();
    assert!(made.created);
    let stored = store.get(made.id).await.unwrap().unwrap();
    assert_eq!(stored.idempotency_key.as_deref(), Some("req-1"));
    assert_eq!(stored.unique_key.as_deref(), Some("k"));

    // A retry is answered by its idempotency key, also after the job finished and gave the key up.
    let claimed = claim(&store).await;
    finish(&store, claimed[0], Finish::Succeeded).await;
    let retry = store.enqueue("q", &a).await.unwrap();
    assert_eq!((retry.id, retry.created), (made.id, false));
    // The same idempotency key with another payload is a conflict, whatever the unique key says.
    assert!(matches!(
        store
            .enqueue(
                "q",
                &job(2).unique("k", UniqueMode::Preserve).idempotency_key("req-1")
            )
            .await,
        Err(Error::Conflict(_))
    ));
    // A new request: the unique key decides (the key was released, so a new job).
    let b = job(3).unique("k", UniqueMode::Preserve).idempotency_key("req-2");
    let second = store.enqueue("q", &b).await.unwrap();
    assert!(second.created);
    // Another new request while it waits: the holder answers and takes the request's idempotency key
    // only when it has none (it has req-2); a third request with a key answers the same.
    let c = job(4).unique("k", UniqueMode::Preserve).idempotency_key("req-3");
    assert_eq!(store.enqueue("q", &c).await.unwrap().id, second.id);
    let plain = store
        .enqueue("q", &job(5).unique("p", UniqueMode::Preserve))
        .await
        .unwrap();
    let d = job(6).unique("p", UniqueMode::Preserve).idempotency_key("req-4");
    assert_eq!(store.enqueue("q", &d).await.unwrap().id, plain.id);
    // The holder of "p" now answers req-4 even after it finished.
    let claimed = claim(&store).await;
    for c in claimed {
        finish(&store, c, Finish::Succeeded).await;
    }
    assert_eq!(store.enqueue("q", &d).await.unwrap().id, plain.id);
    assert_eq!(count(&store).await, 3);
}

#[tokio::test]
async fn a_batch_takes_unique_and_idempotency_keys_and_answers_held_keys_with_the_holder() {
    let (_pg, store) = setup().await;
    let holder = store
        .enqueue("q", &job(0).unique("a", UniqueMode::Preserve))
        .await
        .unwrap()
        .id;
    let ids = store
        .enqueue_many(
            "q",
            &[
                job(1),
                job(2).unique("a", UniqueMode::Preserve),
                job(3).unique("b", UniqueMode::Preserve),
                job(4).unique("b", UniqueMode::Preserve),
                job(5).idempotency_key("r1"),
                job(6).debounce("c", Duration::from_secs(60)),
                job(7).delay(Duration::from_secs(60)),
            ],
        )
        .await
        .unwrap();
    assert_eq!(ids.len(), 7);
    assert_eq!(ids[1], holder, "a held key answers with the holder");
    assert_eq!(ids[2], ids[3], "one key in one batch: one job");
    assert_eq!(count(&store).await, 6);
    let debounced = store.get(ids[5]).await.unwrap().unwrap();
    assert!(debounced.run_at > chrono::Utc::now() + chrono::Duration::seconds(50));
    let delayed = store.get(ids[6]).await.unwrap().unwrap();
    assert!(delayed.run_at > chrono::Utc::now() + chrono::Duration::seconds(50));
    // Retrying the batch: the idempotency key answers its job.
    let again = store
        .enqueue_many("q", &[job(5).idempotency_key("r1")])
        .await
        .unwrap();
    assert_eq!(again, vec![ids[4]]);
    // Dependencies still take a graph.
    assert!(matches!(
        store.enqueue_many("q", &[job(8).depends_on([holder])]).await,
        Err(Error::Invalid(m)) if m.contains("graph")
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_batches_sharing_unique_keys_make_one_job_per_key() {
    let (_pg, store) = setup().await;
    let keys = ["k0", "k1", "k2", "k3", "k4"];
    let tasks: Vec<_> = (0..16)
        .map(|t| {
            let store = store.clone();
            // Each batch names the keys in another order, with unkeyed jobs between.
            let jobs: Vec<NewJob> = (0..keys.len())
                .flat_map(|i| {
                    let key = keys[(i + t) % keys.len()];
                    [job(t as i64).unique(key, UniqueMode::Preserve), job(100)]
                })
                .collect();
            tokio::spawn(async move { store.enqueue_many("q", &jobs).await.unwrap() })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap());
    }
    for key in keys {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE unique_key = $1")
            .bind(key)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(n, 1, "{key}");
    }
    // 5 keyed jobs and 16 × 5 unkeyed ones.
    assert_eq!(count(&store).await, 5 + 16 * 5);
    // Every batch got the one holder's id for each key.
    let holder = |key: &str| {
        let store = store.clone();
        let key = key.to_owned();
        async move {
            sqlx::query_scalar::<_, Uuid>("SELECT id FROM sluice.jobs WHERE unique_key = $1")
                .bind(key)
                .fetch_one(store.pool())
                .await
                .unwrap()
        }
    };
    for (t, ids) in all.iter().enumerate() {
        for i in 0..keys.len() {
            assert_eq!(ids[2 * i], holder(keys[(i + t) % keys.len()]).await);
        }
    }
}

#[tokio::test]
async fn a_graph_job_with_a_held_key_is_the_holder_and_its_children_depend_on_it() {
    let (_pg, store) = setup().await;
    let holder = store
        .enqueue("q", &job(0).unique("render", UniqueMode::Preserve))
        .await
        .unwrap()
        .id;
    let graph = [
        GraphJob::new("render", job(1).unique("render", UniqueMode::Preserve)),
        GraphJob::new("bind", job(2).idempotency_key("bind-7")).depends_on(["render"]),
    ];
    let ids = store.enqueue_graph("q", &graph).await.unwrap();
    assert_eq!(ids[0].0, "render");
    assert_eq!((ids[0].1.id, ids[0].1.created), (holder, false));
    assert!(ids[1].1.created);
    let bind = ids[1].1.id;
    assert_eq!(state(&store, bind).await, "blocked");
    let parents: Vec<Uuid> = store.parents(bind).await.unwrap().iter().map(|p| p.id).collect();
    assert_eq!(parents, vec![holder]);
    // The same graph again: the unique key answers render, the idempotency key answers bind.
    let again = store.enqueue_graph("q", &graph).await.unwrap();
    let same: Vec<_> = again.iter().map(|(r, e)| (r.clone(), e.id, e.created)).collect();
    assert_eq!(
        same,
        [
            ("render".to_owned(), holder, false),
            ("bind".to_owned(), bind, false)
        ]
    );
    assert_eq!(count(&store).await, 2);
    // Options are checked by name, as for one job.
    let bad = [GraphJob::new(
        "x",
        NewJob {
            unique_mode: Some(UniqueMode::Replace),
            ..job(3)
        },
    )];
    assert!(matches!(
        store.enqueue_graph("q", &bad).await,
        Err(Error::Invalid(m)) if m.contains("jobs[0]") && m.contains("uniqueKey")
    ));
}

#[tokio::test]
async fn the_sql_functions_take_keys_and_dependencies_together() {
    let (_pg, store) = setup().await;
    let pool = store.pool();
    let parent: Uuid = sqlx::query_scalar("SELECT sluice.enqueue('q', '{}')")
        .fetch_one(pool)
        .await
        .unwrap();
    let one = "SELECT sluice.enqueue('q', '{}', unique_key => 'u', idempotency_key => 'i', \
               depends_on => ARRAY[$1::uuid])";
    let a: Uuid = sqlx::query_scalar(one)
        .bind(parent)
        .fetch_one(pool)
        .await
        .unwrap();
    let b: Uuid = sqlx::query_scalar(one)
        .bind(parent)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(a, b);
    assert_eq!(state(&store, a).await, "blocked");
    let many: Vec<Uuid> = sqlx::query_scalar(
        "SELECT sluice.enqueue_many('q', ARRAY['{}', '{}']::jsonb[], unique_keys => ARRAY['u', 'v'], \
         idempotency_keys => ARRAY[NULL, 'j'])",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(many[0], a);
    assert_ne!(many[1], a);
    let graph: Vec<(String, Uuid, bool)> = sqlx::query_as(
        r#"SELECT ref, id, created FROM sluice.enqueue_graph('q', '[
             {"ref": "x", "kind": "k", "payload": {}, "uniqueKey": "v"},
             {"ref": "y", "kind": "k", "payload": {}, "uniqueKey": "w", "uniqueFor": "1 hour",
              "dependsOn": ["x"]}]')"#,
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!((graph[0].1, graph[0].2), (many[1], false));
    assert!(graph[1].2);
    let y = store.get(graph[1].1).await.unwrap().unwrap();
    assert_eq!(y.unique_for_ms, Some(3_600_000));
}

/// The unique key of job `id`.
async fn unique_key(store: &QueueStore, id: Uuid) -> Option<String> {
    sqlx::query_scalar("SELECT unique_key FROM sluice.jobs WHERE id = $1")
        .bind(id)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn an_idempotency_key_recorded_on_an_old_holder_counts_its_window_from_then() {
    let (_pg, store) = setup().await;
    let window_h = QueueSettings::defaults("q").idempotency_window_ms / 3_600_000;
    let holder = store
        .enqueue("q", &job(1).unique("k", UniqueMode::Preserve))
        .await
        .unwrap()
        .id;
    // The holder was made longer ago than the idempotency window.
    sqlx::query("UPDATE sluice.jobs SET created_at = now() - $1 * interval '1 hour' WHERE id = $2")
        .bind(window_h as f64 + 1.0)
        .bind(holder)
        .execute(store.pool())
        .await
        .unwrap();

    // The request is answered by the holder, which records its idempotency key now.
    let request = job(2).unique("k", UniqueMode::Preserve).idempotency_key("x");
    let first = store.enqueue("q", &request).await.unwrap();
    assert_eq!((first.id, first.created), (holder, false));
    let c = claim(&store).await;
    assert_eq!(c[0].0, holder);
    finish(&store, c[0], Finish::Succeeded).await;

    // A retry within the window (from the recording) is answered by the same job, although the job
    // finished and gave its unique key up: the request does not run twice.
    let retry = store.enqueue("q", &request).await.unwrap();
    assert_eq!((retry.id, retry.created), (holder, false));
    assert_eq!(count(&store).await, 1);

    // Once the window has passed since the recording, the key is forgotten: a new job.
    sqlx::query("UPDATE sluice.jobs SET idempotency_at = now() - $1 * interval '1 hour' WHERE id = $2")
        .bind(window_h as f64 + 1.0)
        .bind(holder)
        .execute(store.pool())
        .await
        .unwrap();
    let later = store.enqueue("q", &request).await.unwrap();
    assert!(later.created);
    assert_ne!(later.id, holder);
}

#[tokio::test]
async fn a_replacement_created_cancelled_leaves_the_key_with_the_running_holder() {
    let (_pg, store) = setup().await;
    let holder = store
        .enqueue("q", &job(1).unique("k", UniqueMode::Replace))
        .await
        .unwrap()
        .id;
    let running = claim(&store).await;
    assert_eq!(running[0].0, holder);
    let parent = store.enqueue("q", &job(2)).await.unwrap().id;
    store.cancel(parent).await.unwrap();
    assert_eq!(state(&store, parent).await, "cancelled");

    // Its parent is already cancelled: the new job is made cancelled, without the key.
    let next = store
        .enqueue("q", &job(3).unique("k", UniqueMode::Replace).depends_on([parent]))
        .await
        .unwrap();
    assert!(next.created);
    assert_eq!(state(&store, next.id).await, "cancelled");
    assert_eq!(unique_key(&store, next.id).await, None);
    assert_eq!(unique_key(&store, holder).await.as_deref(), Some("k"));

    // The running holder still holds the key: no second job runs beside it.
    let again = store
        .enqueue("q", &job(4).unique("k", UniqueMode::Preserve))
        .await
        .unwrap();
    assert_eq!((again.id, again.created), (holder, false));
    assert!(claim(&store).await.is_empty(), "nothing else to run");
}

#[tokio::test]
async fn a_deadlocked_enqueue_is_retried() {
    let (_pg, store) = setup().await;
    // The first job insert fails as a deadlock victim would (a sequence is not rolled back with it).
    // The trigger runs under the enqueue functions' pinned `search_path`: it names its sequence with
    // its schema.
    sqlx::raw_sql(
        "CREATE SEQUENCE test_inserts;
         CREATE FUNCTION test_deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('public.test_inserts') = 1 THEN
                 RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';
             END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER test_deadlock_once BEFORE INSERT ON sluice.jobs
             FOR EACH ROW EXECUTE FUNCTION test_deadlock_once();",
    )
    .execute(store.pool())
    .await
    .unwrap();
    let reset = || async {
        sqlx::query("SELECT setval('test_inserts', 1, false)")
            .execute(store.pool())
            .await
            .unwrap();
    };

    let ids = store
        .enqueue_many(
            "q",
            &[
                job(1).unique("a", UniqueMode::Preserve).idempotency_key("z"),
                job(2).unique("b", UniqueMode::Preserve),
            ],
        )
        .await
        .unwrap();
    assert_eq!(ids.len(), 2);
    reset().await;
    let one = store
        .enqueue("q", &job(3).unique("c", UniqueMode::Preserve))
        .await
        .unwrap();
    assert!(one.created);
    reset().await;
    let graph = store
        .enqueue_graph("q", &[GraphJob::new("g", job(4))])
        .await
        .unwrap();
    assert!(graph[0].1.created);
    assert_eq!(count(&store).await, 4);

    // A deadlock every time is the caller's after DEADLOCK_ATTEMPTS runs.
    sqlx::query(
        "CREATE OR REPLACE FUNCTION test_deadlock_once() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             PERFORM nextval('public.test_inserts');
             RAISE EXCEPTION 'deadlock detected' USING ERRCODE = '40P01';
         END $$",
    )
    .execute(store.pool())
    .await
    .unwrap();
    reset().await;
    let err = store.enqueue("q", &job(5)).await.unwrap_err();
    assert!(sluice_queue::store::is_deadlock(&err), "{err}");
    let runs: i64 = sqlx::query_scalar("SELECT last_value FROM test_inserts")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(runs, i64::from(sluice_queue::store::DEADLOCK_ATTEMPTS));
}
