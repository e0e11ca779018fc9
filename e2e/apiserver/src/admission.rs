//! Mutating admission: the webhooks of every MutatingWebhookConfiguration stored through the API, called
//! over HTTPS with their `caBundle` verified, as kube-apiserver calls them. Rules, namespace and object
//! selectors, `matchConditions` (CEL) and `failurePolicy` are honoured. A `clientConfig.service` reference
//! reaches whatever address the test routed it to ([`State::route_service`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kube_cel::{KubeCelExt, cel};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::registry::ResKey;
use crate::selectors::LabelSelector;
use crate::state::State;
use crate::target::Target;

const TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// Runs the matching mutating webhooks over `obj` for `operation` (`CREATE`, `UPDATE`).
pub async fn mutate(
    state: &Arc<State>,
    operation: &str,
    t: &Target,
    old: Option<&Value>,
    obj: Value,
) -> Result<Value, ApiError> {
    let (configs, namespace_obj) = {
        let store = state.store();
        let key = ResKey {
            group: "admissionregistration.k8s.io".into(),
            plural: "mutatingwebhookconfigurations".into(),
        };
        let mut configs: Vec<Value> = store.list(&key, None).into_iter().cloned().collect();
        configs.sort_by(|a, b| {
            a["metadata"]["name"]
                .as_str()
                .cmp(&b["metadata"]["name"].as_str())
        });
        let ns_key = ResKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        let ns = if t.rt.namespaced {
            store
                .get(&ns_key, "", t.namespace.as_deref().unwrap_or_default())
                .cloned()
        } else {
            None
        };
        (configs, ns)
    };
    if configs.is_empty() {
        return Ok(obj);
    }
    let mut obj = obj;
    for config in &configs {
        for hook in config["webhooks"].as_array().into_iter().flatten() {
            let name = hook["name"].as_str().unwrap_or_default();
            if !rules_match(hook, operation, t) {
                continue;
            }
            let ns_labels = match (&namespace_obj, t.rt.plural.as_str()) {
                (Some(ns), _) => ns["metadata"].get("labels").cloned(),
                (None, "namespaces") => obj["metadata"].get("labels").cloned(),
                _ => None,
            };
            if let Some(sel) = hook.get("namespaceSelector").filter(|s| !s.is_null())
                && (namespace_obj.is_some() || t.rt.plural == "namespaces")
                && !LabelSelector::from_object(sel)?.matches(ns_labels.as_ref())
            {
                continue;
            }
            if let Some(sel) = hook.get("objectSelector").filter(|s| !s.is_null()) {
                let sel = LabelSelector::from_object(sel)?;
                let new_match = sel.matches(obj["metadata"].get("labels"));
                let old_match = old.is_some_and(|o| sel.matches(o["metadata"].get("labels")));
                if !new_match && !old_match {
                    continue;
                }
            }
            let fail = hook["failurePolicy"].as_str() != Some("Ignore");
            let request = review_request(operation, t, old, &obj);
            match match_conditions(hook, &obj, old, &request, namespace_obj.as_ref()) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) if fail => {
                    return Err(ApiError::internal(format!(
                        "failed calling webhook \"{name}\": {e}"
                    )));
                }
                Err(_) => continue,
            }
            match call(state, hook, &request).await {
                Ok(response) => obj = apply_response(name, obj, &response)?,
                Err(e) if fail => {
                    return Err(ApiError::internal(format!(
                        "failed calling webhook \"{name}\": {e}"
                    )));
                }
                Err(e) => {
                    tracing::warn!(webhook = name, error = %e, "webhook failed, ignored by its failurePolicy")
                }
            }
        }
    }
    Ok(obj)
}

fn any_or(list: &Value, want: &str) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|v| v == "*" || v == want)
}

fn rules_match(hook: &Value, operation: &str, t: &Target) -> bool {
    let sub = t.sub.as_deref();
    let resource = match sub {
        Some(s) => format!("{}/{s}", t.rt.plural),
        None => t.rt.plural.clone(),
    };
    hook["rules"].as_array().into_iter().flatten().any(|r| {
        let scope = r["scope"].as_str().unwrap_or("*");
        let scope_ok = scope == "*" || (scope == "Namespaced") == t.rt.namespaced;
        let resource_ok = r["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .any(|x| {
                x == resource
                    || (sub.is_none() && x == "*")
                    || x == "*/*"
                    || (sub.is_some() && x == format!("*/{}", sub.unwrap_or_default()))
            });
        scope_ok
            && any_or(&r["apiGroups"], &t.rt.group)
            && any_or(&r["apiVersions"], &t.rt.version)
            && any_or(&r["operations"], operation)
            && resource_ok
    })
}

fn review_request(operation: &str, t: &Target, old: Option<&Value>, obj: &Value) -> Value {
    let rt = &t.rt;
    json!({
        "uid": crate::store::new_uid(),
        "kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "resource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
        "subResource": t.sub,
        "requestKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
        "requestResource": {"group": rt.group, "version": rt.version, "resource": rt.plural},
        "name": obj["metadata"]["name"],
        "namespace": t.namespace,
        "operation": operation,
        "userInfo": {"username": "sluice-test", "groups": ["system:masters", "system:authenticated"]},
        "object": obj,
        "oldObject": old,
        "dryRun": false,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": if operation == "CREATE" { "CreateOptions" } else { "UpdateOptions" }},
    })
}

fn match_conditions(
    hook: &Value,
    obj: &Value,
    old: Option<&Value>,
    request: &Value,
    ns: Option<&Value>,
) -> Result<bool, String> {
    let conditions = hook["matchConditions"].as_array().cloned().unwrap_or_default();
    if conditions.is_empty() {
        return Ok(true);
    }
    let mut ctx = cel::Context::default().with_all();
    let var = |v: &Value| cel::to_value(v).map_err(|e| e.to_string());
    ctx.add_variable_from_value("object", var(obj)?);
    ctx.add_variable_from_value("oldObject", var(old.unwrap_or(&Value::Null))?);
    ctx.add_variable_from_value("request", var(request)?);
    ctx.add_variable_from_value("namespaceObject", var(ns.unwrap_or(&Value::Null))?);
    for c in conditions {
        let expr = c["expression"].as_str().unwrap_or("true");
        let program =
            cel::Program::compile(expr).map_err(|e| format!("matchCondition {:?}: {e}", c["name"]))?;
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Ok(false),
            Ok(other) => {
                return Err(format!(
                    "matchCondition {:?} returned {other:?}, not a bool",
                    c["name"]
                ));
            }
            Err(e) => return Err(format!("matchCondition {:?}: {e}", c["name"])),
        }
    }
    Ok(true)
}

fn apply_response(name: &str, mut obj: Value, review: &Value) -> Result<Value, ApiError> {
    let response = &review["response"];
    if response["allowed"] != json!(true) {
        let status = &response["status"];
        let code = status["code"].as_u64().unwrap_or(403) as u16;
        let msg = status["message"].as_str().unwrap_or_default();
        return Err(ApiError::new(
            code,
            status["reason"].as_str().unwrap_or("Forbidden"),
            format!("admission webhook \"{name}\" denied the request: {msg}"),
        ));
    }
    // Go encodes `[]byte` as base64 and decodes it from base64 or from an array of numbers (kube-rs sends
    // the latter); both are accepted.
    let raw: Option<Vec<u8>> = match &response["patch"] {
        Value::String(b) => Some(base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| {
            ApiError::internal(format!(
                "webhook \"{name}\" returned a patch that is not base64: {e}"
            ))
        })?),
        Value::Array(bytes) => Some(
            bytes
                .iter()
                .map(|b| b.as_u64().unwrap_or_default() as u8)
                .collect(),
        ),
        _ => None,
    };
    if let Some(raw) = raw {
        let ops: json_patch::Patch = serde_json::from_slice(&raw).map_err(|e| {
            ApiError::internal(format!("webhook \"{name}\" returned an invalid JSON patch: {e}"))
        })?;
        json_patch::patch(&mut obj, &ops)
            .map_err(|e| ApiError::internal(format!("webhook \"{name}\" patch failed: {e}")))?;
    }
    Ok(obj)
}

/// Where to connect and which TLS name to check.
fn endpoint(state: &State, client: &Value) -> Result<(SocketAddr, String, String), String> {
    if let Some(url) = client["url"].as_str() {
        let u = url::Url::parse(url).map_err(|e| format!("bad url {url}: {e}"))?;
        if u.scheme() != "https" {
            return Err(format!("webhook url must be https: {url}"));
        }
        let host = u
            .host_str()
            .ok_or("url without host")?
            .trim_matches(['[', ']'])
            .to_string();
        let port = u.port().unwrap_or(443);
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
            .map_err(|e| format!("resolving {host}: {e}"))?
            .next()
            .ok_or("no address")?;
        let path = match u.query() {
            Some(q) => format!("{}?{q}", u.path()),
            None => u.path().to_string(),
        };
        return Ok((addr, host, path));
    }
    let svc = &client["service"];
    let (ns, name) = (
        svc["namespace"].as_str().unwrap_or_default(),
        svc["name"].as_str().unwrap_or_default(),
    );
    let port = svc["port"].as_u64().unwrap_or(443) as u16;
    let addr = state.service_route(ns, name, port).ok_or_else(|| {
        format!("service \"{ns}/{name}:{port}\" has no route in the test server (call route_service)")
    })?;
    Ok((
        addr,
        format!("{name}.{ns}.svc"),
        svc["path"].as_str().unwrap_or("/").to_string(),
    ))
}

async fn call(state: &State, hook: &Value, request: &Value) -> Result<Value, String> {
    let client = &hook["clientConfig"];
    let (addr, server_name, path) = endpoint(state, client)?;
    let ca = match client["caBundle"].as_str() {
        Some(b) => base64::engine::general_purpose::STANDARD
            .decode(b)
            .map_err(|e| format!("caBundle is not base64: {e}"))?,
        None => return Err("no caBundle: this server trusts only configured CAs".into()),
    };
    let tls = crate::tls::client_config(&ca).map_err(|e| e.to_string())?;
    let timeout = hook["timeoutSeconds"]
        .as_u64()
        .map(Duration::from_secs)
        .unwrap_or(TIMEOUT_DEFAULT);
    let version = hook["admissionReviewVersions"]
        .as_array()
        .and_then(|v| {
            v.iter()
                .filter_map(Value::as_str)
                .find(|v| *v == "v1" || *v == "v1beta1")
        })
        .unwrap_or("v1")
        .to_string();
    let review = json!({"apiVersion": format!("admission.k8s.io/{version}"), "kind": "AdmissionReview", "request": request});
    let body = serde_json::to_vec(&review).map_err(|e| e.to_string())?;
    let exchange = async move {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("dial {addr}: {e}"))?;
        let name = rustls::pki_types::ServerName::try_from(server_name.clone()).map_err(|e| e.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let req = http::Request::post(path)
            .header(http::header::HOST, server_name)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        if !status.is_success() {
            return Err(format!(
                "webhook answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        serde_json::from_slice::<Value>(&bytes).map_err(|e| format!("bad AdmissionReview: {e}"))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("timed out after {timeout:?}"))?
}
