//! 0↔1 wake-up: one `LISTEN sluice_jobs` connection per database; every notification (payload: the
//! queue name, sent by `sluice.enqueue` for jobs ready now) is passed on as a [`Wake`] at once, so the
//! controller can scale a sleeping queue's workers from 0 to 1 within milliseconds of the enqueue
//! instead of waiting for a poll. NOTIFY is a hint: `pollingInterval` still re-reads depth without it
//! (PgBouncer in transaction mode and replicas cannot LISTEN).
//!
//! Any login of a database may send `NOTIFY sluice_jobs` with any payload, as often as it likes, and a
//! JobQueue may name a database its namespace runs. So wake-ups wait in [`Wakes`]: once per queue
//! however often it was notified, a bounded number per database, and handled one at a time per
//! database, so that a flood of notifications, or a database slow to answer the depth read a wake-up
//! makes, holds up that database's wake-ups only.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    ops::ControlFlow,
    sync::{Arc, Mutex},
    time::Instant,
};

use sluice_queue::listen::Event;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::databases::database_key;

/// A queue was notified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wake {
    /// [`database_key`] of the database.
    pub database: String,
    /// The queue named in the notification.
    pub queue: String,
    /// When the notification was received.
    pub at: Instant,
}

/// Most queues of one database waiting to be woken at once; a notification of another queue past it is
/// dropped (the queue's next poll finds its jobs).
pub const PENDING_PER_DATABASE: usize = 1024;

/// Wake-ups not handled yet ([`Wakes::push`], [`Wakes::next`]).
#[derive(Debug, Default)]
pub struct Wakes {
    databases: Mutex<HashMap<String, Pending>>,
    changed: Notify,
}

/// One database's wake-ups not handled yet.
#[derive(Debug, Default)]
struct Pending {
    /// Oldest first; each queue once.
    wakes: VecDeque<Wake>,
    queues: HashSet<String>,
    /// A wake-up of this database is being handled ([`Wakes::next`] until [`Handling`] is dropped).
    busy: bool,
}

impl Wakes {
    fn databases(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.databases.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `wake`, unless its queue is already waiting (the earlier notification's time is kept) or
    /// its database has [`PENDING_PER_DATABASE`] queues waiting; returns whether it was added.
    pub fn push(&self, wake: Wake) -> bool {
        let mut databases = self.databases();
        let pending = databases.entry(wake.database.clone()).or_default();
        if pending.queues.len() >= PENDING_PER_DATABASE || pending.queues.contains(&wake.queue) {
            return false;
        }
        pending.queues.insert(wake.queue.clone());
        pending.wakes.push_back(wake);
        drop(databases);
        self.changed.notify_waiters();
        true
    }

    /// The oldest waiting wake-up of a database none of whose wake-ups is being handled, and the
    /// handle that marks it handled when dropped. A notification of the same queue that arrives
    /// meanwhile waits again: the depth read being made may have been taken before its jobs.
    pub async fn next(self: &Arc<Self>) -> (Wake, Handling) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut databases = self.databases();
                if let Some(pending) = databases.values_mut().find(|p| !p.busy && !p.wakes.is_empty())
                    && let Some(wake) = pending.wakes.pop_front()
                {
                    pending.queues.remove(&wake.queue);
                    pending.busy = true;
                    let handling = Handling {
                        wakes: self.clone(),
                        database: wake.database.clone(),
                    };
                    return (wake, handling);
                }
            }
            changed.await;
        }
    }

    /// How many wake-ups wait (for tests and logs).
    pub fn waiting(&self) -> usize {
        self.databases().values().map(|p| p.wakes.len()).sum()
    }
}

/// A wake-up being handled ([`Wakes::next`]); its database's next one may be handed out once this is
/// dropped (handled, failed, or its task aborted).
#[derive(Debug)]
pub struct Handling {
    wakes: Arc<Wakes>,
    database: String,
}

impl Drop for Handling {
    fn drop(&mut self) {
        let mut databases = self.wakes.databases();
        if let Some(pending) = databases.get_mut(&self.database) {
            pending.busy = false;
            if pending.wakes.is_empty() {
                databases.remove(&self.database);
            }
        }
        drop(databases);
        self.wakes.changed.notify_waiters();
    }
}

/// Listeners, one per database.
#[derive(Debug)]
pub struct Waker {
    listeners: Mutex<HashMap<String, CancellationToken>>,
    wakes: Arc<Wakes>,
    stop: CancellationToken,
}

impl Waker {
    /// A waker adding to `wakes`; every listener stops when `stop` fires.
    pub fn new(wakes: Arc<Wakes>, stop: CancellationToken) -> Self {
        Self {
            listeners: Mutex::default(),
            wakes,
            stop,
        }
    }

    /// Listens on the database at `url` (once; later calls for the same database do nothing).
    pub fn watch(&self, url: &str) {
        let key = database_key(url);
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        if listeners.contains_key(&key) {
            return;
        }
        let token = self.stop.child_token();
        listeners.insert(key.clone(), token.clone());
        tokio::spawn(listen(url.to_owned(), key, self.wakes.clone(), token));
    }

    /// Stops listening on the database at `url`.
    pub fn unwatch(&self, url: &str) {
        self.unwatch_key(&database_key(url));
    }

    /// Stops listening on the database whose [`database_key`] is `key`.
    pub fn unwatch_key(&self, key: &str) {
        if let Some(t) = self
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
        {
            t.cancel();
        }
    }

    /// How many databases are listened on.
    pub fn listening(&self) -> usize {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

async fn listen(url: String, key: String, wakes: Arc<Wakes>, stop: CancellationToken) {
    // The settings LISTEN connects with (it makes its connection in a pool of its own).
    let pool = match sluice_queue::pool::options(1).connect_lazy(&url) {
        Ok(pool) => pool,
        Err(e) => {
            tracing::warn!(database = %key, error = %e, "no LISTEN for this database; polling only");
            return;
        }
    };
    sluice_queue::listen::listen(&pool, &key, &stop, |event| {
        match event {
            Event::Enqueued(queue) => {
                let wake = Wake {
                    database: key.clone(),
                    queue: queue.to_owned(),
                    at: Instant::now(),
                };
                if !wakes.push(wake) {
                    tracing::trace!(database = %key, queue, "notification folded into one waiting or dropped");
                }
            }
            // Anything enqueued while nobody listened is found by the next poll.
            Event::Listening => {}
        }
        ControlFlow::Continue(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wake(database: &str, queue: &str) -> Wake {
        Wake {
            database: database.into(),
            queue: queue.into(),
            at: Instant::now(),
        }
    }

    /// The next wake-up, if one can be handed out now (its first poll decides).
    async fn ready(wakes: &Arc<Wakes>) -> Option<(Wake, Handling)> {
        futures::FutureExt::now_or_never(wakes.next())
    }

    #[tokio::test]
    async fn a_queue_notified_again_while_it_waits_waits_once() {
        let wakes = Arc::new(Wakes::default());
        let first = wake("db", "emails");
        assert!(wakes.push(first.clone()));
        for _ in 0..1000 {
            assert!(!wakes.push(wake("db", "emails")));
        }
        assert_eq!(wakes.waiting(), 1);
        let (got, _handling) = ready(&wakes).await.expect("a wake-up");
        assert_eq!(got, first, "the first notification's time is kept");
    }

    #[tokio::test]
    async fn a_database_has_one_wake_up_handled_at_a_time_and_others_go_on() {
        let wakes = Arc::new(Wakes::default());
        for w in [wake("slow", "a"), wake("slow", "b"), wake("other", "c")] {
            assert!(wakes.push(w));
        }
        let (first, handling) = ready(&wakes).await.expect("a wake-up");
        let (second, other) = ready(&wakes).await.expect("the other database's");
        assert_ne!(first.database, second.database);
        let (slow, slow_handling) = if first.database == "slow" {
            (first, handling)
        } else {
            (second, other)
        };
        assert_eq!(slow.queue, "a");
        assert!(
            ready(&wakes).await.is_none(),
            "b waits while a's wake-up is handled"
        );
        // Notified again while handled: waits again (the depth being read may predate its jobs).
        assert!(wakes.push(wake("slow", "a")));
        drop(slow_handling);
        let (next, _h) = ready(&wakes).await.expect("b once a is handled");
        assert_eq!((next.database.as_str(), next.queue.as_str()), ("slow", "b"));
    }

    #[tokio::test]
    async fn a_flood_of_queues_is_bounded_per_database() {
        let wakes = Arc::new(Wakes::default());
        for i in 0..PENDING_PER_DATABASE {
            assert!(wakes.push(wake("flooded", &format!("q{i}"))));
        }
        assert!(!wakes.push(wake("flooded", "one-more")), "past the bound");
        assert!(wakes.push(wake("quiet", "emails")), "another database is not");
        assert_eq!(wakes.waiting(), PENDING_PER_DATABASE + 1);
    }

    #[tokio::test]
    async fn a_handled_database_with_nothing_waiting_is_forgotten() {
        let wakes = Arc::new(Wakes::default());
        wakes.push(wake("db", "emails"));
        let (_, handling) = ready(&wakes).await.expect("a wake-up");
        drop(handling);
        assert!(wakes.databases().is_empty());
    }
}
