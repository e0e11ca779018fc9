//! LIST: selectors, `limit`/`continue` pages, Tables and `PartialObjectMetadataList`.

use std::sync::Arc;

use http::Response;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::present;
use crate::request::Req;
use crate::response::{Body, json_response};
use crate::state::State;
use crate::store::ns_name;
use crate::target::Target;

/// Serves a LIST.
pub fn list(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = req.selectors()?;
    let store = state.store();
    let rv = store.current_rv();
    let mut items: Vec<Value> = store
        .list(&t.rt.key(), t.namespace.as_deref())
        .into_iter()
        .filter(|o| labels.matches(o["metadata"].get("labels")) && fields.matches(o))
        .cloned()
        .collect();
    drop(store);
    let mut cont = None;
    let mut list_rv = rv;
    if let Some(token) = req.q("continue") {
        let (token_rv, after) = decode_continue(token)?;
        list_rv = token_rv;
        items.retain(|o| {
            let (ns, name) = ns_name(o);
            format!("{ns}/{name}") > after
        });
    }
    let mut remaining = None;
    if let Some(limit) = req
        .q("limit")
        .and_then(|l| l.parse::<usize>().ok())
        .filter(|l| *l > 0)
        && items.len() > limit
    {
        remaining = Some(items.len() - limit);
        items.truncate(limit);
        let (ns, name) = ns_name(items.last().expect("limit is positive"));
        cont = Some(encode_continue(list_rv, &format!("{ns}/{name}")));
    }
    let items: Vec<Value> = items.into_iter().map(|o| present(&t.rt, o)).collect();
    if let Some(table) = crate::table::maybe_list(&t.rt, &items, req, list_rv, cont.as_deref()) {
        return Ok(json_response(200, &table));
    }
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
        meta["remainingItemCount"] = json!(remaining);
    }
    if req.accept.contains("as=PartialObjectMetadataList") {
        let items: Vec<Value> = items
            .iter()
            .map(|o| json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"]}))
            .collect();
        return Ok(json_response(
            200,
            &json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList", "metadata": meta, "items": items}),
        ));
    }
    Ok(json_response(
        200,
        &json!({"apiVersion": t.rt.api_version(), "kind": format!("{}List", t.rt.kind), "metadata": meta, "items": items}),
    ))
}

fn encode_continue(rv: u64, after: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json!({"rv": rv, "after": after}).to_string())
}

fn decode_continue(token: &str) -> Result<(u64, String), ApiError> {
    use base64::Engine;
    let bad = || ApiError::bad_request("continue key is not valid");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    Ok((
        v["rv"].as_u64().ok_or_else(bad)?,
        v["after"].as_str().ok_or_else(bad)?.to_string(),
    ))
}
