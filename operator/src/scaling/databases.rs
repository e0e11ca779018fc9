//! The operator's connections to the teams' databases: one pooled connection per database (shared by
//! every JobQueue that names it, so a hundred queues do not open a hundred connections, KEDA #6955), a
//! short depth cache (the HPA, the status and the 0↔1 loop all read depth), schema preparation and the
//! lease query behind pod-deletion-cost.
//!
//! Databases are keyed by a hash of their URL, so no URL is kept as a map key or logged.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

use sha2::{Digest, Sha256};
use sluice_sidecar::queue::{Depth, QueueSettings, QueueStore, schema};
use sqlx::{PgPool, Row, postgres::PgPoolOptions};

/// How long a depth read is reused. Short: the HPA asks every 15 s, the 0↔1 loop on each NOTIFY.
pub const DEPTH_CACHE_TTL_DEFAULT: Duration = Duration::from_millis(500);
/// Deadline of acquiring the connection: an unreachable database fails a call fast (it is retried).
pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Running jobs of queue `$1` per lease owner: which worker process holds how many leases.
pub const JOB_RUNNING_BY_OWNER: &str = r#"
SELECT lease_owner, count(*) AS running
  FROM sluice.jobs
 WHERE queue = $1 AND state = 'running'
 GROUP BY lease_owner
"#;

/// A database failure, as text (the URL is never part of it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DbError(pub String);

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        DbError(e.to_string())
    }
}

impl From<sluice_sidecar::Error> for DbError {
    fn from(e: sluice_sidecar::Error) -> Self {
        DbError(e.to_string())
    }
}

/// A stable, non-secret key for a database URL.
pub fn database_key(url: &str) -> String {
    let d = Sha256::digest(url.as_bytes());
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Pools and caches for every database the operator talks to.
#[derive(Debug)]
pub struct Databases {
    pools: Mutex<HashMap<String, PgPool>>,
    migrated: Mutex<HashSet<String>>,
    depth: Mutex<HashMap<(String, String), (Instant, Depth)>>,
    ttl: Duration,
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
        }
    }

    /// The pool (one connection) of the database at `url`, made on first use.
    pub fn pool(&self, url: &str) -> Result<PgPool, DbError> {
        let key = database_key(url);
        let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pools.get(&key) {
            return Ok(p.clone());
        }
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .idle_timeout(Some(Duration::from_secs(300)))
            .connect_lazy(url)?;
        pools.insert(key, pool.clone());
        Ok(pool)
    }

    /// Prepares the queue: the schema (once per database per process; the migrator holds an advisory
    /// lock, so several operator replicas are safe), the queue's settings, and its paused flag.
    pub async fn prepare(&self, url: &str, settings: &QueueSettings, paused: bool) -> Result<(), DbError> {
        let pool = self.pool(url)?;
        let key = database_key(url);
        let done = self
            .migrated
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&key);
        if !done {
            schema::migrate(&pool).await?;
            self.migrated
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key);
        }
        let store = QueueStore::new(pool);
        store.upsert_queue(settings).await?;
        store.set_paused(&settings.name, paused).await?;
        Ok(())
    }

    /// Depth of `queue`, at most the cache TTL old. `None` when the queue is not registered yet.
    pub async fn depth(&self, url: &str, queue: &str) -> Result<Option<Depth>, DbError> {
        let key = (database_key(url), queue.to_owned());
        if let Some((at, d)) = self.depth.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && at.elapsed() < self.ttl
        {
            return Ok(Some(d.clone()));
        }
        self.depth_fresh(url, queue).await
    }

    /// Depth of `queue` read now (and cached).
    pub async fn depth_fresh(&self, url: &str, queue: &str) -> Result<Option<Depth>, DbError> {
        let key = (database_key(url), queue.to_owned());
        let store = QueueStore::new(self.pool(url)?);
        let d = store.depth(queue).await?;
        if let Some(d) = &d {
            self.depth
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, (Instant::now(), d.clone()));
        }
        Ok(d)
    }

    /// Running jobs of `queue` per lease owner.
    pub async fn leases(&self, url: &str, queue: &str) -> Result<Vec<(String, i64)>, DbError> {
        let rows = sqlx::query(JOB_RUNNING_BY_OWNER)
            .bind(queue)
            .fetch_all(&self.pool(url)?)
            .await?;
        rows.iter()
            .map(|r| {
                let owner: Option<String> = r.try_get("lease_owner")?;
                Ok((owner.unwrap_or_default(), r.try_get("running")?))
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(DbError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

/// Why a JobQueue's database URL could not be read from its Secret.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    /// The Secret does not exist.
    #[error("Secret {namespace}/{name} named by spec.database.secretRef does not exist")]
    SecretNotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The Secret lacks the key (or its value is not UTF-8).
    #[error("Secret {namespace}/{name} has no key {key:?} (spec.database.secretRef.key)")]
    SecretKeyMissing {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The key.
        key: String,
    },
    /// Reading it failed.
    #[error("reading the database Secret: {0}")]
    Kube(#[from] kube::Error),
}

/// The database URL of `jq`, read from the Secret its `spec.database.secretRef` names in its own
/// namespace (the only Secret the operator reads for it).
pub async fn read_database_url(
    client: &kube::Client,
    jq: &sluice_crds::job_queue::JobQueue,
) -> Result<String, UrlError> {
    use kube::ResourceExt;
    let namespace = jq.namespace().unwrap_or_default();
    let r = &jq.spec.database.secret_ref;
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), &namespace);
    let secret = api
        .get_opt(&r.name)
        .await?
        .ok_or_else(|| UrlError::SecretNotFound {
            namespace: namespace.clone(),
            name: r.name.clone(),
        })?;
    let from_data = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .and_then(|v| String::from_utf8(v.0.clone()).ok());
    let from_string = secret.string_data.as_ref().and_then(|d| d.get(&r.key)).cloned();
    from_data
        .or(from_string)
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| UrlError::SecretKeyMissing {
            namespace,
            name: r.name.clone(),
            key: r.key.clone(),
        })
}
