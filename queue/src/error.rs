//! The queue's error type. Variants double as metric labels ([`Error::metric_label`]); messages never
//! carry a database URL.

/// Everything a queue call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A PostgreSQL call failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
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
    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Database(_) => "database",
            Error::NotFound(_) => "not_found",
            Error::Conflict(_) => "conflict",
            Error::Invalid(_) => "invalid",
        }
    }
}

/// The queue's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
