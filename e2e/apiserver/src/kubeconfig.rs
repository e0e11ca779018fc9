//! The kubeconfig a server emits, so `kubectl` and kube clients reach it with its CA and token.

use base64::Engine;
use serde_json::json;

/// What a kubeconfig needs to know about the server.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `https://127.0.0.1:port` or `http://…`.
    pub url: String,
    /// CA certificate PEM, for https.
    pub ca_pem: Option<String>,
    /// Bearer token.
    pub token: String,
}

/// Context and cluster name in emitted kubeconfigs.
pub const CONTEXT_NAME: &str = "sluice-test";

/// A kubeconfig (YAML) whose current context targets the server, defaulting to `namespace`.
pub fn render(endpoint: &Endpoint, namespace: &str) -> String {
    let mut cluster = json!({"server": endpoint.url});
    if let Some(ca) = &endpoint.ca_pem {
        cluster["certificate-authority-data"] = json!(base64::engine::general_purpose::STANDARD.encode(ca));
    }
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CONTEXT_NAME, "cluster": cluster}],
        "users": [{"name": CONTEXT_NAME, "user": {"token": endpoint.token}}],
        "contexts": [{"name": CONTEXT_NAME, "context": {"cluster": CONTEXT_NAME, "user": CONTEXT_NAME, "namespace": namespace}}],
        "current-context": CONTEXT_NAME,
        "preferences": {},
    });
    serde_yaml::to_string(&doc).expect("a JSON value always renders as YAML")
}
