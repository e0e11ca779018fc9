//! The defaults kube-apiserver gives built-in kinds that Sluice's code reads back.

use serde_json::{Value, json};

use crate::registry::ResourceType;
use crate::store::ns_name;

/// The few defaults built-in kinds get that Sluice's code reads back. `all: false` fills in only the
/// defaults of list-map keys (`protocol`), which an applied configuration needs to be merged correctly.
pub fn builtin(rt: &ResourceType, obj: &mut Value, all: bool) {
    if rt.custom {
        return;
    }
    // `get_mut` chains, never `obj["a"]["b"]` writes: indexing would invent the missing levels.
    fn default_protocols(ports: Option<&mut Value>) {
        for p in ports.and_then(Value::as_array_mut).into_iter().flatten() {
            if p.get("protocol").is_none_or(Value::is_null)
                && let Some(m) = p.as_object_mut()
            {
                m.insert("protocol".into(), json!("TCP"));
            }
        }
    }
    fn default_pod_spec(spec: Option<&mut Value>) {
        let Some(spec) = spec else { return };
        for key in ["containers", "initContainers"] {
            for c in spec
                .get_mut(key)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                default_protocols(c.get_mut("ports"));
            }
        }
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            default_pod_spec(obj.get_mut("spec"));
            // No kubelet or scheduler here: a new pod is Pending until someone writes its status.
            let no_phase = obj
                .get("status")
                .and_then(|s| s.get("phase"))
                .is_none_or(Value::is_null);
            if all
                && no_phase
                && let Some(o) = obj.as_object_mut()
                && let Some(st) = o.entry("status").or_insert_with(|| json!({})).as_object_mut()
            {
                st.insert("phase".into(), json!("Pending"));
            }
        }
        ("apps", "deployments") => {
            let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
                return;
            };
            if all && !spec.contains_key("replicas") {
                spec.insert("replicas".into(), json!(1));
            }
            default_pod_spec(spec.get_mut("template").and_then(|t| t.get_mut("spec")));
        }
        ("", "secrets") => {
            fold_string_data(obj);
            if all
                && obj.get("type").is_none_or(Value::is_null)
                && let Some(o) = obj.as_object_mut()
            {
                o.insert("type".into(), json!("Opaque"));
            }
        }
        ("", "services") => {
            default_protocols(obj.get_mut("spec").and_then(|s| s.get_mut("ports")));
            if !all {
                return;
            }
            let (ns, name) = ns_name(obj);
            let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
                return;
            };
            let type_ = spec.entry("type").or_insert_with(|| json!("ClusterIP")).clone();
            if type_ != "ExternalName" && spec.get("clusterIP").is_none_or(Value::is_null) {
                // A stable address per service name, from the default service CIDR 10.96.0.0/12.
                let h = crate::discovery::fxhash(&format!("{ns}/{name}"));
                let ip = format!("10.96.{}.{}", (h >> 8) & 0xff, (h & 0xfe).max(2));
                spec.insert("clusterIP".into(), json!(ip));
                spec.insert("clusterIPs".into(), json!([ip]));
            }
        }
        _ => {}
    }
}

/// As kube-apiserver does on every write: `stringData` is write-only, merged into `data` (base64, winning
/// over a `data` key of the same name) and dropped.
fn fold_string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(o) = obj.as_object_mut() else { return };
    let Some(Value::Object(plain)) = o.remove("stringData") else {
        return;
    };
    let data = o.entry("data").or_insert_with(|| json!({}));
    if data.is_null() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in plain {
            let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
            data.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(text)));
        }
    }
}
