//! The operator's wall clock, injected so tests can move time: controllers (condition times, report
//! freshness, cooldowns), certificate rotation and the external metrics API all read it.

use std::sync::Arc;

/// The wall clock in Unix milliseconds.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The real wall clock.
pub fn system_clock() -> Clock {
    Arc::new(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
    })
}
