//! The operator's connections to the teams' databases: a pool of at most [`POOL_SIZE`] connections per
//! database (shared by every JobQueue that names it, so a hundred queues do not open a hundred
//! connections, KEDA #6955; the queue's statements under an answer deadline, so a server gone silent
//! costs a connection, not the pool), a
//! short depth cache (the HPA, the status and the 0↔1 loop all read depth), schema preparation and the
//! lease counts behind pod-deletion-cost. Every statement is the queue crate's ([`QueueStore`]).
//!
//! Databases are keyed by a hash of their URL, so no URL is kept as a map key or logged. Which ones get
//! a pool is bounded by a [`Budget`] (per namespace and in all): the JobQueue controller [`admit`]s a
//! queue's database at each reconcile, and a pool is only made for an admitted database; a database no
//! JobQueue used for the budget's idle time is released and its pool closed.
//!
//! [`admit`]: Databases::admit

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

use sluice_queue::{Depth, Error, QueueSettings, QueueStore, Result, schema};
use sqlx::PgPool;

use crate::budget::{Budget, Exceeded, endpoint_key};

/// How long a depth read is reused. Short: the HPA asks every 15 s, the 0↔1 loop on each NOTIFY.
pub const DEPTH_CACHE_TTL_DEFAULT: Duration = Duration::from_millis(500);
/// How long an unused connection to a database stays open.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the server gives the operator's write of a queue's settings or paused flag (a row lock
/// waited for half of it): see [`QueueStore::with_server_deadline`].
pub const QUEUE_WRITE_DEADLINE: Duration = Duration::from_secs(10);
/// How long the operator's statements about a queue (its settings, paused flag, schedules, depth and
/// leases) may go unanswered before their connection is closed (see
/// [`QueueStore::with_answer_deadline`]): above [`QUEUE_WRITE_DEADLINE`], so that for a write the
/// server's own timeout answers first when the server is merely slow; a depth count of a huge backlog
/// is stopped by the server itself at four fifths of it (12 s, its `statement_timeout`), so that the
/// server does not count on after the operator gave up, and fails the read, to be tried again.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(15);
/// Most connections the operator holds to one database. A thousand JobQueues reconciled together
/// (at start, at a takeover) take turns on them; with one, those past the third second of the queue
/// failed their reconcile on the acquire deadline.
pub const POOL_SIZE: u32 = 4;

/// A stable, non-secret key for a database URL.
pub fn database_key(url: &str) -> String {
    endpoint_key(url)
}

/// Pools and caches for every database the operator talks to.
#[derive(Debug)]
pub struct Databases {
    pools: Mutex<HashMap<String, PgPool>>,
    migrated: Mutex<HashSet<String>>,
    depth: Mutex<HashMap<(String, String), (Instant, Depth)>>,
    ttl: Duration,
    budget: Budget,
}

impl Default for Databases {
    fn default() -> Self {
        Self::with_ttl(DEPTH_CACHE_TTL_DEFAULT)
    }
}

impl Databases {
    /// Databases whose depth reads are cached for `ttl`.
    pub fn with_ttl(ttl: Duration) -> Self {
        Self {
            pools: Mutex::default(),
            migrated: Mutex::default(),
            depth: Mutex::default(),
            ttl,
            budget: Budget::default(),
        }
    }

    /// The same, with `budget` bounding which databases get a pool.
    pub fn with_budget(self, budget: Budget) -> Self {
        Self { budget, ..self }
    }

    /// Records that a JobQueue of `namespace` uses the database at `url` now, if the budget allows; closes
    /// the pools of databases no JobQueue used for the budget's idle time and returns their keys (whose
    /// LISTEN connections the caller closes).
    pub fn admit(&self, namespace: &str, url: &str) -> (std::result::Result<(), Exceeded>, Vec<String>) {
        let (admitted, released) = self.budget.admit(namespace, &database_key(url), Instant::now());
        if !released.is_empty() {
            let closed: Vec<PgPool> = {
                let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
                released.iter().filter_map(|k| pools.remove(k)).collect()
            };
            for pool in closed {
                tokio::spawn(async move { pool.close().await });
            }
            let mut migrated = self.migrated.lock().unwrap_or_else(|p| p.into_inner());
            let mut depth = self.depth.lock().unwrap_or_else(|p| p.into_inner());
            for k in &released {
                migrated.remove(k);
                depth.retain(|(db, _), _| db != k);
            }
        }
        (admitted, released)
    }

    /// How many databases have a pool.
    pub fn pools(&self) -> usize {
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The pool (at most [`POOL_SIZE`] connections) of the database at `url`, made on first use, once
    /// [`admit`]ted.
    ///
    /// [`admit`]: Self::admit
    pub fn pool(&self, url: &str) -> Result<PgPool> {
        let key = database_key(url);
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.get(&key) {
            return Ok(p.clone());
        }
        if !self.budget.contains(&key) {
            return Err(Error::Invalid(
                "the operator does not connect to this database: no JobQueue using it was admitted \
                 within the operator's bound on databases per namespace"
                    .into(),
            ));
        }
        let pool = sluice_queue::pool::options(POOL_SIZE)
            .min_connections(0)
            .idle_timeout(Some(IDLE_TIMEOUT))
            .connect_lazy(url)?;
        pools.insert(key, pool.clone());
        Ok(pool)
    }

    /// Prepares the queue: the schema (once per database per process; the migrator holds an advisory
    /// lock, so several operator replicas are safe), the queue's settings, and its paused flag.
    pub async fn prepare(&self, url: &str, settings: &QueueSettings, paused: bool) -> Result<()> {
        let pool = self.pool(url)?;
        let key = database_key(url);
        let done = self
            .migrated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key);
        if !done {
            // On a connection of its own whose lock waits the server ends: a tenant may hold the
            // migrator's advisory lock.
            schema::migrate_url(url).await?;
            self.migrated
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key);
        }
        // Bounded by the server: a tenant holding its queue's row (`SELECT … FOR UPDATE`) must not park
        // the reconcile.
        let store = Self::store_of(pool);
        store.upsert_queue(settings).await?;
        store.set_paused(&settings.name, paused).await?;
        Ok(())
    }

    /// Depth of `queue`, at most the cache TTL old. `None` when the queue is not registered yet.
    pub async fn depth(&self, url: &str, queue: &str) -> Result<Option<Depth>> {
        let key = (database_key(url), queue.to_owned());
        if let Some((at, d)) = self.depth.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && at.elapsed() < self.ttl
        {
            return Ok(Some(d.clone()));
        }
        self.depth_fresh(url, queue).await
    }

    /// Depth of `queue` read now (and cached).
    pub async fn depth_fresh(&self, url: &str, queue: &str) -> Result<Option<Depth>> {
        let key = (database_key(url), queue.to_owned());
        let d = self.store(url)?.depth(queue).await?;
        if let Some(d) = &d {
            self.depth
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, (Instant::now(), d.clone()));
        }
        Ok(d)
    }

    /// Running jobs of `queue` per lease owner.
    pub async fn leases(&self, url: &str, queue: &str) -> Result<Vec<(String, i64)>> {
        self.store(url)?.running_by_owner(queue).await
    }

    /// The queue store of the database at `url` (see [`Databases::pool`]), its statements under the
    /// [`ANSWER_DEADLINE`] and its writes of a queue under the [`QUEUE_WRITE_DEADLINE`].
    pub fn store(&self, url: &str) -> Result<QueueStore> {
        Ok(Self::store_of(self.pool(url)?))
    }

    fn store_of(pool: PgPool) -> QueueStore {
        QueueStore::new(pool)
            .with_answer_deadline(ANSWER_DEADLINE)
            .with_server_deadline(QUEUE_WRITE_DEADLINE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_admitted_databases_get_a_pool_and_released_ones_lose_it() {
        let dbs = Databases::default().with_budget(Budget::new(1, 10, Duration::from_secs(60)));
        let (a, b) = ("postgres://u@a/db", "postgres://u@b/db");
        assert!(dbs.pool(a).is_err(), "not admitted yet");
        assert_eq!(dbs.admit("shop", a).0, Ok(()));
        dbs.pool(a).unwrap();
        assert_eq!(dbs.admit("shop", b).0, Err(Exceeded::Namespace(1)));
        assert!(dbs.pool(b).is_err());
        assert_eq!(dbs.pools(), 1);
        let idle = Databases::default().with_budget(Budget::new(1, 10, Duration::ZERO));
        assert_eq!(idle.admit("shop", a).0, Ok(()));
        idle.pool(a).unwrap();
        let (r, released) = idle.admit("shop", b);
        assert_eq!((r, released), (Ok(()), vec![database_key(a)]));
        assert_eq!(idle.pools(), 0, "the idle database's pool is closed");
    }

    #[test]
    fn database_keys_are_stable_and_do_not_contain_the_url() {
        let url = "postgres://app:secret@db:5432/app";
        assert_eq!(database_key(url), database_key(url));
        assert_ne!(
            database_key(url),
            database_key("postgres://app:secret@db:5432/other")
        );
        assert!(!database_key(url).contains("secret"));
    }
}
