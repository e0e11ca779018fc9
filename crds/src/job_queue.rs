//! `JobQueue` (`sluice.dev/v1alpha1`, namespaced): a PostgreSQL-backed job queue in the team's own
//! database, the worker Deployment that drains it (the team's handler container plus the Sluice sidecar
//! in worker role) and how that Deployment scales on queue depth.
//!
//! Scaling fields are named like KEDA's `ScaledObject` wherever the meaning is the same
//! (`minReplicaCount`, `maxReplicaCount`, `pollingInterval`, `cooldownPeriod`,
//! `advanced.horizontalPodAutoscalerConfig.behavior`), because users already know them. The CRD validates
//! itself with OpenAPI bounds and CEL rules that span fields; what CEL cannot see (the pod template is
//! kept schemaless to keep the CRD small) the controller reports as `Ready=False`, reason `InvalidSpec`.

use k8s_openapi::{
    api::{autoscaling::v2::HorizontalPodAutoscalerBehavior, core::v1::PodTemplateSpec},
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::queue_database::QueueDatabaseRef;
pub use crate::secret_ref::SecretKeyRef;
use crate::{contract::annotation, duration::Duration, sidecar_config};

/// Longest `JobQueue` name: the worker Deployment is called `<name>-worker` and its pods carry the name
/// in a label, whose values are at most 63 characters.
pub const NAME_MAX_LEN: usize = 52;
/// Default handler port.
pub const HANDLER_PORT_DEFAULT: u16 = 3000;
/// Default handler path.
pub const HANDLER_PATH_DEFAULT: &str = "/jobs";
/// Default `maxReplicaCount` (KEDA's default too).
pub const MAX_REPLICA_COUNT_DEFAULT: i32 = 100;
/// Default `pollingInterval`: how often the operator re-reads depth when no NOTIFY arrives.
pub const POLLING_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);
/// Default `cooldownPeriod`: how long a queue must stay idle before the workers go to zero.
pub const COOLDOWN_PERIOD_DEFAULT: Duration = Duration::from_secs(300);

/// A job queue in the team's PostgreSQL database and the workers that drain it.
///
/// The operator prepares the `sluice` schema in the database, registers the queue's settings, runs a
/// worker Deployment (the `template`'s handler container plus the `sluice-sidecar` worker, which claims
/// jobs and POSTs each to the handler on localhost) and scales it on depth (ready + running jobs): itself
/// between 0 and 1, woken by LISTEN/NOTIFY, and through an HPA between 1 and `maxReplicaCount`.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "JobQueue",
    plural = "jobqueues",
    singular = "jobqueue",
    shortname = "jq",
    category = "sluice",
    namespaced,
    status = "JobQueueStatus",
    derive = "PartialEq",
    doc = "A PostgreSQL-backed job queue in the team's database, the worker Deployment that drains it and how it scales on depth.",
    validation = Rule::new("self.metadata.name.size() <= 52").message("JobQueue names are at most 52 characters: the worker Deployment is named <name>-worker and its pods carry the name in a label"),
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the schema, the settings and the workers are in place"}"#,
    printcolumn = r#"{"name":"Depth","type":"integer","jsonPath":".status.depth.ready","description":"Jobs ready to run now"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.depth.running","priority":1,"description":"Jobs running now"}"#,
    printcolumn = r#"{"name":"Blocked","type":"integer","jsonPath":".status.depth.blocked","priority":1,"description":"Jobs waiting for the jobs they depend on"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.currentReplicas","description":"Worker replicas now"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct JobQueueSpec {
    /// Name of the queue within the namespace. Default: the JobQueue's name. In the database
    /// (`sluice.queues.name`) it is `<namespace>/<queueName>`, so JobQueues of one name in two namespaces
    /// are two queues. Apps enqueue with `SELECT sluice.enqueue('<namespace>/<queueName>', ...)`, or
    /// through the sidecar's queue API, whose paths name the queue without its namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 100), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    pub queue_name: Option<String>,

    /// The PostgreSQL database holding the queue.
    pub database: DatabaseSpec,

    /// The worker pods: the team's handler container and how jobs reach it.
    pub worker: WorkerSpec,

    /// Retries of failed jobs.
    #[serde(default)]
    pub retry: RetrySpec,

    /// How long finished jobs and idempotency keys are kept.
    #[serde(default)]
    pub retention: RetentionSpec,

    /// How the worker Deployment scales on queue depth (ready + running jobs).
    #[serde(default)]
    pub scaling: ScalingSpec,

    /// Periodic jobs: each fire time of a cron schedule enqueues one job into this queue. The workers
    /// run the schedules and PostgreSQL makes sure each fire time makes one job, however many workers
    /// there are. At most 100, names unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub schedules: Vec<JobQueueSchedule>,
}

/// A periodic job of a JobQueue.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobQueueSchedule {
    /// Unique among the queue's schedules: letters, digits, `.`, `_`, `-`.
    #[schemars(length(min = 1, max = 100), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"))]
    pub name: String,
    /// Five fields (`minute hour day-of-month month day-of-week`, e.g. `30 2 * * *`) or six with
    /// seconds first (`*/10 * * * * *`). The operator checks each field; a schedule it cannot read is
    /// not run, and `status.schedules[]` says why.
    #[schemars(length(min = 9, max = 200))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^ *[^ ]+( +[^ ]+){4,5} *$')",
         "message": "schedules[].cron must have five fields (minute hour day-of-month month day-of-week), or six with seconds first"}
    ]))]
    pub cron: String,
    /// IANA time zone the cron expression is read in (default UTC), e.g. `Europe/Berlin`. Daylight
    /// saving time: a fixed time in the hour skipped in spring runs once, right after it; a fixed time
    /// in the hour repeated in autumn runs once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$")
    )]
    pub time_zone: Option<String>,
    /// The jobs' kind.
    #[schemars(length(min = 1, max = 200))]
    pub kind: String,
    /// The jobs' payload, a JSON object (default `{}`).
    #[serde(default = "empty_object")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub payload: serde_json::Value,
    /// The jobs' priority (higher runs first).
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i16,
    /// Fire times that passed while no worker ran: `skip` them (default), `runOnce` (one job for the
    /// latest), or `all` (one job each, at most 100).
    #[serde(default)]
    #[schemars(schema_with = "missed_runs_schema")]
    pub missed_runs: sidecar_config::MissedRuns,
}

fn missed_runs_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["skip", "runOnce", "all"],
        "default": "skip",
    })
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}

/// The database holding the queue: a Secret of the JobQueue's own (`secretRef`) or a database an admin
/// registered (`queueDatabaseRef`), exactly one of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.secretRef) != has(self.queueDatabaseRef)",
     "message": "spec.database must name exactly one of secretRef (a Secret in this namespace) or queueDatabaseRef (a QueueDatabase an admin registered)"},
    {"rule": "!has(self.queueDatabaseRef) || !has(self.rowLevelSecurity) || self.rowLevelSecurity == 'Enabled'",
     "message": "spec.database.rowLevelSecurity must be Enabled with queueDatabaseRef: the QueueDatabase's owner login is never given to a namespace's workers",
     "fieldPath": ".rowLevelSecurity"}
]))]
pub struct DatabaseSpec {
    /// The Secret, in the JobQueue's namespace, holding the PostgreSQL URL
    /// (`postgres://user:password@host:5432/db`). The URL never leaves the Secret: worker pods read it
    /// through `secretKeyRef`, and the operator reads it only to prepare the schema and read depth.
    /// Exactly one of `secretRef` and `queueDatabaseRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,

    /// A `QueueDatabase` an admin registered: the owner's URL stays in the operator's namespace, and
    /// this namespace gets only its tenant's URL (so `rowLevelSecurity` must be `Enabled`). The
    /// QueueDatabase's `namespaceSelector` must admit this namespace. Exactly one of `secretRef` and
    /// `queueDatabaseRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_database_ref: Option<QueueDatabaseRef>,

    /// Whether the namespace's workers log in as a role that row-level security limits to the rows
    /// of this namespace's queues. `Enabled` (the default): when it prepares the database, the
    /// operator creates (or reuses) the namespace's tenant role with `sluice.ensure_tenant` and writes
    /// its URL to a Secret in this namespace (`sluice-tenant-<hash>`, key `url`); worker pods and
    /// injected sidecars read that Secret, never the owner's, whose login must own the `sluice`
    /// schema and have `CREATEROLE`. When it cannot, the JobQueue is `Ready=False`, reason
    /// `TenantNotProvisioned`, and no worker gets the owner's credentials. `Disabled` (with `secretRef`
    /// only): workers and sidecars use the Secret above as it is, and namespaces sharing the database
    /// are not isolated from each other.
    #[serde(default)]
    pub row_level_security: RowLevelSecurity,
}

/// Where a JobQueue's database URL comes from ([`DatabaseSpec::source`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DatabaseSource<'a> {
    /// `spec.database.secretRef`: a Secret in the JobQueue's namespace.
    SecretRef(&'a SecretKeyRef),
    /// `spec.database.queueDatabaseRef`: the name of a `QueueDatabase`.
    QueueDatabase(&'a str),
}

impl DatabaseSpec {
    /// The one source the spec names; `None` when it names both or neither (the CRD's CEL rule refuses
    /// that, so only an object stored without it gets here).
    pub fn source(&self) -> Option<DatabaseSource<'_>> {
        match (&self.secret_ref, &self.queue_database_ref) {
            (Some(r), None) => Some(DatabaseSource::SecretRef(r)),
            (None, Some(q)) => Some(DatabaseSource::QueueDatabase(&q.name)),
            _ => None,
        }
    }
}

/// Whether a JobQueue's workers are limited to their namespace's rows (`spec.database.rowLevelSecurity`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RowLevelSecurity {
    /// Workers log in as the namespace's tenant role, which the operator provisions.
    #[default]
    Enabled,
    /// Workers use `spec.database.secretRef` as it is; no isolation between namespaces is enforced.
    Disabled,
}

/// The worker pods.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSpec {
    /// The pod template of the workers: the team's handler container (and anything else the pod needs).
    /// The operator adds the `sluice-sidecar` container in worker role, its config volume and labels.
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,

    /// The handler each job is POSTed to, on localhost in the same pod.
    #[serde(default)]
    pub handler: HandlerSpec,

    /// Jobs one worker pod runs at once.
    #[serde(default = "default_concurrency")]
    #[schemars(range(min = 1, max = 10000))]
    pub concurrency: u32,

    /// Deadline of one handler call; a job that takes longer is abandoned and retried. Pods get a
    /// `terminationGracePeriodSeconds` longer than this, so scale-in never kills a job mid-run.
    /// Between 1s and 24h.
    #[serde(default = "default_job_timeout")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "duration(self) >= duration('1s') && duration(self) <= duration('24h')",
         "message": "worker.jobTimeout must be between 1s and 24h"}
    ]))]
    pub job_timeout: Duration,

    /// Lease of a running job: the worker renews it by heartbeat, and a job whose lease runs out (its
    /// pod died) is retried. Between 1s and 1h.
    #[serde(default = "sidecar_config::defaults::lease")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "duration(self) >= duration('1s') && duration(self) <= duration('1h')",
         "message": "worker.leaseDuration must be between 1s and 1h"}
    ]))]
    pub lease_duration: Duration,
}

/// Where the handler listens in the worker pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HandlerSpec {
    /// How jobs reach the handler: `http` (POSTed to `port` and `path`) or `grpc` (the handler connects
    /// to the sidecar's `sluice.v1.Worker` service at 127.0.0.1:9903 and takes jobs over a stream;
    /// `port` and `path` are then unused). Default `http`.
    #[serde(default, skip_serializing_if = "HandlerProtocol::is_http")]
    pub protocol: HandlerProtocol,
    /// The container that handles jobs. Default: the template's first container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub container: Option<String>,
    /// Port the handler listens on (localhost).
    #[serde(default = "default_handler_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Path jobs are POSTed to.
    #[serde(default = "default_handler_path")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path: String,
    /// Handler response statuses that fail a job permanently (it goes to `dead` at once, no retry).
    #[serde(default = "sidecar_config::defaults::permanent_statuses")]
    #[schemars(length(max = 32), inner(range(min = 400, max = 599)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub permanent_failure_statuses: Vec<u16>,
}

/// How jobs reach a JobQueue's handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum HandlerProtocol {
    /// The sidecar POSTs each job to the handler.
    #[default]
    Http,
    /// The handler takes jobs from the sidecar's gRPC worker API (docs/queue.md, "gRPC worker API").
    Grpc,
}

impl HandlerProtocol {
    /// Whether this is the default, `http`.
    pub fn is_http(&self) -> bool {
        *self == Self::Http
    }
}

impl Default for HandlerSpec {
    fn default() -> Self {
        Self {
            protocol: HandlerProtocol::Http,
            container: None,
            port: HANDLER_PORT_DEFAULT,
            path: HANDLER_PATH_DEFAULT.into(),
            permanent_failure_statuses: sidecar_config::defaults::permanent_statuses(),
        }
    }
}

/// Retries of failed jobs: attempt n waits about `min(cap, base × multiplier^(n-1))`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetrySpec {
    /// Attempts before a job is dead-lettered.
    #[serde(default = "sidecar_config::defaults::max_attempts")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_attempts: u32,
    /// Exponential backoff between attempts.
    #[serde(default)]
    pub backoff: BackoffSpec,
}

impl Default for RetrySpec {
    fn default() -> Self {
        Self {
            max_attempts: sidecar_config::defaults::max_attempts(),
            backoff: BackoffSpec::default(),
        }
    }
}

/// Exponential backoff with jitter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "duration(self.cap) >= duration(self.base)",
     "message": "retry.backoff.cap must be at least retry.backoff.base"}
]))]
pub struct BackoffSpec {
    /// Wait after the first failure (at least 1ms).
    #[serde(default = "sidecar_config::defaults::backoff_base")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "duration(self) >= duration('1ms')", "message": "retry.backoff.base must be at least 1ms"}
    ]))]
    pub base: Duration,
    /// Longest wait.
    #[serde(default = "sidecar_config::defaults::backoff_cap")]
    #[schemars(schema_with = "go_duration_schema")]
    pub cap: Duration,
    /// Growth per attempt, at least 1 (1 waits `base` every time).
    #[serde(default = "sidecar_config::defaults::backoff_multiplier")]
    #[schemars(range(min = 1.0, max = 100.0))]
    pub multiplier: f64,
    /// How waits are spread: `equal` keeps half of each step fixed and draws the other half at random,
    /// so retries never bunch at 0 ms and workers that failed together spread out.
    #[serde(default)]
    pub jitter: Jitter,
}

impl Default for BackoffSpec {
    fn default() -> Self {
        Self {
            base: sidecar_config::defaults::backoff_base(),
            cap: sidecar_config::defaults::backoff_cap(),
            multiplier: sidecar_config::defaults::backoff_multiplier(),
            jitter: Jitter::Equal,
        }
    }
}

/// How retry waits are spread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Jitter {
    /// Half of each step fixed, half random ("equal jitter").
    #[default]
    Equal,
}

/// How long finished jobs and idempotency keys are kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// How long succeeded and cancelled jobs are kept.
    #[serde(default = "sidecar_config::defaults::retention_succeeded")]
    #[schemars(schema_with = "duration_schema")]
    pub succeeded: Duration,
    /// How long dead (dead-lettered) jobs are kept.
    #[serde(default = "sidecar_config::defaults::retention_dead")]
    #[schemars(schema_with = "duration_schema")]
    pub dead: Duration,
    /// How long an idempotency key is remembered.
    #[serde(default = "sidecar_config::defaults::idempotency_window")]
    #[schemars(schema_with = "duration_schema")]
    pub idempotency_window: Duration,
}

impl Default for RetentionSpec {
    fn default() -> Self {
        Self {
            succeeded: sidecar_config::defaults::retention_succeeded(),
            dead: sidecar_config::defaults::retention_dead(),
            idempotency_window: sidecar_config::defaults::idempotency_window(),
        }
    }
}

/// How the worker Deployment scales. Depth means ready + running jobs, so scale-in never starves
/// in-flight work.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.minReplicaCount <= self.maxReplicaCount",
     "message": "scaling.minReplicaCount must not exceed scaling.maxReplicaCount"},
    {"rule": "!has(self.targetJobsPerReplica) || self.targetJobsPerReplica > 0",
     "message": "scaling.targetJobsPerReplica must be greater than 0: it is the number of jobs one replica should have",
     "fieldPath": ".targetJobsPerReplica"},
    {"rule": "self.maxReplicaCount > 0",
     "message": "scaling.maxReplicaCount must be at least 1 (minReplicaCount 0 lets an idle queue scale to zero)",
     "fieldPath": ".maxReplicaCount"}
]))]
pub struct ScalingSpec {
    /// Fewest workers. 0 lets the queue scale to zero when idle for `cooldownPeriod`.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10000))]
    pub min_replica_count: i32,
    /// Most workers.
    #[serde(default = "default_max_replica_count")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_replica_count: i32,
    /// Jobs (ready + running) one replica should have: the HPA's `AverageValue` target, so the
    /// Deployment runs `ceil(depth / targetJobsPerReplica)` replicas. Default: `worker.concurrency`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000000))]
    pub target_jobs_per_replica: Option<u32>,
    /// Depth above which an idle queue at zero replicas gets its first worker (like KEDA's activation
    /// values: strictly greater). 0: any job wakes it.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000000))]
    pub activation_threshold: u32,
    /// How often the operator re-reads depth for the 0↔1 decision when no NOTIFY arrives (an enqueue
    /// wakes it at once). Between 1s and 1h.
    #[serde(default = "default_polling_interval")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "duration(self) >= duration('1s') && duration(self) <= duration('1h')",
         "message": "scaling.pollingInterval must be between 1s and 1h"}
    ]))]
    pub polling_interval: Duration,
    /// How long the queue must have no ready or running job before the workers go from 1 to 0. At most 24h.
    #[serde(default = "default_cooldown_period")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "duration(self) <= duration('24h')", "message": "scaling.cooldownPeriod must be at most 24h"}
    ]))]
    pub cooldown_period: Duration,
    /// Who scales between 1 and `maxReplicaCount`: `builtin` (an HPA on the operator's
    /// `external.metrics.k8s.io` metric) or `keda` (a KEDA `ScaledObject`, for clusters where KEDA owns
    /// that API).
    #[serde(default)]
    pub provider: ScalingProvider,
    /// Passed through to the HPA, like KEDA's `advanced` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advanced: Option<AdvancedSpec>,
}

impl Default for ScalingSpec {
    fn default() -> Self {
        Self {
            min_replica_count: 0,
            max_replica_count: MAX_REPLICA_COUNT_DEFAULT,
            target_jobs_per_replica: None,
            activation_threshold: 0,
            polling_interval: POLLING_INTERVAL_DEFAULT,
            cooldown_period: COOLDOWN_PERIOD_DEFAULT,
            provider: ScalingProvider::Builtin,
            advanced: None,
        }
    }
}

/// Who scales the workers between 1 and N.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ScalingProvider {
    /// An `autoscaling/v2` HPA on the operator's external metric.
    #[default]
    Builtin,
    /// A KEDA `ScaledObject` with a `postgresql` trigger.
    Keda,
}

/// Settings passed through to the autoscaler.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdvancedSpec {
    /// The HPA's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizontal_pod_autoscaler_config: Option<HpaConfigSpec>,
}

/// The HPA's settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HpaConfigSpec {
    /// `spec.behavior` of the HPA (scale-up and scale-down policies and stabilization windows), as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,
}

/// What the operator last observed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobQueueStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready` (schema, settings and workers in place), `Active` (the queue has work and workers),
    /// `Paused` (the `sluice.dev/paused` annotation), `Degraded` (the database or the metrics API is
    /// unavailable; replicas are kept as they are).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Jobs by state, at the last read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<DepthStatus>,

    /// Age in seconds of the oldest job ready to run (0 when none is ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_ready_job_age_seconds: Option<i64>,

    /// Worker replicas now (the Deployment's `spec.replicas`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_replicas: Option<i32>,

    /// Worker replicas the queue's depth asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,

    /// When the operator last changed the replicas itself (0↔1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,

    /// Why it did (`Activated`, `CooledDown`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_reason: Option<String>,

    /// Who scales between 1 and N: `builtin` (HPA `<name>-worker` on the operator's metric), `keda`, or
    /// `none` when the external metrics API belongs to another provider and `provider: builtin` was asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scaler: Option<String>,

    /// Each schedule's last and next fire time, as the database records them, or why it does not run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub schedules: Vec<ScheduleStatus>,

    /// With `rowLevelSecurity: Enabled`, which Secret workers and injected sidecars read:
    /// `Provisioned` (the tenant Secret the operator writes, `sluice-tenant-<hash>`) or `SecretRef`
    /// (`spec.database.secretRef` itself, whose login is already this namespace's registered tenant,
    /// e.g. one an admin made with `sluice.ensure_tenant`). Unset until the operator has looked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_login: Option<TenantLogin>,

    /// With `rowLevelSecurity: Enabled`, the database role workers and injected sidecars log in as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_role: Option<String>,
}

/// Where a JobQueue's workers get their tenant login (`status.tenantLogin`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TenantLogin {
    /// The operator provisioned the namespace's tenant role and wrote its URL to `sluice-tenant-<hash>`.
    Provisioned,
    /// `spec.database.secretRef` logs in as the namespace's registered tenant: used as it is.
    SecretRef,
}

/// One schedule's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleStatus {
    /// The schedule.
    pub name: String,
    /// The latest fire time a job was enqueued for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_fire_time: Option<Time>,
    /// The next fire time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_fire_time: Option<Time>,
    /// Why the schedule does not run (its cron expression or time zone cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Jobs by state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DepthStatus {
    /// Waiting and due now.
    pub ready: i64,
    /// Waiting for the jobs they depend on (not counted as demand).
    #[serde(default)]
    pub blocked: i64,
    /// Waiting and due later.
    pub scheduled: i64,
    /// Leased by a worker.
    pub running: i64,
    /// Waiting out a retry backoff.
    pub retrying: i64,
    /// Dead-lettered.
    pub dead: i64,
}

impl JobQueue {
    /// The queue's name within its namespace: `spec.queueName`, else the object's name. The HTTP API's
    /// paths name it so.
    pub fn queue_name(&self) -> String {
        self.spec
            .queue_name
            .clone()
            .unwrap_or_else(|| self.metadata.name.clone().unwrap_or_default())
    }

    /// The queue's name in the database: `<namespace>/<queue_name>`, so that JobQueues of one name in two
    /// namespaces sharing a database are two queues (`shop/emails`, `blog/emails`).
    pub fn database_queue_name(&self) -> String {
        format!("{}/{}", self.namespace_or_default(), self.queue_name())
    }

    /// The object's namespace (`default` when unset, as the API server would fill it in).
    pub fn namespace_or_default(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or("default")
    }

    /// Whether the `sluice.dev/paused` annotation is `"true"`.
    pub fn is_paused(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotation::PAUSED))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    }

    /// The condition of `type_`, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
    }
}

impl ScalingSpec {
    /// The HPA target: `targetJobsPerReplica`, else the worker's concurrency.
    pub fn target(&self, concurrency: u32) -> u32 {
        self.target_jobs_per_replica.unwrap_or(concurrency).max(1)
    }
}

impl JobQueueSpec {
    /// The fewest workers the queue runs: `minReplicaCount`, but at least one while it has schedules,
    /// since the workers fire them and no job exists before its fire time to wake a queue at zero.
    pub fn min_replicas(&self) -> i32 {
        if self.schedules.is_empty() {
            self.scaling.min_replica_count
        } else {
            self.scaling.min_replica_count.max(1)
        }
    }

    /// The queue settings row the operator registers for queue `name`.
    pub fn queue_settings(&self, name: &str) -> sidecar_config::QueueSettingsSpec {
        sidecar_config::QueueSettingsSpec {
            name: name.to_owned(),
            max_attempts: self.retry.max_attempts,
            backoff: sidecar_config::BackoffSpec {
                base: self.retry.backoff.base,
                cap: self.retry.backoff.cap,
                multiplier: self.retry.backoff.multiplier,
            },
            lease_duration: self.worker.lease_duration,
            retention_succeeded: self.retention.succeeded,
            retention_dead: self.retention.dead,
            idempotency_window: self.retention.idempotency_window,
        }
    }
}

/// Schema of the pod template: an object whose contents the API server keeps as written. Keeping the
/// full `PodTemplateSpec` schema would make the CRD ~10k lines; Kubernetes validates the rendered
/// Deployment anyway.
fn pod_template_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "description": "A pod template (metadata and spec) as in a Deployment; spec.containers holds the handler.",
    })
}

fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema of a duration that CEL's `duration()` can read as well: Go's units only (no `d`).
fn go_duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": "^([0-9]+(ms|s|m|h))+$",
    })
}

/// Schema of a long duration (retention): days allowed, no CEL rule reads it.
fn duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": "^([0-9]+(ms|s|m|h|d))+$",
    })
}

fn default_concurrency() -> u32 {
    sidecar_config::WORKER_CONCURRENCY_DEFAULT
}
fn default_job_timeout() -> Duration {
    sidecar_config::JOB_TIMEOUT_DEFAULT
}
fn default_handler_port() -> u16 {
    HANDLER_PORT_DEFAULT
}
fn default_handler_path() -> String {
    HANDLER_PATH_DEFAULT.into()
}
fn default_max_replica_count() -> i32 {
    MAX_REPLICA_COUNT_DEFAULT
}
fn default_polling_interval() -> Duration {
    POLLING_INTERVAL_DEFAULT
}
fn default_cooldown_period() -> Duration {
    COOLDOWN_PERIOD_DEFAULT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_job_queue_takes_the_documented_defaults() {
        let jq: JobQueueSpec = serde_yaml::from_str(
            "database: {secretRef: {name: pg}}\nworker:\n  template:\n    spec:\n      containers: [{name: app, image: app:1}]\n",
        )
        .unwrap();
        assert_eq!(jq.database.secret_ref.as_ref().unwrap().key, "url");
        assert!(matches!(jq.database.source(), Some(DatabaseSource::SecretRef(r)) if r.name == "pg"));
        assert_eq!(jq.worker.concurrency, 16);
        assert_eq!(jq.worker.handler.port, 3000);
        assert_eq!(jq.scaling.min_replica_count, 0);
        assert_eq!(jq.scaling.max_replica_count, 100);
        assert_eq!(jq.scaling.target(jq.worker.concurrency), 16);
        assert_eq!(jq.scaling.provider, ScalingProvider::Builtin);
        let s = jq.queue_settings("emails");
        assert_eq!(s.max_attempts, 25);
        assert_eq!(s.lease_duration, Duration::from_secs(30));
        assert_eq!(jq.min_replicas(), 0, "scales to zero without schedules");
    }

    #[test]
    fn a_job_queue_with_schedules_keeps_a_worker_to_fire_them() {
        let jq: JobQueueSpec = serde_yaml::from_str(
            "database: {secretRef: {name: pg}}\nworker:\n  template:\n    spec:\n      containers: [{name: app, image: app:1}]\nschedules: [{name: nightly, cron: '0 3 * * *', kind: report}]\n",
        )
        .unwrap();
        assert_eq!(jq.scaling.min_replica_count, 0);
        assert_eq!(jq.min_replicas(), 1);
    }
}
