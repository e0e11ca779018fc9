//! NUL characters, which PostgreSQL text and JSON strings cannot hold, on a real PostgreSQL: a handler's
//! error text with one still finishes its job and the rest of its batch, and an enqueue with one in its
//! kind, payload or keys is refused as invalid input (a 400 in the HTTP API), not a server error.

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    Error, NewJob, QueueSettings, QueueStore, schema,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;

async fn setup() -> (PgServer, QueueStore) {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = sluice_queue::pool::options(4)
        .connect(&server.url())
        .await
        .expect("connect");
    schema::migrate(&pool).await.expect("migrate");
    let store = QueueStore::new(pool);
    store.upsert_queue(&QueueSettings::defaults("q")).await.unwrap();
    (server, store)
}

#[tokio::test]
async fn an_error_text_with_a_nul_character_still_finishes_its_batch() {
    let (_pg, store) = setup().await;
    for kind in ["a", "b", "c"] {
        store.enqueue("q", &NewJob::new(kind, json!({}))).await.unwrap();
    }
    let claimed = store
        .claim_batch("q", "w", 10, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    let finishes = [
        Finish::Permanent {
            error: "handler answered 500: bad\0byte".into(),
        },
        Finish::Retry {
            delay: Duration::from_secs(60),
            error: "\0".into(),
        },
        Finish::Succeeded,
    ];
    let done: Vec<Finished> = claimed
        .iter()
        .zip(finishes)
        .map(|(j, finish)| Finished {
            id: j.id,
            attempt: j.attempt,
            finish,
        })
        .collect();
    let finished = store.finish_batch("w", &done).await.expect("finished");
    assert_eq!(finished.len(), 3, "every job of the batch is written");

    let dead = store.get(claimed[0].id).await.unwrap().unwrap();
    assert_eq!(dead.state, "dead");
    assert_eq!(
        dead.last_error.as_deref(),
        Some("handler answered 500: bad\u{FFFD}byte")
    );
    let retrying = store.get(claimed[1].id).await.unwrap().unwrap();
    assert_eq!(retrying.state, "retrying");
    assert_eq!(retrying.last_error.as_deref(), Some("\u{FFFD}"));
    let succeeded = store.get(claimed[2].id).await.unwrap().unwrap();
    assert_eq!(succeeded.state, "succeeded");
}

#[tokio::test]
async fn an_enqueue_with_a_nul_character_is_refused_as_invalid() {
    let (_pg, store) = setup().await;
    let cases = [
        ("payload", NewJob::new("k", json!({"s": "a\u{0}b"}))),
        ("kind", NewJob::new("a\u{0}b", json!({}))),
        (
            "idempotency key",
            NewJob::new("k", json!({})).idempotency_key("a\u{0}b"),
        ),
    ];
    for (what, job) in cases {
        let err = store.enqueue("q", &job).await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid(m) if m.contains("NUL")),
            "a NUL in the {what}: {err:?}"
        );
        let err = store.enqueue_many("q", &[job]).await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid(m) if m.contains("NUL")),
            "a NUL in the {what}, in a batch: {err:?}"
        );
    }
    assert_eq!(store.depth("q").await.unwrap().unwrap().ready, 0);
}
