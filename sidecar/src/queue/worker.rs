//! The worker engine shared by the in-process [`Worker`] and the sidecar's worker role (the engine plus
//! [`super::dispatch::HttpHandler`]).
//!
//! Parts, each a task:
//! - the **claim loop** claims as many jobs as there are free handler slots plus a few ahead (up to the
//!   claim batch) in one `FOR UPDATE SKIP LOCKED` query and queues them locally; when the queues are
//!   empty it sleeps until a NOTIFY hint, or a poll timer that backs off from `poll_interval` to
//!   `max_poll_interval`;
//! - the **dispatcher** starts the locally queued jobs in claim order, one task per job, as handler slots
//!   (`concurrency` of them) free up;
//! - the **listener** LISTENs on `sluice_jobs` and turns notifications into one coalesced wake-up;
//! - the **heartbeat** extends the leases of running jobs (and of finished jobs whose outcome is not
//!   written yet), delivers cancellation requests, and stops a job whose lease was lost (another worker
//!   rescued it);
//! - the **completer** writes finished attempts in batches (up to two at once), fenced on (id, running,
//!   owner, attempt);
//! - **maintenance** rescues expired leases, deletes finished jobs past retention in bounded batches and
//!   refreshes the depth gauges; for a while after a claim was given up unanswered, it hands back the
//!   jobs that claim leased to this worker if the server committed it after all
//!   ([`return_unknown_claims`]).
//!
//! While the database refuses to record finished jobs, the claim loops take no new work ([`Intake`]):
//! every job claimed would run and have its outcome refused too.
//!
//! A handler slot is free again as soon as its handler returns, so a slot never waits for a database
//! round trip: claims run ahead of the slots and completions are written behind them. Two bounds keep
//! that finite: the jobs claimed but not started are at most what the slots free during one claim round
//! trip (measured: `concurrency × claim time / handler time`, at most `claim_batch`), and the jobs this
//! worker holds a lease on (queued, running, or finished and not yet written) are at most
//! `2 × (concurrency + claim_batch)`: when the completer falls behind, claims wait for it.
//!
//! Shutdown: claims stop at once; jobs queued but not started are handed back at once; in-flight jobs get
//! `shutdown_grace` to finish; the rest are stopped and handed back (lease released, attempt not
//! counted), not left to expire.

use std::{
    collections::HashMap,
    future::Future,
    ops::ControlFlow,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc},
    task::JoinSet,
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use sluice_crds::sidecar_config::{
    ANSWER_DEADLINE_DEFAULT, CLAIM_BATCH_DEFAULT, JOB_TIMEOUT_DEFAULT, MAX_POLL_INTERVAL_DEFAULT,
    POLL_INTERVAL_DEFAULT, SHUTDOWN_GRACE_DEFAULT, WORKER_CONCURRENCY_DEFAULT,
};
use sluice_queue::{
    ClaimedJob, NOTIFY_CHANNEL, QueueSettings, QueueStore,
    error::Unanswered,
    listen::{Event, Liveness},
    store::{Finish, Finished, Held},
};

use super::metrics::QueueMetrics;
use crate::error::Result;
/// Most finished attempts written by one completer statement.
const COMPLETER_BATCH: usize = 1000;
/// Completer batches written at once (measured: 2 keeps both of a 2-core database's cores busy next to
/// the claim loops; 1 left it idle between batches).
const COMPLETER_WRITES: usize = 2;
/// A batch smaller than this waits for the write under way before it is written (see [`complete`]).
const COMPLETER_GATHER: usize = 100;
/// Longest a small batch gathers (see [`gather_deadline`]).
const COMPLETER_GATHER_MAX: Duration = Duration::from_millis(10);
/// How long a small batch gathers before any write has been timed.
const COMPLETER_GATHER_FIRST: Duration = Duration::from_millis(2);
/// How long, in leases of its queue, a finished job is still renewed once the write of its outcome has
/// started failing (see [`record`]).
const FINISHING_RENEWAL_AFTER_FAILURE: u32 = 1;
/// How long, in leases of its queue, after a claim was given up unanswered the worker keeps looking for
/// jobs that claim leased to it when it committed after all (see [`return_unknown_claims`]).
const UNKNOWN_CLAIMS_SEARCHED_FOR: u32 = 2;
/// How long, in leases of its queue, a job whose outcome the completer gave up writing is still named
/// as held when unknown claims are handed back: its lease lapses within one (it is no longer renewed),
/// and a lapsed lease is the rescue's.
const ABANDONED_KEPT_FOR: u32 = 2;
/// Longest a heartbeat waits for the row of one running job another transaction holds (a quarter of
/// the heartbeat interval when that is shorter).
const HEARTBEAT_ROW_WAIT_MAX: Duration = Duration::from_millis(250);
/// Most expired leases rescued, or finished jobs deleted, by one statement.
const MAINTENANCE_BATCH: i64 = 1000;
/// How often finished jobs past retention are deleted.
const RETENTION_INTERVAL: Duration = Duration::from_secs(30);
/// How long a handler whose job was cancelled may take to return after its token fires.
pub const CANCEL_GRACE: Duration = Duration::from_secs(5);
/// How often the depth gauges and cached queue settings are refreshed.
const REFRESH_INTERVAL: Duration = Duration::from_secs(5);

/// How a handler's attempt ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done.
    Succeeded,
    /// Failed; retry with backoff (dead after the last attempt).
    Retry(String),
    /// Failed; retry after the given delay instead of the queue's backoff (dead after the last attempt).
    RetryAfter(Duration, String),
    /// Failed for good: dead at once.
    Permanent(String),
    /// Stopped because cancellation was requested.
    Cancelled,
}

/// Work for jobs, in process. When the job is cancelled, `cancel` fires and the handler has
/// [`CANCEL_GRACE`] to return (say [`Outcome::Cancelled`]) before its future is dropped. When the lease is
/// lost, or shutdown passes its grace period, the future is dropped at once.
pub trait Handler: Send + Sync + 'static {
    /// Handles one attempt of `job`.
    fn handle(&self, job: ClaimedJob, cancel: CancellationToken) -> impl Future<Output = Outcome> + Send;
}

/// How a worker runs.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// Queues served (round robin between them).
    pub queues: Vec<String>,
    /// Jobs handled at once.
    pub concurrency: usize,
    /// Most jobs claimed by one query.
    pub claim_batch: u32,
    /// Claim loops running at once (each claims up to `claim_batch` while permits are free).
    pub claimers: usize,
    /// Shortest wait between polls of empty queues.
    pub poll_interval: Duration,
    /// Longest wait between polls of empty queues.
    pub max_poll_interval: Duration,
    /// LISTEN for wake-up hints (off: polling only).
    pub listen: bool,
    /// Deadline of one attempt; past it the attempt fails and is retried.
    pub job_timeout: Duration,
    /// Time in-flight jobs get to finish after shutdown is asked for.
    pub shutdown_grace: Duration,
    /// Heartbeat interval; None: a third of the shortest lease of the served queues.
    pub heartbeat_interval: Option<Duration>,
    /// The lease owner written on claimed jobs (see [`default_owner`]). Unique per engine: jobs leased to
    /// it that this engine does not hold may be handed back after a given-up claim.
    pub owner: String,
    /// Claim only jobs of these kinds (empty: every kind).
    pub kinds: Vec<String>,
    /// How long one of the worker's statements may go unanswered before its connection is closed and
    /// the statement retried on another (see [`QueueStore::with_answer_deadline`]). Keep it below the
    /// heartbeat interval, so that a heartbeat stuck on a dead connection is retried before the leases
    /// it renews run out.
    pub answer_deadline: Duration,
}

/// Claim loops a worker runs at once: two keep claims flowing while one waits for its query.
pub const CLAIMERS_DEFAULT: usize = 2;

impl WorkerOptions {
    /// Defaults for serving `queues` (those of the config's `queue.worker` and `queue.handler`).
    pub fn new(queues: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self {
            queues: queues.into_iter().map(Into::into).collect(),
            concurrency: WORKER_CONCURRENCY_DEFAULT as usize,
            claim_batch: CLAIM_BATCH_DEFAULT,
            claimers: CLAIMERS_DEFAULT,
            poll_interval: POLL_INTERVAL_DEFAULT.get(),
            max_poll_interval: MAX_POLL_INTERVAL_DEFAULT.get(),
            listen: true,
            job_timeout: JOB_TIMEOUT_DEFAULT.get(),
            shutdown_grace: SHUTDOWN_GRACE_DEFAULT.get(),
            heartbeat_interval: None,
            owner: default_owner(),
            kinds: Vec::new(),
            answer_deadline: ANSWER_DEADLINE_DEFAULT.get(),
        }
    }
}

/// The lease owner of this process: the pod's name (`SLUICE_POD_NAME`, else the hostname) plus a
/// process-unique suffix, so the operator can tell which pod holds a lease and two processes in one pod
/// never share one.
pub fn default_owner() -> String {
    let pod = crate::config::env::pod_name(&crate::config::env::ProcessEnv);
    format!("{pod}-{:08x}", rand::random::<u32>())
}

/// Why a running job's handler was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StopReason {
    Cancel,
    Lost,
    Shutdown,
}

struct InFlight {
    attempt: i32,
    queue: String,
    stop: CancellationToken,
    reason: Arc<Mutex<Option<StopReason>>>,
    finishing: Arc<AtomicBool>,
}

impl InFlight {
    fn stop(&self, why: StopReason) {
        let mut r = self.reason.lock().expect("reason lock");
        if r.is_none() {
            *r = Some(why);
        }
        self.stop.cancel();
    }
}

struct Done {
    id: Uuid,
    attempt: i32,
    queue: String,
    kind: String,
    /// None: hand the job back.
    finish: Option<Finish>,
    /// The job's lease permit, released only once the outcome is written: until then the job is still
    /// running in the database, and claiming more meanwhile would let finished-but-unrecorded jobs pile
    /// up without bound whenever the completer falls behind.
    _lease: OwnedSemaphorePermit,
}

/// A claimed job waiting for a handler slot.
struct Ready {
    job: ClaimedJob,
    stop: CancellationToken,
    reason: Arc<Mutex<Option<StopReason>>>,
    finishing: Arc<AtomicBool>,
    lease: OwnedSemaphorePermit,
}

/// What sizes the claims: jobs claimed and not started, and how long claims and handlers take.
#[derive(Default)]
struct Ahead {
    /// Jobs claimed (or being claimed) and not yet started.
    queued: usize,
    /// Moving average of one claim statement's time, seconds.
    claim_secs: f64,
    /// Moving average of one handler's time, seconds; None until a handler has returned.
    handler_secs: Option<f64>,
}

/// Weight of the newest sample in the moving averages of [`Ahead`].
const AHEAD_EWMA: f64 = 0.1;

impl Ahead {
    /// Jobs worth claiming now: the free slots, plus what the slots free while one claim is under way,
    /// less what is already queued; at most `batch`, and 0 until at least half the target is missing
    /// (or a whole batch), so the local queue is refilled by a few claims rather than one per job.
    fn reserve(&mut self, free_slots: usize, concurrency: usize, max_ahead: usize, batch: usize) -> usize {
        let ahead = match self.handler_secs {
            Some(h) if h > 0.0 => {
                ((concurrency as f64 * self.claim_secs / h).round() as usize).min(max_ahead)
            }
            Some(_) => max_ahead,
            None => 0,
        };
        let target = free_slots + ahead;
        let n = target.saturating_sub(self.queued).min(batch);
        if n == 0 || (n < batch && 2 * n < target) {
            return 0;
        }
        self.queued += n;
        n
    }
}

/// The claim loops' room: how many jobs a loop may claim now ([`Ahead::reserve`]), and the wake-up of
/// loops waiting for room whenever it may have grown: a handler slot freed, or a claim that got fewer
/// jobs than it reserved gave the rest back. Without the second, a loop woken by a NOTIFY while another
/// loop's claim held the whole reservation waited for a slot to free up, and the job that NOTIFY
/// announced (committed after the other claim's snapshot) waited for that other loop's next poll.
/// Room also grows without a wake-up ([`Room::started`], the moving averages changing): no job waits on
/// it, since the loop that claimed goes on claiming and every job that ends frees a slot.
#[derive(Default)]
struct Room {
    ahead: Mutex<Ahead>,
    grown: Notify,
}

impl Room {
    /// Waits until there is room to claim (`free_slots()` read each time) and reserves it: the number of
    /// jobs to claim. None when `shutdown` fires first.
    async fn reserve(
        &self,
        free_slots: impl Fn() -> usize,
        concurrency: usize,
        max_ahead: usize,
        batch: usize,
        shutdown: &CancellationToken,
    ) -> Option<usize> {
        loop {
            let grown = self.grown.notified();
            let mut grown = std::pin::pin!(grown);
            grown.as_mut().enable();
            let n =
                self.ahead
                    .lock()
                    .expect("ahead lock")
                    .reserve(free_slots(), concurrency, max_ahead, batch);
            if n > 0 {
                return Some(n);
            }
            tokio::select! {
                _ = grown => {}
                _ = shutdown.cancelled() => return None,
            }
        }
    }

    /// A claim got `claimed` of the `reserved` jobs: the rest is room again, for any loop waiting.
    fn settle(&self, reserved: usize, claimed: usize) {
        self.ahead.lock().expect("ahead lock").queued -= reserved - claimed;
        if claimed < reserved {
            self.grown.notify_waiters();
        }
    }

    /// A handler slot was freed.
    fn slot_freed(&self) {
        self.grown.notify_waiters();
    }

    /// A queued job took a handler slot.
    fn started(&self) {
        self.ahead.lock().expect("ahead lock").queued -= 1;
    }

    /// One claim statement took `secs`.
    fn claim_took(&self, secs: f64) {
        let mut ahead = self.ahead.lock().expect("ahead lock");
        ahead.claim_secs = ewma(ahead.claim_secs, secs);
    }

    /// One handler took `secs`.
    fn handler_took(&self, secs: f64) {
        let mut ahead = self.ahead.lock().expect("ahead lock");
        ahead.handler_secs = Some(ahead.handler_secs.map_or(secs, |h| ewma(h, secs)));
    }
}

fn ewma(old: f64, sample: f64) -> f64 {
    old + AHEAD_EWMA * (sample - old)
}

/// What the claim loops may take, by what the completer's writes of finished jobs met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Claims as usual.
    Open,
    /// A write was refused by the database since the latest successful one and is still retried:
    /// nothing is claimed, since each job claimed would run and its outcome be refused too.
    Paused,
    /// Every write refused since the latest successful one was given up: one job is claimed at a time,
    /// and only while the worker holds no other, until a write succeeds (or is refused again).
    Probing,
}

/// The claim loops' pause while the database refuses to record finished jobs (see [`record`] and
/// docs/queue.md, "Completion"). A batch counts from its first refusal until it is written or given up,
/// unless some other write succeeds meanwhile: then its refusals are its own (a row the database
/// refuses, say), not the database's, and hold no claims back.
#[derive(Default)]
struct Intake {
    state: Mutex<IntakeState>,
    changed: Notify,
}

#[derive(Default)]
struct IntakeState {
    /// Successful writes of finished jobs so far.
    written: u64,
    /// Batches refused since the latest successful write and still retried.
    refused: usize,
    /// Whether a write was refused since the latest successful one.
    refusing: bool,
}

impl IntakeState {
    fn mode(&self) -> Mode {
        match (self.refusing, self.refused) {
            (false, _) => Mode::Open,
            (true, 0) => Mode::Probing,
            (true, _) => Mode::Paused,
        }
    }
}

impl Intake {
    fn mode(&self) -> Mode {
        self.state.lock().expect("intake lock").mode()
    }

    /// Applies `change` to the state, waking the claim loops when the mode changed (read before and
    /// after under one lock, so that no change between two updates goes unannounced).
    fn update(&self, change: impl FnOnce(&mut IntakeState)) {
        let mut s = self.state.lock().expect("intake lock");
        let before = s.mode();
        change(&mut s);
        let after = s.mode();
        drop(s);
        if after != before {
            self.changed.notify_waiters();
        }
    }

    /// The write of a batch was refused by the database; `counted` is the batch's mark (None until its
    /// first refusal).
    fn refused(&self, counted: &mut Option<u64>, metrics: &QueueMetrics) {
        if counted.is_some() {
            return;
        }
        self.update(|s| {
            *counted = Some(s.written);
            s.refused += 1;
            if !s.refusing {
                s.refusing = true;
                metrics.claims_paused(true);
                tracing::warn!(
                    "the database refuses to record finished jobs: claims paused until a write succeeds"
                );
            }
        });
    }

    /// A write of finished jobs succeeded.
    fn written(&self, metrics: &QueueMetrics) {
        self.update(|s| {
            s.written += 1;
            s.refused = 0;
            if s.refusing {
                s.refusing = false;
                metrics.claims_paused(false);
                tracing::info!("finished jobs are recorded again: claims resumed");
            }
        });
    }

    /// A batch marked `counted` is no longer retried (written, given up, or shutdown).
    fn settled(&self, counted: Option<u64>) {
        self.update(|s| {
            if counted.is_some_and(|c| c == s.written) {
                s.refused -= 1;
            }
        });
    }

    /// The engine stops: a pause it reported ends with it.
    fn close(&self, metrics: &QueueMetrics) {
        let mut s = self.state.lock().expect("intake lock");
        if s.refusing {
            s.refusing = false;
            metrics.claims_paused(false);
        }
    }
}

/// A batch's mark in the [`Intake`], settled when the batch is dropped whatever ends it.
struct IntakeMark<'a> {
    intake: &'a Intake,
    counted: Option<u64>,
}

impl Drop for IntakeMark<'_> {
    fn drop(&mut self) {
        self.intake.settled(self.counted);
    }
}

struct Shared<H> {
    store: QueueStore,
    handler: H,
    opts: WorkerOptions,
    metrics: Arc<QueueMetrics>,
    inflight: Mutex<HashMap<Uuid, InFlight>>,
    settings: Mutex<HashMap<String, QueueSettings>>,
    wake: Notify,
    room: Room,
    /// Moving average of one completer write's time, seconds; None until a write has succeeded.
    write_secs: Mutex<Option<f64>>,
    intake: Intake,
    /// Held (read) by a claim loop from its claim statement until it has registered what it claimed;
    /// taken (write) to name the jobs the worker holds when it hands back unknown claims.
    claiming: tokio::sync::RwLock<()>,
    /// Until when unknown claims are looked for (a claim was given up unanswered).
    unknown_claims_until: Mutex<Option<tokio::time::Instant>>,
    /// Jobs whose outcome the completer gave up writing (they ran): attempt, and until when they are
    /// named as held ([`ABANDONED_KEPT_FOR`]).
    abandoned: Mutex<HashMap<Uuid, (i32, tokio::time::Instant)>>,
}

impl<H> Shared<H> {
    fn settings(&self, queue: &str) -> QueueSettings {
        self.settings
            .lock()
            .expect("settings lock")
            .get(queue)
            .cloned()
            .unwrap_or_else(|| QueueSettings::defaults(queue))
    }
}

/// A worker: the engine with a handler. Build it, then [`Worker::run`] it until shutdown. It uses up to
/// seven connections of the store's pool at once (LISTEN, two claim loops, two completer writes,
/// heartbeat, maintenance).
pub struct Worker<H> {
    store: QueueStore,
    handler: H,
    opts: WorkerOptions,
    metrics: Arc<QueueMetrics>,
}

impl<H: Handler> Worker<H> {
    /// A worker serving `opts.queues` with `handler`.
    pub fn new(store: QueueStore, handler: H, opts: WorkerOptions) -> Self {
        Self {
            store: store.with_answer_deadline(opts.answer_deadline),
            handler,
            opts,
            metrics: Arc::new(QueueMetrics::new()),
        }
    }

    /// Reports into `metrics` instead of a private registry.
    pub fn with_metrics(mut self, metrics: Arc<QueueMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The worker's metrics.
    pub fn metrics(&self) -> Arc<QueueMetrics> {
        self.metrics.clone()
    }

    /// Runs until `shutdown` fires, then drains as described in the module docs. Creates the served
    /// queues (default settings) when they do not exist, retrying while the database is unreachable.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let shared = Arc::new(Shared {
            store: self.store,
            handler: self.handler,
            opts: self.opts,
            metrics: self.metrics,
            inflight: Mutex::new(HashMap::new()),
            settings: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            room: Room::default(),
            write_secs: Mutex::new(None),
            intake: Intake::default(),
            claiming: tokio::sync::RwLock::new(()),
            unknown_claims_until: Mutex::new(None),
            abandoned: Mutex::new(HashMap::new()),
        });
        if !prepare_queues(&shared, &shutdown).await {
            return Ok(());
        }
        let background = CancellationToken::new();
        let mut tasks = JoinSet::new();
        if shared.opts.listen {
            tasks.spawn(listen(shared.clone(), background.clone()));
        }
        tasks.spawn(heartbeat(shared.clone(), background.clone()));
        tasks.spawn(maintenance(shared.clone(), background.clone()));
        let (done_tx, done_rx) = mpsc::unbounded_channel();
        let completer = tokio::spawn(complete(shared.clone(), done_rx, shutdown.clone()));

        let concurrency = shared.opts.concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let lease_permits = 2 * (concurrency + max_ahead(&shared.opts));
        let leases = Arc::new(Semaphore::new(lease_permits));
        let (ready_tx, mut ready_rx) = mpsc::unbounded_channel::<Ready>();
        let mut jobs: JoinSet<()> = JoinSet::new();
        let claims = futures::future::join_all(
            (0..shared.opts.claimers.max(1))
                .map(|i| claim_loop(&shared, &slots, &leases, lease_permits, i, &shutdown, &ready_tx)),
        );
        // The dispatcher: queued jobs start in claim order as slots free up.
        let dispatch = async {
            loop {
                while jobs.try_join_next().is_some() {}
                let ready = tokio::select! {
                    r = ready_rx.recv() => match r {
                        Some(r) => r,
                        None => return None,
                    },
                    _ = shutdown.cancelled() => return None,
                };
                let slot = tokio::select! {
                    p = slots.clone().acquire_owned() => p.expect("semaphore open"),
                    _ = shutdown.cancelled() => return Some(ready),
                };
                shared.room.started();
                let (shared, done_tx) = (shared.clone(), done_tx.clone());
                jobs.spawn(async move { run_job(&shared, ready, slot, &done_tx).await });
            }
        };
        let (_, unstarted) = tokio::join!(claims, dispatch);
        drop(ready_tx);

        // Drain: jobs claimed but not started are handed back at once; in-flight jobs get the grace
        // period, then are handed back.
        for ready in unstarted
            .into_iter()
            .chain(std::iter::from_fn(|| ready_rx.try_recv().ok()))
        {
            let _ = done_tx.send(Done {
                id: ready.job.id,
                attempt: ready.job.attempt,
                queue: ready.job.queue,
                kind: ready.job.kind,
                finish: None,
                _lease: ready.lease,
            });
        }
        let deadline = tokio::time::Instant::now() + shared.opts.shutdown_grace;
        tracing::info!(in_flight = jobs.len(), "worker stopping: no more claims");
        let mut grace_over = false;
        while !grace_over {
            match tokio::time::timeout_at(deadline, jobs.join_next()).await {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => grace_over = true,
            }
        }
        if grace_over {
            {
                let inflight = shared.inflight.lock().expect("inflight lock");
                tracing::info!(
                    handed_back = inflight.len(),
                    "grace period over: handing jobs back"
                );
                for f in inflight.values() {
                    f.stop(StopReason::Shutdown);
                }
            }
            while jobs.join_next().await.is_some() {}
        }
        drop(done_tx);
        let _ = completer.await;
        background.cancel();
        while tasks.join_next().await.is_some() {}
        shared.intake.close(&shared.metrics);
        Ok(())
    }
}

/// Creates the served queues and loads their settings; false when shutdown came first.
async fn prepare_queues<H>(shared: &Shared<H>, shutdown: &CancellationToken) -> bool {
    let mut wait = Duration::from_millis(100);
    loop {
        match load_settings(shared, true).await {
            Ok(()) => return true,
            Err(e) => tracing::warn!(error = %e, "preparing queues failed; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return false,
        }
        wait = (wait * 2).min(Duration::from_secs(5));
    }
}

async fn load_settings<H>(shared: &Shared<H>, create: bool) -> Result<()> {
    for q in &shared.opts.queues {
        if create {
            shared.store.ensure_queue(q).await?;
        }
        if let Some(s) = shared.store.queue(q).await? {
            shared
                .settings
                .lock()
                .expect("settings lock")
                .insert(q.clone(), s);
        }
    }
    Ok(())
}

/// Most jobs claimed ahead of the free handler slots: one claim's worth.
fn max_ahead(opts: &WorkerOptions) -> usize {
    opts.claim_batch.max(1) as usize
}

/// One claim loop; `claimers` of them share the handler slots and lease permits, so claims overlap with
/// each other (and with completions) instead of queueing behind one connection.
///
/// While the database refuses to record finished jobs ([`Intake`]) a loop claims nothing, and once the
/// refused writes were given up it claims one job at a time, only while the worker holds no other, until
/// a write succeeds.
async fn claim_loop<H: Handler>(
    shared: &Arc<Shared<H>>,
    slots: &Semaphore,
    leases: &Arc<Semaphore>,
    lease_permits: usize,
    index: usize,
    shutdown: &CancellationToken,
    ready_tx: &mpsc::UnboundedSender<Ready>,
) {
    let opts = &shared.opts;
    let concurrency = opts.concurrency.max(1);
    let mut idle = opts.poll_interval;
    let mut next_queue = index;
    loop {
        let changed = shared.intake.changed.notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        let mode = shared.intake.mode();
        let first = match mode {
            Mode::Paused => tokio::select! {
                _ = changed => continue,
                _ = shutdown.cancelled() => return,
            },
            // A lease permit first: when the completer falls behind, claims wait for it.
            Mode::Open => tokio::select! {
                p = leases.clone().acquire_owned() => p.expect("semaphore open"),
                _ = changed => continue,
                _ = shutdown.cancelled() => return,
            },
            // Every permit: no other job held (its outcome refused or not), then one of them.
            Mode::Probing => tokio::select! {
                all = leases.clone().acquire_many_owned(lease_permits as u32) => {
                    all.expect("semaphore open").split(1).expect("every permit held")
                }
                _ = changed => continue,
                _ = shutdown.cancelled() => return,
            },
        };
        let batch = match mode {
            Mode::Probing => 1,
            _ => opts.claim_batch.max(1) as usize,
        };
        // Then room: free slots, plus those that free up while this claim is under way.
        let Some(want) = shared
            .room
            .reserve(
                || slots.available_permits(),
                concurrency,
                max_ahead(opts),
                batch,
                shutdown,
            )
            .await
        else {
            return;
        };
        if shared.intake.mode() == Mode::Paused {
            shared.room.settle(want, 0);
            continue;
        }
        let mut held = vec![first];
        while held.len() < want {
            match leases.clone().try_acquire_owned() {
                Ok(p) => held.push(p),
                Err(_) => break,
            }
        }
        let reserved = want;
        let mut queued = 0;
        let mut claimed_any = false;
        let mut failed = false;
        // Until what is claimed is registered, the worker does not name the jobs it holds (see
        // `return_unknown_claims`).
        let claiming = shared.claiming.read().await;
        for i in 0..opts.queues.len() {
            if held.is_empty() || shutdown.is_cancelled() {
                break;
            }
            let queue = &opts.queues[(next_queue + i) % opts.queues.len()];
            let lease = shared.settings(queue).lease();
            let t0 = Instant::now();
            let result = shared
                .store
                .claim_batch_of_kinds(queue, &opts.kinds, &opts.owner, held.len() as u32, lease)
                .await;
            shared.room.claim_took(t0.elapsed().as_secs_f64());
            match result {
                Ok(claimed) => {
                    shared.metrics.claimed(queue, claimed.len());
                    claimed_any |= !claimed.is_empty();
                    for job in claimed {
                        let lease = held.pop().expect("claimed no more than the permits held");
                        queued += 1;
                        let _ = ready_tx.send(register(shared, job, lease));
                    }
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(queue, error = %e, "claim failed");
                    if matches!(&e, sluice_queue::Error::Database(db) if Unanswered::is(db)) {
                        // The server may still commit it, leasing jobs to this worker it does not know.
                        let until = tokio::time::Instant::now() + UNKNOWN_CLAIMS_SEARCHED_FOR * lease;
                        let mut searched = shared.unknown_claims_until.lock().expect("unknown claims lock");
                        *searched = Some(searched.map_or(until, |u| u.max(until)));
                    }
                }
            }
        }
        drop(claiming);
        shared.room.settle(reserved, queued);
        next_queue = next_queue.wrapping_add(1);
        drop(held);
        if claimed_any {
            idle = opts.poll_interval;
            continue;
        }
        if failed {
            idle = idle.max(Duration::from_millis(200));
        }
        tokio::select! {
            _ = shared.wake.notified() => idle = opts.poll_interval,
            _ = tokio::time::sleep(idle) => idle = (idle * 2).min(opts.max_poll_interval),
            _ = shutdown.cancelled() => return,
        }
    }
}

/// Tracks a claimed job from now on: the heartbeat extends its lease and delivers cancellation even
/// before its handler starts.
fn register<H>(shared: &Shared<H>, job: ClaimedJob, lease: OwnedSemaphorePermit) -> Ready {
    let stop = CancellationToken::new();
    let reason = Arc::new(Mutex::new(None));
    let finishing = Arc::new(AtomicBool::new(false));
    let earlier = shared.inflight.lock().expect("inflight lock").insert(
        job.id,
        InFlight {
            attempt: job.attempt,
            queue: job.queue.clone(),
            stop: stop.clone(),
            reason: reason.clone(),
            finishing: finishing.clone(),
        },
    );
    // This worker claimed the job again while an earlier attempt of it still runs here: that attempt's
    // lease was taken back (the database answered too late for its heartbeat), so it is lost.
    if let Some(earlier) = earlier.filter(|e| e.attempt != job.attempt) {
        earlier.stop(StopReason::Lost);
    }
    Ready {
        job,
        stop,
        reason,
        finishing,
        lease,
    }
}

async fn run_job<H: Handler>(
    shared: &Shared<H>,
    ready: Ready,
    slot: OwnedSemaphorePermit,
    done_tx: &mpsc::UnboundedSender<Done>,
) {
    let Ready {
        job,
        stop,
        reason,
        finishing,
        lease,
    } = ready;
    let (id, attempt, queue, kind) = (job.id, job.attempt, job.queue.clone(), job.kind.clone());
    // Cancelled or lost while queued: the handler never starts.
    let outcome = if stop.is_cancelled() {
        None
    } else {
        shared.metrics.started(&queue, &kind);
        let started = Instant::now();
        let timeout = shared.opts.job_timeout;
        let timed_out = |_| Outcome::Retry(format!("handler timed out after {timeout:?}"));
        let mut attempt_fut = std::pin::pin!(tokio::time::timeout(
            timeout,
            shared.handler.handle(job, stop.clone())
        ));
        let mut outcome = tokio::select! {
            r = &mut attempt_fut => Some(r.unwrap_or_else(timed_out)),
            _ = stop.cancelled() => None,
        };
        let stopped_for = *reason.lock().expect("reason lock");
        if outcome.is_none() && stopped_for == Some(StopReason::Cancel) {
            // A cancelled handler gets a moment to notice its token and clean up; then it is dropped.
            if let Ok(r) = tokio::time::timeout(CANCEL_GRACE, &mut attempt_fut).await {
                outcome = Some(r.unwrap_or_else(timed_out));
            }
        }
        let secs = started.elapsed().as_secs_f64();
        shared.metrics.handled(&queue, &kind, secs);
        shared.room.handler_took(secs);
        outcome
    };
    // The slot is free for the next job now; the outcome is written behind it.
    drop(slot);
    shared.room.slot_freed();
    finishing.store(true, Ordering::SeqCst);
    // Read the reason again: it may have been set while the handler was returning. A lost lease
    // discards whatever the handler said; at shutdown only a success counts (the handler saw its token
    // fire and gave up: the job is handed back, not cancelled or failed).
    let stopped_for = *reason.lock().expect("reason lock");
    let outcome = match (stopped_for, outcome) {
        (Some(StopReason::Lost), _) => None,
        (Some(StopReason::Shutdown), Some(Outcome::Succeeded)) => Some(Outcome::Succeeded),
        (Some(StopReason::Shutdown), _) => None,
        (_, o) => o,
    };
    let finish = match outcome {
        Some(Outcome::Succeeded) => Some(Finish::Succeeded),
        Some(Outcome::Cancelled) => Some(Finish::Cancelled),
        Some(Outcome::Permanent(error)) => Some(Finish::Permanent { error }),
        Some(Outcome::Retry(error)) => {
            let delay = shared
                .settings(&queue)
                .backoff()
                .delay(attempt.max(1) as u32, rand::random::<f64>());
            Some(Finish::Retry { delay, error })
        }
        Some(Outcome::RetryAfter(delay, error)) => Some(Finish::Retry { delay, error }),
        None => match stopped_for {
            Some(StopReason::Cancel) => Some(Finish::Cancelled),
            Some(StopReason::Shutdown) | None => None,
            Some(StopReason::Lost) => {
                forget(&mut shared.inflight.lock().expect("inflight lock"), id, attempt);
                shared.metrics.lease_lost(&queue);
                tracing::warn!(%id, attempt, "lease lost: another worker owns the job now");
                return;
            }
        },
    };
    let _ = done_tx.send(Done {
        id,
        attempt,
        queue,
        kind,
        finish,
        _lease: lease,
    });
}

/// Writes finished attempts in batches, with up to [`COMPLETER_WRITES`] batches in flight: while one is
/// being written the next one gathers, and the database works on both at once.
async fn complete<H: Send + Sync + 'static>(
    shared: Arc<Shared<H>>,
    mut rx: mpsc::UnboundedReceiver<Done>,
    shutdown: CancellationToken,
) {
    let mut writes = JoinSet::new();
    while let Some(first) = rx.recv().await {
        let first_at = tokio::time::Instant::now();
        while writes.len() >= COMPLETER_WRITES {
            writes.join_next().await;
        }
        let mut batch = vec![first];
        while batch.len() < COMPLETER_BATCH {
            match rx.try_recv() {
                Ok(d) => batch.push(d),
                Err(_) => break,
            }
        }
        let deadline = gather_deadline(*shared.write_secs.lock().expect("write_secs lock"));
        gather(
            &mut batch,
            &mut rx,
            &mut writes,
            tokio::time::sleep_until(first_at + deadline),
        )
        .await;
        writes.spawn(record(shared.clone(), batch, shutdown.clone()));
    }
    while writes.join_next().await.is_some() {}
}

/// How long a small batch may gather, counted from its first outcome: the measured time of one write,
/// at most [`COMPLETER_GATHER_MAX`]. A batch starts gathering part-way through the other write, so it
/// usually ends with that write (the batches stay large, the throughput win of gathering); a write that
/// does not end (a batch PostgreSQL rejects on every retry, a long row-lock wait) delays each later
/// batch by this much at most, instead of holding it until 100 outcomes have gathered, which may never
/// happen once finished outcomes hold every lease permit. The cap keeps one slow write (a lock wait
/// that did end) from stretching it.
fn gather_deadline(write_secs: Option<f64>) -> Duration {
    write_secs.map_or(COMPLETER_GATHER_FIRST, |s| {
        Duration::from_secs_f64(s.max(0.0)).min(COMPLETER_GATHER_MAX)
    })
}

/// While another batch is being written, a small one gathers until the first of: that write is done,
/// the batch has grown to [`COMPLETER_GATHER`], or `deadline`. Many small writes cost the database more
/// per job than a few larger ones.
async fn gather<T>(
    batch: &mut Vec<T>,
    rx: &mut mpsc::UnboundedReceiver<T>,
    writes: &mut JoinSet<()>,
    deadline: impl Future<Output = ()>,
) {
    tokio::pin!(deadline);
    while !writes.is_empty() && batch.len() < COMPLETER_GATHER {
        tokio::select! {
            _ = writes.join_next() => break,
            _ = &mut deadline => break,
            d = rx.recv() => match d {
                Some(d) => batch.push(d),
                None => break,
            },
        }
    }
}

/// Records one batch of finished attempts, retrying while the database is away; then frees their
/// lease permits (dropped with the batch).
///
/// While the write is retried the heartbeat keeps renewing the jobs' leases, as long as it reaches the
/// database itself, but not for ever: a write that fails every time (an error it meets on every try)
/// would keep the jobs running, their permits taken and a completer slot busy. From the first failure
/// the database answered on (an unreachable database only delays the write: see
/// [`answered_by_the_database`]), a job is renewed for one more lease
/// ([`FINISHING_RENEWAL_AFTER_FAILURE`]); past that it is given
/// up: dropped from the batch (its permit freed), no longer renewed, its lease left to lapse, and any
/// worker may rescue it and run it again (at least once). Right after each failure the jobs still kept
/// are renewed at once, so that a write which waited longer than a lease before it failed (a row lock,
/// say) does not leave them to a rescue until the next heartbeat.
async fn record<H>(shared: Arc<Shared<H>>, batch: Vec<Done>, shutdown: CancellationToken) {
    let owner = &shared.opts.owner;
    let (mut finish, mut release): (Vec<Done>, Vec<Done>) =
        batch.into_iter().partition(|d| d.finish.is_some());
    let mut wait = Duration::from_millis(50);
    // When the write first failed (it has failed every time since).
    let mut failing_since: Option<tokio::time::Instant> = None;
    // Once a try went unanswered, the server ends later tries within the answer deadline itself (see
    // `QueueStore::with_server_deadline`).
    let mut bounded: Option<QueueStore> = None;
    // What the tries so far wrote: a completion written by one try is not sent again when the release
    // after it failed (it would match no row, and its jobs would count as lost).
    let mut written = HashMap::new();
    let mut finish_written = false;
    // The batch's part in pausing claims while the database refuses its writes (see `Intake`).
    let mut mark = IntakeMark {
        intake: &shared.intake,
        counted: None,
    };
    for attempt in 0.. {
        let t0 = tokio::time::Instant::now();
        let store = bounded.as_ref().unwrap_or(&shared.store);
        let finishing = !finish.is_empty() && !finish_written;
        let result = write_batch(store, owner, &finish, &release, &mut finish_written, &mut written).await;
        // Only the outcomes count, not releases (written at shutdown only, when claims have stopped).
        if finishing && finish_written {
            shared.intake.written(&shared.metrics);
        }
        match result {
            Ok(()) => {
                let secs = t0.elapsed().as_secs_f64();
                let mut write_secs = shared.write_secs.lock().expect("write_secs lock");
                *write_secs = Some(write_secs.map_or(secs, |w| ewma(w, secs)));
                drop(write_secs);
                // Counted per (queue, kind, state) of the batch, not per job: a batch is mostly one.
                let mut counts: HashMap<(&str, &str, &str), u64> = HashMap::new();
                for d in finish.iter().chain(&release) {
                    match written.get(&d.id) {
                        Some(state) => *counts.entry((&d.queue, &d.kind, state)).or_default() += 1,
                        None => {
                            shared.metrics.lease_lost(&d.queue);
                            tracing::warn!(id = %d.id, attempt = d.attempt, "result discarded: lease lost");
                        }
                    }
                }
                for ((queue, kind, state), n) in counts {
                    shared.metrics.finished_many(queue, kind, state, n);
                }
                break;
            }
            Err(e) => {
                if matches!(&e, crate::error::Error::Database(db) if Unanswered::is(db)) {
                    bounded.get_or_insert_with(|| {
                        shared
                            .store
                            .clone()
                            .with_server_deadline(shared.opts.answer_deadline)
                    });
                }
                if shutdown.is_cancelled() && attempt >= 5 {
                    // Exiting with the database away: the leases expire and other workers rescue the
                    // jobs (at-least-once), rather than this process hanging on.
                    let jobs = finish.len() + release.len();
                    tracing::error!(error = %e, jobs, "giving up recording finished jobs");
                    break;
                }
                tracing::warn!(error = %e, attempt, "recording finished jobs failed; retrying");
                // A database that is away (the heartbeat cannot renew the leases either, and they
                // lapse as for a crashed worker) only delays the write: it is retried for as long as it
                // takes, and its outcomes count unless a rescue ran the jobs again meanwhile.
                if answered_by_the_database(&e) {
                    if finishing && !finish_written {
                        shared.intake.refused(&mut mark.counted, &shared.metrics);
                    }
                    let failing = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                    if !keep_renewing(&shared, &mut finish, &mut release, failing).await {
                        return;
                    }
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }
    let mut inflight = shared.inflight.lock().expect("inflight lock");
    for d in finish.iter().chain(&release) {
        forget(&mut inflight, d.id, d.attempt);
    }
}

/// After a write of `finish` and `release` the database refused, first refused at `failing`: drops from
/// the batch the jobs past [`FINISHING_RENEWAL_AFTER_FAILURE`] (no longer renewed, their permits freed)
/// and those whose later attempt this worker claimed (a lost lease), and renews the others at once.
/// Whether any job is left to write.
async fn keep_renewing<H>(
    shared: &Shared<H>,
    finish: &mut Vec<Done>,
    release: &mut Vec<Done>,
    failing: tokio::time::Instant,
) -> bool {
    let past_cap =
        |d: &Done| failing.elapsed() >= FINISHING_RENEWAL_AFTER_FAILURE * shared.settings(&d.queue).lease();
    let before = finish.len() + release.len();
    let mut lost = 0;
    {
        // In this order wherever both are held (see `held_jobs`).
        let mut inflight = shared.inflight.lock().expect("inflight lock");
        let mut abandoned = shared.abandoned.lock().expect("abandoned lock");
        let now = tokio::time::Instant::now();
        abandoned.retain(|_, (_, kept)| *kept > now);
        let mut keep = |d: &Done| {
            if inflight.get(&d.id).is_none_or(|f| f.attempt != d.attempt) {
                // This worker claimed a later attempt of it: this one's lease was lost.
                shared.metrics.lease_lost(&d.queue);
                lost += 1;
                return false;
            }
            if !past_cap(d) {
                return true;
            }
            forget(&mut inflight, d.id, d.attempt);
            // It ran: never handed back as an unknown claim while it may still be leased here.
            let kept = now + ABANDONED_KEPT_FOR * shared.settings(&d.queue).lease();
            abandoned.insert(d.id, (d.attempt, kept));
            false
        };
        finish.retain(&mut keep);
        release.retain(&mut keep);
    }
    let given_up = before - finish.len() - release.len() - lost;
    if given_up > 0 {
        tracing::warn!(
            jobs = given_up,
            "recording finished jobs has failed for longer than their lease; giving them up \
             (their leases lapse and the jobs run again)"
        );
    }
    if finish.is_empty() && release.is_empty() {
        return false;
    }
    let mut by_lease: HashMap<Duration, Vec<(Uuid, i32)>> = HashMap::new();
    for d in finish.iter().chain(release.iter()) {
        by_lease
            .entry(shared.settings(&d.queue).lease())
            .or_default()
            .push((d.id, d.attempt));
    }
    for (lease, jobs) in by_lease {
        renew_finishing(shared, lease, &jobs).await;
    }
    true
}

/// Whether the database answered `e` (an error of the statement itself, which a retry is likely to meet
/// again), rather than not being reached (a connection refused or reset, a pool timeout).
fn answered_by_the_database(e: &crate::error::Error) -> bool {
    use crate::error::Error;
    matches!(
        e,
        Error::Database(sqlx::Error::Database(_))
            | Error::NotFound(_)
            | Error::Conflict(_)
            | Error::Invalid(_)
    )
}

/// Stops tracking `attempt` of job `id`, but not a later attempt of it this worker claimed meanwhile
/// (whose lease the heartbeat must keep renewing).
fn forget(inflight: &mut HashMap<Uuid, InFlight>, id: Uuid, attempt: i32) {
    if inflight.get(&id).is_some_and(|f| f.attempt == attempt) {
        inflight.remove(&id);
    }
}

/// Writes `finish` (unless `finish_written`: an earlier try wrote it) and then `release`, adding to
/// `written` the state each job was written in.
async fn write_batch(
    store: &QueueStore,
    owner: &str,
    finish: &[Done],
    release: &[Done],
    finish_written: &mut bool,
    written: &mut HashMap<Uuid, String>,
) -> Result<()> {
    if !finish.is_empty() && !*finish_written {
        let rows: Vec<Finished> = finish
            .iter()
            .map(|d| Finished {
                id: d.id,
                attempt: d.attempt,
                finish: d.finish.clone().expect("partitioned on finish"),
            })
            .collect();
        written.extend(store.finish_batch(owner, &rows).await?);
        *finish_written = true;
    }
    if !release.is_empty() {
        let jobs: Vec<(Uuid, i32)> = release.iter().map(|d| (d.id, d.attempt)).collect();
        for id in store.release(owner, &jobs).await? {
            written.insert(id, "released".to_owned());
        }
    }
    Ok(())
}

fn heartbeat_interval<H>(shared: &Shared<H>) -> Duration {
    shared.opts.heartbeat_interval.unwrap_or_else(|| {
        let shortest = shared
            .opts
            .queues
            .iter()
            .map(|q| shared.settings(q).lease())
            .min()
            .unwrap_or(Duration::from_secs(30));
        (shortest / 3).max(Duration::from_millis(50))
    })
}

async fn heartbeat<H>(shared: Arc<Shared<H>>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(heartbeat_interval(&shared)) => {}
            _ = stop.cancelled() => return,
        }
        // Group the jobs this worker holds by their queue's lease, the running ones (claimed ahead
        // too) apart from the finishing ones. Finishing jobs are renewed too: their handler has
        // returned, but until the completer has written the outcome the job is still running in the
        // database, and a lease that lapsed while the write waited (a slow database, a row lock, a
        // write retried) would let any worker rescue the job and run it a second time: one statement
        // more per heartbeat while some job is finishing, not per job. Neither statement waits for a
        // row another transaction holds (see `sql::JOB_HEARTBEAT`), and the running jobs' goes first.
        let mut by_lease: HashMap<Duration, Vec<(Uuid, i32)>> = HashMap::new();
        let mut finishing_by_lease: HashMap<Duration, Vec<(Uuid, i32)>> = HashMap::new();
        for (id, f) in shared.inflight.lock().expect("inflight lock").iter() {
            let group = if f.finishing.load(Ordering::SeqCst) {
                &mut finishing_by_lease
            } else {
                &mut by_lease
            };
            group
                .entry(shared.settings(&f.queue).lease())
                .or_default()
                .push((*id, f.attempt));
        }
        let mut skipped = Vec::new();
        for (lease, jobs) in by_lease {
            match shared.store.heartbeat(&shared.opts.owner, &jobs, lease).await {
                Ok(held) => {
                    let held: HashMap<Uuid, Held> = held.into_iter().map(|h| (h.id, h)).collect();
                    for (id, attempt) in jobs {
                        let h = held.get(&id).copied();
                        if h.is_some_and(|h| !h.renewed) {
                            skipped.push((lease, id, attempt));
                        }
                        heard(&shared, id, attempt, h);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        }
        // The running jobs whose rows another transaction held: each waited for, briefly and one at a
        // time, as the heartbeat's batch statement no longer does. Such a row is mostly held for a
        // moment (an enqueue naming the job as a parent, or finding it the holder of a key, locks it
        // until it commits), and a job that enqueues keep locking would be skipped at every heartbeat
        // and never renewed. A row held for longer than the wait (a long application transaction) is
        // left for the next heartbeat, and the rest of this one goes on.
        let started = tokio::time::Instant::now();
        let budget = heartbeat_interval(&shared) / 2;
        let wait = (heartbeat_interval(&shared) / 4).min(HEARTBEAT_ROW_WAIT_MAX);
        skipped.sort_by_key(|&(_, id, _)| id);
        for (lease, id, attempt) in skipped {
            if started.elapsed() >= budget {
                break;
            }
            match shared
                .store
                .heartbeat_waiting(&shared.opts.owner, (id, attempt), lease, wait)
                .await
            {
                Ok(h) => heard(&shared, id, attempt, h),
                Err(e) => tracing::warn!(error = %e, %id, "heartbeat of a held job failed"),
            }
        }
        for (lease, jobs) in finishing_by_lease {
            renew_finishing(&shared, lease, &jobs).await;
        }
    }
}

/// Acts on what a heartbeat found of running job `id` at `attempt`: `None`, no longer this worker's (its
/// handler is stopped as lost); a requested cancellation is delivered; a job held but not renewed (its
/// row another transaction's) is still this worker's. Nothing for a job whose handler has returned
/// since it was grouped.
fn heard<H>(shared: &Shared<H>, id: Uuid, attempt: i32, held: Option<Held>) {
    let inflight = shared.inflight.lock().expect("inflight lock");
    let Some(f) = inflight.get(&id) else { return };
    if f.attempt != attempt || f.finishing.load(Ordering::SeqCst) {
        return;
    }
    match held {
        Some(h) if h.cancel_requested => f.stop(StopReason::Cancel),
        Some(_) => {}
        None => f.stop(StopReason::Lost),
    }
}

/// Extends the leases of finished jobs whose outcome is not written yet (all of one queue lease). A job
/// missing from the result was written meanwhile, is being written (its row held), or was lost (its
/// write is then fenced out): nothing to do either way.
async fn renew_finishing<H>(shared: &Shared<H>, lease: Duration, jobs: &[(Uuid, i32)]) {
    if let Err(e) = shared
        .store
        .heartbeat_finishing(&shared.opts.owner, jobs, lease)
        .await
    {
        tracing::warn!(error = %e, "heartbeat of finishing jobs failed");
    }
}

async fn listen<H>(shared: Arc<Shared<H>>, stop: CancellationToken) {
    // The LISTEN connection is probed when quiet and given up when its server goes silent, with the
    // same deadline as the worker's statements.
    let liveness = Liveness {
        deadline: shared.opts.answer_deadline,
        ..Liveness::default()
    };
    let pool = shared.store.pool();
    sluice_queue::listen::listen_with(pool, NOTIFY_CHANNEL, "worker", liveness, &stop, |event| {
        match event {
            Event::Enqueued(queue) if !shared.opts.queues.iter().any(|q| q == queue) => {}
            // A job for us, or listening (again) after missing notifications: claim now.
            _ => shared.wake.notify_one(),
        }
        ControlFlow::Continue(())
    })
    .await;
}

/// Hands back the jobs a claim given up unanswered leased to this worker when the server committed it
/// after all ([`QueueStore::return_unknown_claims`]): ready again with their attempt not counted,
/// rather than rescued once their lease lapsed with an attempt spent that no handler ran. Runs every
/// maintenance round for [`UNKNOWN_CLAIMS_SEARCHED_FOR`] leases after the latest such claim, and not
/// otherwise: a claim the server commits later than that leaves its jobs to the rescue, as before.
async fn return_unknown_claims<H>(shared: &Shared<H>) {
    let Some(until) = *shared.unknown_claims_until.lock().expect("unknown claims lock") else {
        return;
    };
    let started = tokio::time::Instant::now();
    let result = {
        // No claim under way while the held jobs are named and handed back: one answered just before
        // the statement, its jobs not registered yet, would have them handed back as they start.
        let _claims = shared.claiming.write().await;
        let held = held_jobs(shared);
        shared
            .store
            .return_unknown_claims(&shared.opts.owner, &shared.opts.queues, &held)
            .await
    };
    match result {
        Ok(returned) => {
            for (_, _, queue) in &returned {
                shared.metrics.claim_returned(queue);
            }
            if !returned.is_empty() {
                tracing::warn!(
                    jobs = returned.len(),
                    "a claim given up unanswered had committed: its jobs are handed back, their attempt not counted"
                );
                shared.wake.notify_one();
            }
            let mut searched = shared.unknown_claims_until.lock().expect("unknown claims lock");
            if *searched == Some(until) && started >= until {
                *searched = None;
            }
        }
        Err(e) => tracing::warn!(error = %e, "handing back unknown claims failed"),
    }
}

/// The jobs this worker must not hand back as unknown claims: every job it tracks (queued, running,
/// finishing) and those whose outcome it gave up writing lately, which ran.
fn held_jobs<H>(shared: &Shared<H>) -> Vec<(Uuid, i32)> {
    let inflight = shared.inflight.lock().expect("inflight lock");
    let mut abandoned = shared.abandoned.lock().expect("abandoned lock");
    let now = tokio::time::Instant::now();
    abandoned.retain(|_, (_, kept)| *kept > now);
    inflight
        .iter()
        .map(|(id, f)| (*id, f.attempt))
        .chain(abandoned.iter().map(|(id, (attempt, _))| (*id, *attempt)))
        .collect()
}

async fn maintenance<H>(shared: Arc<Shared<H>>, stop: CancellationToken) {
    let mut last_retention = Instant::now() - RETENTION_INTERVAL;
    let mut last_refresh = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(heartbeat_interval(&shared)) => {}
            _ = stop.cancelled() => return,
        }
        return_unknown_claims(&shared).await;
        match shared
            .store
            .rescue_expired(&shared.opts.queues, MAINTENANCE_BATCH)
            .await
        {
            Ok(0) => {}
            Ok(n) => {
                tracing::info!(rescued = n, "jobs with expired leases made ready again");
                shared.wake.notify_one();
            }
            Err(e) => tracing::warn!(error = %e, "lease rescue failed"),
        }
        if last_refresh.elapsed() >= REFRESH_INTERVAL {
            last_refresh = Instant::now();
            let _ = load_settings(&shared, false).await;
            for q in &shared.opts.queues {
                if let Ok(Some(d)) = shared.store.depth(q).await {
                    shared.metrics.set_depth(&d);
                }
            }
        }
        if last_retention.elapsed() >= RETENTION_INTERVAL {
            last_retention = Instant::now();
            for q in &shared.opts.queues {
                // Bounded batches, a few per round, so retention never holds long locks or starves claims.
                for _ in 0..10 {
                    match shared.store.delete_expired(q, MAINTENANCE_BATCH).await {
                        Ok(n) if n as i64 == MAINTENANCE_BATCH => continue,
                        Ok(_) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "retention failed");
                            break;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashMap,
        sync::{Arc, Mutex, atomic::AtomicBool},
        time::Duration,
    };

    use tokio::{sync::mpsc, task::JoinSet};
    use tokio_util::sync::CancellationToken;
    use uuid::Uuid;

    use super::{
        Ahead, COMPLETER_GATHER, InFlight, Intake, IntakeMark, Mode, Room, forget, gather, gather_deadline,
    };
    use crate::queue::metrics::QueueMetrics;

    /// A bound for awaiting what must happen at once; reaching it fails the test.
    const SOON: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn a_small_batch_is_written_at_its_deadline_while_the_other_write_is_stuck() {
        // The other write never ends (a batch PostgreSQL rejects on every retry, a row lock held).
        let mut writes = JoinSet::new();
        writes.spawn(std::future::pending::<()>());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (fire, deadline) = tokio::sync::oneshot::channel::<()>();
        let gathering = tokio::spawn(async move {
            let mut batch = vec![0];
            gather(&mut batch, &mut rx, &mut writes, async {
                let _ = deadline.await;
            })
            .await;
            (batch, writes.len())
        });
        // Outcomes arriving before the deadline join the batch.
        tx.send(1).unwrap();
        tx.send(2).unwrap();
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(
            !gathering.is_finished(),
            "the batch gathers while the other write is under way"
        );
        // Far fewer outcomes than a full gather: only the deadline can end it.
        fire.send(()).unwrap();
        let (batch, writes) = tokio::time::timeout(SOON, gathering)
            .await
            .expect("the gather ends at its deadline")
            .unwrap();
        assert_eq!(batch, vec![0, 1, 2]);
        assert_eq!(writes, 1, "the stuck write is still under way");
    }

    #[tokio::test]
    async fn a_small_batch_gathers_until_the_other_write_is_done_or_it_is_full() {
        // The other write ends: the batch is written then, deadline or not.
        let mut writes = JoinSet::new();
        let (end_write, write) = tokio::sync::oneshot::channel::<()>();
        writes.spawn(async {
            let _ = write.await;
        });
        let (tx, mut rx) = mpsc::unbounded_channel();
        let gathering = tokio::spawn(async move {
            let mut batch = vec![0];
            gather(&mut batch, &mut rx, &mut writes, std::future::pending()).await;
            batch
        });
        tx.send(1).unwrap();
        end_write.send(()).unwrap();
        let batch = tokio::time::timeout(SOON, gathering)
            .await
            .expect("ends with the write")
            .unwrap();
        assert!(batch.starts_with(&[0]) && batch.len() <= 2);

        // Full: written at once, the other write still under way.
        let mut writes = JoinSet::new();
        writes.spawn(std::future::pending::<()>());
        let (tx, mut rx) = mpsc::unbounded_channel();
        for d in 1..COMPLETER_GATHER {
            tx.send(d).unwrap();
        }
        let mut batch = vec![0];
        tokio::time::timeout(
            SOON,
            gather(&mut batch, &mut rx, &mut writes, std::future::pending()),
        )
        .await
        .expect("ends when full");
        assert_eq!(batch.len(), COMPLETER_GATHER);
    }

    #[test]
    fn a_batch_gathers_for_about_one_write_at_most_ten_milliseconds() {
        assert_eq!(gather_deadline(None), Duration::from_millis(2));
        assert_eq!(gather_deadline(Some(0.003)), Duration::from_millis(3));
        assert_eq!(gather_deadline(Some(30.0)), Duration::from_millis(10));
    }

    #[test]
    fn an_earlier_attempts_end_does_not_forget_a_later_attempt_of_the_job() {
        // Attempt 1's lease was taken back and this worker claimed attempt 2; attempt 1's handler
        // returning afterwards must leave attempt 2 tracked (its lease renewed by the heartbeat).
        let id = Uuid::from_u128(7);
        let attempt = |n| InFlight {
            attempt: n,
            queue: "emails".into(),
            stop: CancellationToken::new(),
            reason: Arc::new(Mutex::new(None)),
            finishing: Arc::new(AtomicBool::new(false)),
        };
        let mut inflight = HashMap::from([(id, attempt(2))]);
        forget(&mut inflight, id, 1);
        assert_eq!(inflight.get(&id).map(|f| f.attempt), Some(2));
        forget(&mut inflight, id, 2);
        assert!(inflight.is_empty());
    }

    #[tokio::test]
    async fn a_claim_that_got_fewer_jobs_than_it_reserved_gives_the_room_to_a_waiting_loop() {
        let room = Room::default();
        let stop = CancellationToken::new();
        // One loop reserves all four free slots and claims; another (woken by a NOTIFY, say) waits.
        assert_eq!(room.reserve(|| 4, 4, 4, 4, &stop).await, Some(4));
        let mut waiting = std::pin::pin!(room.reserve(|| 4, 4, 4, 4, &stop));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "no room while the claim runs"
        );
        // The claim found one job: the other three are room again, and the waiting loop takes them.
        room.settle(4, 1);
        let got = tokio::time::timeout(SOON, waiting).await;
        assert_eq!(
            got,
            Ok(Some(3)),
            "the waiting loop was woken with the room given back"
        );
        // A claim that got all it reserved gives nothing back and wakes nobody.
        let grown = room.grown.notified();
        let mut grown = std::pin::pin!(grown);
        grown.as_mut().enable();
        room.settle(3, 3);
        assert!(
            futures::poll!(grown.as_mut()).is_pending(),
            "a full claim wakes nobody"
        );
        let mut waiting = std::pin::pin!(room.reserve(|| 4, 4, 4, 4, &stop));
        assert!(
            futures::poll!(waiting.as_mut()).is_pending(),
            "and leaves no room"
        );
        stop.cancel();
        assert_eq!(waiting.await, None, "shutdown ends the wait");
    }

    #[test]
    fn claims_pause_at_a_refused_write_probe_once_it_is_given_up_and_resume_at_a_written_one() {
        let metrics = QueueMetrics::new();
        let intake = Intake::default();
        let paused = |m: &QueueMetrics| m.render().contains("sluice_worker_claims_paused 1");
        assert_eq!(intake.mode(), Mode::Open);
        let mut a = IntakeMark {
            intake: &intake,
            counted: None,
        };
        let mut b = IntakeMark {
            intake: &intake,
            counted: None,
        };
        intake.refused(&mut a.counted, &metrics);
        intake.refused(&mut b.counted, &metrics);
        intake.refused(&mut a.counted, &metrics);
        assert_eq!(intake.mode(), Mode::Paused);
        assert!(paused(&metrics));
        // Both batches given up, nothing written since: one job at a time.
        drop(a);
        assert_eq!(intake.mode(), Mode::Paused, "one refused batch is still retried");
        drop(b);
        assert_eq!(intake.mode(), Mode::Probing);
        // The probe's outcome refused: paused again; written: claims resume.
        let mut probe = IntakeMark {
            intake: &intake,
            counted: None,
        };
        intake.refused(&mut probe.counted, &metrics);
        assert_eq!(intake.mode(), Mode::Paused);
        intake.written(&metrics);
        assert_eq!(intake.mode(), Mode::Open);
        assert!(!paused(&metrics));
        drop(probe);
        assert_eq!(intake.mode(), Mode::Open, "a batch written settles nothing twice");
    }

    #[test]
    fn a_batch_refused_before_another_write_succeeded_holds_no_claims_back() {
        // A row the database refuses (a trigger, say) fails its batch every time; the other batches
        // are written: the refusal is the batch's own, not the database's.
        let metrics = QueueMetrics::new();
        let intake = Intake::default();
        let mut poisoned = IntakeMark {
            intake: &intake,
            counted: None,
        };
        intake.refused(&mut poisoned.counted, &metrics);
        assert_eq!(intake.mode(), Mode::Paused);
        intake.written(&metrics);
        assert_eq!(intake.mode(), Mode::Open);
        intake.refused(&mut poisoned.counted, &metrics);
        assert_eq!(intake.mode(), Mode::Open, "its later refusals pause nothing");
        drop(poisoned);
        assert_eq!(intake.mode(), Mode::Open);
        // A batch refused after that write does pause, and the engine's end reports the pause over.
        let mut later = IntakeMark {
            intake: &intake,
            counted: None,
        };
        intake.refused(&mut later.counted, &metrics);
        assert_eq!(intake.mode(), Mode::Paused);
        intake.close(&metrics);
        assert!(metrics.render().contains("sluice_worker_claims_paused 0"));
    }

    #[test]
    fn claims_ahead_only_what_the_slots_free_during_one_claim() {
        // No handler has returned yet: the free slots only.
        let mut a = Ahead {
            claim_secs: 0.002,
            ..Ahead::default()
        };
        assert_eq!(a.reserve(16, 16, 100, 100), 16);
        assert_eq!(a.queued, 16);

        // Handlers ten times quicker than a claim: a whole claim's worth ahead, no more.
        let mut a = Ahead {
            queued: 0,
            claim_secs: 0.002,
            handler_secs: Some(0.000_2),
        };
        assert_eq!(a.reserve(0, 16, 100, 100), 100);
        assert_eq!(a.reserve(0, 16, 100, 100), 0, "the queue is full");

        // Handlers of a second: nothing ahead, a busy worker holds no job it cannot start.
        let mut a = Ahead {
            queued: 0,
            claim_secs: 0.002,
            handler_secs: Some(1.0),
        };
        assert_eq!(a.reserve(0, 16, 100, 100), 0);
        assert_eq!(a.reserve(1, 16, 100, 100), 1);

        // Refilled once half of the target is gone, not one job per freed slot.
        let mut a = Ahead {
            queued: 10,
            claim_secs: 0.002,
            handler_secs: Some(0.002),
        };
        assert_eq!(a.reserve(0, 16, 100, 100), 0, "6 of 16 missing");
        a.queued = 8;
        assert_eq!(a.reserve(0, 16, 100, 100), 8, "half missing");
        assert_eq!(a.queued, 16);
    }
}
