//! The names Sluice's parts agree on: what the operator renders, the sidecar reads, the webhook writes
//! into pods and users see in `kubectl`. Each is spelled here once; the operator and the sidecar use these
//! constants rather than literals, so changing one changes both ends (and the docs that name it).
//!
//! Layout: this file (the sidecar container's name, user, ports and paths; annotation and label names),
//! [`env`](mod@env) (the environment variables the sidecar reads), [`redis`] (the Redis key layout and the
//! `enforced` report). Condition types and reasons are in [`crate::conditions`].

pub mod env;
pub mod redis;

/// Name of the sidecar container, injected into app pods and in worker pods.
pub const SIDECAR_CONTAINER: &str = "sluice-sidecar";

/// User and group the sidecar runs as: the image's non-root user (distroless `nonroot`).
pub const SIDECAR_UID: i64 = 65532;

/// Where a kubelet mounts a pod's ServiceAccount credentials (`token`, `ca.crt`, `namespace`).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Ports of the sidecar.
pub mod port {
    /// The injected sidecar's `/healthz`, `/readyz` and `/metrics` (`limits.adminListen` as rendered);
    /// its probes point here.
    pub const ADMIN: u16 = 15021;
    /// Default port the injected sidecar listens on for application traffic (`sluice.dev/listen-port`).
    pub const LISTEN_DEFAULT: u16 = 15080;
    /// The worker sidecar's `/metrics` and `/healthz` (`queue.worker.metricsListen` as rendered).
    pub const WORKER_METRICS: u16 = 9902;
    /// The queue HTTP API in pods that enqueue through the sidecar, on `127.0.0.1` only.
    pub const QUEUE_API: u16 = 7070;
    /// The worker sidecar's gRPC worker API (`queue.grpc.listen`), when turned on.
    pub const WORKER_GRPC: u16 = 9903;
}

/// Names of the injected sidecar's container ports. Injection refuses pods that use them already, so on
/// a governed pod they name the sidecar's ports alone (the rendered NetworkPolicy admits them by name).
pub mod port_name {
    /// The proxy port, when the app port it fronts had no name to take over.
    pub const LISTEN: &str = "sluice";
    /// The admin port ([`super::port::ADMIN`]).
    pub const ADMIN: &str = "sluice-admin";
}

/// Where the sidecar finds its config file in a pod.
pub mod path {
    /// The directory the config volume is mounted at.
    pub const CONFIG_DIR: &str = "/etc/sluice";
    /// File (and ConfigMap key) of a policy's rendered config: `--config /etc/sluice/config.yaml`.
    pub const POLICY_CONFIG_FILE: &str = "config.yaml";
    /// File (and ConfigMap key) of a worker's config: `worker --config /etc/sluice/worker.yaml`.
    pub const WORKER_CONFIG_FILE: &str = "worker.yaml";
}

/// The `sluice.dev/*` annotations users write. The operator's webhook parses the pod ones.
pub mod annotation {
    /// On a pod: `"true"` asks for the sidecar; `"false"` (or absence) leaves the pod alone.
    pub const INJECT: &str = "sluice.dev/inject";
    /// On a pod: the `RateLimitPolicy` (in the pod's namespace) that governs it. Absent: the one policy
    /// whose `selector` matches the pod's labels.
    pub const POLICY: &str = "sluice.dev/policy";
    /// On a pod: the application's port the sidecar fronts, a container port name (`http`) or number.
    pub const APP_PORT: &str = "sluice.dev/app-port";
    /// On a pod: the port the sidecar listens on (default [`super::port::LISTEN_DEFAULT`]).
    pub const LISTEN_PORT: &str = "sluice.dev/listen-port";
    /// On a pod: `"true"` injects a native sidecar (init container with `restartPolicy: Always`),
    /// `"false"` a plain container. Absent: the operator's default.
    pub const NATIVE_SIDECAR: &str = "sluice.dev/native-sidecar";
    /// On a pod: comma-separated `JobQueue` names the app enqueues to; the sidecar serves the queue HTTP
    /// API for them on `127.0.0.1:7070`.
    pub const JOB_QUEUES: &str = "sluice.dev/job-queues";
    /// On a `JobQueue`: `"true"` pauses it (workers claim nothing, scaling stops where it is).
    pub const PAUSED: &str = "sluice.dev/paused";
    /// On a worker pod template: a hash of the worker config, so a config change rolls the workers.
    pub const CONFIG_HASH: &str = "sluice.dev/config-hash";
}

/// Labels the operator puts on what it creates, and selects by.
pub mod label {
    /// On injected pods and on a policy's ConfigMap, valued with the policy's name: how the controller
    /// finds the pods a policy governs.
    pub const POLICY: &str = "sluice.dev/policy";
    /// On everything rendered for a `JobQueue`, valued with its name; the worker Deployment's selector.
    pub const JOB_QUEUE: &str = "sluice.dev/jobqueue";
    /// `app.kubernetes.io/managed-by`, valued [`MANAGED_BY_VALUE`], on the objects the operator writes.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// The value of [`MANAGED_BY`]: the operator's name (also its server-side apply field manager).
    pub const MANAGED_BY_VALUE: &str = "sluice-operator";
}
