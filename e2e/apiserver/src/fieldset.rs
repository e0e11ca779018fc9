//! Field ownership for server-side apply: sets of field paths per manager, stored in
//! `metadata.managedFields` as `FieldsV1` (`{"f:spec":{"f:replicas":{}}}`).
//!
//! A path is a list of path elements in FieldsV1 spelling: `f:name` a field, `k:{"name":"app"}` an item of
//! a map-list, `v:"x"` a member of a set-list, and `.` the item itself.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use crate::merge::{Flavour, merge};
use crate::shape::{ListType, Shape, key_value, same_key};

/// One field path.
pub type Path = Vec<String>;
/// A set of field paths.
pub type FieldSet = BTreeSet<Path>;

/// Server-maintained metadata nobody owns.
const UNOWNED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

/// The leaf paths an object sets. `apiVersion` and `kind` are not fields anyone owns.
pub fn fields_of(obj: &Value, shape: &Shape) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(m) = obj.as_object() {
        for (k, v) in m {
            if k == "apiVersion" || k == "kind" {
                continue;
            }
            if k == "metadata" {
                let Some(meta) = v.as_object() else { continue };
                for (mk, mv) in meta {
                    if UNOWNED_METADATA.contains(&mk.as_str()) {
                        continue;
                    }
                    walk(
                        mv,
                        &mut vec!["metadata".into(), mk.clone()],
                        &mut vec!["f:metadata".into(), format!("f:{mk}")],
                        shape,
                        &mut out,
                    );
                }
                continue;
            }
            walk(
                v,
                &mut vec![k.clone()],
                &mut vec![format!("f:{k}")],
                shape,
                &mut out,
            );
        }
    }
    out
}

fn walk(v: &Value, names: &mut Vec<String>, enc: &mut Path, shape: &Shape, out: &mut FieldSet) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, c) in m {
                names.push(k.clone());
                enc.push(format!("f:{k}"));
                walk(c, names, enc, shape, out);
                enc.pop();
                names.pop();
            }
        }
        Value::Array(items) if !items.is_empty() => match shape.list_type(names) {
            ListType::Atomic => {
                out.insert(enc.clone());
            }
            ListType::Set => {
                for i in items {
                    let mut p = enc.clone();
                    p.push(format!("v:{i}"));
                    out.insert(p);
                }
            }
            ListType::Map(keys) => {
                for item in items {
                    enc.push(item_key(item, &keys));
                    let mut me = enc.clone();
                    me.push(".".into());
                    out.insert(me);
                    if let Some(m) = item.as_object() {
                        for (k, c) in m {
                            names.push(k.clone());
                            enc.push(format!("f:{k}"));
                            walk(c, names, enc, shape, out);
                            enc.pop();
                            names.pop();
                        }
                    }
                    enc.pop();
                }
            }
        },
        _ => {
            out.insert(enc.clone());
        }
    }
}

/// `k:{"containerPort":80,"protocol":"TCP"}`: key fields in name order.
fn item_key(item: &Value, keys: &[String]) -> String {
    let mut sorted: Vec<&String> = keys.iter().collect();
    sorted.sort();
    let parts: Vec<String> = sorted
        .iter()
        .map(|k| format!("{}:{}", Value::String((*k).clone()), key_value(item, k)))
        .collect();
    format!("k:{{{}}}", parts.join(","))
}

fn parse_item_key(elem: &str) -> Option<Map<String, Value>> {
    let json = elem.strip_prefix("k:")?;
    serde_json::from_str(json).ok()
}

/// The value a path points at (`.` points at the item that holds it).
pub fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for elem in path {
        if elem == "." {
            continue;
        }
        cur = step(cur, elem)?;
    }
    Some(cur)
}

fn step<'a>(cur: &'a Value, elem: &str) -> Option<&'a Value> {
    if let Some(f) = elem.strip_prefix("f:") {
        return cur.get(f);
    }
    if let Some(keys) = parse_item_key(elem) {
        let want = Value::Object(keys.clone());
        let names: Vec<String> = keys.keys().cloned().collect();
        return cur.as_array()?.iter().find(|i| same_key(i, &want, &names));
    }
    if let Some(v) = elem.strip_prefix("v:") {
        let want: Value = serde_json::from_str(v).ok()?;
        return cur.as_array()?.iter().find(|i| **i == want);
    }
    None
}

/// Removes what a path points at (the item itself for a path ending in `.`).
pub fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let (last, parent_path) = if last == "." {
        match parent_path.split_last() {
            Some((l, p)) => (l, p),
            None => return,
        }
    } else {
        (last, parent_path)
    };
    let mut cur = obj;
    for elem in parent_path {
        let next = if let Some(f) = elem.strip_prefix("f:") {
            cur.get_mut(f)
        } else if let Some(keys) = parse_item_key(elem) {
            let want = Value::Object(keys.clone());
            let names: Vec<String> = keys.keys().cloned().collect();
            cur.as_array_mut()
                .and_then(|a| a.iter_mut().find(|i| same_key(i, &want, &names)))
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(f);
        }
    } else if let Some(keys) = parse_item_key(last) {
        let want = Value::Object(keys.clone());
        let names: Vec<String> = keys.keys().cloned().collect();
        if let Some(a) = cur.as_array_mut() {
            a.retain(|i| !same_key(i, &want, &names));
        }
    } else if let Some(v) = last.strip_prefix("v:")
        && let Ok(want) = serde_json::from_str::<Value>(v)
        && let Some(a) = cur.as_array_mut()
    {
        a.retain(|i| *i != want);
    }
}

/// `.spec.containers[name="app"].image`, as conflicts are reported.
pub fn describe(path: &[String]) -> String {
    let mut s = String::new();
    for elem in path {
        if let Some(f) = elem.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(keys) = parse_item_key(elem) {
            let parts: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = elem.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

/// The FieldsV1 tree of a set.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for elem in path {
            cur = cur
                .entry(elem.clone())
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .expect("tree nodes are objects");
        }
    }
    Value::Object(root)
}

/// The set of a FieldsV1 tree (its leaves).
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, c) in m {
                    prefix.push(k.clone());
                    go(c, prefix, out);
                    prefix.pop();
                }
            }
            _ => {
                out.insert(prefix.clone());
            }
        }
    }
    let mut out = FieldSet::new();
    go(v, &mut vec![], &mut out);
    out
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// apiVersion the manager used.
    pub api_version: String,
    /// When it last changed.
    pub time: String,
    /// `status`, `scale` or "".
    pub subresource: String,
    /// Owned fields.
    pub fields: FieldSet,
}

impl Entry {
    fn same_owner(&self, manager: &str, operation: &str, subresource: &str) -> bool {
        self.manager == manager && self.operation == operation && self.subresource == subresource
    }
}

/// The entries stored in an object.
pub fn read_entries(obj: &Value) -> Vec<Entry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| Entry {
            manager: e["manager"].as_str().unwrap_or_default().into(),
            operation: e["operation"].as_str().unwrap_or("Update").into(),
            api_version: e["apiVersion"].as_str().unwrap_or_default().into(),
            time: e["time"].as_str().unwrap_or_default().into(),
            subresource: e["subresource"].as_str().unwrap_or_default().into(),
            fields: from_fields_v1(&e["fieldsV1"]),
        })
        .collect()
}

/// Writes entries into `metadata.managedFields`, dropping empty ones.
pub fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Who is writing, for ownership bookkeeping.
#[derive(Debug, Clone)]
pub struct Writer<'a> {
    /// Field manager.
    pub manager: &'a str,
    /// apiVersion of the request.
    pub api_version: &'a str,
    /// `status`, `scale` or "".
    pub subresource: &'a str,
    /// Timestamp for the entry.
    pub time: &'a str,
}

/// Keeps only the paths a write through `subresource` may own.
fn scope(set: FieldSet, subresource: &str, has_status: bool) -> FieldSet {
    set.into_iter()
        .filter(|p| {
            let status = p.first().map(String::as_str) == Some("f:status");
            match subresource {
                "status" => status,
                _ if has_status => !status,
                _ => true,
            }
        })
        .collect()
}

/// Records a non-apply write (create, update, patch): the writer takes the fields it changed, and fields
/// that disappeared leave every manager.
pub fn record_update(old: Option<&Value>, new: &mut Value, w: &Writer<'_>, shape: &Shape, has_status: bool) {
    let mut entries = old.map(read_entries).unwrap_or_default();
    let new_set = scope(fields_of(new, shape), w.subresource, has_status);
    let old_set = old
        .map(|o| scope(fields_of(o, shape), w.subresource, has_status))
        .unwrap_or_default();
    let changed: FieldSet = new_set
        .iter()
        .filter(|p| {
            if p.last().map(String::as_str) == Some(".") {
                !old_set.contains(*p)
            } else {
                old.and_then(|o| value_at(o, p)) != value_at(new, p)
            }
        })
        .cloned()
        .collect();
    let removed: FieldSet = old_set.difference(&new_set).cloned().collect();
    for e in entries.iter_mut() {
        e.fields.retain(|p| !removed.contains(p) && !changed.contains(p));
    }
    if !changed.is_empty() {
        match entries
            .iter_mut()
            .find(|e| e.same_owner(w.manager, "Update", w.subresource))
        {
            Some(e) => {
                e.fields.extend(changed);
                e.time = w.time.into();
                e.api_version = w.api_version.into();
            }
            None => entries.push(Entry {
                manager: w.manager.into(),
                operation: "Update".into(),
                api_version: w.api_version.into(),
                time: w.time.into(),
                subresource: w.subresource.into(),
                fields: changed,
            }),
        }
    }
    write_entries(new, &entries);
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    /// The other manager.
    pub manager: String,
    /// The apiVersion it used.
    pub api_version: String,
    /// The field, as `.spec.replicas`.
    pub field: String,
}

/// Server-side apply of `applied` over `live` (or over nothing, creating). Returns the merged object with
/// its managedFields, or the conflicts when `force` is false.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    w: &Writer<'_>,
    force: bool,
    shape: &Shape,
    has_status: bool,
) -> Result<Value, Vec<Conflict>> {
    let base = live.cloned().unwrap_or_else(|| json!({}));
    let mut entries = read_entries(&base);
    let applied_set = scope(fields_of(applied, shape), w.subresource, has_status);
    let mut conflicts = vec![];
    let mut conflicting: Vec<(usize, Path)> = vec![];
    for (i, e) in entries.iter().enumerate() {
        if e.same_owner(w.manager, "Apply", w.subresource) {
            continue;
        }
        for p in applied_set.intersection(&e.fields) {
            if p.last().map(String::as_str) == Some(".") {
                continue;
            }
            if value_at(&base, p) != value_at(applied, p) {
                conflicts.push(Conflict {
                    manager: e.manager.clone(),
                    api_version: e.api_version.clone(),
                    field: describe(p),
                });
                conflicting.push((i, p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for (i, p) in conflicting {
        entries[i].fields.remove(&p);
    }
    let mut merged = base;
    let mut applied_body = applied.clone();
    if let Some(meta) = applied_body.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in UNOWNED_METADATA {
            meta.remove(*k);
        }
    }
    if w.subresource == "status" {
        let status = applied_body.get("status").cloned();
        applied_body = json!({});
        if let Some(s) = status {
            applied_body["status"] = s;
        }
    } else if has_status && let Some(m) = applied_body.as_object_mut() {
        m.remove("status");
    }
    // Merging cannot fail for apply (no directives are read).
    let _ = merge(&mut merged, &applied_body, shape, Flavour::Apply);
    let mine = entries
        .iter()
        .position(|e| e.same_owner(w.manager, "Apply", w.subresource));
    let previous = mine.map(|i| entries[i].fields.clone()).unwrap_or_default();
    let mut dropped: Vec<&Path> = previous.difference(&applied_set).collect();
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in dropped {
        let owned_elsewhere = entries
            .iter()
            .enumerate()
            .any(|(i, e)| Some(i) != mine && e.fields.contains(p));
        if !owned_elsewhere {
            remove_at(&mut merged, p);
        }
    }
    match mine {
        Some(i) => {
            entries[i].fields = applied_set;
            entries[i].time = w.time.into();
            entries[i].api_version = w.api_version.into();
        }
        None => entries.push(Entry {
            manager: w.manager.into(),
            operation: "Apply".into(),
            api_version: w.api_version.into(),
            time: w.time.into(),
            subresource: w.subresource.into(),
            fields: applied_set,
        }),
    }
    write_entries(&mut merged, &entries);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(manager: &str) -> Writer<'_> {
        Writer {
            manager,
            api_version: "apps/v1",
            subresource: "",
            time: "2026-01-01T00:00:00Z",
        }
    }

    fn deployment(replicas: i64, image: &str) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
               "spec": {"replicas": replicas, "template": {"spec": {"containers": [{"name": "app", "image": image}]}}}})
    }

    #[test]
    fn fields_v1_round_trips_and_keys_map_list_items() {
        let set = fields_of(&deployment(1, "a"), &Shape::default());
        let tree = to_fields_v1(&set);
        assert_eq!(
            tree["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"]["f:image"],
            json!({})
        );
        assert_eq!(from_fields_v1(&tree), set);
    }

    #[test]
    fn a_second_manager_applying_a_different_value_conflicts_unless_forced() {
        let shape = Shape::default();
        let first = apply(None, &deployment(1, "a"), &writer("one"), false, &shape, true).unwrap();
        let patch = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"replicas": 3}});
        let conflicts = apply(Some(&first), &patch, &writer("two"), false, &shape, true).unwrap_err();
        assert_eq!(
            conflicts,
            vec![Conflict {
                manager: "one".into(),
                api_version: "apps/v1".into(),
                field: ".spec.replicas".into()
            }]
        );
        let forced = apply(Some(&first), &patch, &writer("two"), true, &shape, true).unwrap();
        assert_eq!(forced["spec"]["replicas"], 3);
        let one = read_entries(&forced)
            .into_iter()
            .find(|e| e.manager == "one")
            .unwrap();
        assert!(
            !one.fields
                .contains(&vec!["f:spec".to_string(), "f:replicas".to_string()])
        );
    }

    #[test]
    fn a_field_the_manager_stops_applying_is_removed_when_nobody_else_owns_it() {
        let shape = Shape::default();
        let mut labelled = deployment(1, "a");
        labelled["metadata"]["labels"] = json!({"keep": "1", "drop": "1"});
        let first = apply(None, &labelled, &writer("one"), false, &shape, true).unwrap();
        let mut fewer = deployment(1, "a");
        fewer["metadata"]["labels"] = json!({"keep": "1"});
        let second = apply(Some(&first), &fewer, &writer("one"), false, &shape, true).unwrap();
        assert_eq!(second["metadata"]["labels"], json!({"keep": "1"}));
    }

    #[test]
    fn an_update_takes_ownership_of_the_fields_it_changed() {
        let shape = Shape::default();
        let first = apply(None, &deployment(1, "a"), &writer("one"), false, &shape, true).unwrap();
        let mut edited = first.clone();
        edited["spec"]["replicas"] = json!(5);
        record_update(Some(&first), &mut edited, &writer("kubectl-edit"), &shape, true);
        let entries = read_entries(&edited);
        let edit = entries.iter().find(|e| e.manager == "kubectl-edit").unwrap();
        assert!(
            edit.fields
                .contains(&vec!["f:spec".to_string(), "f:replicas".to_string()])
        );
        let one = entries.iter().find(|e| e.manager == "one").unwrap();
        assert!(
            !one.fields
                .contains(&vec!["f:spec".to_string(), "f:replicas".to_string()])
        );
    }
}
