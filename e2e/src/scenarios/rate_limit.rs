//! Scenario 1 of issue #7, the whole system: `kubectl apply` a RateLimitPolicy and an annotated
//! Deployment → the operator's webhook injects the sidecar → the kubelet stand-in runs the sidecar and
//! the demo app → traffic through the sidecar gets 429 after the limit with the quota headers; a limit
//! changed with kubectl is enforced and visible in status; scaled to two replicas, the operator publishes
//! the count of enforcing pods and the sidecar reads it; with Redis stopped traffic follows the failure
//! mode (`local`: what Redis last said the client had left ÷ the published count per pod, not ÷
//! `expectedReplicas`, and not the whole limit again); with Redis back the limits return, with what the
//! pod allowed meanwhile counted in Redis.
//!
//! The real `sluice-operator` and `sluice-sidecar` binaries run as processes; Redis is a real
//! `redis-server` the scenario starts.

use std::time::Duration;

use crate::http::{self, Response};
use crate::system::SluiceSystem;
use crate::{TestNamespace, wait_for};
use k8s_openapi::api::{core::v1::Pod, networking::v1::NetworkPolicy};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};
use sluice_crds::rate_limit_policy::RateLimitPolicy;
use sluice_testsupport::RedisServer;

const DEADLINE: Duration = Duration::from_secs(30);

fn policy(redis_url: &str, requests: u32) -> String {
    let secret = crate::system::secret_yaml("redis", "url", redis_url);
    format!(
        r#"
{secret}
---
apiVersion: sluice.dev/v1alpha1
kind: RateLimitPolicy
metadata: {{name: web}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  redis: {{secretRef: {{name: redis}}}}
  failureMode: local
  expectedReplicas: 4
  rules:
    - name: per-client
      algorithm: slidingLog
      limit: {{requests: {requests}, window: 1h}}
"#
    )
}

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata:
      labels: {app: web}
      annotations:
        sluice.dev/inject: "true"
        sluice.dev/app-port: http
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: app
          image: example/sluice-demo-app:1
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {httpGet: {path: /, port: http}}
"#;

/// Sends `n` requests one after the other; returns them all.
async fn burst(port: u16, n: usize) -> Vec<Response> {
    let mut out = vec![];
    for _ in 0..n {
        out.push(http::get(port, "/").await.expect("the sidecar answers"));
    }
    out
}

fn statuses(responses: &[Response]) -> Vec<u16> {
    responses.iter().map(|r| r.status).collect()
}

/// The only pod of Deployment `web`, once Ready, and the local ports of its sidecar (`http`) and the
/// sidecar's admin port.
async fn ready_pod(system: &SluiceSystem, ns: &TestNamespace) -> (Pod, u16, u16) {
    let pods = ns.api::<Pod>();
    let kubelet = system.kubelet().clone();
    let n = ns.name().to_string();
    wait_for("the web pod injected, running and Ready", DEADLINE, || {
        let (pods, kubelet, n) = (pods.clone(), kubelet.clone(), n.clone());
        async move {
            let pod = pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?
                .items
                .into_iter()
                .find(crate::deployments::is_ready)?;
            let name = pod.metadata.name.clone()?;
            let http = kubelet.port(&n, &name, "http")?;
            let admin = kubelet.port(&n, &name, "sluice-admin")?;
            Some((pod, http, admin))
        }
    })
    .await
    .unwrap()
}

/// Waits until the sidecar on `admin` has read the operator's count of enforcing pods as `pods`.
async fn enforcing_pods_read(admin: u16, pods: u32) {
    let line = format!("sluice_config_enforcing_pods {pods}");
    wait_for(
        &format!("the sidecar read {pods} enforcing pods"),
        DEADLINE,
        || {
            let line = line.clone();
            async move {
                let metrics = http::get(admin, "/metrics").await.ok()?;
                metrics.body.lines().any(|l| l.trim_end() == line).then_some(())
            }
        },
    )
    .await
    .unwrap();
}

/// Waits until the sidecar's circuit breaker is closed (it reaches Redis): decisions are Redis's.
async fn redis_reached(admin: u16) {
    wait_for(
        "the sidecar reaches Redis (breaker closed)",
        DEADLINE,
        || async move {
            let metrics = http::get(admin, "/metrics").await.ok()?;
            metrics
                .body
                .lines()
                .any(|l| l.starts_with("sluice_limiter_breaker_open") && l.trim_end().ends_with(" 0"))
                .then_some(())
        },
    )
    .await
    .unwrap();
}

async fn enforced(ns: &TestNamespace, generation: i64) -> RateLimitPolicy {
    let policies = ns.api::<RateLimitPolicy>();
    wait_for(
        &format!("generation {generation} enforced by the pod and shown in status"),
        DEADLINE,
        || {
            let policies = policies.clone();
            async move {
                let p = policies.get("web").await.ok()?;
                let status = p.status.as_ref()?;
                (status.observed_generation == Some(generation)
                    && status.enforcing_pods == 1
                    && status
                        .generations
                        .iter()
                        .any(|g| g.generation == generation && g.pods == 1))
                .then_some(p)
            }
        },
    )
    .await
    .unwrap()
}

/// The process runs as UID/GID 65532 with no capabilities and `no_new_privs`.
fn assert_confined(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert_eq!(field("Uid"), "65532 65532 65532 65532", "{status}");
    assert_eq!(field("Gid"), "65532 65532 65532 65532", "{status}");
    assert_eq!(field("CapEff"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs"), "1", "{status}");
}

/// Runs the scenario on an installed system (either control plane); panics naming what failed.
pub async fn run(system: &SluiceSystem) {
    let mut redis = RedisServer::start();
    let ns = system.env().namespace("rate-limit").await.unwrap();
    // Its Redis/database Secret lives here: the operator may read Secrets only where the chart says.
    system.grant_secret_access(ns.name()).await.unwrap();
    let n = ns.name();
    system
        .kubectl_ok(&["apply", "-n", n, "-f", "-"], Some(&policy(&redis.url(), 5)))
        .await
        .unwrap();
    system
        .kubectl_ok(&["apply", "-n", n, "-f", "-"], Some(DEPLOYMENT))
        .await
        .unwrap();

    // Injected by the webhook, run by the kubelet stand-in.
    let (pod, port, admin) = ready_pod(system, &ns).await;
    let spec = pod.spec.clone().unwrap();
    let sidecar = spec
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == "sluice-sidecar")
        .expect("the webhook injected a native sidecar");
    assert!(sidecar.image.as_deref().unwrap().contains("sluice-sidecar"));
    if system.runs_images() {
        // From the images with Podman: the sidecar and the operator run as the securityContext's UID
        // 65532 without capabilities (as processes they would run as the test's own user).
        let kubelet = system.kubelet();
        assert_confined(
            kubelet
                .pid(n, pod.metadata.name.as_deref().unwrap(), "sluice-sidecar")
                .unwrap(),
        );
        let operators: Api<Pod> = Api::namespaced(system.env().client(), crate::system::RELEASE_NAMESPACE);
        let operator = operators.list(&ListParams::default()).await.unwrap().items;
        let operator = operator[0].metadata.name.as_deref().unwrap();
        assert_confined(
            kubelet
                .pid(crate::system::RELEASE_NAMESPACE, operator, "operator")
                .unwrap(),
        );
    }
    redis_reached(admin).await;
    let status = enforced(&ns, 1).await.status.unwrap();
    assert_eq!(status.enforcing.as_deref(), Some("1/1"), "{status:?}");

    // The NetworkPolicy the operator rendered, as the API server stored it: ingress to the governed
    // pods only on the sidecar's ports, by name (the app's own port is not among them).
    let np = ns
        .api::<NetworkPolicy>()
        .get("sluice-policy-web")
        .await
        .unwrap()
        .spec
        .unwrap();
    let selector = np.pod_selector.unwrap().match_labels.unwrap();
    assert_eq!(selector.get("sluice.dev/policy").map(String::as_str), Some("web"));
    assert_eq!(np.policy_types.as_deref(), Some(&["Ingress".to_string()][..]));
    let ingress = np.ingress.unwrap();
    assert_eq!(ingress.len(), 1, "{ingress:?}");
    let mut ports: Vec<String> = ingress[0]
        .ports
        .iter()
        .flatten()
        .map(|p| {
            assert_eq!(p.protocol.as_deref(), Some("TCP"), "{p:?}");
            match p.port.clone().unwrap() {
                IntOrString::String(name) => name,
                IntOrString::Int(n) => n.to_string(),
            }
        })
        .collect();
    ports.sort();
    assert_eq!(ports, ["http", "sluice", "sluice-admin"]);

    // Five pass, the sixth gets 429 with the quota headers.
    let got = burst(port, 6).await;
    assert_eq!(statuses(&got), [200, 200, 200, 200, 200, 429]);
    assert!(
        got[0].body.starts_with("ok "),
        "the demo app answered: {:?}",
        got[0].body
    );
    assert_eq!(got[4].header("x-ratelimit-remaining"), Some("0"));
    let limited = &got[5];
    assert_eq!(limited.header("x-ratelimit-limit"), Some("5"));
    assert_eq!(limited.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        limited.header("ratelimit-policy"),
        Some(r#""per-client";q=5;w=3600"#)
    );
    let retry: u64 = limited.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "retry-after {retry}");

    // The limit raised to 8 with kubectl: enforced (counters kept: 3 more pass) and in status.
    system
        .kubectl_ok(&["apply", "-n", n, "-f", "-"], Some(&policy(&redis.url(), 8)))
        .await
        .unwrap();
    enforced(&ns, 2).await;
    let got = burst(port, 4).await;
    assert_eq!(statuses(&got), [200, 200, 200, 429]);
    assert_eq!(got[3].header("x-ratelimit-limit"), Some("8"));
    let table = system
        .kubectl_ok(&["get", "ratelimitpolicies.sluice.dev", "-n", n], None)
        .await
        .unwrap();
    assert!(table.contains("1/1"), "kubectl get shows who enforces: {table}");

    // The limit raised to 16 and one more request through Redis: it has 7 left for this client.
    system
        .kubectl_ok(&["apply", "-n", n, "-f", "-"], Some(&policy(&redis.url(), 16)))
        .await
        .unwrap();
    enforced(&ns, 3).await;
    let got = burst(port, 1).await;
    assert_eq!(statuses(&got), [200]);
    assert_eq!(got[0].header("x-ratelimit-limit"), Some("16"));
    assert_eq!(got[0].header("x-ratelimit-remaining"), Some("7"));

    // One pod enforces the policy, and the operator says so (signed, in Redis); scaled to two, the count
    // follows and the sidecar reads it.
    enforcing_pods_read(admin, 1).await;
    system
        .kubectl_ok(&["scale", "-n", n, "deployment/web", "--replicas=2"], None)
        .await
        .unwrap();
    enforcing_pods_read(admin, 2).await;

    // Redis gone: failureMode local. The pod starts the client's bucket from what Redis last said (7
    // left) and takes its share of it: 7 ÷ the 2 pods the operator counted = 3 (`expectedReplicas: 4`
    // would have made it 1; starting from zero, 16 ÷ 2 = 8 would have passed).
    redis.kill();
    let got = burst(port, 6).await;
    assert_eq!(statuses(&got), [200, 200, 200, 429, 429, 429]);

    // Redis back, empty (the 9 it had counted are lost with it): the limit of 16 applies again through
    // Redis, with the 3 the pod allowed while Redis was gone carried over into it: 13 more pass.
    redis.restart();
    let first = wait_for("a request allowed through Redis again", DEADLINE, || async move {
        http::get(port, "/").await.ok().filter(|r| r.status == 200)
    })
    .await
    .unwrap();
    assert_eq!(first.header("x-ratelimit-limit"), Some("16"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("12"));
    let got = burst(port, 13).await;
    let mut expected = vec![200; 12];
    expected.push(429);
    assert_eq!(statuses(&got), expected);

    drop(ns);
}
