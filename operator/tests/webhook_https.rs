//! The admission webhooks over HTTPS, answering real `AdmissionReview` v1 requests the way the API
//! server sends them: TLS verified against the generated CA for the Service's DNS name. Pod injection,
//! and the JobQueue access check (with rules standing in for RBAC, and once with SubjectAccessReviews
//! against the test API server).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use base64::Engine;
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::{authentication::v1::UserInfo, authorization::v1::ResourceAttributes};
use kube::runtime::{reflector, watcher};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use serde_json::{Value, json};
use sluice_crds::rate_limit_policy::RateLimitPolicy;
use sluice_operator::{
    certs::{self, Bundle, CertStore, Plan},
    metrics::Metrics,
    render::sidecar_container::SidecarSettings,
    serve,
    webhook::{
        inject::InjectConfig,
        job_queue_access::{
            self, Authorize, Decision, SubjectAccessReviews, VALIDATE_JOB_QUEUE_PATH, describe,
        },
        server::{self, WebhookState},
    },
};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const SERVICE: &str = "sluice-webhook";
const NAMESPACE: &str = "sluice-system";

struct Webhook {
    addr: SocketAddr,
    store: Arc<CertStore>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn bundle() -> Bundle {
    let now = (sluice_operator::clock::system_clock())();
    certs::execute(
        Plan::Create,
        None,
        &certs::service_dns_names(SERVICE, NAMESPACE),
        now,
        certs::WEBHOOK_CA_NAME,
    )
    .unwrap()
    .unwrap()
}

/// RBAC in miniature: what each user is granted, as [`describe`] spells it; everything else is denied.
/// `None` stands for an API server that cannot be reached.
struct Granted(Option<Vec<(&'static str, String)>>, Mutex<Vec<String>>);

impl Authorize for Granted {
    fn authorize<'a>(
        &'a self,
        user: &'a UserInfo,
        attributes: &'a ResourceAttributes,
    ) -> BoxFuture<'a, Result<Decision, kube::Error>> {
        let name = user.username.clone().unwrap_or_default();
        let asked = describe(attributes);
        self.1.lock().unwrap().push(format!("{name}: {asked}"));
        let answer = match &self.0 {
            None => Err(kube::Error::Service("connection refused".into())),
            Some(grants) => Ok(Decision {
                allowed: grants.iter().any(|(u, a)| *u == name && *a == asked),
                reason: String::new(),
            }),
        };
        Box::pin(async move { answer })
    }
}

async fn start(b: &Bundle) -> Webhook {
    start_with(b, Arc::new(Granted(Some(vec![]), Mutex::default()))).await
}

async fn start_with(b: &Bundle, authorizer: Arc<dyn Authorize>) -> Webhook {
    let store = Arc::new(CertStore::default());
    store.load(&b.cert_pem, &b.key_pem).unwrap();
    let (policies, mut writer) = reflector::store::<RateLimitPolicy>();
    let policy: RateLimitPolicy = serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": "api", "namespace": "shop", "uid": "u-1"},
        "spec": {"redis": {"secretRef": {"name": "redis", "key": "url"}},
                 "rules": [{"name": "all", "limit": {"requests": 10, "window": "1s"}}]}
    }))
    .unwrap();
    writer.apply_watcher_event(&watcher::Event::Apply(policy));
    let metrics = Arc::new(Metrics::default());
    let state = Arc::new(WebhookState {
        policies: policies.into(),
        job_queues: reflector::store().0.into(),
        config: InjectConfig {
            sidecar: SidecarSettings {
                image: "ghcr.io/sluice-dev/sluice-sidecar:test".into(),
                ..SidecarSettings::default()
            },
            native: true,
            config_verify_key: None,
            queue_api_auth: false,
        },
        metrics: metrics.clone(),
        authorizer,
    });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(serve::serve(
        "webhook",
        listener,
        Some(store.server_config().unwrap()),
        server::router(state),
        serve::Limits::default(),
        serve::Serving::default(),
        stop.clone().cancelled_owned(),
    ));
    Webhook {
        addr,
        store,
        metrics,
        stop,
    }
}

/// POST an AdmissionReview to the injection path as the API server does, trusting only `ca_pem`.
async fn post(addr: SocketAddr, ca_pem: &str, review: &Value) -> Result<Value, String> {
    post_to(addr, ca_pem, server::INJECT_PATH, review).await
}

/// POST an AdmissionReview to `path` as the API server does, trusting only `ca_pem`.
async fn post_to(addr: SocketAddr, ca_pem: &str, path: &str, review: &Value) -> Result<Value, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config =
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(format!("{SERVICE}.{NAMESPACE}.svc")).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::post(format!("https://{SERVICE}.{NAMESPACE}.svc{path}?timeout=5s"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(review).unwrap())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Ok(serde_json::from_slice(&body).unwrap())
}

fn review(uid: &str, pod: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "shop",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller",
                         "uid": "8b3c", "groups": ["system:serviceaccounts", "system:authenticated"]},
            "object": pod,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// A pod as a ReplicaSet creates it: generateName, no name, no namespace in the object.
fn replica_pod(annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-5d9c7-", "labels": {"app": "web"}, "annotations": annotations},
        "spec": {"containers": [{"name": "web", "image": "shop/web:1",
                                 "ports": [{"name": "http", "containerPort": 8080}],
                                 "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}}}]}
    })
}

#[tokio::test]
async fn annotated_pod_gets_a_json_patch_that_injects_the_sidecar() {
    let b = bundle();
    let hook = start(&b).await;
    let pod = replica_pod(json!({"sluice.dev/inject": "true", "sluice.dev/policy": "api"}));
    let out = post(hook.addr, &b.ca_bundle_pem, &review("a1", pod.clone()))
        .await
        .unwrap();
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(out["kind"], "AdmissionReview");
    let resp = &out["response"];
    assert_eq!(resp["uid"], "a1", "{out}");
    assert_eq!(resp["allowed"], true);
    assert_eq!(resp["patchType"], "JSONPatch", "{out}");
    // Go's []byte: a base64 string, or (as kube-core writes it, and Go's decoder also accepts) an
    // array of byte values.
    let patch_bytes: Vec<u8> = match &resp["patch"] {
        Value::String(b64) => base64::engine::general_purpose::STANDARD.decode(b64).unwrap(),
        other => serde_json::from_value(other.clone()).unwrap(),
    };
    let patch: json_patch::Patch = serde_json::from_slice(&patch_bytes).unwrap();
    let mut patched = pod;
    json_patch::patch(&mut patched, &patch).unwrap();
    assert_eq!(patched["spec"]["initContainers"][0]["name"], "sluice-sidecar");
    assert_eq!(
        patched["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"],
        8080
    );
    assert!(
        patched["metadata"]["namespace"].is_null(),
        "the patch adds no namespace"
    );
    assert!(
        hook.metrics
            .encode()
            .contains(r#"sluice_operator_admissions_total{result="injected"} 1"#)
    );
}

#[tokio::test]
async fn pod_with_a_bad_annotation_is_denied_with_a_message_naming_it() {
    let b = bundle();
    let hook = start(&b).await;
    let pod = replica_pod(json!({"sluice.dev/inject": "true", "sluice.dev/listen-port": "eighty"}));
    let out = post(hook.addr, &b.ca_bundle_pem, &review("a2", pod))
        .await
        .unwrap();
    let resp = &out["response"];
    assert_eq!(resp["uid"], "a2");
    assert_eq!(resp["allowed"], false);
    assert!(resp["patch"].is_null());
    let message = resp["status"]["message"].as_str().unwrap();
    assert!(message.contains("annotation sluice.dev/listen-port"), "{message}");
}

#[tokio::test]
async fn pod_that_does_not_ask_is_allowed_unchanged() {
    let b = bundle();
    let hook = start(&b).await;
    let out = post(
        hook.addr,
        &b.ca_bundle_pem,
        &review("a3", replica_pod(json!({"sluice.dev/inject": "false"}))),
    )
    .await
    .unwrap();
    assert_eq!(out["response"]["allowed"], true);
    assert!(out["response"]["patch"].is_null());
}

#[tokio::test]
async fn a_rotated_certificate_is_served_without_a_restart() {
    let first = bundle();
    let hook = start(&first).await;
    let second = bundle();
    hook.store.load(&second.cert_pem, &second.key_pem).unwrap();
    let pod = replica_pod(json!({}));
    assert!(
        post(hook.addr, &second.ca_bundle_pem, &review("a4", pod.clone()))
            .await
            .is_ok()
    );
    assert!(
        post(hook.addr, &first.ca_bundle_pem, &review("a5", pod))
            .await
            .is_err(),
        "the old CA no longer verifies the new certificate"
    );
}

fn job_queue(service_account: Option<&str>, concurrency: u32) -> Value {
    let mut spec = json!({"containers": [{"name": "handler", "image": "mail:1"}]});
    if let Some(sa) = service_account {
        spec["serviceAccountName"] = json!(sa);
    }
    json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
        "metadata": {"name": "emails", "namespace": "shop"},
        "spec": {"database": {"secretRef": {"name": "pg"}},
                 "worker": {"template": {"spec": spec}, "concurrency": concurrency}}
    })
}

fn job_queue_review(uid: &str, user: &str, operation: &str, object: Value, old: Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "sluice.dev", "version": "v1alpha1", "kind": "JobQueue"},
            "resource": {"group": "sluice.dev", "version": "v1alpha1", "resource": "jobqueues"},
            "name": "emails",
            "namespace": "shop",
            "operation": operation,
            "userInfo": {"username": user, "uid": "u-1", "groups": ["team-mail", "system:authenticated"]},
            "object": object,
            "oldObject": old,
            "dryRun": false
        }
    })
}

/// The `response` of the JobQueue check for `review`.
async fn check(hook: &Webhook, ca: &str, review: &Value) -> Value {
    post_to(hook.addr, ca, VALIDATE_JOB_QUEUE_PATH, review)
        .await
        .unwrap()["response"]
        .clone()
}

#[tokio::test]
async fn a_job_queue_is_allowed_only_to_users_who_may_create_its_workers_and_use_its_account() {
    let b = bundle();
    let deployments = r#"create deployments.apps in namespace "shop""#.to_string();
    let mailer = r#"impersonate serviceaccounts "mailer" in namespace "shop""#.to_string();
    let authorizer = Arc::new(Granted(
        Some(vec![
            ("alice", deployments.clone()),
            ("carol", deployments.clone()),
            ("carol", mailer),
        ]),
        Mutex::default(),
    ));
    let hook = start_with(&b, authorizer.clone()).await;
    let ca = &b.ca_bundle_pem;

    let ok = check(
        &hook,
        ca,
        &job_queue_review("j1", "alice", "CREATE", job_queue(None, 4), Value::Null),
    )
    .await;
    assert_eq!(
        (ok["uid"].as_str(), ok["allowed"].as_bool()),
        (Some("j1"), Some(true)),
        "{ok}"
    );
    let ok = check(
        &hook,
        ca,
        &job_queue_review(
            "j2",
            "alice",
            "CREATE",
            job_queue(Some("default"), 4),
            Value::Null,
        ),
    )
    .await;
    assert_eq!(
        ok["allowed"], true,
        "the default account needs nothing more: {ok}"
    );

    let no = check(
        &hook,
        ca,
        &job_queue_review("j3", "bob", "CREATE", job_queue(None, 4), Value::Null),
    )
    .await;
    assert_eq!(no["allowed"], false);
    assert_eq!(no["status"]["code"], 403, "{no}");
    assert!(
        no["status"]["message"].as_str().unwrap().starts_with(
            r#"bob may not create deployments.apps in namespace "shop", which this JobQueue's workers need"#
        ),
        "{no}"
    );

    let no = check(
        &hook,
        ca,
        &job_queue_review("j4", "alice", "CREATE", job_queue(Some("mailer"), 4), Value::Null),
    )
    .await;
    assert_eq!(no["allowed"], false);
    assert!(
        no["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"alice may not impersonate serviceaccounts "mailer" in namespace "shop""#),
        "{no}"
    );
    let ok = check(
        &hook,
        ca,
        &job_queue_review("j5", "carol", "CREATE", job_queue(Some("mailer"), 4), Value::Null),
    )
    .await;
    assert_eq!(ok["allowed"], true, "{ok}");

    // Updates: a spec change is checked like a create; a metadata-only change (pausing) is not.
    let mut paused = job_queue(Some("mailer"), 4);
    paused["metadata"]["annotations"] = json!({"sluice.dev/paused": "true"});
    let ok = check(
        &hook,
        ca,
        &job_queue_review("j6", "bob", "UPDATE", paused, job_queue(Some("mailer"), 4)),
    )
    .await;
    assert_eq!(ok["allowed"], true, "{ok}");
    let no = check(
        &hook,
        ca,
        &job_queue_review(
            "j7",
            "bob",
            "UPDATE",
            job_queue(Some("mailer"), 8),
            job_queue(Some("mailer"), 4),
        ),
    )
    .await;
    assert_eq!(no["allowed"], false, "{no}");

    let asked = authorizer.1.lock().unwrap().clone();
    assert!(
        !asked
            .iter()
            .any(|a| a.starts_with("bob:") && a.contains("impersonate")),
        "the first refusal ends the review: {asked:?}"
    );
}

#[tokio::test]
async fn a_job_queue_with_a_schedule_that_cannot_be_read_is_refused_with_a_message_naming_it() {
    let b = bundle();
    let deployments = r#"create deployments.apps in namespace "shop""#.to_string();
    let authorizer = Arc::new(Granted(Some(vec![("alice", deployments)]), Mutex::default()));
    let hook = start_with(&b, authorizer).await;
    let ca = &b.ca_bundle_pem;
    let with_schedule = |cron: &str, zone: &str| {
        let mut jq = job_queue(None, 4);
        jq["spec"]["schedules"] =
            json!([{"name": "nightly", "cron": cron, "timeZone": zone, "kind": "report"}]);
        jq
    };

    let ok = check(
        &hook,
        ca,
        &job_queue_review(
            "s1",
            "alice",
            "CREATE",
            with_schedule("30 2 * * *", "Europe/Berlin"),
            Value::Null,
        ),
    )
    .await;
    assert_eq!(ok["allowed"], true, "{ok}");

    let no = check(
        &hook,
        ca,
        &job_queue_review(
            "s2",
            "alice",
            "CREATE",
            with_schedule("30 25 * * *", "Europe/Berlin"),
            Value::Null,
        ),
    )
    .await;
    assert_eq!(no["allowed"], false, "{no}");
    assert_eq!(no["status"]["code"], 422, "{no}");
    assert!(
        no["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"spec.schedules[0] ("nightly"): cron "30 25 * * *""#),
        "{no}"
    );

    let no = check(
        &hook,
        ca,
        &job_queue_review(
            "s3",
            "alice",
            "UPDATE",
            with_schedule("30 2 * * *", "Europe/Berlinn"),
            with_schedule("30 2 * * *", "Europe/Berlin"),
        ),
    )
    .await;
    assert_eq!(no["allowed"], false, "{no}");
    assert_eq!(
        no["status"]["message"],
        r#"spec.schedules[0] ("nightly"): timeZone "Europe/Berlinn": not an IANA time zone (e.g. Europe/Berlin)"#,
        "{no}"
    );
}

#[tokio::test]
async fn a_job_queue_is_refused_when_access_cannot_be_checked() {
    let b = bundle();
    let hook = start_with(&b, Arc::new(Granted(None, Mutex::default()))).await;
    let no = check(
        &hook,
        &b.ca_bundle_pem,
        &job_queue_review("j1", "alice", "CREATE", job_queue(None, 4), Value::Null),
    )
    .await;
    assert_eq!(no["allowed"], false);
    assert!(
        no["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with(r#"could not check whether alice may create deployments.apps in namespace "shop""#),
        "{no}"
    );
}

#[tokio::test]
async fn subject_access_reviews_ask_the_api_server_for_the_requesting_user() {
    let env = sluice_e2e::Env::start().await.unwrap();
    env.server()
        .expect("the in-memory API server")
        .deny("team-interns");
    let reviews = SubjectAccessReviews(env.client());
    let attributes = &job_queue_access::required("shop", Some("mailer"))[1];
    let user = |name: &str, group: &str| UserInfo {
        username: Some(name.into()),
        groups: Some(vec![group.into(), "system:authenticated".into()]),
        ..UserInfo::default()
    };
    let yes = reviews
        .authorize(&user("alice", "team-mail"), attributes)
        .await
        .unwrap();
    assert!(yes.allowed, "{yes:?}");
    let no = reviews
        .authorize(&user("intern", "team-interns"), attributes)
        .await
        .unwrap();
    assert!(!no.allowed);
    assert!(no.reason.contains("team-interns"), "{no:?}");
}
