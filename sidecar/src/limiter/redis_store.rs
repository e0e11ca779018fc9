//! Redis through `fred`: a pool of auto-pipelining connections (single node, Sentinel or Cluster, chosen by
//! the URL scheme; TLS for `rediss` URLs, see [`crate::redis`]), scripts run by SHA with `EVAL` when a
//! server answers `NOSCRIPT` (after a restart or failover; `EVAL` also caches the script on that node),
//! and a deadline on every call. Why connections fail is kept ([`Reachability`]), counted by cause and
//! logged when the cause changes.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use fred::{
    interfaces::EventInterface,
    prelude::{Builder, ClientLike, LuaInterface, Pool, ReconnectPolicy},
    types::config::PerformanceConfig,
};

use super::{
    algorithm::{Call, Script},
    metrics::Metrics,
};
use crate::{
    Error, Result,
    redis::{Problem, Reachability},
};

/// How long fred waits between reconnect attempts (ms).
const RECONNECT_DELAY_MS: u32 = 100;
/// Deadline of fred's own connection set-up (connect, AUTH, HELLO, CLUSTER SLOTS).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A connection that leaves a command unanswered this long is dropped and re-established (a frozen or
/// silently partitioned server); decisions never wait for it, they have their own deadline.
const UNRESPONSIVE_AFTER: Duration = Duration::from_secs(2);

/// Why a call did not decide.
#[derive(Debug)]
pub enum CallError {
    /// No answer within the deadline.
    Timeout,
    /// An error from Redis or the connection.
    Redis(fred::error::Error),
}

/// The limiter's Redis connections.
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    reach: Arc<Reachability>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the URL: it may hold a password.
        f.debug_struct("RedisStore")
            .field("size", &self.pool.size())
            .finish()
    }
}

impl RedisStore {
    /// Builds the pool and starts connecting in the background (trusting `ca_file`'s CA certificates for
    /// a TLS Redis besides the system's); fails only on an unusable URL or CA file. Connection errors are
    /// counted in `metrics` by cause.
    pub fn connect(
        url: &str,
        ca_file: Option<&str>,
        pool_size: usize,
        timeout: Duration,
        metrics: &Metrics,
    ) -> Result<Self> {
        let mut config = crate::redis::config(url, ca_file)?;
        // Keep retrying the first connection like any later one: Redis may come up after the sidecar.
        config.fail_fast = false;
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = CONNECT_TIMEOUT;
                c.internal_command_timeout = CONNECT_TIMEOUT;
                // A decision that missed its deadline is not worth retrying later.
                c.max_command_attempts = 1;
                c.unresponsive.max_timeout = Some(UNRESPONSIVE_AFTER);
                c.unresponsive.interval = UNRESPONSIVE_AFTER / 4;
            })
            .with_performance_config(|p| p.default_command_timeout = timeout)
            .set_policy(ReconnectPolicy::new_constant(0, RECONNECT_DELAY_MS));
        let pool = builder
            .build_pool(pool_size.max(1))
            .map_err(|e| Error::Config(format!("limits.redis: {}", e.details())))?;
        let reach = Arc::new(Reachability::default());
        for client in pool.clients() {
            let (reach, metrics) = (Arc::clone(&reach), metrics.clone());
            // The listener tasks end with the client's event channels.
            drop(client.on_error(move |(e, _server)| {
                metrics.redis_connection_error(crate::redis::Cause::of(&e));
                if reach.failed(&e) {
                    tracing::warn!(
                        problem = %reach.problem().map(|p| p.to_string()).unwrap_or_default(),
                        "cannot reach Redis; the failure mode decides meanwhile"
                    );
                }
                async { Ok(()) }
            }));
        }
        // The connection tasks run for the life of the pool; their handle is not needed.
        drop(pool.connect());
        Ok(Self { pool, reach })
    }

    /// Why Redis cannot be reached, while a connection attempt or the last probe failed.
    pub fn problem(&self) -> Option<Problem> {
        self.reach.problem()
    }

    /// Applies a new call deadline to fred's own command timeout.
    pub fn set_timeout(&self, timeout: Duration) {
        self.pool.update_perf_config(PerformanceConfig {
            default_command_timeout: timeout,
            ..PerformanceConfig::default()
        });
    }

    /// Runs `script` by SHA (falling back to `EVAL` on `NOSCRIPT`) within `timeout`; returns the reply and
    /// how long the call took.
    pub async fn run(
        &self,
        script: &Script,
        call: Call,
        timeout: Duration,
    ) -> (Result<Vec<i64>, CallError>, Duration) {
        let start = Instant::now();
        let attempt = async {
            let Call { keys, args } = call;
            match self
                .pool
                .evalsha::<Vec<i64>, _, _, _>(script.sha1.as_str(), keys.clone(), args.clone())
                .await
            {
                Err(e) if e.details().starts_with("NOSCRIPT") => {
                    tracing::debug!(script = script.name, "script not cached on this node, sending it");
                    self.pool.eval(script.source, keys, args).await
                }
                other => other,
            }
        };
        let result = match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) if *e.kind() == fred::error::ErrorKind::Timeout => Err(CallError::Timeout),
            Ok(Err(e)) => Err(CallError::Redis(e)),
            Err(_) => Err(CallError::Timeout),
        };
        (result, start.elapsed())
    }

    /// Whether Redis answers PING within `timeout`. An answer clears the recorded problem (logged); an
    /// error other than a timeout (`NOAUTH`, a refused ACL) is recorded as one.
    pub async fn ping(&self, timeout: Duration) -> bool {
        match tokio::time::timeout(timeout, self.pool.next_connected().ping::<String>(None)).await {
            Ok(Ok(_)) => {
                if self.reach.connected() {
                    tracing::info!("Redis can be reached again");
                }
                true
            }
            // A PING waits for a connection and times out while there is none: the connection's own
            // error says why, and is not overwritten.
            Ok(Err(e)) if crate::redis::Cause::of(&e) == crate::redis::Cause::timeout => false,
            Ok(Err(e)) => {
                if self.reach.failed(&e) {
                    tracing::warn!(
                        problem = %self.reach.problem().map(|p| p.to_string()).unwrap_or_default(),
                        "Redis does not answer PING"
                    );
                }
                false
            }
            Err(_) => false,
        }
    }
}
