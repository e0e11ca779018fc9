//! How lists merge: atomically, as sets, or as maps keyed by some fields. Server-side apply and strategic
//! merge patch both need it. Custom resources say it in their schema (`x-kubernetes-list-type`,
//! `x-kubernetes-list-map-keys`); built-ins carry it in Go struct tags, copied here for the kinds Sluice uses.

use serde_json::Value;

/// How a list merges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole.
    Atomic,
    /// A set of scalars.
    Set,
    /// A map keyed by these fields of each item.
    Map(Vec<String>),
}

/// The merge shape of one resource type.
#[derive(Debug, Clone, Default)]
pub struct Shape {
    /// The CRD schema of a custom resource; `None` for built-ins.
    pub schema: Option<Value>,
}

impl Shape {
    /// Shape of a type.
    pub fn of(rt: &crate::registry::ResourceType) -> Self {
        Shape {
            schema: rt.schema.clone(),
        }
    }

    /// The list type at a path of field names (list indexes left out).
    pub fn list_type(&self, path: &[String]) -> ListType {
        if path.first().map(String::as_str) == Some("metadata") {
            return builtin(path);
        }
        match &self.schema {
            Some(schema) => schema_list_type(schema, path),
            None => builtin(path),
        }
    }
}

fn schema_at<'a>(schema: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = schema;
    for seg in path {
        while cur.get("type").and_then(Value::as_str) == Some("array") {
            cur = cur.get("items")?;
        }
        cur = match cur.get("properties").and_then(|p| p.get(seg)) {
            Some(s) => s,
            None => cur.get("additionalProperties").filter(|a| a.is_object())?,
        };
    }
    Some(cur)
}

fn schema_list_type(schema: &Value, path: &[String]) -> ListType {
    let Some(s) = schema_at(schema, path) else {
        return ListType::Atomic;
    };
    match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
        Some("set") => ListType::Set,
        Some("map") => ListType::Map(
            s.get("x-kubernetes-list-map-keys")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|k| k.as_str().map(String::from))
                .collect(),
        ),
        _ => ListType::Atomic,
    }
}

fn keys(k: &[&str]) -> ListType {
    ListType::Map(k.iter().map(|s| s.to_string()).collect())
}

/// Built-in list types by field name and context (`patchMergeKey`/`listMapKeys` in the Go types).
fn builtin(path: &[String]) -> ListType {
    let last = path.last().map(String::as_str).unwrap_or_default();
    let in_container = path.iter().any(|p| {
        matches!(
            p.as_str(),
            "containers" | "initContainers" | "ephemeralContainers"
        )
    });
    match last {
        "finalizers" if path.len() == 2 => ListType::Set,
        "ownerReferences" => keys(&["uid"]),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "webhooks"
        | "resourceClaims" => keys(&["name"]),
        "ports" if in_container => keys(&["containerPort", "protocol"]),
        "ports" => keys(&["port", "protocol"]),
        "volumeMounts" => keys(&["mountPath"]),
        "volumeDevices" => keys(&["devicePath"]),
        "conditions" => keys(&["type"]),
        "hostAliases" => keys(&["ip"]),
        "topologySpreadConstraints" => keys(&["topologyKey", "whenUnsatisfiable"]),
        _ => ListType::Atomic,
    }
}

/// Whether two list items have the same key.
pub fn same_key(a: &Value, b: &Value, keys: &[String]) -> bool {
    // Compared in place: called for every pair of items while lists merge, it must not copy them.
    keys.iter().all(|k| key_str(a, k) == key_str(b, k))
}

/// A key field as [`key_value`] has it, borrowed: `Err("TCP")` stands for the defaulted protocol.
fn key_str<'a>(item: &'a Value, key: &str) -> Option<Result<&'a Value, &'static str>> {
    match item.get(key) {
        Some(Value::String(s)) if key == "protocol" && s == "TCP" => Some(Err("TCP")),
        Some(v) if !v.is_null() => Some(Ok(v)),
        _ if key == "protocol" => Some(Err("TCP")),
        _ => None,
    }
}

/// A key field's value, with the defaults the API server fills in before comparing (`protocol: TCP`).
pub fn key_value(item: &Value, key: &str) -> Value {
    match item.get(key) {
        Some(v) if !v.is_null() => v.clone(),
        _ if key == "protocol" => Value::String("TCP".into()),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn p(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn builtin_pod_lists_merge_by_their_go_merge_keys() {
        let shape = Shape::default();
        assert_eq!(shape.list_type(&p(&["spec", "containers"])), keys(&["name"]));
        assert_eq!(
            shape.list_type(&p(&["spec", "containers", "ports"])),
            keys(&["containerPort", "protocol"])
        );
        assert_eq!(
            shape.list_type(&p(&["spec", "ports"])),
            keys(&["port", "protocol"])
        );
        assert_eq!(shape.list_type(&p(&["metadata", "finalizers"])), ListType::Set);
        assert_eq!(
            shape.list_type(&p(&["spec", "containers", "args"])),
            ListType::Atomic
        );
    }

    #[test]
    fn custom_resource_lists_follow_the_schema_markers() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "rules": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                      "items": {"type": "object", "properties": {"tags": {"type": "array", "x-kubernetes-list-type": "set"}}}}
        }}}});
        let shape = Shape { schema: Some(schema) };
        assert_eq!(shape.list_type(&p(&["spec", "rules"])), keys(&["name"]));
        assert_eq!(shape.list_type(&p(&["spec", "rules", "tags"])), ListType::Set);
        assert_eq!(shape.list_type(&p(&["spec", "other"])), ListType::Atomic);
    }
}
