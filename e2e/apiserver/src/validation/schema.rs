//! Structural schema checks (type, required, enum, bounds, lengths, pattern, item counts) and pruning of
//! fields the schema does not declare, worded as kube-apiserver words them.

use serde_json::Value;

use crate::error::Cause;

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

fn preserves(schema: &Value) -> bool {
    schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
}

/// Drops undeclared fields and nulls of non-nullable fields; returns the dropped paths.
pub fn prune(schema: &Value, obj: &mut Value) -> Vec<String> {
    let mut dropped = vec![];
    if let Some(m) = obj.as_object_mut() {
        let props = schema.get("properties").and_then(Value::as_object);
        let keys: Vec<String> = m.keys().cloned().collect();
        for k in keys {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match props.and_then(|p| p.get(&k)) {
                Some(sub) => prune_at(sub, m.get_mut(&k).expect("key listed above"), &k, &mut dropped),
                None if !preserves(schema) => {
                    m.remove(&k);
                    dropped.push(k);
                }
                None => {}
            }
        }
    }
    dropped
}

fn prune_at(schema: &Value, v: &mut Value, path: &str, dropped: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let child = join(path, &k);
                if m[&k].is_null() {
                    let nullable = props.and_then(|p| p.get(&k)).and_then(|s| s.get("nullable"))
                        == Some(&Value::Bool(true));
                    if !nullable {
                        m.remove(&k);
                        continue;
                    }
                }
                if let Some(sub) = props.and_then(|p| p.get(&k)).or(additional) {
                    prune_at(sub, m.get_mut(&k).expect("key listed above"), &child, dropped);
                } else {
                    let embedded_meta = schema.get("x-kubernetes-embedded-resource")
                        == Some(&Value::Bool(true))
                        && matches!(k.as_str(), "apiVersion" | "kind" | "metadata");
                    let declares =
                        props.is_some() || schema.get("type").and_then(Value::as_str) == Some("object");
                    if preserves(schema) || embedded_meta || !declares {
                        continue;
                    }
                    m.remove(&k);
                    dropped.push(child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_at(sub, item, &format!("{path}[{i}]"), dropped);
                }
            }
        }
        _ => {}
    }
}

/// `Invalid value: "string"`-style rendering of a value.
pub fn render(v: &Value) -> String {
    match v {
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Structural checks of the whole object (metadata excluded).
pub fn check(schema: &Value, obj: &Value) -> Vec<Cause> {
    let mut causes = vec![];
    if let Some(m) = obj.as_object() {
        let props = schema.get("properties").and_then(Value::as_object);
        for req in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !m.contains_key(req) {
                causes.push(Cause::new("FieldValueRequired", req, "Required value"));
            }
        }
        for (k, v) in m {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(sub) = props.and_then(|p| p.get(k)) {
                check_at(sub, v, k, &mut causes);
            }
        }
    }
    causes
}

fn check_at(schema: &Value, v: &Value, path: &str, causes: &mut Vec<Cause>) {
    if v.is_null() {
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let got = type_name(v);
        let ok = got == t
            || (t == "number" && got == "integer")
            || (t == "integer" && v.as_f64().is_some_and(|f| f.fract() == 0.0))
            || (int_or_string && matches!(got, "integer" | "string"));
        if !ok {
            causes.push(Cause::new(
                "FieldValueTypeInvalid",
                path,
                format!("Invalid value: \"{got}\": {path} in body must be of type {t}: \"{got}\""),
            ));
            return;
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(v)
    {
        let supported: Vec<String> = options.iter().map(Value::to_string).collect();
        causes.push(Cause::new(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {}: supported values: {}",
                v,
                supported.join(", ")
            ),
        ));
    }
    if let Some(n) = v.as_f64() {
        let exclusive_min = schema.get("exclusiveMinimum") == Some(&Value::Bool(true));
        let exclusive_max = schema.get("exclusiveMaximum") == Some(&Value::Bool(true));
        if let Some(min) = schema.get("minimum").and_then(Value::as_f64)
            && (n < min || (exclusive_min && n == min))
        {
            let word = if exclusive_min {
                "greater than"
            } else {
                "greater than or equal to"
            };
            causes.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {v}: {path} in body should be {word} {}",
                    fmt_num(min)
                ),
            ));
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_f64)
            && (n > max || (exclusive_max && n == max))
        {
            let word = if exclusive_max {
                "less than"
            } else {
                "less than or equal to"
            };
            causes.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!(
                    "Invalid value: {v}: {path} in body should be {word} {}",
                    fmt_num(max)
                ),
            ));
        }
    }
    if let Some(s) = v.as_str() {
        let len = s.chars().count() as u64;
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
            && len < min
        {
            causes.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!("Invalid value: {v}: {path} in body should be at least {min} chars long"),
            ));
        }
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
            && len > max
        {
            causes.push(Cause::new(
                "FieldValueTooLong",
                path,
                format!("Too long: may not be more than {max} bytes"),
            ));
        }
        if let Some(p) = schema.get("pattern").and_then(Value::as_str)
            && let Ok(re) = regex::Regex::new(p)
            && !re.is_match(s)
        {
            causes.push(Cause::new(
                "FieldValueInvalid",
                path,
                format!("Invalid value: {v}: {path} in body should match '{p}'"),
            ));
        }
    }
    match v {
        Value::Object(m) => {
            for req in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                if !m.contains_key(req) {
                    causes.push(Cause::new(
                        "FieldValueRequired",
                        join(path, req),
                        "Required value",
                    ));
                }
            }
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, c) in m {
                if let Some(sub) = props.and_then(|p| p.get(k)).or(additional) {
                    check_at(sub, c, &join(path, k), causes);
                }
            }
            if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
                && m.len() as u64 > max
            {
                causes.push(Cause::new(
                    "TooMany",
                    path,
                    format!("Too many: {}: must have at most {max} items", m.len()),
                ));
            }
        }
        Value::Array(items) => {
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                causes.push(Cause::new(
                    "FieldValueInvalid",
                    path,
                    format!(
                        "Invalid value: {}: {path} in body should have at least {min} items",
                        items.len()
                    ),
                ));
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                causes.push(Cause::new(
                    "TooMany",
                    path,
                    format!("Too many: {}: must have at most {max} items", items.len()),
                ));
            }
            if let Some(sub) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check_at(sub, item, &format!("{path}[{i}]"), causes);
                }
            }
        }
        _ => {}
    }
}

fn fmt_num(n: f64) -> String {
    if n.fract() == 0.0 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["limit"], "properties": {
            "limit": {"type": "integer", "minimum": 1},
            "mode": {"type": "string", "enum": ["open", "closed"]},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }}}})
    }

    #[test]
    fn a_value_below_minimum_is_reported_as_kube_apiserver_words_it() {
        let causes = check(&schema(), &json!({"spec": {"limit": 0}}));
        assert_eq!(
            causes,
            vec![Cause::new(
                "FieldValueInvalid",
                "spec.limit",
                "Invalid value: 0: spec.limit in body should be greater than or equal to 1"
            )]
        );
    }

    #[test]
    fn missing_required_fields_and_unsupported_enum_values_are_reported() {
        let causes = check(&schema(), &json!({"spec": {"mode": "half"}}));
        assert_eq!(causes.len(), 2);
        assert_eq!(causes[0].field, "spec.limit");
        assert!(causes[1].message.starts_with("Unsupported value: \"half\""));
    }

    #[test]
    fn undeclared_fields_are_pruned_unless_preserved() {
        let mut obj =
            json!({"apiVersion": "x/v1", "spec": {"limit": 1, "bogus": 1, "free": {"any": 1}}, "extra": 1});
        let dropped = prune(&schema(), &mut obj);
        assert_eq!(dropped, vec!["extra".to_string(), "spec.bogus".to_string()]);
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "spec": {"limit": 1, "free": {"any": 1}}})
        );
    }
}
