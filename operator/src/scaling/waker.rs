//! 0↔1 wake-up: one `LISTEN sluice_jobs` connection per database; every notification (payload: the
//! queue name, sent by `sluice.enqueue` for jobs ready now) is passed on as a [`Wake`] at once, so the
//! controller can scale a sleeping queue's workers from 0 to 1 within milliseconds of the enqueue
//! instead of waiting for a poll. NOTIFY is a hint: `pollingInterval` still re-reads depth without it
//! (PgBouncer in transaction mode and replicas cannot LISTEN).

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use sluice_sidecar::queue::worker::NOTIFY_CHANNEL;
use sqlx::postgres::{PgListener, PgPoolOptions};
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
        if let Some(t) = self
            .listeners
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&database_key(url))
        {
            t.cancel();
        }
    }
}

async fn listen(url: String, key: String, tx: mpsc::UnboundedSender<Wake>, stop: CancellationToken) {
    let mut wait = Duration::from_millis(200);
    loop {
        let connected = async {
            // Its own connection: LISTEN holds it for as long as the listener lives.
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(Duration::from_secs(3))
                .connect_lazy(&url)?;
            let mut l = PgListener::connect_with(&pool).await?;
            l.listen(NOTIFY_CHANNEL).await?;
            Ok::<_, sqlx::Error>(l)
        };
        let listener = tokio::select! {
            l = connected => l,
            _ = stop.cancelled() => return,
        };
        match listener {
            Ok(mut l) => {
                wait = Duration::from_millis(200);
                loop {
                    let n = tokio::select! {
                        n = l.try_recv() => n,
                        _ = stop.cancelled() => return,
                    };
                    match n {
                        Ok(Some(n)) => {
                            let wake = Wake {
                                database: key.clone(),
                                queue: n.payload().to_owned(),
                                at: Instant::now(),
                            };
                            if tx.send(wake).is_err() {
                                return;
                            }
                        }
                        // The connection dropped and was re-established: anything enqueued meanwhile
                        // is found by the next poll.
                        Ok(None) => {}
                        Err(e) => {
                            tracing::debug!(database = %key, error = %e, "LISTEN connection lost");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!(database = %key, error = %e, "LISTEN failed; polling meanwhile"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        wait = (wait * 2).min(Duration::from_secs(10));
    }
}
