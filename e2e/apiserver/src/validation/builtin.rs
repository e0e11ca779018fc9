//! The checks of built-in kinds an operator's generated objects most often trip on in a real cluster:
//! pods need containers with names and images (names unique), and a Deployment's selector must select
//! its own template.

use serde_json::Value;

use crate::error::Cause;
use crate::registry::ResourceType;
use crate::selectors::LabelSelector;

/// Causes for a built-in object, empty when it passes.
pub fn check(rt: &ResourceType, obj: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => pod_spec(&obj["spec"], "spec", &mut causes),
        ("apps", "deployments") => {
            let spec = &obj["spec"];
            let selector = &spec["selector"];
            if !selector.is_object() {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    "spec.selector",
                    "Required value",
                ));
            } else if let Ok(sel) = LabelSelector::from_object(selector) {
                let labels = spec["template"]["metadata"].get("labels");
                let empty = selector["matchLabels"].as_object().is_none_or(|m| m.is_empty())
                    && selector["matchExpressions"]
                        .as_array()
                        .is_none_or(|m| m.is_empty());
                if empty {
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        "spec.selector",
                        "Invalid value: \"null\": empty selector is invalid for deployment",
                    ));
                } else if !sel.matches(labels) {
                    let shown = labels
                        .map(go_map)
                        .unwrap_or_else(|| "map[string]string(nil)".into());
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        "spec.template.metadata.labels",
                        format!("Invalid value: {shown}: `selector` does not match template `labels`"),
                    ));
                }
            }
            pod_spec(&spec["template"]["spec"], "spec.template.spec", &mut causes);
        }
        _ => {}
    }
    causes
}

fn go_map(labels: &Value) -> String {
    let parts: Vec<String> = labels
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{:?}:{:?}", k, v.as_str().unwrap_or_default()))
        .collect();
    format!("map[string]string{{{}}}", parts.join(", "))
}

fn pod_spec(spec: &Value, path: &str, causes: &mut Vec<Cause>) {
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    if containers.is_empty() {
        causes.push(Cause::new(
            "FieldValueRequired",
            format!("{path}.containers"),
            "Required value",
        ));
    }
    let mut seen: Vec<String> = vec![];
    for key in ["initContainers", "containers"] {
        for (i, c) in spec[key].as_array().into_iter().flatten().enumerate() {
            let at = format!("{path}.{key}[{i}]");
            match c["name"].as_str().filter(|n| !n.is_empty()) {
                None => causes.push(Cause::new(
                    "FieldValueRequired",
                    format!("{at}.name"),
                    "Required value",
                )),
                Some(n) if seen.iter().any(|s| s == n) => causes.push(Cause::new(
                    "FieldValueDuplicate",
                    format!("{at}.name"),
                    format!("Duplicate value: \"{n}\""),
                )),
                Some(n) => seen.push(n.to_string()),
            }
            if c["image"].as_str().is_none_or(str::is_empty) {
                causes.push(Cause::new(
                    "FieldValueRequired",
                    format!("{at}.image"),
                    "Required value",
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_deployment_whose_selector_misses_its_template_is_invalid() {
        let rt = ResourceType::builtin("apps", "v1", "Deployment", "deployments", true);
        let d = json!({"spec": {"selector": {"matchLabels": {"app": "a"}}, "template": {"metadata": {"labels": {"app": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i"}, {"name": "c"}]}}}});
        let fields: Vec<String> = check(&rt, &d)
            .into_iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        assert_eq!(
            fields,
            [
                "spec.template.metadata.labels: Invalid value: map[string]string{\"app\":\"b\"}: `selector` does not match template `labels`",
                "spec.template.spec.containers[1].name: Duplicate value: \"c\"",
                "spec.template.spec.containers[1].image: Required value",
            ]
        );
    }
}
