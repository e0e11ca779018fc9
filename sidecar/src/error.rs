//! The sidecar's error type. Variants double as metric labels (`Error::metric_label`).

/// Everything that can go wrong in the sidecar library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The config file or an environment override is invalid; the message names the field.
    #[error("invalid config: {0}")]
    Config(String),
    /// A Redis call failed or missed its deadline.
    #[error("redis: {0}")]
    Redis(String),
    /// A PostgreSQL call failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// Reading or writing a file or socket failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A queue or job does not exist (the message names it).
    #[error("not found: {0}")]
    NotFound(String),
    /// The request conflicts with stored state: an idempotency key reused with another payload, a cancel
    /// of a finished job, a retry of a job that is not dead.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The request is invalid (the message names the field).
    #[error("invalid request: {0}")]
    Invalid(String),
}

impl Error {
    /// A short, stable label for metrics (`config`, `redis`, ...).
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Redis(_) => "redis",
            Error::Database(_) => "database",
            Error::Io(_) => "io",
            Error::NotFound(_) => "not_found",
            Error::Conflict(_) => "conflict",
            Error::Invalid(_) => "invalid",
        }
    }
}

impl From<sluice_queue::Error> for Error {
    /// The queue's errors keep their meaning (and metric label) here.
    fn from(e: sluice_queue::Error) -> Self {
        match e {
            sluice_queue::Error::Database(e) => Error::Database(e),
            sluice_queue::Error::NotFound(m) => Error::NotFound(m),
            sluice_queue::Error::Conflict(m) => Error::Conflict(m),
            sluice_queue::Error::Invalid(m) => Error::Invalid(m),
        }
    }
}

impl From<sluice_crds::sidecar_config::ConfigErrors> for Error {
    fn from(e: sluice_crds::sidecar_config::ConfigErrors) -> Self {
        Error::Config(e.to_string())
    }
}

/// The sidecar's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
