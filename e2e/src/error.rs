//! The crate's errors. A refusal by the API server is the test API server's [`ApiError`].

pub use sluice_test_apiserver::ApiError;

/// The crate's error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request the API server refused, as it would answer it.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// Binding, reading or writing failed.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// Certificates could not be made or loaded.
    #[error("tls: {0}")]
    Tls(String),
    /// A YAML or JSON document could not be read.
    #[error("decode: {0}")]
    Decode(String),
    /// The Kubernetes client failed.
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    /// A condition the harness waited for did not hold before its deadline.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(std::time::Duration, String),
    /// The harness was configured wrongly.
    #[error("config: {0}")]
    Config(String),
    /// A container could not be run with Podman.
    #[error("container: {0}")]
    Container(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error::Api(Box::new(e))
    }
}

impl From<sluice_test_apiserver::Error> for Error {
    fn from(e: sluice_test_apiserver::Error) -> Self {
        use sluice_test_apiserver::Error as E;
        match e {
            E::Api(e) => Error::Api(e),
            E::Io(e) => Error::Io(e),
            E::Tls(e) => Error::Tls(e),
            E::Decode(e) => Error::Decode(e),
            E::Kube(e) => Error::Kube(e),
            E::Config(e) => Error::Config(e),
        }
    }
}
