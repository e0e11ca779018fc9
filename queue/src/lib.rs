//! `sluice-queue`: the PostgreSQL job queue that the sidecar's worker and queue API and the operator
//! share. It owns every statement that touches the `sluice` schema; nothing else in Sluice writes SQL.
//!
//! Layout (dependencies point down the list): [`backoff`] (pure retry math), [`schedule`] (when a cron
//! schedule fires: pure) and [`job`] (jobs, queue settings, depth: plain types); [`sql`] (named statements, entity first) and [`schema`] (the
//! migrations in `migrations/`, applied under an advisory lock); [`store`] ([`QueueStore`]: every
//! statement behind a typed function, plus enqueue over any executor so apps can enqueue in their own
//! transaction); [`listen`] (`LISTEN sluice_jobs` with reconnects); [`events`] (job state change
//! notifications and the snapshots they are ordered against); [`pool`] (connection pools with a
//! short acquire deadline); [`error`].
//!
//! It knows nothing of HTTP, Redis, Kubernetes or either binary: the worker engine and the queue HTTP
//! API are the sidecar's, scaling is the operator's.

pub mod backoff;
pub mod error;
pub mod events;
pub mod job;
pub mod listen;
pub mod pool;
pub mod schedule;
pub mod schema;
pub mod sql;
pub mod store;

pub use error::{Error, Result};
pub use job::{
    CancelOutcome, ClaimedJob, Depth, Enqueued, GraphJob, Job, JobState, MAX_PAYLOAD_BYTES, NewJob,
    OnParentFailure, Parent, QueueSettings, UniqueMode,
};
pub use listen::NOTIFY_CHANNEL;
pub use store::QueueStore;
