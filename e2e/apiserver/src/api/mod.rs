//! HTTP entry point: authentication, then routing of discovery, OpenAPI, reviews, aggregated groups and
//! resource paths. The resource verbs live one per module: [`get`], [`list`], [`watch`], [`create`],
//! [`update`], [`patch`], [`apply`] and [`delete`]; the writes share [`write`](mod@write) (optimistic concurrency,
//! admission, the server-side rules every write gets) with [`checks`] and [`defaults`].

use std::sync::Arc;

use http::{Method, Request, Response, header};
use http_body_util::BodyExt;

use crate::error::ApiError;
use crate::request::Req;
use crate::response::{Body, error_response, json_response, plain_ok};
use crate::state::State;
use write::Mutation;

pub mod apply;
pub mod checks;
pub mod create;
pub mod defaults;
pub mod delete;
pub mod get;
pub mod list;
pub mod patch;
mod reviews;
pub mod update;
pub mod watch;
pub mod write;

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
        ["apis", "authentication.k8s.io", "v1", "tokenreviews"] if post => reviews::token_review(state, req),
        ["apis", "authorization.k8s.io", "v1", "subjectaccessreviews"] if post => {
            reviews::subject_access_review(state, req)
        }
        ["version"] if get => Ok(json_response(200, &crate::discovery::version())),
        ["healthz" | "readyz" | "livez", ..] if get => Ok(plain_ok()),
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

/// The resource verbs on `/api/v1/...` and `/apis/{group}/{version}/...`, by method.
async fn resource(
    state: &Arc<State>,
    req: &Req,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response<Body>, ApiError> {
    let target = crate::target::parse(&state.store(), group, version, rest, &req.path)?;
    let m = &req.method;
    match (m, target.name.is_some()) {
        (&Method::GET, false) if req.flag("watch") => watch::serve(state, &target, req),
        (&Method::GET, false) => list::list(state, &target, req),
        (&Method::GET, true) => get::get(state, &target, req),
        (&Method::POST, false) => {
            let body = req.body_value()?;
            write::write(state, &target, req, Mutation::Create(body)).await
        }
        (&Method::PUT, true) => {
            let body = req.body_value()?;
            write::write(state, &target, req, Mutation::Replace(body)).await
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
            write::write(state, &target, req, mutation).await
        }
        (&Method::DELETE, true) => delete::delete(state, &target, req),
        (&Method::DELETE, false) => delete::delete_collection(state, &target, req),
        _ => Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({m})"
        ))),
    }
}
