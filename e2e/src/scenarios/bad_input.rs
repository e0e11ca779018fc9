//! Scenario 3 of issue #7, the whole system: bad input through `kubectl` is refused with messages that
//! name the field or annotation at fault, and nothing is half-applied — no invalid object stored, no
//! valid object changed by a refused update, no ConfigMap, Deployment or HPA made for a refused object,
//! no pod created from a refused pod.
//!
//! The real `sluice-operator` binary runs as the chart's Deployment (see [`crate::system`]).

use std::time::Duration;

use crate::system::SluiceSystem;
use crate::wait_for;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::ListParams;
use sluice_crds::job_queue::JobQueue;
use sluice_crds::rate_limit_policy::RateLimitPolicy;

const DEADLINE: Duration = Duration::from_secs(20);

const GOOD_POLICY: &str = r#"
apiVersion: v1
kind: Secret
metadata: {name: redis}
stringData: {url: "redis://127.0.0.1:1"}
---
apiVersion: sluice.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: api}
spec:
  selector: {matchLabels: {app: web}}
  redis: {secretRef: {name: redis}}
  rules:
    - name: per-client
      algorithm: slidingLog
      limit: {requests: 100, window: 1m}
"#;

/// Seven mistakes in one policy; the API server reports every one.
const BAD_POLICY: &str = r#"
apiVersion: sluice.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: broken}
spec:
  redis: {secretRef: {name: redis}, timeout: 10s, prefetch: 200000}
  clientTimeouts: {idle: 0s}
  rules:
    - name: a
      algorithm: slidingLog
      limit: {requests: 100, window: 1m, burst: 5}
    - name: a
      limit: {requests: 0, window: 1m}
    - name: daily
      limit: {requests: 1000000000, window: 24h}
"#;

/// A valid change (the limit) together with an invalid one (the window): refused as a whole.
const HALF_GOOD_UPDATE: &str = r#"
apiVersion: sluice.dev/v1alpha1
kind: RateLimitPolicy
metadata: {name: api}
spec:
  selector: {matchLabels: {app: web}}
  redis: {secretRef: {name: redis}}
  rules:
    - name: per-client
      algorithm: slidingLog
      limit: {requests: 5, window: 500ms}
"#;

const BAD_QUEUE: &str = r#"
apiVersion: sluice.dev/v1alpha1
kind: JobQueue
metadata: {name: thumbnails}
spec:
  database: {secretRef: {name: db}}
  worker:
    template: {spec: {containers: [{name: handler, image: example/sluice-demo-app:1}]}}
  scaling: {minReplicaCount: 5, maxReplicaCount: 2, targetJobsPerReplica: 0}
"#;

const BAD_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
  annotations:
    sluice.dev/inject: "true"
    sluice.dev/listen-port: "eighty"
spec:
  containers:
    - name: app
      image: example/sluice-demo-app:1
      ports: [{name: http, containerPort: 8080}]
"#;

const POD_WITH_MISSING_QUEUE: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: enqueuer
  annotations: {sluice.dev/job-queues: invoices}
spec:
  containers:
    - name: app
      image: example/sluice-demo-app:1
"#;

const POD_WITHOUT_POLICY: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: orphan
  labels: {app: other}
  annotations:
    sluice.dev/inject: "true"
    sluice.dev/policy: missing
spec:
  containers:
    - name: app
      image: example/sluice-demo-app:1
      ports: [{name: http, containerPort: 8080}]
"#;

fn assert_refused(out: &std::process::Output, expected: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kubectl accepted it: {stderr}");
    for e in expected {
        assert!(stderr.contains(e), "missing {e:?} in kubectl's error:\n{stderr}");
    }
}

/// Runs the scenario on an installed system (either control plane); panics naming what failed.
pub async fn run(system: &SluiceSystem) {
    let ns = system.env().namespace("bad-input").await.unwrap();
    // Its Redis/database Secret lives here: the operator may read Secrets only where the chart says.
    system.grant_secret_access(ns.name()).await.unwrap();
    let n = ns.name();

    // A valid policy first, reconciled into its ConfigMap.
    system
        .kubectl_ok(&["apply", "-n", n, "-f", "-"], Some(GOOD_POLICY))
        .await
        .unwrap();
    let policies = ns.api::<RateLimitPolicy>();
    let configmaps = ns.api::<ConfigMap>();
    let before = wait_for("policy api reconciled into its ConfigMap", DEADLINE, || async {
        let cm = configmaps.get_opt("sluice-policy-api").await.ok().flatten()?;
        let policy = policies.get("api").await.ok()?;
        (policy.status.as_ref()?.observed_generation == Some(1)).then_some(cm.data)
    })
    .await
    .unwrap();

    // An invalid policy: every mistake named, nothing stored, nothing rendered.
    let out = system
        .kubectl(&["apply", "-n", n, "-f", "-"], Some(BAD_POLICY))
        .await
        .unwrap();
    assert_refused(
        &out,
        &[
            r#"The RateLimitPolicy "broken" is invalid"#,
            "spec.rules[1].limit.requests",
            "rule names must be unique within a policy",
            "limit.burst is only allowed with algorithm tokenBucket",
            "redis.timeout must be between 1ms and 5s",
            "spec.redis.prefetch",
            "clientTimeouts.idle must be between 1ms and 24h",
            "spec.rules[2].limit",
            "must stay below 2^53",
        ],
    );
    assert!(policies.get_opt("broken").await.unwrap().is_none());
    assert!(
        configmaps
            .get_opt("sluice-policy-broken")
            .await
            .unwrap()
            .is_none()
    );

    // A refused update leaves the stored policy and its rendered config as they were.
    let out = system
        .kubectl(&["apply", "-n", n, "-f", "-"], Some(HALF_GOOD_UPDATE))
        .await
        .unwrap();
    assert_refused(&out, &["limit.window must be at least 1s"]);
    let stored = policies.get("api").await.unwrap();
    assert_eq!(stored.metadata.generation, Some(1));
    assert_eq!(stored.spec.rules[0].limit.requests, 100);
    let after = configmaps.get("sluice-policy-api").await.unwrap().data;
    assert_eq!(after, before, "the refused update reached the sidecar config");

    // An invalid JobQueue: refused by its CEL rules; no worker Deployment, HPA or ConfigMap.
    let out = system
        .kubectl(&["apply", "-n", n, "-f", "-"], Some(BAD_QUEUE))
        .await
        .unwrap();
    assert_refused(
        &out,
        &[
            r#"The JobQueue "thumbnails" is invalid"#,
            "scaling.minReplicaCount must not exceed scaling.maxReplicaCount",
            "scaling.targetJobsPerReplica must be greater than 0",
        ],
    );
    assert!(
        ns.api::<JobQueue>()
            .get_opt("thumbnails")
            .await
            .unwrap()
            .is_none()
    );

    // A pod with a bad annotation: the webhook refuses it, naming the annotation; no pod exists.
    let out = system
        .kubectl(&["apply", "-n", n, "-f", "-"], Some(BAD_POD))
        .await
        .unwrap();
    assert_refused(
        &out,
        &[
            "inject.sluice.dev",
            "denied the request",
            r#"annotation sluice.dev/listen-port: "eighty" is not a port number"#,
        ],
    );
    // A pod naming a policy that does not exist: refused with the fix in the message.
    let out = system
        .kubectl(&["apply", "-n", n, "-f", "-"], Some(POD_WITHOUT_POLICY))
        .await
        .unwrap();
    assert_refused(
        &out,
        &[r#"RateLimitPolicy "missing" does not exist"#, "create it first"],
    );
    // A pod enqueuing to a JobQueue that does not exist: refused naming it.
    let out = system
        .kubectl(&["apply", "-n", n, "-f", "-"], Some(POD_WITH_MISSING_QUEUE))
        .await
        .unwrap();
    assert_refused(
        &out,
        &[r#"annotation sluice.dev/job-queues: JobQueue "invoices" does not exist"#],
    );
    let pods = ns.api::<Pod>();
    assert!(pods.list(&ListParams::default()).await.unwrap().items.is_empty());

    // Nothing else appeared: the only ConfigMap is the valid policy's (beside the cluster CA bundle a
    // real cluster publishes in every namespace), no Deployment, no HPA.
    let names: Vec<String> = configmaps
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|name| name != "kube-root-ca.crt")
        .collect();
    assert_eq!(names, ["sluice-policy-api"]);
    assert!(
        ns.api::<Deployment>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let hpas = ns.api::<HorizontalPodAutoscaler>();
    assert!(hpas.list(&ListParams::default()).await.unwrap().items.is_empty());
    let out = system
        .kubectl_ok(
            &[
                "get",
                "ratelimitpolicies.sluice.dev,jobqueues.sluice.dev",
                "-n",
                n,
                "-o",
                "name",
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(out.trim(), "ratelimitpolicy.sluice.dev/api");

    drop(ns);
}
