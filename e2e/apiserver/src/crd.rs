//! CustomResourceDefinitions: turning one into served types, and the status a real API server gives it
//! once its names are accepted (`Established` is immediate here: there is no controller to wait for).

use serde_json::{Value, json};

use crate::error::{ApiError, Cause};
use crate::registry::{PrinterColumn, Registry, ResKey, ResourceType, ScalePaths};

/// The storage bucket of a CRD's resources.
pub fn res_key(crd: &Value) -> ResKey {
    ResKey {
        group: crd["spec"]["group"].as_str().unwrap_or_default().to_string(),
        plural: crd["spec"]["names"]["plural"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// The served types of a CRD, one per served version.
pub fn types(crd: &Value) -> Vec<ResourceType> {
    let spec = &crd["spec"];
    let names = &spec["names"];
    let kind = names["kind"].as_str().unwrap_or_default();
    let mut out = vec![];
    for v in spec["versions"].as_array().into_iter().flatten() {
        if v["served"] == json!(false) {
            continue;
        }
        let scale = &v["subresources"]["scale"];
        let plural = names["plural"].as_str().unwrap_or_default();
        out.push(ResourceType {
            group: spec["group"].as_str().unwrap_or_default().into(),
            version: v["name"].as_str().unwrap_or_default().into(),
            kind: kind.into(),
            plural: plural.into(),
            singular: names["singular"]
                .as_str()
                .map(String::from)
                .unwrap_or_else(|| kind.to_lowercase()),
            namespaced: spec["scope"].as_str() != Some("Cluster"),
            short_names: strings(&names["shortNames"]),
            categories: strings(&names["categories"]),
            status: v["subresources"]["status"].is_object(),
            scale: scale.is_object().then(|| ScalePaths {
                spec_replicas: scale["specReplicasPath"]
                    .as_str()
                    .unwrap_or(".spec.replicas")
                    .into(),
                status_replicas: scale["statusReplicasPath"]
                    .as_str()
                    .unwrap_or(".status.replicas")
                    .into(),
                label_selector: scale["labelSelectorPath"].as_str().map(String::from),
            }),
            schema: v["schema"]["openAPIV3Schema"]
                .as_object()
                .map(|o| Value::Object(o.clone())),
            printer_columns: v["additionalPrinterColumns"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| PrinterColumn {
                    name: c["name"].as_str().unwrap_or_default().into(),
                    type_: c["type"].as_str().unwrap_or("string").into(),
                    json_path: c["jsonPath"].as_str().unwrap_or_default().into(),
                    description: c["description"].as_str().unwrap_or_default().into(),
                    priority: c["priority"].as_i64().unwrap_or(0),
                })
                .collect(),
            generation: true,
            custom: true,
            storage: v["storage"] == json!(true),
        });
    }
    out
}

/// Makes the registry serve exactly the CRD's current versions.
pub fn register(registry: &mut Registry, crd: &Value) {
    registry.remove(&res_key(crd));
    for t in types(crd) {
        registry.upsert(t);
    }
}

/// Checks what kube-apiserver checks first: the name is `plural.group` and the names are set.
pub fn validate(rt: &ResourceType, crd: &Value) -> Result<(), ApiError> {
    let key = res_key(crd);
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    let mut causes = vec![];
    if key.group.is_empty() {
        causes.push(Cause::new("FieldValueRequired", "spec.group", "Required value"));
    }
    if key.plural.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.plural",
            "Required value",
        ));
    }
    if crd["spec"]["names"]["kind"]
        .as_str()
        .unwrap_or_default()
        .is_empty()
    {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.names.kind",
            "Required value",
        ));
    }
    if name != format!("{}.{}", key.plural, key.group) {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let versions = crd["spec"]["versions"].as_array().cloned().unwrap_or_default();
    if versions.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            "spec.versions",
            "Required value: must have exactly one version marked as storage version",
        ));
    } else if versions.iter().filter(|v| v["storage"] == json!(true)).count() != 1 {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        ));
    }
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt, name, causes))
    }
}

/// The status of an accepted CRD: names accepted, established, stored versions.
pub fn accepted_status(crd: &Value, now: &str) -> Value {
    let stored: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == json!(true))
        .map(|v| v["name"].clone())
        .collect();
    let mut previous = crd["status"]["storedVersions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for s in stored {
        if !previous.contains(&s) {
            previous.push(s);
        }
    }
    json!({
        "acceptedNames": crd["spec"]["names"],
        "storedVersions": previous,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    })
}
