//! What the queue's integration tests share: a throwaway PostgreSQL with the schema migrated and a
//! queue named `q` at its defaults.

use sluice_queue::{QueueSettings, QueueStore, schema};
use sluice_testsupport::PgServer;
use sqlx::PgPool;

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
