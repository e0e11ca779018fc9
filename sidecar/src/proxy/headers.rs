//! Rate-limit response headers: the legacy `X-RateLimit-*` triple and the IETF draft
//! (draft-ietf-httpapi-ratelimit-headers) `RateLimit-Policy` / `RateLimit` fields.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};
use sluice_crds::sidecar_config::HeadersConfig;

use crate::limiter::Quota;

/// `X-RateLimit-Limit`.
pub static X_RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
/// `X-RateLimit-Remaining`.
pub static X_RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
/// `X-RateLimit-Reset` (seconds until the quota is full again).
pub static X_RATELIMIT_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");
/// `RateLimit-Policy` (IETF draft): `"rule";q=LIMIT;w=WINDOW_SECONDS`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (IETF draft): `"rule";r=REMAINING;t=RESET_SECONDS`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Whole seconds, rounded up: a client that waits this long is never early.
pub fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// Adds the configured quota headers for `quota` to `headers`.
pub fn insert_quota(headers: &mut HeaderMap, quota: &Quota, config: &HeadersConfig) {
    let reset = ceil_secs(quota.reset);
    // Grow the map once for all five fields rather than once per field.
    headers.reserve(5);
    if config.legacy {
        headers.insert(X_RATELIMIT_LIMIT.clone(), HeaderValue::from(quota.limit));
        headers.insert(X_RATELIMIT_REMAINING.clone(), HeaderValue::from(quota.remaining));
        headers.insert(X_RATELIMIT_RESET.clone(), HeaderValue::from(reset));
    }
    if config.draft {
        // Rule names are DNS labels (validated), so they need no escaping inside the quoted string.
        let policy = draft_field(&quota.rule, ";q=", quota.limit, ";w=", ceil_secs(quota.window));
        let state = draft_field(&quota.rule, ";r=", quota.remaining, ";t=", reset);
        if let Ok(v) = HeaderValue::try_from(policy) {
            headers.insert(RATELIMIT_POLICY.clone(), v);
        }
        if let Ok(v) = HeaderValue::try_from(state) {
            headers.insert(RATELIMIT.clone(), v);
        }
    }
}

/// `"<rule>"<p1><n1><p2><n2>`, built without the formatting machinery (this runs on every response of
/// a limited route).
fn draft_field(rule: &str, p1: &str, n1: u64, p2: &str, n2: u64) -> String {
    let mut s = String::with_capacity(rule.len() + 2 + p1.len() + p2.len() + 40);
    s.push('"');
    s.push_str(rule);
    s.push('"');
    s.push_str(p1);
    push_decimal(&mut s, n1);
    s.push_str(p2);
    push_decimal(&mut s, n2);
    s
}

fn push_decimal(s: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        s.push(char::from(d));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota() -> Quota {
        Quota {
            rule: "read".into(),
            limit: 300,
            remaining: 12,
            reset: Duration::from_millis(41_200),
            window: Duration::from_secs(60),
        }
    }

    #[test]
    fn both_header_sets_are_written_by_default() {
        let mut h = HeaderMap::new();
        insert_quota(&mut h, &quota(), &HeadersConfig::default());
        assert_eq!(h["x-ratelimit-limit"], "300");
        assert_eq!(h["x-ratelimit-remaining"], "12");
        assert_eq!(h["x-ratelimit-reset"], "42");
        assert_eq!(h["ratelimit-policy"], "\"read\";q=300;w=60");
        assert_eq!(h["ratelimit"], "\"read\";r=12;t=42");
    }

    #[test]
    fn the_draft_fields_can_be_turned_off() {
        let mut h = HeaderMap::new();
        let config = HeadersConfig {
            legacy: true,
            draft: false,
        };
        insert_quota(&mut h, &quota(), &config);
        assert!(h.contains_key("x-ratelimit-limit"));
        assert!(!h.contains_key("ratelimit"));
    }

    #[test]
    fn draft_numbers_are_written_in_full() {
        assert_eq!(
            draft_field("r", ";q=", 0, ";w=", u64::MAX),
            "\"r\";q=0;w=18446744073709551615"
        );
        assert_eq!(
            draft_field("a-b", ";r=", 1_000_000_007, ";t=", 10),
            "\"a-b\";r=1000000007;t=10"
        );
    }
}
