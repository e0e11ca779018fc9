//! Job and queue status streamed over Server-Sent Events: `GET /v1/queues/{queue}/jobs/{id}/events`
//! (a job's state changes until it finishes) and `GET /v1/queues/{queue}/events` (a queue's counts every
//! second).
//!
//! One [`EventHub`] per API fans out to every open stream:
//! - job streams are driven by LISTEN/NOTIFY: one `LISTEN sluice_job_events` connection per hub (started
//!   with the first job stream), whose notifications go to the streams of that job only (a small
//!   broadcast channel per watched job). The database notifies only for queues someone streams: the hub
//!   keeps a row per streamed queue in `sluice.event_subscriptions`, renewed every [`RENEW_EVERY`]
//!   while streams are open (migration 0011), so a queue nobody watches pays no NOTIFY.
//! - queue streams share one ticker per queue, which reads the queue's depth once a second however many
//!   streams are open, and publishes it on a `watch` channel: every stream sends the latest counts.
//!
//! A job stream starts with the job's current state read from the table; each notification for the job
//! that the last read did not already see (by the snapshot it was read under) makes it read the job
//! again and send the state if it changed; it ends after a terminal state. The notification's own
//! content is never sent: any role may `pg_notify` on the channel. A state shorter-lived than a read is
//! folded into the next. A stream whose client reads too slowly to keep up (its channel overflowed), and
//! every stream when the LISTEN connection was lost and re-established or a renewal of the subscription
//! rows failed (they may have expired meanwhile), resyncs from the table: it sends the job's state as it
//! is now if it differs from what it sent last. Nothing a client does holds up any other stream.
//! Comments (`: keep-alive`) every [`KEEP_ALIVE`] keep proxies from closing quiet streams.
//! With callers checked, a stream's caller is checked again every [`Authenticator::recheck_every`]
//! (the gatekeeper's cache makes that cheap) and a refused caller's stream ends with `event: error`.

use std::{
    collections::HashMap,
    convert::Infallible,
    ops::ControlFlow,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Extension,
    extract::{Path, State},
    http::HeaderValue,
    response::{
        IntoResponse, Response,
        sse::{Event, KeepAlive, Sse},
    },
};
use futures::{Stream, StreamExt as _, stream};
use serde_json::json;
use tokio::{
    sync::{broadcast, watch},
    time::Instant,
};
use tokio_util::sync::{CancellationToken, DropGuard};
use uuid::Uuid;

use sluice_queue::{
    Depth, JobState, QueueStore,
    events::{JOB_EVENTS_CHANNEL, JobChange, JobStatus, Snapshot},
};

use super::{
    api::{ApiError, ApiState, Caller},
    auth::{Authenticator, Grant},
};
use crate::error::Error;

/// How long a streamed queue's subscription row lives unless renewed.
pub const SUBSCRIPTION_TTL: Duration = Duration::from_secs(60);
/// How often the hub renews the subscription rows of the queues it streams.
pub const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How often queue streams get counts.
pub const COUNTS_EVERY: Duration = Duration::from_secs(1);
/// Interval of the keep-alive comments.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Changes of one job buffered per stream before a slow stream resyncs from the table.
const JOB_CHANNEL: usize = 16;
/// Longest wait for the LISTEN connection when a job stream opens.
const LISTEN_DEADLINE: Duration = Duration::from_secs(5);
/// A stream opened this soon after its queue's subscription was first written resyncs once when this
/// has passed since then: a transaction that checked for subscribers just before the row was written
/// sent no notification, and committed after the stream's first read.
const SETTLE: Duration = Duration::from_secs(2);

/// What a watched job's channel carries.
#[derive(Clone, Debug)]
enum Msg {
    Change(Arc<JobChange>),
    /// Notifications may have been missed (the LISTEN connection was re-established): read the table.
    Resync,
}

#[derive(Default)]
struct Watches {
    /// Watched jobs, with their channels.
    jobs: HashMap<Uuid, broadcast::Sender<Msg>>,
    /// Open job streams per queue, and when the queue's subscription row was first written (None: not
    /// yet).
    queues: HashMap<String, (usize, Option<Instant>)>,
    /// The counts of each streamed queue (None: the queue is gone).
    counts: HashMap<String, watch::Receiver<Option<Arc<Depth>>>>,
}

struct Shared {
    store: QueueStore,
    /// This process's name in `sluice.event_subscriptions`.
    subscriber: String,
    watches: Mutex<Watches>,
    /// How many times the LISTEN connection was (re-)established; 0 until it first is.
    listening: watch::Sender<u64>,
    /// The background tasks were started.
    started: std::sync::Once,
    /// Stops the background tasks (when the last handle of the hub is dropped).
    stop: CancellationToken,
    /// Ends every open stream (the API is shutting down).
    closing: CancellationToken,
}

struct Hub {
    shared: Arc<Shared>,
    _stop: DropGuard,
}

/// What an [`EventHub`] holds open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubStats {
    /// Open job streams.
    pub job_streams: usize,
    /// Jobs they watch.
    pub jobs_watched: usize,
    /// Queues whose counts are read every second (one reader each).
    pub counted_queues: usize,
}

/// The fan-out of job and queue events to the API's streams; cheap to clone.
#[derive(Clone)]
pub struct EventHub {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for EventHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHub")
            .field("subscriber", &self.hub.shared.subscriber)
            .finish_non_exhaustive()
    }
}

impl EventHub {
    /// A hub over `store`. Nothing runs until the first stream opens.
    pub fn new(store: QueueStore) -> Self {
        let stop = CancellationToken::new();
        Self {
            hub: Arc::new(Hub {
                shared: Arc::new(Shared {
                    store,
                    subscriber: super::worker::default_owner(),
                    watches: Mutex::default(),
                    listening: watch::channel(0).0,
                    started: std::sync::Once::new(),
                    stop: stop.clone(),
                    closing: CancellationToken::new(),
                }),
                _stop: stop.drop_guard(),
            }),
        }
    }

    /// Ends every open stream: the API is shutting down (streams never end by themselves, and a
    /// graceful shutdown waits for open responses).
    pub fn close(&self) {
        self.hub.shared.closing.cancel();
    }

    /// What is open right now.
    pub fn stats(&self) -> HubStats {
        let w = self.hub.shared.watches.lock().expect("watches lock");
        HubStats {
            job_streams: w.queues.values().map(|q| q.0).sum(),
            jobs_watched: w.jobs.len(),
            counted_queues: w.counts.len(),
        }
    }

    fn start(&self) {
        let shared = &self.hub.shared;
        shared.started.call_once(|| {
            tokio::spawn(listen(shared.clone()));
            tokio::spawn(renew(shared.clone()));
        });
    }

    /// Watches job `id` of `queue`: 404 when no such job is in that queue, 503 when the database or
    /// its LISTEN connection is unavailable.
    async fn watch_job(&self, queue: &str, id: Uuid) -> Result<JobWatch, ApiError> {
        self.start();
        let shared = self.hub.shared.clone();
        let (rx, registered_at) = {
            let mut w = shared.watches.lock().expect("watches lock");
            let rx = w
                .jobs
                .entry(id)
                .or_insert_with(|| broadcast::channel(JOB_CHANNEL).0)
                .subscribe();
            let q = w.queues.entry(queue.to_owned()).or_insert((0, None));
            q.0 += 1;
            (rx, q.1)
        };
        let guard = JobGuard {
            shared: shared.clone(),
            queue: queue.to_owned(),
            id,
        };
        // The subscription row is committed and the LISTEN connection up before the job is read: every
        // change committed after the read is notified.
        let registered_at = match registered_at {
            Some(at) => at,
            None => {
                let queues = shared.streamed_queues();
                shared
                    .store
                    .subscribe_events(&shared.subscriber, &queues, SUBSCRIPTION_TTL)
                    .await
                    .map_err(|e| ApiError::from(Error::from(e)))?;
                let now = Instant::now();
                let mut w = shared.watches.lock().expect("watches lock");
                let q = w.queues.get_mut(queue).expect("held by the guard");
                *q.1.get_or_insert(now)
            }
        };
        let mut listening = shared.listening.subscribe();
        if tokio::time::timeout(LISTEN_DEADLINE, listening.wait_for(|n| *n > 0))
            .await
            .is_err()
        {
            return Err(ApiError::from(Error::Io(std::io::Error::other(
                "LISTEN sluice_job_events: no connection",
            ))));
        }
        let status = shared
            .store
            .job_status(id)
            .await
            .map_err(|e| ApiError::from(Error::from(e)))?
            .filter(|s| s.queue == queue)
            .ok_or_else(|| ApiError::from(Error::NotFound(format!("job {id}"))))?;
        let settle = registered_at + SETTLE;
        Ok(JobWatch {
            queue: queue.to_owned(),
            id,
            rx,
            snapshot: status.snapshot.clone(),
            last: None,
            first: Some(status),
            settle_at: (Instant::now() < settle).then_some(settle),
            done: false,
            guard,
        })
    }

    /// The counts of `queue`, refreshed every [`COUNTS_EVERY`] by one ticker per queue.
    fn watch_counts(&self, queue: &str) -> watch::Receiver<Option<Arc<Depth>>> {
        let shared = &self.hub.shared;
        let mut w = shared.watches.lock().expect("watches lock");
        if let Some(rx) = w.counts.get(queue)
            && rx.has_changed().is_ok()
        {
            return rx.clone();
        }
        let (tx, rx) = watch::channel(None);
        w.counts.insert(queue.to_owned(), rx.clone());
        tokio::spawn(tick_counts(shared.clone(), queue.to_owned(), tx));
        rx
    }
}

impl Shared {
    /// Queues with open job streams.
    fn streamed_queues(&self) -> Vec<String> {
        let w = self.watches.lock().expect("watches lock");
        w.queues.keys().cloned().collect()
    }

    /// Resyncs every job stream.
    fn resync_all(&self) {
        let w = self.watches.lock().expect("watches lock");
        for tx in w.jobs.values() {
            let _ = tx.send(Msg::Resync);
        }
    }
}

/// Removes a job stream's interest when the stream ends.
struct JobGuard {
    shared: Arc<Shared>,
    queue: String,
    id: Uuid,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        let mut w = self.shared.watches.lock().expect("watches lock");
        // The stream's own receiver is dropped after this guard (field order), so at most one receiver
        // (its own) may remain.
        if w.jobs.get(&self.id).is_some_and(|tx| tx.receiver_count() <= 1) {
            w.jobs.remove(&self.id);
        }
        if let Some(q) = w.queues.get_mut(&self.queue) {
            q.0 -= 1;
            if q.0 == 0 {
                // The row expires or is dropped by the next renewal.
                w.queues.remove(&self.queue);
            }
        }
    }
}

/// The LISTEN connection: hands each notification to the streams of its job.
async fn listen(shared: Arc<Shared>) {
    let stop = shared.stop.clone();
    let pool = shared.store.pool().clone();
    sluice_queue::listen::listen_on(&pool, JOB_EVENTS_CHANNEL, "job events", &stop, |event| {
        match event {
            sluice_queue::listen::Event::Listening => {
                shared.listening.send_modify(|n| *n += 1);
                shared.resync_all();
            }
            sluice_queue::listen::Event::Enqueued(payload) => match JobChange::parse(payload) {
                Some(change) => {
                    let w = shared.watches.lock().expect("watches lock");
                    if let Some(tx) = w.jobs.get(&change.id) {
                        let _ = tx.send(Msg::Change(Arc::new(change)));
                    }
                }
                None => tracing::debug!(payload, "unreadable job event"),
            },
        }
        ControlFlow::Continue(())
    })
    .await
}

/// Keeps the subscription rows of the streamed queues alive, and drops those of queues no longer
/// streamed.
async fn renew(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut had_rows = true;
    let mut failed = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.stop.cancelled() => break,
        }
        let queues = shared.streamed_queues();
        if queues.is_empty() && !had_rows {
            continue;
        }
        match shared
            .store
            .subscribe_events(&shared.subscriber, &queues, SUBSCRIPTION_TTL)
            .await
        {
            Ok(()) => {
                had_rows = !queues.is_empty();
                // The rows may have expired meanwhile, and changes gone unnotified: read the table.
                if std::mem::take(&mut failed) {
                    shared.resync_all();
                }
            }
            Err(e) => {
                failed = true;
                tracing::warn!(error = %e, "renewing job event subscriptions failed");
            }
        }
    }
    // Stopped: drop this process's rows at once rather than leave them to expire.
    let _ = shared
        .store
        .subscribe_events(&shared.subscriber, &[], SUBSCRIPTION_TTL)
        .await;
}

/// One queue's ticker: its depth every [`COUNTS_EVERY`] while some stream watches it.
async fn tick_counts(shared: Arc<Shared>, queue: String, tx: watch::Sender<Option<Arc<Depth>>>) {
    let mut tick = tokio::time::interval(COUNTS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Leaves the hub's map (under its lock, where streams take their receivers, so none takes one
    // from a ticker that is ending) when only the map's receiver is left or `done`.
    let leave = |done: bool| {
        let mut w = shared.watches.lock().expect("watches lock");
        if done || tx.receiver_count() <= 1 {
            if w.counts
                .get(&queue)
                .is_some_and(|rx| rx.same_channel(&tx.subscribe()))
            {
                w.counts.remove(&queue);
            }
            return true;
        }
        false
    };
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.stop.cancelled() => break,
        }
        if leave(false) {
            return;
        }
        match shared.store.depth(&queue).await {
            Ok(depth) => {
                let gone = depth.is_none();
                tx.send_replace(depth.map(Arc::new));
                if gone {
                    break;
                }
            }
            Err(e) => tracing::debug!(queue, error = %e, "reading queue counts failed"),
        }
    }
    leave(true);
}

/// One job stream.
struct JobWatch {
    queue: String,
    id: Uuid,
    // Dropped before `rx` (fields drop in order): see `JobGuard`.
    guard: JobGuard,
    rx: broadcast::Receiver<Msg>,
    /// Changes this snapshot saw are already reflected in what was sent.
    snapshot: Snapshot,
    last: Option<(JobState, i32)>,
    first: Option<JobStatus>,
    settle_at: Option<Instant>,
    done: bool,
}

/// What a job stream sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JobEvent {
    /// `event: state`: the job's state and attempts.
    State(JobState, i32),
    /// `event: gone`: the job no longer exists (deleted by retention while streamed).
    Gone,
}

impl JobWatch {
    fn event(&self, e: JobEvent) -> Event {
        match e {
            JobEvent::State(state, attempt) => {
                let data = json!({"id": self.id, "queue": self.queue, "state": state, "attempt": attempt});
                Event::default().event("state").data(data.to_string())
            }
            JobEvent::Gone => Event::default()
                .event("gone")
                .data(json!({"id": self.id, "queue": self.queue}).to_string()),
        }
    }

    async fn next(&mut self) -> Option<JobEvent> {
        if self.done {
            return None;
        }
        if let Some(s) = self.first.take() {
            return Some(self.emit(s.state, s.attempt).expect("nothing sent yet"));
        }
        loop {
            let msg = tokio::select! {
                m = self.rx.recv() => m,
                _ = tokio::time::sleep_until(self.settle_at.unwrap_or_else(Instant::now)), if self.settle_at.is_some() => {
                    self.settle_at = None;
                    Ok(Msg::Resync)
                }
            };
            // A notification only says that the job changed, never what it is now: any role may
            // `pg_notify` on the channel, so its payload could be forged (a job "succeeded" to end the
            // stream). What the stream sends is read from the table; a notification the last read
            // already reflects costs nothing.
            let (state, attempt) = match msg {
                Ok(Msg::Change(c)) if self.snapshot.saw(&c.xid) => continue,
                Ok(Msg::Change(_) | Msg::Resync) | Err(broadcast::error::RecvError::Lagged(_)) => {
                    match self.guard.shared.store.job_status(self.id).await {
                        Ok(Some(s)) if s.queue == self.queue => {
                            self.snapshot = s.snapshot;
                            (s.state, s.attempt)
                        }
                        Ok(_) => {
                            // Deleted (retention) or moved: nothing more will come.
                            self.done = true;
                            return Some(JobEvent::Gone);
                        }
                        Err(e) => {
                            tracing::debug!(job = %self.id, error = %e, "job stream resync failed");
                            return None;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            if let Some(event) = self.emit(state, attempt) {
                return Some(event);
            }
        }
    }

    /// The event for (state, attempt), unless that is what was sent last.
    fn emit(&mut self, state: JobState, attempt: i32) -> Option<JobEvent> {
        if self.last == Some((state, attempt)) {
            return None;
        }
        self.last = Some((state, attempt));
        self.done = state.is_terminal();
        Some(JobEvent::State(state, attempt))
    }
}

/// `events`, ended with `event: error` (`{"code", "message"}` as in an error body) once the caller's
/// token or right is refused when checked again, every [`Authenticator::recheck_every`]. An API
/// server that cannot be asked does not end the stream; the next check asks again.
fn rechecked(
    events: impl Stream<Item = Event> + Send + 'static,
    guard: Option<(Arc<Authenticator>, Grant)>,
) -> stream::BoxStream<'static, Event> {
    let Some((auth, grant)) = guard else {
        return events.boxed();
    };
    let every = auth.recheck_every();
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    stream::unfold(
        (events.boxed(), ticks, Some((auth, grant))),
        |(mut events, mut ticks, guard)| async move {
            let (auth, grant) = guard?;
            loop {
                tokio::select! {
                    e = events.next() => return Some((e?, (events, ticks, Some((auth, grant))))),
                    _ = ticks.tick() => match auth.recheck(&grant).await {
                        Ok(()) => {}
                        Err(refusal @ super::auth::Refusal::Unavailable(_)) => {
                            tracing::debug!(reason = refusal.message(), "status stream not rechecked");
                        }
                        Err(refusal) => {
                            let data = json!({"code": refusal.code(), "message": refusal.message()});
                            let last = Event::default().event("error").data(data.to_string());
                            return Some((last, (events, ticks, None)));
                        }
                    },
                }
            }
        },
    )
    .boxed()
}

/// The caller's gatekeeper and grant, when callers are checked.
fn guard(st: &ApiState, caller: Option<Extension<Caller>>) -> Option<(Arc<Authenticator>, Grant)> {
    Some((st.auth.clone()?, caller?.0.grant))
}

fn sse(events: impl Stream<Item = Event> + Send + 'static, closing: CancellationToken) -> Response {
    let events = events
        .map(Ok::<_, Infallible>)
        .take_until(closing.cancelled_owned());
    let mut resp = Sse::new(events)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE).text("keep-alive"))
        .into_response();
    // nginx buffers responses unless told not to.
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// `GET /v1/queues/{queue}/jobs/{id}/events`.
pub(super) async fn job_events(
    State(st): State<ApiState>,
    Path((queue, id)): Path<(String, String)>,
    caller: Option<Extension<Caller>>,
) -> Result<Response, ApiError> {
    let queue = st.check_queue(&queue)?;
    let id = super::api::parse_id(&id)?;
    let watch = st.events.watch_job(&queue, id).await?;
    let events = stream::unfold(watch, |mut w| async move {
        let e = w.next().await?;
        Some((w.event(e), w))
    });
    let events = rechecked(events, guard(&st, caller));
    Ok(sse(events, st.events.hub.shared.closing.clone()))
}

/// `GET /v1/queues/{queue}/events`.
pub(super) async fn queue_events(
    State(st): State<ApiState>,
    Path(queue): Path<String>,
    caller: Option<Extension<Caller>>,
) -> Result<Response, ApiError> {
    let queue = st.check_queue(&queue)?;
    if st.store.queue(&queue).await?.is_none() {
        return Err(Error::NotFound(format!("queue {queue:?}")).into());
    }
    let rx = st.events.watch_counts(&queue);
    let events = stream::unfold(rx, |mut rx| async move {
        rx.changed().await.ok()?;
        let depth = rx.borrow_and_update().clone()?;
        let data = serde_json::to_string(&*depth).ok()?;
        Some((Event::default().event("counts").data(data), rx))
    });
    let events = rechecked(events, guard(&st, caller));
    Ok(sse(events, st.events.hub.shared.closing.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_queue::{
        NewJob, QueueSettings,
        store::{Finish, Finished},
    };

    #[tokio::test]
    async fn a_stream_that_falls_behind_resyncs_from_the_table() {
        let pg = tokio::task::spawn_blocking(sluice_testsupport::PgServer::start)
            .await
            .unwrap();
        let pool = sluice_queue::pool::connect_lazy(&pg.url(), 4).unwrap();
        sluice_queue::schema::migrate(&pool).await.unwrap();
        let store = QueueStore::new(pool);
        let settings = QueueSettings {
            max_attempts: 100,
            ..QueueSettings::defaults("q")
        };
        store.upsert_queue(&settings).await.unwrap();
        let id = store.enqueue("q", &NewJob::new("k", json!({}))).await.unwrap().id;
        let hub = EventHub::new(store.clone());
        let mut w = hub.watch_job("q", id).await.unwrap();
        assert_eq!(w.next().await, Some(JobEvent::State(JobState::Pending, 0)));

        // 2 × 20 + 2 changes while the stream reads nothing: more than its channel holds.
        let lease = Duration::from_secs(30);
        let mut changes = 0;
        for n in 1..=21 {
            let claimed = store.claim_batch("q", "w", 1, lease).await.unwrap();
            assert_eq!(claimed[0].attempt, n);
            let finish = if n < 21 {
                Finish::Retry {
                    delay: Duration::ZERO,
                    error: "again".into(),
                }
            } else {
                Finish::Succeeded
            };
            let done = Finished {
                id,
                attempt: n,
                finish,
            };
            assert_eq!(store.finish_batch("w", &[done]).await.unwrap().len(), 1);
            changes += 2;
        }
        sluice_testsupport::wait_for_async(
            "every change to reach the stream's channel",
            Duration::from_secs(15),
            || {
                let queued = w.rx.len();
                async move { (queued >= changes).then_some(()) }
            },
        )
        .await;
        assert!(changes > JOB_CHANNEL);
        // Lagged: the stream reads the table and goes straight to the job's state now.
        assert_eq!(w.next().await, Some(JobEvent::State(JobState::Succeeded, 21)));
        assert_eq!(w.next().await, None);
        drop(w);
        assert_eq!(hub.stats().jobs_watched, 0);
    }
}
