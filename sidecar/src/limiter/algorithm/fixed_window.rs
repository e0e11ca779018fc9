//! Fixed window: a counter per window aligned to the Unix epoch (`INCR`, expiry set on the first hit).
//!
//! Window `w` covers `[w·W, (w+1)·W)` ms. Cheapest algorithm; a client may get up to 2× the limit across
//! a window edge (the limit at the end of one window and again at the start of the next).

use super::{Algorithm, Call, EXPIRY_GRACE_MS, Hits, Outcome, Params, Unique, count};

/// Fixed-window counting.
#[derive(Debug)]
pub struct FixedWindow;

/// In-process counter of the current window.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FixedWindowState {
    window: u64,
    count: u64,
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    const NAME: &'static str = "fixed_window";
    const KEY_TAG: &'static str = "fw";
    const LUA: &'static str = include_str!("../scripts/fixed_window.lua");

    fn call(base: &str, p: &Params, now: u64, _: Unique, hits: Hits) -> Call {
        let w = now / p.window_ms;
        let end = (w + 1) * p.window_ms;
        Call {
            keys: vec![format!("{base}:{}:{}:{w}", Self::KEY_TAG, p.window_ms)],
            args: vec![
                p.requests.to_string(),
                (end - now + EXPIRY_GRACE_MS).to_string(),
                hits.total().to_string(),
            ],
        }
    }

    fn nth(_: &Params, reply: &[i64], i: u64) -> Option<Vec<i64>> {
        let [allowed, used] = *reply else { return None };
        Some(if i < count(allowed) {
            vec![1, used - (allowed - 1 - i as i64)]
        } else {
            vec![0, used]
        })
    }

    fn outcome(p: &Params, now: u64, reply: &[i64]) -> Option<Outcome> {
        let [allowed, used] = *reply else { return None };
        let reset_ms = (now / p.window_ms + 1) * p.window_ms - now;
        let allowed = allowed == 1;
        Some(Outcome {
            allowed,
            remaining: p.requests.saturating_sub(count(used)),
            reset_ms,
            retry_after_ms: if allowed { 0 } else { reset_ms },
        })
    }

    fn decide_raw(state: &mut Self::State, p: &Params, now: u64) -> Vec<i64> {
        let w = now / p.window_ms;
        if state.window != w {
            *state = FixedWindowState { window: w, count: 0 };
        }
        if state.count >= p.requests {
            return vec![0, state.count as i64];
        }
        state.count += 1;
        vec![1, state.count as i64]
    }

    /// A hit counted early in its aligned window is counted no later than when it is spent, so every
    /// check sees at least the true count; the end of that window ends it.
    fn prefetch_until(p: &Params, now: u64) -> Option<u64> {
        Some((now / p.window_ms + 1) * p.window_ms)
    }

    fn is_idle(state: &Self::State, p: &Params, now: u64) -> bool {
        state.count == 0 || state.window != now / p.window_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        requests: 3,
        window_ms: 30_000,
        burst: 0,
    };

    fn allowed_at(s: &mut FixedWindowState, now: u64, n: usize) -> usize {
        (0..n).filter(|_| FixedWindow::decide(s, &P, now).allowed).count()
    }

    #[test]
    fn allows_the_limit_up_to_the_last_millisecond_of_a_window_and_again_from_the_next() {
        let mut s = FixedWindowState::default();
        let edge = 1_700_000_010_000 / P.window_ms * P.window_ms + P.window_ms;
        assert_eq!(allowed_at(&mut s, edge - 1, 5), 3);
        assert_eq!(allowed_at(&mut s, edge, 5), 3);
    }

    #[test]
    fn rejection_reports_time_until_the_window_ends() {
        let mut s = FixedWindowState::default();
        let start = 1_700_000_010_000 / P.window_ms * P.window_ms;
        allowed_at(&mut s, start, 3);
        let o = FixedWindow::decide(&mut s, &P, start + 10_000);
        assert!(!o.allowed);
        assert_eq!((o.remaining, o.retry_after_ms, o.reset_ms), (0, 20_000, 20_000));
        assert!(!FixedWindow::is_idle(&s, &P, start + 29_999));
        assert!(FixedWindow::is_idle(&s, &P, start + 30_000));
    }

    #[test]
    fn keys_carry_window_length_and_index_under_the_hash_tag() {
        let c = FixedWindow::call(
            "sluice:{a/b/r/k}",
            &P,
            60_001,
            Unique { instance: 0, seq: 0 },
            1.into(),
        );
        assert_eq!(c.keys, ["sluice:{a/b/r/k}:fw:30000:2"]);
        assert_eq!(c.args, ["3", &(29_999 + EXPIRY_GRACE_MS).to_string(), "1"]);
    }
}
