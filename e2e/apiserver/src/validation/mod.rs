//! Validation of custom resources against their CRD's `openAPIV3Schema`, in kube-apiserver's order:
//! defaults, pruning of unknown fields, structural checks, then `x-kubernetes-validations` (CEL).

pub mod builtin;
pub mod cel;
pub mod schema;

use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::registry::ResourceType;

/// How unknown fields are treated (`fieldValidation` query parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Dropped silently.
    Ignore,
    /// Dropped, with a warning.
    #[default]
    Warn,
    /// Rejected with 400.
    Strict,
}

impl FieldValidation {
    /// From the query parameter.
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Strict") => FieldValidation::Strict,
            Some("Ignore") => FieldValidation::Ignore,
            _ => FieldValidation::Warn,
        }
    }
}

/// Defaults, prunes and validates a custom resource in place. Returns warnings (pruned fields).
pub fn custom_resource(
    rt: &ResourceType,
    obj: &mut Value,
    old: Option<&Value>,
    fv: FieldValidation,
) -> Result<Vec<String>, ApiError> {
    let Some(schema) = &rt.schema else {
        return Ok(vec![]);
    };
    *obj = kube_cel::apply_defaults(schema, obj);
    let unknown = schema::prune(schema, obj);
    if fv == FieldValidation::Strict && !unknown.is_empty() {
        let list: Vec<String> = unknown.iter().map(|f| format!("unknown field \"{f}\"")).collect();
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            list.join(", ")
        )));
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let mut causes: Vec<Cause> = schema::check(schema, obj);
    // Like kube-apiserver, CEL rules run alongside the structural checks, unless a value has the wrong
    // type (rules would then fail for reasons the user did not write).
    if !causes.iter().any(|c| c.reason == "FieldValueTypeInvalid") {
        causes.extend(cel::check(rt, schema, obj, old));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid(rt, &name, causes));
    }
    Ok(unknown
        .into_iter()
        .map(|f| format!("unknown field \"{f}\""))
        .collect())
}
