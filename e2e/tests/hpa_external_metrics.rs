//! The HPA stand-in scales a Deployment on an External `AverageValue` metric with the autoscaling/v2
//! algorithm. The external metrics endpoint here is a boundary stand-in served by the test (in the real
//! scenarios the operator serves it); the API server, the Deployment and its `/scale` are real.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::apps::v1::Deployment;
use sluice_e2e::Env;
use sluice_e2e::hpa::{HpaController, ManualClock};

/// A fake `external.metrics.k8s.io` endpoint: answers every metric with one series of `value`, and
/// remembers the last path and query asked for.
#[derive(Clone, Default)]
struct FakeMetrics {
    value: Arc<Mutex<String>>,
    last_request: Arc<Mutex<String>>,
}

impl FakeMetrics {
    async fn serve(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let me = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let me = me.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                        let me = me.clone();
                        async move {
                            *me.last_request.lock().unwrap() = req
                                .uri()
                                .path_and_query()
                                .map(|p| p.to_string())
                                .unwrap_or_default();
                            let value = me.value.lock().unwrap().clone();
                            let body = serde_json::json!({
                                "kind": "ExternalMetricValueList",
                                "apiVersion": "external.metrics.k8s.io/v1beta1",
                                "metadata": {},
                                "items": [{"metricName": "sluice_queue_depth", "metricLabels": {},
                                           "timestamp": "2026-01-01T00:00:00Z", "value": value}],
                            });
                            let resp = hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body.to_string())))
                                .unwrap();
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        });
        addr
    }
}

const WORKLOAD: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: worker}
spec:
  replicas: 1
  selector: {matchLabels: {app: worker}}
  template:
    metadata: {labels: {app: worker}}
    spec:
      containers: [{name: handler, image: example/handler:1}]
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: worker}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: worker}
  minReplicas: 1
  maxReplicas: 8
  behavior:
    scaleDown: {stabilizationWindowSeconds: 60}
  metrics:
    - type: External
      external:
        metric:
          name: sluice_queue_depth
          selector: {matchLabels: {queue: emails}}
        target: {type: AverageValue, averageValue: "10"}
"#;

#[tokio::test]
async fn hpa_stand_in_scales_on_queue_depth_and_waits_out_the_scale_down_window() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("hpa").await.unwrap();
    ns.apply_yaml(WORKLOAD).await.unwrap();

    let metrics = FakeMetrics::default();
    *metrics.value.lock().unwrap() = "45".into();
    let addr = metrics.serve().await;
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let metrics_client = kube::Client::try_from(config).unwrap();
    let clock = ManualClock::default();
    let mut hpa = HpaController::new(
        ns.client(),
        metrics_client,
        Some(ns.name()),
        Arc::new(clock.clone()),
    );
    let deployments: kube::Api<Deployment> = ns.api();
    let replicas = || async {
        deployments
            .get_scale("worker")
            .await
            .unwrap()
            .spec
            .unwrap()
            .replicas
            .unwrap()
    };

    // 45 jobs at 10 per replica: ceil(4.5) = 5.
    hpa.sync_once().await.unwrap();
    assert_eq!(replicas().await, 5);
    assert_eq!(
        *metrics.last_request.lock().unwrap(),
        format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/sluice_queue_depth?labelSelector=queue%3Demails",
            ns.name()
        )
    );

    // 48 at 5 replicas is a ratio of 0.96: inside the 10 % tolerance, nothing changes.
    *metrics.value.lock().unwrap() = "48".into();
    hpa.sync_once().await.unwrap();
    assert_eq!(replicas().await, 5);

    // Past the maximum: clamped to 8.
    *metrics.value.lock().unwrap() = "1k".into();
    hpa.sync_once().await.unwrap();
    assert_eq!(replicas().await, 8);

    // The queue drains: within the 60 s window the highest recent recommendation holds.
    *metrics.value.lock().unwrap() = "0".into();
    clock.advance(Duration::from_secs(30));
    hpa.sync_once().await.unwrap();
    assert_eq!(replicas().await, 8);

    // After the window: down to minReplicas.
    clock.advance(Duration::from_secs(31));
    hpa.sync_once().await.unwrap();
    assert_eq!(replicas().await, 1);
}
