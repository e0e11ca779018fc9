//! `meta.k8s.io/v1` Tables, which `kubectl get` asks for: a Name column, the type's printer columns
//! (CRD `additionalPrinterColumns`), and Age.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::registry::ResourceType;
use crate::request::Req;

/// Whether the client asked for a Table.
pub fn wants_table(req: &Req) -> bool {
    req.accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// The column definitions of a type.
pub fn columns(rt: &ResourceType) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    for c in &rt.printer_columns {
        cols.push(json!({"name": c.name, "type": c.type_, "format": "", "description": c.description, "priority": c.priority}));
    }
    if !rt.printer_columns.iter().any(|c| c.name == "Age") {
        cols.push(json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    }
    cols
}

/// One row for an object.
pub fn row(rt: &ResourceType, obj: &Value, include: &str, now: DateTime<Utc>) -> Value {
    let mut cells = vec![obj["metadata"]["name"].clone()];
    for c in &rt.printer_columns {
        let v = json_path(obj, &c.json_path);
        cells.push(match (c.type_.as_str(), v) {
            ("date", Some(Value::String(t))) => json!(age(&t, now)),
            (_, Some(v)) => v,
            (_, None) => Value::Null,
        });
    }
    if !rt.printer_columns.iter().any(|c| c.name == "Age") {
        cells.push(json!(
            obj["metadata"]["creationTimestamp"]
                .as_str()
                .map(|t| age(t, now))
                .unwrap_or_else(|| "<unknown>".into())
        ));
    }
    let object = match include {
        "None" => Value::Null,
        "Object" => obj.clone(),
        _ => {
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
        }
    };
    json!({"cells": cells, "object": object})
}

/// A Table for one object, when asked for.
pub fn maybe_single(rt: &ResourceType, obj: &Value, req: &Req) -> Option<Value> {
    maybe_list(rt, std::slice::from_ref(obj), req, 0, None).map(|mut t| {
        if let Some(m) = t["metadata"].as_object_mut() {
            m.remove("resourceVersion");
        }
        t
    })
}

/// A Table for a list, when asked for.
pub fn maybe_list(
    rt: &ResourceType,
    items: &[Value],
    req: &Req,
    rv: u64,
    cont: Option<&str>,
) -> Option<Value> {
    if !wants_table(req) {
        return None;
    }
    let include = req.q("includeObject").unwrap_or("Metadata");
    let now = req.now;
    let rows: Vec<Value> = items.iter().map(|o| row(rt, o, include, now)).collect();
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    Some(
        json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns(rt), "rows": rows}),
    )
}

/// kubectl's short durations: `45s`, `3m2s`, `2h`, `4d`.
pub fn age(timestamp: &str, now: DateTime<Utc>) -> String {
    let Ok(t) = DateTime::parse_from_rfc3339(timestamp) else {
        return "<invalid>".into();
    };
    let s = (now - t.with_timezone(&Utc)).num_seconds().max(0);
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The subset of JSONPath printer columns use: `.a.b`, `.a[0].b`, `.a[?(@.type=="Ready")].status`.
pub fn json_path(obj: &Value, path: &str) -> Option<Value> {
    let mut cur = obj.clone();
    let mut rest = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('.');
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']')?;
            let inner = &r[..end];
            rest = r[end + 1..].trim_start_matches('.');
            if let Some(filter) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let (field, want) = filter.split_once("==")?;
                let want = want.trim().trim_matches('"').trim_matches('\'');
                cur = cur
                    .as_array()?
                    .iter()
                    .find(|i| i.get(field.trim()).and_then(Value::as_str) == Some(want))?
                    .clone();
            } else {
                cur = cur.get(inner.parse::<usize>().ok()?)?.clone();
            }
            continue;
        }
        let end = rest.find(['.', '[']).unwrap_or(rest.len());
        cur = cur.get(&rest[..end])?.clone();
        rest = rest[end..].trim_start_matches('.');
    }
    Some(cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printer_column_paths_follow_filters_and_indexes() {
        let obj =
            json!({"status": {"conditions": [{"type": "Ready", "status": "True"}], "list": [{"a": 1}]}});
        assert_eq!(
            json_path(&obj, r#".status.conditions[?(@.type=="Ready")].status"#),
            Some(json!("True"))
        );
        assert_eq!(json_path(&obj, ".status.list[0].a"), Some(json!(1)));
        assert_eq!(json_path(&obj, ".status.missing"), None);
    }

    #[test]
    fn ages_read_like_kubectl() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T01:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(age("2026-01-01T00:59:15Z", now), "45s");
        assert_eq!(age("2026-01-01T00:57:00Z", now), "3m0s");
        assert_eq!(age("2025-12-28T01:00:00Z", now), "4d");
    }
}
