//! Bounded in-process state: the buckets of the local fallback and of Redis-less runs.
//!
//! A hard cap on buckets (`localMaxKeys`), split over shards so requests for different keys rarely share a
//! lock. Only idle buckets are evicted (a bucket is idle when it holds nothing a fresh one would not, so
//! eviction never hands an abuser a fresh quota early). When a shard is full of active buckets, a new key
//! is decided by its rule's shared overflow bucket (the rule's limit for all such clients together): new
//! clients stay limited and memory stays bounded. Evictions and overflow decisions are counted.
//!
//! Under `failureMode: local` a key's bucket starts from what Redis last said for it
//! ([`super::last_said`]): of the requests Redis had left, this pod's share (÷ the enforcing pods) is
//! left to the bucket and the rest of its per-pod limit is spent at once. A bucket seen again after Redis
//! answered for its key since it started (a later outage in the same window) starts again from the newer
//! answer, which counts what the bucket allowed (carried over before Redis decided again).

use std::{
    collections::HashMap,
    sync::{
        Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
};

use sluice_crds::sidecar_config::Algorithm as AlgorithmKind;

use super::{
    algorithm::{LocalState, Outcome, Params},
    key::KeyHash,
    last_said::Said,
    metrics::Metrics,
};

/// Shards of the map; a power of two.
const SHARDS: usize = 16;
/// After a sweep of a full shard found nothing idle, the shard is not swept again for this long (clock ms),
/// so a flood of new keys does not turn every request into a scan.
const SWEEP_BACKOFF_MS: u64 = 100;

#[derive(Debug)]
struct Entry {
    state: LocalState,
    params: Params,
    /// The version of Redis's answer the bucket started from (`None`: it started from zero).
    seeded_from: Option<u64>,
}

#[derive(Debug, Default)]
struct Shard {
    /// By rule scope id, algorithm, key hash and window length, as in [`super::last_said`]: two rules
    /// never share a bucket, even for key values ground to collide in the hash, and a rule whose
    /// algorithm changed starts another bucket, as it starts another Redis counter (the old bucket stays
    /// until evicted, as the old counter stays in Redis until it expires).
    map: HashMap<(u64, AlgorithmKind, KeyHash, u64), Entry>,
    next_sweep: u64,
}

/// In-process buckets under a hard cap.
#[derive(Debug)]
pub struct LocalStore {
    shards: Vec<Mutex<Shard>>,
    overflow: Mutex<HashMap<(String, u64), Entry>>,
    cap: AtomicUsize,
    metrics: Metrics,
}

impl LocalStore {
    /// A store holding at most `cap` buckets (plus one overflow bucket per rule).
    pub fn new(cap: usize, metrics: Metrics) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            overflow: Mutex::default(),
            cap: AtomicUsize::new(cap),
            metrics,
        }
    }

    /// Changes the cap; a smaller cap is reached as idle buckets are evicted on insert.
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Relaxed);
    }

    /// Buckets held (overflow buckets not included).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Whether no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Decides one request for counter `key` of rule `rule` (scope id `scope`), counted by `kind`.
    pub fn decide(
        &self,
        rule: &str,
        scope: u64,
        key: &KeyHash,
        kind: AlgorithmKind,
        p: Params,
        now: u64,
    ) -> Outcome {
        self.decide_from(rule, scope, key, kind, p, now, None, 1)
    }

    /// Decides one request of the local fallback for counter `key` of rule `rule` (`p`: the per-pod
    /// share of `replicas`): as [`decide`](Self::decide), but the key's bucket starts from `said`, what
    /// Redis last said for the key, when that answer still applies and is newer than the one the bucket
    /// started from: `said.remaining ÷ replicas` requests are left to it.
    #[allow(clippy::too_many_arguments)]
    pub fn decide_from(
        &self,
        rule: &str,
        scope: u64,
        key: &KeyHash,
        kind: AlgorithmKind,
        p: Params,
        now: u64,
        said: Option<Said>,
        replicas: u32,
    ) -> Outcome {
        let said = said.filter(|s| s.applies(kind, p.window_ms, now));
        let budget = |s: Said| s.remaining / u64::from(replicas.max(1));
        let index = usize::from(key[0]) % SHARDS;
        let cap = self.shard_cap(index);
        let mut shard = lock(&self.shards[index]);
        let k = (scope, kind, *key, p.window_ms);
        if let Some(e) = shard.map.get_mut(&k) {
            e.params = p;
            if let Some(s) = said.filter(|s| e.seeded_from.is_none_or(|v| s.version > v)) {
                e.state = seeded(kind, &p, budget(s), now);
                e.seeded_from = Some(s.version);
            }
            return e.state.decide(kind, &p, now);
        }
        if shard.map.len() >= cap && now >= shard.next_sweep {
            let before = shard.map.len();
            shard.map.retain(|_, e| !e.state.is_idle(&e.params, now));
            let evicted = before - shard.map.len();
            if evicted == 0 {
                shard.next_sweep = now + SWEEP_BACKOFF_MS;
            }
            self.metrics.local_evictions.inc_by(evicted as u64);
            self.metrics.local_buckets.dec_by(evicted as i64);
        }
        if shard.map.len() < cap {
            let mut state = match said {
                Some(s) => seeded(kind, &p, budget(s), now),
                None => LocalState::new(kind),
            };
            let outcome = state.decide(kind, &p, now);
            shard.map.insert(
                k,
                Entry {
                    state,
                    params: p,
                    seeded_from: said.map(|s| s.version),
                },
            );
            self.metrics.local_buckets.inc();
            return outcome;
        }
        drop(shard);
        self.metrics.local_overflow.inc();
        let mut overflow = lock(&self.overflow);
        let e = overflow
            .entry((rule.to_owned(), p.window_ms))
            .or_insert_with(|| Entry {
                state: LocalState::new(kind),
                params: p,
                seeded_from: None,
            });
        e.params = p;
        e.state.decide(kind, &p, now)
    }

    /// This shard's share of the cap; the shares add up to the cap exactly.
    fn shard_cap(&self, index: usize) -> usize {
        let cap = self.cap.load(Ordering::Relaxed);
        cap / SHARDS + usize::from(index < cap % SHARDS)
    }
}

/// A fresh bucket of `kind` for `p` with `budget` requests left at `now`: the hits a fresh bucket would
/// allow beyond the budget are spent at `now` (one decision each, at most the bucket's capacity).
fn seeded(kind: AlgorithmKind, p: &Params, budget: u64, now: u64) -> LocalState {
    let mut state = LocalState::new(kind);
    // What a fresh bucket allows at once: the first decision's remaining, plus that decision.
    let capacity = LocalState::new(kind).decide(kind, p, now).remaining + 1;
    for _ in 0..capacity.saturating_sub(budget) {
        if !state.decide(kind, p, now).allowed {
            break;
        }
    }
    state
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a bucket lock leaves at worst one bucket half-updated; keep serving.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        requests: 2,
        window_ms: 1_000,
        burst: 0,
    };

    /// Scope id of rule `r`.
    const R: u64 = 1;

    fn key(i: u32) -> KeyHash {
        let mut k = [0u8; 16];
        k[..4].copy_from_slice(&i.to_le_bytes());
        k
    }

    #[test]
    fn cap_holds_and_only_idle_buckets_are_evicted() {
        let m = Metrics::unregistered();
        let store = LocalStore::new(64, m.clone());
        let t0 = 1_700_000_000_000;
        for i in 0..1000 {
            store.decide("r", R, &key(i), AlgorithmKind::FixedWindow, P, t0);
        }
        assert!(store.len() <= 64);
        assert_eq!(m.local_evictions.get(), 0, "active buckets must not be evicted");
        assert!(m.local_overflow.get() >= 1000 - 64);
        // A window later every bucket is idle: new keys evict them.
        for i in 1000..1100 {
            store.decide("r", R, &key(i), AlgorithmKind::FixedWindow, P, t0 + 1_000);
        }
        assert!(store.len() <= 64);
        assert!(m.local_evictions.get() > 0);
        assert_eq!(m.local_buckets.get() as usize, store.len());
    }

    #[test]
    fn clients_past_the_cap_share_their_rules_overflow_bucket() {
        let store = LocalStore::new(0, Metrics::unregistered());
        let t0 = 1_700_000_000_000;
        let allowed = (0..10)
            .filter(|i| {
                store
                    .decide("r", R, &key(*i), AlgorithmKind::FixedWindow, P, t0)
                    .allowed
            })
            .count();
        assert_eq!(allowed, 2);
    }

    #[test]
    fn an_active_abuser_keeps_its_bucket_while_others_come_and_go() {
        let store = LocalStore::new(16, Metrics::unregistered());
        let t0 = 1_700_000_000_000;
        let tb = Params {
            requests: 1,
            window_ms: 60_000,
            burst: 0,
        };
        let abuser = key(u32::MAX);
        assert!(
            store
                .decide("r", R, &abuser, AlgorithmKind::TokenBucket, tb, t0)
                .allowed
        );
        for i in 0..10_000 {
            store.decide(
                "r",
                R,
                &key(i),
                AlgorithmKind::TokenBucket,
                tb,
                t0 + 1 + u64::from(i),
            );
        }
        assert!(
            !store
                .decide("r", R, &abuser, AlgorithmKind::TokenBucket, tb, t0 + 30_000)
                .allowed
        );
    }

    #[test]
    fn two_rules_never_share_a_bucket_even_for_one_key_hash() {
        let store = LocalStore::new(64, Metrics::unregistered());
        let t0 = 1_700_000_000_000;
        let fw = AlgorithmKind::FixedWindow;
        // A hash two rules share: only a 2^64 search could find one, so it is set here.
        let shared = key(7);
        assert!(store.decide("r", R, &shared, fw, P, t0).allowed);
        assert!(store.decide("r", R, &shared, fw, P, t0).allowed);
        assert!(!store.decide("r", R, &shared, fw, P, t0).allowed);
        assert!(
            store.decide("other", R + 1, &shared, fw, P, t0).allowed,
            "another rule's bucket"
        );
    }

    #[test]
    fn a_reload_that_changes_only_the_algorithm_starts_another_bucket_and_keeps_the_old_one() {
        let store = LocalStore::new(64, Metrics::unregistered());
        let t0 = 1_700_000_000_000;
        let (fw, sc) = (AlgorithmKind::FixedWindow, AlgorithmKind::SlidingCounter);
        let k = key(7);
        assert!(store.decide("r", R, &k, fw, P, t0).allowed);
        assert!(store.decide("r", R, &k, fw, P, t0).allowed);
        assert!(!store.decide("r", R, &k, fw, P, t0).allowed);
        // The rule now counts by another algorithm, on a new Redis counter: a bucket of its own.
        let o = store.decide("r", R, &k, sc, P, t0);
        assert!(o.allowed && o.remaining == 1, "{o:?}");
        // Changed back within the window, Redis's fixed-window counter is still spent, and so is the bucket.
        assert!(!store.decide("r", R, &k, fw, P, t0).allowed);
    }
}
