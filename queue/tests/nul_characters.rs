//! NUL characters, which PostgreSQL text and JSON strings cannot hold, on a real PostgreSQL: a handler's
//! error text with one still finishes its job and the rest of its batch, and an enqueue with one in its
//! kind, payload (strings and object keys), keys or graph refs is refused as invalid input naming the
//! field (a 400 in the HTTP API), not a server error.

mod support;

use std::time::Duration;

use serde_json::json;
use sluice_queue::{
    Error, GraphJob, NewJob, QueueStore, UniqueMode,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;

async fn setup() -> (PgServer, QueueStore) {
    let (server, _, store) = support::server_with_queue(4).await;
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
        ("payload", NewJob::new("k", json!({"a": [1, {"b": ["\u{0}"]}]}))),
        (
            "payload (an object key)",
            NewJob::new("k", json!({"a": {"b\u{0}": 1}})),
        ),
        ("kind", NewJob::new("a\u{0}b", json!({}))),
        (
            "idempotencyKey",
            NewJob::new("k", json!({})).idempotency_key("a\u{0}b"),
        ),
        (
            "uniqueKey",
            NewJob::new("k", json!({})).unique("a\u{0}b", UniqueMode::Preserve),
        ),
    ];
    for (field, job) in cases {
        let err = store.enqueue("q", &job).await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid(m) if m.starts_with(&format!("{field}: ")) && m.contains("NUL")),
            "a NUL in the {field}: {err:?}"
        );
        let err = store.enqueue_many("q", &[job]).await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid(m) if m.starts_with("jobs[0]: ") && m.contains(&format!(" {field}: ")) && m.contains("NUL")),
            "a NUL in the {field}, in a batch: {err:?}"
        );
    }
    assert_eq!(store.depth("q").await.unwrap().unwrap().ready, 0);
}

#[tokio::test]
async fn a_graph_with_a_nul_character_is_refused_as_invalid() {
    let (_pg, store) = setup().await;
    let job = || NewJob::new("k", json!({}));
    let cases = [
        (
            "jobs[1].ref",
            vec![GraphJob::new("a", job()), GraphJob::new("b\u{0}", job())],
        ),
        (
            "jobs[1].dependsOn[0]",
            vec![
                GraphJob::new("a", job()),
                GraphJob::new("b", job()).depends_on(["a\u{0}"]),
            ],
        ),
        (
            "jobs[1]: invalid request: kind",
            vec![
                GraphJob::new("a", job()),
                GraphJob::new("b", NewJob::new("k\u{0}", json!({}))).depends_on(["a"]),
            ],
        ),
        (
            "jobs[0]: invalid request: uniqueKey",
            vec![GraphJob::new("a", job().unique("\u{0}", UniqueMode::Preserve))],
        ),
        (
            "jobs[0]: invalid request: payload",
            vec![GraphJob::new("a", NewJob::new("k", json!(["\u{0}"])))],
        ),
    ];
    for (field, graph) in cases {
        let err = store.enqueue_graph("q", &graph).await.unwrap_err();
        assert!(
            matches!(&err, Error::Invalid(m) if m.starts_with(&format!("{field}: ")) && m.contains("NUL")),
            "a NUL in {field}: {err:?}"
        );
    }
    assert_eq!(store.depth("q").await.unwrap().unwrap().ready, 0);
}

/// What PostgreSQL says of a NUL in a text (22021) or a JSON string (22P05) is invalid input; the same
/// SQLSTATE for a character the database's encoding cannot hold (a LATIN1 database given "€") is not
/// called a NUL: it stays a database error.
#[tokio::test]
async fn only_a_nul_is_mapped_to_invalid_input() {
    let (_pg, store) = setup().await;
    let pool = store.pool();
    let text = sqlx::query("SELECT $1::text")
        .bind("a\u{0}b")
        .execute(pool)
        .await
        .unwrap_err();
    let json = sqlx::query(r#"SELECT '{"a": "\u0000"}'::jsonb"#)
        .execute(pool)
        .await
        .unwrap_err();
    for (what, err) in [("text", text), ("JSON", json)] {
        let err = sluice_queue::store::map_db_error(err);
        assert!(
            matches!(&err, Error::Invalid(m) if m.contains("NUL")),
            "a NUL in a {what}: {err:?}"
        );
    }
    let latin = sqlx::query(
        "DO $$ BEGIN RAISE EXCEPTION 'character with byte sequence 0xe2 0x82 0xac in encoding \"UTF8\" \
         has no equivalent in encoding \"LATIN1\"' USING ERRCODE = '22P05'; END $$",
    )
    .execute(pool)
    .await
    .unwrap_err();
    let err = sluice_queue::store::map_db_error(latin);
    assert!(matches!(err, Error::Database(_)), "{err:?}");
}
