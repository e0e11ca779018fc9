//! The queue's data: jobs, their states, queue settings and depth. Plain types; SQL lives in
//! [`crate::sql`] and I/O in [`crate::store`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sluice_crds::sidecar_config::QueueSettingsSpec;
use uuid::Uuid;

pub use sluice_crds::sidecar_config::{valid_queue_name, valid_short_name};

use crate::backoff::Backoff;

/// Largest payload accepted, in bytes of JSON (1 MiB).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Waiting for the jobs it depends on to succeed; not claimable.
    Blocked,
    /// Waiting for its first attempt (maybe scheduled for later).
    Pending,
    /// Claimed by a worker that holds its lease.
    Running,
    /// Done.
    Succeeded,
    /// Failed and waiting out its backoff before the next attempt.
    Retrying,
    /// Failed permanently or ran out of attempts (dead letter); can be retried by API.
    Dead,
    /// Cancelled before or while running.
    Cancelled,
}

impl JobState {
    /// All states.
    pub const ALL: [JobState; 7] = [
        JobState::Blocked,
        JobState::Pending,
        JobState::Running,
        JobState::Succeeded,
        JobState::Retrying,
        JobState::Dead,
        JobState::Cancelled,
    ];

    /// The name stored in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Blocked => "blocked",
            JobState::Pending => "pending",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Retrying => "retrying",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
        }
    }

    /// Whether the job will never run again by itself.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Succeeded | JobState::Dead | JobState::Cancelled)
    }
}

impl std::str::FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        JobState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| format!("unknown job state {s:?}"))
    }
}

/// A job row as stored.
#[derive(Clone, Debug, PartialEq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Job {
    /// UUIDv7.
    pub id: Uuid,
    /// Queue name.
    pub queue: String,
    /// What kind of work (the handler dispatches on it).
    pub kind: String,
    /// The job's input.
    pub payload: serde_json::Value,
    /// Current state (one of [`JobState`]).
    pub state: String,
    /// Higher runs first.
    pub priority: i16,
    /// Attempts started so far.
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Earliest time of the next attempt.
    pub run_at: DateTime<Utc>,
    /// The worker holding the lease while running.
    pub lease_owner: Option<String>,
    /// When the lease runs out unless renewed.
    pub lease_expires_at: Option<DateTime<Utc>>,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// The idempotency key, while it is remembered.
    pub idempotency_key: Option<String>,
    /// Fingerprint of the request the key was used with.
    #[serde(skip)]
    pub payload_hash: Option<Vec<u8>>,
    /// The unique key, while this job holds it.
    #[sqlx(default)]
    pub unique_key: Option<String>,
    /// How long after it succeeded the job keeps its unique key, in ms.
    #[sqlx(default)]
    pub unique_for_ms: Option<i64>,
    /// Parents that have not finished yet (the job is `blocked` while this is above 0).
    #[sqlx(default)]
    pub blocked_by: i32,
    /// What a parent that ends dead or cancelled does to this job: `cancel` (absent) or `run`.
    #[sqlx(default)]
    pub on_parent_failure: Option<String>,
    /// Some job depends on this one.
    #[sqlx(default)]
    #[serde(skip)]
    pub has_dependents: bool,
    /// Cancellation was asked for while running.
    pub cancel_requested: bool,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When the last attempt started.
    pub started_at: Option<DateTime<Utc>>,
    /// When it reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
}

/// A job as handed to a handler after a claim.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct ClaimedJob {
    /// UUIDv7.
    pub id: Uuid,
    /// Queue name.
    pub queue: String,
    /// What kind of work.
    pub kind: String,
    /// The job's input.
    pub payload: serde_json::Value,
    /// Higher runs first.
    pub priority: i16,
    /// This attempt's number (1-based): the fence of its completion.
    pub attempt: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// When the lease runs out unless renewed.
    pub lease_expires_at: DateTime<Utc>,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
}

/// A job to enqueue.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NewJob {
    /// What kind of work.
    pub kind: String,
    /// The job's input (at most [`MAX_PAYLOAD_BYTES`] of JSON).
    pub payload: serde_json::Value,
    /// Higher runs first (-1000..=1000, default 0).
    #[serde(default)]
    pub priority: i16,
    /// Run no earlier than this.
    #[serde(default)]
    pub run_at: Option<DateTime<Utc>>,
    /// Run no earlier than this many milliseconds from now (ignored when `run_at` is given).
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Attempts allowed; absent: the queue's setting.
    #[serde(default)]
    pub max_attempts: Option<i32>,
    /// Idempotency key (the HTTP API takes it from the `Idempotency-Key` header).
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Unique key: at most one job of the queue holds it (see [`UniqueMode`]).
    #[serde(default)]
    pub unique_key: Option<String>,
    /// What an enqueue does when a job holds the unique key (default: preserve; debounce when
    /// `debounce` is given).
    #[serde(default)]
    pub unique_mode: Option<UniqueMode>,
    /// Keep the unique key for this long after the job succeeded (`1h`); absent: released when it
    /// finishes.
    #[serde(default)]
    pub unique_for: Option<sluice_crds::duration::Duration>,
    /// With `uniqueMode: debounce`: run this long after the latest enqueue with the key (`10s`).
    #[serde(default)]
    pub debounce: Option<sluice_crds::duration::Duration>,
    /// Jobs (by id, any queue) that must succeed before this one runs; until then it is `blocked`.
    #[serde(default)]
    pub depends_on: Vec<Uuid>,
    /// What a parent that ends dead or cancelled does to this job (default: cancel it).
    #[serde(default)]
    pub on_parent_failure: Option<OnParentFailure>,
}

/// What a parent that ends `dead` or `cancelled` does to a job that depends on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnParentFailure {
    /// The job is cancelled, with a reason naming the parent.
    #[default]
    Cancel,
    /// The parent counts as finished: the job runs once its other parents are done.
    Run,
}

impl OnParentFailure {
    /// The name the SQL API takes.
    pub fn as_str(self) -> &'static str {
        match self {
            OnParentFailure::Cancel => "cancel",
            OnParentFailure::Run => "run",
        }
    }
}

/// One job of a graph enqueued in one call ([`crate::QueueStore::enqueue_graph`]): the caller's name for
/// it (`ref`), the job, and the jobs it depends on, by ref within the graph or by id.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GraphJob {
    /// The caller's name for the job, unique within the graph.
    #[serde(rename = "ref")]
    pub reference: String,
    /// What kind of work.
    pub kind: String,
    /// The job's input.
    pub payload: serde_json::Value,
    /// Higher runs first.
    #[serde(default)]
    pub priority: i16,
    /// Run no earlier than this.
    #[serde(default)]
    pub run_at: Option<DateTime<Utc>>,
    /// Run no earlier than this many milliseconds from now (ignored when `run_at` is given).
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Attempts allowed; absent: the queue's setting.
    #[serde(default)]
    pub max_attempts: Option<i32>,
    /// Refs of other jobs of the graph, or ids of existing jobs.
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// What a parent that ends dead or cancelled does to this job (default: cancel it).
    #[serde(default)]
    pub on_parent_failure: Option<OnParentFailure>,
    /// Idempotency key: a retried graph is answered with the jobs the first one made.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Unique key (see [`NewJob::unique_key`]): a job whose key is held is the holder.
    #[serde(default)]
    pub unique_key: Option<String>,
    /// What an enqueue does when a job holds the unique key.
    #[serde(default)]
    pub unique_mode: Option<UniqueMode>,
    /// Keep the unique key for this long after the job succeeded.
    #[serde(default)]
    pub unique_for: Option<sluice_crds::duration::Duration>,
    /// With `uniqueMode: debounce`: run this long after the latest enqueue with the key.
    #[serde(default)]
    pub debounce: Option<sluice_crds::duration::Duration>,
}

impl GraphJob {
    /// Job `job` named `reference` within its graph: all of it is taken (kind, payload, priority, run
    /// time, attempts, keys, parents by id and failure policy); refs of the graph are added with
    /// [`GraphJob::depends_on`].
    pub fn new(reference: impl Into<String>, job: NewJob) -> Self {
        Self {
            reference: reference.into(),
            kind: job.kind,
            payload: job.payload,
            priority: job.priority,
            run_at: job.run_at,
            delay_ms: job.delay_ms,
            max_attempts: job.max_attempts,
            depends_on: job.depends_on.iter().map(Uuid::to_string).collect(),
            on_parent_failure: job.on_parent_failure,
            idempotency_key: job.idempotency_key,
            unique_key: job.unique_key,
            unique_mode: job.unique_mode,
            unique_for: job.unique_for,
            debounce: job.debounce,
        }
    }

    /// Also depends on `refs` (refs of the graph or job ids).
    pub fn depends_on<S: Into<String>>(mut self, refs: impl IntoIterator<Item = S>) -> Self {
        self.depends_on.extend(refs.into_iter().map(Into::into));
        self
    }

    /// The job part, for the checks every enqueue makes.
    pub fn as_new_job(&self) -> NewJob {
        NewJob {
            priority: self.priority,
            run_at: self.run_at,
            delay_ms: self.delay_ms,
            max_attempts: self.max_attempts,
            on_parent_failure: self.on_parent_failure,
            idempotency_key: self.idempotency_key.clone(),
            unique_key: self.unique_key.clone(),
            unique_mode: self.unique_mode,
            unique_for: self.unique_for,
            debounce: self.debounce,
            ..NewJob::new(self.kind.clone(), self.payload.clone())
        }
    }
}

/// What an enqueue with a unique key does when a job already holds the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UniqueMode {
    /// Return the holder, waiting or running; change nothing.
    Preserve,
    /// A waiting holder takes the new kind, payload, priority, run time and max attempts; a running
    /// holder is left alone and a new job takes the key, queued after it (`blocked` until it ends).
    Replace,
    /// As replace, and the run time becomes now + `debounce`, pushed again by every enqueue.
    Debounce,
}

impl UniqueMode {
    /// The name the SQL API takes.
    pub fn as_str(self) -> &'static str {
        match self {
            UniqueMode::Preserve => "preserve",
            UniqueMode::Replace => "replace",
            UniqueMode::Debounce => "debounce",
        }
    }
}

impl NewJob {
    /// A job of `kind` with `payload` and default options.
    pub fn new(kind: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            kind: kind.into(),
            payload,
            priority: 0,
            run_at: None,
            delay_ms: None,
            max_attempts: None,
            idempotency_key: None,
            unique_key: None,
            unique_mode: None,
            unique_for: None,
            debounce: None,
            depends_on: Vec::new(),
            on_parent_failure: None,
        }
    }

    /// Runs only after every job of `parents` succeeded (it is `blocked` until then).
    pub fn depends_on(mut self, parents: impl IntoIterator<Item = Uuid>) -> Self {
        self.depends_on.extend(parents);
        self
    }

    /// What a parent that ends dead or cancelled does to this job.
    pub fn on_parent_failure(mut self, policy: OnParentFailure) -> Self {
        self.on_parent_failure = Some(policy);
        self
    }

    /// With a unique key, in `mode`.
    pub fn unique(mut self, key: impl Into<String>, mode: UniqueMode) -> Self {
        self.unique_key = Some(key.into());
        self.unique_mode = Some(mode);
        self
    }

    /// Keeps the unique key for `period` after the job succeeded.
    pub fn unique_for(mut self, period: Duration) -> Self {
        self.unique_for = Some(period.into());
        self
    }

    /// With a unique key in debounce mode: the job runs `quiet` after the latest enqueue with the key.
    pub fn debounce(mut self, key: impl Into<String>, quiet: Duration) -> Self {
        self.unique_key = Some(key.into());
        self.unique_mode = Some(UniqueMode::Debounce);
        self.debounce = Some(quiet.into());
        self
    }

    /// With an idempotency key.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// With a priority (higher runs first).
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Not before `delay` from now.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay_ms = Some(delay.as_millis() as u64);
        self
    }

    /// At most `n` attempts.
    pub fn max_attempts(mut self, n: i32) -> Self {
        self.max_attempts = Some(n);
        self
    }

    /// The earliest run time: `run_at`, else now + `delay_ms`, else None (now, by the database clock).
    pub fn effective_run_at(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.run_at.or_else(|| {
            self.delay_ms
                .map(|ms| now + chrono::Duration::milliseconds(ms.min(i64::MAX as u64 / 2) as i64))
        })
    }
}

/// What an enqueue did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id (the original job's, for a repeated idempotency key).
    pub id: Uuid,
    /// False when an existing job was returned (or, for a unique key in replace or debounce mode,
    /// updated) instead: an earlier request with the same idempotency key made it, or it holds the
    /// unique key.
    pub created: bool,
}

/// A queue's settings (a `sluice.queues` row).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct QueueSettings {
    /// Queue name.
    pub name: String,
    /// Attempts before dead-lettering.
    pub max_attempts: i32,
    /// Backoff base in ms.
    pub backoff_base_ms: i64,
    /// Backoff cap in ms.
    pub backoff_cap_ms: i64,
    /// Backoff growth per attempt.
    pub backoff_multiplier: f64,
    /// Lease of a running job in ms.
    pub lease_ms: i64,
    /// Retention of succeeded and cancelled jobs in ms.
    pub retention_succeeded_ms: i64,
    /// Retention of dead jobs in ms.
    pub retention_dead_ms: i64,
    /// How long idempotency keys are remembered, in ms.
    pub idempotency_window_ms: i64,
    /// Claims are suspended.
    #[sqlx(default)]
    #[serde(default)]
    pub paused: bool,
}

impl QueueSettings {
    /// The settings a queue gets when a worker creates it.
    pub fn defaults(name: impl Into<String>) -> Self {
        Self::from(&QueueSettingsSpec::named(name))
    }

    /// The backoff policy.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            base: Duration::from_millis(self.backoff_base_ms.max(1) as u64),
            cap: Duration::from_millis(self.backoff_cap_ms.max(1) as u64),
            multiplier: self.backoff_multiplier,
        }
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.max(100) as u64)
    }
}

impl From<&QueueSettingsSpec> for QueueSettings {
    fn from(s: &QueueSettingsSpec) -> Self {
        let ms = |d: sluice_crds::duration::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self {
            name: s.name.clone(),
            max_attempts: i32::try_from(s.max_attempts).unwrap_or(i32::MAX),
            backoff_base_ms: ms(s.backoff.base),
            backoff_cap_ms: ms(s.backoff.cap),
            backoff_multiplier: s.backoff.multiplier,
            lease_ms: ms(s.lease_duration),
            retention_succeeded_ms: ms(s.retention_succeeded),
            retention_dead_ms: ms(s.retention_dead),
            idempotency_window_ms: ms(s.idempotency_window),
            paused: false,
        }
    }
}

/// How deep a queue is, from one query. Autoscaling reads [`Depth::demand`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Depth {
    /// Queue name.
    pub queue: String,
    /// Waiting and due now.
    pub ready: i64,
    /// Waiting for the jobs they depend on (not demand: no worker can run them yet).
    #[sqlx(default)]
    pub blocked: i64,
    /// Pending and due later.
    pub scheduled: i64,
    /// Waiting out a retry backoff.
    pub retrying: i64,
    /// Leased by a worker.
    pub running: i64,
    /// Dead-lettered (kept for their retention).
    pub dead: i64,
    /// Age of the oldest ready job in ms (0 when none is ready).
    pub oldest_ready_age_ms: i64,
    /// Claims are suspended.
    pub paused: bool,
}

impl Depth {
    /// Work that needs a worker now: ready + running (running counts so scale-in never starves
    /// in-flight jobs). Blocked jobs do not count: no worker can run them until their parents finish.
    pub fn demand(&self) -> i64 {
        self.ready + self.running
    }
}

/// A job another job depends on, as `GET /v1/jobs/{id}` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, sqlx::FromRow)]
#[serde(rename_all = "camelCase")]
pub struct Parent {
    /// The parent's id.
    pub id: Uuid,
    /// Its state; absent when retention has deleted it (it had finished).
    pub state: Option<String>,
}

/// What a cancel request did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The job was waiting and is now cancelled.
    Cancelled,
    /// The job is running: cancellation was requested and is delivered to its handler.
    Requested,
    /// The job had already finished in this state; nothing changed.
    AlreadyFinished(JobState),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_through_their_column_names() {
        for s in JobState::ALL {
            assert_eq!(s.as_str().parse::<JobState>().unwrap(), s);
        }
        assert!(JobState::Dead.is_terminal());
        assert!(!JobState::Retrying.is_terminal());
    }

    #[test]
    fn a_delay_becomes_a_run_at_and_an_explicit_run_at_wins() {
        let now = DateTime::<Utc>::from_timestamp(1_000, 0).unwrap();
        let j = NewJob::new("k", serde_json::json!({})).delay(Duration::from_secs(5));
        assert_eq!(j.effective_run_at(now), Some(now + chrono::Duration::seconds(5)));
        let at = now + chrono::Duration::seconds(60);
        let j = NewJob {
            run_at: Some(at),
            ..j
        };
        assert_eq!(j.effective_run_at(now), Some(at));
    }
}
