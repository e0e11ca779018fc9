//! What Redis last said for each key: the requests it had left when it last decided one of this pod's
//! requests. When Redis stops answering, `failureMode: local` starts a key's in-process bucket from it
//! (its share of what was left, see [`super::local`]) instead of from zero, so a window split by an
//! outage does not allow what Redis counted before it plus a whole local share after it.
//!
//! An answer is remembered under its rule's scope id ([`KeySpec::scope_id`](super::key::KeySpec::scope_id))
//! and algorithm as well as the key hash and window, as the coalescer's counter id (`remote::CounterId`)
//! names a counter:
//! - the hash covers the rule, but it is 128 bits of a digest of values clients pick, and two rules'
//!   values could be ground to collide in it; the scope id is made of the operator's names, so one rule's
//!   answers never start another rule's buckets;
//! - a rule whose algorithm changed counts on another Redis counter (another key type and tag), which
//!   starts fresh: an answer about the old counter says nothing about the new one, so it starts no bucket
//!   of the new algorithm (and the old algorithm's answer is still there if a reload changes it back).
//!
//! Bounded like the local store (`localMaxKeys` keys, in shards): when a shard is full, answers that can
//! no longer seed anything (older than their window) are dropped first; past that, new keys are not
//! remembered (counted in `last_said_unnoted_total`) and their buckets start from zero.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, PoisonError},
};

use sluice_crds::sidecar_config::Algorithm as AlgorithmKind;

use super::key::KeyHash;

/// Shards of the map (as the local store's).
const SHARDS: usize = 16;

/// One answer of Redis for one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Said {
    /// Requests Redis had left for the key after the request it decided (0 when it refused it).
    pub remaining: u64,
    /// When it decided (limiter clock, ms).
    pub at: u64,
    /// Increases with every answer remembered for the key (many can share a millisecond): a bucket
    /// started from an answer starts again only from a later one.
    pub version: u64,
}

impl Said {
    /// Whether this answer still bounds what the key may do at `now`: for a fixed window, only within the
    /// same aligned window (a new one starts from zero); for the sliding algorithms and the token bucket,
    /// for one window after it (room only grows as hits leave the window or tokens refill, so an older
    /// answer is stricter than Redis would be, never looser).
    pub fn applies(&self, kind: AlgorithmKind, window_ms: u64, now: u64) -> bool {
        let window_ms = window_ms.max(1);
        match kind {
            AlgorithmKind::FixedWindow => self.at / window_ms == now / window_ms,
            _ => now.saturating_sub(self.at) < window_ms,
        }
    }
}

#[derive(Debug)]
struct Shard {
    /// By rule scope id, algorithm, key hash and window length.
    map: HashMap<(u64, AlgorithmKind, KeyHash, u64), Said>,
    /// The next answer's version (a key always falls in the same shard).
    next: u64,
    /// No answer in `map` is a window old before this (limiter clock, ms; a lower bound): a full shard
    /// refuses a new key without walking its answers until then. With many keys and long windows the
    /// shard stays full for the whole window, and walking it for every new key cost each such request
    /// time in proportion to `localMaxKeys`.
    first_expiry: u64,
}

impl Default for Shard {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            next: 0,
            first_expiry: u64::MAX,
        }
    }
}

/// The last answer of Redis per rule, algorithm, key and window length.
#[derive(Debug)]
pub struct LastSaid {
    shards: Vec<Mutex<Shard>>,
}

impl Default for LastSaid {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl LastSaid {
    /// Remembers that Redis had `remaining` requests left for `key` of the rule with scope id `scope`
    /// counted by `kind` at `now`; `false` when the map is full (`cap` keys) and the key is new.
    #[allow(clippy::too_many_arguments)]
    pub fn record(
        &self,
        scope: u64,
        kind: AlgorithmKind,
        key: &KeyHash,
        window_ms: u64,
        remaining: u64,
        now: u64,
        cap: usize,
    ) -> bool {
        let mut guard = lock(&self.shards[usize::from(key[0]) % SHARDS]);
        let shard = &mut *guard;
        shard.next += 1;
        let said = Said {
            remaining,
            at: now,
            version: shard.next,
        };
        if let Some(slot) = shard.map.get_mut(&(scope, kind, *key, window_ms)) {
            // A later answer moves only this key's expiry later: `first_expiry` stays a lower bound.
            if now >= slot.at {
                *slot = said;
            }
            return true;
        }
        let shard_cap = cap.div_ceil(SHARDS);
        if shard.map.len() >= shard_cap {
            if now < shard.first_expiry {
                return false;
            }
            // Answers older than their window seed nothing any more.
            let mut first_expiry = u64::MAX;
            shard.map.retain(|(_, _, _, w), s| {
                let expiry = s.at.saturating_add((*w).max(1));
                let keep = now < expiry;
                if keep {
                    first_expiry = first_expiry.min(expiry);
                }
                keep
            });
            shard.first_expiry = first_expiry;
            if shard.map.len() >= shard_cap {
                return false;
            }
        }
        shard.first_expiry = shard.first_expiry.min(now.saturating_add(window_ms.max(1)));
        shard.map.insert((scope, kind, *key, window_ms), said);
        true
    }

    /// The last answer for `key` of the rule with scope id `scope` counted by `kind`, if one is
    /// remembered.
    pub fn get(&self, scope: u64, kind: AlgorithmKind, key: &KeyHash, window_ms: u64) -> Option<Said> {
        lock(&self.shards[usize::from(key[0]) % SHARDS])
            .map
            .get(&(scope, kind, *key, window_ms))
            .copied()
    }

    /// Keys remembered.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rule's scope id.
    const RULE: u64 = 1;
    /// The rule's algorithm.
    const FW: AlgorithmKind = AlgorithmKind::FixedWindow;

    fn key(i: u8) -> KeyHash {
        [i; 16]
    }

    #[test]
    fn two_rules_never_see_each_others_answers_even_for_one_key_hash() {
        let said = LastSaid::default();
        // A hash two rules share: only a 2^64 search could find one, so it is set here.
        assert!(said.record(RULE, FW, &key(1), 1_000, 0, 1_100, 32));
        assert_eq!(said.get(RULE + 1, FW, &key(1), 1_000), None);
        assert!(said.record(RULE + 1, FW, &key(1), 1_000, 7, 1_200, 32));
        assert_eq!(said.get(RULE, FW, &key(1), 1_000).unwrap().remaining, 0);
        assert_eq!(said.get(RULE + 1, FW, &key(1), 1_000).unwrap().remaining, 7);
    }

    #[test]
    fn an_answer_about_one_algorithms_counter_is_not_one_about_anothers() {
        let said = LastSaid::default();
        let sc = AlgorithmKind::SlidingCounter;
        // A reload changed only the rule's algorithm: Redis counts it on a new, empty counter.
        assert!(said.record(RULE, FW, &key(1), 1_000, 0, 1_100, 32));
        assert_eq!(said.get(RULE, sc, &key(1), 1_000), None);
        assert!(said.record(RULE, sc, &key(1), 1_000, 9, 1_200, 32));
        // Changed back, the old counter's answer is still its own.
        assert_eq!(said.get(RULE, FW, &key(1), 1_000).unwrap().remaining, 0);
        assert_eq!(said.get(RULE, sc, &key(1), 1_000).unwrap().remaining, 9);
    }

    #[test]
    fn the_latest_answer_per_key_is_kept() {
        let said = LastSaid::default();
        assert!(said.record(RULE, FW, &key(1), 1_000, 7, 1_100, 10));
        assert!(said.record(RULE, FW, &key(1), 1_000, 5, 1_200, 10));
        // An answer that arrives late (an older decision) does not replace a newer one.
        assert!(said.record(RULE, FW, &key(1), 1_000, 6, 1_150, 10));
        let last = said.get(RULE, FW, &key(1), 1_000).unwrap();
        assert_eq!((last.remaining, last.at), (5, 1_200));
        // Answers within one millisecond are told apart by their version.
        assert!(said.record(RULE, FW, &key(1), 1_000, 4, 1_200, 10));
        let newer = said.get(RULE, FW, &key(1), 1_000).unwrap();
        assert_eq!(newer.remaining, 4);
        assert!(newer.version > last.version);
        assert_eq!(said.get(RULE, FW, &key(1), 2_000), None, "another window length");
        assert_eq!(said.get(RULE, FW, &key(2), 1_000), None);
    }

    #[test]
    fn a_full_map_drops_answers_older_than_their_window_then_refuses_new_keys() {
        let said = LastSaid::default();
        // Cap 16: one key a shard (the shard is the key's first byte).
        for i in 0..16 {
            assert!(said.record(RULE, FW, &key(i), 1_000, 1, 1_000, 16));
        }
        assert!(
            !said.record(RULE, FW, &key(16), 1_000, 1, 1_500, 16),
            "shard 0 is full"
        );
        assert!(
            said.record(RULE, FW, &key(16), 1_000, 1, 2_000, 16),
            "key 0's answer is a window old"
        );
        assert_eq!(said.get(RULE, FW, &key(0), 1_000), None);
        assert_eq!(said.len(), 16);
    }

    #[test]
    fn a_full_map_drops_an_answer_once_its_latest_is_a_window_old_and_not_before() {
        let said = LastSaid::default();
        for i in 0..16 {
            assert!(said.record(RULE, FW, &key(i), 1_000, 1, 1_000, 16));
        }
        // Key 0 answered again later: its answer is a window old only at 2_600.
        assert!(said.record(RULE, FW, &key(0), 1_000, 1, 1_600, 16));
        assert!(
            !said.record(RULE, FW, &key(16), 1_000, 1, 2_000, 16),
            "key 0's answer is recent"
        );
        assert!(!said.record(RULE, FW, &key(16), 1_000, 1, 2_599, 16));
        assert!(
            said.record(RULE, FW, &key(16), 1_000, 1, 2_600, 16),
            "now it is a window old"
        );
        assert_eq!(said.get(RULE, FW, &key(0), 1_000), None);
        // A shorter window in the same shard expires first.
        assert!(said.record(RULE, FW, &key(32), 10, 1, 2_600, 32));
        assert!(
            !said.record(RULE, FW, &key(48), 1_000, 1, 2_605, 32),
            "shard 0 is full (cap 2)"
        );
        assert!(
            said.record(RULE, FW, &key(48), 1_000, 1, 2_610, 32),
            "key 32's 10 ms answer lapsed"
        );
        assert_eq!(said.get(RULE, FW, &key(32), 10), None);
    }

    #[test]
    fn an_answer_applies_within_its_fixed_window_or_for_one_sliding_window() {
        let s = Said {
            remaining: 3,
            at: 1_900,
            version: 1,
        };
        assert!(s.applies(AlgorithmKind::FixedWindow, 1_000, 1_999));
        assert!(!s.applies(AlgorithmKind::FixedWindow, 1_000, 2_000));
        assert!(s.applies(AlgorithmKind::SlidingLog, 1_000, 2_899));
        assert!(!s.applies(AlgorithmKind::SlidingLog, 1_000, 2_900));
        assert!(s.applies(AlgorithmKind::TokenBucket, 1_000, 2_000));
    }
}
