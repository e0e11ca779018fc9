//! The queue API with callers checked (`queueApi.auth: kubernetes`, the chart's default), the whole
//! system on the real control plane: the webhook injects a sidecar for `sluice.dev/job-queues`, the
//! kubelet stand-in mounts the projected tokens the webhook asked for (TokenRequest, audience `sluice`,
//! bound to the Pod) and the sidecar's API credentials, and the sidecar reviews each caller with the real
//! API server's TokenReview and SubjectAccessReview, under the reviewer ClusterRoleBinding the operator
//! keeps for namespaces that hold a JobQueue.
//!
//! - The app's own token (the file `SLUICE_QUEUE_API_TOKEN_FILE` names) enqueues: its ServiceAccount is
//!   granted `create` on `jobqueues/jobs` by a Role and RoleBinding the scenario creates as docs/queue.md
//!   tells users to.
//! - A valid `sluice` token of another namespace's ServiceAccount, and of a ServiceAccount of the same
//!   namespace without the Role, are 403, the body naming the user, the verb and the JobQueue.
//! - The pod's API token (another audience) is 401 naming the audience.
//! - A host-network pod's sidecar (`loopback: token`, set by the webhook because its loopback is the
//!   node's) answers a caller without a token 401, and its own app's token 201.
//!
//! What the stand-in cannot show: every process here shares 127.0.0.1, so a caller without a token
//! reaching an ordinary pod's sidecar comes from loopback to a loopback listener, which is exactly the
//! pod's own container under `loopback: pod` — the scenario checks that it is taken as the pod's
//! ServiceAccount (and so judged by its Role), but a call from another pod's network namespace, which
//! could not reach a listener on the pod's 127.0.0.1 at all, cannot be made.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::Api;
use serde_json::{Value, json};
use sluice_testsupport::PgServer;

use crate::http;
use crate::system::SluiceSystem;
use crate::wait_for;

const DEADLINE: Duration = Duration::from_secs(60);
/// The queue API reviewers' ClusterRoleBinding the chart creates for release `sluice`.
const REVIEWER_BINDING: &str = "sluice-queue-api-reviewer-jobqueues";
/// The projected volume of the app's token for the queue API (the webhook's).
const TOKEN_VOLUME: &str = "sluice-queue-api-token";
/// The projected volume of the sidecar's API server credentials (the webhook's).
const KUBE_API_VOLUME: &str = "sluice-kube-api";
/// Where the webhook tells app containers their token is.
const TOKEN_PATH: &str = "/var/run/secrets/sluice.dev/token";

fn objects(db_url: &str, ns: &str) -> String {
    let secret = crate::system::secret_yaml("db", "url", db_url);
    format!(
        r#"
{secret}
---
apiVersion: sluice.dev/v1alpha1
kind: JobQueue
metadata: {{name: emails}}
spec:
  database: {{secretRef: {{name: db}}}}
  worker:
    template:
      spec:
        containers:
          - {{name: handler, image: example/sluice-demo-app:1, ports: [{{containerPort: 3000}}]}}
    handler: {{container: handler, port: 3000, path: /jobs}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: web}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: enqueue-emails}}
rules:
  - apiGroups: [sluice.dev]
    resources: [jobqueues/jobs]
    resourceNames: [emails]
    verbs: [create, get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: web-enqueues-emails}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: enqueue-emails}}
subjects:
  - {{kind: ServiceAccount, name: web, namespace: {ns}}}
"#
    )
}

/// An app pod running as ServiceAccount `web`, enqueueing on `emails` through its injected sidecar.
fn app_pod(name: &str, host_network: bool) -> String {
    format!(
        r#"
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations: {{sluice.dev/job-queues: emails}}
spec:
  serviceAccountName: web
  hostNetwork: {host_network}
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: example/sluice-demo-app:1
      ports: [{{name: app, containerPort: 8080}}]
"#
    )
}

/// `POST /v1/queues/emails/jobs` on `port`, with `token` as bearer when given.
async fn enqueue(port: u16, token: Option<&str>) -> (u16, Value) {
    let bearer = token.map(|t| format!("Bearer {}", t.trim()));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(b) = &bearer {
        headers.push(("Authorization", b.as_str()));
    }
    let body = json!({"kind": "mail", "payload": {"to": "ana@example.com"}}).to_string();
    let reply = http::request(port, "POST", "/v1/queues/emails/jobs", &headers, &body)
        .await
        .unwrap();
    let value = serde_json::from_str(&reply.body).unwrap_or(Value::String(reply.body.clone()));
    (reply.status, value)
}

/// Waits until the operator binds the ServiceAccounts of `namespace` (which holds a JobQueue) as queue
/// API reviewers: until then the sidecars' own TokenReviews are refused and every caller gets 503.
pub async fn reviewers_bound(system: &SluiceSystem, namespace: &str) {
    let bindings: Api<ClusterRoleBinding> = Api::all(system.env().client());
    let group = format!("system:serviceaccounts:{namespace}");
    wait_for(
        "the namespace's ServiceAccounts bound as queue API reviewers",
        DEADLINE,
        || async {
            let binding = bindings.get(REVIEWER_BINDING).await.ok()?;
            binding.subjects?.iter().any(|s| s.name == group).then_some(())
        },
    )
    .await
    .unwrap();
}

/// Runs the scenario (real control plane, `queueApi.auth: kubernetes`); panics naming what failed.
pub async fn run(system: &SluiceSystem) {
    let pg = PgServer::start();
    let ns = system.env().namespace("queue-auth").await.unwrap();
    let other = system.env().namespace("queue-auth-other").await.unwrap();
    let n = ns.name().to_string();
    system.grant_secret_access(&n).await.unwrap();
    system
        .kubectl_ok(&["apply", "-n", &n, "-f", "-"], Some(&objects(&pg.url(), &n)))
        .await
        .unwrap();
    wait_for("queue emails Ready", DEADLINE, || async {
        let out = system
            .kubectl_ok(
                &[
                    "get",
                    "jobqueues.sluice.dev",
                    "emails",
                    "-n",
                    &n,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ],
                None,
            )
            .await
            .ok()?;
        (out.trim() == "True").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    reviewers_bound(system, &n).await;

    let pod_yaml = format!("{}\n---\n{}", app_pod("web", false), app_pod("host-web", true));
    system
        .kubectl_ok(&["apply", "-n", &n, "-f", "-"], Some(&pod_yaml))
        .await
        .unwrap();
    let pods = ns.api::<Pod>();
    let kubelet = system.kubelet();
    let mut ports = vec![];
    for name in ["web", "host-web"] {
        let port = wait_for(
            &format!("pod {name} Ready, its queue API served"),
            DEADLINE,
            || async {
                let pod = pods.get(name).await.ok()?;
                crate::deployments::is_ready(&pod).then_some(())?;
                kubelet.port(&n, name, "7070")
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", system.container_log(&n, name, "sluice-sidecar")));
        ports.push(port);
    }
    let (web_port, host_port) = (ports[0], ports[1]);

    // The webhook mounted the app's token and named the file; the stand-in wrote it there.
    let pod = pods.get("web").await.unwrap();
    let app = pod
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == "app")
        .unwrap();
    let named = app
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "SLUICE_QUEUE_API_TOKEN_FILE")
        .and_then(|e| e.value.clone());
    assert_eq!(named.as_deref(), Some(TOKEN_PATH), "{:?}", app.env);
    let read = |pod: &str, volume: &str| {
        let path = kubelet.volume_file(&n, pod, volume, "token").unwrap();
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let web_token = read("web", TOKEN_VOLUME);

    // The app's own token: its ServiceAccount, allowed by the Role.
    let (status, body) = enqueue(web_port, Some(&web_token)).await;
    assert_eq!(status, 201, "the app's own token: {body}");

    // No token, from loopback to the loopback listener: taken as the pod's ServiceAccount (`loopback:
    // pod`), so allowed by the same Role.
    let (status, body) = enqueue(web_port, None).await;
    assert_eq!(status, 201, "tokenless on the pod's loopback: {body}");

    // A valid `sluice` token of another namespace's ServiceAccount: authenticated, not authorized.
    let token_of = |ns: String, sa: &'static str| async move {
        system
            .kubectl_ok(
                &[
                    "create",
                    "token",
                    sa,
                    "-n",
                    &ns,
                    "--audience",
                    "sluice",
                    "--duration",
                    "10m",
                ],
                None,
            )
            .await
            .unwrap()
    };
    for (account_ns, account) in [(other.name().to_string(), "default"), (n.clone(), "default")] {
        let token = token_of(account_ns.clone(), account).await;
        let (status, body) = enqueue(web_port, Some(&token)).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert_eq!(status, 403, "{account_ns}/{account}: {body}");
        assert_eq!(body["error"]["code"], "forbidden", "{body}");
        for part in [
            format!("system:serviceaccount:{account_ns}:{account}"),
            "create jobqueues/jobs".to_string(),
            "\"emails\"".to_string(),
        ] {
            assert!(message.contains(&part), "{part} not in {message}");
        }
    }

    // The pod's API server token (not for audience `sluice`): refused as unauthenticated.
    let api_token = read("web", KUBE_API_VOLUME);
    let (status, body) = enqueue(web_port, Some(&api_token)).await;
    assert_eq!(status, 401, "the API server's audience: {body}");
    assert_eq!(body["error"]["code"], "unauthenticated", "{body}");

    // A host-network pod's loopback is the node's: no token is 401, its app's token 201.
    let (status, body) = enqueue(host_port, None).await;
    assert_eq!(status, 401, "tokenless to a host-network pod: {body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("no token"), "{body}");
    let (status, body) = enqueue(host_port, Some(&read("host-web", TOKEN_VOLUME))).await;
    assert_eq!(status, 201, "the host-network app's own token: {body}");

    // Only the three accepted calls enqueued.
    let count = pg.psql(&format!(
        "SELECT count(*) FROM sluice.jobs WHERE queue = '{n}/emails'"
    ));
    assert_eq!(count.trim(), "3", "jobs enqueued");

    drop(other);
    drop(ns);
}
