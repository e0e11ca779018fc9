//! The external metrics endpoint against a real PostgreSQL with jobs in every state: the value served
//! is ready + running, and the HPA's `AverageValue` formula on it gives the replicas expected. A
//! database that stops answering gives 503 (the HPA keeps its replicas), never 0.
//!
//! Every call goes over TLS and through the access checks, with the test API server as the cluster:
//! its front-proxy certificate and `extension-apiserver-authentication` ConfigMap, its TokenReview and
//! SubjectAccessReview. Unauthenticated callers get 401, a certificate from another CA 401, a user
//! RBAC denies 403.

use std::{collections::HashMap, sync::Arc, time::Duration};

use http_body_util::BodyExt;
use serde_json::Value;
use sluice_e2e::Env;
use sluice_operator::{
    certs::{self, Bundle, CertStore, Plan},
    clock::system_clock,
    external_metrics::{
        Access, MetricsState, Targets, authn::RequestClientCertificate, router, server::Target,
    },
    scaling::{Databases, JobQueueMetrics, decision::hpa_replicas},
    serve::{Limits, Serving, serve},
};
use sluice_queue::{
    NewJob, QueueSettings, QueueStore, schema,
    store::{Finish, Finished},
};
use sluice_test_apiserver::aggregator::FrontProxy;
use sluice_testsupport::PgServer;

const QUEUE: &str = "emails";

/// A queue with 4 ready, 2 running, 1 retrying (in backoff), 1 dead and 2 scheduled jobs.
async fn queue_with_jobs_in_every_state(url: &str) -> QueueStore {
    let pool = sluice_queue::pool::connect_lazy(url, 2).unwrap();
    schema::migrate(&pool).await.unwrap();
    let store = QueueStore::new(pool);
    store.upsert_queue(&QueueSettings::defaults(QUEUE)).await.unwrap();
    let ready: Vec<NewJob> = (0..8)
        .map(|i| NewJob::new("send", serde_json::json!({"n": i})))
        .collect();
    store.enqueue_many(QUEUE, &ready).await.unwrap();
    let claimed = store
        .claim_batch(QUEUE, "emails-worker-abc-0000000a", 4, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 4);
    let done = [
        Finished {
            id: claimed[0].id,
            attempt: claimed[0].attempt,
            finish: Finish::Retry {
                delay: Duration::from_secs(3600),
                error: "boom".into(),
            },
        },
        Finished {
            id: claimed[1].id,
            attempt: claimed[1].attempt,
            finish: Finish::Permanent { error: "bad".into() },
        },
    ];
    store
        .finish_batch("emails-worker-abc-0000000a", &done)
        .await
        .unwrap();
    let later: Vec<NewJob> = (0..2)
        .map(|_| NewJob::new("send", serde_json::json!({})).delay(Duration::from_secs(3600)))
        .collect();
    store.enqueue_many(QUEUE, &later).await.unwrap();
    store
}

/// The metrics API over TLS in front of `url`, guarded by the test API server's front proxy and
/// SubjectAccessReviews, as in a cluster.
struct MetricsApi {
    env: Env,
    addr: std::net::SocketAddr,
    cert: Bundle,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for MetricsApi {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start_server(url: &str) -> MetricsApi {
    start_server_for(Env::start().await.unwrap(), "shop", url).await
}

/// The metrics API serving JobQueue `namespace/emails` from `url`, with the DNS name of the chart's
/// Service in its certificate.
async fn start_server_for(env: Env, namespace: &str, url: &str) -> MetricsApi {
    let targets = HashMap::from([(
        (namespace.to_owned(), "emails".to_owned()),
        Target {
            url: url.to_owned(),
            queue: QUEUE.to_owned(),
        },
    )]);
    let stop = tokio_util::sync::CancellationToken::new();
    let access = Arc::new(Access::new(env.client()));
    access.spawn_config_watch(env.client(), stop.clone());
    tokio::time::timeout(Duration::from_secs(10), access.authenticator.front_proxy_loaded())
        .await
        .expect("extension-apiserver-authentication is loaded");
    // The JobQueue controller admits each queue's database before the API reads from it.
    let databases = Databases::with_ttl(Duration::ZERO);
    databases.admit(namespace, url).0.unwrap();
    let state = Arc::new(MetricsState {
        databases: Arc::new(databases),
        targets: Targets::Static(targets),
        metrics: Arc::new(JobQueueMetrics::default()),
        clock: system_clock(),
        access,
    });
    let mut names = certs::service_dns_names(METRICS_SERVICE, "sluice-system");
    names.push("localhost".into());
    let cert = certs::execute(
        Plan::Create,
        None,
        &names,
        system_clock()(),
        certs::METRICS_API_CA_NAME,
    )
    .unwrap()
    .unwrap();
    let store = Arc::new(CertStore::default());
    store.load(&cert.cert_pem, &cert.key_pem).unwrap();
    let tls = store
        .server_config_with(Some(Arc::new(RequestClientCertificate::default())))
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = stop.clone();
    tokio::spawn(serve(
        "external-metrics",
        listener,
        Some(tls),
        router(state),
        Limits::default(),
        Serving::default(),
        async move { s.cancelled().await },
    ));
    MetricsApi {
        env,
        addr,
        cert,
        stop,
    }
}

/// How a test calls.
enum Caller<'a> {
    /// No client certificate, no token.
    Anonymous,
    /// A client certificate naming a user in `X-Remote-User`.
    Proxy(&'a FrontProxy, &'a str),
    /// A bearer token.
    Token(&'a str),
}

impl MetricsApi {
    /// The API server's own front proxy, naming `user`.
    fn proxy(&self) -> &FrontProxy {
        self.env.server().unwrap().front_proxy()
    }

    async fn get(&self, caller: Caller<'_>, path: &str) -> (u16, Value) {
        use http_body_util::Full;
        let tls = match &caller {
            Caller::Proxy(identity, _) => identity
                .client_config(Some(self.cert.ca_bundle_pem.as_bytes()))
                .unwrap(),
            _ => sluice_test_apiserver::tls::client_config(self.cert.ca_bundle_pem.as_bytes()).unwrap(),
        };
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .expect("the CA of the serving certificate verifies it");
        let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut req = http::Request::get(path).header("host", "localhost");
        match caller {
            Caller::Anonymous => {}
            Caller::Proxy(_, user) => {
                req = req
                    .header("X-Remote-User", user)
                    .header("X-Remote-Group", "system:authenticated");
            }
            Caller::Token(t) => req = req.header("Authorization", format!("Bearer {t}")),
        }
        let resp = sender
            .send_request(req.body(Full::new(bytes::Bytes::new())).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
    }
}

/// The Service the APIService names.
const METRICS_SERVICE: &str = "sluice-metrics-api";

/// The HPA controller's identity, as the front proxy names it.
const HPA_USER: &str = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";

const METRIC_PATH: &str = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/sluice_jobqueue_depth?labelSelector=sluice.dev%2Fjobqueue%3Demails";

#[tokio::test]
async fn the_metric_is_ready_plus_running_and_the_hpa_formula_follows() {
    let pg = PgServer::start();
    let store = queue_with_jobs_in_every_state(&pg.url()).await;
    let depth = store.depth(QUEUE).await.unwrap().unwrap();
    assert_eq!(
        (
            depth.ready,
            depth.running,
            depth.retrying,
            depth.dead,
            depth.scheduled
        ),
        (4, 2, 1, 1, 2),
        "the fixture has jobs in every state"
    );
    let api = start_server(&pg.url()).await;

    let (status, body) = api.get(Caller::Proxy(api.proxy(), HPA_USER), METRIC_PATH).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["kind"], "ExternalMetricValueList");
    let item = &body["items"][0];
    assert_eq!(item["metricName"], "sluice_jobqueue_depth");
    assert_eq!(item["metricLabels"]["sluice.dev/jobqueue"], "emails");
    let value: i64 = item["value"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        value, 6,
        "ready (4) + running (2); retrying, dead and scheduled jobs need no worker now"
    );
    // The HPA with AverageValue target 4 runs ceil(6 / 4) = 2 workers; with target 1, six.
    assert_eq!(hpa_replicas(value, 4, 1, 10), 2);
    assert_eq!(hpa_replicas(value, 1, 1, 10), 6);

    // Discovery lists the metric.
    let (status, body) = api
        .get(
            Caller::Proxy(api.proxy(), HPA_USER),
            "/apis/external.metrics.k8s.io/v1beta1",
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["resources"][0]["name"], "sluice_jobqueue_depth");

    // Another JobQueue or metric is a 404, not a zero.
    let (status, _) = api.get(
        Caller::Proxy(api.proxy(), HPA_USER),
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/sluice_jobqueue_depth?labelSelector=sluice.dev%2Fjobqueue%3Dother",
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = api
        .get(
            Caller::Proxy(api.proxy(), HPA_USER),
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cpu?labelSelector=a%3Db",
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_database_that_stops_answering_gives_503_not_zero() {
    let mut pg = PgServer::start();
    queue_with_jobs_in_every_state(&pg.url()).await;
    let api = start_server(&pg.url()).await;
    assert_eq!(
        api.get(Caller::Proxy(api.proxy(), HPA_USER), METRIC_PATH).await.0,
        200
    );
    pg.stop();
    let (status, body) = api.get(Caller::Proxy(api.proxy(), HPA_USER), METRIC_PATH).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["kind"], "Status");
}

#[tokio::test]
async fn only_the_front_proxy_or_a_reviewed_token_gets_in_and_rbac_decides_what_they_read() {
    let pg = PgServer::start();
    queue_with_jobs_in_every_state(&pg.url()).await;
    let api = start_server(&pg.url()).await;
    let server = api.env.server().unwrap();

    // Nobody in particular: 401, saying what was missing.
    let (status, body) = api.get(Caller::Anonymous, METRIC_PATH).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("no front-proxy client certificate and no bearer token"),
        "{body}"
    );

    // A certificate with the right name from another CA cannot speak for anyone.
    let stranger = FrontProxy::generate(sluice_test_apiserver::aggregator::FRONT_PROXY_CLIENT_NAME).unwrap();
    let (status, body) = api.get(Caller::Proxy(&stranger, HPA_USER), METRIC_PATH).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("requestheader-client-ca-file"),
        "{body}"
    );

    // The front proxy naming a user RBAC denies: 403, naming the user and what was asked.
    server.deny("mallory");
    let (status, body) = api.get(Caller::Proxy(api.proxy(), "mallory"), METRIC_PATH).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["reason"], "Forbidden");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("\"mallory\"")
            && message.contains("list sluice_jobqueue_depth.external.metrics.k8s.io in namespace \"shop\""),
        "{body}"
    );

    // The front proxy naming the HPA controller: the value.
    let (status, body) = api.get(Caller::Proxy(api.proxy(), HPA_USER), METRIC_PATH).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["items"][0]["value"], "6");

    // A bearer token the API server knows, then one it does not.
    server.add_token("reader-token", "metrics-reader", &["system:authenticated"]);
    let (status, body) = api.get(Caller::Token("reader-token"), METRIC_PATH).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = api.get(Caller::Token("forged"), METRIC_PATH).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("TokenReview"),
        "{body}"
    );

    // Probes stay open.
    assert_eq!(api.get(Caller::Anonymous, "/healthz").await.0, 200);
}

#[tokio::test]
async fn a_new_front_proxy_ca_in_the_configmap_is_picked_up_without_a_restart() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    let pg = PgServer::start();
    queue_with_jobs_in_every_state(&pg.url()).await;
    let api = start_server(&pg.url()).await;
    assert_eq!(
        api.get(Caller::Proxy(api.proxy(), HPA_USER), METRIC_PATH).await.0,
        200
    );

    let rotated = FrontProxy::generate(sluice_test_apiserver::aggregator::FRONT_PROXY_CLIENT_NAME).unwrap();
    Api::<ConfigMap>::namespaced(api.env.client(), "kube-system")
        .patch(
            "extension-apiserver-authentication",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"requestheader-client-ca-file": rotated.ca_pem}})),
        )
        .await
        .unwrap();
    sluice_e2e::wait_for(
        "the new front-proxy CA to be trusted",
        Duration::from_secs(10),
        || async { (api.get(Caller::Proxy(&rotated, HPA_USER), METRIC_PATH).await.0 == 200).then_some(()) },
    )
    .await
    .unwrap();
    let (status, body) = api.get(Caller::Proxy(api.proxy(), HPA_USER), METRIC_PATH).await;
    assert_eq!(status, 401, "the old CA is no longer trusted: {body}");
}

const WORKERS: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: emails-worker}
spec:
  replicas: 1
  selector: {matchLabels: {app: emails-worker}}
  template:
    metadata: {labels: {app: emails-worker}}
    spec:
      containers: [{name: handler, image: example/handler:1}]
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: emails-worker}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: emails-worker}
  minReplicas: 1
  maxReplicas: 10
  metrics:
    - type: External
      external:
        metric:
          name: sluice_jobqueue_depth
          selector: {matchLabels: {sluice.dev/jobqueue: emails}}
        target: {type: AverageValue, averageValue: "2"}
"#;

#[tokio::test]
async fn through_the_aggregator_the_hpa_reads_depth_a_denied_user_gets_403_and_an_untrusted_front_proxy_401()
{
    use k8s_openapi::{
        api::apps::v1::Deployment, kube_aggregator::pkg::apis::apiregistration::v1::APIService,
    };
    use kube::api::{Api, PostParams};
    use sluice_e2e::hpa::{HpaController, SystemClock};

    let pg = PgServer::start();
    queue_with_jobs_in_every_state(&pg.url()).await;
    let env = Env::start().await.unwrap();
    let ns = env.namespace("shop").await.unwrap();
    ns.apply_yaml(WORKERS).await.unwrap();
    let api = start_server_for(env, ns.name(), &pg.url()).await;
    let server = api.env.server().unwrap();
    server.route_service("sluice-system", METRICS_SERVICE, 443, api.addr);
    let apiservice: APIService = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100,
                 "service": {"namespace": "sluice-system", "name": METRICS_SERVICE, "port": 443},
                 "caBundle": base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &api.cert.ca_bundle_pem)},
    }))
    .unwrap();
    Api::<APIService>::all(api.env.client())
        .create(&PostParams::default(), &apiservice)
        .await
        .unwrap();

    // The HPA controller calls the API server with its own token; the aggregator names it to the
    // metrics API, which asks the API server whether it may read the metric.
    server.add_token(
        "hpa-token",
        HPA_USER,
        &[
            "system:serviceaccounts",
            "system:serviceaccounts:kube-system",
            "system:authenticated",
        ],
    );
    let hpa_client = server.client_with_token(ns.name(), "hpa-token").await.unwrap();
    let mut hpa = HpaController::new(
        hpa_client.clone(),
        hpa_client,
        Some(ns.name()),
        Arc::new(SystemClock),
    );
    hpa.sync_once().await.unwrap();
    let replicas = ns
        .api::<Deployment>()
        .get_scale("emails-worker")
        .await
        .unwrap()
        .spec
        .unwrap()
        .replicas;
    assert_eq!(replicas, Some(3), "6 ready + running jobs at 2 per worker");

    // Someone RBAC denies, through the same path: the metrics API's 403 comes back.
    server.add_token("intruder-token", "intruder", &["system:authenticated"]);
    server.deny("intruder");
    let intruder = server
        .client_with_token(ns.name(), "intruder-token")
        .await
        .unwrap();
    let path = format!(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{}/sluice_jobqueue_depth?labelSelector=sluice.dev%2Fjobqueue%3Demails",
        ns.name()
    );
    let err = intruder
        .request::<Value>(http::Request::get(&path).body(vec![]).unwrap())
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(status) => {
            assert_eq!(status.code, 403, "{status:?}");
            assert!(status.message.contains("\"intruder\""), "{status:?}");
        }
        other => panic!("expected a 403, got {other}"),
    }

    // If the front-proxy CA the metrics API trusts is not the one the aggregator's certificate comes
    // from, nothing the aggregator says is believed: 401 for everyone, the HPA controller included.
    let other_ca = FrontProxy::generate(sluice_test_apiserver::aggregator::FRONT_PROXY_CLIENT_NAME).unwrap();
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(api.env.client(), "kube-system")
        .patch(
            "extension-apiserver-authentication",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"data": {"requestheader-client-ca-file": other_ca.ca_pem}}),
            ),
        )
        .await
        .unwrap();
    let hpa_client = server.client_with_token(ns.name(), "hpa-token").await.unwrap();
    let status = sluice_e2e::wait_for(
        "the aggregator's certificate to be refused",
        Duration::from_secs(10),
        || {
            let (client, path) = (hpa_client.clone(), path.clone());
            async move {
                match client
                    .request::<Value>(http::Request::get(&path).body(vec![]).unwrap())
                    .await
                {
                    Err(kube::Error::Api(s)) if s.code == 401 => Some(s),
                    _ => None,
                }
            }
        },
    )
    .await
    .unwrap();
    assert!(
        status.message.contains("requestheader-client-ca-file"),
        "{status:?}"
    );
}
