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

/// What a statement the database did not answer within the store's answer deadline fails with (see
/// [`crate::QueueStore::with_answer_deadline`]): a connection error, [`std::io::ErrorKind::TimedOut`],
/// since the connection was closed and nothing is known of what the server did; [`Unanswered::is`]
/// tells it from other connection errors.
#[derive(Debug, thiserror::Error)]
#[error("the database did not answer within {} ms; its connection was closed", .0.as_millis())]
pub struct Unanswered(pub std::time::Duration);

impl Unanswered {
    /// This as the crate's error.
    pub(crate) fn into_error(self) -> Error {
        Error::Database(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            self,
        )))
    }

    /// Whether `e` is the error of a statement given up unanswered.
    pub fn is(e: &sqlx::Error) -> bool {
        Self::of(e).is_some()
    }

    /// The deadline a statement was given up after, when `e` is such an error.
    pub fn of(e: &sqlx::Error) -> Option<&Unanswered> {
        match e {
            sqlx::Error::Io(io) => io.get_ref()?.downcast_ref::<Unanswered>(),
            _ => None,
        }
    }
}

/// The queue's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
