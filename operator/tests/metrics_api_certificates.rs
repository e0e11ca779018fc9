//! The external metrics API's serving certificate, kept by the same code as the webhook's: made on
//! first start and trusted through the APIService's `caBundle`, the serving certificate renewed before
//! it expires under the same CA, and the CA rotated in two steps (new CA into the bundle first, then a
//! serving certificate from it). The test API server's aggregator verifies the backend against the
//! `caBundle`, so "the API answers through the aggregator" means "what is served is trusted".
//!
//! Time is moved with the keeper's injected clock; certificates are checked by rustls against the real
//! time, so the clock only ever moves to moments whose certificates are valid now.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{api::core::v1::Secret, kube_aggregator::pkg::apis::apiregistration::v1::APIService};
use kube::api::{Api, PostParams};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use serde_json::{Value, json};
use sluice_e2e::{Env, wait_for};
use sluice_operator::{
    certs::{self, CA_RENEW_BEFORE, CA_VALIDITY, Keeper, LEAF_RENEW_BEFORE, LEAF_VALIDITY},
    clock::system_clock,
    external_metrics::server::run,
    scaling::{Databases, JobQueueMetrics},
};
use tokio_util::sync::CancellationToken;

const NS: &str = "sluice-system";
const SERVICE: &str = "sluice-metrics-api";
const SECRET: &str = "sluice-metrics-api-tls";
const DEADLINE: Duration = Duration::from_secs(10);
const DAY_MS: i64 = 86_400_000;

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

struct Fixture {
    env: Env,
    addr: SocketAddr,
    /// Milliseconds added to the real clock for the keeper.
    offset: Arc<AtomicI64>,
    stop: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The APIService (no caBundle yet), and the metrics API running with its keeper's clock at
/// `offset_ms` from now, checking every 20 ms.
async fn start(offset_ms: i64) -> Fixture {
    let env = Env::start().await.unwrap();
    env.apply_yaml(
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"),
        None,
    )
    .await
    .unwrap();
    let apiservice: APIService = serde_json::from_value(json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100, "service": {"namespace": NS, "name": SERVICE, "port": 443}},
    }))
    .unwrap();
    Api::<APIService>::all(env.client())
        .create(&PostParams::default(), &apiservice)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    env.server().unwrap().route_service(NS, SERVICE, 443, addr);
    let offset = Arc::new(AtomicI64::new(offset_ms));
    let clock = {
        let (offset, real) = (offset.clone(), system_clock());
        Arc::new(move || real() + offset.load(Ordering::SeqCst))
    };
    let keeper = Keeper {
        settings: certs::CertSettings {
            namespace: NS.into(),
            secret: SECRET.into(),
            service: SERVICE.into(),
            ca_name: certs::METRICS_API_CA_NAME.into(),
        },
        trust: certs::Trust::ApiService,
        source: certs::Source::Generated,
        interval: Duration::from_millis(20),
        clock,
    };
    let stop = CancellationToken::new();
    tokio::spawn(run(
        env.client(),
        listener,
        keeper,
        Arc::new(Databases::default()),
        Arc::new(JobQueueMetrics::default()),
        sluice_operator::serve::Serving::default(),
        stop.clone(),
    ));
    Fixture {
        env,
        addr,
        offset,
        stop,
    }
}

impl Fixture {
    /// Discovery of the metrics API through the API server's aggregator, as an admin.
    async fn through_aggregator(&self) -> Option<Value> {
        let req = http::Request::get("/apis/external.metrics.k8s.io/v1beta1")
            .body(vec![])
            .unwrap();
        self.env.client().request::<Value>(req).await.ok()
    }

    async fn secret(&self) -> Secret {
        Api::<Secret>::namespaced(self.env.client(), NS)
            .get(SECRET)
            .await
            .unwrap()
    }

    async fn ca_bundle(&self) -> String {
        let api = Api::<APIService>::all(self.env.client())
            .get("v1beta1.external.metrics.k8s.io")
            .await
            .unwrap();
        String::from_utf8(api.spec.unwrap().ca_bundle.map(|b| b.0).unwrap_or_default()).unwrap()
    }

    /// The certificate the server presents now (DER), checked against `ca_bundle`.
    async fn served(&self, ca_bundle: &str) -> Vec<u8> {
        let tls = sluice_test_apiserver::tls::client_config(ca_bundle.as_bytes()).unwrap();
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let name = format!("{SERVICE}.{NS}.svc");
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(name.try_into().unwrap(), tcp)
            .await
            .unwrap();
        stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
    }

    async fn wait_through_aggregator(&self, what: &str) {
        wait_for(what, DEADLINE, || self.through_aggregator())
            .await
            .unwrap();
    }
}

fn annotation(s: &Secret, key: &str) -> String {
    s.metadata.annotations.as_ref().unwrap()[key].clone()
}

fn der(pem: &[u8]) -> Vec<u8> {
    CertificateDer::pem_slice_iter(pem)
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn the_serving_certificate_is_renewed_before_expiry_and_the_aggregator_keeps_trusting_it() {
    // The keeper first runs ~10 months in the past: its serving certificate, made then, has 59 days left
    // now, inside the 60-day renewal window.
    let past = -(ms(LEAF_VALIDITY) - ms(LEAF_RENEW_BEFORE)) - DAY_MS;
    let f = start(past).await;
    f.wait_through_aggregator("the metrics API to answer through the aggregator")
        .await;
    let first = f.secret().await;
    let bundle = f.ca_bundle().await;
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 1);
    let first_cert = der(&first.data.as_ref().unwrap()["tls.crt"].0);
    assert_eq!(f.served(&bundle).await, first_cert);

    // Now: renewed under the same CA, served without a restart, the caBundle untouched.
    f.offset.store(0, Ordering::SeqCst);
    let renewed = wait_for("a renewed serving certificate", DEADLINE, || async {
        let s = f.secret().await;
        (der(&s.data.as_ref().unwrap()["tls.crt"].0) != first_cert).then_some(s)
    })
    .await
    .unwrap();
    assert_eq!(
        annotation(&renewed, "sluice.dev/ca-id"),
        annotation(&first, "sluice.dev/ca-id")
    );
    assert_eq!(f.ca_bundle().await, bundle, "the caBundle does not change");
    let renewed_cert = der(&renewed.data.as_ref().unwrap()["tls.crt"].0);
    wait_for("the renewed certificate to be served", DEADLINE, || async {
        (f.served(&bundle).await == renewed_cert).then_some(())
    })
    .await
    .unwrap();
    f.wait_through_aggregator("the aggregator to reach the renewed server")
        .await;
}

#[tokio::test]
async fn the_ca_is_rotated_in_two_steps_and_the_apiservice_trusts_each_step() {
    // The CA is made 9 years and a day ago (10-year validity, renewed in its last year); at two days
    // ago it still had more than a year left and issued a serving certificate valid now.
    let made = -(ms(CA_VALIDITY) - ms(CA_RENEW_BEFORE)) - DAY_MS;
    let f = start(made).await;
    wait_for("the CA to be made", DEADLINE, || async {
        Api::<Secret>::namespaced(f.env.client(), NS)
            .get_opt(SECRET)
            .await
            .ok()
            .flatten()
    })
    .await
    .unwrap();
    let old_ca = annotation(&f.secret().await, "sluice.dev/ca-id");
    f.offset.store(-2 * DAY_MS, Ordering::SeqCst);
    f.wait_through_aggregator("a serving certificate from the old CA, trusted")
        .await;
    assert_eq!(f.ca_bundle().await.matches("BEGIN CERTIFICATE").count(), 1);

    // Now the CA is in its last year: a new CA joins the bundle, the APIService trusts both, and only
    // then is a serving certificate issued from the new CA.
    f.offset.store(0, Ordering::SeqCst);
    let rotated = wait_for("a serving certificate from a new CA", DEADLINE, || async {
        let s = f.secret().await;
        let ca = annotation(&s, "sluice.dev/ca-id");
        (ca != old_ca && annotation(&s, "sluice.dev/cert-ca-id") == ca).then_some(s)
    })
    .await
    .unwrap();
    let bundle = f.ca_bundle().await;
    assert_eq!(bundle.matches("BEGIN CERTIFICATE").count(), 2, "old and new CA");
    let cert = der(&rotated.data.as_ref().unwrap()["tls.crt"].0);
    wait_for("the new serving certificate to be served", DEADLINE, || async {
        (f.served(&bundle).await == cert).then_some(())
    })
    .await
    .unwrap();
    f.wait_through_aggregator("the aggregator to reach the server under the new CA")
        .await;
}
