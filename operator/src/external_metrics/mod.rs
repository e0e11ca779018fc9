//! The `external.metrics.k8s.io/v1beta1` API: the HPA controller asks it for a JobQueue's depth
//! (ready + running jobs), read from the team's PostgreSQL through the operator's pool of each database
//! and a short cache.
//!
//! Only one provider of this API can exist per cluster (KEDA #470). [`apiservice`] decides whether the
//! `v1beta1.external.metrics.k8s.io` APIService is Sluice's (its `spec.service` points into the
//! operator's namespace) and, when it is, keeps its `caBundle` in step with the serving certificate
//! ([`crate::certs`]); when it belongs to KEDA or prometheus-adapter the operator leaves it alone and the JobQueue
//! controller says so in status. [`server`] is the HTTP surface; [`access`] lets only the API server's
//! front proxy (or a bearer token) through, for users RBAC allows ([`authn`], [`authz`]).

pub mod access;
pub mod apiservice;
pub mod authn;
pub mod authz;
pub mod cache;
pub mod server;

pub use access::Access;
pub use server::{MetricsState, Targets, router};
