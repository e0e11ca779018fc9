//! The `/scale` subresource: an `autoscaling/v1` `Scale` view of `.spec.replicas`/`.status.replicas`.

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::ResourceType;

fn path(p: &str) -> Vec<&str> {
    p.trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
        .collect()
}

fn read<'a>(obj: &'a Value, p: &str) -> Option<&'a Value> {
    path(p).into_iter().try_fold(obj, |cur, seg| cur.get(seg))
}

fn write(obj: &mut Value, p: &str, v: Value) {
    let mut cur = obj;
    for seg in path(p) {
        cur = &mut cur[seg];
    }
    *cur = v;
}

/// The Scale of an object.
pub fn to_scale(rt: &ResourceType, obj: &Value) -> Value {
    let Some(paths) = &rt.scale else {
        return Value::Null;
    };
    let m = &obj["metadata"];
    let selector = match &paths.label_selector {
        Some(p) => read(obj, p).cloned().unwrap_or(Value::Null),
        None => obj["spec"]["selector"]["matchLabels"]
            .as_object()
            .map(|l| {
                json!(
                    l.iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join(",")
                )
            })
            .unwrap_or(Value::Null),
    };
    let mut status = json!({"replicas": read(obj, &paths.status_replicas).cloned().unwrap_or(json!(0))});
    if !selector.is_null() {
        status["selector"] = selector;
    }
    json!({
        "apiVersion": "autoscaling/v1",
        "kind": "Scale",
        "metadata": {"name": m["name"], "namespace": m["namespace"], "uid": m["uid"], "resourceVersion": m["resourceVersion"], "creationTimestamp": m["creationTimestamp"]},
        "spec": {"replicas": read(obj, &paths.spec_replicas).cloned().unwrap_or(json!(0))},
        "status": status,
    })
}

/// The object with the Scale's `spec.replicas` written back.
pub fn from_scale(rt: &ResourceType, old: &Value, scale: &Value) -> Result<Value, ApiError> {
    let Some(paths) = &rt.scale else {
        return Err(ApiError::no_route("scale"));
    };
    let replicas = scale["spec"]["replicas"]
        .as_i64()
        .ok_or_else(|| ApiError::bad_request("spec.replicas is required"))?;
    if replicas < 0 {
        return Err(ApiError::new(
            422,
            "Invalid",
            "spec.replicas: Invalid value: must be greater than or equal to 0",
        ));
    }
    let mut obj = old.clone();
    write(&mut obj, &paths.spec_replicas, json!(replicas));
    if let Some(rv) = scale["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
        && Some(rv) != old["metadata"]["resourceVersion"].as_str()
    {
        return Err(ApiError::stale(
            rt,
            old["metadata"]["name"].as_str().unwrap_or_default(),
        ));
    }
    Ok(obj)
}
