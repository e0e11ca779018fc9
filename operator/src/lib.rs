//! `sluice-operator`: Sluice's control plane. It renders each `RateLimitPolicy` into the sidecar's config
//! and gets it to the running sidecars within seconds, injects the `sluice-sidecar` container into pods
//! that ask for it, prepares and scales each `JobQueue`'s workers, serves queue depth as an external
//! metric, and manages its own serving certificates. It depends on `sluice-crds` (API types and the
//! contracts it shares with the sidecar) and `sluice-queue` (all SQL), never on the sidecar's crate.
//!
//! Layout (roughly bottom up: a module uses only those above it):
//! - [`clock`], [`metrics`], [`secret`]: the injected wall clock; reconcile and admission metrics; reading
//!   the URL from the one Secret an object names.
//! - [`digest`]: short hex names from SHA-256 prefixes (annotations, name suffixes, endpoint keys).
//! - [`budget`]: bounds on the Redis servers and databases one namespace makes the operator connect to.
//! - [`render`]: pure functions from API objects to what the cluster and the sidecar read (sidecar config,
//!   the sidecar container, worker Deployment, HPA, `ScaledObject`).
//! - [`serve`]: the serving loop of the webhook, the external metrics API and `/metrics` (timeouts,
//!   connection caps, accept errors survived, readiness tied to the loop running).
//! - [`webhook`]: the pod injection patch ([`webhook::inject`], pure), annotation parsing, and the HTTPS
//!   admission server (the `MutatingWebhookConfiguration` is the chart's).
//! - [`signing`]: the Ed25519 key the operator signs published configs with (kept in a Secret).
//! - [`propagation`]: publishing rendered config to Redis and reading back which generation pods enforce.
//! - [`scaling`]: JobQueue scaling decisions (pure) and their adapters: database pools and depth, the
//!   LISTEN waker, JobQueue metrics.
//! - [`external_metrics`]: the `external.metrics.k8s.io` API, with its own authentication and
//!   authorization; [`certs`]: serving certificates (generation, rotation, the `caBundle` patch).
//! - [`controller`]: the `RateLimitPolicy` and `JobQueue` controllers, of one shape.
//! - [`leader`]: Lease-based leader election; every replica serves the webhook, one reconciles.
//! - [`telemetry`], [`crdgen`], [`config`], [`run`]: tracing, the CRD YAML generator, the typed command
//!   line, and the wiring the binary calls.

pub mod budget;
pub mod certs;
pub mod clock;
pub mod config;
pub mod controller;
pub mod counter_key;
pub mod crdgen;
pub mod digest;
pub mod external_metrics;
pub mod leader;
pub mod metrics;
pub mod probe;
pub mod propagation;
pub mod render;
pub mod revocation;
pub mod run;
pub mod scaling;
pub mod secret;
pub mod serve;
pub mod signing;
pub mod telemetry;
pub mod tenant;
pub mod webhook;

/// Field manager of every server-side apply the operator makes (also its `managed-by` label value).
pub const FIELD_MANAGER: &str = sluice_crds::contract::label::MANAGED_BY_VALUE;

/// Everything that can go wrong in the operator, for both controllers, the webhook and the metrics API.
/// Variant names double as metric labels ([`Error::metric_label`]) and as the `Ready` condition's reason
/// ([`Error::condition_reason`]), so they name causes, not call sites.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// The policy passed the CRD's validation but cannot be rendered.
    #[error("{0}")]
    InvalidSpec(#[from] render::sidecar_config::RenderError),
    /// A JobQueue passed the CRD's validation but cannot be rendered.
    #[error("{0}")]
    InvalidJobQueue(#[from] render::worker_deployment::RenderError),
    /// The Secret an object names does not exist.
    #[error("Secret {namespace}/{name} named by {field} does not exist")]
    SecretNotFound {
        /// Namespace of the Secret (the object's).
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The reference's field (`spec.redis.secretRef`, `spec.database.secretRef`, a QueueDatabase's
        /// `spec.secretRef`).
        field: String,
    },
    /// The Secret exists but lacks the key (or its value is empty or not UTF-8).
    #[error("Secret {namespace}/{name} has no key {key:?} ({field}.key)")]
    SecretKeyMissing {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// The missing key.
        key: String,
        /// The reference's field.
        field: String,
    },
    /// `spec.database.queueDatabaseRef` names a QueueDatabase that does not exist.
    #[error(
        "QueueDatabase {name:?} named by spec.database.queueDatabaseRef does not exist: name one that \
         does (kubectl get queuedatabases), or an administrator must create it; the JobQueue is \
         reconciled again when it appears"
    )]
    QueueDatabaseNotFound {
        /// The QueueDatabase's name.
        name: String,
    },
    /// The QueueDatabase exists but the operator has not taken it over yet (its finalizer, which makes
    /// deleting it revoke what it admitted, is not there yet).
    #[error(
        "QueueDatabase {name:?} is not in use yet: the operator has not yet added its finalizer \
         sluice.dev/revoke-tenants, without which deleting it would not revoke the namespaces it admits; \
         the JobQueue is reconciled again when it is added (is the operator's QueueDatabase controller \
         running?)"
    )]
    QueueDatabasePending {
        /// The QueueDatabase's name.
        name: String,
    },
    /// The QueueDatabase is being deleted (or was deleted, and one made again under its name since this
    /// reconcile read it): nothing is provisioned through it.
    #[error(
        "QueueDatabase {name:?} is being deleted (its namespaces lose their tenant logins) or was made \
         again since: nothing is provisioned through the one being deleted; the JobQueue is reconciled \
         again when the QueueDatabase changes"
    )]
    QueueDatabaseDeleted {
        /// The QueueDatabase's name.
        name: String,
    },
    /// The QueueDatabase's `namespaceSelector` does not admit the JobQueue's namespace.
    #[error(
        "QueueDatabase {name:?} does not admit namespace {namespace}: its spec.namespaceSelector must \
         select this namespace's labels (without a selector it admits none); an admin changes the \
         selector or the namespace's labels, or name another database. Nothing was provisioned"
    )]
    NamespaceNotAllowed {
        /// The QueueDatabase's name.
        name: String,
        /// The JobQueue's namespace.
        namespace: String,
    },
    /// The QueueDatabase's `namespaceSelector` is not a valid label selector, so it admits no namespace.
    #[error(
        "QueueDatabase {name:?} has an invalid spec.namespaceSelector ({why}), so it admits no namespace: \
         an administrator must fix the selector. Nothing was provisioned"
    )]
    QueueDatabaseSelectorInvalid {
        /// The QueueDatabase's name.
        name: String,
        /// What is wrong with the selector.
        why: String,
    },
    /// An object the operator would write or delete exists and is not controlled by the resource being
    /// reconciled (no controller ownerReference to it): the operator leaves it alone.
    #[error(
        "{kind} {namespace}/{name} exists and is not controlled by this {owner}: the operator leaves it \
         unchanged; delete or rename it to let the operator manage it"
    )]
    NotOwned {
        /// Kind of the object (`ConfigMap`, `NetworkPolicy`, `Deployment`, ...).
        kind: String,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Kind of the resource that would own it.
        owner: String,
    },
    /// A namespace names more distinct Redis servers or databases than the operator connects to for
    /// one namespace (or the operator is at its total): the object is not connected.
    #[error(
        "namespace {namespace} already uses {in_use} distinct {kind} endpoints, the most the operator \
         connects to {scope}: reuse one of them (or raise --max-endpoints-per-namespace / --max-endpoints)"
    )]
    TooManyEndpoints {
        /// The namespace of the object.
        namespace: String,
        /// `Redis` or `PostgreSQL`.
        kind: &'static str,
        /// How many are in use.
        in_use: usize,
        /// `for one namespace` or `in all`.
        scope: &'static str,
    },
    /// `spec.database.rowLevelSecurity` is `Enabled` and the namespace's tenant role could not be made
    /// ([`tenant::provision`]); `why` names what is missing and the fix, never the password.
    #[error(
        "the tenant role {}of namespace {namespace} was not provisioned, so no worker is given \
         database credentials: {why}",
        role.as_ref().map(|r| format!("{r:?} ")).unwrap_or_default()
    )]
    TenantNotProvisioned {
        /// The JobQueue's namespace.
        namespace: String,
        /// The role it would log in as, once known (it is looked up in the database).
        role: Option<String>,
        /// What failed and how to fix it.
        why: String,
    },
    /// The namespace's counter key Secret holds no usable key, or the operator may not write it (see
    /// [`counter_key`]).
    #[error("Secret {namespace}/{name} {why}")]
    CounterKeyUnusable {
        /// The policy's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// What is wrong (never the value), what it does to the sidecars, and what to do.
        why: String,
    },
    /// Redis could not be reached or refused a command.
    #[error("Redis: {0}")]
    Redis(String),
    /// A JobQueue's database could not be reached or refused a statement (the URL is never part of it).
    #[error("database: {0}")]
    Database(#[from] sluice_queue::Error),
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
}

/// The operator's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short label for metrics (`reconcile_errors_total{reason=…}`): stable, low-cardinality.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::InvalidSpec(_) | Error::InvalidJobQueue(_) => "invalid_spec",
            Error::SecretNotFound { .. } => "secret_not_found",
            Error::SecretKeyMissing { .. } => "secret_key_missing",
            Error::NotOwned { .. } => "not_owned",
            Error::QueueDatabaseNotFound { .. } => "queue_database_not_found",
            Error::QueueDatabasePending { .. } => "queue_database_pending",
            Error::QueueDatabaseDeleted { .. } => "queue_database_deleted",
            Error::NamespaceNotAllowed { .. } | Error::QueueDatabaseSelectorInvalid { .. } => {
                "namespace_not_allowed"
            }
            Error::TooManyEndpoints { .. } => "too_many_endpoints",
            Error::TenantNotProvisioned { .. } => "tenant_not_provisioned",
            Error::CounterKeyUnusable { .. } => "counter_key_unusable",
            Error::Redis(_) => "redis_unreachable",
            Error::Database(_) => "database_unreachable",
            Error::Certificate(_) => "certificate",
            Error::Tls(_) => "tls",
            Error::Serialization(_) => "serialization",
            Error::Io(_) => "io",
        }
    }

    /// The reason a `Ready=False` condition gives for this error.
    pub fn condition_reason(&self) -> &'static str {
        use sluice_crds::conditions::reason;
        match self {
            Error::InvalidSpec(_) | Error::InvalidJobQueue(_) => reason::INVALID_SPEC,
            Error::SecretNotFound { .. } => reason::SECRET_NOT_FOUND,
            Error::SecretKeyMissing { .. } => reason::SECRET_KEY_MISSING,
            Error::NotOwned { .. } => reason::OBJECT_NOT_OWNED,
            Error::QueueDatabaseNotFound { .. } => reason::QUEUE_DATABASE_NOT_FOUND,
            Error::QueueDatabasePending { .. } => reason::QUEUE_DATABASE_PENDING,
            Error::QueueDatabaseDeleted { .. } => reason::QUEUE_DATABASE_DELETED,
            Error::NamespaceNotAllowed { .. } | Error::QueueDatabaseSelectorInvalid { .. } => {
                reason::NAMESPACE_NOT_ALLOWED
            }
            Error::TooManyEndpoints { .. } => reason::TOO_MANY_ENDPOINTS,
            Error::TenantNotProvisioned { .. } => reason::TENANT_NOT_PROVISIONED,
            Error::CounterKeyUnusable { .. } => reason::COUNTER_KEY_UNUSABLE,
            Error::Redis(_) => reason::REDIS_UNREACHABLE,
            Error::Database(_) => reason::DATABASE_UNREACHABLE,
            _ => reason::KUBERNETES_API_ERROR,
        }
    }

    /// Whether the error comes from what a user wrote (so it is reported in status and not retried
    /// hot), rather than from the cluster or the operator.
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Error::InvalidSpec(_)
                | Error::InvalidJobQueue(_)
                | Error::SecretNotFound { .. }
                | Error::SecretKeyMissing { .. }
                | Error::NotOwned { .. }
                | Error::QueueDatabaseNotFound { .. }
                | Error::NamespaceNotAllowed { .. }
                | Error::QueueDatabaseSelectorInvalid { .. }
                | Error::TooManyEndpoints { .. }
                | Error::TenantNotProvisioned { .. }
                | Error::CounterKeyUnusable { .. }
        )
    }
}

impl Error {
    /// The error for `namespace` over `budget`'s bound on `kind` endpoints.
    pub fn too_many(namespace: &str, kind: &'static str, exceeded: budget::Exceeded) -> Self {
        let (in_use, scope) = match exceeded {
            budget::Exceeded::Namespace(n) => (n, "for one namespace"),
            budget::Exceeded::Total(n) => (n, "in all"),
        };
        Error::TooManyEndpoints {
            namespace: namespace.to_owned(),
            kind,
            in_use,
            scope,
        }
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

impl From<fred::error::Error> for Error {
    fn from(e: fred::error::Error) -> Self {
        Error::Redis(e.to_string())
    }
}
