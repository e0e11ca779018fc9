//! OpenAPI v3 documents: enough for `kubectl apply` to see that server-side field validation is supported
//! (a PATCH operation with a `fieldValidation` parameter per kind) and for `kubectl explain` on custom
//! resources (their CRD schemas, tagged with `x-kubernetes-group-version-kind`).

use serde_json::{Map, Value, json};

use crate::discovery::fxhash;
use crate::error::ApiError;
use crate::registry::{Registry, ResourceType};

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

fn gv_paths(registry: &Registry) -> Vec<(String, String, String)> {
    let mut out = vec![("api/v1".to_string(), String::new(), "v1".to_string())];
    for (g, vs) in registry.groups() {
        for v in vs {
            out.push((format!("apis/{g}/{v}"), g.clone(), v));
        }
    }
    out
}

/// `/openapi/v3`.
pub fn index(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (p, g, v) in gv_paths(registry) {
        let doc = gv_document(registry, &g, &v);
        let hash = format!("{:016X}", fxhash(&doc.to_string()));
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash}")}),
        );
    }
    json!({"paths": paths})
}

/// `/openapi/v3/api/v1`, `/openapi/v3/apis/{g}/{v}`.
pub fn document(registry: &Registry, rest: &[&str]) -> Result<Value, ApiError> {
    match rest {
        ["api", "v1"] => Ok(gv_document(registry, "", "v1")),
        ["apis", g, v] if registry.all().iter().any(|t| t.group == *g && t.version == *v) => {
            Ok(gv_document(registry, g, v))
        }
        _ => Err(ApiError::no_route(&format!("/openapi/v3/{}", rest.join("/")))),
    }
}

/// `dev.sluice.v1alpha1.RateLimitPolicy`, `io.k8s.api.core.v1.Pod`.
pub fn schema_name(rt: &ResourceType) -> String {
    if !rt.custom {
        let g = if rt.group.is_empty() {
            "core".to_string()
        } else {
            rt.group.split('.').next().unwrap_or_default().to_string()
        };
        return format!("io.k8s.api.{g}.{}.{}", rt.version, rt.kind);
    }
    let reversed: Vec<&str> = rt.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), rt.version, rt.kind)
}

fn gvk(rt: &ResourceType) -> Value {
    json!({"group": rt.group, "version": rt.version, "kind": rt.kind})
}

fn query(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn gv_document(registry: &Registry, group: &str, version: &str) -> Value {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    schemas.insert(OBJECT_META.into(), object_meta());
    for rt in registry
        .all()
        .iter()
        .filter(|t| t.group == group && t.version == version)
    {
        let name = schema_name(rt);
        let reference = json!({"$ref": format!("#/components/schemas/{name}")});
        let ok =
            |r: &Value| json!({"200": {"description": "OK", "content": {"application/json": {"schema": r}}}});
        let op = |id: &str, params: Vec<Value>| json!({"operationId": id, "parameters": params, "responses": ok(&reference), "x-kubernetes-group-version-kind": gvk(rt)});
        let write_params = || vec![query("dryRun"), query("fieldManager"), query("fieldValidation")];
        let mut apply_params = write_params();
        apply_params.push(query("force"));
        let base = if rt.namespaced {
            format!("{}/namespaces/{{namespace}}/{}", rt.prefix(), rt.plural)
        } else {
            format!("{}/{}", rt.prefix(), rt.plural)
        };
        paths.insert(base.clone(), json!({
            "get": op(&format!("list{}", rt.kind), vec![query("labelSelector"), query("fieldSelector"), query("limit"), query("continue"), query("watch")]),
            "post": op(&format!("create{}", rt.kind), write_params()),
        }));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": op(&format!("read{}", rt.kind), vec![]),
                "put": op(&format!("replace{}", rt.kind), write_params()),
                "patch": op(&format!("patch{}", rt.kind), apply_params),
                "delete": op(&format!("delete{}", rt.kind), vec![query("propagationPolicy")]),
            }),
        );
        let mut schema = match &rt.schema {
            Some(s) => s.clone(),
            None => {
                json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "description": format!("{} is a built-in kind; this server does not describe its fields.", rt.kind)})
            }
        };
        if let Some(props) = schema
            .as_object_mut()
            .map(|o| o.entry("properties").or_insert_with(|| json!({})))
        {
            props["apiVersion"] = json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."});
            props["kind"] = json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."});
            props["metadata"] = json!({"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}], "default": {}, "description": "Standard object's metadata."});
        }
        schema["x-kubernetes-group-version-kind"] = json!([gvk(rt)]);
        schemas.insert(name, schema);
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": crate::discovery::KUBERNETES_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

fn object_meta() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    json!({
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have.",
        "properties": {
            "name": s("Name must be unique within a namespace."),
            "namespace": s("Namespace defines the space within which each name must be unique."),
            "generateName": s("GenerateName is an optional prefix used by the server to generate a unique name."),
            "uid": s("UID is the unique in time and space value for this object."),
            "resourceVersion": s("An opaque value that represents the internal version of this object."),
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state."},
            "creationTimestamp": s("CreationTimestamp is a timestamp representing the server time when this object was created."),
            "deletionTimestamp": s("DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted."),
            "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Map of string keys and values that can be used to organize and categorize objects."},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Annotations is an unstructured key value map."},
            "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set", "description": "Must be empty before the object is deleted from the registry."},
            "ownerReferences": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"], "description": "List of objects depended by this object."},
            "managedFields": {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}, "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow."},
        },
    })
}
