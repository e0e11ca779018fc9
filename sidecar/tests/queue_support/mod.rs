//! Shared fixtures of the queue integration tests: a throwaway PostgreSQL with the schema, queues with
//! short leases, and handlers built from closures.
#![allow(dead_code)] // each test binary includes this module and uses part of it

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use sluice_queue::{ClaimedJob, QueueSettings, QueueStore, schema};
use sluice_sidecar::queue::{Handler, Outcome, WorkerOptions};
use sluice_testsupport::PgServer;
use sqlx::{PgPool, postgres::PgPoolOptions};
use tokio_util::sync::CancellationToken;

/// A server with the queue schema and a pool on it.
pub async fn pg() -> (PgServer, PgPool) {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = pool(&server.url(), 20).await;
    schema::migrate(&pool).await.expect("migrate");
    (server, pool)
}

/// A pool with a short acquire timeout.
pub async fn pool(url: &str, size: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(3))
        .connect(url)
        .await
        .expect("connect")
}

/// Queue settings for tests: short lease, fast backoff.
pub fn settings(name: &str) -> QueueSettings {
    QueueSettings {
        lease_ms: 1000,
        backoff_base_ms: 20,
        backoff_cap_ms: 200,
        max_attempts: 3,
        ..QueueSettings::defaults(name)
    }
}

/// Creates queue `name` with [`settings`].
pub async fn queue(store: &QueueStore, name: &str) -> QueueSettings {
    let s = settings(name);
    store.upsert_queue(&s).await.unwrap();
    s
}

/// Worker options for tests: fast polls, short grace.
pub fn opts(queue: &str, owner: &str) -> WorkerOptions {
    WorkerOptions {
        concurrency: 8,
        claim_batch: 16,
        poll_interval: Duration::from_millis(10),
        max_poll_interval: Duration::from_millis(100),
        shutdown_grace: Duration::from_secs(2),
        owner: owner.into(),
        ..WorkerOptions::new([queue])
    }
}

type BoxFut = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// A handler made of a closure.
#[derive(Clone)]
pub struct FnHandler(Arc<dyn Fn(ClaimedJob, CancellationToken) -> BoxFut + Send + Sync>);

impl FnHandler {
    /// Wraps `f`.
    pub fn new<F, Fut>(f: F) -> Self
    where
        F: Fn(ClaimedJob, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        Self(Arc::new(move |j, c| Box::pin(f(j, c))))
    }
}

impl Handler for FnHandler {
    fn handle(&self, job: ClaimedJob, cancel: CancellationToken) -> impl Future<Output = Outcome> + Send {
        (self.0)(job, cancel)
    }
}

/// The state of job `id` as psql sees it.
pub async fn state(store: &QueueStore, id: uuid::Uuid) -> String {
    store.get(id).await.unwrap().expect("job exists").state
}

/// How long a test waits for a job to reach a state.
pub const STATE_DEADLINE: Duration = Duration::from_secs(15);

/// Waits until job `id` is in state `want`, failing the test after [`STATE_DEADLINE`].
pub async fn wait_state(store: &QueueStore, id: uuid::Uuid, want: &str) {
    sluice_testsupport::wait_for_async(&format!("job {id} to be {want}"), STATE_DEADLINE, || {
        let store = store.clone();
        async move { (state(&store, id).await == want).then_some(()) }
    })
    .await;
}
