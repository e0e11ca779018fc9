//! Sliding-window counter (Cloudflare's estimate): counters per aligned window; a request at elapsed `e`
//! into window `w` is allowed when `prev·(W − e)/W + cur + 1 ≤ limit`. Constant memory, no 2× burst at
//! window edges; the estimate assumes the previous window's requests were spread evenly.
//!
//! The comparison is done in integers scaled by `W` (`prev·(W − e) + (cur + 1)·W ≤ limit·W`), exact in
//! Lua's doubles while `limit·W < 2^53` (checked when rules are compiled).

use super::{Algorithm, Call, EXPIRY_GRACE_MS, Hits, Outcome, Params, Unique, count};

/// Sliding-counter counting.
#[derive(Debug)]
pub struct SlidingCounter;

/// In-process counters of the current and previous window.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SlidingCounterState {
    window: u64,
    cur: u64,
    prev: u64,
}

impl Algorithm for SlidingCounter {
    type State = SlidingCounterState;

    const NAME: &'static str = "sliding_counter";
    const KEY_TAG: &'static str = "sc";
    const LUA: &'static str = include_str!("../scripts/sliding_counter.lua");

    fn call(base: &str, p: &Params, now: u64, _: Unique, hits: Hits) -> Call {
        let w = now / p.window_ms;
        let elapsed = now - w * p.window_ms;
        let prev = w as i64 - 1;
        Call {
            keys: vec![
                format!("{base}:{}:{}:{w}", Self::KEY_TAG, p.window_ms),
                format!("{base}:{}:{}:{prev}", Self::KEY_TAG, p.window_ms),
            ],
            args: vec![
                p.requests.to_string(),
                p.window_ms.to_string(),
                elapsed.to_string(),
                (2 * p.window_ms - elapsed + EXPIRY_GRACE_MS).to_string(),
                hits.total().to_string(),
            ],
        }
    }

    fn nth(_: &Params, reply: &[i64], i: u64) -> Option<Vec<i64>> {
        let [allowed, prev, cur] = *reply else { return None };
        Some(if i < count(allowed) {
            vec![1, prev, cur - (allowed - 1 - i as i64)]
        } else {
            vec![0, prev, cur]
        })
    }

    fn outcome(p: &Params, now: u64, reply: &[i64]) -> Option<Outcome> {
        let [allowed, prev, cur] = *reply else { return None };
        let (prev, cur) = (count(prev), count(cur));
        let big_w = u128::from(p.window_ms);
        let e = now % p.window_ms;
        let left = p.window_ms - e;
        let used = u128::from(prev) * u128::from(left) + u128::from(cur) * big_w;
        let capacity = u128::from(p.requests) * big_w;
        let remaining = u64::try_from(capacity.saturating_sub(used) / big_w).unwrap_or(u64::MAX);
        let allowed = allowed == 1;
        Some(Outcome {
            allowed,
            remaining,
            reset_ms: if cur > 0 { left + p.window_ms } else { left },
            retry_after_ms: if allowed {
                0
            } else {
                retry_after(p, e, prev, cur).max(1)
            },
        })
    }

    fn decide_raw(state: &mut Self::State, p: &Params, now: u64) -> Vec<i64> {
        let w = now / p.window_ms;
        if state.window != w {
            let prev = if state.window + 1 == w { state.cur } else { 0 };
            *state = SlidingCounterState {
                window: w,
                cur: 0,
                prev,
            };
        }
        let e = u128::from(now - w * p.window_ms);
        let big_w = u128::from(p.window_ms);
        let used = u128::from(state.prev) * (big_w - e) + u128::from(state.cur + 1) * big_w;
        if used > u128::from(p.requests) * big_w {
            return vec![0, state.prev as i64, state.cur as i64];
        }
        state.cur += 1;
        vec![1, state.prev as i64, state.cur as i64]
    }

    /// As for the fixed window: a hit counted early in its aligned window is counted no later than when
    /// it is spent; the end of that window ends it.
    fn prefetch_until(p: &Params, now: u64) -> Option<u64> {
        Some((now / p.window_ms + 1) * p.window_ms)
    }

    fn is_idle(state: &Self::State, p: &Params, now: u64) -> bool {
        let w = now / p.window_ms;
        (state.cur == 0 && state.prev == 0)
            || state.window + 1 < w
            || (state.window + 1 == w && state.cur == 0)
    }
}

/// Milliseconds from elapsed `e` into the current window until one request fits, if none arrive meanwhile.
fn retry_after(p: &Params, e: u64, prev: u64, cur: u64) -> u64 {
    let big_w = u128::from(p.window_ms);
    let limit = u128::from(p.requests);
    let left = p.window_ms - e;
    // Still in this window: the previous window's weight must shrink enough.
    if u128::from(cur) < limit && prev > 0 {
        let spare = (limit - u128::from(cur) - 1) * big_w / u128::from(prev);
        if spare > 0 {
            let t = u128::from(left).saturating_sub(spare);
            if t < u128::from(left) {
                return u64::try_from(t).unwrap_or(u64::MAX);
            }
        }
    }
    // In the next window, where this window's count becomes the weighted one.
    if cur == 0 {
        return left;
    }
    let spare = (limit - 1) * big_w / u128::from(cur);
    let e_next = big_w.saturating_sub(spare).min(big_w);
    left.saturating_add(u64::try_from(e_next).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        requests: 10,
        window_ms: 60_000,
        burst: 0,
    };

    fn fill(s: &mut SlidingCounterState, now: u64, n: usize) -> usize {
        (0..n)
            .filter(|_| SlidingCounter::decide(s, &P, now).allowed)
            .count()
    }

    #[test]
    fn previous_window_weighs_by_its_remaining_overlap() {
        let mut s = SlidingCounterState::default();
        let start = 1_700_000_040_000 / P.window_ms * P.window_ms;
        assert_eq!(fill(&mut s, start + 59_999, 20), 10);
        // At the edge the previous window still weighs 10·(60000/60000): nothing fits.
        assert_eq!(fill(&mut s, start + 60_000, 5), 0);
        // A quarter in, it weighs 7.5: two more fit (7.5 + 2 ≤ 10 < 7.5 + 3).
        assert_eq!(fill(&mut s, start + 75_000, 5), 2);
        // Half way it weighs 5: 5 + 2 + 3 = 10.
        assert_eq!(fill(&mut s, start + 90_000, 5), 3);
    }

    #[test]
    fn retry_after_is_the_first_millisecond_a_request_fits() {
        let mut s = SlidingCounterState::default();
        let start = 1_700_000_040_000 / P.window_ms * P.window_ms;
        fill(&mut s, start + 59_999, 10);
        let now = start + 60_000;
        let o = SlidingCounter::decide(&mut s, &P, now);
        assert!(!o.allowed);
        let t = o.retry_after_ms;
        let mut probe = s.clone();
        assert!(!SlidingCounter::decide(&mut probe, &P, now + t - 1).allowed);
        let mut probe = s.clone();
        assert!(
            SlidingCounter::decide(&mut probe, &P, now + t).allowed,
            "retry after {t}"
        );
    }

    #[test]
    fn retry_after_crosses_into_the_next_window_when_this_one_is_full() {
        let mut s = SlidingCounterState::default();
        let start = 1_700_000_040_000 / P.window_ms * P.window_ms;
        fill(&mut s, start + 1_000, 10);
        let now = start + 2_000;
        let o = SlidingCounter::decide(&mut s, &P, now);
        let t = o.retry_after_ms;
        let mut probe = s.clone();
        assert!(!SlidingCounter::decide(&mut probe, &P, now + t - 1).allowed);
        let mut probe = s.clone();
        assert!(
            SlidingCounter::decide(&mut probe, &P, now + t).allowed,
            "retry after {t}"
        );
    }
}
