//! The queue's PostgreSQL adapter: every statement of [`crate::sql`] behind a typed function.
//!
//! [`QueueStore`] wraps a pool for the worker, the HTTP API and the operator. The enqueue functions are
//! also free functions over any executor ([`enqueue`], [`enqueue_many`]), so an app can enqueue inside
//! its own sqlx transaction: the job exists exactly when the transaction commits.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};
use sqlx::{Connection as _, PgConnection, PgExecutor, PgPool, Row, postgres::PgRow};
use uuid::Uuid;

use sluice_crds::clock::{SharedClock, SystemClock};
use tokio_util::sync::CancellationToken;

use crate::{
    Error, Result,
    error::Unanswered,
    events::JobStatus,
    job::{
        CancelOutcome, ClaimedJob, Depth, Enqueued, GraphJob, Job, JobState, MAX_PAYLOAD_BYTES, NewJob,
        OnParentFailure, Parent, QueueSettings, UniqueMode, valid_queue_name, valid_short_name,
    },
    schedule::{self, CronSchedule, MissedRuns},
    sql,
};

/// A periodic job: a cron schedule (in its time zone) and the job each fire time enqueues.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// Its name, unique per queue (`[A-Za-z0-9][A-Za-z0-9._-]*`, at most 100).
    pub name: String,
    /// When it fires.
    pub cron: CronSchedule,
    /// The job each fire time enqueues (kind, payload, priority, max attempts).
    pub job: NewJob,
    /// What to do with fire times that passed while no scheduler ran.
    pub missed_runs: MissedRuns,
}

impl Schedule {
    /// A schedule named `name` firing on `cron` in `time_zone` (UTC when `None`), enqueueing `job`. The
    /// error names the field at fault.
    pub fn new(
        name: impl Into<String>,
        cron: &str,
        time_zone: Option<&str>,
        job: NewJob,
        missed_runs: MissedRuns,
    ) -> Result<Self> {
        let name = name.into();
        if !valid_short_name(&name) {
            return Err(Error::Invalid(format!(
                "schedule name {name:?}: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
            )));
        }
        let cron = CronSchedule::parse(cron, time_zone).map_err(Error::Invalid)?;
        check_new_job(&job).map_err(|e| Error::Invalid(format!("schedule {name:?}: {e}")))?;
        if job.unique_key.is_some() || job.idempotency_key.is_some() || !job.depends_on.is_empty() {
            return Err(Error::Invalid(format!(
                "schedule {name:?}: the job takes no uniqueKey, idempotency key or dependsOn (each fire time makes one job)"
            )));
        }
        Ok(Self {
            name,
            cron,
            job,
            missed_runs,
        })
    }
}

/// How often [`QueueStore::run_schedules`] looks for due fire times.
pub const SCHEDULER_TICK: Duration = Duration::from_secs(1);

/// What one scheduler pass did.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleRun {
    /// The fire times enqueued, oldest first, with their jobs.
    pub fired: Vec<(DateTime<Utc>, Uuid)>,
    /// The next fire time after this pass.
    pub next_fire_at: Option<DateTime<Utc>>,
}

/// A schedule's row: how far its fire times have been handled, the last one enqueued, the next one.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleState {
    /// The queue.
    pub queue: String,
    /// The schedule's name.
    pub name: String,
    /// Every fire time up to here has been handled.
    pub handled_until: DateTime<Utc>,
    /// The latest fire time a job was enqueued for.
    pub last_fire_at: Option<DateTime<Utc>>,
    /// That job.
    pub last_job_id: Option<Uuid>,
    /// The next fire time, when the scheduler last looked.
    pub next_fire_at: Option<DateTime<Utc>>,
}

/// How a finished attempt ends, as the completer writes it.
#[derive(Clone, Debug, PartialEq)]
pub enum Finish {
    /// The handler succeeded.
    Succeeded,
    /// The handler failed; retry after `delay` unless that was the last attempt.
    Retry {
        /// Backoff before the next attempt.
        delay: Duration,
        /// What went wrong.
        error: String,
    },
    /// The handler failed and said retrying is pointless: dead at once.
    Permanent {
        /// What went wrong.
        error: String,
    },
    /// The handler stopped because cancellation was requested.
    Cancelled,
}

/// One finished attempt: the fence (id, attempt) and the outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    /// The job.
    pub id: Uuid,
    /// The attempt that finished (must still be the job's current attempt).
    pub attempt: i32,
    /// How it ended.
    pub finish: Finish,
}

/// A running job its owner still holds, as a heartbeat found it ([`QueueStore::heartbeat`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    /// The job.
    pub id: Uuid,
    /// Whether its cancellation was requested.
    pub cancel_requested: bool,
    /// Whether its lease was extended now; false when another transaction held its row, which the
    /// heartbeat skips rather than waits for (the lease is extended by a later heartbeat).
    pub renewed: bool,
}

/// The queue store: typed access to `sluice.jobs` and `sluice.queues`.
#[derive(Clone)]
pub struct QueueStore {
    pool: PgPool,
    clock: SharedClock,
    /// How long a statement may go unanswered (see [`QueueStore::with_answer_deadline`]).
    answer_deadline: Option<Duration>,
    /// The server-side deadline of writes (see [`QueueStore::with_server_deadline`]).
    server_deadline: Option<Duration>,
}

impl std::fmt::Debug for QueueStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueStore")
            .field("answer_deadline", &self.answer_deadline)
            .field("server_deadline", &self.server_deadline)
            .finish_non_exhaustive()
    }
}

impl QueueStore {
    /// A store on `pool`, reading wall-clock time (for `delayMs`) from the system clock.
    pub fn new(pool: PgPool) -> Self {
        Self::with_clock(pool, Arc::new(SystemClock))
    }

    /// A store reading time from `clock`.
    pub fn with_clock(pool: PgPool, clock: SharedClock) -> Self {
        Self {
            pool,
            clock,
            answer_deadline: None,
            server_deadline: None,
        }
    }

    /// This store, its writes that a caller may run again after a try went unanswered ended by the
    /// server itself within `deadline`: completions and releases ([`QueueStore::finish_batch`],
    /// [`QueueStore::release`]), enqueues ([`QueueStore::enqueue`], [`QueueStore::enqueue_many`],
    /// [`QueueStore::enqueue_graph`]), cancels and retries of dead jobs, scheduler passes, event
    /// subscriptions, tenant registrations, writes of a queue's settings and paused flag
    /// ([`QueueStore::upsert_queue`], [`QueueStore::set_paused`]) and adoptions
    /// ([`QueueStore::adopt_queue`], whose table lock would otherwise queue every enqueue and claim
    /// behind it while it waits). For their transaction only: a lock wait after half
    /// of it (`lock_timeout`), the statement after four fifths (`statement_timeout`), the transaction
    /// when idle for all of it (`idle_in_transaction_session_timeout`); the database then answers with
    /// an error (or ends the session) instead of waiting on. For a write retried after a try went
    /// unanswered: a try given up while it waited (for a lock, or on a slow server) still waits on the
    /// server, which notices the closed connection only when it next answers, and a retry that waited
    /// just as long would leave one more such backend behind each time; and a transaction whose
    /// connection went silent before its COMMIT would otherwise hold its row locks until the server's
    /// TCP keepalive gives up on it (hours by default), and an enqueue given up could otherwise commit
    /// long after its caller retried. Costs a write three more round trips (its transaction and the
    /// settings), a release one.
    pub fn with_server_deadline(mut self, deadline: Duration) -> Self {
        self.server_deadline = Some(deadline);
        self
    }

    /// This store, every one of its statements given up when the database has not answered within
    /// `deadline`: the connection is closed, never returned to the pool, and the call fails as a
    /// connection error would ([`crate::error::Unanswered`]; the next call opens a fresh connection).
    /// Reads whose time grows with the table ([`QueueStore::depth`], [`QueueStore::depth_all`],
    /// [`QueueStore::list`]) are also stopped by the server just before it. Without it a statement on
    /// a connection whose server went away without a word (a failover, a dropped NAT entry, a frozen
    /// backend) waits for ever, as sqlx has no statement deadline and sets no TCP keepalive. A
    /// statement that was merely slow (a long row-lock wait) may still commit on the server after it
    /// was given up, unless a [server deadline](Self::with_server_deadline) ends it; the worker's
    /// statements are fenced by lease owner and attempt, and an enqueue with an idempotency key answers
    /// a retry with the job the first try made, so running one again is harmless.
    pub fn with_answer_deadline(mut self, deadline: Duration) -> Self {
        self.answer_deadline = Some(deadline);
        self
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn now(&self) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp_millis(self.clock.now_millis() as i64).unwrap_or_else(Utc::now)
    }

    // ---- queues -------------------------------------------------------------------------------------

    /// Creates or updates a queue's settings (its paused flag is kept). Returns whether it was created.
    pub async fn upsert_queue(&self, s: &QueueSettings) -> Result<bool> {
        check_queue_name(&s.name)?;
        let row = sqlx::query(sql::QUEUE_UPSERT)
            .bind(&s.name)
            .bind(s.max_attempts)
            .bind(s.backoff_base_ms)
            .bind(s.backoff_cap_ms)
            .bind(s.backoff_multiplier)
            .bind(s.lease_ms)
            .bind(s.retention_succeeded_ms)
            .bind(s.retention_dead_ms)
            .bind(s.idempotency_window_ms);
        let row = self
            .on_connection(async |c| {
                self.server_bounded(c, async |c| Ok(row.fetch_one(c).await.map_err(map_db_error)?))
                    .await
            })
            .await?;
        Ok(row.try_get("created")?)
    }

    /// Creates queue `name` with default settings unless it exists. Under the answer deadline but not
    /// the server deadline: one insert that does nothing when the queue exists (a worker's start),
    /// waiting at most for a concurrent creation of the same queue, and harmless when it commits after
    /// being given up.
    pub async fn ensure_queue(&self, name: &str) -> Result<()> {
        check_queue_name(name)?;
        self.on_connection(async |c| {
            sqlx::query(sql::QUEUE_ENSURE)
                .bind(name)
                .execute(c)
                .await
                .map_err(map_db_error)
        })
        .await?;
        Ok(())
    }

    /// A queue's settings, if it exists.
    pub async fn queue(&self, name: &str) -> Result<Option<QueueSettings>> {
        self.on_connection(async |c| {
            Ok(sqlx::query_as::<_, QueueSettings>(sql::QUEUE_GET)
                .bind(name)
                .fetch_optional(c)
                .await?)
        })
        .await
    }

    /// Moves queue `from` with its settings, jobs and schedules to the name `to` (`sluice.adopt_queue`):
    /// how a queue named before namespaces (`thumbnails`) becomes its JobQueue's (`shop/thumbnails`).
    /// Returns how many jobs moved, or `None` when there is no queue `from`. `to` must hold no job or
    /// schedule yet ([`Error::Conflict`]). Holds enqueues and claims back for the moment it takes.
    pub async fn adopt_queue(&self, from: &str, to: &str) -> Result<Option<i64>> {
        check_queue_name(to)?;
        let adopt = sqlx::query_scalar(sql::QUEUE_ADOPT).bind(from).bind(to);
        self.on_connection(async |c| {
            self.server_bounded(c, async |c| adopt.fetch_one(c).await.map_err(map_db_error))
                .await
        })
        .await
    }

    /// Creates the LOGIN role `role` for `namespace` with `password` (or sets the password of the
    /// namespace's existing one), registers it as the namespace's tenant and grants it the queue tables,
    /// whose rows of other namespaces row-level security hides from it (`sluice.ensure_tenant`). Needs
    /// CREATEROLE and the tables' owner (a database error `42501` otherwise); [`Error::Conflict`] when
    /// `role` exists and is no tenant, or the namespace has another tenant role, or `role` is the caller,
    /// owns objects, is privileged (superuser, CREATEROLE, BYPASSRLS, REPLICATION), has members that
    /// could act as it or is a member of another role.
    ///
    /// Under the store's answer deadline and, as a write, its server deadline: running it again after
    /// a try given up is harmless (the role ends with the last password set).
    pub async fn ensure_tenant(&self, role: &str, namespace: &str, password: &str) -> Result<()> {
        let ensure = sqlx::query(sql::TENANT_ENSURE)
            .bind(role)
            .bind(namespace)
            .bind(password);
        self.on_connection(async |c| {
            self.server_bounded(c, async |c| ensure.execute(c).await.map_err(map_db_error))
                .await
        })
        .await?;
        Ok(())
    }

    /// Pauses (no claims) or resumes a queue.
    pub async fn set_paused(&self, name: &str, paused: bool) -> Result<()> {
        let set = sqlx::query(sql::QUEUE_SET_PAUSED).bind(name).bind(paused);
        let row = self
            .on_connection(async |c| {
                self.server_bounded(c, async |c| Ok(set.fetch_optional(c).await?))
                    .await
            })
            .await?;
        row.map(|_| ())
            .ok_or_else(|| Error::NotFound(format!("queue {name:?}")))
    }

    /// Depth of one queue; None when it does not exist. Counting takes time proportional to the
    /// backlog, so with an answer deadline the server also stops the count itself, at four fifths of
    /// it (`statement_timeout`): the caller gets the server's error (SQLSTATE 57014) and the server
    /// does not count on after the caller gave up. Costs three more round trips then.
    pub async fn depth(&self, queue: &str) -> Result<Option<Depth>> {
        let depth = sqlx::query_as::<_, Depth>(sql::QUEUE_DEPTH).bind(Some(queue));
        self.long_read(async |c| Ok(depth.fetch_optional(c).await?)).await
    }

    /// Depth of every queue, in name order; stopped by the server as [`QueueStore::depth`] is.
    pub async fn depth_all(&self) -> Result<Vec<Depth>> {
        let depth = sqlx::query_as::<_, Depth>(sql::QUEUE_DEPTH).bind(None::<String>);
        self.long_read(async |c| Ok(depth.fetch_all(c).await?)).await
    }

    // ---- enqueue ------------------------------------------------------------------------------------

    /// Enqueues one job (see [`enqueue`]). A deadlock (two calls taking keys in opposite orders) is
    /// retried (up to [`DEADLOCK_ATTEMPTS`] runs in all): the call is its own transaction, so the
    /// aborted attempt left nothing behind.
    ///
    /// Under the store's answer deadline, and its server deadline: an enqueue given up unanswered has
    /// an unknown outcome (it may have committed just before the deadline), and one that is only slow
    /// is ended by the server rather than committed long after its caller gave up and retried. A retry
    /// with the same idempotency key makes no second job.
    pub async fn enqueue(&self, queue: &str, job: &NewJob) -> Result<Enqueued> {
        retry_on_deadlock(|| {
            self.on_connection(async |c| {
                self.server_bounded(c, async |c| enqueue_at(c, queue, job, self.now()).await)
                    .await
            })
        })
        .await
    }

    /// Enqueues many jobs in one statement (see [`enqueue_many`]). A deadlock with another call taking
    /// the same keys (key holders committed between the two calls' reads of them, or batches with both
    /// unique and idempotency keys, can make them take keys in opposite orders) is retried (up to
    /// [`DEADLOCK_ATTEMPTS`] runs in all): the call is its own transaction, so the aborted attempt left
    /// nothing behind. Deadlines as for [`QueueStore::enqueue`] (each job's `idempotency_key` makes a
    /// retry safe).
    pub async fn enqueue_many(&self, queue: &str, jobs: &[NewJob]) -> Result<Vec<Uuid>> {
        retry_on_deadlock(|| {
            self.on_connection(async |c| {
                self.server_bounded(c, async |c| enqueue_many_at(c, queue, jobs, self.now()).await)
                    .await
            })
        })
        .await
    }

    /// Enqueues a graph of jobs in one call (see [`enqueue_graph`]). A deadlock is retried, and the
    /// deadlines apply, as for [`QueueStore::enqueue_many`].
    pub async fn enqueue_graph(&self, queue: &str, jobs: &[GraphJob]) -> Result<Vec<(String, Enqueued)>> {
        retry_on_deadlock(|| {
            self.on_connection(async |c| {
                self.server_bounded(c, async |c| enqueue_graph_at(c, queue, jobs, self.now()).await)
                    .await
            })
        })
        .await
    }

    // ---- periodic jobs ------------------------------------------------------------------------------

    /// One scheduler pass over `schedule` of `queue`: under the schedule's row lock, enqueues a job for
    /// each fire time due since the last pass ([`schedule::due`], by the database clock) and moves the
    /// watermark, in one transaction. `None` when another worker holds the schedule right now. Safe to
    /// call from every worker as often as wanted: each fire time makes exactly one job. Each job carries
    /// the unique key `schedule:<name>:<fire time, RFC 3339>` while it waits or runs.
    ///
    /// Under the store's answer deadline, its transaction under its server deadline: a pass given up
    /// and run again enqueues each fire time once all the same (the unique key, the watermark).
    pub async fn fire_schedule(&self, queue: &str, schedule: &Schedule) -> Result<Option<ScheduleRun>> {
        self.on_connection(async |c| {
            let mut tx = c.begin().await?;
            if let Some(deadline) = self.server_deadline {
                set_server_deadline(&mut tx, deadline).await?;
            }
            let run = fire_schedule_in(&mut tx, queue, schedule).await?;
            if run.is_some() {
                tx.commit().await?;
            }
            Ok(run)
        })
        .await
    }

    /// The schedules of `queue` as the database records them (last and next fire time), by name.
    pub async fn schedules(&self, queue: &str) -> Result<Vec<ScheduleState>> {
        self.on_connection(async |c| {
            Ok(sqlx::query_as::<_, ScheduleState>(sql::SCHEDULE_LIST)
                .bind(queue)
                .fetch_all(c)
                .await?)
        })
        .await
    }

    /// Runs the scheduler for `schedules` (queue, schedule) until `shutdown`: a pass over every schedule
    /// each [`SCHEDULER_TICK`] (a pass with nothing due is one short transaction per schedule). A failed
    /// pass is logged and the next one tries again: a fire time it missed is enqueued late if a pass succeeds
    /// within 60 s of it, and after that is a missed run (`missedRuns` decides).
    pub async fn run_schedules(self, schedules: Vec<(String, Schedule)>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(SCHEDULER_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            for (queue, s) in &schedules {
                match self.fire_schedule(queue, s).await {
                    Ok(Some(run)) if !run.fired.is_empty() => {
                        tracing::info!(queue, schedule = %s.name, jobs = run.fired.len(), "schedule fired")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(queue, schedule = %s.name, error = %e, "schedule pass failed"),
                }
            }
        }
    }

    // ---- jobs ---------------------------------------------------------------------------------------

    /// The jobs job `id` depends on, with their states, in id order (empty for a job without parents).
    /// Under the answer deadline; a lookup by key, so the server needs no deadline of its own.
    pub async fn parents(&self, id: Uuid) -> Result<Vec<Parent>> {
        let parents = sqlx::query_as::<_, Parent>(sql::JOB_PARENTS).bind(id);
        self.on_connection(async |c| Ok(parents.fetch_all(c).await?))
            .await
    }

    /// The queue of each of the jobs `ids` that exists, in one query. Under the answer deadline; a
    /// lookup by key.
    pub async fn queues_of(&self, ids: &[Uuid]) -> Result<std::collections::HashMap<Uuid, String>> {
        let queues = sqlx::query_as::<_, (Uuid, String)>(sql::JOB_QUEUES).bind(ids);
        let rows = self
            .on_connection(async |c| Ok(queues.fetch_all(c).await?))
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// One job, if it exists. Under the answer deadline; a lookup by key.
    pub async fn get(&self, id: Uuid) -> Result<Option<Job>> {
        let job = sqlx::query_as::<_, Job>(sql::JOB_GET).bind(id);
        self.on_connection(async |c| Ok(job.fetch_optional(c).await?))
            .await
    }

    /// Up to `limit` jobs of `queue` (in `state`, if given) with ids after `after`, in id order. A
    /// state that few of a large queue's jobs are in can take a long scan: stopped by the server as
    /// [`QueueStore::depth`] is.
    pub async fn list(
        &self,
        queue: &str,
        state: Option<JobState>,
        after: Option<Uuid>,
        limit: i64,
    ) -> Result<Vec<Job>> {
        let list = sqlx::query_as::<_, Job>(sql::JOB_LIST)
            .bind(queue)
            .bind(state.map(JobState::as_str))
            .bind(after)
            .bind(limit);
        self.long_read(async |c| Ok(list.fetch_all(c).await?)).await
    }

    /// Cancels a job: waiting → cancelled at once; running → cancellation requested (its worker stops
    /// the handler and records `cancelled`); finished → nothing.
    ///
    /// Cancelling a waiting job with dependents cancels them in the same statement; the job and every
    /// job its cancel cascades to are locked first, in one statement in id order ([`sql::JOB_CANCEL`]).
    /// A child enqueued after that statement read the cascade can still meet another transaction in the
    /// other order: a cancel PostgreSQL aborted as a deadlock is run again (it is its own
    /// transaction, so the aborted attempt left nothing behind).
    ///
    /// Under the store's answer and server deadlines: a cancel given up unanswered may or may not have
    /// been made, and running it again is harmless (a cancelled job stays cancelled).
    pub async fn cancel(&self, id: Uuid) -> Result<CancelOutcome> {
        let row = retry_on_deadlock(|| {
            self.on_connection(async |c| {
                self.server_bounded(c, async |c| {
                    Ok(sqlx::query(sql::JOB_CANCEL).bind(id).fetch_optional(c).await?)
                })
                .await
            })
        })
        .await?
        .ok_or_else(|| Error::NotFound(format!("job {id}")))?;
        let before: String = row.try_get("before")?;
        let before: JobState = before.parse().map_err(Error::Invalid)?;
        Ok(match before {
            JobState::Blocked | JobState::Pending | JobState::Retrying => CancelOutcome::Cancelled,
            JobState::Running => CancelOutcome::Requested,
            done => CancelOutcome::AlreadyFinished(done),
        })
    }

    /// Retries a dead job: one more attempt, ready now. Not found → [`Error::NotFound`]; not dead →
    /// [`Error::Conflict`].
    ///
    /// Under the store's answer and server deadlines. A retry given up unanswered may or may not have
    /// been made; run again after it was, it finds the job no longer dead ([`Error::Conflict`]).
    pub async fn retry_dead(&self, id: Uuid) -> Result<()> {
        let retry = sqlx::query(sql::JOB_RETRY_DEAD).bind(id);
        let row = self
            .on_connection(async |c| {
                self.server_bounded(c, async |c| Ok(retry.fetch_optional(c).await?))
                    .await
            })
            .await?;
        match row {
            Some(_) => Ok(()),
            None => match self.get(id).await? {
                None => Err(Error::NotFound(format!("job {id}"))),
                Some(j) => Err(Error::Conflict(format!(
                    "job {id} is {}, only dead jobs can be retried",
                    j.state
                ))),
            },
        }
    }

    // ---- job events ---------------------------------------------------------------------------------

    /// Makes the state changes of `queues`' jobs notified on [`crate::events::JOB_EVENTS_CHANNEL`] for
    /// `ttl` from now, on behalf of `subscriber` (one row per queue; call again before `ttl` passes to
    /// keep them), and stops `subscriber`'s subscriptions to other queues. Also deletes rows that expired
    /// a minute ago or more.
    ///
    /// Under the store's answer deadline, its transaction under the server deadline: it is renewed
    /// periodically, and a renewal given up is simply made again.
    pub async fn subscribe_events(&self, subscriber: &str, queues: &[String], ttl: Duration) -> Result<()> {
        self.on_connection(async |c| {
            let mut tx = c.begin().await?;
            if let Some(deadline) = self.server_deadline {
                set_server_deadline(&mut tx, deadline).await?;
            }
            if !queues.is_empty() {
                sqlx::query(sql::EVENT_SUBSCRIBE)
                    .bind(queues)
                    .bind(subscriber)
                    .bind(ttl.as_millis() as i64)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query(sql::EVENT_UNSUBSCRIBE_OTHERS)
                .bind(queues)
                .bind(subscriber)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(())
        })
        .await
    }

    /// A job's queue, state and attempt, with the snapshot they were read under; None when it does not
    /// exist. Under the answer deadline; a lookup by key.
    pub async fn job_status(&self, id: Uuid) -> Result<Option<JobStatus>> {
        let status = sqlx::query(sql::JOB_STATUS).bind(id);
        let Some(row) = self
            .on_connection(async |c| Ok(status.fetch_optional(c).await?))
            .await?
        else {
            return Ok(None);
        };
        let state: String = row.try_get("state")?;
        let snapshot: String = row.try_get("snapshot")?;
        Ok(Some(JobStatus {
            queue: row.try_get("queue")?,
            state: state.parse().map_err(Error::Invalid)?,
            attempt: row.try_get("attempt")?,
            snapshot: snapshot.parse().map_err(Error::Invalid)?,
        }))
    }

    // ---- worker side --------------------------------------------------------------------------------

    /// Claims up to `limit` ready jobs of `queue` for `owner`, leased for `lease`: highest priority first.
    pub async fn claim_batch(
        &self,
        queue: &str,
        owner: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<ClaimedJob>> {
        self.claim_batch_of_kinds(queue, &[], owner, limit, lease).await
    }

    /// [`QueueStore::claim_batch`] of jobs whose kind is one of `kinds` (all kinds when empty). Jobs of
    /// other kinds stay for other workers; see [`sql::JOB_CLAIM_BATCH_OF_KINDS`] for what the filter
    /// costs.
    pub async fn claim_batch_of_kinds(
        &self,
        queue: &str,
        kinds: &[String],
        owner: &str,
        limit: u32,
        lease: Duration,
    ) -> Result<Vec<ClaimedJob>> {
        let statement = if kinds.is_empty() {
            sql::JOB_CLAIM_BATCH
        } else {
            sql::JOB_CLAIM_BATCH_OF_KINDS
        };
        let mut query = sqlx::query_as::<_, ClaimedJob>(statement)
            .bind(queue)
            .bind(owner)
            .bind(i64::from(limit))
            .bind(lease.as_millis() as i64);
        if !kinds.is_empty() {
            query = query.bind(kinds);
        }
        let mut jobs = self
            .on_connection(async |c| Ok(query.fetch_all(c).await?))
            .await?;
        // `UPDATE … RETURNING` gives rows back in no particular order; handler slots are handed out in
        // this order, so restore the claim's: highest priority first, then oldest (UUIDv7 ids sort by
        // enqueue time).
        jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.id));
        Ok(jobs)
    }

    /// Records finished attempts in one call, fenced on (id, running, owner, attempt). Returns the jobs
    /// written with their new state; a job missing from the result was no longer this owner's.
    ///
    /// One autocommit statement, [`sql::JOB_FINISH`] (`sluice.finish_jobs`): the fenced update with its
    /// generic plan; when some of the jobs have children waiting on them, the jobs of the batch and the
    /// waiting children are locked first, together in one id order, so two batches finishing parents of
    /// shared children, or a batch and an enqueue naming its jobs as parents, lock in one order: one
    /// waits for the other. A child enqueued between the function's look for waiting children and its
    /// update can still make PostgreSQL abort one of them as a deadlock; the batch is then run again,
    /// as an enqueue is.
    ///
    /// A NUL character, which PostgreSQL text cannot hold, is written as U+FFFD in the error texts (a
    /// handler's answer may contain one); one such text would otherwise make PostgreSQL refuse the whole
    /// batch, every time it is retried.
    pub async fn finish_batch(&self, owner: &str, done: &[Finished]) -> Result<Vec<(Uuid, String)>> {
        let mut done: Vec<&Finished> = done.iter().collect();
        done.sort_by_key(|d| d.id);
        let mut ids = Vec::with_capacity(done.len());
        let mut attempts = Vec::with_capacity(done.len());
        let mut outcomes = Vec::with_capacity(done.len());
        let mut delays = Vec::with_capacity(done.len());
        let mut errors = Vec::with_capacity(done.len());
        for d in &done {
            ids.push(d.id);
            attempts.push(d.attempt);
            let (o, delay, err) = match &d.finish {
                Finish::Succeeded => ("s", 0, ""),
                Finish::Retry { delay, error } => ("r", delay.as_millis() as i64, error.as_str()),
                Finish::Permanent { error } => ("p", 0, error.as_str()),
                Finish::Cancelled => ("c", 0, "cancelled while running"),
            };
            outcomes.push(o);
            delays.push(delay);
            errors.push(without_nul(err));
        }
        let (ids, attempts, outcomes, delays, errors) = (&ids, &attempts, &outcomes, &delays, &errors);
        let rows = retry_on_deadlock(|| {
            self.on_connection(async |c| {
                let finish = sqlx::query(sql::JOB_FINISH)
                    .bind(ids)
                    .bind(attempts)
                    .bind(outcomes)
                    .bind(delays)
                    .bind(errors)
                    .bind(owner);
                self.server_bounded(c, async |c| Ok(finish.fetch_all(c).await?))
                    .await
            })
        })
        .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("state")?)))
            .collect()
    }

    /// Extends the leases of `owner`'s running jobs by `lease`, skipping those another transaction holds
    /// (see [`sql::JOB_HEARTBEAT`]). Returns the jobs still held: a job missing from it was lost.
    pub async fn heartbeat(&self, owner: &str, jobs: &[(Uuid, i32)], lease: Duration) -> Result<Vec<Held>> {
        let (ids, attempts): (Vec<Uuid>, Vec<i32>) = in_lock_order(jobs).into_iter().unzip();
        let query = sqlx::query(sql::JOB_HEARTBEAT)
            .bind(ids)
            .bind(attempts)
            .bind(owner)
            .bind(lease.as_millis() as i64);
        let rows = self.fetch_planned_generically(query).await?;
        rows.iter()
            .map(|r| {
                Ok(Held {
                    id: r.try_get("id")?,
                    cancel_requested: r.try_get("cancel_requested")?,
                    renewed: r.try_get("renewed")?,
                })
            })
            .collect()
    }

    /// Extends the lease of `owner`'s running job `job` (id, attempt) by `lease`, waiting up to `wait` for
    /// its row if another transaction holds it (see [`sql::JOB_HEARTBEAT_WAITING`]): for a job
    /// [`QueueStore::heartbeat`] skipped. `Some` with `renewed` when extended; `Some` without when the
    /// row was still held after `wait` (the job is still the owner's as far as is known); `None` when the
    /// job is no longer the owner's (lost).
    pub async fn heartbeat_waiting(
        &self,
        owner: &str,
        job: (Uuid, i32),
        lease: Duration,
        wait: Duration,
    ) -> Result<Option<Held>> {
        self.on_connection(async |c| {
            let mut tx = c.begin().await?;
            set_lock_timeout(&mut tx, wait).await?;
            let row = sqlx::query(sql::JOB_HEARTBEAT_WAITING)
                .bind(job.0)
                .bind(job.1)
                .bind(owner)
                .bind(lease.as_millis() as i64)
                .fetch_optional(&mut *tx)
                .await;
            let row = match row {
                Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some(LOCK_NOT_AVAILABLE) => {
                    return Ok(Some(Held {
                        id: job.0,
                        cancel_requested: false,
                        renewed: false,
                    }));
                }
                row => row?,
            };
            tx.commit().await?;
            row.map(|r| {
                Ok(Held {
                    id: r.try_get("id")?,
                    cancel_requested: r.try_get("cancel_requested")?,
                    renewed: true,
                })
            })
            .transpose()
        })
        .await
    }

    /// Extends the leases of `owner`'s finished jobs whose outcome is not written yet by `lease`,
    /// skipping those another transaction holds (the owner's own write, mostly): see
    /// [`sql::JOB_HEARTBEAT_FINISHING`]. Returns the jobs renewed.
    pub async fn heartbeat_finishing(
        &self,
        owner: &str,
        jobs: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<Vec<Uuid>> {
        let (ids, attempts): (Vec<Uuid>, Vec<i32>) = in_lock_order(jobs).into_iter().unzip();
        let query = sqlx::query(sql::JOB_HEARTBEAT_FINISHING)
            .bind(ids)
            .bind(attempts)
            .bind(owner)
            .bind(lease.as_millis() as i64);
        let rows = self.fetch_planned_generically(query).await?;
        rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
    }

    /// Hands `owner`'s running jobs back without counting the attempt. Returns the jobs released.
    ///
    /// A job whose cancellation was requested is cancelled instead, and its dependents with it (see
    /// [`QueueStore::cancel`]). As a cancel does, the release first locks its jobs together with the
    /// jobs those cancels cascade to, in one statement in id order ([`sql::JOB_LOCK_RELEASING`]), then
    /// writes them, in one transaction with its generic plans (see [`sql`]). A job that joins a cascade
    /// after that statement read it can still meet another transaction in the other order: PostgreSQL
    /// aborts one side as a deadlock, and the release is run again.
    pub async fn release(&self, owner: &str, jobs: &[(Uuid, i32)]) -> Result<Vec<Uuid>> {
        let (ids, attempts): (Vec<Uuid>, Vec<i32>) = in_lock_order(jobs).into_iter().unzip();
        let (ids, attempts) = (&ids, &attempts);
        let rows = retry_on_deadlock(|| {
            self.on_connection(async |c| {
                let mut tx = c.begin().await?;
                sqlx::query(sql::PLAN_GENERIC).execute(&mut *tx).await?;
                if let Some(deadline) = self.server_deadline {
                    set_server_deadline(&mut tx, deadline).await?;
                }
                sqlx::query(sql::JOB_LOCK_RELEASING)
                    .bind(ids)
                    .bind(owner)
                    .execute(&mut *tx)
                    .await?;
                let rows = sqlx::query(sql::JOB_RELEASE_FENCED)
                    .bind(ids)
                    .bind(attempts)
                    .bind(owner)
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(rows)
            })
        })
        .await?;
        rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
    }

    /// Hands back `owner`'s running jobs of `queues` that are not among `held` (id, attempt): the jobs a
    /// claim given up unanswered leased to `owner` when it committed after all. Each is ready again as
    /// if it had never been claimed: its attempt taken back, `pending` or `retrying`, its lease cleared,
    /// its queue's workers woken. Fenced on owner and attempt: a job another worker holds has another
    /// owner, and `held` must name every job the owner has claimed and not written (running, queued or
    /// finishing) and every job whose outcome it gave up writing, read while none of its claims is under
    /// way. A job whose lease lapsed or whose cancellation was requested is left to the rescue, and one
    /// another transaction holds to the next call: it never waits for a lock. Returns the jobs handed
    /// back (id, attempt now, queue). One call of `sluice.return_unknown_claims` ([`sql::JOB_RETURN_UNKNOWN`]).
    pub async fn return_unknown_claims(
        &self,
        owner: &str,
        queues: &[String],
        held: &[(Uuid, i32)],
    ) -> Result<Vec<(Uuid, i32, String)>> {
        let (ids, attempts): (Vec<Uuid>, Vec<i32>) = held.iter().copied().unzip();
        // In a transaction of its own, committed only once its answer came: a call given up unanswered
        // (a frozen server) never commits, so it cannot run later, after the caller's claims resumed,
        // with a list of held jobs that no longer names them all, and hand back a job being run.
        let rows = self
            .on_connection(async |c| {
                let mut tx = c.begin().await?;
                let rows = sqlx::query(sql::JOB_RETURN_UNKNOWN)
                    .bind(owner)
                    .bind(queues)
                    .bind(&ids)
                    .bind(&attempts)
                    .fetch_all(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok(rows)
            })
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("id")?, r.try_get("attempt")?, r.try_get("queue")?)))
            .collect()
    }

    /// Runs `statements` on a connection of the pool, within the [answer deadline](Self::with_answer_deadline)
    /// when there is one. Past it the statements are dropped unfinished and their connection closed
    /// (detached from the pool, which opens another in its place), whatever state it was in.
    async fn on_connection<T>(
        &self,
        statements: impl AsyncFnOnce(&mut PgConnection) -> Result<T>,
    ) -> Result<T> {
        let mut conn = self.pool.acquire().await?;
        let Some(deadline) = self.answer_deadline else {
            return statements(&mut conn).await;
        };
        match tokio::time::timeout(deadline, statements(&mut conn)).await {
            Ok(done) => done,
            Err(_) => {
                drop(conn.detach());
                Err(Unanswered(deadline).into_error())
            }
        }
    }

    /// Runs `statement` on `c`, in a transaction of its own that the server ends within the
    /// [server deadline](Self::with_server_deadline) when there is one (three more round trips), or
    /// else as it is.
    async fn server_bounded<T>(
        &self,
        c: &mut PgConnection,
        statement: impl AsyncFnOnce(&mut PgConnection) -> Result<T>,
    ) -> Result<T> {
        let Some(deadline) = self.server_deadline else {
            return statement(c).await;
        };
        let mut tx = c.begin().await?;
        set_server_deadline(&mut tx, deadline).await?;
        let done = statement(&mut tx).await?;
        tx.commit().await?;
        Ok(done)
    }

    /// Runs `read`, a read whose time grows with the table (a count of a backlog, a scan), within the
    /// [answer deadline](Self::with_answer_deadline) when there is one, in a transaction whose
    /// `statement_timeout` is four fifths of it: a read given up by the client is also stopped by the
    /// server (which otherwise counts on until it next answers, and only then notices the closed
    /// connection), and a read that is only slow fails with the server's error (SQLSTATE 57014) before
    /// the client gives up, its connection kept. Costs three more round trips; none without a deadline.
    async fn long_read<T>(&self, read: impl AsyncFnOnce(&mut PgConnection) -> Result<T>) -> Result<T> {
        let Some(deadline) = self.answer_deadline else {
            return self.on_connection(read).await;
        };
        self.on_connection(async |c| {
            let mut tx = c.begin().await?;
            sqlx::query("SELECT pg_catalog.set_config('statement_timeout', $1, true)")
                .bind(format!("{}ms", (deadline * 4 / 5).as_millis().max(1)))
                .execute(&mut *tx)
                .await?;
            let done = read(&mut tx).await?;
            tx.commit().await?;
            Ok(done)
        })
        .await
    }

    /// Runs one of the by-id batch statements (the heartbeats) with its generic plan, in a transaction of its
    /// own: `SET LOCAL plan_cache_mode = force_generic_plan` (see [`sql`] for why the generic plan is the
    /// right one at every table size and a custom plan is not). Costs two more round trips per batch,
    /// not per job.
    async fn fetch_planned_generically(
        &self,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<Vec<PgRow>> {
        self.on_connection(async |c| {
            let mut tx = c.begin().await?;
            sqlx::query(sql::PLAN_GENERIC).execute(&mut *tx).await?;
            let rows = query.fetch_all(&mut *tx).await?;
            tx.commit().await?;
            Ok(rows)
        })
        .await
    }

    /// Makes up to `limit` jobs of `queues` whose lease expired ready again (or dead, or cancelled).
    /// Returns how many. One call of `sluice.rescue_expired` ([`sql::JOB_RESCUE_EXPIRED`]), which never
    /// waits for a lock: a job the rescue ends while it has dependents is locked first with the jobs its
    /// end cascades to, in one statement in id order, skipping rows another transaction holds, and is
    /// rescued only when it and its whole cascade were locked (the others are left for a later pass);
    /// the rest are taken with `SKIP LOCKED`. A rescue PostgreSQL aborted as a deadlock all the same is
    /// run again.
    pub async fn rescue_expired(&self, queues: &[String], limit: i64) -> Result<u64> {
        let rows = retry_on_deadlock(|| {
            self.on_connection(async |c| {
                Ok(sqlx::query(sql::JOB_RESCUE_EXPIRED)
                    .bind(queues)
                    .bind(limit)
                    .fetch_all(c)
                    .await?)
            })
        })
        .await?;
        Ok(rows.len() as u64)
    }

    /// Running jobs of `queue` per lease owner (the worker process holding them): which pod holds how
    /// many leases, for the operator's pod-deletion-cost.
    pub async fn running_by_owner(&self, queue: &str) -> Result<Vec<(String, i64)>> {
        let rows = self
            .on_connection(async |c| {
                Ok(sqlx::query(sql::JOB_COUNT_RUNNING_BY_OWNER)
                    .bind(queue)
                    .fetch_all(c)
                    .await?)
            })
            .await?;
        rows.iter()
            .map(|r| {
                let owner: Option<String> = r.try_get("lease_owner")?;
                Ok((owner.unwrap_or_default(), r.try_get("running")?))
            })
            .collect()
    }

    /// Deletes up to `limit` finished jobs of `queue` past their retention. Returns how many.
    pub async fn delete_expired(&self, queue: &str, limit: i64) -> Result<u64> {
        let done = self
            .on_connection(async |c| {
                Ok(sqlx::query(sql::JOB_DELETE_EXPIRED)
                    .bind(queue)
                    .bind(limit)
                    .execute(c)
                    .await?)
            })
            .await?;
        Ok(done.rows_affected())
    }
}

/// One scheduler pass over `schedule` of `queue` in transaction `tx` (see [`QueueStore::fire_schedule`]).
async fn fire_schedule_in(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    queue: &str,
    schedule: &Schedule,
) -> Result<Option<ScheduleRun>> {
    sqlx::query(sql::SCHEDULE_ENSURE)
        .bind(queue)
        .bind(&schedule.name)
        .execute(&mut **tx)
        .await
        .map_err(map_db_error)?;
    let Some(row) = sqlx::query(sql::SCHEDULE_LOCK)
        .bind(queue)
        .bind(&schedule.name)
        .fetch_optional(&mut **tx)
        .await?
    else {
        return Ok(None);
    };
    let handled: DateTime<Utc> = row.try_get("handled_until")?;
    let now: DateTime<Utc> = row.try_get("now")?;
    let mut fired = Vec::new();
    for at in schedule::due(&schedule.cron, handled, now, schedule.missed_runs) {
        let job = NewJob {
            unique_key: Some(format!(
                "schedule:{}:{}",
                schedule.name,
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            )),
            unique_mode: Some(UniqueMode::Preserve),
            ..schedule.job.clone()
        };
        let done = enqueue_at(&mut **tx, queue, &job, now).await?;
        fired.push((at, done.id));
    }
    let next_fire_at = schedule.cron.next_after(now);
    sqlx::query(sql::SCHEDULE_ADVANCE)
        .bind(queue)
        .bind(&schedule.name)
        .bind(now)
        .bind(fired.last().map(|f| f.0))
        .bind(fired.last().map(|f| f.1))
        .bind(next_fire_at)
        .execute(&mut **tx)
        .await?;
    Ok(Some(ScheduleRun { fired, next_fire_at }))
}

/// `jobs` sorted by id: the order in which the by-id batch statements (finish, heartbeat, release) lock
/// their rows, since their plan walks the ids in array order. One order for all of them means a
/// heartbeat and a completion covering some of the same jobs (a job finishing while the heartbeat is
/// under way) never lock in opposite orders; before, they could deadlock, and PostgreSQL broke the tie
/// only after `deadlock_timeout` (1 s), aborting one (seen once in a 100k-job run at concurrency 512).
fn in_lock_order(jobs: &[(Uuid, i32)]) -> Vec<(Uuid, i32)> {
    let mut jobs = jobs.to_vec();
    jobs.sort_unstable_by_key(|j| j.0);
    jobs
}

/// Enqueues one job through `sluice.enqueue_job` on any executor — a pool, a connection, or `&mut *tx`
/// of the caller's transaction (the job then commits or rolls back with it).
///
/// Errors: [`Error::NotFound`] for an unknown queue, [`Error::Conflict`] for an idempotency key reused with
/// another kind or payload, [`Error::Invalid`] for bad input.
///
/// A job with parents or keys locks them (and their holders) in one statement in id order, but can still
/// meet another transaction locking some of the same jobs in another order (a job enqueued meanwhile):
/// PostgreSQL then aborts one transaction as a deadlock ([`is_deadlock`]); roll it back and run it again
/// ([`QueueStore::enqueue`] does so once by itself).
pub async fn enqueue<'e>(exec: impl PgExecutor<'e>, queue: &str, job: &NewJob) -> Result<Enqueued> {
    enqueue_at(exec, queue, job, Utc::now()).await
}

async fn enqueue_at<'e>(
    exec: impl PgExecutor<'e>,
    queue: &str,
    job: &NewJob,
    now: DateTime<Utc>,
) -> Result<Enqueued> {
    check_new_job(job)?;
    let row = sqlx::query(sql::JOB_ENQUEUE)
        .bind(queue)
        .bind(&job.kind)
        .bind(&job.payload)
        .bind(i32::from(job.priority))
        .bind(job.effective_run_at(now))
        .bind(job.max_attempts)
        .bind(job.idempotency_key.as_deref())
        .bind(Uuid::now_v7())
        .bind(job.unique_key.as_deref())
        .bind(job.unique_mode.map(UniqueMode::as_str))
        .bind(job.unique_for.map(millis))
        .bind(job.debounce.map(millis))
        .bind((!job.depends_on.is_empty()).then_some(&job.depends_on))
        .bind(job.on_parent_failure.map(OnParentFailure::as_str))
        .fetch_one(exec)
        .await
        .map_err(map_db_error)?;
    Ok(Enqueued {
        id: row.try_get("id")?,
        created: row.try_get("created")?,
    })
}

/// Enqueues many jobs in one statement (`sluice.enqueue_many`) on any executor; returns their ids in
/// order. Without keys it is one UNNEST insert; jobs may carry idempotency and unique keys (then each job
/// is enqueued by the rules of [`enqueue`], keyed jobs in key order, and a job whose key was held gets the
/// holder's id). Dependencies take a graph ([`enqueue_graph`]); all jobs share one `max_attempts`
/// (absent: the queue's setting).
///
/// Batches whose jobs carry both a unique and an idempotency key can take keys in opposite orders and
/// deadlock: PostgreSQL aborts one transaction ([`is_deadlock`]); roll it back and run it again
/// ([`QueueStore::enqueue_many`] does so once by itself).
pub async fn enqueue_many<'e>(exec: impl PgExecutor<'e>, queue: &str, jobs: &[NewJob]) -> Result<Vec<Uuid>> {
    enqueue_many_at(exec, queue, jobs, Utc::now()).await
}

async fn enqueue_many_at<'e>(
    exec: impl PgExecutor<'e>,
    queue: &str,
    jobs: &[NewJob],
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let mut payloads = Vec::with_capacity(jobs.len());
    let mut kinds = Vec::with_capacity(jobs.len());
    let mut priorities = Vec::with_capacity(jobs.len());
    let mut run_ats = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        check_new_job(j).map_err(|e| Error::Invalid(format!("jobs[{i}]: {e}")))?;
        if j.max_attempts != jobs[0].max_attempts {
            return Err(Error::Invalid(format!(
                "jobs[{i}].maxAttempts: all jobs of a batch share one maxAttempts (that of jobs[0])"
            )));
        }
        if !j.depends_on.is_empty() || j.on_parent_failure.is_some() {
            return Err(Error::Invalid(format!(
                "jobs[{i}].dependsOn: not supported in a batch; enqueue a graph instead"
            )));
        }
        payloads.push(&j.payload);
        kinds.push(j.kind.as_str());
        priorities.push(i32::from(j.priority));
        run_ats.push(j.effective_run_at(now));
    }
    let all_now = jobs.iter().all(|j| j.run_at.is_none() && j.delay_ms.is_none());
    // The key arrays only when some job has a key: without, the SQL function inserts all rows at once.
    let keyed = jobs
        .iter()
        .any(|j| j.idempotency_key.is_some() || j.unique_key.is_some());
    let keys = |f: fn(&NewJob) -> Option<String>| keyed.then(|| jobs.iter().map(f).collect::<Vec<_>>());
    let periods = |f: fn(&NewJob) -> Option<i64>| keyed.then(|| jobs.iter().map(f).collect::<Vec<_>>());
    let rows = sqlx::query(sql::JOB_ENQUEUE_MANY)
        .bind(queue)
        .bind(payloads)
        .bind(kinds)
        .bind(priorities)
        // Jobs without a time take the database's now() (NULL array), so a client clock ahead of the
        // database cannot delay them.
        .bind((!all_now).then_some(run_ats))
        .bind(jobs[0].max_attempts)
        .bind(jobs.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
        .bind(keys(|j| j.idempotency_key.clone()))
        .bind(keys(|j| j.unique_key.clone()))
        .bind(keys(|j| j.unique_mode.map(|m| m.as_str().to_owned())))
        .bind(periods(|j| j.unique_for.map(millis)))
        .bind(periods(|j| j.debounce.map(millis)))
        .fetch_all(exec)
        .await
        .map_err(map_db_error)?;
    rows.iter().map(|r| Ok(r.try_get("id")?)).collect()
}

/// Most jobs in one graph ([`enqueue_graph`]); the SQL function holds the same limit.
pub const MAX_GRAPH_JOBS: usize = 100;
/// Most parents of one job.
pub const MAX_PARENTS: usize = 1000;

/// Enqueues a small graph of jobs (at most [`MAX_GRAPH_JOBS`]) in one call through
/// `sluice.enqueue_graph`, on any executor: parents before children, all or nothing. Each job has a
/// `ref` unique within the graph and depends on other jobs by ref or on existing jobs by id. Jobs may
/// carry idempotency and unique keys, with the rules of [`enqueue`]: a job whose key is held is answered
/// by the holder (its id is returned for the ref, and the graph's children of the ref depend on it).
/// Returns (ref, what the enqueue did) in input order.
///
/// Errors: [`Error::Invalid`] naming the job for a cycle, a duplicate or unknown ref, an unknown job id
/// or bad input; [`Error::NotFound`] for an unknown queue. A deadlock ([`is_deadlock`]) is possible as
/// for [`enqueue`]: roll the transaction back and run it again ([`QueueStore::enqueue_graph`] does so once
/// by itself).
pub async fn enqueue_graph<'e>(
    exec: impl PgExecutor<'e>,
    queue: &str,
    jobs: &[GraphJob],
) -> Result<Vec<(String, Enqueued)>> {
    enqueue_graph_at(exec, queue, jobs, Utc::now()).await
}

async fn enqueue_graph_at<'e>(
    exec: impl PgExecutor<'e>,
    queue: &str,
    jobs: &[GraphJob],
    now: DateTime<Utc>,
) -> Result<Vec<(String, Enqueued)>> {
    if jobs.is_empty() {
        return Err(Error::Invalid("jobs: must hold at least one job".into()));
    }
    if jobs.len() > MAX_GRAPH_JOBS {
        return Err(Error::Invalid(format!(
            "jobs: {} jobs is over the graph limit of {MAX_GRAPH_JOBS}",
            jobs.len()
        )));
    }
    let mut body = Vec::with_capacity(jobs.len());
    for (i, j) in jobs.iter().enumerate() {
        let job = j.as_new_job();
        check_new_job(&job).map_err(|e| Error::Invalid(format!("jobs[{i}]: {e}")))?;
        if j.reference.is_empty() || j.reference.len() > 255 {
            return Err(Error::Invalid(format!("jobs[{i}].ref: must be 1-255 characters")));
        }
        check_no_nul(&format!("jobs[{i}].ref"), &j.reference)?;
        for (k, parent) in j.depends_on.iter().enumerate() {
            check_no_nul(&format!("jobs[{i}].dependsOn[{k}]"), parent)?;
        }
        if j.depends_on.len() > MAX_PARENTS {
            return Err(Error::Invalid(format!(
                "jobs[{i}].dependsOn: at most {MAX_PARENTS} parents"
            )));
        }
        body.push(serde_json::json!({
            "ref": j.reference,
            "kind": j.kind,
            "payload": j.payload,
            "priority": j.priority,
            "runAt": job.effective_run_at(now),
            "maxAttempts": j.max_attempts,
            "dependsOn": j.depends_on,
            "onParentFailure": j.on_parent_failure.map(OnParentFailure::as_str),
            "idempotencyKey": j.idempotency_key,
            "uniqueKey": j.unique_key,
            "uniqueMode": j.unique_mode.map(UniqueMode::as_str),
            "uniqueFor": j.unique_for.map(|d| format!("{} milliseconds", millis(d))),
            "debounce": j.debounce.map(|d| format!("{} milliseconds", millis(d))),
        }));
    }
    let rows = sqlx::query(sql::JOB_ENQUEUE_GRAPH)
        .bind(queue)
        .bind(serde_json::Value::Array(body))
        .fetch_all(exec)
        .await
        .map_err(map_db_error)?;
    rows.iter()
        .map(|r| {
            let done = Enqueued {
                id: r.try_get("id")?,
                created: r.try_get("created")?,
            };
            Ok((r.try_get("ref")?, done))
        })
        .collect()
}

fn check_queue_name(name: &str) -> Result<()> {
    if valid_queue_name(name) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "queue name {name:?}: use 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit, \
             optionally after a namespace and '/' (shop/emails)"
        )))
    }
}

/// Validates a job before it reaches the database, naming the field at fault.
pub fn check_new_job(job: &NewJob) -> Result<()> {
    if job.kind.is_empty() || job.kind.len() > 200 {
        return Err(Error::Invalid("kind: must be 1-200 characters".into()));
    }
    check_no_nul("kind", &job.kind)?;
    for (field, key) in [
        ("idempotencyKey", &job.idempotency_key),
        ("uniqueKey", &job.unique_key),
    ] {
        if let Some(key) = key {
            check_no_nul(field, key)?;
        }
    }
    if !(-1000..=1000).contains(&job.priority) {
        return Err(Error::Invalid("priority: must be between -1000 and 1000".into()));
    }
    if let Some(n) = job.max_attempts
        && !(1..=1000).contains(&n)
    {
        return Err(Error::Invalid("maxAttempts: must be between 1 and 1000".into()));
    }
    if let Some(k) = &job.idempotency_key
        && (k.is_empty() || k.len() > 255)
    {
        return Err(Error::Invalid("idempotencyKey: must be 1-255 characters".into()));
    }
    check_unique(job)?;
    if job.depends_on.len() > MAX_PARENTS {
        return Err(Error::Invalid(format!(
            "dependsOn: at most {MAX_PARENTS} parents"
        )));
    }
    let size = serde_json::to_vec(&job.payload)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_PAYLOAD_BYTES {
        return Err(Error::Invalid(format!(
            "payload: {size} bytes is over the limit of {MAX_PAYLOAD_BYTES}"
        )));
    }
    check_payload_has_no_nul(&job.payload)
}

/// What a text or JSON string with a NUL character gets: PostgreSQL cannot store one.
const NUL_REFUSED: &str = "a NUL character (\\u0000) cannot be stored in a text or JSON string";

/// Refuses `value` of `field` when it holds a NUL character, naming the field.
fn check_no_nul(field: &str, value: &str) -> Result<()> {
    if value.contains('\0') {
        return Err(Error::Invalid(format!("{field}: {NUL_REFUSED}")));
    }
    Ok(())
}

/// Refuses a payload with a NUL character in any string or object key, at any depth (walked with a
/// stack of its own: the depth of a payload built in Rust has no limit).
fn check_payload_has_no_nul(payload: &serde_json::Value) -> Result<()> {
    use serde_json::Value;
    let mut stack = vec![payload];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(s) => check_no_nul("payload", s)?,
            Value::Array(items) => stack.extend(items),
            Value::Object(fields) => {
                for (key, item) in fields {
                    check_no_nul("payload (an object key)", key)?;
                    stack.push(item);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    Ok(())
}

/// The unique-key options must fit together; the SQL API checks the same, this names the JSON fields.
/// The longest `uniqueFor` and `debounce`: beyond it a run time or key expiry leaves PostgreSQL's range
/// of timestamps long before it means anything.
const MAX_UNIQUE_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

fn check_unique(job: &NewJob) -> Result<()> {
    let Some(key) = &job.unique_key else {
        if job.unique_mode.is_some() || job.unique_for.is_some() || job.debounce.is_some() {
            return Err(Error::Invalid(
                "uniqueMode, uniqueFor and debounce need a uniqueKey".into(),
            ));
        }
        return Ok(());
    };
    if key.is_empty() || key.len() > 255 {
        return Err(Error::Invalid("uniqueKey: must be 1-255 characters".into()));
    }
    for (field, period) in [("uniqueFor", job.unique_for), ("debounce", job.debounce)] {
        if period.is_some_and(|p| p.get() > MAX_UNIQUE_PERIOD) {
            return Err(Error::Invalid(format!("{field}: at most 366 days")));
        }
    }
    let debounce_mode = job.unique_mode == Some(UniqueMode::Debounce)
        || (job.unique_mode.is_none() && job.debounce.is_some());
    if debounce_mode && job.debounce.is_none() {
        return Err(Error::Invalid(
            "debounce: required with uniqueMode debounce (e.g. 10s)".into(),
        ));
    }
    if !debounce_mode && job.debounce.is_some() {
        return Err(Error::Invalid("debounce: only with uniqueMode debounce".into()));
    }
    if debounce_mode && (job.run_at.is_some() || job.delay_ms.is_some()) {
        return Err(Error::Invalid(
            "runAt, delayMs: not with debounce, which sets the run time itself".into(),
        ));
    }
    Ok(())
}

fn millis(d: sluice_crds::duration::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// `s` with each NUL character (which PostgreSQL text refuses) replaced by U+FFFD; borrowed when it has none.
fn without_nul(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains('\0') {
        std::borrow::Cow::Owned(s.replace('\0', "\u{FFFD}"))
    } else {
        std::borrow::Cow::Borrowed(s)
    }
}

/// How many times a call aborted as a deadlock is run in all ([`retry_on_deadlock`]).
pub const DEADLOCK_ATTEMPTS: u32 = 5;

/// How long a call aborted as a deadlock waits before it runs again, at most, times the attempts so
/// far; a random part of it: PostgreSQL aborted this side so that the other could take the lock it was
/// waiting for, and a retry at once (or at the same moment as another victim's) can take the first
/// lock again before the other side has been scheduled to take its own, and meet it once more.
const DEADLOCK_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Runs `attempt`, and again (after a growing, random pause up to [`DEADLOCK_RETRY_PAUSE`] times the
/// attempts so far) while PostgreSQL aborts it as a deadlock ([`is_deadlock`]), [`DEADLOCK_ATTEMPTS`]
/// times in all: for a call that is a transaction of its own, so an aborted attempt left nothing
/// behind. Concurrent keyed enqueues can deadlock when key holders commit between their snapshots
/// (docs/queue.md); the last deadlock is returned.
async fn retry_on_deadlock<T, F, Fut>(mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut tries = 1;
    loop {
        match attempt().await {
            Err(e) if is_deadlock(&e) && tries < DEADLOCK_ATTEMPTS => {
                let most = DEADLOCK_RETRY_PAUSE.as_micros() as u64 * u64::from(tries);
                let pause = most / 2 + random_below(most / 2 + 1);
                tokio::time::sleep(Duration::from_micros(pause)).await;
                tries += 1;
            }
            done => return done,
        }
    }
}

/// A random number below `n` (`n` > 0), for spreading retries: a std `RandomState`'s fresh keys.
fn random_below(n: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(()) % n
}

/// Sets `lock_timeout` to `wait` for the rest of transaction `tx`.
async fn set_lock_timeout(tx: &mut sqlx::Transaction<'_, sqlx::Postgres>, wait: Duration) -> Result<()> {
    sqlx::query("SELECT pg_catalog.set_config('lock_timeout', $1, true)")
        .bind(format!("{}ms", wait.as_millis().max(1)))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Has the server end transaction `tx` within `deadline` (see [`QueueStore::with_server_deadline`]).
async fn set_server_deadline(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    deadline: Duration,
) -> Result<()> {
    let ms = |d: Duration| format!("{}ms", d.as_millis().max(1));
    sqlx::query(
        "SELECT pg_catalog.set_config('lock_timeout', $1, true), \
                pg_catalog.set_config('statement_timeout', $2, true), \
                pg_catalog.set_config('idle_in_transaction_session_timeout', $3, true)",
    )
    .bind(ms(deadline / 2))
    .bind(ms(deadline * 4 / 5))
    .bind(ms(deadline))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// PostgreSQL's SQLSTATE for a lock not taken within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// Whether `e` is PostgreSQL's deadlock error (40P01): the transaction was aborted and can be run again.
pub fn is_deadlock(e: &Error) -> bool {
    matches!(e, Error::Database(sqlx::Error::Database(db)) if db.code().as_deref() == Some("40P01"))
}

/// Maps the SQL API's SQLSTATEs to the crate's errors: SL404 → not found, SL409 → conflict, constraint
/// violations → invalid. A NUL character in a text (22021, "… 0x00") or a JSON string (22P05, "`\u0000`
/// cannot be converted to text"), which PostgreSQL cannot store and [`check_new_job`] refuses before
/// the server sees it, is invalid too; the same SQLSTATEs for anything else (a character the database's
/// encoding cannot hold) stay a database error.
pub fn map_db_error(e: sqlx::Error) -> Error {
    if let sqlx::Error::Database(db) = &e {
        let msg = db.message().to_owned();
        match db.code().as_deref() {
            Some("SL404") => return Error::NotFound(msg),
            Some("SL409") => return Error::Conflict(msg),
            Some("23514") | Some("22P02") | Some("22023") | Some("23503") => return Error::Invalid(msg),
            Some("22021") | Some("22P05") => {
                let detail = db
                    .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
                    .and_then(|pg| pg.detail())
                    .unwrap_or_default();
                let names_nul = |s: &str| s.contains("0x00") || s.contains("\\u0000");
                if names_nul(&msg) || names_nul(detail) {
                    return Error::Invalid(format!("{NUL_REFUSED}: {msg}"));
                }
            }
            _ => {}
        }
    }
    Error::Database(e)
}
