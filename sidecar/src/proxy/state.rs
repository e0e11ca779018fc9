//! What every request reads: the running config (swapped whole on reload), the limiter, the upstream
//! clients, metrics and readiness.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};

use arc_swap::ArcSwap;
use http::uri::{Authority, Scheme};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use prometheus_client::registry::Registry;
use sluice_crds::sidecar_config::FailureMode;

use super::{
    RequestBody,
    capacity::{Capacity, Environment},
    limit::RateLimit,
    metrics::ProxyMetrics,
    reject::RejectionLog,
};
use crate::{
    clock::SharedClock,
    config::{
        ConfigErrors, Effective,
        reload::{ConfigSink, ReloadOutcome, ReloadSource},
    },
};

/// How long the proxy waits for a TCP connection to the app.
pub const UPSTREAM_CONNECT_TIMEOUT_DEFAULT: std::time::Duration = std::time::Duration::from_secs(2);
/// Idle keep-alive connections kept per upstream.
pub const UPSTREAM_POOL_IDLE_DEFAULT: usize = 256;

/// One applied config, with what the hot path needs precomputed.
#[derive(Debug)]
pub struct Snapshot {
    /// The config as resolved (env overrides, seed tiers).
    pub effective: Effective,
    /// `http` (the app is reached in cleartext).
    pub upstream_scheme: Scheme,
    /// `host:port` of the app.
    pub upstream_authority: Authority,
}

impl Snapshot {
    /// Precomputes a snapshot; the config must be valid (its upstream URL parses).
    pub fn new(effective: Effective) -> Result<Self, ConfigErrors> {
        let uri: http::Uri = effective.config.limits.upstream.parse().map_err(|_| {
            let mut e = ConfigErrors::default();
            e.push("limits.upstream", "is not a URL");
            e
        })?;
        let parts = uri.into_parts();
        Ok(Self {
            effective,
            upstream_scheme: parts.scheme.unwrap_or(Scheme::HTTP),
            upstream_authority: parts.authority.ok_or_else(|| {
                let mut e = ConfigErrors::default();
                e.push("limits.upstream", "names no host");
                e
            })?,
        })
    }
}

/// Pooled clients to the app, one per protocol.
#[derive(Clone)]
pub struct UpstreamClients {
    /// HTTP/1.1 with keep-alive.
    pub http1: Client<HttpConnector, RequestBody>,
    /// HTTP/2 prior knowledge (h2c).
    pub h2c: Client<HttpConnector, RequestBody>,
}

impl UpstreamClients {
    /// Builds both clients (connections are opened lazily).
    pub fn new() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(UPSTREAM_CONNECT_TIMEOUT_DEFAULT));
        let http1 = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(UPSTREAM_POOL_IDLE_DEFAULT)
            .build(connector.clone());
        let h2c = Client::builder(TokioExecutor::new())
            .http2_only(true)
            .build(connector);
        Self { http1, h2c }
    }
}

impl Default for UpstreamClients {
    fn default() -> Self {
        Self::new()
    }
}

/// Shared state of the proxy and the admin endpoints.
pub struct ProxyState {
    snapshot: ArcSwap<Snapshot>,
    /// The limiter (the real one, or a test's stand-in).
    pub limiter: Arc<dyn RateLimit>,
    /// Clients to the app.
    pub clients: UpstreamClients,
    /// Proxy metrics.
    pub metrics: ProxyMetrics,
    /// All metrics (the limiter's and the proxy's), encoded by `/metrics`.
    pub registry: Registry,
    /// Sampling of rejection log lines.
    pub rejection_log: RejectionLog,
    /// Wall clock (for log sampling; the limiter has its own handle).
    pub clock: SharedClock,
    /// Open client connections against `limits.maxConnections`, and the budget of long request heads.
    pub capacity: Capacity,
    draining: AtomicBool,
    apply_lock: Mutex<()>,
    generation_tx: tokio::sync::watch::Sender<i64>,
}

impl ProxyState {
    /// State running `initial`. `metrics` must be registered in `registry`.
    pub fn new(
        initial: Effective,
        limiter: Arc<dyn RateLimit>,
        metrics: ProxyMetrics,
        registry: Registry,
        clock: SharedClock,
    ) -> Result<Self, ConfigErrors> {
        let generation = initial.generation();
        metrics.config_generation.set(generation);
        metrics.config_applies.inc();
        let capacity = Capacity::new(&initial.config.limits, Environment::probe());
        Ok(Self {
            snapshot: ArcSwap::from_pointee(Snapshot::new(initial)?),
            limiter,
            clients: UpstreamClients::new(),
            metrics,
            registry,
            rejection_log: RejectionLog::default(),
            clock,
            capacity,
            draining: AtomicBool::new(false),
            apply_lock: Mutex::new(()),
            generation_tx: tokio::sync::watch::channel(generation).0,
        })
    }

    /// The running config.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Applies a new config unless its policy generation is older than the running one's. The limiter
    /// is reconfigured in place (counters kept); listen addresses take effect only after a restart.
    pub fn apply(&self, next: Effective, source: ReloadSource) -> Result<ReloadOutcome, ConfigErrors> {
        let _one_at_a_time = self.apply_lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot();
        if next.config.policy.is_some() && next.generation() < current.effective.generation() {
            self.metrics.reload(source, ReloadOutcome::Stale);
            return Ok(ReloadOutcome::Stale);
        }
        let snapshot = match Snapshot::new(next) {
            Ok(s) => s,
            Err(e) => {
                self.metrics.reload(source, ReloadOutcome::Rejected);
                return Err(e);
            }
        };
        let limits = &snapshot.effective.config.limits;
        if let Err(e) = self
            .limiter
            .reconfigure(limits, snapshot.effective.config.policy.as_ref())
        {
            self.metrics.reload(source, ReloadOutcome::Rejected);
            let mut errs = ConfigErrors::default();
            errs.push("limits", e.to_string());
            return Err(errs);
        }
        self.capacity.reconfigure(limits);
        let old = &current.effective.config.limits;
        if old.listen != limits.listen || old.admin_listen != limits.admin_listen {
            tracing::warn!(
                "limits.listen / limits.adminListen changed; the new addresses take effect after a restart"
            );
        }
        let generation = snapshot.effective.generation();
        self.snapshot.store(Arc::new(snapshot));
        self.metrics.config_generation.set(generation);
        self.metrics.config_applies.inc();
        self.metrics.reload(source, ReloadOutcome::Applied);
        self.generation_tx.send_replace(generation);
        Ok(ReloadOutcome::Applied)
    }

    /// Changes to the applied policy generation (for the `enforced` report).
    pub fn generation_changes(&self) -> tokio::sync::watch::Receiver<i64> {
        self.generation_tx.subscribe()
    }

    /// Marks the proxy as shutting down: `/readyz` fails from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Whether `/readyz` should pass: config loaded (always, once state exists), not draining, and — in
    /// `failureMode: closed` only — Redis answering.
    pub fn ready(&self) -> bool {
        if self.draining.load(Ordering::SeqCst) {
            return false;
        }
        let snap = self.snapshot();
        snap.effective.config.limits.failure_mode != FailureMode::Closed || self.limiter.redis_healthy()
    }

    /// Whether shutdown has begun.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

impl ConfigSink for ProxyState {
    fn apply(&self, config: Effective, source: ReloadSource) -> Result<ReloadOutcome, ConfigErrors> {
        ProxyState::apply(self, config, source)
    }

    fn rejected(&self, source: ReloadSource) {
        self.metrics.reload(source, ReloadOutcome::Rejected);
    }

    fn running_generation(&self) -> i64 {
        self.snapshot().effective.generation()
    }
}
