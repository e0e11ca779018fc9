//! The Rust client library: enqueue from a Rust app (also inside the app's own sqlx transaction) and run
//! an in-process [`Worker`] with a [`Handler`], skipping HTTP dispatch.
//!
//! ```no_run
//! use sluice_sidecar::queue::client::{self, NewJob, Outcome, ClaimedJob, Worker, WorkerOptions, QueueStore};
//! use tokio_util::sync::CancellationToken;
//!
//! struct SendEmail;
//! impl client::Handler for SendEmail {
//!     async fn handle(&self, job: ClaimedJob, _cancel: CancellationToken) -> Outcome {
//!         println!("sending {}", job.payload);
//!         Outcome::Succeeded
//!     }
//! }
//!
//! # async fn demo(pool: sqlx::PgPool) -> sluice_sidecar::Result<()> {
//! client::migrate(&pool).await?;
//! // Enqueue in the app's own transaction: the job exists exactly when the transaction commits.
//! let mut tx = pool.begin().await?;
//! client::enqueue(&mut *tx, "emails", &NewJob::new("welcome", serde_json::json!({"to": "a@b.c"}))).await?;
//! tx.commit().await?;
//!
//! let shutdown = CancellationToken::new();
//! Worker::new(QueueStore::new(pool), SendEmail, WorkerOptions::new(["emails"])).run(shutdown).await?;
//! # Ok(()) }
//! ```

pub use sluice_queue::{
    ClaimedJob, Enqueued, GraphJob, Job, JobState, NewJob, OnParentFailure, Parent, QueueSettings,
    QueueStore, UniqueMode,
    schema::migrate,
    store::{enqueue, enqueue_graph, enqueue_many, is_deadlock},
};

pub use super::worker::{Handler, Outcome, Worker, WorkerOptions};
