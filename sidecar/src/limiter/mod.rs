//! Rate limiting: which rules apply to a request, the key each rule counts, and the decision, made by one
//! atomic Redis round trip per rule (with a deadline, a circuit breaker and a local fallback).
//!
//! This file holds the interface the proxy uses. The body of [`Limiter::check`] is a placeholder that
//! allows everything until the algorithms land.

use std::{net::IpAddr, time::Duration};

use sluice_crds::sidecar_config::{LimitsConfig, PolicyRef};

/// What the limiter needs to know about a request.
#[derive(Debug)]
pub struct RequestFacts<'a> {
    /// Request method (`GET`, ...).
    pub method: &'a http::Method,
    /// Request path, without the query.
    pub path: &'a str,
    /// Host without port, lower case, if the request names one.
    pub host: Option<&'a str>,
    /// Request headers.
    pub headers: &'a http::HeaderMap,
    /// The client address (already resolved through trusted proxies, see [`client_ip`]).
    pub client_ip: IpAddr,
}

/// The decision for one request.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// The rule that rejected the request, when one did (shadow rules never reject).
    pub rejected_by: Option<String>,
    /// When to retry, for a rejection.
    pub retry_after: Option<Duration>,
    /// The quota to report in headers: the most restrictive rule that applied, if any did.
    pub quota: Option<Quota>,
}

impl Verdict {
    /// Whether the request may go on to the app.
    pub fn allowed(&self) -> bool {
        self.rejected_by.is_none()
    }
}

/// Quota state of one rule for one client, for response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// Rule name.
    pub rule: String,
    /// Requests allowed per window.
    pub limit: u64,
    /// Requests left in the current window (0 when rejected).
    pub remaining: u64,
    /// Time until the quota is fully available again.
    pub reset: Duration,
    /// The rule's window.
    pub window: Duration,
}

/// Decides requests against the configured rules.
pub struct Limiter {
    _policy: Option<PolicyRef>,
}

impl Limiter {
    /// Builds a limiter for `config`.
    pub fn new(_config: &LimitsConfig, policy: Option<&PolicyRef>) -> crate::Result<Self> {
        Ok(Self {
            _policy: policy.cloned(),
        })
    }

    /// Decides one request: every applying rule must allow it.
    pub async fn check(&self, _req: &RequestFacts<'_>) -> Verdict {
        Verdict::default()
    }
}

/// Resolves the client address: the socket peer, or — only when the peer is a trusted proxy — the
/// rightmost `X-Forwarded-For` address that is not itself a trusted proxy.
pub fn client_ip(peer: IpAddr, _headers: &http::HeaderMap, _trusted: &[ipnet::IpNet]) -> IpAddr {
    peer
}
