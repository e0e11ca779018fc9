//! 0↔1 wake-up: one `LISTEN sluice_jobs` connection per database; every notification (payload: the
//! queue name, sent by `sluice.enqueue` for jobs ready now) is passed on as a [`Wake`] at once, so the
//! controller can scale a sleeping queue's workers from 0 to 1 within milliseconds of the enqueue
//! instead of waiting for a poll. NOTIFY is a hint: `pollingInterval` still re-reads depth without it
//! (PgBouncer in transaction mode and replicas cannot LISTEN).

use std::{collections::HashMap, ops::ControlFlow, sync::Mutex, time::Instant};

use sluice_queue::listen::Event;
use tokio::sync::mpsc;
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

/// Listeners, one per database.
#[derive(Debug)]
pub struct Waker {
    listeners: Mutex<HashMap<String, CancellationToken>>,
    tx: mpsc::UnboundedSender<Wake>,
    stop: CancellationToken,
}

impl Waker {
    /// A waker sending to `tx`; every listener stops when `stop` fires.
    pub fn new(tx: mpsc::UnboundedSender<Wake>, stop: CancellationToken) -> Self {
        Self {
            listeners: Mutex::default(),
            tx,
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
        tokio::spawn(listen(url.to_owned(), key, self.tx.clone(), token));
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

async fn listen(url: String, key: String, tx: mpsc::UnboundedSender<Wake>, stop: CancellationToken) {
    // The settings LISTEN connects with (it makes its connection in a pool of its own).
    let pool = match sluice_queue::pool::options(1).connect_lazy(&url) {
        Ok(pool) => pool,
        Err(e) => {
            tracing::warn!(database = %key, error = %e, "no LISTEN for this database; polling only");
            return;
        }
    };
    sluice_queue::listen::listen(&pool, &key, &stop, |event| match event {
        Event::Enqueued(queue) => {
            let wake = Wake {
                database: key.clone(),
                queue: queue.to_owned(),
                at: Instant::now(),
            };
            if tx.send(wake).is_err() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
        // Anything enqueued while nobody listened is found by the next poll.
        Event::Listening => ControlFlow::Continue(()),
    })
    .await;
}
