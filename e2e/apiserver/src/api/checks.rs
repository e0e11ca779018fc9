//! Checks the writes share: the kind and apiVersion of a body, preconditions, object names.

use serde_json::Value;

use crate::error::{ApiError, Cause};
use crate::registry::ResourceType;

/// The body's `kind` and `apiVersion` group, if given, are the path's.
pub fn check_kind(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if let Some(k) = obj["kind"].as_str()
        && k != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    if let Some(av) = obj["apiVersion"].as_str() {
        let (g, _) = crate::registry::split_api_version(av);
        if g != rt.group {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
    }
    Ok(())
}

/// A `resourceVersion` or `uid` in the body must be the stored object's.
pub fn precondition(rt: &ResourceType, name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    if let Some(want) = new["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
        && Some(want) != old["metadata"]["resourceVersion"].as_str()
    {
        return Err(ApiError::stale(rt, name));
    }
    if let Some(want) = new["metadata"]["uid"].as_str().filter(|s| !s.is_empty())
        && Some(want) != old["metadata"]["uid"].as_str()
    {
        return Err(ApiError::conflict(
            rt,
            name,
            "Precondition failed: UID in precondition does not match the object",
        ));
    }
    Ok(())
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

/// `metadata.name` is a DNS subdomain (a DNS label for Namespaces and Services).
pub fn validate_name(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let label_like = rt.plural == "namespaces" || rt.plural == "services";
    let ok = if label_like {
        is_dns_subdomain(name) && !name.contains('.') && name.len() <= 63
    } else {
        is_dns_subdomain(name)
    };
    if ok {
        return Ok(());
    }
    let what = if label_like {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    } else {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    };
    Err(ApiError::invalid(
        rt,
        name,
        vec![Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": {what}"),
        )],
    ))
}
