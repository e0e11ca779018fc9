//! Requests the local fallback allowed, owed to Redis. While Redis cannot decide, `failureMode: local`
//! counts in process; Redis never sees those requests, so once it answers again it would allow the
//! whole limit once more within the same window (about twice the limit at the transition, more when
//! Redis came back empty after a restart). Each locally allowed request is noted here per rule and key;
//! when Redis answers again the notes of the current window are counted into Redis (the rule's script
//! with that many hits, as if they had just arrived; counted up to the limit), before the breaker lets
//! requests through to Redis.
//!
//! What carries over is the current aligned window's usage (`floor(now / window)`): exact for fixed
//! windows; for the sliding algorithms and the token bucket it is a close, slightly generous bound (hits
//! from the end of the previous window are not carried). The ledger holds at most `localMaxKeys` keys;
//! past that, requests for new keys go unnoted (and are counted).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use super::key::KeyHash;

/// Shards of the ledger (as the local store's).
const SHARDS: usize = 16;

/// What one key owes: requests allowed in process within one window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owed {
    /// Requests allowed.
    pub hits: u64,
    /// The aligned window they fell in (`time / window`).
    pub window: u64,
    /// When the last of them was allowed (limiter clock, ms).
    pub at: u64,
}

/// The rule (by name) and key a note is for.
pub type Noted = (Arc<str>, KeyHash);
/// One note: what a rule's key owes.
pub type Entry = (Noted, Owed);

/// Requests allowed in process and not yet counted in Redis.
#[derive(Debug)]
pub struct Ledger {
    shards: Vec<Mutex<HashMap<Noted, Owed>>>,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Ledger {
    /// Notes one request of `rule` for `key` allowed at `now` in a window of `window_ms`; `false` when
    /// the ledger is full (`cap` keys) and the key is new.
    pub fn note(&self, rule: &Arc<str>, key: &KeyHash, window_ms: u64, now: u64, cap: usize) -> bool {
        let window = now / window_ms.max(1);
        let mut shard = lock(&self.shards[usize::from(key[0]) % SHARDS]);
        if let Some(owed) = shard.get_mut(&(Arc::clone(rule), *key)) {
            if owed.window != window {
                owed.hits = 0;
                owed.window = window;
            }
            owed.hits += 1;
            owed.at = now;
            return true;
        }
        if shard.len() >= cap.div_ceil(SHARDS) {
            // Notes of past windows are worth nothing.
            shard.retain(|_, owed| owed.window == window);
            if shard.len() >= cap.div_ceil(SHARDS) {
                return false;
            }
        }
        shard.insert(
            (Arc::clone(rule), *key),
            Owed {
                hits: 1,
                window,
                at: now,
            },
        );
        true
    }

    /// Whether nothing is owed.
    pub fn is_empty(&self) -> bool {
        self.shards.iter().all(|s| lock(s).is_empty())
    }

    /// Takes every note out of the ledger.
    pub fn take(&self) -> Vec<Entry> {
        self.shards
            .iter()
            .flat_map(|s| std::mem::take(&mut *lock(s)))
            .collect()
    }

    /// Puts back a note that could not be carried over (merged with any taken since).
    pub fn put_back(&self, (key, owed): Entry) {
        let mut shard = lock(&self.shards[usize::from(key.1[0]) % SHARDS]);
        let slot = shard.entry(key).or_insert(Owed { hits: 0, ..owed });
        if slot.window == owed.window {
            slot.hits += owed.hits;
            slot.at = slot.at.max(owed.at);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> KeyHash {
        [i; 16]
    }

    #[test]
    fn notes_count_per_rule_and_key_within_the_current_window() {
        let ledger = Ledger::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        for t in [1_000, 1_100, 1_900] {
            assert!(ledger.note(&a, &key(1), 1_000, t, 100));
        }
        ledger.note(&b, &key(1), 1_000, 1_200, 100);
        // A new window starts the count again.
        ledger.note(&a, &key(2), 1_000, 1_500, 100);
        ledger.note(&a, &key(2), 1_000, 2_100, 100);
        let mut taken = ledger.take();
        taken.sort_by(|x, y| (&x.0.0, x.0.1).cmp(&(&y.0.0, y.0.1)));
        let owed: Vec<_> = taken
            .iter()
            .map(|((r, k), o)| (&**r, k[0], o.hits, o.window, o.at))
            .collect();
        assert_eq!(
            owed,
            [
                ("a", 1, 3, 1, 1_900),
                ("a", 2, 1, 2, 2_100),
                ("b", 1, 1, 1, 1_200)
            ]
        );
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_full_ledger_drops_past_windows_first_then_new_keys() {
        let ledger = Ledger::default();
        let r: Arc<str> = Arc::from("r");
        // One key per shard (the shard is the key's first byte), cap 16: one key a shard.
        for i in 0..16 {
            assert!(ledger.note(&r, &key(i), 1_000, 1_000, 16));
        }
        assert!(!ledger.note(&r, &key(16), 1_000, 1_500, 16), "shard 0 is full");
        assert!(
            ledger.note(&r, &key(16), 1_000, 2_000, 16),
            "key 0's window is over"
        );
    }

    #[test]
    fn a_note_put_back_merges_with_what_came_since() {
        let ledger = Ledger::default();
        let r: Arc<str> = Arc::from("r");
        ledger.note(&r, &key(1), 1_000, 1_100, 10);
        let taken = ledger.take();
        ledger.note(&r, &key(1), 1_000, 1_200, 10);
        ledger.put_back(taken.into_iter().next().unwrap());
        let owed = ledger.take()[0].1;
        assert_eq!((owed.hits, owed.at), (2, 1_200));
    }
}
