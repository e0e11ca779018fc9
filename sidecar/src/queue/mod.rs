//! The sidecar's side of the job queue: the worker engine, the HTTP dispatcher that hands jobs to the
//! team's handler, the queue HTTP API for apps, the Rust client library, and the worker role's wiring.
//! The queue itself (store, SQL, migrations, LISTEN) is the `sluice-queue` crate, which the operator
//! shares.
//!
//! Layout (dependencies point down the list): [`metrics`]; [`worker`] (the engine: claim loop,
//! heartbeats, batch completer, maintenance); [`dispatch`] (the [`worker::Handler`] that POSTs to the
//! handler); [`auth`] (who may call the HTTP API and the gRPC worker API); [`grpc`] (the gRPC worker API: jobs pushed to workers over a stream); [`api`] (the HTTP API for apps) and [`events`] (its job and queue status streams); [`client`] (the Rust client library: enqueue and an
//! in-process worker); [`role`] (the `worker` subcommand and the proxy role's queue API, as library
//! functions the binary calls).

pub mod api;
pub mod auth;
pub mod client;
pub mod dispatch;
pub mod events;
pub mod grpc;
pub mod metrics;
pub mod role;
pub mod worker;

pub use sluice_queue::{ClaimedJob, Depth, Enqueued, Job, JobState, NewJob, QueueSettings, QueueStore};
pub use worker::{Handler, Outcome, Worker, WorkerOptions};
