//! `x-kubernetes-validations` rules, evaluated with kube-cel (the Kubernetes CEL library on the `cel`
//! crate). Rules this evaluator cannot compile or does not support are skipped with a warning rather than
//! rejecting objects a real API server would accept.

use kube_cel::{ErrorKind, RootContext, Validator};
use serde_json::Value;

use crate::error::Cause;
use crate::registry::ResourceType;

/// Causes for every failed rule.
pub fn check(rt: &ResourceType, schema: &Value, obj: &Value, old: Option<&Value>) -> Vec<Cause> {
    let root = RootContext {
        api_version: rt.api_version(),
        api_group: rt.group.clone(),
        kind: rt.kind.clone(),
    };
    let Err(errors) = Validator::new().validate_with_context(schema, obj, old, Some(&root)) else {
        return vec![];
    };
    let mut causes = vec![];
    for e in errors.into_vec() {
        match e.kind {
            ErrorKind::CompilationFailure | ErrorKind::UnsupportedReference | ErrorKind::InvalidRule => {
                tracing::warn!(rule = %e.rule, message = %e.message, "CEL rule skipped: this evaluator cannot run it");
            }
            _ => {
                let field = e.field_path.trim_start_matches('.').to_string();
                // kube-apiserver shows the schema type where a rule failed, not the value.
                let at = Value::String(type_name(&field_value(obj, &field)).to_string());
                let message = if e.message.is_empty() {
                    format!("failed rule: {}", e.rule)
                } else {
                    e.message.clone()
                };
                let reason = e.reason.clone().unwrap_or_else(|| "FieldValueInvalid".into());
                causes.push(Cause::new(
                    &reason,
                    field,
                    format!("Invalid value: {at}: {message}"),
                ));
            }
        }
    }
    causes
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        _ => "object",
    }
}

/// The value at `spec.rules[0].limit`, or null.
fn field_value(obj: &Value, path: &str) -> Value {
    let mut cur = obj;
    for seg in path.split('.').filter(|s| !s.is_empty()) {
        let mut parts = seg.split('[');
        let name = parts.next().unwrap_or_default();
        if !name.is_empty() {
            match cur.get(name) {
                Some(v) => cur = v,
                None => return Value::Null,
            }
        }
        for index in parts {
            let index = index.trim_end_matches(']');
            let next = match index.parse::<usize>() {
                Ok(i) => cur.get(i),
                Err(_) => cur.get(index.trim_matches('\'').trim_matches('"')),
            };
            match next {
                Some(v) => cur = v,
                None => return Value::Null,
            }
        }
    }
    cur.clone()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_failing_rule_gives_its_message_at_its_field() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object",
            "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min must not exceed max"}],
            "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}}}}});
        let rt = ResourceType::builtin(
            "sluice.dev",
            "v1alpha1",
            "RateLimitPolicy",
            "ratelimitpolicies",
            true,
        );
        let causes = check(&rt, &schema, &json!({"spec": {"min": 5, "max": 1}}), None);
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].field, "spec");
        assert_eq!(
            causes[0].message,
            "Invalid value: \"object\": min must not exceed max"
        );
        assert!(check(&rt, &schema, &json!({"spec": {"min": 1, "max": 5}}), None).is_empty());
    }
}
