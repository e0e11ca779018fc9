//! Sluice's API types: the `sluice.dev/v1alpha1` custom resources (`RateLimitPolicy`, `JobQueue`) and the
//! sidecar config schema the operator renders them into. Types only: nothing here talks to Redis,
//! PostgreSQL, HTTP or the Kubernetes API.
//!
//! Layout: [`rate_limit_policy`] and [`job_queue`] (one CRD each, with their CEL rules and status),
//! [`conditions`] (the `metav1.Condition` helpers both statuses use), [`sidecar_config`] (the file the
//! sidecar reads), [`duration`] (the `30s`/`5m` duration type shared by CRDs and config).

pub mod conditions;
pub mod duration;
pub mod job_queue;
pub mod rate_limit_policy;
pub mod sidecar_config;

pub use duration::Duration;
