//! DELETE of one object (preconditions, propagation, protected namespaces) and of a collection.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::present;
use crate::request::Req;
use crate::response::{Body, json_response};
use crate::state::State;
use crate::store::{Propagation, ns_name};
use crate::target::Target;

fn delete_options(req: &Req) -> Result<(Propagation, Value), ApiError> {
    let body: Value = if req.body.is_empty() {
        json!({})
    } else {
        req.body_value()?
    };
    let policy = req
        .q("propagationPolicy")
        .map(String::from)
        .or_else(|| body["propagationPolicy"].as_str().map(String::from));
    let propagation = match policy.as_deref() {
        Some("Foreground") => Propagation::Foreground,
        Some("Orphan") => Propagation::Orphan,
        _ if body["orphanDependents"] == json!(true) => Propagation::Orphan,
        _ => Propagation::Background,
    };
    Ok((propagation, body))
}

/// Namespaces kube-apiserver refuses to delete.
const PROTECTED_NAMESPACES: &[&str] = &["default", "kube-system", "kube-public"];

/// Serves a DELETE of one object.
pub fn delete(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let (propagation, body) = delete_options(req)?;
    if t.rt.group.is_empty() && t.rt.plural == "namespaces" && PROTECTED_NAMESPACES.contains(&t.name()) {
        return Err(ApiError::forbidden(format!(
            "namespaces \"{}\" is forbidden: this namespace may not be deleted",
            t.name()
        )));
    }
    let mut store = state.store();
    let obj = store
        .get(&t.rt.key(), t.ns(), t.name())
        .cloned()
        .ok_or_else(|| ApiError::not_found(&t.rt, t.name()))?;
    let pre = &body["preconditions"];
    if let Some(rv) = pre["resourceVersion"].as_str()
        && Some(rv) != obj["metadata"]["resourceVersion"].as_str()
    {
        return Err(ApiError::conflict(
            &t.rt,
            t.name(),
            &format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                obj["metadata"]["resourceVersion"].as_str().unwrap_or_default()
            ),
        ));
    }
    if let Some(uid) = pre["uid"].as_str()
        && uid != crate::store::uid(&obj)
    {
        return Err(ApiError::conflict(
            &t.rt,
            t.name(),
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                crate::store::uid(&obj)
            ),
        ));
    }
    if req.q("dryRun").is_some() {
        return Ok(json_response(200, &present(&t.rt, obj)));
    }
    let (after, gone) = store
        .delete(&t.rt.key(), t.ns(), t.name(), propagation)
        .ok_or_else(|| ApiError::not_found(&t.rt, t.name()))?;
    drop(store);
    if gone {
        Ok(json_response(
            200,
            &json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": {"name": t.name(), "group": t.rt.group, "kind": t.rt.plural, "uid": crate::store::uid(&after)},
            }),
        ))
    } else {
        Ok(json_response(200, &present(&t.rt, after)))
    }
}

/// Serves a DELETE of every object the selectors match.
pub fn delete_collection(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let (propagation, _) = delete_options(req)?;
    let (labels, fields) = req.selectors()?;
    let mut store = state.store();
    let victims: Vec<(String, String)> = store
        .list(&t.rt.key(), t.namespace.as_deref())
        .into_iter()
        .filter(|o| labels.matches(o["metadata"].get("labels")) && fields.matches(o))
        .map(ns_name)
        .collect();
    let mut items = vec![];
    for (ns, name) in victims {
        if let Some((obj, _)) = store.delete(&t.rt.key(), &ns, &name, propagation) {
            items.push(present(&t.rt, obj));
        }
    }
    let rv = store.current_rv();
    Ok(json_response(
        200,
        &json!({"apiVersion": t.rt.api_version(), "kind": format!("{}List", t.rt.kind), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    ))
}
