//! The proxy's own Prometheus metrics. The limiter registers its metrics (decisions by rule and outcome,
//! Redis latency, breaker state, fallback decisions, evictions) into the same registry.

pub use crate::config::reload::{ReloadOutcome, ReloadSource};
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// What became of a request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// Forwarded to the app and answered by it.
    Forwarded,
    /// Rejected with 429.
    Limited,
    /// Rejected with 413.
    TooLarge,
    /// The app could not be reached or failed mid-response (502).
    UpstreamError,
    /// Switched protocols (WebSocket) and tunnelled.
    Upgraded,
    /// Refused as malformed (400), e.g. a chunked body that breaks the coding.
    BadRequest,
}

/// Labels of `sluice_proxy_requests_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// What became of the request.
    pub outcome: Outcome,
}

/// Labels of `sluice_config_reloads_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReloadLabels {
    /// Where the config came from.
    pub source: ReloadSource,
    /// What became of it.
    pub outcome: ReloadOutcome,
}

/// Proxy metrics, registered once at start.
#[derive(Clone)]
pub struct ProxyMetrics {
    /// Requests by outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// Failures talking to the app.
    pub upstream_errors: Counter,
    /// Time from forwarding a request to the app's response headers.
    pub upstream_latency: Histogram,
    /// Reloads by source and outcome.
    pub reloads: Family<ReloadLabels, Counter>,
    /// Policy generation of the running config.
    pub config_generation: Gauge,
    /// Configs applied since start (the first load counts).
    pub config_applies: Counter,
    /// Pods enforcing the policy, as the operator last published it (0: not known yet).
    pub enforcing_pods: Gauge,
    /// Rejections that were not logged because the rejection log was over its per-second budget.
    pub rejections_unlogged: Counter,
    /// Client connections open now.
    pub connections_open: Gauge,
    /// Client connections closed as soon as accepted, `limits.maxConnections` being open.
    pub connections_refused: Counter,
    /// Client connections closed because the client was too slow (`limits.clientTimeouts`), or its
    /// request head outgrew the memory kept for heads.
    pub slow_clients: Counter,
    /// Handles into `requests`, one per [`Outcome`] in declaration order.
    by_outcome: [Counter; 6],
}

impl ProxyMetrics {
    /// Creates the metrics and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            upstream_errors: Counter::default(),
            upstream_latency: Histogram::new([
                0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                5.0,
            ]),
            reloads: Family::default(),
            config_generation: Gauge::default(),
            config_applies: Counter::default(),
            enforcing_pods: Gauge::default(),
            rejections_unlogged: Counter::default(),
            connections_open: Gauge::default(),
            connections_refused: Counter::default(),
            slow_clients: Counter::default(),
            by_outcome: Default::default(),
        };
        let mut m = m;
        let family = m.requests.clone();
        m.by_outcome = [
            Outcome::Forwarded,
            Outcome::Limited,
            Outcome::TooLarge,
            Outcome::UpstreamError,
            Outcome::Upgraded,
            Outcome::BadRequest,
        ]
        .map(|outcome| family.get_or_create(&RequestLabels { outcome }).clone());
        registry.register("sluice_proxy_requests", "Requests by outcome", m.requests.clone());
        registry.register(
            "sluice_proxy_upstream_errors",
            "Requests the app could not answer (502)",
            m.upstream_errors.clone(),
        );
        registry.register(
            "sluice_proxy_upstream_latency_seconds",
            "Time from forwarding to the app's response headers",
            m.upstream_latency.clone(),
        );
        registry.register(
            "sluice_config_reloads",
            "Config reloads by source and outcome",
            m.reloads.clone(),
        );
        registry.register(
            "sluice_config_generation",
            "Policy generation of the running config",
            m.config_generation.clone(),
        );
        registry.register(
            "sluice_config_applies",
            "Configs applied since start",
            m.config_applies.clone(),
        );
        registry.register(
            "sluice_config_enforcing_pods",
            "Pods enforcing the policy as the operator last published it, which failureMode local divides \
             each limit by (0: not known yet; expectedReplicas divides it)",
            m.enforcing_pods.clone(),
        );
        registry.register(
            "sluice_rejections_unlogged",
            "Rejections not logged because the rejection log was over budget",
            m.rejections_unlogged.clone(),
        );
        registry.register(
            "sluice_proxy_connections",
            "Client connections open",
            m.connections_open.clone(),
        );
        registry.register(
            "sluice_proxy_connections_refused",
            "Client connections closed at once because limits.maxConnections were open",
            m.connections_refused.clone(),
        );
        registry.register(
            "sluice_proxy_slow_clients",
            "Client connections closed for keeping the proxy waiting (limits.clientTimeouts) or for a \
             request head over the memory kept for heads",
            m.slow_clients.clone(),
        );
        m
    }

    /// Counts one request. The per-outcome counters are looked up once, at registration, so the hot path
    /// takes no lock on the family's map.
    pub fn request(&self, outcome: Outcome) {
        let i = match outcome {
            Outcome::Forwarded => 0,
            Outcome::Limited => 1,
            Outcome::TooLarge => 2,
            Outcome::UpstreamError => 3,
            Outcome::Upgraded => 4,
            Outcome::BadRequest => 5,
        };
        self.by_outcome[i].inc();
    }

    /// Counts one reload.
    pub fn reload(&self, source: ReloadSource, outcome: ReloadOutcome) {
        self.reloads
            .get_or_create(&ReloadLabels { source, outcome })
            .inc();
    }
}
