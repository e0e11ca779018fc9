//! Applying the queue schema (`migrations/`, embedded at build time) to a database.
//!
//! Safe to run from many processes at once: sqlx's migrator holds a PostgreSQL advisory lock while it
//! checks and applies migrations, so concurrent callers wait for the first and then find nothing to do.
//! The bookkeeping table lives in the `sluice` schema too (`sluice._sqlx_migrations`), so the queue
//! never collides with the app's own sqlx migrations in `public`.

use sqlx::{
    PgPool, SqlSafeStr,
    migrate::{Migration, MigrationType, Migrator},
};

use crate::{Error, Result};

/// The queue migrations, embedded: (version, description, SQL). Numbered like their files; a new
/// migration is a new file and a new line here (the `migrate!` macro needs sqlx's `macros` feature,
/// which the workspace does not enable).
const MIGRATIONS: [(i64, &str, &str); 29] = [
    (
        1,
        "queue tables",
        include_str!("../../migrations/0001_queue_tables.sql"),
    ),
    (
        2,
        "queue sql api",
        include_str!("../../migrations/0002_queue_sql_api.sql"),
    ),
    (
        3,
        "dead jobs index",
        include_str!("../../migrations/0003_dead_jobs_index.sql"),
    ),
    (
        4,
        "unique jobs",
        include_str!("../../migrations/0004_unique_jobs.sql"),
    ),
    (
        5,
        "job dependencies",
        include_str!("../../migrations/0005_job_dependencies.sql"),
    ),
    (
        6,
        "schedules",
        include_str!("../../migrations/0006_schedules.sql"),
    ),
    (
        7,
        "replace after running",
        include_str!("../../migrations/0007_replace_after_running.sql"),
    ),
    (
        8,
        "release dependents iteratively",
        include_str!("../../migrations/0008_release_dependents_iteratively.sql"),
    ),
    (
        9,
        "keys on every enqueue path",
        include_str!("../../migrations/0009_keys_on_every_enqueue_path.sql"),
    ),
    (
        10,
        "idempotency window and cancelled replacements",
        include_str!("../../migrations/0010_idempotency_window_and_cancelled_replacements.sql"),
    ),
    (
        11,
        "job events",
        include_str!("../../migrations/0011_job_events.sql"),
    ),
    (
        12,
        "namespaced queues",
        include_str!("../../migrations/0012_namespaced_queues.sql"),
    ),
    (
        13,
        "row level security",
        include_str!("../../migrations/0013_row_level_security.sql"),
    ),
    (
        14,
        "tenant hardening",
        include_str!("../../migrations/0014_tenant_hardening.sql"),
    ),
    (
        15,
        "tenant password out of errors",
        include_str!("../../migrations/0015_tenant_password_out_of_errors.sql"),
    ),
    (
        16,
        "tenant without memberships",
        include_str!("../../migrations/0016_tenant_without_memberships.sql"),
    ),
    (
        17,
        "tenant role names per database",
        include_str!("../../migrations/0017_tenant_role_names_per_database.sql"),
    ),
    (
        18,
        "tenant refuses privileged roles",
        include_str!("../../migrations/0018_tenant_refuses_privileged_roles.sql"),
    ),
    (
        19,
        "tenant provisioning locks",
        include_str!("../../migrations/0019_tenant_provisioning_locks.sql"),
    ),
    (
        20,
        "finish jobs in one call",
        include_str!("../../migrations/0020_finish_jobs_in_one_call.sql"),
    ),
    (
        21,
        "one lock order on every path",
        include_str!("../../migrations/0021_one_lock_order_on_every_path.sql"),
    ),
    (
        22,
        "idempotency holders in the lock order",
        include_str!("../../migrations/0022_idempotency_holders_in_the_lock_order.sql"),
    ),
    (
        23,
        "batch key holders in the lock order",
        include_str!("../../migrations/0023_batch_key_holders_in_the_lock_order.sql"),
    ),
    (
        24,
        "cascades locked in the lock order",
        include_str!("../../migrations/0024_cascades_locked_in_the_lock_order.sql"),
    ),
    (
        25,
        "owner functions pin search path",
        include_str!("../../migrations/0025_owner_functions_pin_search_path.sql"),
    ),
    (
        26,
        "existing tenants altered by a createrole owner",
        include_str!("../../migrations/0026_existing_tenants_altered_by_a_createrole_owner.sql"),
    ),
    (
        27,
        "tenant attributes checked after the alter",
        include_str!("../../migrations/0027_tenant_attributes_checked_after_the_alter.sql"),
    ),
    (
        28,
        "tenants revoked from the registry",
        include_str!("../../migrations/0028_tenants_revoked_from_the_registry.sql"),
    ),
    (
        29,
        "claims given up handed back",
        include_str!("../../migrations/0029_claims_given_up_handed_back.sql"),
    ),
];

/// The migrator, with its bookkeeping table in the `sluice` schema.
pub fn migrator() -> Migrator {
    migrator_through(latest_version())
}

/// The migrator of the migrations up to `version` only: the schema an older release left behind, for
/// upgrade tests.
pub fn migrator_through(version: i64) -> Migrator {
    let migrations = MIGRATIONS
        .iter()
        .filter(|(v, _, _)| *v <= version)
        .map(|(v, d, sql)| Migration::new(*v, (*d).into(), MigrationType::Simple, sql.into_sql_str(), false))
        .collect();
    let mut m = Migrator::with_migrations(migrations);
    m.create_schema("sluice");
    m.dangerous_set_table_name("sluice._sqlx_migrations");
    m
}

/// Applies every pending queue migration; idempotent and safe under concurrency. A schema that is
/// current already is left alone without taking the migrator's lock or creating anything, so a login
/// without rights to change the schema (a namespace's tenant role) passes when there is nothing to do.
pub async fn migrate(pool: &PgPool) -> Result<()> {
    if is_current(pool).await {
        return Ok(());
    }
    migrator()
        .run(pool)
        .await
        .map_err(|e| Error::Database(sqlx::Error::Migrate(Box::new(e))))
}

/// How long [`migrate_url`] lets any lock wait last, ended by the server.
pub const SET_MIGRATE_LOCK_TIMEOUT: &str = "SET lock_timeout = '10s'";

/// [`migrate`] on a connection of its own to `url`, whose lock waits the server ends after 10 s
/// ([`SET_MIGRATE_LOCK_TIMEOUT`]): the migrator's lock is an advisory lock any login may take (a tenant
/// holding it would otherwise hold up the caller for as long as it likes), and a migration that alters a
/// table waits for the sessions using it. The wait ends with an error (the caller retries), and no
/// backend is left waiting.
pub async fn migrate_url(url: &str) -> Result<()> {
    let own = crate::pool::options(1)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::query(SET_MIGRATE_LOCK_TIMEOUT)
                    .execute(conn)
                    .await
                    .map(|_| ())
            })
        })
        .connect(url)
        .await?;
    let result = migrate(&own).await;
    own.close().await;
    result
}

/// Whether exactly the migrations this build knows were applied, all successfully (a check that cannot
/// be made counts as no).
async fn is_current(pool: &PgPool) -> bool {
    let applied: std::result::Result<(Vec<i64>, bool), _> = sqlx::query_as(
        "SELECT coalesce(pg_catalog.array_agg(version ORDER BY version), '{}'), \
                coalesce(pg_catalog.bool_and(success), false) \
           FROM sluice._sqlx_migrations",
    )
    .fetch_one(pool)
    .await;
    applied.is_ok_and(|(versions, ok)| ok && versions.iter().eq(MIGRATIONS.iter().map(|m| &m.0)))
}

/// The newest migration version this build knows.
pub fn latest_version() -> i64 {
    MIGRATIONS.iter().map(|m| m.0).max().unwrap_or(0)
}
