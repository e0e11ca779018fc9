//! Responses the proxy makes itself: the `429 Too Many Requests` with its `RATE_LIMIT …` log line, itself
//! sampled so an attack cannot flood the logs (at most `rejectionLog.perSecond` lines a second; the rest
//! are counted), and the short plain-text answers for 413, 400 and 502.

use std::{
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering},
};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use sluice_crds::sidecar_config::{HeadersConfig, LogFormat, RejectionLogConfig};

use super::headers;
use crate::limiter::Verdict;

/// The body of every rejection.
pub const REJECTION_BODY: &str = "Too Many Requests";

/// Builds the 429: body `Too Many Requests`, `Retry-After` in whole seconds (at least 1), and the quota
/// headers.
pub fn too_many_requests(verdict: &Verdict, config: &HeadersConfig) -> Response<Bytes> {
    let mut resp = plain(StatusCode::TOO_MANY_REQUESTS, REJECTION_BODY);
    let h = resp.headers_mut();
    let retry = verdict
        .retry_after
        .or_else(|| verdict.quota.as_ref().map(|q| q.reset))
        .map(headers::ceil_secs)
        .unwrap_or(1)
        .max(1);
    h.insert(header::RETRY_AFTER, HeaderValue::from(retry));
    if let Some(q) = &verdict.quota {
        headers::insert_quota(h, q, config);
    }
    resp
}

/// A short text response made by the proxy itself.
pub fn plain(status: StatusCode, body: &'static str) -> Response<Bytes> {
    let mut resp = Response::new(Bytes::from_static(body.as_bytes()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A budget of log lines per wall-clock second, shared by all connections without a lock.
#[derive(Debug, Default)]
pub struct RejectionLog {
    /// Second (since the epoch) the count belongs to, in the high 32 bits; lines logged in it, low 32.
    slot: AtomicU64,
}

/// What is logged about one rejection.
#[derive(Debug)]
pub struct Rejection<'a> {
    /// Client address as the limiter saw it.
    pub client_ip: IpAddr,
    /// Host the request named.
    pub host: &'a str,
    /// Request path.
    pub path: &'a str,
    /// The rule that rejected it.
    pub rule: &'a str,
}

impl RejectionLog {
    /// Whether one more line fits in the budget of second `now_secs`.
    pub fn admit(&self, now_secs: u64, per_second: u32) -> bool {
        if per_second == 0 {
            return false;
        }
        let now = now_secs & 0xFFFF_FFFF;
        let mut cur = self.slot.load(Ordering::Relaxed);
        loop {
            let (sec, n) = (cur >> 32, cur & 0xFFFF_FFFF);
            let next = if sec == now {
                if n >= u64::from(per_second) {
                    return false;
                }
                cur + 1
            } else {
                (now << 32) | 1
            };
            match self
                .slot
                .compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Logs `r` if the budget allows; returns whether it did.
    pub fn log(&self, r: &Rejection<'_>, config: &RejectionLogConfig, now_secs: u64) -> bool {
        if !self.admit(now_secs, config.per_second) {
            return false;
        }
        match config.format {
            LogFormat::Text => tracing::warn!(
                target: "sluice::rate_limit",
                "RATE_LIMIT client_ip={} host={} path={} rule={} status=429",
                r.client_ip,
                r.host,
                r.path,
                r.rule
            ),
            LogFormat::Json => tracing::warn!(
                target: "sluice::rate_limit",
                client_ip = %r.client_ip,
                host = r.host,
                path = r.path,
                rule = r.rule,
                status = 429u16,
                "RATE_LIMIT"
            ),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Quota;
    use std::time::Duration;

    #[test]
    fn the_log_budget_refills_each_second() {
        let log = RejectionLog::default();
        let admitted = (0..100).filter(|_| log.admit(1000, 10)).count();
        assert_eq!(admitted, 10);
        assert!(log.admit(1001, 10));
        assert!(!RejectionLog::default().admit(5, 0));
    }

    #[test]
    fn a_rejection_says_too_many_requests_with_retry_after_and_quota() {
        let verdict = Verdict {
            rejected_by: Some("auth".into()),
            retry_after: Some(Duration::from_millis(2_500)),
            quota: Some(Quota {
                rule: "auth".into(),
                limit: 10,
                remaining: 0,
                reset: Duration::from_secs(30),
                window: Duration::from_secs(60),
            }),
        };
        let resp = too_many_requests(&verdict, &HeadersConfig::default());
        assert_eq!(resp.status(), 429);
        assert_eq!(resp.headers()["retry-after"], "3");
        assert_eq!(resp.headers()["x-ratelimit-remaining"], "0");
    }
}
