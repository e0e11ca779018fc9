//! Job-queue settings of the sidecar: the worker role and the queue HTTP API served to the app.
//!
//! The operator renders this section from a `JobQueue`; without a file, `sluice-sidecar worker` builds it
//! from env vars alone (`SLUICE_DATABASE_URL`, `SLUICE_QUEUES`, `SLUICE_HANDLER_URL`,
//! `SLUICE_WORKER_CONCURRENCY`, `SLUICE_API_LISTEN`). Reference: docs/queue.md.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{duration::Duration, names::is_dns_label};

/// Default jobs handled at once by one worker (`SLUICE_WORKER_CONCURRENCY`).
pub const WORKER_CONCURRENCY_DEFAULT: u32 = 16;
/// Default largest claim batch (`SLUICE_WORKER_CLAIM_BATCH`).
pub const CLAIM_BATCH_DEFAULT: u32 = 100;
/// Default handler URL (`SLUICE_HANDLER_URL`).
pub const HANDLER_URL_DEFAULT: &str = "http://127.0.0.1:3000/jobs";
/// Default deadline of one handler call.
pub const JOB_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);
/// Default handler statuses that fail a job permanently (no retry).
pub const PERMANENT_FAILURE_STATUSES_DEFAULT: [u16; 1] = [422];
/// Default shortest idle poll interval.
pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_millis(50);
/// Default longest idle poll interval (polls back off to this while the queue stays empty).
pub const MAX_POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(2);
/// Default time in-flight jobs get to finish after SIGTERM before they are handed back.
pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(25);
/// Default time one of the worker's statements may go unanswered before its connection is closed and
/// the statement retried on another: below the default heartbeat interval (a third of the default 30 s
/// lease).
pub const ANSWER_DEADLINE_DEFAULT: Duration = Duration::from_secs(5);
/// Default time one of the queue HTTP API's statements may go unanswered before its connection is
/// closed and the request answered 503 (`queue.api.answerDeadline`): long enough for a healthy database
/// under load, short enough that an app's request fails before its own timeout would.
pub const API_ANSWER_DEADLINE_DEFAULT: Duration = Duration::from_secs(5);
/// Default address of the worker's `/metrics` and `/healthz`.
pub const METRICS_LISTEN_DEFAULT: &str = "0.0.0.0:9902";
/// Default largest number of jobs in one batch enqueue request.
pub const MAX_ENQUEUE_BATCH_DEFAULT: u32 = 1000;
/// Default connections in the worker's pool.
pub const POOL_SIZE_DEFAULT: u32 = 8;
/// Default address of the gRPC worker API when it is turned on: loopback, port
/// [`crate::contract::port::WORKER_GRPC`].
pub const GRPC_LISTEN_DEFAULT: &str = "127.0.0.1:9903";
/// Default most gRPC worker streams served at once.
pub const GRPC_MAX_STREAMS_DEFAULT: u32 = 8;
/// Default largest gRPC message, either way (a job whose message would be larger fails for good).
pub const GRPC_MAX_MESSAGE_BYTES_DEFAULT: u32 = 4 << 20;

/// Job queue settings. The database URL normally comes from `SLUICE_DATABASE_URL`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueConfig {
    /// PostgreSQL URL; overridden by `SLUICE_DATABASE_URL`. Prefer the env var: it comes from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database_url: Option<String>,
    /// Connections in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<u32>,
    /// Queues the worker serves (`SLUICE_QUEUES`, comma-separated). A served queue that does not exist is
    /// created with default settings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<String>,
    /// The Kubernetes namespace short queue names are resolved in (`SLUICE_QUEUE_NAMESPACE`): the queue
    /// HTTP API's paths and the gRPC worker API's `subscribe.queues` may then name `emails` for the
    /// queue `<namespace>/emails`. Set by the operator to the JobQueue's namespace; unset, names are
    /// taken as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Settings applied (created or updated) at start for the named queues.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue_settings: Vec<QueueSettingsSpec>,
    /// The worker role.
    #[serde(default)]
    pub worker: WorkerConfig,
    /// The handler the worker hands jobs to.
    #[serde(default)]
    pub handler: HandlerConfig,
    /// The queue HTTP API for the app.
    #[serde(default)]
    pub api: QueueApiConfig,
    /// The gRPC worker API (`sluice.v1.Worker`): workers connect and jobs are pushed to them over a
    /// stream, instead of being POSTed to `handler.url`. Left out when written at its defaults, so
    /// configs rendered for sidecars that predate it stay readable by them.
    #[serde(default, skip_serializing_if = "GrpcConfig::is_default")]
    pub grpc: GrpcConfig,
    /// Periodic jobs this worker's scheduler enqueues (every worker runs it; PostgreSQL makes sure each
    /// fire time makes one job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub schedules: Vec<ScheduleSpec>,
}

/// A periodic job: a cron schedule and the job each fire time enqueues.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Unique per queue: letters, digits, `.`, `_`, `-`; at most 100 characters.
    pub name: String,
    /// The queue the jobs go to (default: the first of `queues`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Five fields (`minute hour day-of-month month day-of-week`) or six with seconds first
    /// (`*/10 * * * * *`).
    pub cron: String,
    /// IANA time zone the cron expression is read in (default UTC), e.g. `Europe/Berlin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// The jobs' kind.
    pub kind: String,
    /// The jobs' payload (default `{}`).
    #[serde(default = "empty_object")]
    pub payload: serde_json::Value,
    /// The jobs' priority (-1000..=1000, default 0).
    #[serde(default)]
    pub priority: i16,
    /// What to do with fire times that passed while no worker ran: `skip` (default), `runOnce` (one
    /// job for the latest), `all` (one per fire time, at most 100).
    #[serde(default)]
    pub missed_runs: MissedRuns,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// What a schedule does with fire times that passed while no scheduler ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum MissedRuns {
    /// Drop them (default).
    #[default]
    Skip,
    /// One job for the latest of them.
    RunOnce,
    /// One job for each, the latest 100 of them.
    All,
}

/// How the worker claims and runs jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerConfig {
    /// Jobs handled at once (`SLUICE_WORKER_CONCURRENCY`).
    #[serde(default = "default_concurrency")]
    pub concurrency: u32,
    /// Most jobs claimed by one query (`SLUICE_WORKER_CLAIM_BATCH`).
    #[serde(default = "default_claim_batch")]
    pub claim_batch: u32,
    /// Shortest wait between polls of an empty queue.
    #[serde(default = "default_poll_interval")]
    pub poll_interval: Duration,
    /// Longest wait between polls of an empty queue (NOTIFY usually wakes the worker sooner).
    #[serde(default = "default_max_poll_interval")]
    pub max_poll_interval: Duration,
    /// LISTEN for `sluice_jobs` notifications. Turn off behind PgBouncer in transaction mode or on replicas;
    /// polling alone still works.
    #[serde(default = "yes")]
    pub listen: bool,
    /// Time in-flight jobs get to finish after SIGTERM; the rest are handed back at once.
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace: Duration,
    /// Heartbeat interval. Absent: a third of the shortest lease of the served queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval: Option<Duration>,
    /// How long one of the worker's statements may go unanswered before its connection is closed and
    /// the statement retried on another (a server gone silent). Keep it below the heartbeat interval.
    #[serde(default = "default_answer_deadline")]
    pub answer_deadline: Duration,
    /// Address of the worker's `/metrics` and `/healthz`.
    #[serde(default = "default_metrics_listen")]
    pub metrics_listen: SocketAddr,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            concurrency: WORKER_CONCURRENCY_DEFAULT,
            claim_batch: CLAIM_BATCH_DEFAULT,
            poll_interval: POLL_INTERVAL_DEFAULT,
            max_poll_interval: MAX_POLL_INTERVAL_DEFAULT,
            listen: true,
            shutdown_grace: SHUTDOWN_GRACE_DEFAULT,
            heartbeat_interval: None,
            answer_deadline: ANSWER_DEADLINE_DEFAULT,
            metrics_listen: default_metrics_listen(),
        }
    }
}

/// The team's handler: each job is POSTed to `url`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HandlerConfig {
    /// `http://127.0.0.1:PORT/PATH` (`SLUICE_HANDLER_URL`).
    #[serde(default = "default_handler_url")]
    pub url: String,
    /// Deadline of one call; a call that takes longer is abandoned and the job retried.
    #[serde(default = "default_job_timeout")]
    pub timeout: Duration,
    /// Response statuses that fail the job permanently (it goes to `dead` at once).
    #[serde(default = "defaults::permanent_statuses")]
    pub permanent_failure_statuses: Vec<u16>,
}

impl Default for HandlerConfig {
    fn default() -> Self {
        Self {
            url: HANDLER_URL_DEFAULT.into(),
            timeout: JOB_TIMEOUT_DEFAULT,
            permanent_failure_statuses: PERMANENT_FAILURE_STATUSES_DEFAULT.to_vec(),
        }
    }
}

/// The queue HTTP API served on localhost for the app.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueApiConfig {
    /// Address to serve on (`SLUICE_API_LISTEN`). Absent: the API is not served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Most jobs in one batch enqueue request.
    #[serde(default = "default_max_batch")]
    pub max_batch: u32,
    /// How long one of the API's statements may go unanswered (`SLUICE_API_ANSWER_DEADLINE`): past it
    /// the connection is closed and the request answered 503 with `Retry-After`; the API's writes are
    /// also ended by the server itself within it. Left out when written at its default, so configs
    /// rendered for sidecars that predate it stay readable by them.
    #[serde(
        default = "default_api_answer_deadline",
        skip_serializing_if = "is_default_api_answer_deadline"
    )]
    pub answer_deadline: Duration,
    /// Who may call the API. Left out when written at its default (off), so configs rendered for
    /// sidecars that predate it stay readable by them.
    #[serde(default, skip_serializing_if = "ApiAuthConfig::is_default")]
    pub auth: ApiAuthConfig,
}

impl Default for QueueApiConfig {
    fn default() -> Self {
        Self {
            listen: None,
            max_batch: MAX_ENQUEUE_BATCH_DEFAULT,
            answer_deadline: API_ANSWER_DEADLINE_DEFAULT,
            auth: ApiAuthConfig::default(),
        }
    }
}

/// The audience a caller's projected ServiceAccount token must be minted for.
pub const API_TOKEN_AUDIENCE: &str = "sluice";

/// How the queue HTTP API authenticates and authorizes callers (docs/queue.md, "Who may call the API").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiAuthConfig {
    /// `off` (default for a sidecar run by hand) or `kubernetes` (`SLUICE_API_AUTH`).
    #[serde(default)]
    pub mode: ApiAuthMode,
    /// What a request without a token from a loopback address on a loopback listener is
    /// (`SLUICE_API_AUTH_LOOPBACK`).
    #[serde(default)]
    pub loopback: LoopbackCallers,
    /// The pod's namespace: where the JobQueues named in paths are (`SLUICE_POD_NAMESPACE`; default: the
    /// namespace file of the pod's ServiceAccount credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The pod's ServiceAccount name (`SLUICE_POD_SERVICE_ACCOUNT`): who tokenless loopback callers are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// The JobQueue of each queue whose name within the namespace (`spec.queueName`) is not its
    /// JobQueue's name: callers are authorized on the JobQueue (`SLUICE_API_JOB_QUEUES=queue=jobqueue,...`).
    /// A queue not listed is its own JobQueue's name.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub job_queues: std::collections::BTreeMap<String, String>,
}

impl ApiAuthConfig {
    /// Whether every field is at its default (auth off).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Whether callers of the queue API are checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ApiAuthMode {
    /// Anyone who reaches the listener may call it (out-of-cluster use, tests).
    #[default]
    Off,
    /// A ServiceAccount token (audience [`API_TOKEN_AUDIENCE`]) checked by TokenReview, and a
    /// SubjectAccessReview per queue and verb.
    Kubernetes,
}

/// Who a request without a token is, in `kubernetes` mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LoopbackCallers {
    /// From a loopback address to a loopback listener: the pod's own ServiceAccount (authorized like
    /// anyone else). Any other tokenless request is refused.
    #[default]
    Pod,
    /// Every request needs a token (pods on the host network, whose loopback is the node's).
    Token,
}

/// The gRPC worker API of the worker role.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrpcConfig {
    /// Address to serve on (`SLUICE_GRPC_LISTEN`, usually [`GRPC_LISTEN_DEFAULT`]). Absent: not served,
    /// and jobs are POSTed to `handler.url`; set: jobs go to the workers connected here only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    /// Most worker streams at once; more are refused (`RESOURCE_EXHAUSTED`).
    #[serde(default = "default_grpc_max_streams")]
    pub max_streams: u32,
    /// Largest message in either direction, bytes.
    #[serde(default = "default_grpc_max_message_bytes")]
    pub max_message_bytes: u32,
}

impl GrpcConfig {
    /// Whether every field is at its default (the API off).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for GrpcConfig {
    fn default() -> Self {
        Self {
            listen: None,
            max_streams: GRPC_MAX_STREAMS_DEFAULT,
            max_message_bytes: GRPC_MAX_MESSAGE_BYTES_DEFAULT,
        }
    }
}

/// Settings of one queue (the `sluice.queues` row). Absent fields take the defaults below.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueSettingsSpec {
    /// Queue name: letters, digits, `.`, `_`, `-`; at most 100 characters.
    pub name: String,
    /// Attempts before a job is dead-lettered (default 25).
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    /// Retry backoff.
    #[serde(default)]
    pub backoff: BackoffSpec,
    /// Lease of a running job; heartbeats extend it, and a job whose lease runs out is retried.
    #[serde(default = "defaults::lease")]
    pub lease_duration: Duration,
    /// How long succeeded and cancelled jobs are kept.
    #[serde(default = "defaults::retention_succeeded")]
    pub retention_succeeded: Duration,
    /// How long dead jobs are kept.
    #[serde(default = "defaults::retention_dead")]
    pub retention_dead: Duration,
    /// How long an idempotency key is remembered.
    #[serde(default = "defaults::idempotency_window")]
    pub idempotency_window: Duration,
}

impl QueueSettingsSpec {
    /// Default settings for queue `name`.
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            max_attempts: defaults::max_attempts(),
            backoff: BackoffSpec::default(),
            lease_duration: defaults::lease(),
            retention_succeeded: defaults::retention_succeeded(),
            retention_dead: defaults::retention_dead(),
            idempotency_window: defaults::idempotency_window(),
        }
    }
}

/// Exponential backoff with jitter: attempt n waits about `min(cap, base × multiplier^(n-1))`, of which
/// a random half is jitter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackoffSpec {
    /// Wait after the first failure (default 1s).
    #[serde(default = "defaults::backoff_base")]
    pub base: Duration,
    /// Longest wait (default 1h).
    #[serde(default = "defaults::backoff_cap")]
    pub cap: Duration,
    /// Growth per attempt (default 2).
    #[serde(default = "defaults::backoff_multiplier")]
    pub multiplier: f64,
}

impl Default for BackoffSpec {
    fn default() -> Self {
        Self {
            base: defaults::backoff_base(),
            cap: defaults::backoff_cap(),
            multiplier: defaults::backoff_multiplier(),
        }
    }
}

/// Whether `name` is a queue name: 1-100 letters, digits, `.`, `_` or `-`, starting with a letter or
/// digit, optionally after a Kubernetes namespace and `/` (`shop/emails`: JobQueues name their queues
/// so). The `sluice.queues` table CHECKs the same, so config and API input fail early and clearly.
pub fn valid_queue_name(name: &str) -> bool {
    match name.split_once('/') {
        Some((namespace, short)) => is_dns_label(namespace) && valid_short_name(short),
        None => valid_short_name(name),
    }
}

/// Whether `name` is a queue name without a namespace (or a schedule name): 1-100 letters, digits, `.`,
/// `_` or `-`, starting with a letter or digit.
pub fn valid_short_name(name: &str) -> bool {
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    name.len() <= 100
        && first.is_ascii_alphanumeric()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The database name of queue `name` for a sidecar in `namespace`: a short name is in the namespace
/// (`emails` in `shop` is `shop/emails`); a name that has a namespace already, or any name when there
/// is no namespace, stays as it is.
pub fn queue_in_namespace(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !name.contains('/') => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

fn yes() -> bool {
    true
}
fn default_concurrency() -> u32 {
    WORKER_CONCURRENCY_DEFAULT
}
fn default_claim_batch() -> u32 {
    CLAIM_BATCH_DEFAULT
}
fn default_poll_interval() -> Duration {
    POLL_INTERVAL_DEFAULT
}
fn default_max_poll_interval() -> Duration {
    MAX_POLL_INTERVAL_DEFAULT
}
fn default_shutdown_grace() -> Duration {
    SHUTDOWN_GRACE_DEFAULT
}
fn default_answer_deadline() -> Duration {
    ANSWER_DEADLINE_DEFAULT
}
fn default_api_answer_deadline() -> Duration {
    API_ANSWER_DEADLINE_DEFAULT
}
fn is_default_api_answer_deadline(d: &Duration) -> bool {
    *d == API_ANSWER_DEADLINE_DEFAULT
}
fn default_metrics_listen() -> SocketAddr {
    METRICS_LISTEN_DEFAULT.parse().expect("valid default")
}
fn default_handler_url() -> String {
    HANDLER_URL_DEFAULT.into()
}
fn default_job_timeout() -> Duration {
    JOB_TIMEOUT_DEFAULT
}
fn default_grpc_max_streams() -> u32 {
    GRPC_MAX_STREAMS_DEFAULT
}
fn default_grpc_max_message_bytes() -> u32 {
    GRPC_MAX_MESSAGE_BYTES_DEFAULT
}
fn default_max_batch() -> u32 {
    MAX_ENQUEUE_BATCH_DEFAULT
}
/// Default attempts before a job is dead (the `sluice.queues` column default too).
pub const MAX_ATTEMPTS_DEFAULT: u32 = 25;
/// Default lease of a running job, renewed by heartbeat.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(30);
/// Default time succeeded (and cancelled) jobs are kept.
pub const RETENTION_SUCCEEDED_DEFAULT: Duration = Duration::from_secs(86_400);
/// Default time dead jobs are kept.
pub const RETENTION_DEAD_DEFAULT: Duration = Duration::from_secs(7 * 86_400);
/// Default time an idempotency key is remembered.
pub const IDEMPOTENCY_WINDOW_DEFAULT: Duration = Duration::from_secs(86_400);
/// Default first retry delay.
pub const BACKOFF_BASE_DEFAULT: Duration = Duration::from_secs(1);
/// Default longest retry delay.
pub const BACKOFF_CAP_DEFAULT: Duration = Duration::from_secs(3600);
/// Default growth of the retry delay per attempt.
pub const BACKOFF_MULTIPLIER_DEFAULT: f64 = 2.0;

/// Serde default functions for the settings above, shared with the `JobQueue` CRD.
pub mod defaults {
    use super::*;

    /// [`MAX_ATTEMPTS_DEFAULT`]
    pub fn max_attempts() -> u32 {
        MAX_ATTEMPTS_DEFAULT
    }
    /// [`LEASE_DEFAULT`]
    pub fn lease() -> Duration {
        LEASE_DEFAULT
    }
    /// [`RETENTION_SUCCEEDED_DEFAULT`]
    pub fn retention_succeeded() -> Duration {
        RETENTION_SUCCEEDED_DEFAULT
    }
    /// [`RETENTION_DEAD_DEFAULT`]
    pub fn retention_dead() -> Duration {
        RETENTION_DEAD_DEFAULT
    }
    /// [`IDEMPOTENCY_WINDOW_DEFAULT`]
    pub fn idempotency_window() -> Duration {
        IDEMPOTENCY_WINDOW_DEFAULT
    }
    /// [`BACKOFF_BASE_DEFAULT`]
    pub fn backoff_base() -> Duration {
        BACKOFF_BASE_DEFAULT
    }
    /// [`BACKOFF_CAP_DEFAULT`]
    pub fn backoff_cap() -> Duration {
        BACKOFF_CAP_DEFAULT
    }
    /// [`BACKOFF_MULTIPLIER_DEFAULT`]
    pub fn backoff_multiplier() -> f64 {
        BACKOFF_MULTIPLIER_DEFAULT
    }
    /// [`super::PERMANENT_FAILURE_STATUSES_DEFAULT`]
    pub fn permanent_statuses() -> Vec<u16> {
        super::PERMANENT_FAILURE_STATUSES_DEFAULT.to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_queue_section_takes_the_documented_defaults() {
        let c: QueueConfig = serde_yaml::from_str("{}").unwrap();
        assert_eq!(c.worker.concurrency, WORKER_CONCURRENCY_DEFAULT);
        assert_eq!(c.handler.permanent_failure_statuses, vec![422]);
        assert!(c.api.listen.is_none());
    }

    #[test]
    fn queue_names_follow_the_table_check() {
        assert!(valid_queue_name("emails"));
        assert!(valid_queue_name("a.b_c-1"));
        assert!(!valid_queue_name(""));
        assert!(!valid_queue_name("-x"));
        assert!(!valid_queue_name("a b"));
        assert!(!valid_queue_name(&"a".repeat(101)));
        assert!(valid_queue_name("shop/emails"));
        assert!(valid_queue_name("a-1/b.c"));
        assert!(!valid_queue_name("Shop/emails"));
        assert!(!valid_queue_name("-shop/emails"));
        assert!(!valid_queue_name("shop-/emails"));
        assert!(!valid_queue_name("/emails"));
        assert!(!valid_queue_name("shop/"));
        assert!(!valid_queue_name("a/b/c"));
        assert!(!valid_queue_name(&format!("{}/x", "a".repeat(64))));
        assert!(valid_queue_name(&format!(
            "{}/{}",
            "a".repeat(63),
            "b".repeat(100)
        )));
        assert!(!valid_short_name("shop/emails"));
        assert_eq!(queue_in_namespace(Some("shop"), "emails"), "shop/emails");
        assert_eq!(queue_in_namespace(Some("shop"), "other/emails"), "other/emails");
        assert_eq!(queue_in_namespace(None, "emails"), "emails");
    }

    #[test]
    fn queue_settings_read_camel_case_durations() {
        let c: QueueConfig = serde_yaml::from_str(
            "queues: [emails]\nqueueSettings:\n- name: emails\n  leaseDuration: 5s\n  backoff: {base: 100ms, cap: 10s, multiplier: 3}\n",
        )
        .unwrap();
        let s = &c.queue_settings[0];
        assert_eq!(s.lease_duration, Duration::from_secs(5));
        assert_eq!(s.backoff.base, Duration::from_millis(100));
        assert_eq!(s.max_attempts, 25);
    }
}
