//! `sluice-operator`: Sluice's control plane. It renders each `RateLimitPolicy` into the sidecar's config
//! and gets it to the running sidecars within seconds, injects the `sluice-sidecar` container into pods
//! that ask for it, and manages its own webhook certificates.
//!
//! Layout (dependencies point down the list):
//! - [`render`]: pure functions from API objects to what the sidecar reads (no I/O).
//! - [`webhook`]: the pod injection patch ([`webhook::inject`], pure), its annotations, the
//!   `MutatingWebhookConfiguration` it needs, and the HTTPS admission server.
//! - [`redis`]: publishing rendered config to Redis and reading back which generation pods enforce.
//! - [`controller`]: the `RateLimitPolicy` and `JobQueue` controllers (`reconcile`/`error_policy`).
//! - [`scaling`], [`external_metrics`]: JobQueue depth, scaling decisions, and the
//!   `external.metrics.k8s.io` API (with its own authentication and authorization).
//! - [`certs`]: serving certificates (generation, rotation, the `caBundle` patch).
//! - [`leader`]: Lease-based leader election; every replica serves the webhook, one reconciles.
//! - [`metrics`], [`telemetry`]: Prometheus metrics and tracing.
//! - [`crdgen`], [`config`], [`run`]: the CRD YAML generator, the typed command line, and the wiring
//!   the binary calls.

pub mod certs;
pub mod config;
pub mod controller;
pub mod crdgen;
pub mod external_metrics;
pub mod leader;
pub mod metrics;
pub mod probe;
pub mod redis;
pub mod render;
pub mod run;
pub mod scaling;
pub mod telemetry;
pub mod webhook;

/// Port of the sidecar's `/healthz`, `/readyz` and `/metrics` in injected pods; rendered into the
/// config (`limits.adminListen`) and probed by the injected readiness probe, so both agree.
pub const SIDECAR_ADMIN_PORT: u16 = 15021;
/// Default port the injected sidecar listens on for application traffic (`sluice.dev/listen-port`).
pub const SIDECAR_LISTEN_PORT_DEFAULT: u16 = 15080;
/// Name of the injected container.
pub const SIDECAR_CONTAINER_NAME: &str = "sluice-sidecar";
/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "sluice-operator";

/// Everything that can go wrong in the operator. Variant names double as metric labels
/// ([`Error::metric_label`]), so they name causes, not call sites.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// The policy passed the CRD's validation but cannot be rendered.
    #[error("{0}")]
    InvalidSpec(#[from] render::sidecar_config::RenderError),
    /// The Secret a policy names does not exist.
    #[error("Secret {namespace}/{name} named by spec.redis.secretRef does not exist")]
    SecretNotFound {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
    },
    /// The Secret exists but lacks the key.
    #[error("Secret {namespace}/{name} has no key {key:?} (spec.redis.secretRef.key)")]
    SecretKeyMissing {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The missing key.
        key: String,
    },
    /// Redis could not be reached or refused a command.
    #[error("Redis: {0}")]
    Redis(String),
    /// A certificate could not be generated.
    #[error("certificate generation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    /// TLS setup failed.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// (De)serialisation failed: a bug or a malformed object from the API server.
    #[error("serialisation failed: {0}")]
    Serialization(String),
    /// Network I/O failed (binding a port, accepting a connection).
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// A JobQueue's database Secret is missing or lacks its key.
    #[error("{0}")]
    DatabaseSecret(scaling::databases::UrlError),
    /// A JobQueue's database could not be reached or refused a statement.
    #[error("database: {0}")]
    Database(#[from] scaling::databases::DbError),
    /// A JobQueue passed the CRD's validation but cannot be rendered.
    #[error("{0}")]
    InvalidJobQueue(#[from] render::worker_deployment::RenderError),
}

/// The operator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short label for metrics (`errors_total{reason=…}`): stable, low-cardinality.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::InvalidSpec(_) => "invalid_spec",
            Error::SecretNotFound { .. } => "secret_not_found",
            Error::SecretKeyMissing { .. } => "secret_key_missing",
            Error::Redis(_) => "redis_unreachable",
            Error::Certificate(_) => "certificate",
            Error::Tls(_) => "tls",
            Error::Serialization(_) => "serialization",
            Error::Io(_) => "io",
            Error::DatabaseSecret(scaling::databases::UrlError::SecretKeyMissing { .. }) => {
                "secret_key_missing"
            }
            Error::DatabaseSecret(_) => "secret_not_found",
            Error::Database(_) => "database_unreachable",
            Error::InvalidJobQueue(_) => "invalid_spec",
        }
    }

    /// Whether the error comes from what a user wrote (so it is reported in status and not retried
    /// hot), rather than from the cluster or the operator.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Error::InvalidSpec(_)
                | Error::SecretNotFound { .. }
                | Error::SecretKeyMissing { .. }
                | Error::DatabaseSecret(_)
                | Error::InvalidJobQueue(_)
        )
    }
}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Error::Serialization(e.to_string())
    }
}

impl From<serde_yaml::Error> for Error {
    fn from(e: serde_yaml::Error) -> Self {
        Error::Serialization(e.to_string())
    }
}

impl From<scaling::databases::UrlError> for Error {
    fn from(e: scaling::databases::UrlError) -> Self {
        match e {
            scaling::databases::UrlError::Kube(k) => Error::Kube(k),
            other => Error::DatabaseSecret(other),
        }
    }
}

impl From<fred::error::Error> for Error {
    fn from(e: fred::error::Error) -> Self {
        Error::Redis(e.to_string())
    }
}
