//! The counting algorithms. Each one has the same shape ([`Algorithm`]): a Lua script that decides in one
//! atomic Redis round trip, and the same math in process (for the local fallback and for Redis-less runs).
//! Both paths end in [`Algorithm::outcome`], which turns the script's raw reply into an [`Outcome`], so the
//! two can be tested against each other step by step.
//!
//! Time is always the caller's clock, passed to the scripts as an argument: windows align across sidecars
//! (wall-clock time) and tests drive Redis-side algorithms with a manual clock. Redis expiries only collect
//! garbage; no decision depends on them.
//!
//! Adding an algorithm: a variant of the config's `Algorithm` enum (in `sluice_crds`), a script in
//! `scripts/`, a file here implementing [`Algorithm`], and one line in the `algorithms!` list below,
//! which writes the dispatch.

pub mod fixed_window;
pub mod sliding_counter;
pub mod sliding_log;
pub mod token_bucket;

use std::sync::LazyLock;

use sha1::{Digest, Sha1};
use sluice_crds::sidecar_config::Algorithm as AlgorithmKind;

pub use fixed_window::FixedWindow;
pub use sliding_counter::SlidingCounter;
pub use sliding_log::SlidingLog;
pub use token_bucket::TokenBucket;

/// How long Redis keeps a key after the last moment it can matter, so sidecars whose clocks differ a little
/// still see it.
pub const EXPIRY_GRACE_MS: u64 = 1_000;

/// The limit one algorithm run enforces (already divided by the replica count for the local fallback).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Requests per window (for the token bucket: the refill rate per window). At least 1.
    pub requests: u64,
    /// Window length in milliseconds. At least 1.
    pub window_ms: u64,
    /// Token bucket only: requests allowed above the rate at once (nginx `burst`).
    pub burst: u64,
}

impl Params {
    /// The share of one replica out of `replicas`: `limit / replicas`, at least one request.
    pub fn per_replica(self, replicas: u32) -> Self {
        let replicas = u64::from(replicas.max(1));
        Self {
            requests: (self.requests / replicas).max(1),
            window_ms: self.window_ms,
            burst: self.burst / replicas,
        }
    }
}

/// The decision of one algorithm for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Whether the request fits the limit.
    pub allowed: bool,
    /// Requests that would still be allowed right now after this one.
    pub remaining: u64,
    /// Milliseconds until the quota is fully available again (if no further requests arrive).
    pub reset_ms: u64,
    /// For a rejection: milliseconds until a request would be allowed. 0 when allowed.
    pub retry_after_ms: u64,
}

/// What makes a sliding-log member unique across sidecars: a random id per limiter and a sequence number.
#[derive(Clone, Copy, Debug)]
pub struct Unique {
    /// Random per limiter instance.
    pub instance: u64,
    /// Increases with every call of this instance.
    pub seq: u64,
}

/// The hits one call decides, in this order: requests waiting for the answer, then hits taken ahead for
/// later requests (see [`Algorithm::prefetch_until`]). Only the token bucket treats the two differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hits {
    /// Requests decided now.
    pub waiting: u64,
    /// Hits counted now and spent later by this sidecar.
    pub ahead: u64,
}

impl Hits {
    /// All of them.
    pub fn total(self) -> u64 {
        self.waiting + self.ahead
    }
}

impl From<u64> for Hits {
    /// `n` waiting requests, nothing taken ahead.
    fn from(waiting: u64) -> Self {
        Self { waiting, ahead: 0 }
    }
}

/// One Redis call: the keys (all under one hash tag) and the arguments of the script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// `KEYS`.
    pub keys: Vec<String>,
    /// `ARGV`.
    pub args: Vec<String>,
}

/// A Lua script with its SHA-1 (computed here, so `EVALSHA` needs no round trip to learn it).
#[derive(Debug)]
pub struct Script {
    /// Short name, for logs.
    pub name: &'static str,
    /// The Lua source.
    pub source: &'static str,
    /// Hex SHA-1 of the source, as Redis computes it.
    pub sha1: String,
}

impl Script {
    fn new(name: &'static str, source: &'static str) -> Self {
        let digest = Sha1::digest(source.as_bytes());
        let sha1 = digest.iter().map(|b| format!("{b:02x}")).collect();
        Self { name, source, sha1 }
    }
}

/// The shape every algorithm shares.
pub trait Algorithm {
    /// Per-key state kept in process.
    type State: Default + Send + 'static;

    /// Short name, for logs (the script's file name).
    const NAME: &'static str;
    /// Tag of the algorithm in its Redis keys (`fw`, `sl`, `sc`, `tb`): the data types differ, so a rule
    /// that changes algorithm starts fresh instead of hitting `WRONGTYPE`.
    const KEY_TAG: &'static str;
    /// The Lua script's source.
    const LUA: &'static str;

    /// The Redis call deciding `hits` (at least 1) for one key, in arrival order, as if they had come one
    /// after another at `now`. `base` is the key prefix with the hash tag
    /// (`sluice:{ns/policy/rule/keyhash}`); every key starts with it and [`Self::KEY_TAG`], so a script
    /// touches one cluster slot.
    fn call(base: &str, p: &Params, now: u64, unique: Unique, hits: Hits) -> Call;

    /// From the reply to a call with several hits, the reply the script would have given the `i`-th of
    /// them (from 0) had each been a call of its own, one after another; `None` when the reply has the
    /// wrong shape. A one-hit reply is its own 0th.
    fn nth(p: &Params, reply: &[i64], i: u64) -> Option<Vec<i64>>;

    /// The outcome from the script's raw (one-hit) reply; `None` when the reply has the wrong shape.
    fn outcome(p: &Params, now: u64, reply: &[i64]) -> Option<Outcome>;

    /// The same decision in process: updates `state` exactly as the script updates Redis and returns the
    /// reply the script would have returned.
    fn decide_raw(state: &mut Self::State, p: &Params, now: u64) -> Vec<i64>;

    /// The in-process decision.
    fn decide(state: &mut Self::State, p: &Params, now: u64) -> Outcome {
        let raw = Self::decide_raw(state, p, now);
        Self::outcome(p, now, &raw).expect("local replies have the script's shape")
    }

    /// Until when hits counted ahead at `now` may be spent (limiter clock, ms), or `None` when the
    /// algorithm cannot take hits ahead without letting a key over its limit.
    fn prefetch_until(p: &Params, now: u64) -> Option<u64>;

    /// Whether `state` holds nothing a fresh state would not: such a bucket may be evicted without letting a
    /// client back in early.
    fn is_idle(state: &Self::State, p: &Params, now: u64) -> bool;
}

/// Lists every algorithm once, as `variant of AlgorithmKind => type implementing Algorithm`, and writes the
/// dispatch from the rule's [`AlgorithmKind`] to the type: [`LocalState`] and the free functions below.
/// Dispatch stays static (a `match` per call, no `dyn`, no allocation), since the limiter runs it on every
/// request. The `match`es are exhaustive, so a new `AlgorithmKind` variant without a line here does not
/// compile.
macro_rules! algorithms {
    ($($kind:ident => $ty:ident),+ $(,)?) => {
        /// In-process state of any algorithm (one entry of the local store).
        #[derive(Debug)]
        pub enum LocalState {
            $(
                #[doc = concat!("[`", stringify!($ty), "`].")]
                $kind(<$ty as Algorithm>::State),
            )+
        }

        impl LocalState {
            /// A fresh state for `kind`.
            pub fn new(kind: AlgorithmKind) -> Self {
                match kind {
                    $(AlgorithmKind::$kind => Self::$kind(Default::default()),)+
                }
            }

            /// Which algorithm this state belongs to.
            pub fn kind(&self) -> AlgorithmKind {
                match self {
                    $(Self::$kind(_) => AlgorithmKind::$kind,)+
                }
            }

            /// Decides one request in process, restarting the state when the rule changed algorithm.
            pub fn decide(&mut self, kind: AlgorithmKind, p: &Params, now: u64) -> Outcome {
                if self.kind() != kind {
                    *self = Self::new(kind);
                }
                match self {
                    $(Self::$kind(s) => $ty::decide(s, p, now),)+
                }
            }

            /// See [`Algorithm::is_idle`].
            pub fn is_idle(&self, p: &Params, now: u64) -> bool {
                match self {
                    $(Self::$kind(s) => $ty::is_idle(s, p, now),)+
                }
            }
        }

        /// The script of `kind`, its SHA-1 computed once.
        pub fn script(kind: AlgorithmKind) -> &'static Script {
            match kind {
                $(AlgorithmKind::$kind => {
                    static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new($ty::NAME, $ty::LUA));
                    &SCRIPT
                })+
            }
        }

        /// The Redis call of `kind` deciding `hits` requests for one key (see [`Algorithm::call`]).
        pub fn call(kind: AlgorithmKind, base: &str, p: &Params, now: u64, unique: Unique, hits: Hits) -> Call {
            match kind {
                $(AlgorithmKind::$kind => $ty::call(base, p, now, unique, hits),)+
            }
        }

        /// The one-hit reply of the `i`-th request of a several-hit reply of `kind` (see [`Algorithm::nth`]).
        pub fn nth(kind: AlgorithmKind, p: &Params, reply: &[i64], i: u64) -> Option<Vec<i64>> {
            match kind {
                $(AlgorithmKind::$kind => $ty::nth(p, reply, i),)+
            }
        }

        /// The outcome of `kind` from a script reply (see [`Algorithm::outcome`]).
        pub fn outcome(kind: AlgorithmKind, p: &Params, now: u64, reply: &[i64]) -> Option<Outcome> {
            match kind {
                $(AlgorithmKind::$kind => $ty::outcome(p, now, reply),)+
            }
        }

        /// Until when hits of `kind` counted ahead at `now` may be spent (see
        /// [`Algorithm::prefetch_until`]).
        pub fn prefetch_until(kind: AlgorithmKind, p: &Params, now: u64) -> Option<u64> {
            match kind {
                $(AlgorithmKind::$kind => $ty::prefetch_until(p, now),)+
            }
        }

        /// Tag of `kind` in Redis keys (see [`Algorithm::KEY_TAG`]).
        pub fn key_tag(kind: AlgorithmKind) -> &'static str {
            match kind {
                $(AlgorithmKind::$kind => $ty::KEY_TAG,)+
            }
        }
    };
}

algorithms! {
    FixedWindow => FixedWindow,
    SlidingLog => SlidingLog,
    SlidingCounter => SlidingCounter,
    TokenBucket => TokenBucket,
}

/// How many of the hits of a script reply were allowed (every script's first value).
pub fn allowed_hits(reply: &[i64]) -> u64 {
    reply.first().copied().map_or(0, count)
}

/// A reply value as a count (negative values never come from the scripts; they read as 0).
pub(crate) fn count(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// `a / b` rounded up.
pub(crate) fn div_ceil(a: u128, b: u128) -> u64 {
    u64::try_from(a.div_ceil(b)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_sha1_matches_what_redis_computes() {
        // SHA-1 of "return 1", as `SCRIPT LOAD "return 1"` answers.
        assert_eq!(
            Script::new("t", "return 1").sha1,
            "e0e1f9fabfc9d4800c877a703b823ac0578ff8db"
        );
    }

    #[test]
    fn per_replica_share_divides_limit_and_burst_but_keeps_one_request() {
        let p = Params {
            requests: 100,
            window_ms: 60_000,
            burst: 10,
        };
        assert_eq!(
            p.per_replica(4),
            Params {
                requests: 25,
                window_ms: 60_000,
                burst: 2
            }
        );
        assert_eq!(p.per_replica(1000).requests, 1);
        assert_eq!(p.per_replica(0), p);
    }
}
