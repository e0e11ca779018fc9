//! Connection pools to a queue database. Every pool gets the same short acquire deadline, so a dead
//! database fails a call fast (callers retry) instead of holding it for sqlx's default 30 s, and its
//! sessions resolve names in pg_catalog only ([`connect_options`]).

use std::time::Duration;

use sqlx::{
    PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};

/// Deadline of acquiring a connection.
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Pool options: at most `size` connections, the [`ACQUIRE_TIMEOUT`].
pub fn options(size: u32) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(ACQUIRE_TIMEOUT)
}

/// The session's `search_path`: pg_catalog, then pg_temp (which, last, cannot shadow pg_catalog).
pub const SEARCH_PATH: &str = "pg_catalog, pg_temp";

/// How to connect to `url`, with every session's `search_path` set to [`SEARCH_PATH`]. Every statement
/// Sluice sends names its own objects with their schema; what it names without one (`unnest`, `now`,
/// `count`) is then always pg_catalog's. With the server's default (`"$user", public`), a function in
/// `public` whose argument types match a call better than pg_catalog's (`public.unnest(uuid[])` for
/// `unnest($1::uuid[])`) would win and run with the session's rights: any role that may create in
/// `public` (every role before PostgreSQL 15) could plant one for the operator's login, the schema's
/// owner. The schema's functions pin the same path themselves (migrations 0014, 0020, 0024, 0025).
pub fn connect_options(url: &str) -> crate::Result<PgConnectOptions> {
    Ok(url
        .parse::<PgConnectOptions>()?
        .options([("search_path", SEARCH_PATH)]))
}

/// A pool of at most `size` connections (at least 2: a worker's claim loop and completer run at once)
/// that connects on first use, so a database that is down at start is only an error when used. Its
/// sessions resolve names as [`connect_options`] says.
pub fn connect_lazy(url: &str, size: u32) -> crate::Result<PgPool> {
    Ok(options(size.max(2)).connect_lazy_with(connect_options(url)?))
}
