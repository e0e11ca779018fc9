//! Bounds on the endpoints (Redis servers, PostgreSQL databases) the operator connects to because a
//! namespace named them.
//!
//! Every distinct URL in a RateLimitPolicy's or JobQueue's Secret gets a Redis client, a connection pool
//! and a `LISTEN` connection of the operator's. Without a bound, one namespace creating thousands of
//! objects with distinct URLs could exhaust the operator (every replica serves the webhook, so injection
//! would flap cluster-wide) and make it connect to hosts from its own network position. So each kind of
//! endpoint has a [`Budget`]: at most `per_namespace` distinct endpoints in use by one namespace and
//! `total` in all, each released when no object has used it for `idle` (its connections are then closed
//! by the owner). An object over the budget is not connected; its status says why
//! ([`crate::Error::TooManyEndpoints`]).
//!
//! Endpoints are keyed by a hash of the URL, never the URL itself (it carries passwords).

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::{Duration, Instant},
};

/// A stable, non-secret key for an endpoint URL (16 hex digits of its SHA-256).
pub fn endpoint_key(url: &str) -> String {
    crate::digest::short_hash(url.as_bytes(), 8)
}

/// Distinct endpoints of one kind one namespace may have in use, by default.
pub const PER_NAMESPACE_DEFAULT: usize = 8;
/// Distinct endpoints of one kind in use in all, by default.
pub const TOTAL_DEFAULT: usize = 256;
/// How long an endpoint no object has used stays open, by default.
pub const IDLE_DEFAULT: Duration = Duration::from_secs(600);

/// Why an endpoint was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exceeded {
    /// The namespace has this many distinct endpoints in use already.
    Namespace(usize),
    /// The operator has this many in use already.
    Total(usize),
}

#[derive(Debug)]
struct Entry {
    namespaces: HashSet<String>,
    last_used: Instant,
}

/// The endpoints of one kind in use, by key, with who uses them. See the module docs.
#[derive(Debug)]
pub struct Budget {
    /// Most distinct endpoints one namespace may use.
    pub per_namespace: usize,
    /// Most distinct endpoints in all.
    pub total: usize,
    /// How long an unused endpoint is kept.
    pub idle: Duration,
    entries: Mutex<HashMap<String, Entry>>,
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(PER_NAMESPACE_DEFAULT, TOTAL_DEFAULT, IDLE_DEFAULT)
    }
}

impl Budget {
    /// A budget with these bounds.
    pub fn new(per_namespace: usize, total: usize, idle: Duration) -> Self {
        Self {
            per_namespace,
            total,
            idle,
            entries: Mutex::default(),
        }
    }

    /// Records that `namespace` uses endpoint `key` at `now`, if the bounds allow. Also returns the
    /// keys of endpoints nobody used for `idle`, now released: the caller closes their connections.
    pub fn admit(&self, namespace: &str, key: &str, now: Instant) -> (Result<(), Exceeded>, Vec<String>) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let idle = self.idle;
        let released: Vec<String> = entries
            .iter()
            .filter(|(k, e)| k.as_str() != key && now.saturating_duration_since(e.last_used) >= idle)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &released {
            entries.remove(k);
        }
        let in_namespace = entries
            .values()
            .filter(|e| e.namespaces.contains(namespace))
            .count();
        let in_all = entries.len();
        let result = match entries.get_mut(key) {
            Some(e) if e.namespaces.contains(namespace) => {
                e.last_used = now;
                Ok(())
            }
            Some(_) if in_namespace >= self.per_namespace => Err(Exceeded::Namespace(in_namespace)),
            Some(e) => {
                e.namespaces.insert(namespace.to_owned());
                e.last_used = now;
                Ok(())
            }
            None if in_namespace >= self.per_namespace => Err(Exceeded::Namespace(in_namespace)),
            None if in_all >= self.total => Err(Exceeded::Total(in_all)),
            None => {
                entries.insert(
                    key.to_owned(),
                    Entry {
                        namespaces: HashSet::from([namespace.to_owned()]),
                        last_used: now,
                    },
                );
                Ok(())
            }
        };
        (result, released)
    }

    /// Whether endpoint `key` is in use (admitted and not released).
    pub fn contains(&self, key: &str) -> bool {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }

    /// Endpoints in use.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no endpoint is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_gets_at_most_its_share_and_a_shared_endpoint_counts_once_in_all() {
        let b = Budget::new(2, 3, Duration::from_secs(60));
        let t = Instant::now();
        assert_eq!(b.admit("a", "x", t).0, Ok(()));
        assert_eq!(b.admit("a", "y", t).0, Ok(()));
        assert_eq!(b.admit("a", "x", t).0, Ok(()), "an endpoint in use is used again");
        assert_eq!(b.admit("a", "z", t).0, Err(Exceeded::Namespace(2)));
        assert_eq!(
            b.admit("b", "x", t).0,
            Ok(()),
            "another namespace on a shared endpoint"
        );
        assert_eq!(b.len(), 2);
        assert_eq!(b.admit("b", "z", t).0, Ok(()));
        assert_eq!(b.admit("c", "w", t).0, Err(Exceeded::Total(3)));
    }

    #[test]
    fn endpoints_nobody_used_for_the_idle_time_are_released_for_closing() {
        let b = Budget::new(1, 10, Duration::from_secs(60));
        let t = Instant::now();
        assert_eq!(b.admit("a", "x", t).0, Ok(()));
        let (r, released) = b.admit("a", "y", t + Duration::from_secs(30));
        assert_eq!((r, released), (Err(Exceeded::Namespace(1)), vec![]));
        let (r, released) = b.admit("a", "y", t + Duration::from_secs(61));
        assert_eq!(r, Ok(()), "x went idle, so the namespace has room again");
        assert_eq!(released, vec!["x".to_owned()]);
        assert!(!b.contains("x") && b.contains("y"));
    }
}
