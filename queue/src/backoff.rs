//! Retry backoff: pure math, no I/O, no clock. The worker draws the jitter and passes it in.

use std::time::Duration;

/// Exponential backoff settings of a queue.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    /// Wait after the first failed attempt.
    pub base: Duration,
    /// Longest wait.
    pub cap: Duration,
    /// Growth per attempt (≥ 1).
    pub multiplier: f64,
}

impl Backoff {
    /// The wait before retrying after failed attempt `attempt` (1-based), with "equal jitter": the
    /// exponential step `min(cap, base × multiplier^(attempt-1))` is split in a fixed half and a half scaled
    /// by `jitter` ∈ [0, 1). So waits never shrink below half the step (no thundering retry at 0 ms) and
    /// workers that failed together spread out over the other half.
    pub fn delay(&self, attempt: u32, jitter: f64) -> Duration {
        let step = self.step(attempt).as_secs_f64();
        let jitter = jitter.clamp(0.0, 1.0);
        Duration::from_secs_f64(step / 2.0 + step / 2.0 * jitter)
    }

    /// The exponential step without jitter: `min(cap, base × multiplier^(attempt-1))`.
    pub fn step(&self, attempt: u32) -> Duration {
        let exp = attempt.saturating_sub(1).min(1000) as i32;
        let raw = self.base.as_secs_f64() * self.multiplier.max(1.0).powi(exp);
        let capped = if raw.is_finite() {
            raw.min(self.cap.as_secs_f64())
        } else {
            self.cap.as_secs_f64()
        };
        Duration::from_secs_f64(capped.max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Backoff {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
            multiplier: 2.0,
        }
    }

    #[test]
    fn steps_grow_by_the_multiplier_until_the_cap() {
        let b = policy();
        let steps: Vec<u64> = (1..=8).map(|n| b.step(n).as_secs()).collect();
        assert_eq!(steps, vec![1, 2, 4, 8, 16, 32, 60, 60]);
    }

    #[test]
    fn jitter_spreads_each_wait_over_the_upper_half_of_its_step() {
        let b = policy();
        assert_eq!(b.delay(3, 0.0), Duration::from_secs(2));
        assert_eq!(b.delay(3, 1.0), Duration::from_secs(4));
        assert_eq!(b.delay(3, 0.5), Duration::from_secs(3));
    }

    #[test]
    fn huge_attempt_numbers_stay_at_the_cap() {
        let b = policy();
        assert_eq!(b.step(u32::MAX), Duration::from_secs(60));
        assert!(b.delay(10_000, 0.99) <= Duration::from_secs(60));
    }

    #[test]
    fn a_multiplier_below_one_is_treated_as_constant_backoff() {
        let b = Backoff {
            multiplier: 0.5,
            ..policy()
        };
        assert_eq!(b.step(5), Duration::from_secs(1));
    }
}
