//! Unique jobs on a real PostgreSQL: one job per unique key under many concurrent enqueuers, the three
//! unique modes against waiting, running and finished holders, `uniqueFor`, the SQL API's named
//! parameters, and an upgrade from the schema before unique keys.

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    Error, NewJob, QueueSettings, QueueStore, UniqueMode, schema,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;
use sqlx::PgPool;

/// A server with the queue schema, a store on it and queue `q`.
async fn setup() -> (PgServer, QueueStore) {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = connect(&server.url()).await;
    schema::migrate(&pool).await.expect("migrate");
    let store = QueueStore::new(pool);
    store.upsert_queue(&QueueSettings::defaults("q")).await.unwrap();
    (server, store)
}

async fn connect(url: &str) -> PgPool {
    sluice_queue::pool::options(40)
        .connect(url)
        .await
        .expect("connect")
}

async fn count(store: &QueueStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Claims the one ready job of `q` and returns its attempt.
async fn claim_one(store: &QueueStore) -> (uuid::Uuid, i32) {
    let jobs = store
        .claim_batch("q", "w1", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "one job ready");
    (jobs[0].id, jobs[0].attempt)
}

async fn finish(store: &QueueStore, (id, attempt): (uuid::Uuid, i32), finish: Finish) {
    let done = store
        .finish_batch("w1", &[Finished { id, attempt, finish }])
        .await
        .unwrap();
    assert_eq!(done.len(), 1);
}

fn job(n: i64) -> NewJob {
    NewJob::new("digest", json!({ "n": n }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_enqueuers_with_one_unique_key_make_one_job_in_every_mode() {
    let (_pg, store) = setup().await;
    for (round, mode) in [UniqueMode::Preserve, UniqueMode::Replace, UniqueMode::Debounce]
        .into_iter()
        .enumerate()
    {
        let key = format!("user-{round}");
        let tasks: Vec<_> = (0..32)
            .map(|n| {
                let mut j = job(n).unique(key.clone(), mode);
                if mode == UniqueMode::Debounce {
                    j.debounce = Some(Duration::from_secs(60).into());
                }
                let store = store.clone();
                tokio::spawn(async move { store.enqueue("q", &j).await.unwrap() })
            })
            .collect();
        let mut results = Vec::new();
        for t in tasks {
            results.push(t.await.unwrap());
        }
        assert_eq!(
            results.iter().filter(|r| r.created).count(),
            1,
            "{mode:?}: one created"
        );
        assert!(results.iter().all(|r| r.id == results[0].id), "{mode:?}: one job");
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE unique_key = $1")
            .bind(&key)
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(n, 1, "{mode:?}");
    }
    assert_eq!(count(&store).await, 3);
}

#[tokio::test]
async fn preserve_returns_the_holder_and_replace_updates_a_waiting_one() {
    let (_pg, store) = setup().await;
    let first = store
        .enqueue("q", &job(1).unique("k", UniqueMode::Preserve))
        .await
        .unwrap();
    assert!(first.created);
    let again = store
        .enqueue("q", &job(2).unique("k", UniqueMode::Preserve))
        .await
        .unwrap();
    assert_eq!((again.id, again.created), (first.id, false));
    assert_eq!(
        store.get(first.id).await.unwrap().unwrap().payload,
        json!({"n": 1})
    );

    let replaced = store
        .enqueue("q", &job(3).unique("k", UniqueMode::Replace).priority(7))
        .await
        .unwrap();
    assert_eq!((replaced.id, replaced.created), (first.id, false));
    let stored = store.get(first.id).await.unwrap().unwrap();
    assert_eq!((stored.payload, stored.priority), (json!({"n": 3}), 7));
    assert_eq!(stored.unique_key.as_deref(), Some("k"));
    assert_eq!(count(&store).await, 1);
}

#[tokio::test]
async fn a_running_holder_is_returned_by_preserve_and_left_alone_by_replace() {
    let (_pg, store) = setup().await;
    let first = store
        .enqueue("q", &job(1).unique("k", UniqueMode::Replace))
        .await
        .unwrap();
    let running = claim_one(&store).await;
    assert_eq!(running.0, first.id);

    let kept = store
        .enqueue("q", &job(2).unique("k", UniqueMode::Preserve))
        .await
        .unwrap();
    assert_eq!(
        (kept.id, kept.created),
        (first.id, false),
        "preserve: the running job"
    );

    let next = store
        .enqueue("q", &job(3).unique("k", UniqueMode::Replace))
        .await
        .unwrap();
    assert!(
        next.created && next.id != first.id,
        "replace: a new job after the running one"
    );
    let old = store.get(first.id).await.unwrap().unwrap();
    assert_eq!((old.state.as_str(), old.payload), ("running", json!({"n": 1})));
    assert_eq!(old.unique_key, None, "the running job gave the key up");

    // The new job is queued after the running one: nothing to claim while it runs, and a second replace
    // changes the waiting job in place.
    let queued = store.get(next.id).await.unwrap().unwrap();
    assert_eq!(queued.state, "blocked", "the new job waits for the running one");
    let claimed = store
        .claim_batch("q", "w1", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(claimed.is_empty(), "claimed while the holder runs: {claimed:?}");
    let replaced = store
        .enqueue("q", &job(5).unique("k", UniqueMode::Replace))
        .await
        .unwrap();
    assert_eq!((replaced.id, replaced.created), (next.id, false));

    // The running job's completion still counts, releases the new one at once, which holds the key.
    finish(&store, running, Finish::Succeeded).await;
    let again = store
        .enqueue("q", &job(4).unique("k", UniqueMode::Preserve))
        .await
        .unwrap();
    assert_eq!((again.id, again.created), (next.id, false));
    let (id, _) = claim_one(&store).await;
    assert_eq!(id, next.id);
    let ran = store.get(next.id).await.unwrap().unwrap();
    assert_eq!(ran.payload, json!({"n": 5}), "the last replace's payload");
}

#[tokio::test]
async fn a_job_queued_after_a_running_holder_runs_whatever_the_holder_ends_with() {
    let (_pg, store) = setup().await;
    let first = store
        .enqueue("q", &job(1).unique("k", UniqueMode::Replace))
        .await
        .unwrap();
    let running = claim_one(&store).await;
    let next = store
        .enqueue("q", &job(2).unique("k", UniqueMode::Replace))
        .await
        .unwrap();
    assert!(next.created);
    // The holder fails for good: the job queued after it still runs.
    finish(&store, running, Finish::Permanent { error: "boom".into() }).await;
    assert_eq!(store.get(first.id).await.unwrap().unwrap().state, "dead");
    let (id, _) = claim_one(&store).await;
    assert_eq!(id, next.id, "released by the holder's end, not cancelled");
}

#[tokio::test]
async fn debounce_pushes_the_run_time_with_every_enqueue() {
    let (_pg, store) = setup().await;
    let first = store
        .enqueue("q", &job(1).debounce("sync", Duration::from_secs(30)))
        .await
        .unwrap();
    let run_at_1 = store.get(first.id).await.unwrap().unwrap().run_at;
    let later = store
        .enqueue("q", &job(2).debounce("sync", Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!((later.id, later.created), (first.id, false));
    let stored = store.get(first.id).await.unwrap().unwrap();
    assert!(
        stored.run_at >= run_at_1 + chrono::Duration::seconds(3500),
        "pushed to now + 1h"
    );
    assert_eq!(stored.payload, json!({"n": 2}), "the latest payload");
    let depth = store.depth("q").await.unwrap().unwrap();
    assert_eq!((depth.ready, depth.scheduled), (0, 1));
}

#[tokio::test]
async fn a_finished_holder_keeps_the_key_only_while_unique_for_lasts() {
    let (_pg, store) = setup().await;
    // Without uniqueFor a succeeded job gives the key up.
    let a = store
        .enqueue("q", &job(1).unique("plain", UniqueMode::Preserve))
        .await
        .unwrap();
    finish(&store, claim_one(&store).await, Finish::Succeeded).await;
    let b = store
        .enqueue("q", &job(2).unique("plain", UniqueMode::Preserve))
        .await
        .unwrap();
    assert!(b.created && b.id != a.id);
    finish(&store, claim_one(&store).await, Finish::Succeeded).await;

    // With uniqueFor 1h it keeps the key for an hour after it succeeded, in every mode.
    let c = store
        .enqueue(
            "q",
            &job(3)
                .unique("daily", UniqueMode::Preserve)
                .unique_for(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    finish(&store, claim_one(&store).await, Finish::Succeeded).await;
    for mode in [UniqueMode::Preserve, UniqueMode::Replace] {
        let d = store.enqueue("q", &job(4).unique("daily", mode)).await.unwrap();
        assert_eq!((d.id, d.created), (c.id, false), "{mode:?}");
    }
    // An hour later (moved back in the database rather than waited for), the key makes a new job.
    sqlx::query("UPDATE sluice.jobs SET finished_at = now() - interval '61 minutes' WHERE id = $1")
        .bind(c.id)
        .execute(store.pool())
        .await
        .unwrap();
    let e = store
        .enqueue("q", &job(5).unique("daily", UniqueMode::Preserve))
        .await
        .unwrap();
    assert!(e.created && e.id != c.id);

    // A dead or cancelled holder gives the key up at once, uniqueFor or not.
    store.cancel(e.id).await.unwrap();
    let f = store
        .enqueue(
            "q",
            &job(6)
                .unique("daily", UniqueMode::Preserve)
                .unique_for(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    assert!(f.created);
    finish(
        &store,
        claim_one(&store).await,
        Finish::Permanent { error: "no".into() },
    )
    .await;
    let g = store
        .enqueue("q", &job(7).unique("daily", UniqueMode::Preserve))
        .await
        .unwrap();
    assert!(g.created && g.id != f.id);
}

#[tokio::test]
async fn inconsistent_unique_options_are_refused_by_name_and_change_nothing() {
    let (_pg, store) = setup().await;
    let cases = [
        (
            NewJob {
                unique_mode: Some(UniqueMode::Replace),
                ..job(1)
            },
            "need a uniqueKey",
        ),
        (
            NewJob {
                debounce: Some(Duration::from_secs(1).into()),
                ..job(1).unique("k", UniqueMode::Replace)
            },
            "only with uniqueMode debounce",
        ),
        (
            job(1).unique("k", UniqueMode::Debounce),
            "required with uniqueMode debounce",
        ),
        (
            job(1)
                .debounce("k", Duration::from_secs(1))
                .delay(Duration::from_secs(5)),
            "not with debounce",
        ),
        (
            NewJob {
                unique_for: Some(Duration::from_secs(400 * 24 * 3600).into()),
                ..job(1).unique("k", UniqueMode::Preserve)
            },
            "uniqueFor: at most 366 days",
        ),
        (job(1).unique("", UniqueMode::Preserve), "1-255"),
    ];
    for (j, want) in cases {
        match store.enqueue("q", &j).await {
            Err(Error::Invalid(m)) => assert!(m.contains(want), "{m:?} should say {want:?}"),
            other => panic!("{j:?}: expected invalid, got {other:?}"),
        }
    }
    assert!(matches!(
        store.enqueue_many("q", &[job(1), job(2).unique("", UniqueMode::Preserve)]).await,
        Err(Error::Invalid(m)) if m.contains("jobs[1]") && m.contains("uniqueKey")
    ));
    assert_eq!(count(&store).await, 0);
}

#[tokio::test]
async fn the_sql_api_takes_unique_options_as_named_parameters() {
    let (_pg, store) = setup().await;
    let pool = store.pool();
    let enqueue = "SELECT sluice.enqueue('q', $1, kind => 'reindex', unique_key => 'doc-42', \
                   unique_mode => 'debounce', debounce => interval '10 minutes')";
    let a: uuid::Uuid = sqlx::query_scalar(enqueue)
        .bind(json!({"v": 1}))
        .fetch_one(pool)
        .await
        .unwrap();
    let b: uuid::Uuid = sqlx::query_scalar(enqueue)
        .bind(json!({"v": 2}))
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(a, b);
    let job = store.get(a).await.unwrap().unwrap();
    assert_eq!(job.payload, json!({"v": 2}));
    assert!(job.run_at > chrono::Utc::now() + chrono::Duration::minutes(9));

    let (id, created): (uuid::Uuid, bool) = sqlx::query_as(
        "SELECT id, created FROM sluice.enqueue_job('q', 'reindex', '{}', p_unique_key => 'doc-42')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((id, created), (a, false), "preserve by default");

    let bad = sqlx::query("SELECT sluice.enqueue('q', '{}', unique_mode => 'sometimes', unique_key => 'x')")
        .execute(pool)
        .await
        .unwrap_err();
    let db = bad.as_database_error().expect("a database error");
    assert_eq!(db.code().as_deref(), Some("22023"));
    assert!(
        db.message().contains("preserve, replace or debounce"),
        "{}",
        db.message()
    );
}

#[tokio::test]
async fn the_schema_before_unique_keys_upgrades_with_its_jobs_and_callers_intact() {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = connect(&server.url()).await;
    schema::migrator_through(3).run(&pool).await.expect("old schema");
    sqlx::query("SELECT sluice.create_queue('q')")
        .execute(&pool)
        .await
        .unwrap();
    let old: uuid::Uuid =
        sqlx::query_scalar("SELECT sluice.enqueue('q', '{\"old\": true}', 'k', 0, NULL, NULL, 'idem-1')")
            .fetch_one(&pool)
            .await
            .unwrap();

    schema::migrate(&pool).await.expect("upgrade");
    let store = QueueStore::new(pool.clone());
    let job = store.get(old).await.unwrap().unwrap();
    assert_eq!((job.state.as_str(), job.unique_key), ("pending", None));

    // Callers written for the old signatures, positional and named, still work and still dedupe.
    let again: uuid::Uuid =
        sqlx::query_scalar("SELECT sluice.enqueue('q', '{\"old\": true}', 'k', 0, NULL, NULL, 'idem-1')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(again, old);
    let (_, created): (uuid::Uuid, bool) = sqlx::query_as(
        "SELECT id, created FROM sluice.enqueue_job('q', 'k', '{}', 0, NULL, NULL, NULL, NULL)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(created);
    let claimed = store
        .claim_batch("q", "w1", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2, "old and new jobs are claimed alike");
}
