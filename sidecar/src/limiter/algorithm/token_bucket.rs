//! Token bucket with nginx `limit_req rate=R burst=N nodelay` semantics, in GCRA form.
//!
//! The state is an excess `e` in units of `1/W` request: every admitted request adds `W`, and `e` drains
//! by `requests` per ms (so by `W` every `W/requests` ms, one request's worth). A request is allowed when
//! `max(e − requests·elapsed, 0) + W ≤ (burst + 1)·W`: a new client gets `burst + 1` requests at once, then
//! one every `W/requests` ms; rejections change nothing (as in nginx). nginx's `excess` is `e/W − 1`.
//! Integers throughout, exact in Lua's doubles while `(burst + 1)·W < 2^53`.
//!
//! Hits taken ahead (see [`Algorithm::prefetch_until`]) are *held*: until they may no longer be spent, `e`
//! drains no lower than `held·W`, as if they were still in the bucket, so a full bucket cannot refill the
//! room they made. Held hits live in [`HOLD_SLOT_MS`] slots: those taken in slot `s` may be spent until
//! slot `s + 2` begins (minus [`HOLD_MARGIN_MS`] for clock skew between sidecars). The in-process math
//! below never takes hits ahead, so it needs none of this.

use super::{Algorithm, Call, EXPIRY_GRACE_MS, Hits, Outcome, Params, Unique, count, div_ceil};

/// Length of the time slots hits taken ahead are held in (ms).
pub const HOLD_SLOT_MS: u64 = 1_000;
/// Hits taken ahead stop being spendable this long before Redis stops holding them (ms), so a sidecar
/// whose clock is that much behind another's still spends nothing Redis no longer holds.
pub const HOLD_MARGIN_MS: u64 = 250;

/// Until when hits a token bucket took ahead at `now` may be spent.
pub fn hold_until(now: u64) -> u64 {
    (now / HOLD_SLOT_MS + 2) * HOLD_SLOT_MS - HOLD_MARGIN_MS
}

/// Token-bucket (GCRA) counting.
#[derive(Debug)]
pub struct TokenBucket;

/// In-process excess and the time it was last written.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TokenBucketState {
    excess: u64,
    last: Option<u64>,
}

impl TokenBucketState {
    fn drained(&self, p: &Params, now: u64) -> u64 {
        let last = self.last.unwrap_or(now);
        let elapsed = now.saturating_sub(last);
        let drain = u128::from(p.requests) * u128::from(elapsed);
        u64::try_from(u128::from(self.excess).saturating_sub(drain)).unwrap_or(0)
    }
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;

    const NAME: &'static str = "token_bucket";
    const KEY_TAG: &'static str = "tb";
    const LUA: &'static str = include_str!("../scripts/token_bucket.lua");

    fn call(base: &str, p: &Params, now: u64, _: Unique, hits: Hits) -> Call {
        Call {
            keys: vec![format!("{base}:{}:{}", Self::KEY_TAG, p.window_ms)],
            args: vec![
                p.requests.to_string(),
                p.window_ms.to_string(),
                p.burst.to_string(),
                now.to_string(),
                EXPIRY_GRACE_MS.to_string(),
                hits.total().to_string(),
                hits.ahead.to_string(),
                HOLD_SLOT_MS.to_string(),
            ],
        }
    }

    fn nth(p: &Params, reply: &[i64], i: u64) -> Option<Vec<i64>> {
        let [allowed, excess] = *reply else { return None };
        let later = u64::try_from(allowed).ok()?.checked_sub(1 + i);
        Some(match later {
            Some(later) => {
                let back = i64::try_from(u128::from(later) * u128::from(p.window_ms)).ok()?;
                vec![1, excess - back]
            }
            None => vec![0, excess],
        })
    }

    fn outcome(p: &Params, _now: u64, reply: &[i64]) -> Option<Outcome> {
        let [allowed, excess] = *reply else { return None };
        let e = u128::from(count(excess));
        let big_w = u128::from(p.window_ms);
        let capacity = u128::from(p.burst + 1) * big_w;
        let rate = u128::from(p.requests);
        let allowed = allowed == 1;
        let remaining = if allowed {
            u64::try_from(capacity.saturating_sub(e) / big_w)
                .unwrap_or(u64::MAX)
                .min(p.requests)
        } else {
            0
        };
        Some(Outcome {
            allowed,
            remaining,
            reset_ms: div_ceil(e, rate),
            retry_after_ms: if allowed {
                0
            } else {
                div_ceil(e.saturating_sub(u128::from(p.burst) * big_w), rate).max(1)
            },
        })
    }

    fn decide_raw(state: &mut Self::State, p: &Params, now: u64) -> Vec<i64> {
        let excess = state.drained(p, now);
        let after = u128::from(excess) + u128::from(p.window_ms);
        if after > u128::from(p.burst + 1) * u128::from(p.window_ms) {
            return vec![0, excess as i64];
        }
        let last = state.last.map_or(now, |l| l.max(now));
        *state = TokenBucketState {
            excess: after as u64,
            last: Some(last),
        };
        vec![1, after as i64]
    }

    /// A full bucket would lose the refill the early hits made room for, so the script holds them (the
    /// bucket drains no lower than what is held) until [`hold_until`].
    fn prefetch_until(_: &Params, now: u64) -> Option<u64> {
        Some(hold_until(now))
    }

    fn is_idle(state: &Self::State, p: &Params, now: u64) -> bool {
        state.drained(p, now) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 requests per second (one per 100 ms), burst 4.
    const P: Params = Params {
        requests: 10,
        window_ms: 1_000,
        burst: 4,
    };

    #[test]
    fn new_client_gets_burst_plus_one_at_once_then_one_per_interval() {
        let mut s = TokenBucketState::default();
        let t0 = 1_700_000_000_000;
        let at_once = (0..10)
            .filter(|_| TokenBucket::decide(&mut s, &P, t0).allowed)
            .count();
        assert_eq!(at_once, 5);
        let o = TokenBucket::decide(&mut s, &P, t0 + 99);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ms, 1);
        assert!(TokenBucket::decide(&mut s, &P, t0 + 100).allowed);
        assert!(!TokenBucket::decide(&mut s, &P, t0 + 100).allowed);
    }

    #[test]
    fn burst_zero_is_one_request_per_interval_like_nginx() {
        let p = Params { burst: 0, ..P };
        let mut s = TokenBucketState::default();
        let t0 = 1_700_000_000_000;
        assert!(TokenBucket::decide(&mut s, &p, t0).allowed);
        assert!(!TokenBucket::decide(&mut s, &p, t0 + 99).allowed);
        assert!(TokenBucket::decide(&mut s, &p, t0 + 100).allowed);
    }

    #[test]
    fn a_smaller_burst_caps_what_an_existing_client_may_send() {
        let mut s = TokenBucketState::default();
        let t0 = 1_700_000_000_000;
        for _ in 0..3 {
            TokenBucket::decide(&mut s, &P, t0);
        }
        let smaller = Params { burst: 1, ..P };
        assert!(!TokenBucket::decide(&mut s, &smaller, t0).allowed);
        assert!(!TokenBucket::is_idle(&s, &P, t0 + 299));
        assert!(TokenBucket::is_idle(&s, &P, t0 + 300));
    }
}
