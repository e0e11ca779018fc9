//! API aggregation: an APIService that hands `external.metrics.k8s.io` to a Service makes the server
//! proxy that group to the backend, as kube-aggregator does for the HPA's external metrics.

use std::convert::Infallible;

use base64::Engine;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use sluice_e2e::Env;
use sluice_test_apiserver::tls::Pki;

/// A metrics backend answering discovery and one external metric.
async fn start_backend(pki: &Pki) -> std::net::SocketAddr {
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config().unwrap());
    serve_json(acceptor, |req| match req.uri().path() {
        "/apis/external.metrics.k8s.io/v1beta1" => {
            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "external.metrics.k8s.io/v1beta1",
            "resources": [{"name": "queue_depth", "singularName": "", "namespaced": true, "kind": "ExternalMetricValueList", "verbs": ["get"]}]})
        }
        p => {
            json!({"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1", "metadata": {},
            "items": [{"metricName": p.rsplit('/').next(), "metricLabels": {"selector": req.uri().query().unwrap_or_default()}, "timestamp": "2026-01-01T00:00:00Z", "value": "42"}]})
        }
    })
    .await
}

/// Serves HTTPS on a free port through `acceptor`, answering every request with `answer(request)` as JSON.
async fn serve_json(
    acceptor: tokio_rustls::TlsAcceptor,
    answer: fn(&hyper::Request<hyper::body::Incoming>) -> Value,
) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| async move {
                    let mut resp = hyper::Response::new(Full::new(Bytes::from(answer(&req).to_string())));
                    resp.headers_mut()
                        .insert(http::header::CONTENT_TYPE, "application/json".parse().unwrap());
                    Ok::<_, Infallible>(resp)
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_api_service_proxies_its_group_to_the_backend_service() {
    let env = Env::start().await.unwrap();
    let pki = Pki::generate(&["metrics.sluice-system.svc"]).unwrap();
    let backend = start_backend(&pki).await;
    env.server()
        .unwrap()
        .route_service("sluice-system", "metrics", 443, backend);
    let apiservice = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100, "versionPriority": 100,
                 "service": {"namespace": "sluice-system", "name": "metrics", "port": 443},
                 "caBundle": base64::engine::general_purpose::STANDARD.encode(&pki.ca_pem)},
    });
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
        "apiservices",
    );
    Api::<DynamicObject>::all_with(env.client(), &ar)
        .patch(
            "v1beta1.external.metrics.k8s.io",
            &PatchParams::apply("test"),
            &Patch::Apply(apiservice),
        )
        .await
        .unwrap();

    let client = env.client();
    let req = http::Request::get(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/team/queue_depth?labelSelector=queue%3Demails",
    )
    .body(vec![])
    .unwrap();
    let metrics: Value = client.request(req).await.unwrap();
    assert_eq!(metrics["items"][0]["value"], "42");
    assert_eq!(metrics["items"][0]["metricName"], "queue_depth");
    assert_eq!(
        metrics["items"][0]["metricLabels"]["selector"],
        "labelSelector=queue%3Demails"
    );
    let discovery = kube::discovery::Discovery::new(client)
        .filter(&["external.metrics.k8s.io"])
        .run()
        .await
        .unwrap();
    assert!(discovery.groups().any(|g| g.name() == "external.metrics.k8s.io"));
}

/// A backend that, like an aggregated API server, accepts only clients with a certificate from `ca_pem`
/// (the front-proxy CA) and answers with the user the front proxy named.
async fn start_identity_echo(pki: &Pki, front_proxy_ca_pem: &str) -> std::net::SocketAddr {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(front_proxy_ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .unwrap();
    let certs = CertificateDer::pem_slice_iter(pki.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(pki.key_pem.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    serve_json(acceptor, |req| {
        let all = |h: &str| {
            req.headers()
                .get_all(h)
                .iter()
                .map(|v| v.to_str().unwrap().to_string())
                .collect::<Vec<_>>()
        };
        json!({"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
            "metadata": {}, "items": [],
            "user": all("x-remote-user"), "groups": all("x-remote-group"),
            "authorization": all("authorization")})
    })
    .await
}

#[tokio::test]
async fn the_aggregator_calls_as_the_front_proxy_and_names_the_caller_in_headers() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let env = Env::start().await.unwrap();
    let server = env.server().unwrap();
    // The front-proxy settings are published where aggregated API servers read them.
    let cm = Api::<ConfigMap>::namespaced(env.client(), "kube-system")
        .get("extension-apiserver-authentication")
        .await
        .unwrap();
    let data = cm.data.unwrap();
    assert_eq!(data["requestheader-allowed-names"], r#"["front-proxy-client"]"#);
    assert_eq!(data["requestheader-username-headers"], r#"["X-Remote-User"]"#);
    let ca = data["requestheader-client-ca-file"].clone();
    assert_eq!(ca, server.front_proxy().ca_pem);

    let pki = Pki::generate(&["metrics.sluice-system.svc"]).unwrap();
    let backend = start_identity_echo(&pki, &ca).await;
    server.route_service("sluice-system", "metrics", 443, backend);
    let apiservice = json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100, "versionPriority": 100,
                 "service": {"namespace": "sluice-system", "name": "metrics", "port": 443},
                 "caBundle": base64::engine::general_purpose::STANDARD.encode(&pki.ca_pem)},
    });
    env.apply_yaml(&serde_yaml::to_string(&apiservice).unwrap(), None)
        .await
        .unwrap();

    server.add_token(
        "hpa-token",
        "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
        &["system:serviceaccounts", "system:authenticated"],
    );
    let hpa = server.client_with_token("default", "hpa-token").await.unwrap();
    let req = http::Request::get("/apis/external.metrics.k8s.io/v1beta1/namespaces/team/queue_depth")
        .body(vec![])
        .unwrap();
    let seen: Value = hpa.request(req).await.unwrap();
    assert_eq!(
        seen["user"],
        json!(["system:serviceaccount:kube-system:horizontal-pod-autoscaler"])
    );
    assert_eq!(
        seen["groups"],
        json!(["system:serviceaccounts", "system:authenticated"])
    );
    assert_eq!(
        seen["authorization"],
        json!([]),
        "the caller's token is not forwarded"
    );
}

#[tokio::test]
async fn token_and_subject_access_reviews_answer_from_the_tokens_and_the_deny_list() {
    use k8s_openapi::api::{authentication::v1::TokenReview, authorization::v1::SubjectAccessReview};
    use kube::api::PostParams;
    let env = Env::start().await.unwrap();
    let server = env.server().unwrap();
    server.add_token("t1", "alice", &["team-a"]);
    let review = |token: &str| -> TokenReview {
        serde_json::from_value(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})).unwrap()
    };
    let tokens = Api::<TokenReview>::all(env.client());
    let known = tokens
        .create(&PostParams::default(), &review("t1"))
        .await
        .unwrap();
    let status = known.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(status.user.unwrap().username.as_deref(), Some("alice"));
    let unknown = tokens
        .create(&PostParams::default(), &review("nope"))
        .await
        .unwrap();
    assert_eq!(unknown.status.unwrap().authenticated, Some(false));

    let sar = |user: &str, groups: &[&str]| -> SubjectAccessReview {
        serde_json::from_value(json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": {"verb": "list", "group": "external.metrics.k8s.io", "resource": "m", "namespace": "n"}}})).unwrap()
    };
    let sars = Api::<SubjectAccessReview>::all(env.client());
    let allowed = |r: SubjectAccessReview| r.status.unwrap().allowed;
    assert!(allowed(
        sars.create(&PostParams::default(), &sar("alice", &["team-a"]))
            .await
            .unwrap()
    ));
    server.deny("team-a");
    assert!(!allowed(
        sars.create(&PostParams::default(), &sar("alice", &["team-a"]))
            .await
            .unwrap()
    ));
    server.allow("team-a");
    assert!(allowed(
        sars.create(&PostParams::default(), &sar("alice", &["team-a"]))
            .await
            .unwrap()
    ));
}
