//! Mutating admission: pods created through the API pass through webhooks configured with
//! MutatingWebhookConfiguration objects, over HTTPS with the caBundle verified, as in a cluster.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use serde_json::{Value, json};
use sluice_e2e::Env;
use sluice_test_apiserver::tls::Pki;

/// A webhook that adds a `sluice-sidecar` container, or denies pods annotated `example.dev/deny`.
struct Injector {
    addr: SocketAddr,
    ca_pem: String,
    calls: Arc<AtomicUsize>,
}

async fn review(body: Bytes) -> Value {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(&body).unwrap();
    let req: AdmissionRequest<DynamicObject> = review.try_into().unwrap();
    let pod = req.object.clone().unwrap();
    let mut resp = AdmissionResponse::from(&req);
    if pod
        .metadata
        .annotations
        .unwrap_or_default()
        .contains_key("example.dev/deny")
    {
        resp = resp.deny("pods marked deny are refused");
    } else {
        // Marked pods get a container whose name clashes with the app's, which validation must catch.
        let annotations = req
            .object
            .as_ref()
            .and_then(|p| p.metadata.annotations.clone())
            .unwrap_or_default();
        let name = if annotations.contains_key("example.dev/clash") {
            "app"
        } else {
            "sluice-sidecar"
        };
        let patch: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/spec/containers/-", "value": {"name": name, "image": "sluice-sidecar:test"}}
        ]))
        .unwrap();
        resp = resp.with_patch(patch).unwrap();
    }
    serde_json::to_value(resp.into_review()).unwrap()
}

async fn start_injector(dns_name: &str) -> Injector {
    let pki = Pki::generate(&[dns_name]).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let counter = counter.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let out = serde_json::to_vec(&review(body).await).unwrap();
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(out))))
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Injector {
        addr,
        ca_pem: pki.ca_pem,
        calls,
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn webhook_config(name: &str, client_config: Value, failure_policy: &str) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [{
            "name": format!("{name}.example.dev"),
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": failure_policy,
            "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["sluice-system"]}]},
            "matchConditions": [{"name": "asks-for-injection", "expression":
                "has(object.metadata.annotations) && 'sluice.dev/inject' in object.metadata.annotations && object.metadata.annotations['sluice.dev/inject'] == 'true'"}],
        }],
    })
}

fn pod(name: &str, annotations: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "annotations": annotations}, "spec": {"containers": [{"name": "app", "image": "app:1"}]}})).unwrap()
}

fn containers(p: &Pod) -> Vec<String> {
    p.spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| c.name.clone())
        .collect()
}

async fn configure(env: &Env, config: Value) {
    let name = config["metadata"]["name"].as_str().unwrap().to_string();
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(
            "admissionregistration.k8s.io",
            "v1",
            "MutatingWebhookConfiguration",
        ),
        "mutatingwebhookconfigurations",
    );
    let api: Api<DynamicObject> = Api::all_with(env.client(), &ar);
    api.patch(&name, &PatchParams::apply("test").force(), &Patch::Apply(config))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_mutating_webhook_injects_the_sidecar_into_pods_that_ask_for_it() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("inject").await.unwrap();
    let injector = start_injector("injector.sluice-system.svc").await;
    env.server()
        .unwrap()
        .route_service("sluice-system", "injector", 443, injector.addr);
    let client_config = json!({"caBundle": b64(&injector.ca_pem), "service": {"namespace": "sluice-system", "name": "injector", "path": "/inject", "port": 443}});
    configure(&env, webhook_config("sidecar", client_config, "Fail")).await;
    let pods: Api<Pod> = ns.api();
    let injected = pods
        .create(
            &PostParams::default(),
            &pod("asks", json!({"sluice.dev/inject": "true"})),
        )
        .await
        .unwrap();
    assert_eq!(containers(&injected), ["app", "sluice-sidecar"]);
    assert_eq!(
        containers(&pods.get("asks").await.unwrap()),
        ["app", "sluice-sidecar"]
    );
    let plain = pods
        .create(&PostParams::default(), &pod("plain", json!({})))
        .await
        .unwrap();
    assert_eq!(containers(&plain), ["app"]);
    assert_eq!(
        injector.calls.load(Ordering::SeqCst),
        1,
        "matchConditions keep other pods away from the webhook"
    );
    let clash = pod(
        "clash",
        json!({"sluice.dev/inject": "true", "example.dev/clash": "1"}),
    );
    let err = pods.create(&PostParams::default(), &clash).await.unwrap_err();
    let duplicate = "spec.containers[1].name: Duplicate value: \"app\"";
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422 && s.message.contains(duplicate)),
        "{err}"
    );
    let err = pods
        .create(
            &PostParams::default(),
            &pod(
                "denied",
                json!({"sluice.dev/inject": "true", "example.dev/deny": "1"}),
            ),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => assert!(
            s.message.contains(
                "admission webhook \"sidecar.example.dev\" denied the request: pods marked deny are refused"
            ),
            "{}",
            s.message
        ),
        other => panic!("expected a denial, got {other}"),
    }
}

#[tokio::test]
async fn failure_policy_decides_what_happens_when_the_webhook_cannot_be_reached() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("failure").await.unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let injector = start_injector("127.0.0.1").await;
    let client_config = json!({"caBundle": b64(&injector.ca_pem), "url": format!("https://127.0.0.1:{}/inject", closed.port())});
    configure(&env, webhook_config("unreachable", client_config.clone(), "Fail")).await;
    let pods: Api<Pod> = ns.api();
    let err = pods
        .create(
            &PostParams::default(),
            &pod("a", json!({"sluice.dev/inject": "true"})),
        )
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 500);
            assert!(
                s.message
                    .contains("failed calling webhook \"unreachable.example.dev\""),
                "{}",
                s.message
            );
        }
        other => panic!("expected a refusal, got {other}"),
    }
    configure(&env, webhook_config("unreachable", client_config, "Ignore")).await;
    let admitted = pods
        .create(
            &PostParams::default(),
            &pod("a", json!({"sluice.dev/inject": "true"})),
        )
        .await
        .unwrap();
    assert_eq!(containers(&admitted), ["app"]);
}

#[tokio::test]
async fn a_webhook_whose_certificate_the_ca_bundle_does_not_sign_is_not_trusted() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("untrusted").await.unwrap();
    let injector = start_injector("127.0.0.1").await;
    let other_ca = Pki::generate(&["127.0.0.1"]).unwrap().ca_pem;
    let client_config = json!({"caBundle": b64(&other_ca), "url": format!("https://127.0.0.1:{}/inject", injector.addr.port())});
    configure(&env, webhook_config("untrusted", client_config, "Fail")).await;
    let pods: Api<Pod> = ns.api();
    let err = pods
        .create(
            &PostParams::default(),
            &pod("a", json!({"sluice.dev/inject": "true"})),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.message.contains("tls")),
        "{err}"
    );
    assert_eq!(injector.calls.load(Ordering::SeqCst), 0);
}
