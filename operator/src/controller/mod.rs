//! Controllers. Each has the same shape: `reconcile(object, ctx) -> Result<Action>` and
//! `error_policy(object, error, ctx) -> Action`, plus a `run` that wires the watches.
//!
//! Shared here: the [`Context`] handed to every reconcile, per-object exponential [`Backoff`] (kube-rs
//! has none built in, kube-rs/kube#1916), and setting [`conditions`].

pub mod conditions;
pub mod job_queue;
pub mod rate_limit_policy;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use kube::{
    Client,
    runtime::events::{Recorder, Reporter},
};

use crate::{metrics::Metrics, redis::Publisher};

/// The wall clock in Unix milliseconds; injected so tests can move time.
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

/// What every reconcile needs.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Redis clients for publishing config and reading reports.
    pub publisher: Publisher,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Publishes Events on the objects reconciled.
    pub recorder: Recorder,
    /// Per-object error backoff.
    pub backoff: Backoff,
    /// Wall clock (Unix ms), for report freshness and condition times.
    pub clock: Clock,
    /// When each policy generation was first published, to tell "still propagating" from "lagging".
    pub published: Mutex<HashMap<(String, String), Published>>,
}

/// A generation the controller published, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The policy generation.
    pub generation: i64,
    /// First published at (Unix ms).
    pub first_ms: i64,
    /// Last published at (Unix ms); republished now and then in case Redis lost the key.
    pub last_ms: i64,
}

impl Context {
    /// A context for the real cluster.
    pub fn new(client: Client, metrics: Arc<Metrics>, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: crate::FIELD_MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            publisher: Publisher::default(),
            metrics,
            backoff: Backoff::default(),
            clock: system_clock(),
            published: Mutex::default(),
        }
    }
}

/// Per-object exponential backoff: 1 s, 2 s, 4 s … up to [`Backoff::MAX`], reset by a success.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// First retry delay.
    pub const BASE: Duration = Duration::from_secs(1);
    /// Longest retry delay.
    pub const MAX: Duration = Duration::from_secs(300);

    /// Record a failure of `key` and return how long to wait before retrying.
    pub fn next(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_owned()).or_insert(0);
        let delay = Self::BASE
            .checked_mul(1u32.checked_shl(*n).unwrap_or(u32::MAX))
            .unwrap_or(Self::MAX)
            .min(Self::MAX);
        *n = n.saturating_add(1);
        delay
    }

    /// Forget the failures of `key` after a success.
    pub fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_object_caps_and_resets_on_success() {
        let b = Backoff::default();
        let delays: Vec<u64> = (0..12).map(|_| b.next("shop/api").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(
            b.next("shop/other").as_secs(),
            1,
            "objects back off independently"
        );
        b.reset("shop/api");
        assert_eq!(b.next("shop/api").as_secs(), 1);
    }
}
