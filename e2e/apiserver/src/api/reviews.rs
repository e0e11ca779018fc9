//! `TokenReview` and `SubjectAccessReview`, answered from the tokens and the deny list the server holds.

use std::sync::Arc;

use http::Response;
use serde_json::json;

use crate::error::ApiError;
use crate::request::Req;
use crate::response::{Body, json_response};
use crate::state::State;

/// `TokenReview`: who a bearer token belongs to (the tokens [`State::user_of`] knows).
pub fn token_review(state: &Arc<State>, req: &Req) -> Result<Response<Body>, ApiError> {
    let mut review = req.body_value()?;
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    review["status"] = match state.user_of(token) {
        Some(u) => json!({"authenticated": true, "user": {"username": u.username, "groups": u.groups}}),
        None => json!({"authenticated": false, "error": "the token is not known to this API server"}),
    };
    Ok(json_response(201, &review))
}

/// `SubjectAccessReview`. RBAC is not simulated: this is a stand-in whose rule is "allowed unless the
/// user or one of its groups is on the deny list" ([`State::set_denied`]), enough to test that a caller
/// asks and obeys the answer.
pub fn subject_access_review(state: &Arc<State>, req: &Req) -> Result<Response<Body>, ApiError> {
    let mut review = req.body_value()?;
    let spec = &review["spec"];
    let user = spec["user"].as_str().unwrap_or_default().to_string();
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(String::from))
        .collect();
    if user.is_empty() && groups.is_empty() {
        return Err(ApiError::bad_request(
            "SubjectAccessReview spec: at least one of user or group must be specified",
        ));
    }
    let denied = state.denied(&user, &groups);
    review["status"] = if let Some(who) = denied {
        json!({"allowed": false, "denied": true, "reason": format!("{who} is on the test API server's deny list")})
    } else {
        json!({"allowed": true, "reason": "the test API server allows everyone not on its deny list"})
    };
    Ok(json_response(201, &review))
}
