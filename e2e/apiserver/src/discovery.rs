//! Legacy discovery (`/api`, `/apis`, `/apis/{g}`, `/apis/{g}/{v}`) and `/version`. Clients that ask for
//! aggregated discovery (apidiscovery.k8s.io/v2) also accept plain JSON and fall back to these documents.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::Registry;

/// Kubernetes version reported by `/version`.
pub const KUBERNETES_VERSION: &str = "v1.32.0";

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": KUBERNETES_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.23.0", "compiler": "gc", "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn api_versions(addr: SocketAddr) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string()}]})
}

fn group_doc(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({"name": name, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// Local groups, then groups served by aggregated APIServices (`extra`: group, version).
fn all_groups(registry: &Registry, extra: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let mut groups = registry.groups();
    for (g, v) in extra {
        match groups.iter_mut().find(|(name, _)| name == g) {
            Some((_, vs)) if !vs.contains(v) => vs.push(v.clone()),
            Some(_) => {}
            None => groups.push((g.clone(), vec![v.clone()])),
        }
    }
    groups
}

/// `/apis`.
pub fn group_list(registry: &Registry, extra: &[(String, String)]) -> Value {
    let groups: Vec<Value> = all_groups(registry, extra)
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/{group}`.
pub fn group(registry: &Registry, extra: &[(String, String)], name: &str) -> Result<Value, ApiError> {
    let (g, vs) = all_groups(registry, extra)
        .into_iter()
        .find(|(g, _)| g == name)
        .ok_or_else(|| ApiError::no_route(&format!("/apis/{name}")))?;
    let mut doc = group_doc(&g, &vs);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Ok(doc)
}

/// `/api/v1`, `/apis/{group}/{version}`.
pub fn resource_list(registry: &Registry, group: &str, version: &str) -> Result<Value, ApiError> {
    let types: Vec<_> = registry
        .all()
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    if types.is_empty() {
        return Err(ApiError::no_route(&gv));
    }
    let mut resources = vec![];
    for t in types {
        let mut r = json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind, "verbs": VERBS,
            "storageVersionHash": format!("{:x}", fxhash(&format!("{}/{}", t.group, t.plural))),
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        if t.status {
            resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced, "kind": t.kind, "verbs": ["get", "patch", "update"]}));
        }
        if t.scale.is_some() {
            resources.push(json!({"name": format!("{}/scale", t.plural), "singularName": "", "namespaced": t.namespaced, "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}));
        }
    }
    Ok(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

/// A small stable hash (FNV-1a), for version hashes and OpenAPI cache keys.
pub fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf29ce484222325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100000001b3)
    })
}
