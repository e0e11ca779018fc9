//! Queue names with a namespace on a real PostgreSQL: `a/thumbnails` and `b/thumbnails` are two queues
//! that never see each other's jobs or keys, the table refuses malformed names, and a queue named before
//! namespaces is adopted under its new name with its settings, jobs (running ones too) and schedules.

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    Error, NewJob, QueueSettings, QueueStore, UniqueMode, schema,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;
use sqlx::PgPool;

async fn server() -> PgServer {
    tokio::task::spawn_blocking(PgServer::start).await.unwrap()
}

async fn connect(url: &str) -> PgPool {
    sluice_queue::pool::options(8)
        .connect(url)
        .await
        .expect("connect")
}

async fn jobs_of(store: &QueueStore, queue: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE queue = $1")
        .bind(queue)
        .fetch_one(store.pool())
        .await
        .unwrap()
}

#[tokio::test]
async fn queues_of_one_name_in_two_namespaces_are_two_queues() {
    let pg = server().await;
    let pool = connect(&pg.url()).await;
    schema::migrate(&pool).await.unwrap();
    let store = QueueStore::new(pool);
    for q in ["a/thumbnails", "b/thumbnails"] {
        store.upsert_queue(&QueueSettings::defaults(q)).await.unwrap();
    }
    // The same idempotency and unique keys in both: each queue keeps its own.
    let job = |n: i64| {
        NewJob::new("resize", json!({ "n": n }))
            .idempotency_key("k-1")
            .unique("u-1", UniqueMode::Preserve)
    };
    let a = store.enqueue("a/thumbnails", &job(1)).await.unwrap();
    let b = store.enqueue("b/thumbnails", &job(2)).await.unwrap();
    assert!(a.created && b.created && a.id != b.id);
    // The SQL API names them the same way.
    let c: uuid::Uuid =
        sqlx::query_scalar("SELECT sluice.enqueue('b/thumbnails', '{\"n\": 3}', kind => 'resize')")
            .fetch_one(store.pool())
            .await
            .unwrap();

    let claimed = store
        .claim_batch("a/thumbnails", "w-a", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [a.id]);
    assert_eq!(claimed[0].queue, "a/thumbnails");
    let claimed = store
        .claim_batch("b/thumbnails", "w-b", 10, Duration::from_secs(60))
        .await
        .unwrap();
    let mut ids: Vec<_> = claimed.iter().map(|j| j.id).collect();
    ids.sort();
    let mut want = vec![b.id, c];
    want.sort();
    assert_eq!(ids, want);
    assert_eq!(store.depth("a/thumbnails").await.unwrap().unwrap().running, 1);
    assert_eq!(store.depth("b/thumbnails").await.unwrap().unwrap().running, 2);
    // No queue by the short name exists.
    assert!(store.depth("thumbnails").await.unwrap().is_none());
    assert!(matches!(
        store.enqueue("thumbnails", &job(4)).await,
        Err(Error::NotFound(_))
    ));
}

#[tokio::test]
async fn malformed_names_are_refused_by_the_store_and_the_table() {
    let pg = server().await;
    let pool = connect(&pg.url()).await;
    schema::migrate(&pool).await.unwrap();
    let store = QueueStore::new(pool);
    for bad in ["Shop/emails", "-a/emails", "a/b/c", "/emails", "a/", "a b/c"] {
        assert!(
            matches!(
                store.upsert_queue(&QueueSettings::defaults(bad)).await,
                Err(Error::Invalid(_))
            ),
            "{bad:?} accepted by the store"
        );
        let err = sqlx::query("SELECT sluice.create_queue($1)")
            .bind(bad)
            .execute(store.pool())
            .await
            .expect_err(bad);
        assert_eq!(
            err.as_database_error().and_then(|e| e.code()).as_deref(),
            Some("23514"),
            "{bad:?}: {err}"
        );
    }
    for good in ["emails", "shop/emails", "a-1/x.y_z"] {
        store.upsert_queue(&QueueSettings::defaults(good)).await.unwrap();
    }
}

/// Queue `thumbnails` as a release before namespaces left it: settings, a waiting job, a running job
/// and a schedule.
async fn legacy_queue(store: &QueueStore) -> (uuid::Uuid, uuid::Uuid, i32) {
    sqlx::query("SELECT sluice.create_queue('thumbnails', max_attempts => 7)")
        .execute(store.pool())
        .await
        .unwrap();
    let running = store
        .enqueue("thumbnails", &NewJob::new("resize", json!({"n": 1})))
        .await
        .unwrap()
        .id;
    let claimed = store
        .claim_batch("thumbnails", "old-worker", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed[0].id, running);
    let waiting = store
        .enqueue(
            "thumbnails",
            &NewJob::new("resize", json!({"n": 2})).idempotency_key("k-2"),
        )
        .await
        .unwrap()
        .id;
    sqlx::query(
        "INSERT INTO sluice.schedules (queue, name, handled_until) VALUES ('thumbnails', 'nightly', now())",
    )
    .execute(store.pool())
    .await
    .unwrap();
    (waiting, running, claimed[0].attempt)
}

#[tokio::test]
async fn a_queue_named_before_namespaces_is_adopted_with_everything_it_holds() {
    let pg = server().await;
    let pool = connect(&pg.url()).await;
    schema::migrator_through(11).run(&pool).await.expect("old schema");
    let store = QueueStore::new(pool.clone());
    let (waiting, running, attempt) = legacy_queue(&store).await;
    schema::migrate(&pool).await.expect("upgrade");

    let moved = store.adopt_queue("thumbnails", "shop/thumbnails").await.unwrap();
    assert_eq!(moved, Some(2));
    assert!(store.queue("thumbnails").await.unwrap().is_none());
    assert_eq!(jobs_of(&store, "thumbnails").await, 0);
    assert_eq!(jobs_of(&store, "shop/thumbnails").await, 2);
    // Its settings came along, and so did its schedule.
    assert_eq!(
        store
            .queue("shop/thumbnails")
            .await
            .unwrap()
            .unwrap()
            .max_attempts,
        7
    );
    let schedules = store.schedules("shop/thumbnails").await.unwrap();
    assert_eq!(schedules.len(), 1);
    // The worker that held the running job completes it, fenced by id, owner and attempt as before.
    let done = store
        .finish_batch(
            "old-worker",
            &[Finished {
                id: running,
                attempt,
                finish: Finish::Succeeded,
            }],
        )
        .await
        .unwrap();
    assert_eq!(done.len(), 1);
    // The waiting job is claimed from the new name and keeps its idempotency key.
    let again = store
        .enqueue(
            "shop/thumbnails",
            &NewJob::new("resize", json!({"n": 2})).idempotency_key("k-2"),
        )
        .await
        .unwrap();
    assert_eq!((again.id, again.created), (waiting, false));
    let claimed = store
        .claim_batch("shop/thumbnails", "new-worker", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [waiting]);
    // The old name is gone: enqueues naming it fail, and adopting it again finds nothing.
    assert!(matches!(
        store
            .enqueue("thumbnails", &NewJob::new("resize", json!({})))
            .await,
        Err(Error::NotFound(_))
    ));
    assert_eq!(
        store.adopt_queue("thumbnails", "shop/thumbnails").await.unwrap(),
        None
    );
}

#[tokio::test]
async fn adopting_keeps_the_new_queues_settings_and_refuses_a_queue_that_holds_jobs() {
    let pg = server().await;
    let pool = connect(&pg.url()).await;
    schema::migrate(&pool).await.unwrap();
    let store = QueueStore::new(pool);
    legacy_queue(&store).await;
    // The operator registers the JobQueue's settings first; those stay.
    let mut settings = QueueSettings::defaults("shop/thumbnails");
    settings.max_attempts = 3;
    store.upsert_queue(&settings).await.unwrap();
    // A queue that holds jobs already is not merged into: keys could collide.
    store
        .enqueue("shop/thumbnails", &NewJob::new("resize", json!({})))
        .await
        .unwrap();
    assert!(matches!(
        store.adopt_queue("thumbnails", "shop/thumbnails").await,
        Err(Error::Conflict(_))
    ));
    assert_eq!(jobs_of(&store, "thumbnails").await, 2, "nothing moved");
    // Into an empty one it moves, keeping the new settings.
    store
        .upsert_queue(&QueueSettings {
            max_attempts: 3,
            ..QueueSettings::defaults("blog/thumbnails")
        })
        .await
        .unwrap();
    assert_eq!(
        store.adopt_queue("thumbnails", "blog/thumbnails").await.unwrap(),
        Some(2)
    );
    assert_eq!(
        store
            .queue("blog/thumbnails")
            .await
            .unwrap()
            .unwrap()
            .max_attempts,
        3
    );
}
