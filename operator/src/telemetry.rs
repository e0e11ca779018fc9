//! Tracing setup: JSON or text lines, filtered by `RUST_LOG` (default `info`). Each reconcile runs in a
//! `reconcile` span carrying the object, its generation and the outcome.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::config::LogFormat;

/// Install the global subscriber. Call once, from the binary.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry.with(fmt::layer().json().with_current_span(true)).init(),
        LogFormat::Text => registry.with(fmt::layer()).init(),
    }
}
