//! What the queue's integration tests share: a throwaway PostgreSQL with the schema migrated and a
//! queue named `q` at its defaults, and the steps of the tests that interleave two transactions' locks.
#![allow(dead_code)] // each test binary includes this module and uses part of it

use std::time::{Duration, Instant};

use sluice_queue::{QueueSettings, QueueStore, schema};
use sluice_testsupport::PgServer;
use sqlx::PgPool;
use uuid::Uuid;

/// A new server, a pool of `connections` to it, the schema migrated and queue `q` created.
pub async fn server_with_queue(connections: u32) -> (PgServer, PgPool, QueueStore) {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = sluice_queue::pool::options(connections)
        .connect(&server.url())
        .await
        .expect("connect");
    schema::migrate(&pool).await.expect("migrate");
    let store = QueueStore::new(pool.clone());
    store.upsert_queue(&QueueSettings::defaults("q")).await.unwrap();
    (server, pool, store)
}

/// Returns once a statement whose text contains `text` waits for a lock (`what` names it in the
/// failure).
pub async fn wait_for_a_statement_waiting_on_a_lock(pool: &PgPool, text: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
              WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() \
                AND strpos(query, $1) > 0",
        )
        .bind(text)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never waited for a lock");
        tokio::task::yield_now().await;
    }
}

/// Returns once PostgreSQL's clock is past the millisecond of `id` (a UUIDv7): the next job enqueued
/// gets a greater id.
pub async fn past_the_millisecond_of(pool: &PgPool, id: Uuid) {
    let mut ms = [0_u8; 8];
    ms[2..].copy_from_slice(&id.as_bytes()[..6]);
    let ms = i64::from_be_bytes(ms);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .fetch_one(pool)
            .await
            .unwrap();
        if now > ms {
            return;
        }
        assert!(Instant::now() < deadline, "PostgreSQL's clock never moved on");
        tokio::task::yield_now().await;
    }
}

/// A transaction (left open) holding job `id`'s row lock, as an enqueue naming it as a parent does first.
pub async fn locked_in_an_open_transaction(
    pool: &PgPool,
    id: Uuid,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '20s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR NO KEY UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}
