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
//! A [`Coalescer`] only keeps the queues and reserves; the limiter makes the calls. The first request for
//! an idle key [`Turn::Lead`]s: it calls Redis for itself (plus any prefetch), then [`Coalescer::settle`]s
//! the reply, which serves the queue that formed meanwhile from the reserve and hands what is left to a
//! task that calls for the whole batch, until no queue forms. Everyone else [`Turn::Follow`]s and awaits
//! its answer, never longer than its own deadline, or is served at once from the reserve
//! ([`Turn::Reserved`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

use super::algorithm::Params;

/// The most requests one call decides; further requests for that key go to Redis on their own.
pub const MAX_BATCH: usize = 256;
/// Most keys tracked at once (in flight, holding a reserve, or seen lately); beyond it, calls take nothing
/// ahead.
pub const MAX_RESERVES: usize = 10_000;
/// Above this many tracked keys, keys with no call in flight, no usable reserve and no recent request are
/// dropped, at most once per [`SWEEP_EVERY_MS`].
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

/// Hits a call counted in Redis beyond the requests it decided: spendable in order, while `now` is before
/// `until_ms` and the rule's parameters are unchanged.
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
    /// End of the window the hits were counted in (limiter clock, ms).
    pub until_ms: u64,
}

impl Reserve {
    fn usable(&self, params: &Params, now: u64) -> bool {
        self.next < self.end && now < self.until_ms && self.params == *params
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
    fn take(&mut self, params: &Params, now: u64) -> Option<Spent> {
        while let Some(r) = self.0.front_mut() {
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
    /// The queue is full: call alone, outside the coalescer.
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
    queue: Vec<Waiter<T>>,
    reserves: Reserves,
    /// Requests that joined since the last call was issued.
    demand: u64,
    rate: Rate,
    /// Hits the next call for this key takes ahead, as the last settled call reckoned it (also the size
    /// of a refill).
    prefetched: u64,
}

impl<T> Entry<T> {
    fn new(now: u64) -> Self {
        let mut rate = Rate::new(now);
        rate.record(now);
        Self {
            in_flight: true,
            queue: Vec::new(),
            reserves: Reserves::default(),
            demand: 0,
            rate,
            prefetched: 0,
        }
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

/// Queues of requests per key while a call for that key is in flight, and the keys' reserves.
#[derive(Debug)]
pub struct Coalescer<T> {
    entries: Mutex<Entries<T>>,
}

#[derive(Debug)]
struct Entries<T> {
    by_key: HashMap<String, Entry<T>>,
    /// When idle keys with spent or expired reserves were last dropped (limiter clock, ms).
    swept_at: u64,
}

impl<T> Default for Coalescer<T> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(Entries {
                by_key: HashMap::new(),
                swept_at: 0,
            }),
        }
    }
}

/// How many hits a call takes ahead: what the key `wanted` (see `Entry::wanted`); at most `limit`
/// (`limits.redis.prefetch`); and at most a quarter of what is left divided by the replicas that share
/// it, so near the limit every request is decided by Redis and unspent hits never hide more than a
/// quarter of the budget from other replicas.
pub fn prefetch_size(wanted: u64, remaining: u64, replicas: u32, limit: u64) -> u64 {
    wanted
        .min(limit)
        .min(remaining / (4 * u64::from(replicas.max(1))))
}

impl<T> Coalescer<T> {
    /// Joins `key` at `now` for a rule with `params`: spend from its reserve, lead when no call is in
    /// flight for it, else wait in its queue.
    pub fn join(&self, key: &str, params: &Params, now: u64) -> Turn<T> {
        let mut entries = self.lock();
        let Some(entry) = entries.by_key.get_mut(key) else {
            entries.by_key.insert(key.to_owned(), Entry::new(now));
            return Turn::Lead { prefetch: 0 };
        };
        let quiet = !entry.rate.recent(now);
        entry.demand += 1;
        entry.rate.record(now);
        if let Some(spent) = entry.reserves.take(params, now) {
            let low = entry.reserves.left() * 2 <= entry.prefetched;
            let refill = if low && entry.prefetched > 0 && !entry.in_flight {
                entry.in_flight = true;
                entry.demand = 0;
                entry.prefetched
            } else {
                0
            };
            return Turn::Reserved { spent, refill };
        }
        if !entry.in_flight {
            entry.in_flight = true;
            // Quiet since its last call: what that call reckoned no longer holds.
            let prefetch = if quiet { 0 } else { entry.prefetched };
            entry.demand = 0;
            return Turn::Lead { prefetch };
        }
        if entry.queue.len() >= MAX_BATCH {
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
    /// were allowed) and the size of the next call's prefetch, which `next_prefetch` reckons from the hits
    /// the key wants (see [`prefetch_size`]). Serves the queue that formed meanwhile from the reserve and
    /// returns the rest as the next batch; with nothing left to decide the key is no longer in flight,
    /// and it is forgotten unless it holds hits or saw a request lately.
    pub fn settle(
        &self,
        key: &str,
        params: &Params,
        reserve: Option<Reserve>,
        now: u64,
        next_prefetch: impl FnOnce(u64) -> u64,
    ) -> Settled<T> {
        let mut entries = self.lock();
        if entries.by_key.len() >= SWEEP_ABOVE && now.saturating_sub(entries.swept_at) >= SWEEP_EVERY_MS {
            entries.swept_at = now;
            entries
                .by_key
                .retain(|_, e| e.in_flight || e.reserves.usable(now) || e.rate.recent(now));
        }
        let crowded = entries.by_key.len() >= MAX_RESERVES;
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
        let prefetch = if crowded { 0 } else { next_prefetch(entry.wanted()) };
        entry.prefetched = prefetch;
        let reserve_left = entry.reserves.left();
        if !settled.batch.is_empty() {
            entry.demand = 0;
            settled.prefetch = prefetch;
        } else if reserve_left == 0 && !entry.rate.recent(now) {
            // Nothing queued, nothing held, quiet: the key is idle (its demand is forgotten).
            entries.by_key.remove(key);
        } else {
            entry.in_flight = false;
        }
        settled
    }

    /// Keys with a call in flight or a reserve (for tests).
    pub fn tracked(&self) -> usize {
        self.lock().by_key.len()
    }

    /// Hits unspent in `key`'s reserve (for tests).
    pub fn reserved(&self, key: &str) -> u64 {
        self.lock().by_key.get(key).map_or(0, |e| e.reserves.left())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<T>> {
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

    fn reserve(next: u64, end: u64, until_ms: u64) -> Reserve {
        Reserve {
            reply: Arc::new(vec![end as i64, end as i64]),
            params: P,
            next,
            end,
            until_ms,
        }
    }

    fn none(_: u64) -> u64 {
        0
    }

    #[test]
    fn the_first_request_leads_and_later_ones_queue_until_the_call_finishes() {
        let c = Coalescer::<u32>::default();
        assert!(matches!(c.join("k", &P, 0), Turn::Lead { prefetch: 0 }));
        let Turn::Follow(mut a) = c.join("k", &P, 0) else {
            panic!("second must follow")
        };
        let Turn::Follow(_b) = c.join("k", &P, 0) else {
            panic!("third must follow")
        };
        assert!(
            matches!(c.join("other", &P, 0), Turn::Lead { .. }),
            "keys never wait for each other"
        );

        let settled = c.settle("k", &P, None, 0, none);
        assert_eq!(settled.batch.len(), 2);
        assert!(settled.served.is_empty());
        assert_eq!(c.tracked(), 2, "the batch's call keeps the key in flight");
        assert!(
            matches!(c.join("k", &P, 0), Turn::Follow(_)),
            "joins the next batch"
        );
        let mut batch = settled.batch.into_iter();
        batch.next().unwrap().answer.send(7).unwrap();
        assert_eq!(a.try_recv().unwrap(), 7);

        assert_eq!(c.settle("k", &P, None, 0, none).batch.len(), 1);
        assert!(c.settle("k", &P, None, 0, none).batch.is_empty());
        assert_eq!(c.tracked(), 2, "an idle key seen lately is remembered");
        let quiet = 2 * RATE_WINDOW_MS;
        assert!(c.settle("other", &P, None, quiet, none).batch.is_empty());
        let _ = c.join("k", &P, quiet);
        assert!(
            c.settle("k", &P, None, quiet + 2 * RATE_WINDOW_MS, none)
                .batch
                .is_empty()
        );
        assert_eq!(c.tracked(), 0, "quiet idle keys are forgotten");
        assert!(
            matches!(c.join("k", &P, 0), Turn::Lead { .. }),
            "an idle key is led again"
        );
    }

    #[test]
    fn a_full_queue_sends_further_requests_alone() {
        let c = Coalescer::<()>::default();
        assert!(matches!(c.join("k", &P, 0), Turn::Lead { .. }));
        let _waiting: Vec<_> = (0..MAX_BATCH).map(|_| c.join("k", &P, 0)).collect();
        assert!(matches!(c.join("k", &P, 0), Turn::Alone));
    }

    #[test]
    fn a_reserve_serves_the_queue_first_then_later_requests_in_order() {
        let c = Coalescer::<()>::default();
        let _ = c.join("k", &P, 0);
        let queued: Vec<_> = (0..2).map(|_| c.join("k", &P, 0)).collect();
        assert!(queued.iter().all(|t| matches!(t, Turn::Follow(_))));
        // The leader's call allowed hit 0 (its own) and hits 1..5 ahead.
        let settled = c.settle("k", &P, Some(reserve(1, 5, 60_000)), 10, |_| 4);
        let served: Vec<u64> = settled.served.iter().map(|(_, s)| s.index).collect();
        assert_eq!(served, [1, 2], "queued requests spend the first hits");
        assert!(settled.batch.is_empty());
        assert_eq!(c.reserved("k"), 2);

        let Turn::Reserved { spent, refill } = c.join("k", &P, 20) else {
            panic!("served from the reserve")
        };
        assert_eq!(
            (spent.index, refill),
            (3, 4),
            "half spent: refill by the last prefetch"
        );
        let Turn::Reserved { spent, refill } = c.join("k", &P, 20) else {
            panic!("served from the reserve")
        };
        assert_eq!((spent.index, refill), (4, 0), "one refill in flight at a time");
        assert!(
            matches!(c.join("k", &P, 20), Turn::Follow(_)),
            "spent: wait for the refill"
        );
    }

    #[test]
    fn a_reserve_is_not_spent_after_its_window_or_under_other_parameters() {
        let c = Coalescer::<()>::default();
        let _ = c.join("k", &P, 0);
        let _ = c.settle("k", &P, Some(reserve(1, 100, 60_000)), 0, |_| 50);
        let changed = Params { requests: 10, ..P };
        assert!(
            matches!(c.join("k", &changed, 10), Turn::Lead { .. }),
            "a changed limit drops the reserve"
        );
        let _ = c.settle("k", &P, Some(reserve(1, 100, 60_000)), 0, |_| 50);
        assert!(
            matches!(c.join("k", &P, 60_000), Turn::Lead { prefetch: 0 }),
            "the next window needs a new call (and a key quiet this long takes nothing ahead)"
        );
        assert_eq!(c.reserved("k"), 0);
    }

    #[test]
    fn a_refill_arriving_early_is_spent_after_what_is_left_of_the_last_one() {
        let c = Coalescer::<()>::default();
        let _ = c.join("k", &P, 0);
        let _ = c.settle("k", &P, Some(reserve(1, 5, 60_000)), 0, |_| 4);
        let Turn::Reserved { refill, .. } = c.join("k", &P, 1) else {
            panic!("reserved")
        };
        assert_eq!(refill, 0);
        let Turn::Reserved { refill, .. } = c.join("k", &P, 1) else {
            panic!("reserved")
        };
        assert_eq!(refill, 4, "half spent");
        let mut refilled = reserve(0, 4, 60_000);
        refilled.reply = Arc::new(vec![4, 9]);
        let _ = c.settle("k", &P, Some(refilled), 2, |_| 4);
        assert_eq!(
            c.reserved("k"),
            6,
            "two left of the first reserve, four of the refill"
        );
        let order: Vec<(i64, u64)> = (0..6)
            .map(|_| match c.join("k", &P, 3) {
                Turn::Reserved { spent, .. } => (spent.reply[1], spent.index),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(order, [(5, 3), (5, 4), (9, 0), (9, 1), (9, 2), (9, 3)]);
    }

    #[test]
    fn a_key_wants_twice_the_arrivals_per_call_or_its_horizon_at_its_rate() {
        let mut e = Entry::<()>::new(0);
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
        let c = Coalescer::<()>::default();
        let mut prefetches = Vec::new();
        // Two requests a millisecond, each call finished before the next request arrives.
        for t in 0..2 * RATE_WINDOW_MS {
            for _ in 0..2 {
                let Turn::Lead { prefetch } = c.join("k", &P, t) else {
                    panic!("nothing overlaps, nothing is reserved: every request leads")
                };
                prefetches.push(prefetch);
                let _ = c.settle("k", &P, None, t, |wanted| wanted);
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
        assert_eq!(prefetch_size(0, 1_000_000, 1, 256), 0, "wanting none takes none");
        assert_eq!(prefetch_size(34, 1_000_000, 1, 256), 34);
        assert_eq!(prefetch_size(1_000, 1_000_000, 1, 256), 256, "capped");
        assert_eq!(prefetch_size(17, 40, 1, 256), 10, "a quarter of what is left");
        assert_eq!(prefetch_size(17, 40, 5, 256), 2, "shared by the replicas");
        assert_eq!(
            prefetch_size(17, 3, 1, 256),
            0,
            "near the limit: every request asks Redis"
        );
    }

    #[test]
    fn a_batch_gets_what_is_left_of_its_oldest_deadline() {
        let c = Coalescer::<()>::default();
        let _ = c.join("k", &P, 0);
        let _rx = c.join("k", &P, 0);
        let batch = c.settle("k", &P, None, 0, none).batch;
        assert!(batch_deadline(&batch, Duration::from_millis(50)) <= Duration::from_millis(50));
        assert!(batch_deadline(&batch, Duration::from_secs(3600)) > Duration::from_secs(3000));
        assert_eq!(batch_deadline(&batch, Duration::ZERO), Duration::ZERO);
    }
}
