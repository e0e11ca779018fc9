//! Pure functions from API objects to what the cluster and the sidecar read: the sidecar config of a
//! policy ([`sidecar_config`]), the sidecar container both the webhook and the worker Deployment use
//! ([`sidecar_container`]), a JobQueue's worker ConfigMap and Deployment ([`worker_deployment`]), its HPA
//! ([`hpa`]) and KEDA `ScaledObject` ([`scaled_object`]), and a policy's NetworkPolicy and the Services
//! that bypass the sidecar ([`network_policy`]), and the token volumes for the queue API's caller checks that
//! injected pods and gRPC workers share ([`caller_token`]). No I/O: unit tests call them directly.

pub mod caller_token;
pub mod hpa;
pub mod network_policy;
pub mod scaled_object;
pub mod sidecar_config;
pub mod sidecar_container;
pub mod worker_deployment;
