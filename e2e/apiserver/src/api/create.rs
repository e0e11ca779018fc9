//! CREATE (POST): the object as sent, in the namespace of the path, named or given a generated name.

use serde_json::{Value, json};

use super::checks::check_kind;
use crate::error::{ApiError, Cause};
use crate::registry::present;
use crate::store::Store;
use crate::target::Target;

/// The object a POST asks for, before the server-side rules; refused if the name is taken.
pub fn desired(store: &Store, t: &Target, body: &Value) -> Result<Value, ApiError> {
    let rt = &t.rt;
    let mut obj = body.clone();
    check_kind(rt, &obj)?;
    obj = present(rt, obj);
    if rt.namespaced {
        let body_ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
        if !body_ns.is_empty() && body_ns != t.ns() {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        obj["metadata"]["namespace"] = json!(t.ns());
    }
    if obj["metadata"]["name"].as_str().unwrap_or_default().is_empty() {
        match obj["metadata"]["generateName"].as_str() {
            Some(prefix) if !prefix.is_empty() => {
                obj["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix()))
            }
            _ => {
                return Err(ApiError::invalid(
                    rt,
                    "",
                    vec![Cause::new(
                        "FieldValueRequired",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    )],
                ));
            }
        }
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    if store.get(&rt.key(), t.ns(), &name).is_some() {
        return Err(ApiError::already_exists(rt, &name));
    }
    Ok(obj)
}

/// Five characters for `generateName`, from kube-apiserver's alphabet.
fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let id = uuid::Uuid::now_v7();
    id.as_bytes()[10..15]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}
