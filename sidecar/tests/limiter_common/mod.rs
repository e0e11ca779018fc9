//! Fixtures shared by the limiter's integration tests: rules, configs, requests, limiters on real Redis.

#![allow(dead_code)] // each test binary includes this module and uses part of it

use std::{net::IpAddr, sync::Arc, time::Duration};

use http::{HeaderMap, Method};
use sluice_crds::{
    duration::Duration as ConfigDuration,
    sidecar_config::{Algorithm, FailureMode, Limit, LimitsConfig, PolicyRef, Rule},
};
use sluice_sidecar::{
    clock::{ManualClock, SharedClock},
    limiter::{Limiter, RequestFacts, Verdict, metrics::Metrics},
};
use sluice_testsupport::wait_for_async;

/// A Tuesday, well inside the epoch, not aligned to any window.
pub const T0: u64 = 1_700_000_123_456;

/// A rule named `name` for every request, keyed by client IP.
pub fn rule(name: &str, algorithm: Algorithm, requests: u64, window_ms: u64) -> Rule {
    Rule {
        name: name.into(),
        matches: Default::default(),
        key: Vec::new(),
        algorithm,
        limit: Limit {
            requests,
            window: ConfigDuration::from_millis(window_ms),
            burst: None,
        },
        shadow: false,
        client_ip_ceiling: None,
    }
}

/// A config with `rules` and the given failure mode. Its Redis deadline is generous (2 s): tests of
/// exact counting must not flip to the failure mode because a loaded CI machine stalled a call. The
/// tests of the deadline itself set it back with [`with_deadline`].
pub fn config(rules: Vec<Rule>, failure_mode: FailureMode) -> LimitsConfig {
    let mut c = LimitsConfig {
        rules,
        failure_mode,
        ..Default::default()
    };
    c.redis.timeout = ConfigDuration::from_millis(2_000);
    c
}

/// `config` with the production Redis deadline of `ms` milliseconds.
pub fn with_deadline(mut c: LimitsConfig, ms: u64) -> LimitsConfig {
    c.redis.timeout = ConfigDuration::from_millis(ms);
    c
}

/// The policy every test limiter belongs to.
pub fn policy() -> PolicyRef {
    PolicyRef {
        namespace: "tests".into(),
        name: "limits".into(),
        generation: 1,
    }
}

/// A limiter on `redis_url` (or purely local) driven by `clock`.
pub fn limiter(config: &LimitsConfig, redis_url: Option<&str>, clock: &ManualClock) -> Limiter {
    let clock: SharedClock = Arc::new(clock.clone());
    Limiter::with_metrics(config, Some(&policy()), redis_url, clock, Metrics::unregistered()).unwrap()
}

/// Waits until the limiter's breaker has closed (Redis answers).
pub async fn healthy(l: &Limiter) {
    wait_for_async("the limiter to reach Redis", Duration::from_secs(10), || async {
        l.redis_healthy().then_some(())
    })
    .await;
}

/// An empty header map, for requests without headers.
pub fn no_headers() -> &'static HeaderMap {
    static EMPTY: std::sync::OnceLock<HeaderMap> = std::sync::OnceLock::new();
    EMPTY.get_or_init(HeaderMap::new)
}

/// `GET /` from `ip`.
pub fn get_from(ip: &str) -> RequestFacts<'static> {
    RequestFacts {
        method: &Method::GET,
        path: "/",
        host: None,
        headers: no_headers(),
        client_ip: ip.parse::<IpAddr>().unwrap(),
    }
}

/// How many of `n` sequential requests from `ip` are allowed.
pub async fn allowed_of(l: &Limiter, ip: &str, n: usize) -> usize {
    let mut allowed = 0;
    for _ in 0..n {
        if l.check(&get_from(ip)).await.allowed() {
            allowed += 1;
        }
    }
    allowed
}

/// One request's verdict.
pub async fn check(l: &Limiter, ip: &str) -> Verdict {
    l.check(&get_from(ip)).await
}

/// The start of the window of length `window_ms` after the one holding `t`.
pub fn next_edge(t: u64, window_ms: u64) -> u64 {
    (t / window_ms + 1) * window_ms
}
