//! Rate-limit response headers: the legacy `X-RateLimit-*` triple and the IETF draft
//! (draft-ietf-httpapi-ratelimit-headers) `RateLimit-Policy` / `RateLimit` fields.

use std::time::Duration;

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
    let reset = ceil_secs(quota.reset);
    // Enough for every field, so the buffer never grows: a u64 has at most 20 digits, and a draft field
    // is the quoted rule name, two 3-byte parameter prefixes and two numbers.
    let draft_len = quota.rule.len() + 2 + 2 * 3 + 2 * 20;
    let mut values = Values::with_capacity(3 * 20 + 2 * draft_len);
    if config.legacy {
        values.field(&X_RATELIMIT_LIMIT, |b| push_decimal(b, quota.limit));
        values.field(&X_RATELIMIT_REMAINING, |b| push_decimal(b, quota.remaining));
        values.field(&X_RATELIMIT_RESET, |b| push_decimal(b, reset));
    }
    if config.draft {
        // Rule names are DNS labels (validated), so they need no escaping inside the quoted string.
        let window = ceil_secs(quota.window);
        values.field(&RATELIMIT_POLICY, |b| {
            draft_field(b, &quota.rule, b";q=", quota.limit, b";w=", window)
        });
        values.field(&RATELIMIT, |b| {
            draft_field(b, &quota.rule, b";r=", quota.remaining, b";t=", reset)
        });
    }
    values.insert_into(headers);
}

/// Header values written one after another into one buffer: `(name, start, end)` per field.
struct Values {
    buf: Vec<u8>,
    fields: [Option<(&'static HeaderName, usize, usize)>; 5],
    len: usize,
}

impl Values {
    fn with_capacity(bytes: usize) -> Self {
        Self {
            buf: Vec::with_capacity(bytes),
            fields: [None; 5],
            len: 0,
        }
    }

    fn field(&mut self, name: &'static HeaderName, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.buf.len();
        write(&mut self.buf);
        self.fields[self.len] = Some((name, start, self.buf.len()));
        self.len += 1;
    }

    fn insert_into(self, headers: &mut HeaderMap) {
        if self.len == 0 {
            return;
        }
        // Grow the map once for all fields rather than once per field.
        headers.reserve(self.len);
        let buf = Bytes::from(self.buf);
        for (name, start, end) in self.fields.into_iter().flatten() {
            if let Ok(v) = HeaderValue::from_maybe_shared(buf.slice(start..end)) {
                headers.insert(name.clone(), v);
            }
        }
    }
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

fn push_decimal(b: &mut Vec<u8>, mut n: u64) {
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
