//! HTTP entry point: authentication, routing of discovery/OpenAPI/resource paths, and the resource verbs
//! (get, list, watch, create, update, patch, apply, delete) on top of the [`Store`].

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, header};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use crate::error::{ApiError, Cause};
use crate::fieldset::{self, Writer};
use crate::merge::{Flavour, merge};
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::server::{Body, State};
use crate::shape::Shape;
use crate::store::{Propagation, Store, ns_name};
use crate::validation::{self, FieldValidation};

/// Namespaces every cluster starts with.
pub fn bootstrap(store: &mut Store) {
    let key = ResourceType::builtin("", "v1", "Namespace", "namespaces", false).key();
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let now = store.now();
        let ns = json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": new_uid(), "creationTimestamp": now, "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        });
        store.put(&key, ns);
    }
}

/// An authenticated caller of the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    /// User name.
    pub username: String,
    /// Groups.
    pub groups: Vec<String>,
}

impl User {
    /// The user the default bearer token authenticates as: a cluster admin.
    pub fn admin() -> Self {
        User {
            username: "sluice-test-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }
}

/// A fresh object uid.
pub fn new_uid() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// A parsed request.
pub struct Req {
    /// Method.
    pub method: Method,
    /// Path.
    pub path: String,
    /// Query parameters.
    pub query: HashMap<String, String>,
    /// `Accept` header.
    pub accept: String,
    /// `Content-Type` header.
    pub content_type: String,
    /// `User-Agent` header.
    pub user_agent: String,
    /// Body.
    pub body: Bytes,
    /// When the request arrived, by the server's clock.
    pub now: chrono::DateTime<chrono::Utc>,
    /// Who sent it (from the bearer token).
    pub user: User,
}

impl Req {
    /// A query parameter.
    pub fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }

    fn flag(&self, k: &str) -> bool {
        matches!(self.q(k), Some("true") | Some("1"))
    }

    /// The field manager: `fieldManager`, else derived from the user agent as kube-apiserver does.
    fn manager(&self) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        let ua = self.user_agent.split('/').next().unwrap_or_default();
        if ua.is_empty() {
            "unknown".into()
        } else {
            ua.to_string()
        }
    }

    fn body_value(&self) -> Result<Value, ApiError> {
        if self.body.is_empty() {
            return Err(ApiError::bad_request("the request body is empty"));
        }
        if self.content_type.starts_with(crate::protobuf::CONTENT_TYPE) {
            // Typed client-go clients (`kubectl create configmap …`) send built-in kinds as protobuf.
            return crate::protobuf::decode(&self.body).map_err(|e| {
                ApiError::new(
                    415,
                    "UnsupportedMediaType",
                    format!("error decoding the protobuf request body: {e}"),
                )
            });
        }
        if self.content_type.contains("cbor") {
            // client-go falls back to JSON when a CBOR body is refused with 415.
            return Err(ApiError::new(
                415,
                "UnsupportedMediaType",
                format!(
                    "this test API server accepts JSON, YAML and protobuf bodies, not {}",
                    self.content_type
                ),
            ));
        }
        if let Ok(v) = serde_json::from_slice(&self.body) {
            return Ok(v);
        }
        serde_yaml::from_slice(&self.body)
            .map_err(|e| ApiError::bad_request(format!("error decoding the request body: {e}")))
    }
}

/// A JSON response.
pub fn json_response(code: u16, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .expect("a static response is valid")
}

fn error_response(e: &ApiError) -> Response<Body> {
    json_response(e.code, &e.to_status())
}

/// Serves one request.
pub async fn handle(state: Arc<State>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let user = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .and_then(|t| state.user_of(t.trim()));
    let Some(user) = user else {
        return error_response(&ApiError::unauthorized());
    };
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error_response(&ApiError::bad_request(format!("reading body: {e}"))),
    };
    let header = |h: header::HeaderName| {
        parts
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let query = parts
        .uri
        .query()
        .map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let req = Req {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        query,
        accept: header(header::ACCEPT),
        content_type: header(header::CONTENT_TYPE),
        user_agent: header(header::USER_AGENT),
        body,
        now: (state.options.clock)(),
        user,
    };
    tracing::debug!(method = %req.method, path = %req.path, query = ?req.query, "request");
    match route(&state, &req).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(method = %req.method, path = %req.path, error = %e, "refused");
            error_response(&e)
        }
    }
}

async fn route(state: &Arc<State>, req: &Req) -> Result<Response<Body>, ApiError> {
    let segs: Vec<&str> = req
        .path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let get = req.method == Method::GET;
    if let ["apis", g, v, ..] = segs.as_slice() {
        let aggregated = {
            let store = state.store();
            let local = store
                .registry
                .all()
                .iter()
                .any(|t| t.group == *g && t.version == *v);
            if local {
                None
            } else {
                crate::aggregator::find(&store, g, v)
            }
        };
        if let Some(apiservice) = aggregated {
            return crate::aggregator::proxy(state, &apiservice, req).await;
        }
    }
    let post = req.method == Method::POST;
    match segs.as_slice() {
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] if post => token_review(state, req),
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] if post => {
            subject_access_review(state, req)
        }
        ["version"] if get => Ok(json_response(200, &crate::discovery::version())),
        ["healthz" | "readyz" | "livez", ..] if get => {
            Ok(Response::new(Full::new(Bytes::from_static(b"ok")).boxed()))
        }
        ["api"] if get => Ok(json_response(200, &crate::discovery::api_versions(state.addr))),
        ["apis"] if get => Ok(json_response(200, &{
            let store = state.store();
            crate::discovery::group_list(&store.registry, &crate::aggregator::served(&store))
        })),
        ["api", "v1"] if get => Ok(json_response(
            200,
            &crate::discovery::resource_list(&state.store().registry, "", "v1")?,
        )),
        ["apis", g] if get => Ok(json_response(200, &{
            let store = state.store();
            crate::discovery::group(&store.registry, &crate::aggregator::served(&store), g)?
        })),
        ["apis", g, v] if get => Ok(json_response(
            200,
            &crate::discovery::resource_list(&state.store().registry, g, v)?,
        )),
        ["openapi", "v2"] => Err(ApiError::no_route(&req.path)),
        ["openapi", "v3"] if get => Ok(json_response(
            200,
            &crate::openapi::index(&state.store().registry),
        )),
        ["openapi", "v3", rest @ ..] if get => Ok(json_response(
            200,
            &crate::openapi::document(&state.store().registry, rest)?,
        )),
        ["api", "v1", rest @ ..] => resource(state, req, "", "v1", rest).await,
        ["apis", g, v, rest @ ..] => resource(state, req, g, v, rest).await,
        _ => Err(ApiError::no_route(&req.path)),
    }
}

/// `TokenReview`: who a bearer token belongs to (the tokens [`State::user_of`] knows).
fn token_review(state: &Arc<State>, req: &Req) -> Result<Response<Body>, ApiError> {
    let mut review = req.body_value()?;
    let token = review["spec"]["token"].as_str().unwrap_or_default();
    review["status"] = match state.user_of(token) {
        Some(u) => json!({"authenticated": true, "user": {"username": u.username, "groups": u.groups}}),
        None => json!({"authenticated": false, "error": "the token is not known to this API server"}),
    };
    Ok(json_response(201, &review))
}

/// `SubjectAccessReview`. RBAC is not simulated: this is a stand-in whose rule is "allowed unless the
/// user or one of its groups is on the deny list" ([`State::deny`]), enough to test that a caller
/// asks and obeys the answer.
fn subject_access_review(state: &Arc<State>, req: &Req) -> Result<Response<Body>, ApiError> {
    let mut review = req.body_value()?;
    let spec = &review["spec"];
    let user = spec["user"].as_str().unwrap_or_default().to_string();
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g.as_str().map(String::from))
        .collect();
    if user.is_empty() && groups.is_empty() {
        return Err(ApiError::bad_request(
            "SubjectAccessReview spec: at least one of user or group must be specified",
        ));
    }
    let denied = state.denied(&user, &groups);
    review["status"] = if let Some(who) = denied {
        json!({"allowed": false, "denied": true, "reason": format!("{who} is on the test API server's deny list")})
    } else {
        json!({"allowed": true, "reason": "the test API server allows everyone not on its deny list"})
    };
    Ok(json_response(201, &review))
}

/// What a resource path names.
pub struct Target {
    /// The type.
    pub rt: Arc<ResourceType>,
    /// Namespace from the path (None: cluster-scoped, or all namespaces).
    pub namespace: Option<String>,
    /// Object name.
    pub name: Option<String>,
    /// Subresource.
    pub sub: Option<String>,
}

impl Target {
    fn ns(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }

    fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }
}

fn parse_target(
    store: &Store,
    group: &str,
    version: &str,
    rest: &[&str],
    path: &str,
) -> Result<Target, ApiError> {
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if !matches!(*plural, "status" | "finalize") || !tail.is_empty() =>
        {
            (Some(ns.to_string()), [&[*plural][..], tail].concat())
        }
        _ => (None, rest.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(s.to_string())),
        _ => return Err(ApiError::no_route(path)),
    };
    let rt = store
        .registry
        .find(group, version, plural)
        .ok_or_else(|| ApiError::no_route(path))?;
    if namespace.is_some() && !rt.namespaced {
        return Err(ApiError::no_route(path));
    }
    if namespace.is_none() && rt.namespaced && name.is_some() {
        return Err(ApiError::no_route(path));
    }
    if let Some(s) = &sub {
        let ok = match s.as_str() {
            "status" => rt.status,
            "scale" => rt.scale.is_some(),
            "finalize" => rt.plural == "namespaces",
            _ => false,
        };
        if !ok {
            return Err(ApiError::no_route(path));
        }
    }
    Ok(Target {
        rt,
        namespace,
        name,
        sub,
    })
}

async fn resource(
    state: &Arc<State>,
    req: &Req,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response<Body>, ApiError> {
    let target = parse_target(&state.store(), group, version, rest, &req.path)?;
    let m = &req.method;
    match (m, target.name.is_some()) {
        (&Method::GET, false) if req.flag("watch") => crate::watch::serve(state, &target, req),
        (&Method::GET, false) => list(state, &target, req),
        (&Method::GET, true) => get(state, &target, req),
        (&Method::POST, false) => {
            let body = req.body_value()?;
            write(state, &target, req, Mutation::Create(body)).await
        }
        (&Method::PUT, true) => {
            let body = req.body_value()?;
            write(state, &target, req, Mutation::Replace(body)).await
        }
        (&Method::PATCH, true) => {
            let ct = req
                .content_type
                .split(';')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string();
            let mutation = match ct.as_str() {
                "application/json-patch+json" => Mutation::JsonPatch(req.body_value()?),
                "application/merge-patch+json" => Mutation::MergePatch(req.body_value()?),
                "application/strategic-merge-patch+json" if !target.rt.custom => {
                    Mutation::StrategicPatch(req.body_value()?)
                }
                "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                    if req.q("fieldManager").is_none() {
                        return Err(ApiError::bad_request(
                            "PATCH, application/apply-patch+yaml: fieldManager is required",
                        ));
                    }
                    Mutation::Apply(req.body_value()?)
                }
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            write(state, &target, req, mutation).await
        }
        (&Method::DELETE, true) => delete(state, &target, req),
        (&Method::DELETE, false) => delete_collection(state, &target, req),
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}

/// Sets `apiVersion`/`kind` to the version that was asked for.
pub fn present(rt: &ResourceType, mut obj: Value) -> Value {
    if let Some(m) = obj.as_object_mut() {
        m.insert("apiVersion".into(), json!(rt.api_version()));
        m.insert("kind".into(), json!(rt.kind));
    }
    obj
}

fn get(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let store = state.store();
    let obj = store
        .get(&t.rt.key(), t.ns(), t.name())
        .cloned()
        .ok_or_else(|| ApiError::not_found(&t.rt, t.name()))?;
    if t.sub.as_deref() == Some("scale") {
        return Ok(json_response(200, &crate::scale::to_scale(&t.rt, &obj)));
    }
    let obj = present(&t.rt, obj);
    if let Some(r) = crate::table::maybe_single(&t.rt, &obj, req) {
        return Ok(json_response(200, &r));
    }
    Ok(json_response(200, &obj))
}

/// Label and field selectors of a request.
pub fn selectors(req: &Req) -> Result<(LabelSelector, FieldSelector), ApiError> {
    Ok((
        LabelSelector::parse(req.q("labelSelector").unwrap_or_default())?,
        FieldSelector::parse(req.q("fieldSelector").unwrap_or_default())?,
    ))
}

fn list(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = selectors(req)?;
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

/// A write request.
pub enum Mutation {
    /// POST.
    Create(Value),
    /// PUT.
    Replace(Value),
    /// `application/json-patch+json`.
    JsonPatch(Value),
    /// `application/merge-patch+json`.
    MergePatch(Value),
    /// `application/strategic-merge-patch+json`.
    StrategicPatch(Value),
    /// `application/apply-patch+yaml`.
    Apply(Value),
}

/// The outcome of computing a write, before admission and commit.
struct Planned {
    old: Option<Value>,
    new: Value,
    unchanged: bool,
    warnings: Vec<String>,
}

const MAX_ATTEMPTS: usize = 8;

async fn write(
    state: &Arc<State>,
    t: &Target,
    req: &Req,
    mutation: Mutation,
) -> Result<Response<Body>, ApiError> {
    let dry_run = req.q("dryRun").is_some();
    for _ in 0..MAX_ATTEMPTS {
        let planned = {
            let store = state.store();
            plan(&store, t, req, &mutation)?
        };
        if planned.unchanged {
            let old = planned.old.expect("only updates are unchanged");
            return Ok(respond_object(t, old, 200, &planned.warnings));
        }
        let operation = if planned.old.is_some() { "UPDATE" } else { "CREATE" };
        let new = if t.sub.is_none() {
            crate::admission::mutate(state, operation, t, planned.old.as_ref(), planned.new).await?
        } else {
            planned.new
        };
        // Validation follows mutating admission, as in kube-apiserver.
        if !t.rt.custom && t.sub.is_none() {
            let causes = validation::builtin::check(&t.rt, &new);
            if !causes.is_empty() {
                return Err(ApiError::invalid(&t.rt, &ns_name(&new).1, causes));
            }
        }
        let mut store = state.store();
        let current = store.get(&t.rt.key(), t.ns(), &ns_name(&new).1).cloned();
        let current_rv = current.as_ref().map(|c| c["metadata"]["resourceVersion"].clone());
        let planned_rv = planned
            .old
            .as_ref()
            .map(|c| c["metadata"]["resourceVersion"].clone());
        if current_rv != planned_rv {
            if matches!(mutation, Mutation::Create(_)) {
                return Err(ApiError::already_exists(&t.rt, &ns_name(&new).1));
            }
            continue;
        }
        if planned.old.is_none() {
            ensure_namespace_open(&store, &t.rt, t.ns())?;
        }
        if dry_run {
            return Ok(respond_object(
                t,
                new,
                if planned.old.is_some() { 200 } else { 201 },
                &planned.warnings,
            ));
        }
        let stored = store.put_or_finish(&t.rt.key(), new);
        drop(store);
        let code = if planned.old.is_some() { 200 } else { 201 };
        if t.sub.as_deref() == Some("scale") {
            return Ok(json_response(code, &crate::scale::to_scale(&t.rt, &stored)));
        }
        return Ok(respond_object(t, stored, code, &planned.warnings));
    }
    Err(ApiError::stale(&t.rt, t.name()))
}

fn respond_object(t: &Target, obj: Value, code: u16, warnings: &[String]) -> Response<Body> {
    let mut r = json_response(code, &present(&t.rt, obj));
    for w in warnings {
        if let Ok(v) = http::HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "'"))) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn ensure_namespace_open(store: &Store, rt: &ResourceType, namespace: &str) -> Result<(), ApiError> {
    if !rt.namespaced {
        return Ok(());
    }
    let ns_rt = store
        .registry
        .find("", "v1", "namespaces")
        .expect("namespaces are built in");
    match store.get(&ns_rt.key(), "", namespace) {
        None => Err(ApiError::not_found(&ns_rt, namespace)),
        Some(ns) if !ns["metadata"]["deletionTimestamp"].is_null() => Err(ApiError::forbidden(format!(
            "{} \"{}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated",
            crate::error::qualified(rt),
            "",
        ))),
        Some(_) => Ok(()),
    }
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let id = uuid::Uuid::now_v7();
    id.as_bytes()[10..15]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

fn plan(store: &Store, t: &Target, req: &Req, mutation: &Mutation) -> Result<Planned, ApiError> {
    let rt = &t.rt;
    let shape = Shape::of(rt);
    let fv = FieldValidation::parse(req.q("fieldValidation"));
    let manager = req.manager();
    let now = store.now();
    let sub = t.sub.clone().unwrap_or_default();
    let writer = Writer {
        manager: &manager,
        api_version: &rt.api_version(),
        subresource: &sub,
        time: &now,
    };
    let existing = t
        .name
        .as_ref()
        .and_then(|n| store.get(&rt.key(), t.ns(), n))
        .cloned();
    let existing = existing.map(|o| present(rt, o));

    // 1. The object as the client wants it, before server-side rules.
    let (old, mut new, applied) = match mutation {
        Mutation::Create(body) => {
            let mut obj = body.clone();
            check_kind(rt, &obj)?;
            obj = present(rt, obj);
            if rt.namespaced {
                let body_ns = obj["metadata"]["namespace"].as_str().unwrap_or_default();
                if !body_ns.is_empty() && body_ns != t.ns() {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                obj["metadata"]["namespace"] = json!(t.ns());
            }
            if obj["metadata"]["name"].as_str().unwrap_or_default().is_empty() {
                match obj["metadata"]["generateName"].as_str() {
                    Some(prefix) if !prefix.is_empty() => {
                        obj["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix()))
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            rt,
                            "",
                            vec![Cause::new(
                                "FieldValueRequired",
                                "metadata.name",
                                "Required value: name or generateName is required",
                            )],
                        ));
                    }
                }
            }
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if store.get(&rt.key(), t.ns(), &name).is_some() {
                return Err(ApiError::already_exists(rt, &name));
            }
            (None, obj, false)
        }
        Mutation::Replace(body) => {
            let old = existing.ok_or_else(|| ApiError::not_found(rt, t.name()))?;
            let mut obj = body.clone();
            if t.sub.as_deref() != Some("scale") {
                check_kind(rt, &obj)?;
            }
            precondition(rt, t.name(), &old, &obj)?;
            // Custom resources allow no unconditional updates (built-ins mostly do).
            if rt.custom
                && t.sub.as_deref() != Some("scale")
                && obj["metadata"]["resourceVersion"]
                    .as_str()
                    .is_none_or(str::is_empty)
            {
                return Err(ApiError::invalid(
                    rt,
                    t.name(),
                    vec![Cause::new(
                        "FieldValueInvalid",
                        "metadata.resourceVersion",
                        "Invalid value: 0x0: must be specified for an update",
                    )],
                ));
            }
            if t.sub.as_deref() == Some("scale") {
                obj = crate::scale::from_scale(rt, &old, &obj)?;
            }
            obj = present(rt, obj);
            (Some(old), obj, false)
        }
        Mutation::JsonPatch(patch) => {
            let old = existing.ok_or_else(|| ApiError::not_found(rt, t.name()))?;
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            let mut obj = patch_base(rt, t, &old);
            json_patch::patch(&mut obj, &ops).map_err(|e| patch_error(rt, t.name(), &e.to_string()))?;
            let obj = unpatch_base(rt, t, &old, obj)?;
            (Some(old), present(rt, obj), false)
        }
        Mutation::MergePatch(patch) => {
            let old = existing.ok_or_else(|| ApiError::not_found(rt, t.name()))?;
            precondition(rt, t.name(), &old, patch)?;
            let mut obj = patch_base(rt, t, &old);
            json_patch::merge(&mut obj, patch);
            let obj = unpatch_base(rt, t, &old, obj)?;
            (Some(old), present(rt, obj), false)
        }
        Mutation::StrategicPatch(patch) => {
            let old = existing.ok_or_else(|| ApiError::not_found(rt, t.name()))?;
            precondition(rt, t.name(), &old, patch)?;
            let mut obj = patch_base(rt, t, &old);
            merge(&mut obj, patch, &shape, Flavour::Strategic)?;
            let obj = unpatch_base(rt, t, &old, obj)?;
            (Some(old), present(rt, obj), false)
        }
        Mutation::Apply(body) => {
            let mut applied = body.clone();
            check_kind(rt, &applied)?;
            if applied["kind"].is_null() || applied["apiVersion"].is_null() {
                return Err(ApiError::bad_request(
                    "apiVersion and kind must be set in an applied configuration",
                ));
            }
            // An applied configuration may leave the name out (controllers applying only `status` do).
            let body_name = applied["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if body_name.is_empty() {
                applied["metadata"]["name"] = json!(t.name());
            } else if body_name != t.name() {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
            if rt.namespaced {
                applied["metadata"]["namespace"] = json!(t.ns());
            }
            default_builtin(rt, &mut applied, false);
            if let Some(old) = &existing {
                precondition(rt, t.name(), old, &applied)?;
            }
            if existing.is_none() && t.sub.is_some() {
                return Err(ApiError::not_found(rt, t.name()));
            }
            let force = req.flag("force");
            let merged = fieldset::apply(existing.as_ref(), &applied, &writer, force, &shape, rt.status)
                .map_err(|c| conflict_error(rt, t.name(), &c))?;
            let mut merged = present(rt, merged);
            if existing.is_none() {
                merged["metadata"]["name"] = json!(t.name());
                if rt.namespaced {
                    merged["metadata"]["namespace"] = json!(t.ns());
                }
            }
            (existing, merged, true)
        }
    };

    // 2. Server-side rules: identity, subresource split, generation, defaults, ownership, validation.
    default_builtin(rt, &mut new, true);
    let mut warnings = vec![];
    match &old {
        None => {
            let m = &mut new["metadata"];
            m["uid"] = json!(crate::api::new_uid());
            m["creationTimestamp"] = json!(now);
            if let Some(obj) = m.as_object_mut() {
                for k in [
                    "resourceVersion",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "selfLink",
                ] {
                    obj.remove(k);
                }
            }
            if rt.generation {
                new["metadata"]["generation"] = json!(1);
            } else if let Some(m) = new["metadata"].as_object_mut() {
                m.remove("generation");
            }
            if rt.status
                && rt.custom
                && let Some(o) = new.as_object_mut()
            {
                o.remove("status");
            }
            validate_name(rt, &new)?;
        }
        Some(old) => {
            if ns_name(&new).1 != ns_name(old).1 {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "namespace",
                "generation",
                "name",
            ] {
                match old["metadata"].get(k) {
                    Some(v) => new["metadata"][k] = v.clone(),
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove(k);
                        }
                    }
                }
            }
            if !old["metadata"]["deletionTimestamp"].is_null() {
                // Finalizers may only be removed once deletion started.
                let before: Vec<Value> = old["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let after: Vec<Value> = new["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                if after.iter().any(|f| !before.contains(f)) {
                    return Err(ApiError::forbidden(format!(
                        "{} \"{}\" is forbidden: no new finalizers can be added if the object is being deleted",
                        crate::error::qualified(rt),
                        t.name()
                    )));
                }
            }
            match t.sub.as_deref() {
                Some("status") => {
                    let mut keep = old.clone();
                    keep["status"] = new.get("status").cloned().unwrap_or(Value::Null);
                    if keep["status"].is_null()
                        && let Some(o) = keep.as_object_mut()
                    {
                        o.remove("status");
                    }
                    keep["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
                    new = keep;
                }
                Some("scale") => {}
                _ if rt.status => match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(o) = new.as_object_mut() {
                            o.remove("status");
                        }
                    }
                },
                _ => {}
            }
            if rt.generation && spec_of(old) != spec_of(&new) {
                let g = old["metadata"]["generation"].as_i64().unwrap_or(0);
                new["metadata"]["generation"] = json!(g + 1);
            }
        }
    }
    if !applied {
        if let Some(m) = new["metadata"].as_object_mut()
            && old.is_none()
        {
            m.remove("managedFields");
        }
        if let Some(old) = &old {
            new["metadata"]["managedFields"] = old["metadata"]["managedFields"].clone();
        }
        fieldset::record_update(old.as_ref(), &mut new, &writer, &shape, rt.status);
    }
    if rt.custom && t.sub.as_deref() != Some("status") {
        warnings = validation::custom_resource(rt, &mut new, old.as_ref(), fv)?;
    } else if rt.custom {
        validation::custom_resource(rt, &mut new, old.as_ref(), FieldValidation::Ignore)?;
    }
    if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
        crate::crd::validate(rt, &new)?;
        new["status"] = crate::crd::accepted_status(&new, &now);
    }
    if rt.plural == "namespaces" && rt.group.is_empty() {
        let name = ns_name(&new).1;
        new["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
        if new["status"]["phase"].is_null() {
            new["status"]["phase"] = json!("Active");
        }
        if new["spec"]["finalizers"].is_null() {
            new["spec"]["finalizers"] = json!(["kubernetes"]);
        }
    }
    let unchanged = old
        .as_ref()
        .is_some_and(|o| without_times(o) == without_times(&new));
    Ok(Planned {
        old,
        new,
        unchanged,
        warnings,
    })
}

/// What a JSON or merge patch applies to: the whole object, or the Scale for `/scale`.
fn patch_base(rt: &ResourceType, t: &Target, old: &Value) -> Value {
    if t.sub.as_deref() == Some("scale") {
        crate::scale::to_scale(rt, old)
    } else {
        old.clone()
    }
}

fn unpatch_base(rt: &ResourceType, t: &Target, old: &Value, patched: Value) -> Result<Value, ApiError> {
    if t.sub.as_deref() == Some("scale") {
        crate::scale::from_scale(rt, old, &patched)
    } else {
        Ok(patched)
    }
}

fn patch_error(rt: &ResourceType, name: &str, why: &str) -> ApiError {
    if why.contains("test") {
        ApiError::invalid(
            rt,
            name,
            vec![Cause::new(
                "FieldValueInvalid",
                "",
                format!("the server rejected our request due to an error in our request: {why}"),
            )],
        )
    } else {
        ApiError::new(
            422,
            "Invalid",
            format!("the server rejected our request due to an error in our request: {why}"),
        )
    }
}

fn without_times(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(list) = v["metadata"]["managedFields"].as_array_mut() {
        for e in list {
            if let Some(o) = e.as_object_mut() {
                o.remove("time");
            }
        }
    }
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("resourceVersion");
    }
    v
}

fn spec_of(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("metadata");
        o.remove("status");
        o.remove("apiVersion");
        o.remove("kind");
    }
    v
}

fn check_kind(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if let Some(k) = obj["kind"].as_str()
        && k != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    if let Some(av) = obj["apiVersion"].as_str() {
        let (g, _) = crate::registry::split_api_version(av);
        if g != rt.group {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
    }
    Ok(())
}

fn precondition(rt: &ResourceType, name: &str, old: &Value, new: &Value) -> Result<(), ApiError> {
    if let Some(want) = new["metadata"]["resourceVersion"]
        .as_str()
        .filter(|s| !s.is_empty())
        && Some(want) != old["metadata"]["resourceVersion"].as_str()
    {
        return Err(ApiError::stale(rt, name));
    }
    if let Some(want) = new["metadata"]["uid"].as_str().filter(|s| !s.is_empty())
        && Some(want) != old["metadata"]["uid"].as_str()
    {
        return Err(ApiError::conflict(
            rt,
            name,
            "Precondition failed: UID in precondition does not match the object",
        ));
    }
    Ok(())
}

fn conflict_error(rt: &ResourceType, name: &str, conflicts: &[fieldset::Conflict]) -> ApiError {
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| {
            format!(
                "conflict with \"{}\" using {}: {}",
                c.manager, c.api_version, c.field
            )
        })
        .collect();
    let message = if conflicts.len() == 1 {
        format!("Apply failed with 1 conflict: {}", lines[0])
    } else {
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\" using {}", c.manager, c.api_version), "field": c.field}))
        .collect();
    ApiError {
        details: Some(json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": causes})),
        ..ApiError::new(409, "Conflict", message)
    }
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|p| {
            !p.is_empty()
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !p.starts_with('-')
                && !p.ends_with('-')
        })
}

fn validate_name(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let label_like = rt.plural == "namespaces" || rt.plural == "services";
    let ok = if label_like {
        is_dns_subdomain(name) && !name.contains('.') && name.len() <= 63
    } else {
        is_dns_subdomain(name)
    };
    if ok {
        return Ok(());
    }
    let what = if label_like {
        "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
    } else {
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
    };
    Err(ApiError::invalid(
        rt,
        name,
        vec![Cause::new(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": {what}"),
        )],
    ))
}

/// The few defaults built-in kinds get that Sluice's code reads back. `all: false` fills in only the
/// defaults of list-map keys (`protocol`), which an applied configuration needs to be merged correctly.
fn default_builtin(rt: &ResourceType, obj: &mut Value, all: bool) {
    if rt.custom {
        return;
    }
    // `get_mut` chains, never `obj["a"]["b"]` writes: indexing would invent the missing levels.
    fn default_protocols(ports: Option<&mut Value>) {
        for p in ports.and_then(Value::as_array_mut).into_iter().flatten() {
            if p.get("protocol").is_none_or(Value::is_null)
                && let Some(m) = p.as_object_mut()
            {
                m.insert("protocol".into(), json!("TCP"));
            }
        }
    }
    fn default_pod_spec(spec: Option<&mut Value>) {
        let Some(spec) = spec else { return };
        for key in ["containers", "initContainers"] {
            for c in spec
                .get_mut(key)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                default_protocols(c.get_mut("ports"));
            }
        }
    }
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "pods") => {
            default_pod_spec(obj.get_mut("spec"));
            // No kubelet or scheduler here: a new pod is Pending until someone writes its status.
            let no_phase = obj
                .get("status")
                .and_then(|s| s.get("phase"))
                .is_none_or(Value::is_null);
            if all
                && no_phase
                && let Some(o) = obj.as_object_mut()
                && let Some(st) = o.entry("status").or_insert_with(|| json!({})).as_object_mut()
            {
                st.insert("phase".into(), json!("Pending"));
            }
        }
        ("apps", "deployments") => {
            let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
                return;
            };
            if all && !spec.contains_key("replicas") {
                spec.insert("replicas".into(), json!(1));
            }
            default_pod_spec(spec.get_mut("template").and_then(|t| t.get_mut("spec")));
        }
        ("", "secrets") => {
            fold_string_data(obj);
            if all
                && obj.get("type").is_none_or(Value::is_null)
                && let Some(o) = obj.as_object_mut()
            {
                o.insert("type".into(), json!("Opaque"));
            }
        }
        ("", "services") => {
            default_protocols(obj.get_mut("spec").and_then(|s| s.get_mut("ports")));
            if !all {
                return;
            }
            let (ns, name) = ns_name(obj);
            let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
                return;
            };
            let type_ = spec.entry("type").or_insert_with(|| json!("ClusterIP")).clone();
            if type_ != "ExternalName" && spec.get("clusterIP").is_none_or(Value::is_null) {
                // A stable address per service name, from the default service CIDR 10.96.0.0/12.
                let h = crate::discovery::fxhash(&format!("{ns}/{name}"));
                let ip = format!("10.96.{}.{}", (h >> 8) & 0xff, (h & 0xfe).max(2));
                spec.insert("clusterIP".into(), json!(ip));
                spec.insert("clusterIPs".into(), json!([ip]));
            }
        }
        _ => {}
    }
}

/// As kube-apiserver does on every write: `stringData` is write-only, merged into `data` (base64, winning
/// over a `data` key of the same name) and dropped.
fn fold_string_data(obj: &mut Value) {
    use base64::Engine;
    let Some(o) = obj.as_object_mut() else { return };
    let Some(Value::Object(plain)) = o.remove("stringData") else {
        return;
    };
    let data = o.entry("data").or_insert_with(|| json!({}));
    if data.is_null() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (k, v) in plain {
            let text = v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
            data.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(text)));
        }
    }
}

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

fn delete(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
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

fn delete_collection(state: &Arc<State>, t: &Target, req: &Req) -> Result<Response<Body>, ApiError> {
    let (propagation, _) = delete_options(req)?;
    let (labels, fields) = selectors(req)?;
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
