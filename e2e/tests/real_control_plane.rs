//! Sluice on a real Kubernetes control plane (etcd, kube-apiserver and kube-controller-manager built
//! from the pinned Go modules, see `sluice_e2e::control_plane`): the chart installed with the real
//! `helm install` and checked with `helm test`, the operator under the chart's RBAC (a TokenRequest token
//! of its ServiceAccount), then the whole-system scenarios with the real admission chain, aggregator,
//! HPA, Deployment, ReplicaSet, EndpointSlice and garbage-collector controllers; then the scenarios that
//! need real RBAC (JobQueue authors judged as RBAC users, the queue API's callers checked by its injected
//! sidecars with projected tokens, and the release upgraded to `watchNamespaces`).
//! `make e2e-real` runs this file alone and shows its report.

use std::time::Instant;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams};
use sluice_e2e::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_e2e::system::{RELEASE_NAMESPACE, SluiceSystem, SystemOptions};

/// What the operator logs when the RBAC authorizer refused one of its calls (kube-apiserver's wording:
/// `secrets "x" is forbidden: User "system:serviceaccount:…" cannot get resource …`).
const RBAC_REFUSAL: &str = "is forbidden: User \"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_starts_with_rbac_enforced_and_its_own_kubectl_talks_to_it() {
    let plane = ControlPlane::start(ControlPlaneOptions::default()).await.unwrap();
    let versions = plane.versions().await.unwrap();
    let kube = sluice_e2e::control_plane::binaries::pinned("KUBERNETES_VERSION").unwrap();
    assert!(
        versions.starts_with(&format!(
            "kube-apiserver {kube}, kube-controller-manager {kube}, etcd 3."
        )),
        "{versions}"
    );

    let kubectl = |args: &[&str]| {
        std::process::Command::new(&plane.binaries().kubectl)
            .arg("--kubeconfig")
            .arg(plane.kubeconfig_path())
            .args(args)
            .output()
            .unwrap()
    };
    let out = kubectl(&["version", "-o", "json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("\"gitVersion\": \"{kube}\"")), "{text}");
    let out = kubectl(&["get", "namespaces", "-o", "name"]);
    let names = String::from_utf8_lossy(&out.stdout);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&format!("namespace/{ns}")), "{names}");
    }

    // RBAC judges a ServiceAccount: `default` may not list Secrets, and the refusal names it.
    let accounts: Api<ServiceAccount> = Api::namespaced(plane.client(), "default");
    assert!(accounts.get_opt("default").await.unwrap().is_some());
    let out = kubectl(&[
        "auth",
        "can-i",
        "list",
        "secrets",
        "--as=system:serviceaccount:default:default",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    let out = kubectl(&["get", "secrets", "--as=system:serviceaccount:default:default"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("forbidden") && stderr.contains("system:serviceaccount:default:default"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_installed_with_helm_passes_every_scenario_on_a_real_control_plane() {
    let started = Instant::now();
    let options = SystemOptions::new(env!("CARGO_BIN_EXE_sluice-demo-app").as_ref()).real();
    let system = SluiceSystem::install(options).await.unwrap();
    let plane = system.env().control_plane().expect("a real control plane");
    println!(
        "real control plane: {} (helm {}, kubectl {})",
        plane.versions().await.unwrap(),
        sluice_e2e::control_plane::binaries::pinned("HELM_VERSION").unwrap_or("?"),
        sluice_e2e::control_plane::binaries::pinned("KUBERNETES_VERSION").unwrap_or("?"),
    );
    println!(
        "installed: control plane started, helm install --wait and helm test passed ({:.1} s)",
        started.elapsed().as_secs_f64()
    );

    let mut outcomes = sluice_e2e::scenarios::run_all(&system, sluice_e2e::scenarios::ALL).await;
    for outcome in &outcomes {
        println!("{outcome}");
    }
    // Every call the operator made was allowed by the chart's RBAC: a missing permission shows up as a
    // refusal in its log even when a scenario happens not to depend on the call. Read before the
    // real-only scenarios, whose `watchNamespaces` upgrade replaces the operator pod, and again after.
    let refusals = |logs: String| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains(RBAC_REFUSAL))
            .map(String::from)
            .collect()
    };
    let mut refused = refusals(system.operator_logs().await);
    let real_only = sluice_e2e::scenarios::run_all(&system, sluice_e2e::scenarios::REAL_ONLY).await;
    for outcome in &real_only {
        println!("{outcome}");
    }
    outcomes.extend(real_only);
    refused.extend(refusals(system.operator_logs().await));
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(system.env().client(), RELEASE_NAMESPACE);
    let operator_pods = pods.list(&ListParams::default()).await.unwrap().items.len();
    system.shutdown().await;

    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| o.result.is_err())
        .map(|o| o.to_string())
        .collect();
    assert!(failed.is_empty(), "scenarios failed:\n{}", failed.join("\n"));
    assert!(operator_pods >= 1);
    assert!(
        refused.is_empty(),
        "the API server refused calls of the operator (a permission missing from the chart?):\n{}",
        refused.join("\n")
    );
}

/// The queue API's gatekeeper (`sluice_sidecar::queue::auth`) against a real kube-apiserver with RBAC:
/// tokens minted by `kubectl create token --audience sluice` are accepted, a token for another audience
/// is not, and a SubjectAccessReview on `jobqueues/jobs` allows exactly what a Role grants — to the
/// ServiceAccount it names, not to another one, nor to one of the same name in another namespace. The
/// sidecar itself needs the reviewer rights the chart's ClusterRole gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_api_checks_callers_by_token_review_and_subject_access_review_on_a_real_api_server() {
    use std::sync::Arc;

    use sluice_crds::sidecar_config::LoopbackCallers;
    use sluice_sidecar::queue::auth::{Access, ApiServer, Authenticator, Origin, Refusal};

    let plane = ControlPlane::start(ControlPlaneOptions::default()).await.unwrap();
    let kubectl = |args: &[&str], stdin: Option<&str>| {
        use std::io::Write;
        let mut child = std::process::Command::new(&plane.binaries().kubectl)
            .arg("--kubeconfig")
            .arg(plane.kubeconfig_path())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.unwrap_or_default().as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    // What docs/queue.md tells users to write, and the reviewer rights the chart gives sidecars.
    kubectl(
        &["apply", "-f", "-"],
        Some(
            r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web, namespace: shop}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: stranger, namespace: shop}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: web, namespace: other}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: unbound, namespace: other}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: enqueue-emails, namespace: shop}
rules:
  - apiGroups: [sluice.dev]
    resources: [jobqueues/jobs]
    resourceNames: [emails]
    verbs: [create, get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: web-enqueues-emails, namespace: shop}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: enqueue-emails}
subjects:
  - {kind: ServiceAccount, name: web, namespace: shop}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: sluice-queue-api-reviewer}
rules:
  - apiGroups: [authentication.k8s.io]
    resources: [tokenreviews]
    verbs: [create]
  - apiGroups: [authorization.k8s.io]
    resources: [subjectaccessreviews]
    verbs: [create]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: sluice-queue-api-reviewer-shop}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: sluice-queue-api-reviewer}
subjects:
  - {kind: Group, apiGroup: rbac.authorization.k8s.io, name: "system:serviceaccounts:shop"}
"#,
        ),
    );
    let token = |ns: &str, sa: &str, audience: Option<&str>| {
        let mut args = vec!["create", "token", sa, "-n", ns, "--duration", "10m"];
        if let Some(a) = audience {
            args.extend(["--audience", a]);
        }
        kubectl(&args, None)
    };
    let dir = tempfile::tempdir().unwrap();
    let gate_as = |ns: &str, sa: &str| {
        // The sidecar of a pod running as `sa`, with that ServiceAccount's API credentials.
        let file = dir.path().join(format!("{ns}-{sa}"));
        std::fs::write(&file, token(ns, sa, None)).unwrap();
        let server = ApiServer::new(plane.url(), plane.ca_pem().as_bytes(), &file).unwrap();
        Authenticator::new(Arc::new(server), ns, Some(sa), LoopbackCallers::Pod)
    };
    let gate = gate_as("shop", "web");
    fn remote(authorization: Option<&str>) -> Origin<'_> {
        Origin {
            authorization: authorization.map(str::as_bytes),
            peer: "10.0.0.7:40000".parse().unwrap(),
            local: "0.0.0.0:7070".parse().unwrap(),
        }
    }
    let bearer = |t: &str| format!("Bearer {t}");
    let emails = Access::jobs("create", "emails");

    // A token for audience sluice: the ServiceAccount, allowed what its Role grants and nothing else.
    let web = bearer(&token("shop", "web", Some("sluice")));
    let user = gate.authenticate(remote(Some(&web))).await.unwrap();
    assert_eq!(user.name, "system:serviceaccount:shop:web");
    assert!(!user.uid.is_empty(), "the TokenReview's uid is kept: {user:?}");
    gate.authorize(&user, &emails).await.unwrap();
    gate.authorize(&user, &Access::jobs("list", "emails"))
        .await
        .unwrap();
    for denied in [
        Access::jobs("create", "reports"),
        Access::jobs("update", "emails"),
        Access::settings("emails"),
    ] {
        let refused = gate.authorize(&user, &denied).await.unwrap_err();
        assert!(
            matches!(refused, Refusal::Forbidden(_)),
            "{denied:?}: {refused:?}"
        );
    }

    // The same ServiceAccount's token for the API server's audience is refused.
    let wrong_audience = bearer(&token("shop", "web", None));
    let refused = gate
        .authenticate(remote(Some(&wrong_audience)))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, Refusal::Unauthenticated(m) if m.contains("audience")),
        "{refused:?}"
    );
    let refused = gate
        .authenticate(remote(Some("Bearer not-a-token")))
        .await
        .unwrap_err();
    assert!(matches!(refused, Refusal::Unauthenticated(_)), "{refused:?}");

    // Another ServiceAccount of the namespace, and the same name in another namespace: valid tokens,
    // no right.
    for (ns, sa) in [("shop", "stranger"), ("other", "web")] {
        let t = bearer(&token(ns, sa, Some("sluice")));
        let user = gate.authenticate(remote(Some(&t))).await.unwrap();
        assert_eq!(user.name, format!("system:serviceaccount:{ns}:{sa}"));
        let refused = gate.authorize(&user, &emails).await.unwrap_err();
        let Refusal::Forbidden(message) = refused else {
            panic!("{ns}/{sa}: {refused:?}")
        };
        assert!(
            message.contains("create jobqueues/jobs of JobQueue \"emails\""),
            "{message}"
        );
    }

    // The pod's own loopback without a token is the pod's ServiceAccount, judged by the same Role.
    let local = Origin {
        authorization: None,
        peer: "127.0.0.1:40000".parse().unwrap(),
        local: "127.0.0.1:7070".parse().unwrap(),
    };
    let pod = gate.authenticate(local).await.unwrap();
    gate.authorize(&pod, &emails).await.unwrap();
    let stranger = gate_as("shop", "stranger");
    let pod = stranger.authenticate(local).await.unwrap();
    assert!(matches!(
        stranger.authorize(&pod, &emails).await,
        Err(Refusal::Forbidden(_))
    ));

    // The same over HTTP: the queue API with this gatekeeper, on a real PostgreSQL.
    let pg = tokio::task::spawn_blocking(sluice_testsupport::PgServer::start)
        .await
        .unwrap();
    let pool = sluice_queue::pool::connect_lazy(&pg.url(), 4).unwrap();
    sluice_queue::schema::migrate(&pool).await.unwrap();
    let store = sluice_queue::QueueStore::new(pool);
    for q in ["emails", "reports"] {
        store
            .upsert_queue(&sluice_queue::QueueSettings::defaults(q))
            .await
            .unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let state = sluice_sidecar::queue::api::ApiState::new(store).with_auth(Arc::new(gate_as("shop", "web")));
    tokio::spawn(sluice_sidecar::queue::api::serve(listener, state, async move {
        let _ = stopped.await;
    }));
    let http = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let enqueue = |queue: &str, authorization: Option<&str>| {
        let mut req = http::Request::post(format!("{base}/v1/queues/{queue}/jobs"))
            .header("content-type", "application/json");
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let req = req
            .body(http_body_util::Full::new(bytes::Bytes::from(
                r#"{"kind": "welcome", "payload": {}}"#,
            )))
            .unwrap();
        let http = http.clone();
        async move {
            use http_body_util::BodyExt;
            let resp = http.request(req).await.unwrap();
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            (
                status,
                body["error"]["code"].as_str().unwrap_or_default().to_owned(),
            )
        }
    };
    let stranger_token = bearer(&token("shop", "stranger", Some("sluice")));
    assert_eq!(enqueue("emails", Some(&web)).await, (201, String::new()));
    assert_eq!(
        enqueue("emails", None).await,
        (201, String::new()),
        "the pod's own loopback"
    );
    assert_eq!(
        enqueue("emails", Some(&wrong_audience)).await,
        (401, "unauthenticated".into())
    );
    assert_eq!(
        enqueue("emails", Some(&stranger_token)).await,
        (403, "forbidden".into())
    );
    assert_eq!(enqueue("reports", Some(&web)).await, (403, "forbidden".into()));
    let _ = stop.send(());

    // What the webhook injects for it is a pod the real API server admits (projected token volumes,
    // downward-API env), for a pod on the pod network and one on the host network.
    let job_queue: sluice_crds::job_queue::JobQueue = serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
        "metadata": {"name": "emails", "namespace": "shop"},
        "spec": {"queueName": "email-jobs", "database": {"secretRef": {"name": "pg"}},
                 "worker": {"template": {"spec": {"containers": [{"name": "h", "image": "h"}]}}}},
    }))
    .unwrap();
    let config = sluice_operator::webhook::inject::InjectConfig {
        sidecar: sluice_operator::render::sidecar_container::SidecarSettings {
            image: "ghcr.io/sluice-dev/sluice-sidecar:0.1.0".into(),
            image_pull_policy: None,
            resources: None,
            queue_api_auth: true,
        },
        native: true,
        config_verify_key: None,
        queue_api_auth: true,
    };
    for host_network in [false, true] {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop",
                         "annotations": {"sluice.dev/job-queues": "emails"}},
            "spec": {"serviceAccountName": "web", "hostNetwork": host_network,
                     "containers": [{"name": "web", "image": "shop/web:1"}]},
        }))
        .unwrap();
        let injected =
            sluice_operator::webhook::inject::admit(&pod, &[], &[Arc::new(job_queue.clone())], &config)
                .unwrap()
                .expect("injected");
        let created = kubectl(
            &["create", "--dry-run=server", "-o", "json", "-f", "-"],
            Some(&serde_json::to_string(&injected).unwrap()),
        );
        let created: serde_json::Value = serde_json::from_str(&created).unwrap();
        let volumes: Vec<&str> = created["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert!(
            volumes.contains(&"sluice-queue-api-token") && volumes.contains(&"sluice-kube-api"),
            "{volumes:?}"
        );
        let sidecar = &created["spec"]["initContainers"][0];
        let env: Vec<&str> = sidecar["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(env.contains(&"SLUICE_API_AUTH_LOOPBACK"), host_network, "{env:?}");
        assert!(env.contains(&"SLUICE_API_JOB_QUEUES"), "{env:?}");
    }

    // A sidecar whose ServiceAccount lacks the reviewer rights cannot check anyone: 503, naming why.
    let unbound = gate_as("other", "unbound");
    let refused = unbound.authenticate(remote(Some(&web))).await.unwrap_err();
    let Refusal::Unavailable(message) = refused else {
        panic!("{refused:?}")
    };
    assert!(
        message.contains("403") && message.contains("tokenreviews"),
        "{message}"
    );
}
