//! Sluice's API types: the `sluice.dev/v1alpha1` custom resources (`RateLimitPolicy`, `JobQueue`) and the
//! sidecar config schema the operator renders them into. Types only: nothing here talks to Redis,
//! PostgreSQL, HTTP or the Kubernetes API.
//!
//! Layout: [`duration`] (the `30s`/`5m` duration type shared by CRDs and config), [`sidecar_config`].

pub mod conditions;
pub mod duration;
pub mod job_queue;
pub mod rate_limit_policy;
pub mod sidecar_config;

pub use duration::Duration;
