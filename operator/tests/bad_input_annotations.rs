//! Bad `sluice.dev/*` annotations (the table in `bad_input/annotations.rs`), each on a pod sent to the
//! injection webhook in an `AdmissionReview` as the API server sends it: each pod is refused, with a
//! message naming the annotation, and no patch (nothing of the injection is applied).

#[path = "bad_input/annotations.rs"]
mod table;

use std::{collections::HashSet, net::SocketAddr, sync::Arc};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};
use sluice_crds::{job_queue::JobQueue, rate_limit_policy::RateLimitPolicy};
use sluice_operator::{
    metrics::Metrics,
    render::sidecar_container::SidecarSettings,
    serve,
    webhook::{
        inject::InjectConfig,
        server::{self, WebhookState},
    },
};
use table::CASES;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

#[test]
fn every_bad_annotation_set_in_the_table_is_distinct() {
    let mut seen = HashSet::new();
    for case in CASES {
        assert!(
            seen.insert(case.annotations),
            "listed twice: {:?}",
            case.annotations
        );
    }
}

fn policy(name: &str, app: &str) -> RateLimitPolicy {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}")},
        "spec": {"selector": {"matchLabels": {"app": app}},
                 "redis": {"secretRef": {"name": "redis", "key": "url"}},
                 "rules": [{"name": "all", "limit": {"requests": 10, "window": "1s"}}]}
    }))
    .unwrap()
}

fn job_queue(name: &str, secret: &str) -> JobQueue {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}")},
        "spec": {"database": {"secretRef": {"name": secret}},
                 "worker": {"template": {"spec": {"containers": [{"name": "h", "image": "h"}]}}}},
    }))
    .unwrap()
}

/// Pod admission asks no SubjectAccessReview; the JobQueue check is tested in webhook_https.rs.
struct NoReviews;

impl sluice_operator::webhook::job_queue_access::Authorize for NoReviews {
    fn authorize<'a>(
        &'a self,
        _user: &'a k8s_openapi::api::authentication::v1::UserInfo,
        _attributes: &'a k8s_openapi::api::authorization::v1::ResourceAttributes,
    ) -> futures::future::BoxFuture<
        'a,
        Result<sluice_operator::webhook::job_queue_access::Decision, kube::Error>,
    > {
        Box::pin(async { Err(kube::Error::Service("no reviews in this test".into())) })
    }
}

/// The webhook's router served over plain HTTP (TLS is tested in webhook_https.rs).
async fn start() -> (SocketAddr, CancellationToken) {
    let (policies, mut w) = reflector::store::<RateLimitPolicy>();
    for p in [policy("api", "web"), policy("spare", "nothing")] {
        w.apply_watcher_event(&watcher::Event::Apply(p));
    }
    let (job_queues, mut w) = reflector::store::<JobQueue>();
    for q in [
        job_queue("emails", "pg"),
        job_queue("reports", "pg"),
        job_queue("audit", "audit-db"),
    ] {
        w.apply_watcher_event(&watcher::Event::Apply(q));
    }
    let state = Arc::new(WebhookState {
        policies: policies.into(),
        job_queues: job_queues.into(),
        config: InjectConfig {
            sidecar: SidecarSettings {
                image: "ghcr.io/sluice-dev/sluice-sidecar:test".into(),
                ..SidecarSettings::default()
            },
            native: true,
            config_verify_key: None,
            queue_api_auth: false,
        },
        metrics: Arc::new(Metrics::default()),
        authorizer: Arc::new(NoReviews),
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve::serve(
        "webhook",
        listener,
        None,
        server::router(state),
        serve::Limits::default(),
        serve::Serving::default(),
        stop.clone().cancelled_owned(),
    ));
    (addr, stop)
}

fn review(uid: &str, annotations: &[(&str, &str)]) -> Value {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "web-5d9c7-", "labels": {"app": "web"}, "annotations": annotations},
                "spec": {"containers": [{"name": "web", "image": "shop/web:1",
                                         "ports": [{"name": "http", "containerPort": 8080},
                                                   {"name": "metrics", "containerPort": 9090}]}]}
            },
            "oldObject": null,
            "dryRun": false
        }
    })
}

#[tokio::test]
async fn each_pod_with_a_bad_annotation_is_refused_naming_it_and_nothing_is_injected() {
    let (addr, stop) = start().await;
    let _stop = stop.drop_guard();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut wrong = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let uid = format!("bad-{i}");
        let request = hyper::Request::post(format!("http://{addr}{}", server::INJECT_PATH))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                serde_json::to_vec(&review(&uid, case.annotations)).unwrap(),
            )))
            .unwrap();
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let out: Value = serde_json::from_slice(&body).unwrap();
        let resp = &out["response"];
        let message = resp["status"]["message"].as_str().unwrap_or_default();
        let refused = resp["uid"] == uid.as_str()
            && resp["allowed"] == false
            && resp.get("patch").is_none_or(Value::is_null)
            && message.starts_with(&format!("annotation {}", case.annotation))
            && message.contains(case.says);
        if !refused {
            wrong.push(format!(
                "{:?}: expected {} …{}…, got {resp}",
                case.annotations, case.annotation, case.says
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} cases:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}
