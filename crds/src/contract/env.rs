//! The environment variables the sidecar reads. The operator sets them in the containers it renders
//! (connection settings and credentials by `secretKeyRef`, so they never land in a ConfigMap); people
//! running the sidecar by hand set them too. Each overrides the config file's field named beside it.

/// The config file (`--config`).
pub const CONFIG: &str = "SLUICE_CONFIG";
/// How often the config file is re-read for hot reload (`--config-poll`, default `1s`).
pub const CONFIG_POLL: &str = "SLUICE_CONFIG_POLL";
/// `json` switches the sidecar's logs to JSON lines.
pub const LOG_FORMAT: &str = "SLUICE_LOG_FORMAT";
/// This pod's name (the downward API's `metadata.name`): the key of its `enforced` report and the
/// start of its workers' lease owner.
pub const POD_NAME: &str = "SLUICE_POD_NAME";

/// `limits.listen`: where the proxy listens.
pub const LISTEN: &str = "SLUICE_LISTEN";
/// `limits.upstream`: the app's base URL.
pub const UPSTREAM: &str = "SLUICE_UPSTREAM";
/// `limits.redis.url`.
pub const REDIS_URL: &str = "SLUICE_REDIS_URL";
/// The secret the sidecar keys the hashes naming its counters in Redis with (HMAC-SHA-256), so that
/// nobody who can read Redis's key names (a backup, a replica, `MONITOR`) can test guesses of a key
/// value (an `Authorization` header, a client IP) against them offline. At least
/// [`super::redis::COUNTER_KEY_MIN_LEN`] characters; every sidecar counting on the same counters must
/// have the same one. The webhook sets it from the namespace's [`super::redis::COUNTER_KEY_SECRET`].
/// Unset: unkeyed SHA-256, as sidecars before it hashed (a warning at start).
pub const COUNTER_KEY: &str = "SLUICE_COUNTER_KEY";
/// `limits.redis.caFile`: CA certificates (PEM) trusted for a TLS Redis besides the system's.
pub const REDIS_CA_FILE: &str = "SLUICE_REDIS_CA_FILE";
/// `limits.adminListen`: `/healthz`, `/readyz` and `/metrics`.
pub const ADMIN_LISTEN: &str = "SLUICE_ADMIN_LISTEN";
/// The memory limit (bytes) the proxy sizes its default `limits.maxConnections` and its budget for long
/// request heads by, instead of its cgroup's (for a process outside a container, and tests).
pub const MEMORY_LIMIT: &str = "SLUICE_MEMORY_LIMIT";

/// The operator's Ed25519 public key (64 hex digits), set by the webhook in injected sidecars: a config
/// read from the Redis config channel is applied only if the operator signed it
/// ([`super::redis::SIGNATURE_PREFIX`]). Unset: signed and unsigned configs are accepted alike.
pub const CONFIG_VERIFY_KEY: &str = "SLUICE_CONFIG_VERIFY_KEY";

/// `false` turns rate limiting off (the proxy still forwards, reports and logs).
pub const RATE_LIMIT_ENABLED: &str = "RATE_LIMIT__ENABLED";
/// Per-minute limit of the seed `auth` tier.
pub const RATE_LIMIT_AUTH: &str = "RATE_LIMIT__AUTH_REQUESTS_PER_MINUTE";
/// Per-minute limit of the seed `write` tier.
pub const RATE_LIMIT_WRITE: &str = "RATE_LIMIT__WRITE_REQUESTS_PER_MINUTE";
/// Per-minute limit of the seed `read` tier.
pub const RATE_LIMIT_READ: &str = "RATE_LIMIT__READ_REQUESTS_PER_MINUTE";
/// Per-minute limit of the seed `protocol` tier.
pub const RATE_LIMIT_PROTOCOL: &str = "RATE_LIMIT__PROTOCOL_REQUESTS_PER_MINUTE";

/// `queue.databaseUrl`: the PostgreSQL URL (from the JobQueue's Secret).
pub const DATABASE_URL: &str = "SLUICE_DATABASE_URL";
/// `queue.queues`: the queues served, comma-separated.
pub const QUEUES: &str = "SLUICE_QUEUES";
/// The namespace short queue names are resolved in (queue HTTP API paths, gRPC `subscribe.queues`).
pub const QUEUE_NAMESPACE: &str = "SLUICE_QUEUE_NAMESPACE";
/// `queue.handler.url`: where the worker POSTs jobs.
pub const HANDLER_URL: &str = "SLUICE_HANDLER_URL";
/// `queue.worker.concurrency`.
pub const WORKER_CONCURRENCY: &str = "SLUICE_WORKER_CONCURRENCY";
/// `queue.worker.claimBatch`: most jobs claimed by one query.
pub const WORKER_CLAIM_BATCH: &str = "SLUICE_WORKER_CLAIM_BATCH";
/// `queue.api.listen`: where the queue HTTP API is served (unset: not served).
pub const API_LISTEN: &str = "SLUICE_API_LISTEN";
/// `queue.api.answerDeadline`: how long one of the queue HTTP API's statements may go unanswered
/// (`5s`, `500ms`) before the request is answered 503.
pub const API_ANSWER_DEADLINE: &str = "SLUICE_API_ANSWER_DEADLINE";
/// `queue.api.auth.mode`: `kubernetes` checks the queue API's callers (ServiceAccount tokens, RBAC),
/// `off` does not.
pub const API_AUTH: &str = "SLUICE_API_AUTH";
/// `queue.api.auth.loopback`: `pod` (tokenless callers on loopback are the pod's ServiceAccount) or
/// `token` (every caller needs a token).
pub const API_AUTH_LOOPBACK: &str = "SLUICE_API_AUTH_LOOPBACK";
/// `queue.api.auth.namespace`: the pod's namespace (the downward API's `metadata.namespace`).
pub const POD_NAMESPACE: &str = "SLUICE_POD_NAMESPACE";
/// `queue.api.auth.serviceAccount`: the pod's ServiceAccount (the downward API's
/// `spec.serviceAccountName`).
pub const POD_SERVICE_ACCOUNT: &str = "SLUICE_POD_SERVICE_ACCOUNT";
/// `queue.api.auth.jobQueues`: `queue=jobqueue,...` for queues whose database name is not their
/// JobQueue's (set by the webhook from `spec.queueName`).
pub const API_JOB_QUEUES: &str = "SLUICE_API_JOB_QUEUES";
/// `queue.worker.metricsListen`.
pub const METRICS_LISTEN: &str = "SLUICE_METRICS_LISTEN";
/// `queue.grpc.listen`: where the gRPC worker API is served (unset: not served; jobs are POSTed to the
/// handler).
pub const GRPC_LISTEN: &str = "SLUICE_GRPC_LISTEN";

/// Set by the webhook in app containers of pods that enqueue through the sidecar: the queue API's base
/// URL (`http://127.0.0.1:7070`). Read by the app, not by Sluice.
pub const QUEUE_API: &str = "SLUICE_QUEUE_API";
/// Set by the webhook beside [`QUEUE_API`] when the API checks callers: the file holding the app's
/// ServiceAccount token for it (audience `sluice`, refreshed by the kubelet; read it for each request or
/// every few minutes, and send it as `Authorization: Bearer <token>`). Read by the app, not by Sluice.
pub const QUEUE_API_TOKEN_FILE: &str = "SLUICE_QUEUE_API_TOKEN_FILE";

/// The directory the sidecar reads its own ServiceAccount credentials from (`token`, `ca.crt`,
/// `namespace`) for the queue API's TokenReviews and SubjectAccessReviews, in place of
/// [`crate::contract::SERVICE_ACCOUNT_DIR`]: for a sidecar run outside a pod, with the credentials
/// elsewhere.
pub const SERVICE_ACCOUNT_DIR: &str = "SLUICE_SERVICE_ACCOUNT_DIR";
