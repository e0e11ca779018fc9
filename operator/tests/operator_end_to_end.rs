//! The whole operator (`run_with`) against the test API server, which calls mutating webhooks over
//! HTTPS verifying their `caBundle` as kube-apiserver does: the operator generates its certificate,
//! patches the `caBundle`, turns ready, reconciles a policy, and pods created through the API come back
//! injected — or rejected with the annotation named. The same `run_with`, on the same Lease, reconciles
//! JobQueues, and its one `/metrics` carries the JobQueue metrics.

use std::{net::SocketAddr, time::Duration};

use clap::Parser;
use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    apps::v1::Deployment,
    coordination::v1::Lease,
    core::v1::{Pod, Secret},
};
use kube::{Api, api::PostParams};
use serde_json::json;
use sluice_crds::rate_limit_policy::RateLimitPolicy;
use sluice_e2e::{Env, wait_for};
use sluice_operator::config::{Cli, Command};
use sluice_testsupport::{PgServer, RedisServer, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(20);
const OPERATOR_NS: &str = "sluice-system";

const WEBHOOK_CONFIG: &str = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: sluice
webhooks:
  - name: inject.sluice.dev
    admissionReviewVersions: [v1]
    sideEffects: None
    failurePolicy: Fail
    reinvocationPolicy: IfNeeded
    timeoutSeconds: 5
    clientConfig:
      service: {name: sluice-webhook, namespace: sluice-system, path: /inject, port: 443}
    rules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [CREATE]
        resources: [pods]
        scope: Namespaced
    namespaceSelector:
      matchExpressions:
        - {key: kubernetes.io/metadata.name, operator: NotIn, values: [sluice-system, kube-system]}
    matchConditions:
      - name: asks-for-sluice
        expression: >-
          has(object.metadata.annotations) &&
          (('sluice.dev/inject' in object.metadata.annotations) ||
           ('sluice.dev/job-queues' in object.metadata.annotations))
"#;

async fn http_body(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Some(text.split_once("\r\n\r\n")?.1.to_owned())
}

async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    String::from_utf8_lossy(&buf).split(' ').nth(1)?.parse().ok()
}

#[tokio::test]
async fn the_operator_serves_a_trusted_webhook_that_injects_pods_created_through_the_api() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    env.apply_yaml(
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OPERATOR_NS}}}\n"),
        None,
    )
    .await
    .unwrap();
    env.apply_yaml(WEBHOOK_CONFIG, None).await.unwrap();
    let webhook_port = free_port();
    let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    env.server().expect("in-memory API server").route_service(
        OPERATOR_NS,
        "sluice-webhook",
        443,
        SocketAddr::from(([127, 0, 0, 1], webhook_port)),
    );

    let cli = Cli::try_parse_from([
        "sluice-operator",
        "run",
        "--namespace",
        OPERATOR_NS,
        "--pod-name",
        "operator-0",
        "--webhook-listen",
        &format!("127.0.0.1:{webhook_port}"),
        "--metrics-listen",
        &metrics_addr.to_string(),
        "--external-metrics-listen",
        &format!("127.0.0.1:{}", free_port()),
        "--sidecar-image",
        "sluice-sidecar:test",
        "--sidecar-native",
        "true",
        "--log-format",
        "text",
    ])
    .unwrap();
    let Command::Run(args) = cli.command else {
        unreachable!()
    };
    let stop = CancellationToken::new();
    let operator = tokio::spawn(sluice_operator::run::run_with(env.client(), *args, stop.clone()));
    let leases = Api::<Lease>::namespaced(env.client(), OPERATOR_NS);

    // Ready only once the certificate is generated, the caBundle patched and the policy cache synced.
    wait_for("/readyz 200", DEADLINE, || async {
        (http_status(metrics_addr, "/readyz").await == Some(200)).then_some(())
    })
    .await
    .unwrap();
    let mwc = Api::<MutatingWebhookConfiguration>::all(env.client())
        .get("sluice")
        .await
        .unwrap();
    assert!(mwc.webhooks.unwrap()[0].client_config.ca_bundle.is_some());
    Api::<Secret>::namespaced(env.client(), OPERATOR_NS)
        .get("sluice-webhook-tls")
        .await
        .unwrap();

    let ns = env.namespace("shop").await.unwrap();
    let redis = RedisServer::start();
    ns.apply_yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: redis}}\nstringData: {{url: \"{}\"}}\n---\n\
         apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: web}}\n\
         spec:\n  selector: {{matchLabels: {{app: web}}}}\n  redis: {{secretRef: {{name: redis}}}}\n  \
         rules: [{{name: all, limit: {{requests: 5, window: 1s}}}}]\n",
        redis.url()
    ))
    .await
    .unwrap();
    let policies = ns.api::<RateLimitPolicy>();
    wait_for("policy Ready", DEADLINE, || {
        let policies = policies.clone();
        async move { (policies.get("web").await.ok()?.ready_condition()?.status == "True").then_some(()) }
    })
    .await
    .unwrap();

    let pods = ns.api::<Pod>();
    let pod = |name: &str, extra: serde_json::Value| -> Pod {
        let mut annotations = json!({"sluice.dev/inject": "true"});
        annotations
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": "web"}, "annotations": annotations},
            "spec": {"containers": [{"name": "web", "image": "web",
                                     "ports": [{"name": "http", "containerPort": 8080}]}]}
        }))
        .unwrap()
    };
    let created = pods
        .create(&PostParams::default(), &pod("web-1", json!({})))
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    let sidecar = &spec.init_containers.as_ref().expect("injected")[0];
    assert_eq!(sidecar.name, "sluice-sidecar");
    assert_eq!(sidecar.restart_policy.as_deref(), Some("Always"));
    assert_eq!(created.metadata.labels.unwrap()["sluice.dev/policy"], "web");
    assert_eq!(spec.containers[0].ports.as_ref().unwrap()[0].name, None);

    let err = pods
        .create(
            &PostParams::default(),
            &pod("web-2", json!({"sluice.dev/listen-port": "eighty"})),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("annotation sluice.dev/listen-port"),
        "{err}"
    );

    // The same run, on the same Lease, reconciles JobQueues too, and /metrics carries their metrics.
    let pg = PgServer::start();
    ns.apply_yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: pg}}\nstringData: {{url: \"{}\"}}\n---\n\
         apiVersion: sluice.dev/v1alpha1\nkind: JobQueue\nmetadata: {{name: emails}}\n\
         spec:\n  database: {{secretRef: {{name: pg}}}}\n  worker:\n    template:\n      spec:\n        \
         containers: [{{name: handler, image: \"mail:1\"}}]\n",
        pg.url()
    ))
    .await
    .unwrap();
    let deployments = ns.api::<Deployment>();
    wait_for("the JobQueue's worker Deployment", DEADLINE, || {
        let deployments = deployments.clone();
        async move { deployments.get_opt("emails-worker").await.ok().flatten() }
    })
    .await
    .unwrap();

    // Pods that enqueue: with the policy that selects them, and alone. The webhook's JobQueue cache
    // catches up with the API within the deadline.
    let with_policy = wait_for("a pod naming the JobQueue to be admitted", DEADLINE, || {
        let pods = pods.clone();
        let p = pod("web-3", json!({"sluice.dev/job-queues": "emails"}));
        async move { pods.create(&PostParams::default(), &p).await.ok() }
    })
    .await
    .unwrap();
    let spec = with_policy.spec.unwrap();
    let sidecar = &spec.init_containers.as_ref().expect("injected")[0];
    let env = |name: &str| {
        sidecar
            .env
            .iter()
            .flatten()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{name} in {sidecar:?}"))
            .clone()
    };
    let url = env("SLUICE_DATABASE_URL");
    assert_eq!(url.value, None, "never as text");
    // The namespace's tenant Secret (rowLevelSecurity is Enabled by default), not the owner's.
    assert_eq!(
        url.value_from.unwrap().secret_key_ref.unwrap().name,
        sluice_operator::tenant::secret_name(sluice_crds::job_queue::DatabaseSource::SecretRef(
            &sluice_crds::job_queue::SecretKeyRef {
                name: "pg".into(),
                key: "url".into()
            }
        ))
    );
    assert_eq!(
        env("SLUICE_QUEUES").value.as_deref(),
        Some(format!("{}/emails", ns.name()).as_str())
    );
    assert!(env("SLUICE_REDIS_URL").value_from.is_some(), "rate limiting too");
    let alone: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "enqueuer", "labels": {"app": "batch"},
                     "annotations": {"sluice.dev/job-queues": "emails"}},
        "spec": {"containers": [{"name": "batch", "image": "batch"}]}
    }))
    .unwrap();
    let alone = pods.create(&PostParams::default(), &alone).await.unwrap();
    let spec = alone.spec.unwrap();
    let sidecar = &spec.init_containers.as_ref().expect("injected without a policy")[0];
    assert!(
        sidecar
            .env
            .iter()
            .flatten()
            .any(|e| e.name == "SLUICE_API_LISTEN"),
        "{sidecar:?}"
    );
    let missing: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "lost", "annotations": {"sluice.dev/job-queues": "emails,invoices"}},
        "spec": {"containers": [{"name": "batch", "image": "batch"}]}
    }))
    .unwrap();
    let err = pods.create(&PostParams::default(), &missing).await.unwrap_err();
    assert!(
        err.to_string().contains("JobQueue \"invoices\" does not exist"),
        "{err}"
    );

    let text = http_body(metrics_addr, "/metrics").await.unwrap();
    assert!(
        text.contains("sluice_operator_jobqueue_activation_seconds"),
        "{text}"
    );
    assert!(text.contains("sluice_operator_reconcile_total"), "{text}");
    assert_eq!(text.matches("# EOF").count(), 1, "one exposition: {text}");

    // A graceful stop hands the Lease back before the process would exit, so that the next operator (a
    // rolling update's new pod) leads at once instead of waiting for the Lease to expire.
    let held = leases.get("sluice-operator").await.unwrap();
    assert_eq!(
        held.spec.unwrap().holder_identity.as_deref(),
        Some("operator-0"),
        "the only replica leads"
    );
    stop.cancel();
    operator.await.unwrap().unwrap();
    let released = leases.get("sluice-operator").await.unwrap();
    assert_eq!(
        released.spec.unwrap().holder_identity,
        None,
        "released when run_with returned"
    );
}

#[tokio::test]
async fn auto_injects_native_sidecars_on_an_api_server_that_has_them() {
    use sluice_operator::{config::NativeSidecar, run::native_sidecars};
    let env = Env::start().await.unwrap();
    // The test API server reports Kubernetes 1.32; native sidecars exist since 1.29.
    assert!(native_sidecars(&env.client(), NativeSidecar::Auto).await);
    assert!(!native_sidecars(&env.client(), NativeSidecar::False).await);
}
