//! Scenario 2 of issue #7, the whole system: `kubectl apply` a JobQueue at `minReplicaCount: 0` →
//! 5,000 jobs enqueued through the queue HTTP API of a sidecar the webhook injected for
//! `sluice.dev/job-queues` → the operator wakes the workers 0 → 1 on
//! the enqueue's NOTIFY, the HPA (stand-in, reading the operator's external metrics API through the API
//! server's aggregation) scales 1 → N, the workers drain the queue, every job succeeds exactly once,
//! and after the cooldown the operator scales back to 0. A worker's sidecar is killed mid-job (SIGKILL):
//! its jobs are rescued when their leases expire and still succeed exactly once.
//!
//! The real `sluice-operator` and `sluice-sidecar` binaries run as processes; PostgreSQL is a real
//! server the scenario starts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::http;
use crate::system::SluiceSystem;
use crate::wait_for;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use serde_json::json;
use sluice_testsupport::PgServer;

const JOBS: usize = 5_000;
const BATCH: usize = 1_000;
const DEADLINE: Duration = Duration::from_secs(30);
const DRAIN_DEADLINE: Duration = Duration::from_secs(120);
/// Every 250th job runs this long (the rest 20 ms), so a worker can be caught holding one when it is
/// killed: short jobs alone may all finish between seeing a lease and the kill.
const LONG_JOB_MS: u64 = 6_000;

fn job_ms(n: usize) -> u64 {
    if n.is_multiple_of(250) { LONG_JOB_MS } else { 20 }
}

fn queue(db_url: &str) -> String {
    let secret = crate::system::secret_yaml("db", "url", db_url);
    format!(
        r#"
{secret}
---
apiVersion: sluice.dev/v1alpha1
kind: JobQueue
metadata: {{name: thumbs}}
spec:
  database: {{secretRef: {{name: db}}}}
  worker:
    template:
      spec:
        containers:
          - name: handler
            image: example/sluice-demo-app:1
            ports: [{{containerPort: 3000}}]
    handler: {{container: handler, port: 3000, path: /jobs}}
    concurrency: 8
    jobTimeout: 10s
    leaseDuration: 2s
  retry: {{maxAttempts: 5, backoff: {{base: 100ms, cap: 1s}}}}
  scaling:
    minReplicaCount: 0
    maxReplicaCount: 4
    targetJobsPerReplica: 1000
    pollingInterval: 1s
    cooldownPeriod: 3s
    advanced:
      horizontalPodAutoscalerConfig:
        behavior:
          scaleDown: {{stabilizationWindowSeconds: 0}}
---
# The enqueuer calls its sidecar's queue API without a token, as its pod's ServiceAccount (`default`):
# with the queue API's checks on, that account needs this right, as docs/queue.md tells users.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: enqueue-thumbs}}
rules: [{{apiGroups: [sluice.dev], resources: [jobqueues/jobs], resourceNames: [thumbs], verbs: [create]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: enqueuer-enqueues-thumbs}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: enqueue-thumbs}}
subjects: [{{kind: ServiceAccount, name: default}}]
"#
    )
}

/// The app that enqueues: annotated `sluice.dev/job-queues`, so the webhook injects a sidecar serving the
/// queue HTTP API on the pod's localhost:7070, with the database URL by reference to the queue's Secret.
const ENQUEUER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: enqueuer
  labels: {app: enqueuer}
  annotations: {sluice.dev/job-queues: thumbs}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: example/sluice-demo-app:1
      ports: [{name: app, containerPort: 8080}]
"#;

/// Runs the scenario on an installed system (either control plane); panics naming what failed.
pub async fn run(system: &SluiceSystem) {
    let pg = PgServer::start();
    let ns = system.env().namespace("job-queue").await.unwrap();
    // Its Redis/database Secret lives here: the operator may read Secrets only where the chart says.
    system.grant_secret_access(ns.name()).await.unwrap();
    let n = ns.name().to_string();
    system
        .kubectl_ok(&["apply", "-n", &n, "-f", "-"], Some(&queue(&pg.url())))
        .await
        .unwrap();
    let deployments = ns.api::<Deployment>();
    let pods = ns.api::<Pod>();

    // The operator prepares the schema and the worker Deployment at 0 replicas.
    wait_for(
        "worker Deployment thumbs-worker at 0 replicas",
        DEADLINE,
        || async {
            let d = deployments.get_opt("thumbs-worker").await.ok().flatten()?;
            (d.spec?.replicas == Some(0)).then_some(())
        },
    )
    .await
    .unwrap();
    let ready = wait_for("queue thumbs registered and Ready", DEADLINE, || async {
        let out = system
            .kubectl_ok(
                &[
                    "get",
                    "jobqueues.sluice.dev",
                    "thumbs",
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
    .await;
    if let Err(e) = ready {
        panic!("{e}\n{}", system.operator_logs().await);
    }

    if system.queue_api_auth() {
        crate::scenarios::queue_api_auth::reviewers_bound(system, &n).await;
    }
    system
        .kubectl_ok(&["apply", "-n", &n, "-f", "-"], Some(ENQUEUER))
        .await
        .unwrap();
    let api_port = wait_for("the enqueuer's injected queue API", DEADLINE, || async {
        let pod = pods.get("enqueuer").await.ok()?;
        crate::deployments::is_ready(&pod).then_some(())?;
        system.kubelet().port(&n, "enqueuer", "7070")
    })
    .await;
    let api_port = match api_port {
        Ok(port) => port,
        // What the stand-in's processes of the pod said, so that a pod that never got ready says why.
        Err(e) => panic!(
            "{e}\n==== enqueuer/sluice-sidecar ====\n{}\n==== enqueuer/app ====\n{}",
            system.container_log(&n, "enqueuer", "sluice-sidecar"),
            system.container_log(&n, "enqueuer", "app")
        ),
    };
    let pod = pods.get("enqueuer").await.unwrap();
    let spec = pod.spec.unwrap();
    let sidecar = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == "sluice-sidecar")
        .expect("the webhook injected the sidecar for sluice.dev/job-queues");
    let env = sidecar.env.clone().unwrap_or_default();
    let database = env.iter().find(|e| e.name == "SLUICE_DATABASE_URL").unwrap();
    assert!(
        database.value.is_none(),
        "the URL is referenced, never written into the pod"
    );

    // Replica counts over time, as the Deployment's spec says.
    let history = Arc::new(Mutex::new(vec![0i32]));
    let (stop_watch, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let watcher = {
        let (deployments, history) = (deployments.clone(), history.clone());
        tokio::spawn(async move {
            loop {
                if let Ok(Some(d)) = deployments.get_opt("thumbs-worker").await {
                    let r = d.spec.and_then(|s| s.replicas).unwrap_or(0);
                    let mut h = history.lock().unwrap();
                    if h.last() != Some(&r) {
                        h.push(r);
                    }
                }
                tokio::select! {
                    _ = &mut stopped => return,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        })
    };

    // 5,000 jobs through the queue API, in batches.
    for start in (0..JOBS).step_by(BATCH) {
        let jobs: Vec<_> = (start..start + BATCH)
            .map(|i| json!({"kind": "thumb", "payload": {"n": i, "sleepMs": job_ms(i)}}))
            .collect();
        let body = json!({"jobs": jobs}).to_string();
        let reply = http::post_json(api_port, "/v1/queues/thumbs/jobs/batch", &body)
            .await
            .unwrap();
        assert_eq!(reply.status, 201, "{}", reply.body);
    }

    // Several workers at once; kill one worker's sidecar while it holds jobs.
    let victim = wait_for(
        "two worker pods Ready, one holding a long job it just started",
        DEADLINE,
        || async {
            let list = pods
                .list(&ListParams::default().labels("sluice.dev/jobqueue=thumbs"))
                .await
                .ok()?;
            let ready: Vec<String> = list
                .items
                .iter()
                .filter(|p| crate::deployments::is_ready(p))
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            if ready.len() < 2 {
                return None;
            }
            // A long job started in the last 2 s is still running when the kill lands a moment later.
            let owners = pg.psql(&format!(
                "SELECT DISTINCT lease_owner FROM sluice.jobs WHERE state = 'running' \
                 AND (payload->>'sleepMs')::int = {LONG_JOB_MS} AND started_at > now() - interval '2 seconds'"
            ));
            ready
                .into_iter()
                .find(|pod| owners.lines().any(|o| o.trim().starts_with(&format!("{pod}-"))))
        },
    )
    .await
    .unwrap();
    // SIGKILL, and wait until the process is gone: whatever it still held is orphaned for good.
    let pid = system.kubelet().pid(&n, &victim, "sluice-sidecar").unwrap();
    assert!(system.kubelet().kill(&n, &victim, "sluice-sidecar"));
    wait_for("the killed sidecar gone", DEADLINE, || async move {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        (stat.is_empty() || stat.split(' ').nth(2) == Some("Z")).then_some(())
    })
    .await
    .unwrap();
    let held = pg.psql(&format!(
        "SELECT id FROM sluice.jobs WHERE state = 'running' AND lease_owner LIKE '{victim}-%'"
    ));
    let rescued: Vec<&str> = held.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    assert!(!rescued.is_empty(), "the killed worker held no job any more");

    // Drained: every job succeeded, exactly once (one success per job id; fenced completions).
    wait_for("all 5,000 jobs succeeded", DRAIN_DEADLINE, || async {
        let done: usize = pg
            .psql(&format!(
                "SELECT count(*) FROM sluice.jobs WHERE queue = '{}/thumbs' AND state = 'succeeded'",
                ns.name()
            ))
            .trim()
            .parse()
            .ok()?;
        (done == JOBS).then_some(())
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            pg.psql("SELECT state, count(*) FROM sluice.jobs GROUP BY state")
        )
    });
    let summary = pg.psql(&format!(
        "SELECT count(*), count(DISTINCT payload->>'n'), count(*) FILTER (WHERE state <> 'succeeded') FROM sluice.jobs WHERE queue = '{}/thumbs'",
        ns.name()
    ));
    assert_eq!(
        summary.trim(),
        format!("{JOBS}|{JOBS}|0"),
        "jobs | distinct | not succeeded"
    );
    for id in &rescued {
        let row = pg.psql(&format!(
            "SELECT state, attempt > 1 FROM sluice.jobs WHERE id = '{id}'"
        ));
        assert_eq!(row.trim(), "succeeded|t", "job {id} held by the killed worker");
    }

    // Back to zero after the cooldown; no worker pod left.
    wait_for("workers scaled back to 0 and gone", DEADLINE, || async {
        let d = deployments.get("thumbs-worker").await.ok()?;
        let left = pods
            .list(&ListParams::default().labels("sluice.dev/jobqueue=thumbs"))
            .await
            .ok()?
            .items
            .len();
        (d.spec?.replicas == Some(0) && left == 0).then_some(())
    })
    .await
    .unwrap();
    let _ = stop_watch.send(());
    watcher.await.unwrap();
    let mut history = history.lock().unwrap().clone();
    // The wait above saw 0 replicas; the watcher may have been stopped before its next look.
    if history.last() != Some(&0) {
        history.push(0);
    }
    assert_eq!(history.first(), Some(&0), "{history:?}");
    assert_eq!(history.get(1), Some(&1), "woken 0 → 1 first: {history:?}");
    assert!(history.iter().any(|r| *r >= 2), "scaled 1 → N: {history:?}");
    // The queue only drains, so once scaling in began nothing scales out again: nobody fights the HPA
    // (on a real control plane the operator once re-applied counts it had read before the HPA's write).
    let peak = history
        .iter()
        .enumerate()
        .max_by_key(|(i, r)| (**r, std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i);
    assert!(
        history[peak..].windows(2).all(|w| w[1] <= w[0]),
        "scaled out again after scaling in: {history:?}"
    );
    eprintln!(
        "worker replicas over time: {history:?}; jobs rescued from the killed worker: {}",
        rescued.len()
    );

    drop(ns);
}
