//! Condition types and reasons of Sluice's custom resources, for both kinds.
//!
//! Conditions are standard `metav1.Condition`s (`type`, `status`, `reason`, `message`,
//! `observedGeneration`, `lastTransitionTime`). The names live here, next to the API types, so that
//! users, the docs and both controllers agree on one spelling.

/// The resource does what it asks for: for a `RateLimitPolicy`, its config is rendered, published and
/// enforced by every selected pod; for a `JobQueue`, its schema, settings and workers are in place.
pub const READY: &str = "Ready";
/// The resource works, but not fully: some pods lag behind, or a dependency is sick.
pub const DEGRADED: &str = "Degraded";
/// `RateLimitPolicy` only: a Service selecting governed pods targets the app's own port (by number, or
/// by a name that is the app container's), so its traffic goes around the sidecar unlimited.
pub const APP_PORT_EXPOSED: &str = "AppPortExposed";
/// `JobQueue` only: the queue has work and workers to run it.
pub const ACTIVE: &str = "Active";
/// `JobQueue` only: the `sluice.dev/paused` annotation is set.
pub const PAUSED: &str = "Paused";

/// Reasons a condition may carry. Each is a short `PascalCase` word, as the API conventions ask.
pub mod reason {
    /// Nothing is wrong.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// The spec passed the CRD's validation but cannot be rendered (e.g. a regular expression the
    /// sidecar's engine rejects, a pod template without containers); the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The Secret named by `spec.redis.secretRef` or `spec.database.secretRef` does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The Secret exists but lacks the key its reference names (or the value is empty).
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    /// The namespace's counter key Secret (`sluice-counter-key`) has no usable key (missing, too short,
    /// padded with whitespace: sidecars refuse to start with it), or the operator may not create it
    /// (injected pods then wait for it).
    pub const COUNTER_KEY_UNUSABLE: &str = "CounterKeyUnusable";
    /// A Kubernetes API call failed (e.g. applying the worker Deployment).
    pub const KUBERNETES_API_ERROR: &str = "KubernetesApiError";
    /// An object the operator would write (ConfigMap, NetworkPolicy, worker Deployment, HPA,
    /// `ScaledObject`) exists already and is not controlled by this resource: the operator changes
    /// nothing until it is renamed or deleted.
    pub const OBJECT_NOT_OWNED: &str = "ObjectNotOwned";

    /// `RateLimitPolicy` (an Event): the policy's config key in Redis held something other than what the
    /// operator published (someone else wrote it); the operator's config was published again.
    pub const REMOTE_CONFIG_REPLACED: &str = "RemoteConfigReplaced";

    /// The object's Secret names a Redis server or database beyond the operator's bound on distinct
    /// endpoints per namespace (or in all): it is not connected until others go unused.
    pub const TOO_MANY_ENDPOINTS: &str = "TooManyEndpoints";

    /// `RateLimitPolicy` `AppPortExposed`: a Service targets the app's port of governed pods.
    pub const SERVICE_TARGETS_APP_PORT: &str = "ServiceTargetsAppPort";

    /// `RateLimitPolicy`: every selected pod enforces the current generation.
    pub const ENFORCED: &str = "Enforced";
    /// `RateLimitPolicy`: the config is published and some selected pods do not enforce it yet.
    pub const PROPAGATING: &str = "Propagating";
    /// `RateLimitPolicy`: the config is published and no pod is selected yet.
    pub const NO_PODS: &str = "NoPods";
    /// `RateLimitPolicy`: Redis could not be reached to publish the config.
    pub const REDIS_UNREACHABLE: &str = "RedisUnreachable";
    /// `RateLimitPolicy`: some selected pods report an older generation, or nothing at all, well after
    /// publication.
    pub const PODS_LAGGING: &str = "PodsLagging";

    /// `JobQueue`: the database could not be reached, or preparing the schema failed.
    pub const DATABASE_UNREACHABLE: &str = "DatabaseUnreachable";
    /// `JobQueue` `Ready=False`: `spec.database.rowLevelSecurity` is `Enabled` and the namespace's
    /// tenant role could not be created or its Secret written (the database login lacks `CREATEROLE`,
    /// a role of that name exists and is no tenant...). The message names what is missing and the fix;
    /// workers are not given the owner's credentials instead.
    pub const TENANT_NOT_PROVISIONED: &str = "TenantNotProvisioned";
    /// `QueueDatabase` `Ready=False`, and a Warning Event: revoking a namespace it no longer admits
    /// failed in part (its LOGIN, its sessions or its tenant Secrets); the message names the namespaces
    /// and what failed. The operator retries.
    pub const REVOCATION_FAILED: &str = "RevocationFailed";
    /// `QueueDatabase` Normal Event: namespaces it no longer admits were revoked (named in the note).
    pub const TENANTS_REVOKED: &str = "TenantsRevoked";
    /// `JobQueue` `Ready=False`: `spec.database.queueDatabaseRef` names a QueueDatabase that does not
    /// exist; the JobQueue is reconciled again once it is created.
    pub const QUEUE_DATABASE_NOT_FOUND: &str = "QueueDatabaseNotFound";
    /// `JobQueue` `Ready=False`: the QueueDatabase exists but the operator has not taken it over yet
    /// (added its finalizer); nothing is provisioned through it until then.
    pub const QUEUE_DATABASE_PENDING: &str = "QueueDatabasePending";
    /// `JobQueue` `Ready=False`: the QueueDatabase is being deleted (its namespaces lose their tenant
    /// logins); nothing is provisioned through it.
    pub const QUEUE_DATABASE_DELETED: &str = "QueueDatabaseDeleted";
    /// `JobQueue` `Ready=False`: the QueueDatabase's `namespaceSelector` does not admit the JobQueue's
    /// namespace (an absent selector admits none); nothing is provisioned for it.
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// `JobQueue`: another provider serves `external.metrics.k8s.io`; the operator scales 1..N itself.
    pub const EXTERNAL_METRICS_OWNED_ELSEWHERE: &str = "ExternalMetricsOwnedElsewhere";
    /// `JobQueue`: nobody serves `external.metrics.k8s.io` for Sluice; the operator scales 1..N itself.
    pub const EXTERNAL_METRICS_UNAVAILABLE: &str = "ExternalMetricsUnavailable";
    /// `JobQueue`: KEDA's `ScaledObject` could not be applied (KEDA not installed?).
    pub const KEDA_UNAVAILABLE: &str = "KedaUnavailable";
    /// `JobQueue` `Degraded`: a schedule's cron expression or time zone cannot be read (stored where the
    /// admission webhook is off); that schedule does not fire, the others do. The message names it.
    pub const INVALID_SCHEDULE: &str = "InvalidSchedule";
    /// `JobQueue` `Degraded`: a queue named without a namespace (by an earlier version) holds this
    /// JobQueue's name and could not be adopted into `<namespace>/<queueName>`; the message says why and
    /// names the SQL step that moves it.
    pub const LEGACY_QUEUE_NOT_ADOPTED: &str = "LegacyQueueNotAdopted";
    /// `JobQueue` (Event): a queue named without a namespace was adopted into `<namespace>/<queueName>`.
    pub const LEGACY_QUEUE_ADOPTED: &str = "LegacyQueueAdopted";
    /// `JobQueue` `Active`: ready or running jobs, and workers.
    pub const WORKING: &str = "Working";
    /// `JobQueue` `Active`: no ready or running jobs.
    pub const IDLE: &str = "Idle";
    /// `JobQueue` `Active`: jobs wait and no worker runs yet.
    pub const WAKING: &str = "Waking";
    /// `JobQueue` `Paused`: paused by the annotation.
    pub const PAUSED_BY_ANNOTATION: &str = "PausedByAnnotation";
    /// `JobQueue` `Paused`: not paused.
    pub const NOT_PAUSED: &str = "NotPaused";
}
