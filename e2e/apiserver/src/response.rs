//! What handlers answer with: [`Body`], JSON objects and `Status` errors.

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::Value;

use crate::error::ApiError;
use crate::registry::{ResourceType, present};

/// Response body of every handler.
pub type Body = BoxBody<Bytes, Infallible>;

/// A JSON response.
pub fn json_response(code: u16, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("a static response is valid")
}

/// A refusal as kube-apiserver answers it: its code and a `metav1.Status`.
pub fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

/// `ok`.
pub fn plain_ok() -> Response<Body> {
    Response::new(Full::new(Bytes::from_static(b"ok")).boxed())
}

/// An object of type `rt` in the version asked for, with a `Warning` header per warning.
pub fn object_response(rt: &ResourceType, obj: Value, code: u16, warnings: &[String]) -> Response<Body> {
    let mut r = json_response(code, &present(rt, obj));
    for w in warnings {
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "'"))) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}
