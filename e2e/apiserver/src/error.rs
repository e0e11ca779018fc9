//! Errors: [`ApiError`] is what a client sees (a `metav1.Status`), [`Error`] is the crate's own.

use serde_json::{Value, json};

use crate::registry::ResourceType;

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
    /// A Kubernetes client for the server could not be made.
    #[error("kube: {0}")]
    Kube(#[from] kube::Error),
    /// A client configuration could not be made.
    #[error("config: {0}")]
    Config(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<ApiError> for Error {
    fn from(e: ApiError) -> Self {
        Error::Api(Box::new(e))
    }
}

/// A refusal in the shape a real API server gives it: HTTP code, `reason`, message and details.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `metav1.StatusReason`, e.g. `NotFound`.
    pub reason: String,
    /// Human readable message, worded like kube-apiserver's.
    pub message: String,
    /// `metav1.StatusDetails`, when there are any.
    pub details: Option<Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// `deployments.apps`, `pods`: how kube-apiserver names a resource in messages.
pub fn qualified(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        rt.plural.clone()
    } else {
        format!("{}.{}", rt.plural, rt.group)
    }
}

/// `RateLimitPolicy.sluice.dev`, `Pod`: how kube-apiserver names a kind in validation messages.
pub fn qualified_kind(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        rt.kind.clone()
    } else {
        format!("{}.{}", rt.kind, rt.group)
    }
}

fn details(rt: &ResourceType, name: &str) -> Value {
    json!({"name": name, "group": rt.group, "kind": rt.plural})
}

impl ApiError {
    /// A bare error with code, reason and message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    /// 404 for a named object.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        ApiError {
            details: Some(details(rt, name)),
            ..Self::new(404, "NotFound", format!("{} \"{name}\" not found", qualified(rt)))
        }
    }

    /// 404 for a path that names nothing.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 on create of an existing name.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        ApiError {
            details: Some(details(rt, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(rt)),
            )
        }
    }

    /// 409 when a resourceVersion precondition fails.
    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        ApiError {
            details: Some(details(rt, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    qualified(rt)
                ),
            )
        }
    }

    /// 409 for the usual stale-resourceVersion update.
    pub fn stale(rt: &ResourceType, name: &str) -> Self {
        Self::conflict(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with field causes, worded `Kind "name" is invalid: field: message`.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> Self {
        let list = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect::<Vec<_>>();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        ApiError {
            details: Some(json!({
                "name": name,
                "group": rt.group,
                "kind": rt.kind,
                "causes": causes.iter().map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field})).collect::<Vec<_>>(),
            })),
            ..Self::new(
                422,
                "Invalid",
                format!("{} \"{name}\" is invalid: {joined}", qualified_kind(rt)),
            )
        }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410 for a watch or list continuation that is too old.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 401.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 415.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {content_type})"
            ),
        )
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        status
    }
}

/// One field-level cause of a 422.
#[derive(Debug, Clone, PartialEq)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: String,
    /// `spec.limit`.
    pub field: String,
    /// `Invalid value: -1: spec.limit in body should be greater than or equal to 1`.
    pub message: String,
}

impl Cause {
    /// A cause from its three parts.
    pub fn new(reason: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Cause {
            reason: reason.to_string(),
            field: field.into(),
            message: message.into(),
        }
    }
}
