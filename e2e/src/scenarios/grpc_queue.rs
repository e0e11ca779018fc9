//! A JobQueue whose handler speaks gRPC (`worker.handler.protocol: grpc`), the whole system: the
//! operator renders the worker sidecar serving the `sluice.v1.Worker` API on the pod's 127.0.0.1:9903,
//! the handler container is the Python example worker (`examples/grpc-worker/worker.py`, image pattern
//! [`crate::kubelet::GRPC_WORKER_IMAGE_PATTERN`]) taking jobs over that stream, and jobs are enqueued
//! through the queue HTTP API of a sidecar injected for `sluice.dev/job-queues`. Every job succeeds,
//! once: one success per job in the table, on its first attempt, and each job's id printed once by the
//! workers (`done <id>`).
//!
//! With the queue APIs checking callers (`queueApi.auth: kubernetes`, the real control plane's install)
//! each worker's sidecar checks its gRPC callers: the handler sends the projected `sluice` token the
//! operator mounts in it (`SLUICE_QUEUE_API_TOKEN_FILE`), a real TokenReview accepts it as the pod's
//! ServiceAccount bound to that pod, and the pod itself takes its JobQueue's jobs without a Role; each
//! sidecar's log says its handler came in so (`token bound to this pod`). Real `sluice` tokens that are
//! not the pod's (`kubectl create token`: of another ServiceAccount, and of the pod's own ServiceAccount
//! but bound to no pod) are refused `PERMISSION_DENIED` naming user, verb and JobQueue, since no Role
//! grants them `update` on `jobqueues/jobs` of `mail`.
//!
//! Every Pod shares 127.0.0.1 under the kubelet stand-in: the gRPC port 9903, named in the worker's
//! rendered config and in the handler's `--target`, gets a local port per Pod like any other Pod port.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use serde_json::json;
use sluice_testsupport::PgServer;

use crate::http;
use crate::system::SluiceSystem;
use crate::wait_for;

const JOBS: usize = 300;
const DEADLINE: Duration = Duration::from_secs(60);

fn queue(db_url: &str) -> String {
    let secret = crate::system::secret_yaml("db", "url", db_url);
    format!(
        r#"
{secret}
---
apiVersion: sluice.dev/v1alpha1
kind: JobQueue
metadata: {{name: mail}}
spec:
  database: {{secretRef: {{name: db}}}}
  worker:
    template:
      spec:
        containers:
          - name: handler
            image: example/sluice-grpc-worker:1
            args: [--target, "127.0.0.1:9903", --queue, mail, --slots, "8"]
    handler: {{container: handler, protocol: grpc}}
    concurrency: 8
    # Also the workers' shutdown grace: the namespace is deleted quickly after the scenario.
    jobTimeout: 2s
  scaling: {{minReplicaCount: 2, maxReplicaCount: 2}}
---
# The enqueuer calls its sidecar's queue API without a token, as its pod's ServiceAccount (`default`).
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: enqueue-mail}}
rules: [{{apiGroups: [sluice.dev], resources: [jobqueues/jobs], resourceNames: [mail], verbs: [create]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: enqueuer-enqueues-mail}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: enqueue-mail}}
subjects: [{{kind: ServiceAccount, name: default}}]
"#
    )
}

const ENQUEUER: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: enqueuer
  annotations: {sluice.dev/job-queues: mail}
spec:
  terminationGracePeriodSeconds: 2
  containers:
    - name: app
      image: example/sluice-demo-app:1
      ports: [{name: app, containerPort: 8080}]
"#;

/// Runs the Python example worker against a worker pod's gRPC port (local `port`) with `token`; it
/// must exit failing: its error output.
async fn worker_refused(port: u16, token: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let run = tokio::process::Command::new("python3")
        .arg(crate::kubelet::GRPC_WORKER_SCRIPT)
        .args(["--target", &format!("127.0.0.1:{port}"), "--queue", "mail"])
        .args(["--connect-timeout", "10", "--token-file"])
        .arg(&token_file)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("the refused worker exits within 30 s")
        .expect("python3 runs");
    assert!(!out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs the scenario on an installed system (either control plane); panics naming what failed.
pub async fn run(system: &SluiceSystem) {
    let pg = PgServer::start();
    let ns = system.env().namespace("grpc-queue").await.unwrap();
    let n = ns.name().to_string();
    system.grant_secret_access(&n).await.unwrap();
    system
        .kubectl_ok(&["apply", "-n", &n, "-f", "-"], Some(&queue(&pg.url())))
        .await
        .unwrap();
    let pods = ns.api::<Pod>();
    let workers = ListParams::default().labels("sluice.dev/jobqueue=mail");
    // The worker sidecars review their handlers' tokens as the namespace's ServiceAccounts.
    if system.queue_api_auth() {
        crate::scenarios::queue_api_auth::reviewers_bound(system, &n).await;
    }

    // Two worker pods Ready, each with its own local port for the pod's 9903.
    let worker_pods = wait_for("two gRPC worker pods Ready", DEADLINE, || async {
        let list = pods.list(&workers).await.ok()?.items;
        let ready: Vec<String> = list
            .iter()
            .filter(|p| crate::deployments::is_ready(p))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        (ready.len() == 2).then_some(ready)
    })
    .await;
    let worker_pods = match worker_pods {
        Ok(pods) => pods,
        Err(e) => panic!("{e}\n{}", system.operator_logs().await),
    };
    let grpc_ports: HashSet<u16> = worker_pods
        .iter()
        .map(|p| {
            system
                .kubelet()
                .port(&n, p, "9903")
                .expect("9903 is a port of the worker pod")
        })
        .collect();
    assert_eq!(
        grpc_ports.len(),
        2,
        "each worker pod's 9903 has a local port of its own"
    );
    // Each handler subscribed to its own pod's sidecar.
    wait_for("both handlers subscribed", DEADLINE, || async {
        worker_pods
            .iter()
            .all(|p| system.container_log(&n, p, "handler").contains("subscribed as"))
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| {
        let logs: Vec<String> = worker_pods
            .iter()
            .map(|p| {
                format!(
                    "== {p} handler ==\n{}\n== {p} sidecar ==\n{}",
                    system.container_log(&n, p, "handler"),
                    system.container_log(&n, p, "sluice-sidecar")
                )
            })
            .collect();
        panic!("{e}\n{}", logs.join("\n"))
    });

    if system.queue_api_auth() {
        // Each handler came in with its own pod's token, checked by the real API server.
        let caller = format!("system:serviceaccount:{n}:default (token bound to this pod)");
        for p in &worker_pods {
            let log = system.container_log(&n, p, "sluice-sidecar");
            assert!(
                log.contains(&caller),
                "{p}: no stream let in as {caller:?}:\n{log}"
            );
        }
        let port = *grpc_ports.iter().next().unwrap();
        system
            .kubectl_ok(&["create", "serviceaccount", "intruder", "-n", &n], None)
            .await
            .unwrap();
        for account in ["intruder", "default"] {
            let token = system
                .kubectl_ok(
                    &[
                        "create",
                        "token",
                        account,
                        "-n",
                        &n,
                        "--audience",
                        "sluice",
                        "--duration",
                        "10m",
                    ],
                    None,
                )
                .await
                .unwrap();
            let refusal = worker_refused(port, token.trim()).await;
            let want = format!(
                "system:serviceaccount:{n}:{account} may not update jobqueues/jobs of JobQueue \"mail\""
            );
            assert!(
                refusal.contains("PERMISSION_DENIED") && refusal.contains(&want),
                "{account}: {refusal}"
            );
        }
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
    .await
    .unwrap();
    let jobs: Vec<_> = (0..JOBS)
        .map(|i| json!({"kind": "mail", "payload": {"n": i}}))
        .collect();
    let reply = http::post_json(
        api_port,
        "/v1/queues/mail/jobs/batch",
        &json!({"jobs": jobs}).to_string(),
    )
    .await
    .unwrap();
    assert_eq!(reply.status, 201, "{}", reply.body);

    let queue = format!("{n}/mail");
    wait_for("every job succeeded", DEADLINE, || async {
        let done: usize = pg
            .psql(&format!(
                "SELECT count(*) FROM sluice.jobs WHERE queue = '{queue}' AND state = 'succeeded'"
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
        "SELECT count(*), count(DISTINCT payload->>'n'), count(*) FILTER (WHERE attempt <> 1) \
         FROM sluice.jobs WHERE queue = '{queue}'"
    ));
    assert_eq!(
        summary.trim(),
        format!("{JOBS}|{JOBS}|0"),
        "jobs | distinct | not done on the first attempt"
    );

    // The handlers did the work, each job once: `done <id>` lines across both worker pods.
    let ids: Vec<String> = pg
        .psql(&format!("SELECT id FROM sluice.jobs WHERE queue = '{queue}'"))
        .lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    let logs: Vec<String> = worker_pods
        .iter()
        .map(|p| system.container_log(&n, p, "handler"))
        .collect();
    let done: Vec<&str> = logs
        .iter()
        .flat_map(|log| log.lines())
        .filter_map(|l| l.strip_prefix("done "))
        .collect();
    let distinct: HashSet<&str> = done.iter().copied().collect();
    assert_eq!(done.len(), JOBS, "done lines: each job once");
    assert_eq!(
        distinct,
        ids.iter().map(String::as_str).collect::<HashSet<_>>(),
        "the handlers completed exactly the enqueued jobs"
    );
    let per_pod: Vec<usize> = logs
        .iter()
        .map(|log| log.lines().filter(|l| l.starts_with("done ")).count())
        .collect();
    eprintln!("gRPC handlers' jobs per worker pod: {per_pod:?}");

    drop(ns);
}
