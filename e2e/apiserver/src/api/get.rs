//! GET of one object (or its `/scale`), as JSON or as a Table.

use std::sync::Arc;

use http::Response;

use crate::error::ApiError;
use crate::registry::present;
use crate::request::Req;
use crate::response::{Body, json_response};
use crate::state::State;
use crate::target::Target;

/// Serves a GET of one object.
pub fn get(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let store = state.store();
    let obj = store
        .get(&t.rt.key(), t.ns(), t.name())
        .cloned()
        .ok_or_else(|| ApiError::not_found(&t.rt, t.name()))?;
    if t.sub.as_deref() == Some("scale") {
        return Ok(json_response(200, &crate::scale::to_scale(&t.rt, &obj)));
    }
    let obj = present(&t.rt, obj);
    if let Some(r) = crate::table::maybe_single(&t.rt, &obj, req) {
        return Ok(json_response(200, &r));
    }
    Ok(json_response(200, &obj))
}
