//! Listening for enqueues: `LISTEN sluice_jobs` (payload: the queue name, sent by `sluice.enqueue` for
//! jobs ready now) on one connection of a pool, reconnecting with backoff, until stopped. Used by the
//! worker (to claim at once) and by the operator (to scale a sleeping queue from 0 to 1). NOTIFY is only
//! a hint: whoever listens also polls, since PgBouncer in transaction mode and replicas cannot LISTEN.
//!
//! [`listen_on`] is the same loop for any channel (the sidecar's job event streams listen on
//! [`crate::events::JOB_EVENTS_CHANNEL`]).

use std::{ops::ControlFlow, time::Duration};

use sqlx::{PgPool, postgres::PgListener};
use tokio_util::sync::CancellationToken;

/// The channel `sluice.enqueue` notifies on, with the queue name as payload (migration 0002).
pub const NOTIFY_CHANNEL: &str = "sluice_jobs";

/// First pause before reconnecting; it doubles after each failure.
const RETRY_FIRST: Duration = Duration::from_millis(100);
/// Longest pause before reconnecting.
const RETRY_MAX: Duration = Duration::from_secs(5);

/// What the listener saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event<'a> {
    /// Listening (again): anything enqueued while nobody listened has to be found by a poll.
    Listening,
    /// A job was enqueued on this queue (on another channel than `sluice_jobs`: a notification, with
    /// this payload).
    Enqueued(&'a str),
}

/// Listens on a connection of `pool` and hands every [`Event`] to `on_event` until `stop` fires or
/// `on_event` breaks. Connection failures are logged at debug level (`what` names the listener) and
/// retried with backoff.
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
    mut on_event: impl FnMut(Event<'_>) -> ControlFlow<()>,
) {
    let mut wait = RETRY_FIRST;
    loop {
        let connected = async {
            let mut l = PgListener::connect_with(pool).await?;
            l.listen(channel).await?;
            Ok::<_, sqlx::Error>(l)
        };
        let listener = tokio::select! {
            l = connected => l,
            _ = stop.cancelled() => return,
        };
        match listener {
            Ok(mut l) => {
                wait = RETRY_FIRST;
                if on_event(Event::Listening).is_break() {
                    return;
                }
                loop {
                    let n = tokio::select! {
                        n = l.try_recv() => n,
                        _ = stop.cancelled() => return,
                    };
                    let event = match &n {
                        Ok(Some(n)) => Event::Enqueued(n.payload()),
                        // sqlx re-established the connection: notifications may have been missed.
                        Ok(None) => Event::Listening,
                        Err(e) => {
                            tracing::debug!(listener = what, error = %e, "LISTEN connection lost");
                            break;
                        }
                    };
                    if on_event(event).is_break() {
                        return;
                    }
                }
            }
            Err(e) => tracing::debug!(listener = what, error = %e, "LISTEN failed; polling meanwhile"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.cancelled() => return,
        }
        wait = (wait * 2).min(RETRY_MAX);
    }
}
