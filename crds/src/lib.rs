//! Sluice's API types and the contracts its parts share: the `sluice.dev/v1alpha1` custom resources
//! (`RateLimitPolicy`, `JobQueue`, `QueueDatabase`), the sidecar config schema the operator renders
//! them into and its validation, and the names the operator, the sidecar and users agree on. Types and pure functions
//! only: nothing here talks to Redis, PostgreSQL, HTTP or the Kubernetes API, and the crate links no
//! async runtime or client (a test checks its dependency tree).
//!
//! Layout: [`rate_limit_policy`], [`job_queue`] and [`queue_database`] (one CRD each, with their CEL
//! rules and status); [`secret_ref`] (how they name their credentials); [`conditions`] (condition types
//! and reasons of the statuses); [`sidecar_config`] (the file the sidecar reads, and its validation);
//! [`contract`] (container name, ports, paths, env vars, annotations, labels, the Redis key layout);
//! [`duration`] (the `30s`/`5m` duration type shared by CRDs and config); [`clock`] (time as an
//! argument).

pub mod clock;
pub mod conditions;
pub mod contract;
pub mod duration;
pub mod job_queue;
pub mod names;
pub mod queue_database;
pub mod rate_limit_policy;
pub mod secret_ref;
pub mod sidecar_config;

pub use duration::Duration;
