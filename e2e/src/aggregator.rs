//! API aggregation: requests for a group-version that an APIService hands to a Service are proxied to
//! it (the address given by `TestApiServer::route_service`), as kube-aggregator does for
//! `external.metrics.k8s.io`. The backend's certificate is checked against `caBundle` for the name
//! `service.namespace.svc`, or not at all with `insecureSkipTLSVerify`.
//!
//! Like kube-aggregator, the proxy authenticates itself to the backend as the *front proxy*: it presents
//! a client certificate ([`FrontProxy`], common name `front-proxy-client`, signed by a front-proxy CA of
//! its own, as kubeadm sets it up) and names the user it authenticated in `X-Remote-User`, one
//! `X-Remote-Group` per group and `X-Remote-Extra-*`; the caller's own credentials are not forwarded.
//! The server publishes that CA and those header names in `kube-system/extension-apiserver-authentication`
//! ([`authentication_config_map`]), where aggregated API servers read them.

use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{PrivateKeyDer, pem::PemObject};

use base64::Engine;
use http::{Response, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use serde_json::Value;

use crate::api::{Req, User};
use crate::error::{ApiError, Error, Result};
use crate::registry::ResKey;
use crate::server::{Body, State};
use crate::store::Store;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Common name of the front-proxy client certificate (kubeadm's).
pub const FRONT_PROXY_CLIENT_NAME: &str = "front-proxy-client";
/// Namespace of the ConfigMap aggregated API servers read the front-proxy settings from.
pub const AUTHENTICATION_CONFIGMAP_NAMESPACE: &str = "kube-system";
/// Its name.
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";

/// The aggregator's identity towards backends: a front-proxy CA and the client certificate it signs.
#[derive(Clone, Debug)]
pub struct FrontProxy {
    /// The CA backends trust (`requestheader-client-ca-file`).
    pub ca_pem: String,
    /// The client certificate the proxy presents.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

fn tls_err(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

impl FrontProxy {
    /// A fresh front-proxy CA and a client certificate with common name `common_name` signed by it.
    /// Tests make a second one to play a stranger with a certificate from another CA.
    pub fn generate(common_name: &str) -> Result<Self> {
        let ca_key = KeyPair::generate().map_err(tls_err)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        ca.distinguished_name.push(DnType::CommonName, "front-proxy-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(tls_err)?;
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().map_err(tls_err)?;
        let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(tls_err)?;
        leaf.distinguished_name.push(DnType::CommonName, common_name);
        leaf.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&key, &issuer).map_err(tls_err)?;
        Ok(FrontProxy {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A rustls client config that presents the client certificate and trusts the PEM bundle `ca_pem`
    /// (or, with `None`, any server certificate: `insecureSkipTLSVerify`).
    pub fn client_config(&self, ca_pem: Option<&[u8]>) -> Result<Arc<rustls::ClientConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(tls_err)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(tls_err)?;
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?;
        let builder = match ca_pem {
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca) {
                    roots.add(cert.map_err(tls_err)?).map_err(tls_err)?;
                }
                builder.with_root_certificates(roots)
            }
            None => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
        };
        Ok(Arc::new(
            builder.with_client_auth_cert(certs, key).map_err(tls_err)?,
        ))
    }
}

/// `kube-system/extension-apiserver-authentication` as kube-apiserver publishes it: the front-proxy CA,
/// the allowed client names and header names (JSON lists in strings), and the cluster's client CA.
pub fn authentication_config_map(front_proxy: &FrontProxy, client_ca_pem: Option<&str>) -> Value {
    let mut data = serde_json::json!({
        "requestheader-client-ca-file": front_proxy.ca_pem,
        "requestheader-allowed-names": format!("[\"{FRONT_PROXY_CLIENT_NAME}\"]"),
        "requestheader-username-headers": "[\"X-Remote-User\"]",
        "requestheader-group-headers": "[\"X-Remote-Group\"]",
        "requestheader-extra-headers-prefix": "[\"X-Remote-Extra-\"]",
    });
    if let Some(ca) = client_ca_pem {
        data["client-ca-file"] = Value::String(ca.to_string());
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": AUTHENTICATION_CONFIGMAP, "namespace": AUTHENTICATION_CONFIGMAP_NAMESPACE},
        "data": data,
    })
}

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
    let addr = state
        .services
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(ns.to_string(), svc_name.to_string(), port))
        .copied()
        .ok_or_else(|| {
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

/// `insecureSkipTLSVerify: true`: any certificate is accepted, signatures are still checked.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
