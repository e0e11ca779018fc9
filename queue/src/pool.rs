//! Connection pools to a queue database. Every pool gets the same short acquire deadline, so a dead
//! database fails a call fast (callers retry) instead of holding it for sqlx's default 30 s.

use std::time::Duration;

use sqlx::{PgPool, postgres::PgPoolOptions};

/// Deadline of acquiring a connection.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Pool options: at most `size` connections, the [`ACQUIRE_TIMEOUT`].
pub fn options(size: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
}

/// A pool of at most `size` connections (at least 2: a worker's claim loop and completer run at once)
/// that connects on first use, so a database that is down at start is only an error when used.
pub fn connect_lazy(url: &str, size: u32) -> crate::Result<PgPool> {
    Ok(options(size.max(2)).connect_lazy(url)?)
}
