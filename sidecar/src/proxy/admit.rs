//! Whether a request may go on to the app, decided the same way on both paths a request can take (the
//! HTTP/1.1 fast path, [`super::h1`], and hyper, [`super::forward`]): a declared body over
//! `limits.maxRequestBody` is a 413; then, unless limiting is off or the client is allow-listed, every
//! applying rule must allow it, and a rejection is a 429 with its (sampled) log line.

use std::net::IpAddr;

use bytes::Bytes;
use http::{Method, Response, StatusCode};

use super::{
    metrics::Outcome,
    reject::{Rejection, plain, too_many_requests},
    state::{ProxyState, Snapshot},
};
use crate::limiter::{HeaderLookup, RequestFacts, Verdict, client_ip};

/// What admission reads of a request.
pub struct Arrival<'a> {
    /// Request method.
    pub method: &'a Method,
    /// Request path, without the query, as rules read it (normalized, see [`super::target`]).
    pub path: &'a str,
    /// The `Host` field (or, for HTTP/2, the URI authority) as sent, port and all.
    pub host: Option<&'a str>,
    /// The request's header fields.
    pub headers: &'a dyn HeaderLookup,
    /// The declared body length, if the request declares one.
    pub content_length: Option<u64>,
}

/// What becomes of a request.
#[derive(Debug)]
pub enum Admission {
    /// Forward it; the verdict's quota goes into the response headers.
    Forward(Verdict),
    /// Answer it with this response (413 or 429) instead.
    Refuse(Response<Bytes>),
}

/// Decides whether the request from `peer` goes on to the app. Never waits longer than the Redis deadline.
pub async fn admit(state: &ProxyState, snap: &Snapshot, peer: IpAddr, req: &Arrival<'_>) -> Admission {
    let limits = &snap.effective.config.limits;
    if req.content_length.is_some_and(|n| n > limits.max_request_body) {
        state.metrics.request(Outcome::TooLarge);
        return Admission::Refuse(plain(StatusCode::PAYLOAD_TOO_LARGE, "Payload Too Large"));
    }
    if !snap.effective.limiting_enabled {
        return Admission::Forward(Verdict::default());
    }
    let ip = client_ip(peer, req.headers, &limits.client_ip.trusted_proxies);
    if limits.allow_list.iter().any(|n| n.contains(&ip)) {
        return Admission::Forward(Verdict::default());
    }
    let host = req.host.map(super::target::host_for_rules);
    let facts = RequestFacts {
        method: req.method,
        path: req.path,
        host: host.as_deref(),
        headers: req.headers,
        client_ip: ip,
    };
    let verdict = state.limiter.check(&facts).await;
    if verdict.allowed() {
        return Admission::Forward(verdict);
    }
    state.metrics.request(Outcome::Limited);
    let rejection = Rejection {
        client_ip: ip,
        host: host.as_deref().unwrap_or("-"),
        path: req.path,
        rule: verdict.rejected_by.as_deref().unwrap_or("-"),
    };
    let now_secs = state.clock.now_millis() / 1000;
    if !state
        .rejection_log
        .log(&rejection, &limits.rejection_log, now_secs)
    {
        state.metrics.rejections_unlogged.inc();
    }
    Admission::Refuse(too_many_requests(&verdict, &limits.headers))
}
