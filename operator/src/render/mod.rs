//! Pure functions from API objects to what the sidecar reads. No I/O: unit tests call them directly.

pub mod hpa;
pub mod scaled_object;
pub mod sidecar_config;
pub mod worker_deployment;
