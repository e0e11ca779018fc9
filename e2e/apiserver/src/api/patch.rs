//! PATCH: JSON patch, JSON merge patch and (built-in kinds only) strategic merge patch, on the object or
//! on the Scale of `/scale`. Server-side apply is [`super::apply`].

use serde_json::Value;

use super::checks::precondition;
use crate::error::{ApiError, Cause};
use crate::merge::{Flavour, merge as strategic_merge};
use crate::registry::{ResourceType, present};
use crate::shape::Shape;
use crate::target::Target;

/// `application/json-patch+json`: the operations applied to `old`.
pub fn json(t: &Target, old: &Value, patch: &Value) -> Result<Value, ApiError> {
    let rt = &t.rt;
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    let mut obj = patch_base(rt, t, old);
    json_patch::patch(&mut obj, &ops).map_err(|e| patch_error(rt, t.name(), &e.to_string()))?;
    let obj = unpatch_base(rt, t, old, obj)?;
    Ok(present(rt, obj))
}

/// `application/merge-patch+json` (RFC 7386) over `old`.
pub fn merge(t: &Target, old: &Value, patch: &Value) -> Result<Value, ApiError> {
    let rt = &t.rt;
    precondition(rt, t.name(), old, patch)?;
    let mut obj = patch_base(rt, t, old);
    json_patch::merge(&mut obj, patch);
    let obj = unpatch_base(rt, t, old, obj)?;
    Ok(present(rt, obj))
}

/// `application/strategic-merge-patch+json` over `old`: lists merged by their keys where the kind's
/// shape says so.
pub fn strategic(t: &Target, old: &Value, patch: &Value, shape: &Shape) -> Result<Value, ApiError> {
    let rt = &t.rt;
    precondition(rt, t.name(), old, patch)?;
    let mut obj = patch_base(rt, t, old);
    strategic_merge(&mut obj, patch, shape, Flavour::Strategic)?;
    let obj = unpatch_base(rt, t, old, obj)?;
    Ok(present(rt, obj))
}

/// What a JSON or merge patch applies to: the whole object, or the Scale for `/scale`.
fn patch_base(rt: &ResourceType, t: &Target, old: &Value) -> Value {
    if t.sub.as_deref() == Some("scale") {
        crate::scale::to_scale(rt, old)
    } else {
        old.clone()
    }
}

fn unpatch_base(rt: &ResourceType, t: &Target, old: &Value, patched: Value) -> Result<Value, ApiError> {
    if t.sub.as_deref() == Some("scale") {
        crate::scale::from_scale(rt, old, &patched)
    } else {
        Ok(patched)
    }
}

fn patch_error(rt: &ResourceType, name: &str, why: &str) -> ApiError {
    if why.contains("test") {
        ApiError::invalid(
            rt,
            name,
            vec![Cause::new(
                "FieldValueInvalid",
                "",
                format!("the server rejected our request due to an error in our request: {why}"),
            )],
        )
    } else {
        ApiError::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {why}"),
        )
    }
}
