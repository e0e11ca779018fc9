//! Who is calling the external metrics API, decided the way Kubernetes' aggregated API servers decide
//! it (k8s.io/apiserver's delegated authentication, as prometheus-adapter and KEDA's metrics server use):
//!
//! 1. **Front proxy.** The kube-apiserver's aggregator calls with a TLS client certificate signed by the
//!    `requestheader-client-ca-file` CA and a common name in `requestheader-allowed-names` (an empty list
//!    allows any), and names the user it authenticated in `X-Remote-User`, `X-Remote-Group` and
//!    `X-Remote-Extra-*` (the header names come from the same ConfigMap). Only then are those headers
//!    believed. The settings live in `kube-system/extension-apiserver-authentication`, which
//!    [`Authenticator::watch_config`] follows, so a rotated front-proxy CA is picked up without a restart.
//! 2. **Bearer token**, checked with a `TokenReview` against the main API server (cached briefly).
//!
//! Every authenticated user is in the group `system:authenticated`, added when the front proxy did not
//! name it (as k8s.io/apiserver's `AuthenticatedGroupAdder` does): the aggregator's own discovery
//! requests come as `system:kube-aggregator` with no group, and RBAC allows discovery to
//! `system:authenticated` — without it the APIService's discovery fails, the aggregator marks the group
//! stale, and the namespace controller cannot finish deleting any namespace.
//!
//! Anything else is unauthenticated (401). As in k8s.io/apiserver, the TLS layer only *requests* a
//! client certificate and checks that the client holds its key ([`RequestClientCertificate`]); the chain
//! is verified here, per request, against the CA loaded now — so a wrong certificate is a 401 naming
//! why, not a failed handshake, and a token still works on the same connection.
//!
//! Not done: client certificates signed by the cluster's `client-ca-file` (users with their own
//! certificates calling the metrics API directly); the aggregator and tokens cover the HPA and kubectl.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, SystemTime},
};

use futures::StreamExt;
use http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api, Client,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
    client::danger::HandshakeSignatureValid,
    crypto::CryptoProvider,
    pki_types::{CertificateDer, UnixTime, pem::PemObject},
    server::{
        WebPkiClientVerifier,
        danger::{ClientCertVerified, ClientCertVerifier},
    },
};
use serde_json::json;
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cache::TtlCache;

/// Namespace of the ConfigMap the API server publishes its front-proxy settings in.
pub const AUTHENTICATION_CONFIGMAP_NAMESPACE: &str = "kube-system";
/// Name of that ConfigMap.
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";
/// How long a `TokenReview` answer is reused (k8s.io/apiserver's default is 10 s).
pub const TOKEN_CACHE_TTL: Duration = Duration::from_secs(10);
/// Most token answers kept at once.
pub const TOKEN_CACHE_CAPACITY: usize = 4096;
/// Most rejected tokens remembered, apart from the accepted ones: made-up tokens only push out each other.
pub const REJECTED_TOKEN_CACHE_CAPACITY: usize = 1024;

/// An authenticated caller.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct User {
    /// User name, e.g. `system:serviceaccount:kube-system:horizontal-pod-autoscaler`.
    pub name: String,
    /// The user's uid, when the authenticator knows one.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (scopes and the like), passed on to the SubjectAccessReview.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The group every authenticated user belongs to.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

impl User {
    /// The user with [`AUTHENTICATED_GROUP`] among its groups (added once, at the end).
    pub fn authenticated(mut self) -> Self {
        if !self.groups.iter().any(|g| g == AUTHENTICATED_GROUP) {
            self.groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        self
    }
}

pub use crate::serve::PeerCertificates;

/// Why a caller is not authenticated: the text goes into the 401's Status message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unauthenticated(pub String);

/// The front-proxy settings of `extension-apiserver-authentication`, ready to check requests.
#[derive(Debug)]
pub struct FrontProxy {
    verifier: Arc<dyn ClientCertVerifier>,
    /// Common names a front-proxy certificate may have; empty: any signed by the CA.
    pub allowed_names: Vec<String>,
    /// Headers naming the user (the first non-empty one counts).
    pub username_headers: Vec<String>,
    /// Headers naming groups (every value of each).
    pub group_headers: Vec<String>,
    /// Prefixes of headers carrying extra attributes.
    pub extra_header_prefixes: Vec<String>,
}

/// A ConfigMap key holding a JSON list of strings (`'["X-Remote-User"]'`), as kube-apiserver writes it.
fn string_list(data: &BTreeMap<String, String>, key: &str) -> Result<Vec<String>, String> {
    match data.get(key).map(|s| s.trim()) {
        None | Some("") => Ok(vec![]),
        Some(text) => {
            serde_json::from_str(text).map_err(|e| format!("{key}: not a JSON list of strings: {e}"))
        }
    }
}

impl FrontProxy {
    /// Reads the settings from the ConfigMap's data. `Ok(None)`: the API server has no front proxy
    /// configured (no `requestheader-client-ca-file`), so no request can come through it.
    pub fn from_config_map(data: &BTreeMap<String, String>) -> Result<Option<Self>, String> {
        let Some(ca_pem) = data
            .get("requestheader-client-ca-file")
            .filter(|s| !s.trim().is_empty())
        else {
            return Ok(None);
        };
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            let cert = cert.map_err(|e| format!("requestheader-client-ca-file: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("requestheader-client-ca-file: {e}"))?;
        }
        if roots.is_empty() {
            return Err("requestheader-client-ca-file holds no certificate".into());
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| format!("requestheader-client-ca-file: {e}"))?;
        Ok(Some(Self {
            verifier,
            allowed_names: string_list(data, "requestheader-allowed-names")?,
            username_headers: string_list(data, "requestheader-username-headers")?,
            group_headers: string_list(data, "requestheader-group-headers")?,
            extra_header_prefixes: string_list(data, "requestheader-extra-headers-prefix")?,
        }))
    }

    /// The user the front proxy names, if `chain` is a front-proxy certificate valid at `now`.
    /// `Ok(None)`: a valid front proxy that named no user (another authenticator may still succeed).
    pub fn authenticate(
        &self,
        chain: &[CertificateDer<'_>],
        headers: &HeaderMap,
        now: UnixTime,
    ) -> Result<Option<User>, Unauthenticated> {
        let (end_entity, intermediates) = chain
            .split_first()
            .ok_or_else(|| Unauthenticated("no client certificate".into()))?;
        self.verifier
            .verify_client_cert(end_entity, intermediates, now)
            .map_err(|e| {
                Unauthenticated(format!(
                    "the client certificate is not a front-proxy certificate signed by requestheader-client-ca-file: {e}"
                ))
            })?;
        let cn = common_name(end_entity).unwrap_or_default();
        if !self.allowed_names.is_empty() && !self.allowed_names.contains(&cn) {
            return Err(Unauthenticated(format!(
                "the client certificate's common name {cn:?} is not in requestheader-allowed-names {:?}",
                self.allowed_names
            )));
        }
        let values = |name: &str| {
            headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        let Some(name) = self
            .username_headers
            .iter()
            .find_map(|h| values(h).into_iter().find(|v| !v.is_empty()))
        else {
            return Ok(None);
        };
        let groups = self.group_headers.iter().flat_map(|h| values(h)).collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let lower = header.as_str();
            for prefix in &self.extra_header_prefixes {
                let prefix = prefix.to_ascii_lowercase();
                if let Some(key) = lower.strip_prefix(&prefix)
                    && let Ok(v) = value.to_str()
                {
                    extra
                        .entry(percent_decode(key).to_ascii_lowercase())
                        .or_default()
                        .push(v.to_owned());
                }
            }
        }
        Ok(Some(User {
            name,
            uid: String::new(),
            groups,
            extra,
        }))
    }
}

/// `%2F` → `/` in extra keys, as the front proxy escapes them.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The subject's common name of a DER certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned)
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS side of client certificates, as Go's `tls.RequestClientCert`: a certificate is asked for but
/// optional, and the handshake only proves the client holds its key. Whether it is trusted is decided
/// per request by [`FrontProxy::authenticate`], against the CA loaded at that moment.
#[derive(Debug)]
pub struct RequestClientCertificate(Arc<CryptoProvider>);

impl Default for RequestClientCertificate {
    fn default() -> Self {
        Self(provider())
    }
}

impl ClientCertVerifier for RequestClientCertificate {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // No hints: a client then offers whatever certificate it has.
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
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

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Authenticates requests: front proxy first, then bearer tokens.
pub struct Authenticator {
    front_proxy: watch::Sender<Option<Arc<FrontProxy>>>,
    client: Client,
    /// Accepted and rejected tokens in caches of their own, so a flood of made-up tokens cannot push
    /// out the answers real callers rely on.
    accepted: TtlCache<[u8; 32], User>,
    rejected: TtlCache<[u8; 32], Unauthenticated>,
}

impl Authenticator {
    /// An authenticator that reviews tokens through `client`. No front proxy is trusted until
    /// [`Self::set_front_proxy`] or [`Self::watch_config`] loads one.
    pub fn new(client: Client) -> Self {
        Self {
            front_proxy: watch::Sender::new(None),
            client,
            accepted: TtlCache::new(TOKEN_CACHE_CAPACITY),
            rejected: TtlCache::new(REJECTED_TOKEN_CACHE_CAPACITY),
        }
    }

    /// Trusts `front_proxy` from now on (`None`: no front proxy).
    pub fn set_front_proxy(&self, front_proxy: Option<FrontProxy>) {
        self.front_proxy.send_replace(front_proxy.map(Arc::new));
    }

    /// Resolves once a front proxy is trusted (tests wait on it before calling).
    pub async fn front_proxy_loaded(&self) {
        let mut rx = self.front_proxy.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Follows `kube-system/extension-apiserver-authentication` until `shutdown`: every change reloads
    /// the front-proxy settings; a deleted ConfigMap trusts no front proxy. A malformed one keeps the
    /// settings loaded before (and says why in the log).
    pub async fn watch_config(self: Arc<Self>, client: Client, shutdown: CancellationToken) {
        let api: Api<ConfigMap> = Api::namespaced(client, AUTHENTICATION_CONFIGMAP_NAMESPACE);
        let config = watcher::Config::default().fields(&format!("metadata.name={AUTHENTICATION_CONFIGMAP}"));
        let events = watcher(api, config).default_backoff();
        tokio::pin!(events);
        loop {
            let event = tokio::select! {
                e = events.next() => e,
                () = shutdown.cancelled() => return,
            };
            match event {
                None => return,
                Some(Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm))) => self.load(&cm),
                Some(Ok(watcher::Event::Delete(_))) => {
                    tracing::warn!("{AUTHENTICATION_CONFIGMAP} was deleted: no front proxy is trusted");
                    self.set_front_proxy(None);
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching {AUTHENTICATION_CONFIGMAP_NAMESPACE}/{AUTHENTICATION_CONFIGMAP}")
                }
            }
        }
    }

    fn load(&self, cm: &ConfigMap) {
        match FrontProxy::from_config_map(&cm.data.clone().unwrap_or_default()) {
            Ok(fp) => {
                tracing::info!(
                    front_proxy = fp.is_some(),
                    "loaded {AUTHENTICATION_CONFIGMAP_NAMESPACE}/{AUTHENTICATION_CONFIGMAP}"
                );
                self.set_front_proxy(fp);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "{AUTHENTICATION_CONFIGMAP_NAMESPACE}/{AUTHENTICATION_CONFIGMAP} is malformed; keeping the settings loaded before"
            ),
        }
    }

    /// The caller of a request with these TLS peer certificates and headers.
    pub async fn authenticate(
        &self,
        peer: Option<&PeerCertificates>,
        headers: &HeaderMap,
    ) -> Result<User, Unauthenticated> {
        let mut why = vec![];
        if let Some(PeerCertificates(chain)) = peer.filter(|p| !p.0.is_empty()) {
            let front_proxy = self.front_proxy.borrow().clone();
            match front_proxy {
                None => why.push(format!(
                    "a client certificate was presented but no front proxy is trusted ({AUTHENTICATION_CONFIGMAP_NAMESPACE}/{AUTHENTICATION_CONFIGMAP} not loaded or without requestheader-client-ca-file)"
                )),
                Some(fp) => match fp.authenticate(chain, headers, UnixTime::since_unix_epoch(now())) {
                    Ok(Some(user)) => return Ok(user.authenticated()),
                    Ok(None) => why.push(format!(
                        "the front proxy named no user (headers {:?})",
                        fp.username_headers
                    )),
                    Err(e) => why.push(e.0),
                },
            }
        }
        if let Some(token) = bearer_token(headers) {
            match self.review_token(token).await {
                Ok(user) => return Ok(user.authenticated()),
                Err(e) => why.push(e.0),
            }
        }
        if why.is_empty() {
            why.push("no front-proxy client certificate and no bearer token".into());
        }
        Err(Unauthenticated(why.join("; ")))
    }

    async fn review_token(&self, token: &str) -> Result<User, Unauthenticated> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(user) = self.accepted.get(&key) {
            return Ok(user);
        }
        if let Some(why) = self.rejected.get(&key) {
            return Err(why);
        }
        let review = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": {"token": token},
        }))
        .map_err(|e| Unauthenticated(e.to_string()))?;
        let api: Api<k8s_openapi::api::authentication::v1::TokenReview> = Api::all(self.client.clone());
        // An API server that cannot be asked is not cached: the next request asks again.
        let answered = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Unauthenticated(format!("TokenReview failed: {e}")))?;
        let status = answered.status.unwrap_or_default();
        let answer = match status.user.filter(|_| status.authenticated == Some(true)) {
            Some(u) => Ok(User {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }),
            None => Err(Unauthenticated(format!(
                "the bearer token was not accepted by TokenReview{}",
                status.error.map(|e| format!(": {e}")).unwrap_or_default()
            ))),
        };
        match &answer {
            Ok(user) => self.accepted.insert(key, user.clone(), TOKEN_CACHE_TTL),
            Err(why) => self.rejected.insert(key, why.clone(), TOKEN_CACHE_TTL),
        }
        answer
    }
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        KeyUsagePurpose,
    };

    /// A CA (PEM) and a client certificate (DER) with common name `cn` signed by it.
    fn ca_and_client(cn: &str) -> (String, CertificateDer<'static>) {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name.push(DnType::CommonName, "front-proxy-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, cn);
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&KeyPair::generate().unwrap(), &issuer).unwrap();
        (ca_cert.pem(), cert.der().clone())
    }

    fn config_map(ca_pem: &str, allowed: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("requestheader-client-ca-file".into(), ca_pem.into()),
            ("requestheader-allowed-names".into(), allowed.into()),
            (
                "requestheader-username-headers".into(),
                r#"["X-Remote-User"]"#.into(),
            ),
            (
                "requestheader-group-headers".into(),
                r#"["X-Remote-Group"]"#.into(),
            ),
            (
                "requestheader-extra-headers-prefix".into(),
                r#"["X-Remote-Extra-"]"#.into(),
            ),
        ])
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn now() -> UnixTime {
        UnixTime::since_unix_epoch(super::now())
    }

    #[test]
    fn the_front_proxy_names_the_user_its_groups_and_extras() {
        let (ca, cert) = ca_and_client("front-proxy-client");
        let fp = FrontProxy::from_config_map(&config_map(&ca, r#"["front-proxy-client"]"#))
            .unwrap()
            .unwrap();
        let h = headers(&[
            (
                "x-remote-user",
                "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
            ),
            ("x-remote-group", "system:serviceaccounts"),
            ("x-remote-group", "system:authenticated"),
            ("x-remote-extra-scopes%2Fa", "one"),
        ]);
        let user = fp.authenticate(&[cert], &h, now()).unwrap().unwrap();
        assert_eq!(
            user.name,
            "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
        );
        assert_eq!(user.groups, ["system:serviceaccounts", "system:authenticated"]);
        assert_eq!(user.extra["scopes/a"], ["one"]);
    }

    #[test]
    fn a_user_named_without_groups_is_still_in_system_authenticated() {
        // The aggregator's discovery requests: `system:kube-aggregator`, no X-Remote-Group.
        let user = User {
            name: "system:kube-aggregator".into(),
            uid: String::new(),
            groups: vec![],
            extra: BTreeMap::new(),
        };
        assert_eq!(user.authenticated().groups, [AUTHENTICATED_GROUP]);
        let user = User {
            name: "system:serviceaccount:kube-system:horizontal-pod-autoscaler".into(),
            uid: String::new(),
            groups: vec!["system:serviceaccounts".into(), AUTHENTICATED_GROUP.into()],
            extra: BTreeMap::new(),
        };
        assert_eq!(
            user.authenticated().groups,
            ["system:serviceaccounts", AUTHENTICATED_GROUP],
            "not added twice"
        );
    }

    #[test]
    fn a_certificate_from_another_ca_is_not_a_front_proxy() {
        let (ca, _) = ca_and_client("front-proxy-client");
        let (_, stranger) = ca_and_client("front-proxy-client");
        let fp = FrontProxy::from_config_map(&config_map(&ca, "[]"))
            .unwrap()
            .unwrap();
        let err = fp
            .authenticate(&[stranger], &headers(&[("x-remote-user", "admin")]), now())
            .unwrap_err();
        assert!(err.0.contains("requestheader-client-ca-file"), "{err}");
    }

    #[test]
    fn a_common_name_outside_the_allowed_names_is_refused_and_an_empty_list_allows_any() {
        let (ca, cert) = ca_and_client("someone-else");
        let h = headers(&[("x-remote-user", "admin")]);
        let strict = FrontProxy::from_config_map(&config_map(&ca, r#"["front-proxy-client"]"#))
            .unwrap()
            .unwrap();
        let err = strict
            .authenticate(std::slice::from_ref(&cert), &h, now())
            .unwrap_err();
        assert!(err.0.contains("\"someone-else\""), "{err}");
        let open = FrontProxy::from_config_map(&config_map(&ca, ""))
            .unwrap()
            .unwrap();
        assert_eq!(
            open.authenticate(&[cert], &h, now()).unwrap().unwrap().name,
            "admin"
        );
    }

    #[test]
    fn without_a_user_header_the_front_proxy_authenticates_nobody() {
        let (ca, cert) = ca_and_client("front-proxy-client");
        let fp = FrontProxy::from_config_map(&config_map(&ca, "[]"))
            .unwrap()
            .unwrap();
        assert_eq!(fp.authenticate(&[cert], &HeaderMap::new(), now()).unwrap(), None);
    }

    #[test]
    fn no_client_ca_means_no_front_proxy_and_a_bad_list_is_an_error_naming_the_key() {
        assert!(FrontProxy::from_config_map(&BTreeMap::new()).unwrap().is_none());
        let (ca, _) = ca_and_client("x");
        let err = FrontProxy::from_config_map(&config_map(&ca, "front-proxy-client")).unwrap_err();
        assert!(err.contains("requestheader-allowed-names"), "{err}");
    }
}
