//! Coalescing: requests for one counter that arrive while a Redis call for that counter is in flight wait
//! for it to finish and are then decided together, by one call with `hits = n` (see
//! [`Algorithm::call`](super::algorithm::Algorithm::call)). The script decides them in arrival order
//! exactly as n calls one after another would, so limits stay exact; what changes is the cost: a hot key
//! (one client, one tenant) costs one Redis round trip per round-trip time instead of one per request.
//! Different keys never wait for each other.
//!
//! A [`Coalescer`] only keeps the queues; the limiter makes the calls. The first request for an idle key
//! [`Turn::Lead`]s: it calls Redis for itself alone, then takes the queue that formed meanwhile
//! ([`Coalescer::next_batch`]) and hands it to a task that calls for the whole batch, until no queue
//! forms. Everyone else [`Turn::Follow`]s and awaits its answer, never longer than its own deadline.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

/// The most requests one call decides; further requests for that key go to Redis on their own.
pub const MAX_BATCH: usize = 256;

/// A request waiting for the next call for its key.
#[derive(Debug)]
pub struct Waiter<T> {
    /// When it joined the queue: its deadline counts from here.
    pub since: Instant,
    /// Where its answer goes.
    pub answer: oneshot::Sender<T>,
}

/// What a request does for its key.
#[derive(Debug)]
pub enum Turn<T> {
    /// No call is in flight: make one, then pass on the queue with [`Coalescer::next_batch`].
    Lead,
    /// A call is in flight: the answer comes on this channel.
    Follow(oneshot::Receiver<T>),
    /// The queue is full: call alone, outside the coalescer.
    Alone,
}

/// Queues of requests per key while a call for that key is in flight. A key is present exactly while a
/// call for it is in flight.
#[derive(Debug)]
pub struct Coalescer<T> {
    queues: Mutex<HashMap<String, Vec<Waiter<T>>>>,
}

impl<T> Default for Coalescer<T> {
    fn default() -> Self {
        Self {
            queues: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> Coalescer<T> {
    /// Joins `key`: lead when no call is in flight for it, else wait in its queue.
    pub fn join(&self, key: &str) -> Turn<T> {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        match queues.get_mut(key) {
            None => {
                queues.insert(key.to_owned(), Vec::new());
                Turn::Lead
            }
            Some(queue) if queue.len() >= MAX_BATCH => Turn::Alone,
            Some(queue) => {
                let (answer, rx) = oneshot::channel();
                queue.push(Waiter {
                    since: Instant::now(),
                    answer,
                });
                Turn::Follow(rx)
            }
        }
    }

    /// Called when the call in flight for `key` finished: the requests that queued meanwhile, which the
    /// caller must now decide with one call (the key stays in flight), or none, and the key is idle.
    pub fn next_batch(&self, key: &str) -> Vec<Waiter<T>> {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        match queues.get_mut(key) {
            Some(queue) if !queue.is_empty() => std::mem::take(queue),
            _ => {
                queues.remove(key);
                Vec::new()
            }
        }
    }

    /// Keys with a call in flight (for tests).
    pub fn in_flight(&self) -> usize {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).len()
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

    #[test]
    fn the_first_request_leads_and_later_ones_queue_until_the_call_finishes() {
        let c = Coalescer::<u32>::default();
        assert!(matches!(c.join("k"), Turn::Lead));
        let Turn::Follow(mut a) = c.join("k") else {
            panic!("second must follow")
        };
        let Turn::Follow(_b) = c.join("k") else {
            panic!("third must follow")
        };
        assert!(
            matches!(c.join("other"), Turn::Lead),
            "keys never wait for each other"
        );

        let batch = c.next_batch("k");
        assert_eq!(batch.len(), 2);
        assert_eq!(c.in_flight(), 2, "the batch's call keeps the key in flight");
        assert!(matches!(c.join("k"), Turn::Follow(_)), "joins the next batch");
        let mut batch = batch.into_iter();
        batch.next().unwrap().answer.send(7).unwrap();
        assert_eq!(a.try_recv().unwrap(), 7);

        assert_eq!(c.next_batch("k").len(), 1);
        assert!(c.next_batch("k").is_empty());
        assert!(c.next_batch("other").is_empty());
        assert_eq!(c.in_flight(), 0);
        assert!(matches!(c.join("k"), Turn::Lead), "an idle key is led again");
    }

    #[test]
    fn a_full_queue_sends_further_requests_alone() {
        let c = Coalescer::<()>::default();
        assert!(matches!(c.join("k"), Turn::Lead));
        let _waiting: Vec<_> = (0..MAX_BATCH).map(|_| c.join("k")).collect();
        assert!(matches!(c.join("k"), Turn::Alone));
    }

    #[test]
    fn a_batch_gets_what_is_left_of_its_oldest_deadline() {
        let c = Coalescer::<()>::default();
        let _ = c.join("k");
        let _rx = c.join("k");
        let batch = c.next_batch("k");
        assert!(batch_deadline(&batch, Duration::from_millis(50)) <= Duration::from_millis(50));
        assert!(batch_deadline(&batch, Duration::from_secs(3600)) > Duration::from_secs(3000));
        assert_eq!(batch_deadline(&batch, Duration::ZERO), Duration::ZERO);
    }
}
