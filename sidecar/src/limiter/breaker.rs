//! The circuit breaker in front of Redis: after `breakerFailures` consecutive failed calls it opens, and
//! while it is open no request calls Redis at all (the failure mode decides at once). A background probe
//! (PING with the call deadline, every `breakerCooldown`) closes it again when Redis answers. It starts
//! open: a limiter is usable before Redis is.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use prometheus_client::metrics::gauge::Gauge;

/// Consecutive-failure circuit breaker. Lock-free: the hot path reads one atomic.
#[derive(Debug)]
pub struct Breaker {
    open: AtomicBool,
    failures: AtomicU32,
    gauge: Gauge,
}

impl Breaker {
    /// An open breaker (Redis not yet known to answer); `gauge` mirrors its state.
    pub fn new_open(gauge: Gauge) -> Self {
        gauge.set(1);
        Self {
            open: AtomicBool::new(true),
            failures: AtomicU32::new(0),
            gauge,
        }
    }

    /// Whether calls must stay away from Redis.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// A call succeeded.
    pub fn record_success(&self) {
        // Only write when there is something to reset: keeps the cache line shared on the hot path.
        if self.failures.load(Ordering::Relaxed) != 0 {
            self.failures.store(0, Ordering::Relaxed);
        }
    }

    /// A call failed; opens the breaker at `threshold` consecutive failures. Returns whether this call
    /// opened it.
    pub fn record_failure(&self, threshold: u32) -> bool {
        let n = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        n >= threshold.max(1) && self.open()
    }

    /// Opens the breaker; returns whether it was closed.
    pub fn open(&self) -> bool {
        let was_open = self.open.swap(true, Ordering::AcqRel);
        self.gauge.set(1);
        !was_open
    }

    /// Closes the breaker (a probe succeeded).
    pub fn close(&self) {
        self.failures.store(0, Ordering::Release);
        self.open.store(false, Ordering::Release);
        self.gauge.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = Breaker::new_open(Gauge::default());
        assert!(b.is_open());
        b.close();
        assert!(!b.record_failure(3));
        assert!(!b.record_failure(3));
        b.record_success();
        assert!(!b.record_failure(3));
        assert!(!b.record_failure(3));
        assert!(!b.is_open());
        assert!(b.record_failure(3));
        assert!(b.is_open());
        assert!(!b.record_failure(3), "already open");
        b.close();
        assert!(!b.is_open());
    }
}
