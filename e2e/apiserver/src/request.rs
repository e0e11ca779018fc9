//! [`Req`]: one request, read once (headers, query, body, caller) before routing.

use std::collections::HashMap;

use bytes::Bytes;
use http::Method;
use serde_json::Value;

use crate::error::ApiError;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::user::User;

/// A parsed request.
pub struct Req {
    /// Method.
    pub method: Method,
    /// Path.
    pub path: String,
    /// Query parameters.
    pub query: HashMap<String, String>,
    /// `Accept` header.
    pub accept: String,
    /// `Content-Type` header.
    pub content_type: String,
    /// `User-Agent` header.
    pub user_agent: String,
    /// Body.
    pub body: Bytes,
    /// When the request arrived, by the server's clock.
    pub now: chrono::DateTime<chrono::Utc>,
    /// Who sent it (from the bearer token).
    pub user: User,
}

impl Req {
    /// A query parameter.
    pub fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }

    /// A boolean query parameter (`true` or `1`).
    pub fn flag(&self, k: &str) -> bool {
        matches!(self.q(k), Some("true") | Some("1"))
    }

    /// The field manager: `fieldManager`, else derived from the user agent as kube-apiserver does.
    pub fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        let ua = self.user_agent.split('/').next().unwrap_or_default();
        if ua.is_empty() {
            "unknown".into()
        } else {
            ua.to_string()
        }
    }

    /// The body as JSON: JSON, YAML, or protobuf of a built-in kind.
    pub fn body_value(&self) -> Result<Value, ApiError> {
        if self.body.is_empty() {
            return Err(ApiError::bad_request("the request body is empty"));
        }
        if self.content_type.starts_with(crate::protobuf::CONTENT_TYPE) {
            // Typed client-go clients (`kubectl create configmap …`) send built-in kinds as protobuf.
            return crate::protobuf::decode(&self.body).map_err(|e| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("error decoding the protobuf request body: {e}"),
                )
            });
        }
        if self.content_type.contains("cbor") {
            // client-go falls back to JSON when a CBOR body is refused with 415.
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "this test API server accepts JSON, YAML and protobuf bodies, not {}",
                    self.content_type
                ),
            ));
        }
        if let Ok(v) = serde_json::from_slice(&self.body) {
            return Ok(v);
        }
        serde_yaml::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding the request body: {e}")))
    }

    /// The label and field selectors.
    pub fn selectors(&self) -> Result<(LabelSelector, FieldSelector), ApiError> {
        Ok((
            LabelSelector::parse(self.q("labelSelector").unwrap_or_default())?,
            FieldSelector::parse(self.q("fieldSelector").unwrap_or_default())?,
        ))
    }
}
