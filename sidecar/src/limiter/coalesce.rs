//! Coalescing and prefetch: requests for one counter that arrive while a Redis call for that counter is in
//! flight wait for it to finish and are then decided together, by one call with `hits = n` (see
//! [`Algorithm::call`](super::algorithm::Algorithm::call)). The script decides them in arrival order
//! exactly as n calls one after another would, so limits stay exact; what changes is the cost: a hot key
//! (one client, one tenant) costs one Redis round trip per round-trip time instead of one per request.
//! Different keys never wait for each other.
//!
//! A hot key can also take part of its budget ahead (a [`Reserve`]): its next call asks for a few more hits
//! than requests are waiting, and later requests spend those hits in process, in order, without waiting for
//! Redis. Every hit is counted in Redis before it is spent and only in the window it was counted in, so a
//! reserve never lets a key over its limit; what it can do is make another replica refuse early while
//! hits taken here are still unspent (bounded by [`prefetch_size`]).
//!
//! A slow key far from its limit takes a few hits ahead as well ([`SLOW_PREFETCH`], where the rule's
//! algorithm allows it): with many distinct keys, each seeing a request now and then, most requests are
//! then decided in process and one call in [`SLOW_PREFETCH`] goes to Redis, in the background. Its first
//! call after a quiet spell learns how far the key is from its limit; it is remembered for
//! [`SLOW_MEMORY_MS`], so the key's next request takes hits ahead.
//!
//! A [`Coalescer`] only keeps the queues and reserves; the limiter makes the calls. The first request for
//! an idle key [`Turn::Lead`]s: it calls Redis for itself (plus any prefetch), then [`Coalescer::settle`]s
//! the reply, which serves the queue that formed meanwhile from the reserve and hands what is left to a
//! task that calls for the whole batch, until no queue forms. Everyone else [`Turn::Follow`]s and awaits
//! its answer, never longer than its own deadline, or is served at once from the reserve
//! ([`Turn::Reserved`]).

use std::{
    borrow::Borrow,
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

use super::algorithm::Params;

/// The most requests one call decides; further requests for that key go to Redis on their own.
pub const MAX_BATCH: usize = 256;
/// Most keys tracked at once (in flight, holding a reserve, or seen lately) for a key to start taking hits
/// ahead; beyond it, only keys already taking hits ahead go on doing so.
pub const MAX_RESERVES: usize = 20_000;
/// Most keys tracked at once for a slow key to start taking [`SLOW_PREFETCH`] hits ahead: slow keys'
/// reserves can last until their window ends, so fewer than this many keys hold one, and busy keys
/// still find room below [`MAX_RESERVES`].
pub const MAX_SLOW_RESERVES: usize = 10_000;
const _: () = assert!(MAX_SLOW_RESERVES < MAX_RESERVES);
/// Hits a key takes ahead however slow it is, when it is far from its limit ([`FAR_FROM_LIMIT`]).
pub const SLOW_PREFETCH: u64 = 8;
/// A key is far from its limit when at least this much is left of it per replica (64 × [`SLOW_PREFETCH`]):
/// what a replica holds for a slow key (at most 1.5 × [`SLOW_PREFETCH`], a refill arriving while half is
/// left) is then under 2.5 % of what was left.
pub const FAR_FROM_LIMIT: u64 = 64 * SLOW_PREFETCH;
/// How long a key's last call is remembered as far from its limit, so that its next request takes
/// [`SLOW_PREFETCH`] hits ahead even after a quiet spell.
pub const SLOW_MEMORY_MS: u64 = 2_000;
/// Above this many tracked keys, keys with no call in flight, no usable reserve, no recent request and not
/// remembered as far from their limit are dropped, at most once per [`SWEEP_EVERY_MS`].
pub const SWEEP_ABOVE: usize = 1_024;
/// See [`SWEEP_ABOVE`].
pub const SWEEP_EVERY_MS: u64 = 100;
/// A busy key takes ahead the hits it is expected to spend in this long, at its rate over the last
/// [`RATE_WINDOW_MS`]: a refill started when half is left then has half the horizon to arrive, many Redis
/// round trips even on a loaded machine.
pub const PREFETCH_HORIZON_MS: u64 = 8;
/// A key's arrival rate is counted per window of this long.
pub const RATE_WINDOW_MS: u64 = 10;

/// A request waiting for the next call for its key.
#[derive(Debug)]
pub struct Waiter<T> {
    /// When it joined the queue: its deadline counts from here.
    pub since: Instant,
    /// Where its answer goes.
    pub answer: oneshot::Sender<T>,
}

/// What sizes a key's prefetch besides its own traffic: the rule's parameters, the most hits one call may
/// take ahead (`limits.redis.prefetch`) and the replicas sharing the limit. A prefetch reckoned under other
/// sizing (before a hot reload, or before the replica count changed) is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizing {
    /// The rule's parameters.
    pub params: Params,
    /// Most hits one call takes ahead.
    pub prefetch: u64,
    /// Replicas sharing the limit.
    pub replicas: u32,
}

/// Hits a call counted in Redis beyond the requests it decided: spendable in order by requests timed in
/// the window they were counted in (`from_ms..until_ms`), while the rule's parameters are unchanged.
#[derive(Debug, Clone)]
pub struct Reserve {
    /// The call's reply; hit `i` of it is decided by `nth(reply, i)`.
    pub reply: Arc<Vec<i64>>,
    /// The parameters the call was made with.
    pub params: Params,
    /// Index of the next unspent hit.
    pub next: u64,
    /// One past the last allowed hit.
    pub end: u64,
    /// Start of the window the hits were counted in (limiter clock, ms): a request timed earlier (a clock
    /// stepped back, or a time read just before the window began) belongs to the window before.
    pub from_ms: u64,
    /// End of the window the hits were counted in (limiter clock, ms).
    pub until_ms: u64,
}

impl Reserve {
    fn usable(&self, params: &Params, now: u64) -> bool {
        self.next < self.end && self.from_ms <= now && now < self.until_ms && self.params == *params
    }

    /// Spendable later but not at `now`: its window has not begun.
    fn early(&self, now: u64) -> bool {
        now < self.from_ms
    }

    /// Hits still unspent.
    pub fn left(&self) -> u64 {
        self.end.saturating_sub(self.next)
    }
}

/// A key's reserves, oldest first: a refill arrives while the previous reserve still has hits, which are
/// spent first (they were counted first), so nothing taken ahead is dropped while it is still usable.
#[derive(Debug, Default)]
struct Reserves(std::collections::VecDeque<Reserve>);

impl Reserves {
    /// Spends the next usable hit, dropping reserves that ran out, expired or belong to other parameters.
    /// A reserve whose window has not begun at `now` is kept, and nothing is spent.
    fn take(&mut self, params: &Params, now: u64) -> Option<Spent> {
        while let Some(r) = self.0.front_mut() {
            if r.early(now) && r.params == *params && r.next < r.end {
                return None;
            }
            if r.usable(params, now) {
                let spent = Spent {
                    reply: Arc::clone(&r.reply),
                    index: r.next,
                };
                r.next += 1;
                return Some(spent);
            }
            self.0.pop_front();
        }
        None
    }

    fn left(&self) -> u64 {
        self.0.iter().map(Reserve::left).sum()
    }

    /// Whether any reserve has hits that are or will be spendable (worth keeping the key for).
    fn usable(&self, now: u64) -> bool {
        self.0.iter().any(|r| r.next < r.end && now < r.until_ms)
    }
}

/// One hit taken from a reserve: its reply and its index in it.
#[derive(Debug, Clone)]
pub struct Spent {
    /// The reply of the call that counted it.
    pub reply: Arc<Vec<i64>>,
    /// Its index among that call's hits.
    pub index: u64,
}

/// What a request does for its key.
#[derive(Debug)]
pub enum Turn<T> {
    /// No call is in flight: make one for this request and `prefetch` more hits, then
    /// [`Coalescer::settle`] its reply.
    Lead {
        /// Hits to take ahead.
        prefetch: u64,
    },
    /// A call is in flight: the answer comes on this channel.
    Follow(oneshot::Receiver<T>),
    /// Decided from the key's reserve, at once. When `refill` is set, this request must start a call that
    /// takes `prefetch` more hits ahead (the key is marked in flight).
    Reserved {
        /// The hit spent.
        spent: Spent,
        /// Hits to take ahead in a refill call, or 0 for none.
        refill: u64,
    },
    /// The queue is full, or the call in flight decides under other limits (a hot reload changed the
    /// rule's limit or burst): call alone, outside the coalescer.
    Alone,
}

/// What a finished call leaves to do.
#[derive(Debug)]
pub struct Settled<T> {
    /// Queued requests now decided from the reserve: send each its hit.
    pub served: Vec<(Waiter<T>, Spent)>,
    /// Queued requests the reserve could not serve: decide them with one more call (the key stays in
    /// flight), taking `prefetch` hits ahead. Empty with `prefetch == 0`: the key is idle.
    pub batch: Vec<Waiter<T>>,
    /// Hits the next call should take ahead.
    pub prefetch: u64,
}

/// A key's arrivals per fixed window of [`RATE_WINDOW_MS`]: the current window's so far and the last full
/// one's.
#[derive(Debug)]
struct Rate {
    /// Start of the current window (limiter clock, ms).
    start: u64,
    seen: u64,
    before: u64,
}

impl Rate {
    fn new(now: u64) -> Self {
        Self {
            start: now,
            seen: 0,
            before: 0,
        }
    }

    /// Counts one arrival at `now`.
    fn record(&mut self, now: u64) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed >= RATE_WINDOW_MS {
            // The window that just ended is the last full one only if no empty window came between.
            self.before = if elapsed < 2 * RATE_WINDOW_MS {
                self.seen
            } else {
                0
            };
            self.seen = 0;
            self.start = now - elapsed % RATE_WINDOW_MS;
        }
        self.seen += 1;
    }

    /// Arrivals expected within [`PREFETCH_HORIZON_MS`] at the last full window's rate.
    fn expected(&self) -> u64 {
        self.before * PREFETCH_HORIZON_MS / RATE_WINDOW_MS
    }

    /// Whether the key saw a request in this window or the last: worth remembering while it is idle, so
    /// that a steady stream of requests that never overlap still builds up a rate.
    fn recent(&self, now: u64) -> bool {
        now.saturating_sub(self.start) < 2 * RATE_WINDOW_MS
    }
}

#[derive(Debug)]
struct Entry<T> {
    in_flight: bool,
    /// The limits the call in flight (or the last call) decides under. A request under other limits (a
    /// hot reload changed the rule's limit or burst; another window or algorithm is another key) does
    /// not wait for it: that call's answer, and the next batch it would start, count under the old
    /// limits.
    flight: Params,
    /// No rule counts this key any longer (a hot reload changed its rule's window or algorithm, or
    /// removed the rule; see [`Coalescer::forget`]): once its call is settled and nothing is queued, it
    /// is dropped with whatever it holds.
    unused: bool,
    queue: Vec<Waiter<T>>,
    reserves: Reserves,
    /// Requests that joined since the last call was issued.
    demand: u64,
    rate: Rate,
    /// Hits the next call for this key takes ahead, as the last settled call reckoned it (also the size
    /// of a refill).
    prefetched: u64,
    /// Hits the next call takes ahead if the key is quiet until then: [`SLOW_PREFETCH`] if the last settled
    /// call found it far from its limit, else 0.
    slow: u64,
    /// When the last call was settled (limiter clock, ms).
    settled_at: u64,
    /// What `prefetched` and `slow` were reckoned under: under other sizing they are not used.
    sized: Option<Sizing>,
    /// Until when the key is worth keeping while nothing is in flight for it ([`Entry::worth_keeping`]
    /// is `now < keep_until`), as of its last change: the sweep reads this one field per key instead of
    /// walking each key's reserves. Set by [`Entry::refresh`] after every change.
    keep_until: u64,
}

impl<T> Entry<T> {
    fn new(now: u64, params: Params) -> Self {
        let mut rate = Rate::new(now);
        rate.record(now);
        Self {
            in_flight: true,
            flight: params,
            unused: false,
            queue: Vec::new(),
            reserves: Reserves::default(),
            demand: 0,
            rate,
            prefetched: 0,
            slow: 0,
            settled_at: now,
            sized: None,
            keep_until: 0,
        }
        .refreshed()
    }

    fn refreshed(mut self) -> Self {
        self.refresh();
        self
    }

    /// Reckons `keep_until` again after a change: the latest of the end of the key's recent arrivals,
    /// the end of its memory as far from its limit and the end of the window of any reserve with hits
    /// left.
    fn refresh(&mut self) {
        let recent = self.rate.start.saturating_add(2 * RATE_WINDOW_MS);
        let slow = if self.slow > 0 {
            self.settled_at.saturating_add(SLOW_MEMORY_MS)
        } else {
            0
        };
        let held = self
            .reserves
            .0
            .iter()
            .filter(|r| r.next < r.end)
            .map(|r| r.until_ms)
            .max()
            .unwrap_or(0);
        self.keep_until = recent.max(slow).max(held);
    }

    /// Hits a quiet key takes ahead: what its last call allowed a slow key, if that was lately.
    fn slow_prefetch(&self, now: u64) -> u64 {
        if now.saturating_sub(self.settled_at) < SLOW_MEMORY_MS {
            self.slow
        } else {
            0
        }
    }

    /// Whether the key takes hits ahead already (it may go on doing so when many keys are tracked).
    fn taking_ahead(&self) -> bool {
        self.prefetched > 0 || self.slow > 0 || self.reserves.left() > 0
    }

    /// Worth keeping while nothing is in flight for it.
    fn worth_keeping(&self, now: u64) -> bool {
        self.reserves.usable(now) || self.rate.recent(now) || self.slow_prefetch(now) > 0
    }

    /// Hits this key wants to take ahead: twice the requests that arrived during the last call (so a
    /// refill started when half is spent arrives in time), or what it is expected to spend within
    /// [`PREFETCH_HORIZON_MS`], whichever is more. Fewer than two is none: a key that sees one request at
    /// a time, at a low rate, takes nothing ahead.
    fn wanted(&self) -> u64 {
        let during_call = if self.demand >= 2 { self.demand * 2 } else { 0 };
        let wanted = during_call.max(self.rate.expected());
        if wanted < 2 { 0 } else { wanted }
    }
}

/// Queues of requests per key while a call for that key is in flight, and the keys' reserves. Keys are
/// of type `K`: the limiter names a counter by its key hash, rule id, algorithm and window (a small
/// fixed-size value, so a request builds no key string and a remembered key holds none).
#[derive(Debug)]
pub struct Coalescer<T, K> {
    entries: Mutex<Entries<T, K>>,
}

#[derive(Debug)]
struct Entries<T, K> {
    /// Keyed by a randomly seeded hasher (`RandomState`), and it must stay so: the limiter's keys are
    /// hashes of values clients pick, so they can be ground to land in one bucket of an unkeyed or
    /// identity hasher, and every lookup, under the one lock, would turn linear.
    by_key: HashMap<K, Entry<T>>,
    /// When idle keys with spent or expired reserves were last dropped (limiter clock, ms).
    swept_at: u64,
}

impl<T, K> Default for Coalescer<T, K> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(Entries {
                by_key: HashMap::new(),
                swept_at: 0,
            }),
        }
    }
}

/// How many hits a call takes ahead: what the key `wanted` (see `Entry::wanted`), or `floor` if more and
/// at least [`FAR_FROM_LIMIT`] is left per replica (`floor` is [`SLOW_PREFETCH`] or 0); at most `limit`
/// (`limits.redis.prefetch`, so 0 turns it all off); and at most a quarter of what is left divided by the
/// replicas that share it, so near the limit every request is decided by Redis and unspent hits never
/// hide more than a quarter of the budget from other replicas.
pub fn prefetch_size(wanted: u64, floor: u64, remaining: u64, replicas: u32, limit: u64) -> u64 {
    let per_replica = remaining / u64::from(replicas.max(1));
    let wanted = if per_replica >= FAR_FROM_LIMIT {
        wanted.max(floor)
    } else {
        wanted
    };
    wanted.min(limit).min(per_replica / 4)
}

impl<T, K: Hash + Eq> Coalescer<T, K> {
    /// Joins `key` at `now` for a rule sized by `sizing`: spend from its reserve, lead when no call is in
    /// flight for it, else wait in its queue. Takes hits ahead only as reckoned under the same sizing.
    pub fn join<Q>(&self, key: &Q, sizing: &Sizing, now: u64) -> Turn<T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut entries = self.lock();
        let Some(entry) = entries.by_key.get_mut(key) else {
            entries
                .by_key
                .insert(key.to_owned(), Entry::new(now, sizing.params));
            return Turn::Lead { prefetch: 0 };
        };
        // A request for the key: a rule counts it (after a reload forgot it, one that went back to its
        // window before its call was settled).
        entry.unused = false;
        let turn = Self::turn(entry, sizing, now);
        entry.refresh();
        turn
    }

    /// What a request for the known key `entry` does (see [`Coalescer::join`]).
    fn turn(entry: &mut Entry<T>, sizing: &Sizing, now: u64) -> Turn<T> {
        let params = &sizing.params;
        let quiet = !entry.rate.recent(now);
        // Reckoned under other limits, prefetch setting or replica count (a hot reload): take nothing
        // ahead until the next settle reckons again.
        let (prefetched, slow) = if entry.sized == Some(*sizing) {
            (entry.prefetched, entry.slow_prefetch(now))
        } else {
            (0, 0)
        };
        entry.demand += 1;
        entry.rate.record(now);
        if let Some(spent) = entry.reserves.take(params, now) {
            let low = entry.reserves.left() * 2 <= prefetched;
            let refill = if low && prefetched > 0 && !entry.in_flight {
                entry.in_flight = true;
                entry.flight = *params;
                entry.demand = 0;
                prefetched
            } else {
                0
            };
            return Turn::Reserved { spent, refill };
        }
        if !entry.in_flight {
            entry.in_flight = true;
            entry.flight = *params;
            // Quiet since its last call: what that call reckoned for a busy key no longer holds; for a
            // slow key far from its limit it does, for a while.
            let prefetch = if quiet { slow } else { prefetched };
            entry.demand = 0;
            return Turn::Lead { prefetch };
        }
        // Queued, it would be decided under the limits of the call in flight, and keep that call's
        // successors going under them for as long as requests overlap.
        if entry.queue.len() >= MAX_BATCH || entry.flight != *params {
            return Turn::Alone;
        }
        let (answer, rx) = oneshot::channel();
        entry.queue.push(Waiter {
            since: Instant::now(),
            answer,
        });
        Turn::Follow(rx)
    }

    /// Called when the call in flight for `key` finished, with the hits it took ahead (`reserve`, if any
    /// were allowed) and the size of the next call's prefetch, which `next_prefetch(wanted, floor)`
    /// reckons under `sizing` from the hits the key wants and the floor a slow key may take (see
    /// [`prefetch_size`]).
    /// Serves the queue that formed meanwhile from the reserve and returns the rest as the next batch;
    /// with nothing left to decide the key is no longer in flight, and it is forgotten unless it holds
    /// hits, saw a request lately or was found far from its limit lately.
    pub fn settle<Q>(
        &self,
        key: &Q,
        sizing: &Sizing,
        reserve: Option<Reserve>,
        now: u64,
        next_prefetch: impl Fn(u64, u64) -> u64,
    ) -> Settled<T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let params = &sizing.params;
        let mut entries = self.lock();
        if entries.by_key.len() >= SWEEP_ABOVE && now.saturating_sub(entries.swept_at) >= SWEEP_EVERY_MS {
            entries.swept_at = now;
            entries.by_key.retain(|_, e| {
                let keep = e.in_flight || now < e.keep_until;
                debug_assert_eq!(keep, e.in_flight || e.worth_keeping(now));
                keep
            });
        }
        let tracked = entries.by_key.len();
        let mut settled = Settled {
            served: Vec::new(),
            batch: Vec::new(),
            prefetch: 0,
        };
        let Some(entry) = entries.by_key.get_mut(key) else {
            return settled;
        };
        if let Some(r) = reserve {
            entry.reserves.0.push_back(r);
        }
        let queue = std::mem::take(&mut entry.queue);
        for waiter in queue {
            match entry.reserves.take(params, now) {
                Some(spent) => settled.served.push((waiter, spent)),
                None => settled.batch.push(waiter),
            }
        }
        // Many keys tracked: only keys already taking hits ahead go on (they hold no more entries).
        let going_on = entry.taking_ahead();
        let floor = if tracked < MAX_SLOW_RESERVES || going_on {
            SLOW_PREFETCH
        } else {
            0
        };
        let (prefetch, slow) = if tracked < MAX_RESERVES || going_on {
            (next_prefetch(entry.wanted(), floor), next_prefetch(0, floor))
        } else {
            (0, 0)
        };
        entry.prefetched = prefetch;
        entry.slow = slow;
        entry.sized = Some(*sizing);
        entry.settled_at = now;
        entry.refresh();
        let reserve_left = entry.reserves.left();
        if !settled.batch.is_empty() {
            entry.flight = *params;
            entry.demand = 0;
            // No rule counts the key any longer: take nothing ahead that no request would spend.
            settled.prefetch = if entry.unused { 0 } else { prefetch };
        } else if entry.unused || (reserve_left == 0 && !entry.rate.recent(now) && slow == 0) {
            // No rule counts the key any longer, or nothing queued, nothing held, quiet, not worth taking
            // hits ahead for: the key is idle (its demand is forgotten).
            entries.by_key.remove(key);
        } else {
            entry.in_flight = false;
        }
        settled
    }

    /// Forgets the keys no rule counts any longer, after a hot reload: `keep` says which keys a rule
    /// still counts. Those with no call in flight are dropped at once, with their reserves and what was
    /// remembered of their rate (the hits they hold were counted on Redis keys that no request uses now,
    /// so nothing is lost); those with a call in flight are dropped once it is settled and nothing is
    /// queued (the requests queued before the reload are still decided, under the old rule). Without
    /// this, a key's old entry would outlive the reload until the old window ends, holding a place
    /// among the keys that may take hits ahead ([`MAX_SLOW_RESERVES`], [`MAX_RESERVES`]). A key joined
    /// again before its call is settled is kept.
    pub fn forget(&self, keep: impl Fn(&K) -> bool) {
        self.lock().by_key.retain(|key, e| {
            e.unused = !keep(key);
            e.in_flight || !e.unused
        });
    }

    /// Keys tracked: with a call in flight, a reserve, a recent request or remembered as far from its
    /// limit (for tests).
    pub fn tracked(&self) -> usize {
        self.lock().by_key.len()
    }

    /// Hits unspent in `key`'s reserve (for tests).
    pub fn reserved<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lock().by_key.get(key).map_or(0, |e| e.reserves.left())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<T, K>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long a batch may wait for Redis: what is left of its oldest waiter's deadline.
pub fn batch_deadline<T>(batch: &[Waiter<T>], timeout: Duration) -> Duration {
    batch
        .iter()
        .map(|w| w.since)
        .min()
        .map_or(timeout, |oldest| timeout.saturating_sub(oldest.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params {
        requests: 1_000,
        window_ms: 60_000,
        burst: 0,
    };
    const S: Sizing = Sizing {
        params: P,
        prefetch: 256,
        replicas: 1,
    };

    fn reserve(next: u64, end: u64, until_ms: u64) -> Reserve {
        Reserve {
            reply: Arc::new(vec![end as i64, end as i64]),
            params: P,
            next,
            end,
            from_ms: until_ms.saturating_sub(P.window_ms),
            until_ms,
        }
    }

    fn none(_: u64, _: u64) -> u64 {
        0
    }

    #[test]
    fn the_first_request_leads_and_later_ones_queue_until_the_call_finishes() {
        let c = Coalescer::<u32, String>::default();
        assert!(matches!(c.join("k", &S, 0), Turn::Lead { prefetch: 0 }));
        let Turn::Follow(mut a) = c.join("k", &S, 0) else {
            panic!("second must follow")
        };
        let Turn::Follow(_b) = c.join("k", &S, 0) else {
            panic!("third must follow")
        };
        assert!(
            matches!(c.join("other", &S, 0), Turn::Lead { .. }),
            "keys never wait for each other"
        );

        let settled = c.settle("k", &S, None, 0, none);
        assert_eq!(settled.batch.len(), 2);
        assert!(settled.served.is_empty());
        assert_eq!(c.tracked(), 2, "the batch's call keeps the key in flight");
        assert!(
            matches!(c.join("k", &S, 0), Turn::Follow(_)),
            "joins the next batch"
        );
        let mut batch = settled.batch.into_iter();
        batch.next().unwrap().answer.send(7).unwrap();
        assert_eq!(a.try_recv().unwrap(), 7);

        assert_eq!(c.settle("k", &S, None, 0, none).batch.len(), 1);
        assert!(c.settle("k", &S, None, 0, none).batch.is_empty());
        assert_eq!(c.tracked(), 2, "an idle key seen lately is remembered");
        let quiet = 2 * RATE_WINDOW_MS;
        assert!(c.settle("other", &S, None, quiet, none).batch.is_empty());
        let _ = c.join("k", &S, quiet);
        assert!(
            c.settle("k", &S, None, quiet + 2 * RATE_WINDOW_MS, none)
                .batch
                .is_empty()
        );
        assert_eq!(c.tracked(), 0, "quiet idle keys are forgotten");
        assert!(
            matches!(c.join("k", &S, 0), Turn::Lead { .. }),
            "an idle key is led again"
        );
    }

    #[test]
    fn a_full_queue_sends_further_requests_alone() {
        let c = Coalescer::<(), String>::default();
        assert!(matches!(c.join("k", &S, 0), Turn::Lead { .. }));
        let _waiting: Vec<_> = (0..MAX_BATCH).map(|_| c.join("k", &S, 0)).collect();
        assert!(matches!(c.join("k", &S, 0), Turn::Alone));
    }

    #[test]
    fn a_request_under_other_limits_does_not_wait_for_the_call_in_flight() {
        let c = Coalescer::<(), String>::default();
        let changed = Sizing {
            params: Params { requests: 10, ..P },
            ..S
        };
        assert!(matches!(c.join("k", &S, 0), Turn::Lead { .. }));
        assert!(matches!(c.join("k", &S, 0), Turn::Follow(_)));
        assert!(
            matches!(c.join("k", &changed, 0), Turn::Alone),
            "after a hot reload, not decided under the old limit"
        );
        // The request queued under the old limit is still decided under it, by the next call; requests
        // under the new limit do not join that call either.
        let settled = c.settle("k", &S, None, 0, |_, _| 0);
        assert_eq!(settled.batch.len(), 1);
        assert!(matches!(c.join("k", &changed, 0), Turn::Alone));
        assert!(c.settle("k", &S, None, 0, |_, _| 0).batch.is_empty());
        assert!(
            matches!(c.join("k", &changed, 1), Turn::Lead { .. }),
            "the old calls done, the new limit leads"
        );
        assert!(matches!(c.join("k", &changed, 1), Turn::Follow(_)));
        assert!(matches!(c.join("k", &S, 1), Turn::Alone));
    }

    #[test]
    fn keys_no_rule_counts_are_forgotten_at_once_or_once_their_call_is_settled() {
        let c = Coalescer::<(), String>::default();
        let counted = |k: &String| k == "kept";
        // Idle keys holding hits ahead until their window ends.
        for k in ["old", "kept"] {
            let _ = c.join(k, &S, 0);
            let _ = c.settle(k, &S, Some(reserve(1, 9, 60_000)), 0, |_, _| 8);
        }
        // A key with a call in flight and a request queued behind it.
        assert!(matches!(c.join("busy", &S, 0), Turn::Lead { .. }));
        let Turn::Follow(_queued) = c.join("busy", &S, 0) else {
            panic!("must follow")
        };
        c.forget(counted);
        assert_eq!(
            c.tracked(),
            2,
            "the idle key no rule counts is dropped with its hits"
        );
        assert_eq!(c.reserved("kept"), 8);
        let settled = c.settle("busy", &S, Some(reserve(1, 5, 60_000)), 0, |_, _| 8);
        assert_eq!(
            settled.served.len(),
            1,
            "the request queued before the reload is decided"
        );
        assert_eq!(c.tracked(), 1, "dropped once its call is settled, hits and all");

        // Queued requests the reserve cannot serve get one more call, which takes nothing ahead.
        let _ = c.join("busy", &S, 0);
        let _queued = c.join("busy", &S, 0);
        c.forget(counted);
        let settled = c.settle("busy", &S, None, 0, |_, _| 8);
        assert_eq!(settled.batch.len(), 1);
        assert_eq!(settled.prefetch, 0, "no request would spend hits taken ahead");
        assert_eq!(c.tracked(), 2, "in flight for the batch");
        assert!(c.settle("busy", &S, None, 0, |_, _| 8).batch.is_empty());
        assert_eq!(c.tracked(), 1);

        // Joined again before its call is settled (a reload went back to its window): kept.
        let _ = c.join("back", &S, 0);
        c.forget(counted);
        assert!(matches!(c.join("back", &S, 0), Turn::Follow(_)));
        let _ = c.settle("back", &S, Some(reserve(1, 9, 60_000)), 0, |_, _| 8);
        assert_eq!(c.tracked(), 2);
        assert_eq!(c.reserved("back"), 7);
    }

    #[test]
    fn a_reserve_serves_the_queue_first_then_later_requests_in_order() {
        let c = Coalescer::<(), String>::default();
        let _ = c.join("k", &S, 0);
        let queued: Vec<_> = (0..2).map(|_| c.join("k", &S, 0)).collect();
        assert!(queued.iter().all(|t| matches!(t, Turn::Follow(_))));
        // The leader's call allowed hit 0 (its own) and hits 1..5 ahead.
        let settled = c.settle("k", &S, Some(reserve(1, 5, 60_000)), 10, |_, _| 4);
        let served: Vec<u64> = settled.served.iter().map(|(_, s)| s.index).collect();
        assert_eq!(served, [1, 2], "queued requests spend the first hits");
        assert!(settled.batch.is_empty());
        assert_eq!(c.reserved("k"), 2);

        let Turn::Reserved { spent, refill } = c.join("k", &S, 20) else {
            panic!("served from the reserve")
        };
        assert_eq!(
            (spent.index, refill),
            (3, 4),
            "half spent: refill by the last prefetch"
        );
        let Turn::Reserved { spent, refill } = c.join("k", &S, 20) else {
            panic!("served from the reserve")
        };
        assert_eq!((spent.index, refill), (4, 0), "one refill in flight at a time");
        assert!(
            matches!(c.join("k", &S, 20), Turn::Follow(_)),
            "spent: wait for the refill"
        );
    }

    #[test]
    fn a_reserve_is_not_spent_after_its_window_or_under_other_parameters() {
        let c = Coalescer::<(), String>::default();
        let _ = c.join("k", &S, 0);
        let _ = c.settle("k", &S, Some(reserve(1, 100, 60_000)), 0, |_, _| 50);
        let changed = Sizing {
            params: Params { requests: 10, ..P },
            ..S
        };
        assert!(
            matches!(c.join("k", &changed, 10), Turn::Lead { .. }),
            "a changed limit drops the reserve"
        );
        let _ = c.settle("k", &S, Some(reserve(1, 100, 60_000)), 0, |_, _| 50);
        assert!(
            matches!(c.join("k", &S, 60_000), Turn::Lead { prefetch: 0 }),
            "the next window needs a new call (and a key quiet this long takes nothing ahead)"
        );
        assert_eq!(c.reserved("k"), 0);
    }

    #[test]
    fn a_reserve_is_not_spent_by_a_request_timed_before_its_window_and_is_kept_for_it() {
        let c = Coalescer::<(), String>::default();
        let _ = c.join("k", &S, 60_000);
        // Counted in the window 60,000..120,000.
        let _ = c.settle("k", &S, Some(reserve(1, 5, 120_000)), 60_000, |_, _| 4);
        assert!(
            matches!(c.join("k", &S, 59_999), Turn::Lead { .. }),
            "a request timed in the window before (a clock stepped back) asks Redis"
        );
        assert_eq!(c.reserved("k"), 4, "the reserve is kept");
        let _ = c.settle("k", &S, None, 59_999, |_, _| 4);
        let Turn::Reserved { spent, .. } = c.join("k", &S, 60_000) else {
            panic!("spent in its own window")
        };
        assert_eq!(spent.index, 1);
    }

    #[test]
    fn a_prefetch_reckoned_before_a_reload_is_not_taken() {
        let c = Coalescer::<(), String>::default();
        let far = |w, f| prefetch_size(w, f, 1_000_000, 1, 256);
        let _ = c.join("k", &S, 0);
        let _ = c.settle("k", &S, None, 0, far);
        let fewer = Sizing {
            params: Params { requests: 100, ..P },
            replicas: 4,
            ..S
        };
        assert!(
            matches!(c.join("k", &fewer, 100), Turn::Lead { prefetch: 0 }),
            "a lower limit and more replicas: nothing ahead until reckoned again"
        );
        let _ = c.settle("k", &fewer, None, 100, |w, f| prefetch_size(w, f, 99, 4, 256));
        assert!(
            matches!(c.join("k", &fewer, 200), Turn::Lead { prefetch: 0 }),
            "reckoned again: near the limit per replica, exact"
        );
        let _ = c.settle("k", &S, None, 200, far);
        let off = Sizing { prefetch: 0, ..S };
        assert!(
            matches!(c.join("k", &off, 300), Turn::Lead { prefetch: 0 }),
            "prefetch: 0 turns it off at once"
        );

        // A refill reckoned before the reload is not made either.
        let _ = c.settle("k", &S, Some(reserve(1, 5, 60_000)), 300, |_, _| 4);
        let _ = c.join("k", &S, 301);
        let Turn::Reserved { refill, .. } = c.join("k", &off, 302) else {
            panic!("hits already counted are still spent")
        };
        assert_eq!(refill, 0, "half spent, but reckoned under other sizing");
    }

    #[test]
    fn a_refill_arriving_early_is_spent_after_what_is_left_of_the_last_one() {
        let c = Coalescer::<(), String>::default();
        let _ = c.join("k", &S, 0);
        let _ = c.settle("k", &S, Some(reserve(1, 5, 60_000)), 0, |_, _| 4);
        let Turn::Reserved { refill, .. } = c.join("k", &S, 1) else {
            panic!("reserved")
        };
        assert_eq!(refill, 0);
        let Turn::Reserved { refill, .. } = c.join("k", &S, 1) else {
            panic!("reserved")
        };
        assert_eq!(refill, 4, "half spent");
        let mut refilled = reserve(0, 4, 60_000);
        refilled.reply = Arc::new(vec![4, 9]);
        let _ = c.settle("k", &S, Some(refilled), 2, |_, _| 4);
        assert_eq!(
            c.reserved("k"),
            6,
            "two left of the first reserve, four of the refill"
        );
        let order: Vec<(i64, u64)> = (0..6)
            .map(|_| match c.join("k", &S, 3) {
                Turn::Reserved { spent, .. } => (spent.reply[1], spent.index),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(order, [(5, 3), (5, 4), (9, 0), (9, 1), (9, 2), (9, 3)]);
    }

    #[test]
    fn a_key_wants_twice_the_arrivals_per_call_or_its_horizon_at_its_rate() {
        let mut e = Entry::<()>::new(0, P);
        e.demand = 1;
        assert_eq!(e.wanted(), 0, "one at a time, at a low rate: exact");
        e.demand = 17;
        assert_eq!(e.wanted(), 34, "twice the arrivals per call");
        e.demand = 0;
        for t in 0..25 {
            e.rate.record(t * RATE_WINDOW_MS / 25);
        }
        assert_eq!(e.wanted(), 0, "no full window yet");
        e.rate.record(RATE_WINDOW_MS);
        assert_eq!(
            e.wanted(),
            25 * PREFETCH_HORIZON_MS / RATE_WINDOW_MS,
            "the last window's rate over the horizon"
        );
        e.rate.record(3 * RATE_WINDOW_MS + 1);
        assert_eq!(e.wanted(), 0, "an empty window between: no rate");
    }

    #[test]
    fn a_steady_stream_that_never_overlaps_takes_hits_ahead_after_one_window() {
        let c = Coalescer::<(), String>::default();
        let mut prefetches = Vec::new();
        // Two requests a millisecond, each call finished before the next request arrives.
        for t in 0..2 * RATE_WINDOW_MS {
            for _ in 0..2 {
                let Turn::Lead { prefetch } = c.join("k", &S, t) else {
                    panic!("nothing overlaps, nothing is reserved: every request leads")
                };
                prefetches.push(prefetch);
                let _ = c.settle("k", &S, None, t, |wanted, _| wanted);
            }
        }
        let per_window = 2 * RATE_WINDOW_MS;
        assert!(prefetches[..per_window as usize + 1].iter().all(|&p| p == 0));
        assert_eq!(
            prefetches.last(),
            Some(&(per_window * PREFETCH_HORIZON_MS / RATE_WINDOW_MS))
        );
    }

    #[test]
    fn prefetch_stays_within_its_cap_and_far_from_the_limit() {
        assert_eq!(
            prefetch_size(0, 0, 1_000_000, 1, 256),
            0,
            "wanting none takes none"
        );
        assert_eq!(prefetch_size(34, 0, 1_000_000, 1, 256), 34);
        assert_eq!(prefetch_size(1_000, 0, 1_000_000, 1, 256), 256, "capped");
        assert_eq!(prefetch_size(17, 0, 40, 1, 256), 10, "a quarter of what is left");
        assert_eq!(prefetch_size(17, 0, 40, 5, 256), 2, "shared by the replicas");
        assert_eq!(
            prefetch_size(17, 0, 3, 1, 256),
            0,
            "near the limit: every request asks Redis"
        );
    }

    #[test]
    fn a_slow_key_far_from_its_limit_takes_a_small_floor_ahead() {
        let far = |w| prefetch_size(w, SLOW_PREFETCH, 1_000_000, 1, 256);
        assert_eq!(far(0), SLOW_PREFETCH, "wanting none, far from the limit");
        assert_eq!(far(34), 34, "a busy key wants more than the floor");
        assert_eq!(
            prefetch_size(0, SLOW_PREFETCH, FAR_FROM_LIMIT, 1, 256),
            SLOW_PREFETCH
        );
        assert_eq!(
            prefetch_size(0, SLOW_PREFETCH, FAR_FROM_LIMIT - 1, 1, 256),
            0,
            "not far enough: exact"
        );
        assert_eq!(
            prefetch_size(0, SLOW_PREFETCH, 3 * FAR_FROM_LIMIT - 1, 3, 256),
            0,
            "what is left is shared by the replicas"
        );
        assert_eq!(
            prefetch_size(0, SLOW_PREFETCH, 3 * FAR_FROM_LIMIT, 3, 256),
            SLOW_PREFETCH
        );
        assert_eq!(
            prefetch_size(0, SLOW_PREFETCH, 1_000_000, 1, 0),
            0,
            "prefetch: 0 turns it off"
        );
        assert_eq!(prefetch_size(0, 0, 1_000_000, 1, 256), 0, "no floor, no hits");
        for remaining in 0..4 * FAR_FROM_LIMIT {
            for replicas in 1..4 {
                let ahead = prefetch_size(0, SLOW_PREFETCH, remaining, replicas, 256);
                assert!(
                    ahead * 4 * u64::from(replicas) <= remaining,
                    "never more than a quarter of what is left per replica"
                );
            }
        }
    }

    /// A fixed window counter as the script keeps it: `call(now, n)` allows the first hits that fit and
    /// replies `[allowed, count before, window]`.
    struct Window {
        limit: u64,
        window_ms: u64,
        window: u64,
        count: u64,
        calls: u64,
    }

    impl Window {
        fn new(p: &Params) -> Self {
            Self {
                limit: p.requests,
                window_ms: p.window_ms,
                window: 0,
                count: 0,
                calls: 0,
            }
        }

        fn call(&mut self, now: u64, hits: u64) -> Arc<Vec<i64>> {
            if now / self.window_ms != self.window {
                self.window = now / self.window_ms;
                self.count = 0;
            }
            self.calls += 1;
            let allowed = hits.min(self.limit - self.count);
            let before = self.count;
            self.count += allowed;
            Arc::new(vec![allowed as i64, before as i64, self.window as i64])
        }
    }

    fn sizing(p: &Params, replicas: u32) -> Sizing {
        Sizing {
            params: *p,
            prefetch: 256,
            replicas,
        }
    }

    /// Settles a call on `w` that decided `decided` requests, as `limiter::remote` does.
    fn settle_call(
        c: &Coalescer<(), String>,
        w: &Window,
        p: &Params,
        replicas: u32,
        now: u64,
        reply: &Arc<Vec<i64>>,
        decided: u64,
    ) {
        let allowed = reply[0] as u64;
        let reserve = (allowed > decided).then(|| Reserve {
            reply: Arc::clone(reply),
            params: *p,
            next: decided,
            end: allowed,
            from_ms: now / p.window_ms * p.window_ms,
            until_ms: (now / p.window_ms + 1) * p.window_ms,
        });
        let remaining = w.limit - w.count;
        let settled = c.settle("k", &sizing(p, replicas), reserve, now, |wanted, floor| {
            prefetch_size(wanted, floor, remaining, replicas, 256)
        });
        assert!(
            settled.batch.is_empty() && settled.served.is_empty(),
            "nothing overlaps"
        );
    }

    /// One request for `k` at `now` through `c` (a replica of `replicas`), its calls made on `w` at once:
    /// whether it was allowed, and whether a reserve decided it.
    fn request(
        c: &Coalescer<(), String>,
        w: &mut Window,
        p: &Params,
        replicas: u32,
        now: u64,
    ) -> (bool, bool) {
        match c.join("k", &sizing(p, replicas), now) {
            Turn::Lead { prefetch } => {
                let reply = w.call(now, 1 + prefetch);
                settle_call(c, w, p, replicas, now, &reply, 1);
                (reply[0] > 0, false)
            }
            Turn::Reserved { spent, refill } => {
                assert_eq!(
                    spent.reply[2] as u64,
                    now / p.window_ms,
                    "a hit is spent only in the window it was counted in"
                );
                if refill > 0 {
                    let reply = w.call(now, refill);
                    settle_call(c, w, p, replicas, now, &reply, 0);
                }
                (spent.index < spent.reply[0] as u64, true)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn slow_keys_far_from_their_limit_make_one_call_in_eight_and_two_replicas_stay_exact_at_the_limit() {
        let p = Params {
            requests: 2_000,
            window_ms: 3_600_000,
            burst: 0,
        };
        let mut w = Window::new(&p);
        let (a, b) = (
            Coalescer::<(), String>::default(),
            Coalescer::<(), String>::default(),
        );
        let (mut allowed, mut reserved, mut reserved_late) = (0, 0, 0);
        // One request every 300 ms, alternating between the replicas: each sees the key quiet every time.
        for i in 0..3_000u64 {
            let now = 1_000 + i * 300;
            let left_before = w.limit - w.count;
            let (ok, from_reserve) = request(if i % 2 == 0 { &a } else { &b }, &mut w, &p, 2, now);
            allowed += u64::from(ok);
            reserved += u64::from(from_reserve);
            if from_reserve && left_before < 2 * FAR_FROM_LIMIT {
                reserved_late += 1;
            }
            if i == 1_000 {
                assert!(
                    w.calls * SLOW_PREFETCH <= 2 * 1_000,
                    "far from the limit, about one call per {SLOW_PREFETCH} requests: {}",
                    w.calls
                );
            }
        }
        assert_eq!(
            allowed, p.requests,
            "never over the limit, and every hit taken ahead spent"
        );
        // Far from the limit (the first 2,000 − 2 × 512 requests), most are decided from reserves.
        let far = p.requests - 2 * FAR_FROM_LIMIT;
        assert!(reserved * 4 >= far * 3, "{reserved} of {far}");
        // Near the limit a replica spends what it held and at most one refill reckoned at its last call
        // before: 1.5 floors and one floor.
        assert!(
            reserved_late <= 2 * (2 * SLOW_PREFETCH + SLOW_PREFETCH / 2),
            "near the limit only what a replica held is spent from reserves: {reserved_late}"
        );
    }

    #[test]
    fn hits_a_slow_key_holds_at_its_window_end_are_not_spent_in_the_next() {
        let p = Params {
            requests: 1_000_000,
            window_ms: 10_000,
            burst: 0,
        };
        let mut w = Window::new(&p);
        let c = Coalescer::<(), String>::default();
        let mut per_window = std::collections::BTreeMap::<u64, (u64, u64)>::new();
        for i in 0..200u64 {
            let now = i * 300;
            let (ok, from_reserve) = request(&c, &mut w, &p, 1, now);
            assert!(ok);
            let e = per_window.entry(now / p.window_ms).or_default();
            e.0 += 1;
            e.1 += u64::from(from_reserve);
            assert!(
                c.reserved("k") <= SLOW_PREFETCH + SLOW_PREFETCH / 2,
                "a replica holds at most one and a half floors"
            );
        }
        // Each window starts with a call (what was held lapsed) and then spends hits taken ahead.
        for (requests, from_reserves) in per_window.values() {
            assert!(from_reserves < requests && *from_reserves > 0);
        }
    }

    #[test]
    fn a_slow_key_is_remembered_for_a_while_and_then_decided_exactly_again() {
        let c = Coalescer::<(), String>::default();
        let far = |w, f| prefetch_size(w, f, 1_000_000, 1, 256);
        let near = |w, f| prefetch_size(w, f, FAR_FROM_LIMIT - 1, 1, 256);
        assert!(
            matches!(c.join("k", &S, 0), Turn::Lead { prefetch: 0 }),
            "unknown: exact"
        );
        let _ = c.settle("k", &S, None, 0, far);
        let later = SLOW_MEMORY_MS - 1;
        assert!(
            matches!(
                c.join("k", &S, later),
                Turn::Lead {
                    prefetch: SLOW_PREFETCH
                }
            ),
            "quiet, but found far from its limit lately"
        );
        let _ = c.settle("k", &S, None, later, near);
        assert_eq!(c.tracked(), 1, "seen lately");
        assert!(
            matches!(c.join("k", &S, later + 1_000), Turn::Lead { prefetch: 0 }),
            "near its limit: exact"
        );
        let _ = c.settle("k", &S, None, later + 1_000, far);
        let much_later = later + 1_000 + SLOW_MEMORY_MS;
        assert!(
            matches!(c.join("k", &S, much_later), Turn::Lead { prefetch: 0 }),
            "found far too long ago: exact"
        );
        let _ = c.settle("k", &S, None, much_later, none);
        assert!(
            c.settle("k", &S, None, much_later + 2 * RATE_WINDOW_MS, none)
                .batch
                .is_empty()
        );
        assert_eq!(c.tracked(), 0, "neither far nor seen lately: forgotten");
    }

    #[test]
    fn many_keys_tracked_stop_new_slow_keys_from_taking_hits_ahead_but_not_others() {
        let c = Coalescer::<(), String>::default();
        let far = |w, f| prefetch_size(w, f, 1_000_000, 1, 256);
        for i in 0..MAX_SLOW_RESERVES - 1 {
            let key = i.to_string();
            let _ = c.join(&key, &S, 0);
            let _ = c.settle(&key, &S, None, 0, far);
        }
        assert_eq!(c.tracked(), MAX_SLOW_RESERVES - 1);
        // "0" was found far before; "new" is the key that fills the table.
        let _ = c.join("new", &S, 1_000);
        let _ = c.settle("new", &S, None, 1_000, far);
        assert!(
            matches!(c.join("new", &S, 1_500), Turn::Lead { prefetch: 0 }),
            "no room"
        );
        let _ = c.settle("new", &S, None, 1_500, far);
        assert!(
            matches!(
                c.join("0", &S, 1_500),
                Turn::Lead {
                    prefetch: SLOW_PREFETCH
                }
            ),
            "a key already taking hits ahead goes on"
        );
        let _ = c.settle("0", &S, None, 1_500, far);
        // A busy key still finds room below MAX_RESERVES.
        let _ = c.join("busy", &S, 1_500);
        let _waiting: Vec<_> = (0..16).map(|_| c.join("busy", &S, 1_500)).collect();
        let settled = c.settle("busy", &S, None, 1_500, far);
        assert_eq!(settled.prefetch, 32, "twice the arrivals during its call");
        assert!(c.tracked() <= MAX_SLOW_RESERVES + 1);
    }

    #[test]
    fn the_sweep_keeps_exactly_the_keys_worth_keeping() {
        let c = Coalescer::<(), String>::default();
        let far: fn(u64, u64) -> u64 = |w, f| prefetch_size(w, f, 1_000_000, 1, 256);
        let exact: fn(u64, u64) -> u64 = none;
        // Keys in each state the sweep meets: seen lately or not, found far from their limit lately or
        // not, holding hits (some spent, some lapsed) or none.
        for (i, at) in [0u64, 5, 15, 25, 1_000, 1_999, 2_500, 59_990]
            .into_iter()
            .enumerate()
        {
            let key = format!("k{i}");
            let _ = c.join(&key, &S, at);
            let held = (i % 2 == 0).then(|| reserve(1, 1 + i as u64, (at / P.window_ms + 1) * P.window_ms));
            let _ = c.settle(&key, &S, held, at, if i % 3 == 0 { far } else { exact });
            for later in [at + 1, at + 12, at + 700] {
                match c.join(&key, &S, later) {
                    Turn::Lead { .. } => {
                        let _ = c.settle(&key, &S, None, later, exact);
                    }
                    Turn::Reserved { refill, .. } if refill > 0 => {
                        let _ = c.settle(&key, &S, None, later, far);
                    }
                    _ => {}
                }
            }
        }
        let entries = c.lock();
        assert!(entries.by_key.len() >= 4, "{}", entries.by_key.len());
        for (key, e) in &entries.by_key {
            assert!(!e.in_flight);
            for now in (0..130_000).step_by(7).chain([e.keep_until - 1, e.keep_until]) {
                assert_eq!(
                    now < e.keep_until,
                    e.worth_keeping(now),
                    "{key} at {now} (kept until {})",
                    e.keep_until
                );
            }
        }
    }

    #[test]
    fn a_batch_gets_what_is_left_of_its_oldest_deadline() {
        let c = Coalescer::<(), String>::default();
        let _ = c.join("k", &S, 0);
        let _rx = c.join("k", &S, 0);
        let batch = c.settle("k", &S, None, 0, none).batch;
        assert!(batch_deadline(&batch, Duration::from_millis(50)) <= Duration::from_millis(50));
        assert!(batch_deadline(&batch, Duration::from_secs(3600)) > Duration::from_secs(3000));
        assert_eq!(batch_deadline(&batch, Duration::ZERO), Duration::ZERO);
    }
}
