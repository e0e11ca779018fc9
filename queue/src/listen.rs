//! Listening for enqueues: `LISTEN sluice_jobs` (payload: the queue name, sent by `sluice.enqueue` for
//! jobs ready now) on a connection made with a pool's settings, reconnecting with backoff, until stopped. Used by the
//! worker (to claim at once) and by the operator (to scale a sleeping queue from 0 to 1). NOTIFY is only
//! a hint: whoever listens also polls, since PgBouncer in transaction mode and replicas cannot LISTEN.
//!
//! [`listen_on`] is the same loop for any channel (the sidecar's job event streams listen on
//! [`crate::events::JOB_EVENTS_CHANNEL`]).
//!
//! A LISTEN connection only reads, so a server gone silent under it (a failover that left the old
//! address unanswered, a dropped NAT entry, a frozen backend) never shows up as an error: the socket
//! just stays quiet, and whoever listens would wait on it for good. So the loop has a [`Liveness`]:
//! after a quiet spell it sends `SELECT 1` on the connection, and a connection that does not answer it
//! (or a connect and `LISTEN` that do not finish) within the deadline is dropped and made again, which
//! reports [`Event::Listening`] (notifications may have been missed meanwhile).

use std::{ops::ControlFlow, time::Duration};

use sqlx::{
    Executor as _, PgPool,
    postgres::{PgListener, PgPoolOptions},
};
use tokio_util::sync::CancellationToken;

/// The channel `sluice.enqueue` notifies on, with the queue name as payload (migration 0002).
pub const NOTIFY_CHANNEL: &str = "sluice_jobs";

/// First pause before reconnecting; it doubles after each failure.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// Longest pause before reconnecting.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// When a LISTEN connection is checked, and how long it has to answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// How long the connection may stay quiet (no notification) before it is probed with `SELECT 1`.
    pub quiet: Duration,
    /// How long the probe, or connecting and `LISTEN`, may go unanswered before the connection is
    /// dropped and made again.
    pub deadline: Duration,
}

impl Default for Liveness {
    /// A probe after 30 s of quiet, answered within 10 s: a silent server is noticed within 40 s, at
    /// the cost of one `SELECT 1` per quiet half minute.
    fn default() -> Self {
        Self {
            quiet: Duration::from_secs(30),
            deadline: Duration::from_secs(10),
        }
    }
}

/// What the listener saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// Listening (again): anything enqueued while nobody listened has to be found by a poll.
    Listening,
    /// A job was enqueued on this queue (on another channel than `sluice_jobs`: a notification, with
    /// this payload).
    Enqueued(&'a str),
}

/// Listens on a connection made with `pool`'s settings (see [`listen_with`]) and hands every [`Event`] to `on_event` until `stop` fires or
/// `on_event` breaks. Connection failures, and connections that stop answering ([`Liveness`], the
/// default), are logged at debug level (`what` names the listener) and retried with backoff.
pub async fn listen(
    pool: &PgPool,
    what: &str,
    stop: &CancellationToken,
    on_event: impl FnMut(Event<'_>) -> ControlFlow<()>,
) {
    listen_on(pool, NOTIFY_CHANNEL, what, stop, on_event).await
}

/// [`listen`] on `channel`: [`Event::Enqueued`] carries each notification's payload.
pub async fn listen_on(
    pool: &PgPool,
    channel: &str,
    what: &str,
    stop: &CancellationToken,
    on_event: impl FnMut(Event<'_>) -> ControlFlow<()>,
) {
    listen_with(pool, channel, what, Liveness::default(), stop, on_event).await
}

/// [`listen_on`] with the connection checked as `liveness` says.
///
/// Each LISTEN connection is made with `pool`'s connect options in a pool of its own, one more
/// connection than `pool` holds: sqlx hands a dropped listener's connection back to its pool only
/// after an `UNLISTEN *` on it is answered, which a silent server may never do, and that connection
/// then pins only its own pool, not a slot of `pool`.
pub async fn listen_with(
    pool: &PgPool,
    channel: &str,
    what: &str,
    liveness: Liveness,
    stop: &CancellationToken,
    mut on_event: impl FnMut(Event<'_>) -> ControlFlow<()>,
) {
    let mut wait = RETRY_FIRST;
    loop {
        let connected = async {
            let own = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(liveness.deadline)
                .idle_timeout(None)
                .max_lifetime(None)
                .connect_lazy_with((*pool.connect_options()).clone());
            let mut l = PgListener::connect_with(&own).await?;
            // A lost connection is made again by this loop, under the deadline, and reported; not by
            // `try_recv` itself, where the quiet timer could cut the reconnect short unreported.
            l.eager_reconnect(false);
            l.listen(channel).await?;
            Ok::<_, sqlx::Error>(l)
        };
        let listener = tokio::select! {
            l = tokio::time::timeout(liveness.deadline, connected) => l,
            _ = stop.cancelled() => return,
        };
        match listener {
            Ok(Ok(mut l)) => {
                wait = RETRY_FIRST;
                if on_event(Event::Listening).is_break() {
                    return;
                }
                loop {
                    // Without a reconnect inside it, `try_recv` only reads, and keeps a partly read
                    // message when it is dropped: waiting on it against the quiet timer loses nothing.
                    let n = tokio::select! {
                        n = l.try_recv() => n,
                        () = tokio::time::sleep(liveness.quiet) => {
                            let probed = tokio::select! {
                                p = probe(&mut l, liveness.deadline) => p,
                                _ = stop.cancelled() => return,
                            };
                            if let Err(e) = probed {
                                tracing::debug!(listener = what, error = %e, "LISTEN connection silent");
                                break;
                            }
                            continue;
                        }
                        _ = stop.cancelled() => return,
                    };
                    match &n {
                        Ok(Some(n)) => {
                            if on_event(Event::Enqueued(n.payload())).is_break() {
                                return;
                            }
                        }
                        Ok(None) => {
                            tracing::debug!(listener = what, "LISTEN connection lost");
                            break;
                        }
                        Err(e) => {
                            tracing::debug!(listener = what, error = %e, "LISTEN connection lost");
                            break;
                        }
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(listener = what, error = %e, "LISTEN failed; polling meanwhile")
            }
            Err(_) => tracing::debug!(
                listener = what,
                deadline = ?liveness.deadline,
                "LISTEN unanswered; polling meanwhile"
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        wait = (wait * 2).min(RETRY_MAX);
    }
}

/// Sends `SELECT 1` on the listener's connection (the simple protocol: one round trip, no prepared
/// statement to find again behind a pooler); an error when it fails or is not answered within
/// `deadline`. Notifications that arrive meanwhile are kept for the next `try_recv`.
async fn probe(l: &mut PgListener, deadline: Duration) -> Result<(), String> {
    match tokio::time::timeout(deadline, l.execute("SELECT 1")).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer to a probe within {deadline:?}")),
    }
}
