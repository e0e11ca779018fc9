//! Migrating the schema against a real PostgreSQL: a migration held up by a lock ends with the server's
//! lock timeout.

use sluice_queue::schema;
use sluice_testsupport::PgServer;
use sqlx::PgPool;

async fn connect(url: &str) -> PgPool {
    sluice_queue::pool::options(2)
        .connect(url)
        .await
        .expect("connect")
}

/// CRC-32 (IEEE), as sqlx's migrator keys its advisory lock with it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

// Any login may take the migrator's advisory lock. A migration held up by it (or by any lock) ends
// with an error once the server's lock timeout passes, instead of waiting for as long as the holder
// likes, and leaves no backend waiting on it.
#[tokio::test]
async fn a_migration_held_up_by_the_migrator_s_lock_ends_and_leaves_no_backend_waiting() {
    let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    pg.psql("CREATE DATABASE fresh");
    let url = pg.url_for("fresh");
    let holder = connect(&url).await;
    let key = 0x3d32_ad9e_i64 * i64::from(crc32(b"fresh"));
    let mut held = holder.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut *held)
        .await
        .unwrap();
    let err = schema::migrate_url(&url).await.unwrap_err();
    assert!(err.to_string().contains("lock timeout"), "{err}");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'",
    )
    .fetch_one(&mut *held)
    .await
    .unwrap();
    assert_eq!(waiting, 0);
    // Once the lock is free it migrates.
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut *held)
        .await
        .unwrap();
    schema::migrate_url(&url).await.unwrap();
}
