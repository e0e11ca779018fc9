//! Structural merge of a partial object into a live one, list by list as the [`Shape`] says. Strategic
//! merge patch and server-side apply both use it; the strategic flavour also reads `$patch`,
//! `$retainKeys`, `$setElementOrder/…` and `$deleteFromPrimitiveList/…` directives.

use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::shape::{ListType, Shape, same_key};

/// Which merge semantics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// Server-side apply of an applied configuration.
    Apply,
}

/// Merges `patch` into `live` in place.
pub fn merge(live: &mut Value, patch: &Value, shape: &Shape, flavour: Flavour) -> Result<(), ApiError> {
    let mut path = vec![];
    merge_at(live, patch, shape, flavour, &mut path)
}

fn merge_at(
    live: &mut Value,
    patch: &Value,
    shape: &Shape,
    flavour: Flavour,
    path: &mut Vec<String>,
) -> Result<(), ApiError> {
    let Some(pmap) = patch.as_object() else {
        *live = patch.clone();
        return Ok(());
    };
    if flavour == Flavour::Strategic && pmap.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut replaced = pmap.clone();
        replaced.remove("$patch");
        *live = Value::Object(replaced);
        return Ok(());
    }
    if !live.is_object() {
        *live = Value::Object(Map::new());
    }
    let lmap = live.as_object_mut().expect("made an object above");
    let mut retain: Option<Vec<String>> = None;
    for (k, v) in pmap {
        if flavour == Flavour::Strategic {
            if k == "$patch" {
                continue;
            }
            if k == "$retainKeys" {
                retain = Some(
                    v.as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s.as_str().map(String::from))
                        .collect(),
                );
                continue;
            }
            if k.starts_with("$setElementOrder/") {
                continue;
            }
            if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
                if let Some(list) = lmap.get_mut(field).and_then(Value::as_array_mut) {
                    let drop = v.as_array().cloned().unwrap_or_default();
                    list.retain(|x| !drop.contains(x));
                }
                continue;
            }
            if k.starts_with('$') {
                return Err(ApiError::bad_request(format!("unknown patch directive {k}")));
            }
        }
        if v.is_null() {
            lmap.remove(k);
            continue;
        }
        path.push(k.clone());
        match (lmap.get_mut(k), v) {
            (Some(l @ Value::Object(_)), Value::Object(_)) => merge_at(l, v, shape, flavour, path)?,
            (Some(l @ Value::Array(_)), Value::Array(items)) => merge_list(l, items, shape, flavour, path)?,
            (_, Value::Array(items)) => {
                let mut fresh = Value::Array(vec![]);
                merge_list(&mut fresh, items, shape, flavour, path)?;
                lmap.insert(k.clone(), fresh);
            }
            (_, Value::Object(_)) => {
                let mut fresh = Value::Object(Map::new());
                merge_at(&mut fresh, v, shape, flavour, path)?;
                lmap.insert(k.clone(), fresh);
            }
            _ => {
                lmap.insert(k.clone(), v.clone());
            }
        }
        path.pop();
    }
    if let Some(keep) = retain {
        lmap.retain(|k, _| keep.contains(k));
    }
    Ok(())
}

fn merge_list(
    live: &mut Value,
    items: &[Value],
    shape: &Shape,
    flavour: Flavour,
    path: &mut Vec<String>,
) -> Result<(), ApiError> {
    let list_type = shape.list_type(path);
    let strategic_replace = flavour == Flavour::Strategic
        && items
            .iter()
            .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"));
    let llist = live.as_array_mut().expect("caller passes an array");
    match list_type {
        _ if strategic_replace => {
            *llist = items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .cloned()
                .collect();
        }
        ListType::Atomic => *llist = items.to_vec(),
        ListType::Set => {
            for i in items {
                if !llist.contains(i) {
                    llist.push(i.clone());
                }
            }
        }
        ListType::Map(keys) => {
            for item in items {
                let pos = llist.iter().position(|l| same_key(l, item, &keys));
                let delete = flavour == Flavour::Strategic
                    && item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(p), true) => {
                        llist.remove(p);
                    }
                    (None, true) => {}
                    (Some(p), false) => merge_at(&mut llist[p], item, shape, flavour, path)?,
                    (None, false) => {
                        let mut fresh = Value::Object(Map::new());
                        merge_at(&mut fresh, item, shape, flavour, path)?;
                        llist.push(fresh);
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn strategic_patch_merges_containers_by_name_and_keeps_the_others() {
        let mut live = json!({"spec": {"containers": [{"name": "app", "image": "a:1"}, {"name": "side", "image": "s:1"}]}});
        let patch = json!({"spec": {"containers": [{"name": "app", "image": "a:2"}]}});
        merge(&mut live, &patch, &Shape::default(), Flavour::Strategic).unwrap();
        assert_eq!(
            live,
            json!({"spec": {"containers": [{"name": "app", "image": "a:2"}, {"name": "side", "image": "s:1"}]}})
        );
    }

    #[test]
    fn strategic_patch_directives_delete_items_and_primitives() {
        let mut live = json!({"metadata": {"finalizers": ["a", "b"]}, "spec": {"containers": [{"name": "app"}, {"name": "side"}]}});
        let patch = json!({
            "metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {"containers": [{"name": "side", "$patch": "delete"}], "$setElementOrder/containers": [{"name": "app"}]}
        });
        merge(&mut live, &patch, &Shape::default(), Flavour::Strategic).unwrap();
        assert_eq!(
            live,
            json!({"metadata": {"finalizers": ["b"]}, "spec": {"containers": [{"name": "app"}]}})
        );
    }

    #[test]
    fn null_removes_a_field() {
        let mut live = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        merge(
            &mut live,
            &json!({"metadata": {"labels": {"a": null}}}),
            &Shape::default(),
            Flavour::Strategic,
        )
        .unwrap();
        assert_eq!(live, json!({"metadata": {"labels": {"b": "2"}}}));
    }
}
