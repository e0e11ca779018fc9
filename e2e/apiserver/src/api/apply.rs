//! Server-side apply (PATCH `application/apply-patch+yaml`): the applied configuration merged by field
//! ownership, conflicts with other managers refused unless forced.

use serde_json::{Value, json};

use super::checks::{check_kind, precondition};
use crate::error::ApiError;
use crate::fieldset::{self, Writer};
use crate::registry::{ResourceType, present};
use crate::shape::Shape;
use crate::target::Target;

/// The object `body` applied over `existing` (if any) by `writer` makes, ownership recorded.
pub fn desired(
    t: &Target,
    existing: Option<&Value>,
    body: &Value,
    writer: &Writer<'_>,
    force: bool,
    shape: &Shape,
) -> Result<Value, ApiError> {
    let rt = &t.rt;
    let mut applied = body.clone();
    check_kind(rt, &applied)?;
    if applied["kind"].is_null() || applied["apiVersion"].is_null() {
        return Err(ApiError::bad_request(
            "apiVersion and kind must be set in an applied configuration",
        ));
    }
    // An applied configuration may leave the name out (controllers applying only `status` do).
    let body_name = applied["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if body_name.is_empty() {
        applied["metadata"]["name"] = json!(t.name());
    } else if body_name != t.name() {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    if rt.namespaced {
        applied["metadata"]["namespace"] = json!(t.ns());
    }
    super::defaults::builtin(rt, &mut applied, false);
    if let Some(old) = existing {
        precondition(rt, t.name(), old, &applied)?;
    }
    if existing.is_none() && t.sub.is_some() {
        return Err(ApiError::not_found(rt, t.name()));
    }
    let merged = fieldset::apply(existing, &applied, writer, force, shape, rt.status)
        .map_err(|c| conflict_error(rt, t.name(), &c))?;
    let mut merged = present(rt, merged);
    if existing.is_none() {
        merged["metadata"]["name"] = json!(t.name());
        if rt.namespaced {
            merged["metadata"]["namespace"] = json!(t.ns());
        }
    }
    Ok(merged)
}

fn conflict_error(rt: &ResourceType, name: &str, conflicts: &[fieldset::Conflict]) -> ApiError {
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| {
            format!(
                "conflict with \"{}\" using {}: {}",
                c.manager, c.api_version, c.field
            )
        })
        .collect();
    let message = if conflicts.len() == 1 {
        format!("Apply failed with 1 conflict: {}", lines[0])
    } else {
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\" using {}", c.manager, c.api_version), "field": c.field}))
        .collect();
    ApiError {
        details: Some(json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": causes})),
        ..ApiError::new(409, "Conflict", message)
    }
}
