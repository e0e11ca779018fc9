//! `sluice-sidecar`: Sluice's data plane, in front of (or beside) an application container.
//!
//! Two roles share one binary:
//! - **proxy** (default): a reverse proxy that enforces cluster-wide rate limits kept in Redis before a
//!   request reaches the app on localhost; health, readiness and Prometheus metrics on an admin port; and,
//!   in pods that enqueue through the sidecar, the queue HTTP API.
//! - **worker**: claims jobs from the PostgreSQL queue (`FOR UPDATE SKIP LOCKED`, in batches) and hands
//!   each to the team's handler over localhost HTTP.
//!
//! It depends on `sluice-crds` (the config schema, its validation and the contracts it shares with the
//! operator) and `sluice-queue` (the store and all SQL); it knows nothing of the Kubernetes API.
//!
//! Layout (roughly bottom up): [`clock`] (re-exported from `sluice-crds`) and [`error`]; [`redis`]
//! (connecting, TLS, why a connection fails); [`config`] (loading, env overrides, hot reload);
//! [`limiter`] (rules, keys, algorithms, Redis store, circuit breaker, local fallback); [`queue`] (worker
//! engine, HTTP dispatch, queue HTTP API, client library, the roles' wiring); [`proxy`] (HTTP forwarding,
//! the admin endpoints, the proxy role). `main.rs` parses the command line and calls one role.

pub mod config;
pub mod error;
pub mod limiter;
pub mod proxy;
pub mod queue;
pub mod redis;

pub use error::{Error, Result};
pub use sluice_crds::clock;
