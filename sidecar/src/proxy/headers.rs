//! Rate-limit response headers: the legacy `X-RateLimit-*` triple and the IETF draft
//! (draft-ietf-httpapi-ratelimit-headers) `RateLimit-Policy` / `RateLimit` fields.

use std::{ops::Range, time::Duration};

use bytes::Bytes;
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
///
/// This runs on every response of a limited route, so the values are written into one buffer and each
/// field holds a slice of it: two allocations for all five fields rather than two per field.
pub fn insert_quota(headers: &mut HeaderMap, quota: &Quota, config: &HeadersConfig) {
    let mut buf = Vec::with_capacity(values_capacity(quota));
    let fields = quota_values(quota, config, &mut buf);
    if fields.is_empty() {
        return;
    }
    // Grow the map once for all fields rather than once per field.
    headers.reserve(fields.len());
    let buf = Bytes::from(buf);
    for (name, range) in fields.iter() {
        if let Ok(v) = HeaderValue::from_maybe_shared(buf.slice(range.clone())) {
            headers.insert((*name).clone(), v);
        }
    }
}

/// Writes the configured quota fields for `quota` as HTTP/1.1 header lines (`name: value\r\n`) onto
/// `out`; `scratch` is a buffer the caller keeps between calls.
pub fn write_quota_lines(out: &mut Vec<u8>, scratch: &mut Vec<u8>, quota: &Quota, config: &HeadersConfig) {
    scratch.clear();
    let fields = quota_values(quota, config, scratch);
    for (name, range) in fields.iter() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&scratch[range.clone()]);
        out.extend_from_slice(b"\r\n");
    }
}

/// Enough for every field, so the buffer never grows: a u64 has at most 20 digits, and a draft field is
/// the quoted rule name, two 3-byte parameter prefixes and two numbers.
fn values_capacity(quota: &Quota) -> usize {
    let draft_len = quota.rule.len() + 2 + 2 * 3 + 2 * 20;
    3 * 20 + 2 * draft_len
}

/// The configured quota fields: each one's name and where its value lies in the buffer it was written to.
#[derive(Default)]
struct QuotaFields {
    fields: [Option<(&'static HeaderName, Range<usize>)>; 5],
    len: usize,
}

impl QuotaFields {
    fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn len(&self) -> usize {
        self.len
    }

    fn iter(&self) -> impl Iterator<Item = &(&'static HeaderName, Range<usize>)> {
        self.fields.iter().flatten()
    }
}

/// Writes the values of the configured quota fields one after another onto `buf`.
fn quota_values(quota: &Quota, config: &HeadersConfig, buf: &mut Vec<u8>) -> QuotaFields {
    let mut fields = QuotaFields::default();
    let mut field = |name: &'static HeaderName, buf: &mut Vec<u8>, write: &dyn Fn(&mut Vec<u8>)| {
        let start = buf.len();
        write(buf);
        fields.fields[fields.len] = Some((name, start..buf.len()));
        fields.len += 1;
    };
    let reset = ceil_secs(quota.reset);
    if config.legacy {
        field(&X_RATELIMIT_LIMIT, buf, &|b| push_decimal(b, quota.limit));
        field(&X_RATELIMIT_REMAINING, buf, &|b| push_decimal(b, quota.remaining));
        field(&X_RATELIMIT_RESET, buf, &|b| push_decimal(b, reset));
    }
    if config.draft {
        // Rule names are DNS labels (validated), so they need no escaping inside the quoted string.
        let window = ceil_secs(quota.window);
        field(&RATELIMIT_POLICY, buf, &|b| {
            draft_field(b, &quota.rule, b";q=", quota.limit, b";w=", window)
        });
        field(&RATELIMIT, buf, &|b| {
            draft_field(b, &quota.rule, b";r=", quota.remaining, b";t=", reset)
        });
    }
    fields
}

/// Writes `"<rule>"<p1><n1><p2><n2>`.
fn draft_field(b: &mut Vec<u8>, rule: &str, p1: &[u8], n1: u64, p2: &[u8], n2: u64) {
    b.push(b'"');
    b.extend_from_slice(rule.as_bytes());
    b.push(b'"');
    b.extend_from_slice(p1);
    push_decimal(b, n1);
    b.extend_from_slice(p2);
    push_decimal(b, n2);
}

/// Writes `n` in decimal onto `b`, without `fmt`.
pub fn push_decimal(b: &mut Vec<u8>, mut n: u64) {
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
    b.extend_from_slice(&digits[i..]);
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
        let field = |rule, p1, n1, p2, n2| {
            let mut b = Vec::new();
            draft_field(&mut b, rule, p1, n1, p2, n2);
            String::from_utf8(b).unwrap()
        };
        assert_eq!(
            field("r", b";q=", 0, b";w=", u64::MAX),
            "\"r\";q=0;w=18446744073709551615"
        );
        assert_eq!(
            field("a-b", b";r=", 1_000_000_007, b";t=", 10),
            "\"a-b\";r=1000000007;t=10"
        );
    }

    #[test]
    fn quota_lines_are_the_same_fields_as_http1_header_lines() {
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        write_quota_lines(&mut out, &mut scratch, &quota(), &HeadersConfig::default());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x-ratelimit-limit: 300\r\nx-ratelimit-remaining: 12\r\nx-ratelimit-reset: 42\r\n\
             ratelimit-policy: \"read\";q=300;w=60\r\nratelimit: \"read\";r=12;t=42\r\n"
        );
    }

    #[test]
    fn no_fields_leave_the_map_untouched() {
        let mut h = HeaderMap::new();
        let config = HeadersConfig {
            legacy: false,
            draft: false,
        };
        insert_quota(&mut h, &quota(), &config);
        assert!(h.is_empty());
    }
}
