//! Pure functions from API objects to what the sidecar reads. No I/O: unit tests call them directly.

pub mod sidecar_config;
