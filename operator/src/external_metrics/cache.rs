//! A small map whose entries expire, for authentication and authorization answers. Bounded: when full,
//! expired entries are dropped, and if none are, the one closest to expiring (never everything: a flood
//! of new keys must not flush the answers every other caller relies on).

use std::{
    collections::HashMap,
    hash::Hash,
    sync::Mutex,
    time::{Duration, Instant},
};

/// Entries that expire after the time-to-live each was inserted with.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// An empty cache holding at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::default(),
            capacity,
        }
    }

    /// The value of `key`, unless it expired.
    pub fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(expires, _)| Instant::now() < *expires)
            .map(|(_, v)| v.clone())
    }

    /// Keeps `value` for `ttl`.
    pub fn insert(&self, key: K, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.capacity {
            let now = Instant::now();
            entries.retain(|_, (expires, _)| now < *expires);
            if entries.len() >= self.capacity
                && let Some(soonest) = entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(k, _)| k.clone())
            {
                entries.remove(&soonest);
            }
        }
        entries.insert(key, (Instant::now() + ttl, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_the_cache_stays_bounded() {
        let cache = TtlCache::new(2);
        cache.insert("a", 1, Duration::from_secs(60));
        cache.insert("gone", 0, Duration::ZERO);
        assert_eq!(cache.get(&"a"), Some(1));
        assert_eq!(cache.get(&"gone"), None, "a zero TTL is not cached");
        cache.insert("b", 2, Duration::from_secs(60));
        cache.insert("c", 3, Duration::from_secs(60));
        assert_eq!(cache.get(&"c"), Some(3));
        assert!(cache.entries.lock().unwrap().len() <= 2);
    }

    #[test]
    fn a_full_cache_drops_the_entry_closest_to_expiring_not_everything() {
        let cache = TtlCache::new(3);
        cache.insert("allowed", 1, Duration::from_secs(600));
        cache.insert("soon", 2, Duration::from_secs(5));
        cache.insert("later", 3, Duration::from_secs(60));
        cache.insert("new", 4, Duration::from_secs(60));
        assert_eq!(cache.get(&"soon"), None, "the one closest to expiring made room");
        for (k, v) in [("allowed", 1), ("later", 3), ("new", 4)] {
            assert_eq!(cache.get(&k), Some(v), "{k}");
        }
    }
}
