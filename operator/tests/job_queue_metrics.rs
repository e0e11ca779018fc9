//! The external metrics endpoint against a real PostgreSQL with jobs in every state: the value served
//! is ready + running, and the HPA's `AverageValue` formula on it gives the replicas expected. A
//! database that stops answering gives 503 (the HPA keeps its replicas), never 0.

use std::{collections::HashMap, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Empty};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use serde_json::Value;
use sluice_operator::{
    controller::system_clock,
    external_metrics::{MetricsState, Targets, router, serve, server::Target},
    render::hpa::hpa_replicas,
    scaling::{Databases, JobQueueMetrics},
};
use sluice_sidecar::queue::{
    NewJob, QueueSettings, QueueStore, schema,
    store::{Finish, Finished},
};
use sluice_testsupport::PgServer;

const QUEUE: &str = "emails";

/// A queue with 4 ready, 2 running, 1 retrying (in backoff), 1 dead and 2 scheduled jobs.
async fn queue_with_jobs_in_every_state(url: &str) -> QueueStore {
    let pool = sluice_sidecar::queue::connect_lazy(url, 2).unwrap();
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

async fn start_server(url: &str) -> (String, tokio_util::sync::CancellationToken) {
    let targets = HashMap::from([(
        ("shop".to_owned(), "emails".to_owned()),
        Target {
            url: url.to_owned(),
            queue: QUEUE.to_owned(),
        },
    )]);
    let state = Arc::new(MetricsState {
        databases: Arc::new(Databases::with_ttl(Duration::ZERO)),
        targets: Targets::Static(targets),
        metrics: Arc::new(JobQueueMetrics::default()),
        clock: system_clock(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(serve(listener, None, router(state), async move {
        s.cancelled().await
    }));
    (format!("http://{addr}"), stop)
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let resp = client
        .get(format!("{base}{path}").parse().unwrap())
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

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
    let (base, _stop) = start_server(&pg.url()).await;

    let (status, body) = get(&base, METRIC_PATH).await;
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
    let (status, body) = get(&base, "/apis/external.metrics.k8s.io/v1beta1").await;
    assert_eq!(status, 200);
    assert_eq!(body["resources"][0]["name"], "sluice_jobqueue_depth");

    // Another JobQueue or metric is a 404, not a zero.
    let (status, _) = get(
        &base,
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/sluice_jobqueue_depth?labelSelector=sluice.dev%2Fjobqueue%3Dother",
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = get(
        &base,
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cpu?labelSelector=a%3Db",
    )
    .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_database_that_stops_answering_gives_503_not_zero() {
    let mut pg = PgServer::start();
    queue_with_jobs_in_every_state(&pg.url()).await;
    let (base, _stop) = start_server(&pg.url()).await;
    assert_eq!(get(&base, METRIC_PATH).await.0, 200);
    pg.stop();
    let (status, body) = get(&base, METRIC_PATH).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["kind"], "Status");
}

#[tokio::test]
async fn the_metrics_api_speaks_tls_that_its_ca_verifies() {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let pg = PgServer::start();
    queue_with_jobs_in_every_state(&pg.url()).await;
    let cert = sluice_operator::external_metrics::tls::ServingCert::generate(&["localhost".into()]).unwrap();
    let state = Arc::new(MetricsState {
        databases: Arc::new(Databases::default()),
        targets: Targets::Static(HashMap::from([(
            ("shop".to_owned(), "emails".to_owned()),
            Target {
                url: pg.url(),
                queue: QUEUE.to_owned(),
            },
        )])),
        metrics: Arc::new(JobQueueMetrics::default()),
        clock: system_clock(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(serve(
        listener,
        Some(cert.server_config().unwrap()),
        router(state),
        async move { s.cancelled().await },
    ));

    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(cert.ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .expect("the CA in the Secret verifies the serving certificate");
    let request = format!("GET {METRIC_PATH} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n");
    tls.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tls.read_to_string(&mut response).await.ok();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.contains(r#""value":"6""#), "{response}");
    stop.cancel();
}
