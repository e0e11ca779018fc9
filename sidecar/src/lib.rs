//! `sluice-sidecar`: Sluice's data plane, in front of (or beside) an application container.
//!
//! Two roles share one binary:
//! - **proxy** (default): a reverse proxy that enforces cluster-wide rate limits kept in Redis before a
//!   request reaches the app on localhost; health, readiness and Prometheus metrics on an admin port.
//! - **worker**: claims jobs from the PostgreSQL queue (`FOR UPDATE SKIP LOCKED`, in batches) and hands
//!   each to the team's handler over localhost HTTP; apps enqueue through the queue HTTP API.
//!
//! Layout (dependencies point down the list): [`clock`] and [`error`]; [`limiter`] (rules, keys,
//! algorithms, Redis store, circuit breaker, local fallback); [`config`] (loading, env overrides,
//! validation, hot reload); [`proxy`] (HTTP forwarding and the admin endpoints); [`queue`] (schema,
//! store, worker, HTTP API, client library).

pub mod clock;
pub mod config;
pub mod error;
pub mod limiter;
pub mod proxy;
pub mod queue;

pub use error::{Error, Result};
