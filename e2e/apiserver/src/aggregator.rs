//! API aggregation: requests for a group-version that an APIService hands to a Service are proxied to
//! it (the address given by `TestApiServer::route_service`), as kube-aggregator does for
//! `external.metrics.k8s.io`. The backend's certificate is checked against `caBundle` for the name
//! `service.namespace.svc`, or not at all with `insecureSkipTLSVerify`.
//!
//! Like kube-aggregator, the proxy authenticates itself to the backend as the *front proxy*
//! ([`FrontProxy`]): it presents the front proxy's client certificate and names the user it
//! authenticated in `X-Remote-User` and one `X-Remote-Group` per group; the caller's own credentials are
//! not forwarded.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::{Response, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde_json::Value;

use crate::error::ApiError;
pub use crate::front_proxy::{
    AUTHENTICATION_CONFIGMAP, AUTHENTICATION_CONFIGMAP_NAMESPACE, FRONT_PROXY_CLIENT_NAME, FrontProxy,
    authentication_config_map,
};
use crate::registry::ResKey;
use crate::request::Req;
use crate::response::Body;
use crate::state::State;
use crate::store::Store;
use crate::user::User;

const TIMEOUT: Duration = Duration::from_secs(30);

/// The request headers naming `user` to a backend.
fn user_headers(mut builder: http::request::Builder, user: &User) -> http::request::Builder {
    builder = builder.header("X-Remote-User", &user.username);
    for group in &user.groups {
        builder = builder.header("X-Remote-Group", group);
    }
    builder
}

/// APIServices backed by a Service: `(group, version)` pairs, for discovery.
pub fn served(store: &Store) -> Vec<(String, String)> {
    let key = ResKey {
        group: "apiregistration.k8s.io".into(),
        plural: "apiservices".into(),
    };
    store
        .list(&key, None)
        .into_iter()
        .filter(|a| a["spec"]["service"].is_object())
        .map(|a| {
            (
                a["spec"]["group"].as_str().unwrap_or_default().to_string(),
                a["spec"]["version"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The APIService `{version}.{group}` if it hands its group to a Service.
pub fn find(store: &Store, group: &str, version: &str) -> Option<Value> {
    let key = ResKey {
        group: "apiregistration.k8s.io".into(),
        plural: "apiservices".into(),
    };
    store
        .get(&key, "", &format!("{version}.{group}"))
        .filter(|a| a["spec"]["service"].is_object())
        .cloned()
}

/// Forwards the request to the APIService's backend and relays its answer.
pub async fn proxy(state: &Arc<State>, apiservice: &Value, req: &Req) -> Result<Response<Body>, ApiError> {
    let name = apiservice["metadata"]["name"].as_str().unwrap_or_default();
    let unavailable = |why: String| {
        ApiError::new(
            503,
            "ServiceUnavailable",
            format!("the APIService {name} is not available: {why}"),
        )
    };
    let svc = &apiservice["spec"]["service"];
    let (ns, svc_name) = (
        svc["namespace"].as_str().unwrap_or_default(),
        svc["name"].as_str().unwrap_or_default(),
    );
    let port = svc["port"].as_u64().unwrap_or(443) as u16;
    let addr = state.service_route(ns, svc_name, port).ok_or_else(|| {
        unavailable(format!(
            "service {ns}/{svc_name}:{port} has no route (call route_service)"
        ))
    })?;
    let tls = if apiservice["spec"]["insecureSkipTLSVerify"] == Value::Bool(true) {
        state.front_proxy.client_config(None)
    } else {
        let ca = apiservice["spec"]["caBundle"]
            .as_str()
            .ok_or_else(|| unavailable("no caBundle".into()))?;
        let ca = base64::engine::general_purpose::STANDARD
            .decode(ca)
            .map_err(|e| unavailable(format!("caBundle: {e}")))?;
        state.front_proxy.client_config(Some(&ca))
    }
    .map_err(|e| unavailable(e.to_string()))?;
    let server_name = format!("{svc_name}.{ns}.svc");
    let mut uri = req.path.clone();
    if !req.query.is_empty() {
        let q: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(req.query.iter())
            .finish();
        uri = format!("{uri}?{q}");
    }
    let mut builder = user_headers(
        http::Request::builder()
            .method(req.method.clone())
            .uri(uri)
            .header(header::HOST, &server_name),
        &req.user,
    );
    if !req.accept.is_empty() {
        builder = builder.header(header::ACCEPT, &req.accept);
    }
    if !req.content_type.is_empty() {
        builder = builder.header(header::CONTENT_TYPE, &req.content_type);
    }
    let request = builder
        .body(Full::new(req.body.clone()))
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let exchange = async move {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("dial {addr}: {e}"))?;
        let sni = ServerName::try_from(server_name).map_err(|e| e.to_string())?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(sni, tcp)
            .await
            .map_err(|e| format!("tls: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let resp = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>((parts, bytes))
    };
    let (parts, bytes) = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| unavailable("timed out".into()))?
        .map_err(unavailable)?;
    let mut out = Response::builder().status(parts.status);
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
        out = out.header(header::CONTENT_TYPE, ct);
    }
    out.body(Full::new(bytes).boxed())
        .map_err(|e| ApiError::internal(e.to_string()))
}
