//! Waiting for a condition with a deadline. Tests never sleep to wait: they poll what they wait for and fail
//! with a message naming it when the deadline passes.

use std::{
    future::Future,
    thread,
    time::{Duration, Instant},
};

/// How often a condition is polled; short, so a test waits no longer than it must.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Polls `cond` until it returns `Some`, and returns that value; panics naming `what` after `deadline`.
pub fn wait_for<T>(what: &str, deadline: Duration, mut cond: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = cond() {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        thread::sleep(POLL_INTERVAL);
    }
}

/// Async form of [`wait_for`]: awaits `cond()` until it yields `Some`; panics naming `what` after `deadline`.
pub async fn wait_for_async<T, F, Fut>(what: &str, deadline: Duration, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_for_returns_the_value_once_the_condition_holds() {
        let mut n = 0;
        let got = wait_for("n to reach 3", Duration::from_secs(1), || {
            n += 1;
            (n >= 3).then_some(n)
        });
        assert_eq!(got, 3);
    }

    #[test]
    #[should_panic(expected = "waiting for the impossible")]
    fn wait_for_panics_naming_what_it_waited_for() {
        wait_for::<()>("the impossible", Duration::from_millis(20), || None);
    }
}
