//! The limiter's Prometheus metrics, registered under the `sluice_limiter_` prefix:
//!
//! | metric | labels | meaning |
//! |---|---|---|
//! | `sluice_limiter_decisions_total` | `rule`, `outcome` (`allowed`/`rejected`/`shadow_rejected`) | one per applying rule per request |
//! | `sluice_limiter_redis_latency_seconds` | | every Redis call, answered or not |
//! | `sluice_limiter_redis_batch_size` | | requests decided by one Redis call (more than 1 when requests for one key arrived while a call for it was in flight) |
//! | `sluice_limiter_redis_errors_total` | `kind` (`timeout`/`error`/`reply`) | calls that did not decide |
//! | `sluice_limiter_redis_connection_errors_total` | `cause` (`tls`/`auth`/`refused`/`dns`/`timeout`/`protocol`/`error`) | failed connection attempts and connections lost, by why |
//! | `sluice_limiter_breaker_open` | | 1 while the circuit breaker keeps calls away from Redis |
//! | `sluice_limiter_fallback_decisions_total` | `mode` (`open`/`closed`/`local`), `outcome` | decisions made without Redis while Redis was configured |
//! | `sluice_limiter_local_buckets` | | in-process buckets held |
//! | `sluice_limiter_local_evictions_total` | | idle buckets evicted to stay under the cap |
//! | `sluice_limiter_local_overflow_total` | | decisions made by a rule's shared overflow bucket because the cap was full of active buckets |
//! | `sluice_limiter_carried_over_total` | | requests the local fallback allowed, counted into Redis once it answered again |
//! | `sluice_limiter_carry_unnoted_total` | | requests the local fallback allowed that could not be noted for the carry-over (`localMaxKeys` keys noted) |
//! | `sluice_limiter_last_said_unnoted_total` | | Redis answers not remembered to seed the local fallback (`localMaxKeys` keys remembered) |
//!
//! Per-rule counters are created once when rules are compiled, so the hot path neither allocates labels
//! nor takes the family's lock.

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// How a rule decided one request.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // variant names are the metric label values, snake_case as Prometheus has them
pub enum DecisionOutcome {
    /// Within the limit.
    allowed,
    /// Over the limit, and the rule enforces.
    rejected,
    /// Over the limit, but the rule is in shadow mode: let through.
    shadow_rejected,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    rule: String,
    outcome: DecisionOutcome,
}

/// Why a Redis call did not decide.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // variant names are the metric label values, snake_case as Prometheus has them
pub enum RedisErrorKind {
    /// No answer within the deadline.
    timeout,
    /// Redis or the connection answered with an error.
    error,
    /// The script's reply had an unexpected shape.
    reply,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: RedisErrorKind,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: crate::redis::Cause,
}

/// Which failure mode made a decision.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // variant names are the metric label values, snake_case as Prometheus has them
pub enum FallbackMode {
    /// Let through.
    open,
    /// Rejected.
    closed,
    /// Decided in process.
    local,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FallbackLabels {
    mode: FallbackMode,
    outcome: DecisionOutcome,
}

/// Handles of one rule's decision counters.
#[derive(Clone, Debug, Default)]
pub struct RuleCounters {
    allowed: Counter,
    rejected: Counter,
    shadow_rejected: Counter,
}

impl RuleCounters {
    /// Counts one decision.
    pub fn count(&self, outcome: DecisionOutcome) {
        match outcome {
            DecisionOutcome::allowed => self.allowed.inc(),
            DecisionOutcome::rejected => self.rejected.inc(),
            DecisionOutcome::shadow_rejected => self.shadow_rejected.inc(),
        };
    }
}

/// All limiter metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    decisions: Family<DecisionLabels, Counter>,
    /// Latency of Redis calls.
    pub redis_latency: Histogram,
    /// Requests decided per Redis call.
    pub redis_batch_size: Histogram,
    redis_errors: Family<ErrorLabels, Counter>,
    redis_connection_errors: Family<CauseLabels, Counter>,
    /// 1 while the breaker is open.
    pub breaker_open: Gauge,
    fallback: Family<FallbackLabels, Counter>,
    /// In-process buckets held.
    pub local_buckets: Gauge,
    /// Idle buckets evicted.
    pub local_evictions: Counter,
    /// Decisions by overflow buckets.
    pub local_overflow: Counter,
    /// Decisions spent from hits a Redis call took ahead.
    pub prefetched: Counter,
    /// Requests allowed by the local fallback and counted into Redis afterwards.
    pub carried_over: Counter,
    /// Requests allowed by the local fallback that the carry-over ledger had no room for.
    pub carry_unnoted: Counter,
    /// Redis answers that could not be remembered to seed the local fallback (map full).
    pub last_said_unnoted: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `sluice_limiter_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::unregistered();
        let r = registry.sub_registry_with_prefix("sluice_limiter");
        r.register(
            "decisions",
            "Rate-limit decisions by rule and outcome",
            m.decisions.clone(),
        );
        r.register(
            "redis_latency_seconds",
            "Latency of rate-limit calls to Redis, answered or not",
            m.redis_latency.clone(),
        );
        r.register(
            "redis_batch_size",
            "Requests decided by one Redis call (coalesced while a call for the same key was in flight)",
            m.redis_batch_size.clone(),
        );
        r.register(
            "prefetched_decisions",
            "Requests allowed from budget a hot key's Redis call counted ahead (no wait for Redis)",
            m.prefetched.clone(),
        );
        r.register(
            "redis_errors",
            "Redis calls that did not decide, by kind",
            m.redis_errors.clone(),
        );
        r.register(
            "redis_connection_errors",
            "Failed connection attempts to Redis and connections lost, by cause",
            m.redis_connection_errors.clone(),
        );
        r.register(
            "breaker_open",
            "1 while the circuit breaker keeps rate-limit calls away from Redis",
            m.breaker_open.clone(),
        );
        r.register(
            "fallback_decisions",
            "Decisions made without Redis while Redis was configured, by failure mode and outcome",
            m.fallback.clone(),
        );
        r.register(
            "local_buckets",
            "In-process rate-limit buckets held",
            m.local_buckets.clone(),
        );
        r.register(
            "local_evictions",
            "Idle in-process buckets evicted to stay under the cap",
            m.local_evictions.clone(),
        );
        r.register(
            "local_overflow",
            "Decisions made by a rule's shared overflow bucket because the cap was full of active buckets",
            m.local_overflow.clone(),
        );
        r.register(
            "carried_over",
            "Requests the local fallback allowed, counted into Redis once it answered again",
            m.carried_over.clone(),
        );
        r.register(
            "carry_unnoted",
            "Requests the local fallback allowed that could not be noted for the carry-over (localMaxKeys keys noted)",
            m.carry_unnoted.clone(),
        );
        r.register(
            "last_said_unnoted",
            "Redis answers not remembered to seed the local fallback (localMaxKeys keys remembered)",
            m.last_said_unnoted.clone(),
        );
        m
    }

    /// Metrics that are not exported (tests, benchmarks).
    pub fn unregistered() -> Self {
        Self {
            decisions: Family::default(),
            redis_latency: Histogram::new(exponential_buckets(0.000_1, 2.0, 14)),
            redis_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 9)),
            redis_errors: Family::default(),
            redis_connection_errors: Family::default(),
            breaker_open: Gauge::default(),
            fallback: Family::default(),
            local_buckets: Gauge::default(),
            local_evictions: Counter::default(),
            local_overflow: Counter::default(),
            prefetched: Counter::default(),
            carried_over: Counter::default(),
            carry_unnoted: Counter::default(),
            last_said_unnoted: Counter::default(),
        }
    }

    /// The decision counters of rule `rule`.
    pub fn rule(&self, rule: &str) -> RuleCounters {
        let get = |outcome| {
            self.decisions.get_or_create_owned(&DecisionLabels {
                rule: rule.to_owned(),
                outcome,
            })
        };
        RuleCounters {
            allowed: get(DecisionOutcome::allowed),
            rejected: get(DecisionOutcome::rejected),
            shadow_rejected: get(DecisionOutcome::shadow_rejected),
        }
    }

    /// Counts a Redis call that did not decide.
    pub fn redis_error(&self, kind: RedisErrorKind) {
        self.redis_errors.get_or_create(&ErrorLabels { kind }).inc();
    }

    /// Redis calls that did not decide, of `kind`, so far.
    pub fn redis_errors(&self, kind: RedisErrorKind) -> u64 {
        self.redis_errors.get_or_create(&ErrorLabels { kind }).get()
    }

    /// Counts a failed connection to Redis.
    pub fn redis_connection_error(&self, cause: crate::redis::Cause) {
        self.redis_connection_errors
            .get_or_create(&CauseLabels { cause })
            .inc();
    }

    /// Connection errors counted so far for `cause`.
    pub fn redis_connection_errors(&self, cause: crate::redis::Cause) -> u64 {
        self.redis_connection_errors
            .get_or_create(&CauseLabels { cause })
            .get()
    }

    /// Counts a decision made by a failure mode.
    pub fn fallback(&self, mode: FallbackMode, outcome: DecisionOutcome) {
        self.fallback
            .get_or_create(&FallbackLabels { mode, outcome })
            .inc();
    }

    /// Decisions counted for `rule` with `outcome` so far (for tests and the benchmark).
    pub fn decisions(&self, rule: &str, outcome: DecisionOutcome) -> u64 {
        self.decisions
            .get_or_create(&DecisionLabels {
                rule: rule.to_owned(),
                outcome,
            })
            .get()
    }

    /// Fallback decisions counted so far for `mode` and `outcome`.
    pub fn fallbacks(&self, mode: FallbackMode, outcome: DecisionOutcome) -> u64 {
        self.fallback
            .get_or_create(&FallbackLabels { mode, outcome })
            .get()
    }
}
