//! What the queue's integration tests share: a throwaway PostgreSQL with the schema migrated and a
//! queue named `q` at its defaults, and the steps of the tests that interleave two transactions' locks.
#![allow(dead_code)] // each test binary includes this module and uses part of it

use std::{
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use sluice_queue::{QueueSettings, QueueStore, schema};
use sluice_testsupport::PgServer;
use sqlx::{PgConnection, PgPool, postgres::PgConnectOptions};
use uuid::Uuid;

/// A new server, a pool of `connections` to it, the schema migrated and queue `q` created.
pub async fn server_with_queue(connections: u32) -> (PgServer, PgPool, QueueStore) {
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let pool = sluice_queue::pool::options(connections)
        .connect(&server.url())
        .await
        .expect("connect");
    schema::migrate(&pool).await.expect("migrate");
    let store = QueueStore::new(pool.clone());
    store.upsert_queue(&QueueSettings::defaults("q")).await.unwrap();
    (server, pool, store)
}

/// How often the waits below look again: a poll with a deadline, not a spin.
const POLL: Duration = Duration::from_millis(10);

/// Returns once a statement whose text contains `text` waits for a lock (`what` names it in the
/// failure).
pub async fn wait_for_a_statement_waiting_on_a_lock(pool: &PgPool, text: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
              WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() \
                AND strpos(query, $1) > 0",
        )
        .bind(text)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting == 1 {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never waited for a lock");
        tokio::time::sleep(POLL).await;
    }
}

/// The backend process id of a connection (or of `&mut *tx`, a transaction's).
pub async fn backend_pid(conn: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Returns once session `waiter` waits for a lock that session `holder` holds (`pg_blocking_pids`):
/// `waiter` waits for that lock, not merely for some lock (`what` names it in the failure).
pub async fn wait_until_blocked_by(pool: &PgPool, waiter: i32, holder: i32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let blocked: bool = sqlx::query_scalar("SELECT $2 = ANY (pg_blocking_pids($1))")
            .bind(waiter)
            .bind(holder)
            .fetch_one(pool)
            .await
            .unwrap();
        if blocked {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what} never waited for session {holder}'s lock"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The deadlocks PostgreSQL detected in this database so far. A backend reports its counts when it
/// goes idle, at most once a second; [`wait_for_deadlocks`] waits for a count.
pub async fn deadlocks(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Returns once this database has counted `count` deadlocks, failing if it counts more (or, by the
/// deadline, fewer).
pub async fn wait_for_deadlocks(pool: &PgPool, count: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = deadlocks(pool).await;
        assert!(seen <= count, "{seen} deadlocks, not {count}");
        if seen == count {
            return;
        }
        assert!(Instant::now() < deadline, "{seen} deadlocks, never {count}");
        tokio::time::sleep(POLL).await;
    }
}

/// Returns once PostgreSQL's clock is past the millisecond of `id` (a UUIDv7): the next job enqueued
/// gets a greater id.
pub async fn past_the_millisecond_of(pool: &PgPool, id: Uuid) {
    let mut ms = [0_u8; 8];
    ms[2..].copy_from_slice(&id.as_bytes()[..6]);
    let ms = i64::from_be_bytes(ms);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now: i64 = sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint")
            .fetch_one(pool)
            .await
            .unwrap();
        if now > ms {
            return;
        }
        assert!(Instant::now() < deadline, "PostgreSQL's clock never moved on");
        tokio::time::sleep(POLL).await;
    }
}

/// A transaction (left open) holding job `id`'s row lock, as an enqueue naming it as a parent does first.
pub async fn locked_in_an_open_transaction(
    pool: &PgPool,
    id: Uuid,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '20s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT 1 FROM sluice.jobs WHERE id = $1 FOR NO KEY UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

/// The one session of a store method that PostgreSQL aborts as a deadlock and that runs once more.
pub struct RetriedSession {
    /// A pool of one connection: every run of the method is this session's.
    pub pool: PgPool,
    /// The session's backend process id.
    pub pid: i32,
    /// How many times the method took the connection (each run takes it once).
    runs: Arc<AtomicUsize>,
    /// A run after the first takes the connection only once this is opened.
    gate: tokio::sync::watch::Sender<bool>,
}

impl RetriedSession {
    /// A session that looks for a deadlock `deadlock_timeout` after each of its waits begins.
    pub async fn connect(url: &str, deadlock_timeout: &str) -> Self {
        let runs = Arc::new(AtomicUsize::new(0));
        let (gate, opened) = tokio::sync::watch::channel(false);
        let pool = sluice_queue::pool::options(1)
            .acquire_timeout(Duration::from_secs(20))
            .before_acquire({
                let runs = runs.clone();
                move |_, _| {
                    let run = runs.fetch_add(1, Ordering::SeqCst);
                    let mut opened = opened.clone();
                    Box::pin(async move {
                        if run > 0 {
                            opened.wait_for(|open| *open).await.expect("the gate is kept");
                        }
                        Ok(true)
                    })
                }
            })
            .connect_with(
                PgConnectOptions::from_str(url)
                    .unwrap()
                    .options([("deadlock_timeout", deadlock_timeout)]),
            )
            .await
            .expect("connect");
        let pid = backend_pid(&mut pool.acquire().await.unwrap()).await;
        runs.store(0, Ordering::SeqCst);
        Self {
            pool,
            pid,
            runs,
            gate,
        }
    }

    /// Lets a run after the first take the connection: the store runs an aborted call once more at
    /// once, and a second run that took a lock before the other transaction did would deadlock again.
    pub fn open_the_gate(&self) {
        self.gate.send(true).unwrap();
    }

    /// How many times the method ran.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}
