//! Sliding-window log: the admission time of every counted request in a sorted set. Exact: a request at
//! `t` is allowed when fewer than `limit` requests were admitted in `(t − W, t]`. Memory grows with the
//! limit (one member per admitted request per key). Members carry a per-limiter random id and a sequence
//! number, so requests of two sidecars in the same millisecond never collapse into one member.

use std::collections::VecDeque;

use super::{Algorithm, Call, EXPIRY_GRACE_MS, Hits, Outcome, Params, Unique, count};

/// Sliding-log counting.
#[derive(Debug)]
pub struct SlidingLog;

/// In-process log: admission times, ascending.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SlidingLogState {
    times: VecDeque<u64>,
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    const NAME: &'static str = "sliding_log";
    const KEY_TAG: &'static str = "sl";
    const LUA: &'static str = include_str!("../scripts/sliding_log.lua");

    fn call(base: &str, p: &Params, now: u64, unique: Unique, hits: Hits) -> Call {
        Call {
            keys: vec![format!("{base}:{}:{}", Self::KEY_TAG, p.window_ms)],
            args: vec![
                now.to_string(),
                p.window_ms.to_string(),
                p.requests.to_string(),
                format!("{now}:{:x}:{:x}", unique.instance, unique.seq),
                (p.window_ms + EXPIRY_GRACE_MS).to_string(),
                hits.total().to_string(),
            ],
        }
    }

    fn nth(_: &Params, reply: &[i64], i: u64) -> Option<Vec<i64>> {
        let [allowed, used, freeing, newest] = *reply else {
            return None;
        };
        Some(if i < count(allowed) {
            vec![1, used - (allowed - 1 - i as i64), 0, newest]
        } else {
            vec![0, used, freeing, newest]
        })
    }

    fn outcome(p: &Params, now: u64, reply: &[i64]) -> Option<Outcome> {
        let [allowed, used, freeing, newest] = *reply else {
            return None;
        };
        let allowed = allowed == 1;
        Some(Outcome {
            allowed,
            remaining: p.requests.saturating_sub(count(used)),
            reset_ms: (count(newest) + p.window_ms).saturating_sub(now),
            retry_after_ms: if allowed {
                0
            } else {
                (count(freeing) + p.window_ms).saturating_sub(now).max(1)
            },
        })
    }

    fn decide_raw(state: &mut Self::State, p: &Params, now: u64) -> Vec<i64> {
        if let Some(cutoff) = now.checked_sub(p.window_ms) {
            while state.times.front().is_some_and(|&t| t <= cutoff) {
                state.times.pop_front();
            }
        }
        let used = state.times.len() as u64;
        if used < p.requests {
            let at = state.times.partition_point(|&t| t <= now);
            state.times.insert(at, now);
            let newest = *state.times.back().expect("just inserted");
            return vec![1, used as i64 + 1, 0, newest as i64];
        }
        let freeing = state.times[(used - p.requests) as usize];
        let newest = *state.times.back().expect("log is full");
        vec![0, used as i64, freeing as i64, newest as i64]
    }

    /// Never: an entry written early would expire early and let requests over the limit.
    fn prefetch_until(_: &Params, _: u64) -> Option<u64> {
        None
    }

    fn is_idle(state: &Self::State, p: &Params, now: u64) -> bool {
        state.times.back().is_none_or(|&t| t + p.window_ms <= now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        requests: 3,
        window_ms: 60_000,
        burst: 0,
    };

    #[test]
    fn a_request_leaves_the_window_exactly_one_window_after_it_was_admitted() {
        let mut s = SlidingLogState::default();
        let t0 = 1_700_000_000_000;
        for i in 0..3 {
            assert!(SlidingLog::decide(&mut s, &P, t0 + i).allowed);
        }
        let o = SlidingLog::decide(&mut s, &P, t0 + P.window_ms - 1);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ms, 1);
        assert!(SlidingLog::decide(&mut s, &P, t0 + P.window_ms).allowed);
        assert!(!SlidingLog::decide(&mut s, &P, t0 + P.window_ms).allowed);
        assert!(SlidingLog::decide(&mut s, &P, t0 + P.window_ms + 1).allowed);
    }

    #[test]
    fn a_lowered_limit_waits_for_enough_entries_to_leave() {
        let mut s = SlidingLogState::default();
        let t0 = 1_700_000_000_000;
        for i in 0..3 {
            SlidingLog::decide(&mut s, &P, t0 + i * 1000);
        }
        let lower = Params { requests: 1, ..P };
        let o = SlidingLog::decide(&mut s, &lower, t0 + 5000);
        assert!(!o.allowed);
        // All three must leave before one fits: the last leaves at t0 + 2000 + W.
        assert_eq!(o.retry_after_ms, 2000 + P.window_ms - 5000);
    }

    #[test]
    fn members_are_unique_per_instance_and_sequence() {
        let a = SlidingLog::call("b", &P, 5, Unique { instance: 1, seq: 7 }, 1.into());
        let b = SlidingLog::call("b", &P, 5, Unique { instance: 2, seq: 7 }, 1.into());
        assert_ne!(a.args[3], b.args[3]);
    }
}
