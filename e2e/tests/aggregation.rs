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
use sluice_e2e::tls::Pki;

/// A metrics backend answering discovery and one external metric.
async fn start_backend(pki: &Pki) -> std::net::SocketAddr {
    let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config().unwrap());
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
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let body = match req.uri().path() {
                        "/apis/external.metrics.k8s.io/v1beta1" => {
                            json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "external.metrics.k8s.io/v1beta1",
                            "resources": [{"name": "queue_depth", "singularName": "", "namespaced": true, "kind": "ExternalMetricValueList", "verbs": ["get"]}]})
                        }
                        p => {
                            json!({"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1", "metadata": {},
                            "items": [{"metricName": p.rsplit('/').next(), "metricLabels": {"selector": req.uri().query().unwrap_or_default()}, "timestamp": "2026-01-01T00:00:00Z", "value": "42"}]})
                        }
                    };
                    let mut resp = hyper::Response::new(Full::new(Bytes::from(body.to_string())));
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
