//! The kubelet stand-in runs Sluice's images as local processes: an injected-looking pod (the sidecar
//! as a native sidecar with its ConfigMap-mounted config, and the demo app as the team's container)
//! gets real processes, turns Ready once the sidecar's /readyz answers, passes traffic through the
//! sidecar to the app, and loses its processes when the pod is deleted or a process is killed; projected
//! volumes are written and a process is told where its ServiceAccount files are.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use sluice_e2e::kubelet::{Kubelet, KubeletConfig, sidecar_binary};
use sluice_e2e::{Env, wait_for};

const DEADLINE: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: sluice-policy-api}
data:
  config.yaml: |
    version: 1
    limits:
      failureMode: open
"#;

/// What the webhook makes of a pod (docs/injection.md), written out by hand.
fn injected_pod() -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "labels": {"app": "web"}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "initContainers": [{
                "name": "sluice-sidecar",
                "image": "ghcr.io/sluice-dev/sluice-sidecar:0.1.0",
                "restartPolicy": "Always",
                "args": ["--config", "/etc/sluice/config.yaml"],
                "env": [
                    {"name": "SLUICE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "SLUICE_LISTEN", "value": "0.0.0.0:15080"},
                    {"name": "SLUICE_UPSTREAM", "value": "http://127.0.0.1:8080"},
                ],
                "ports": [
                    {"name": "http", "containerPort": 15080, "protocol": "TCP"},
                    {"name": "sluice-admin", "containerPort": 15021, "protocol": "TCP"},
                ],
                "readinessProbe": {"httpGet": {"path": "/readyz", "port": 15021}},
                "volumeMounts": [{"name": "sluice-config", "mountPath": "/etc/sluice", "readOnly": true}],
            }],
            "containers": [
                {
                    "name": "web", "image": "example/sluice-demo-app:1", "ports": [{"containerPort": 8080}],
                    // Without it the pod is Ready as soon as the sidecar is, and a request can reach the
                    // sidecar before the app listens (a 502), as on a real node.
                    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}},
                },
                {"name": "not-ours", "image": "example/other:1"},
            ],
            "volumes": [{"name": "sluice-config", "configMap": {"name": "sluice-policy-api"}}],
        },
    }))
    .unwrap()
}

async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    request(port, "GET", path, "").await
}

async fn request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: web\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(format!("{head}{body}").as_bytes()).await.ok()?;
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.ok()?;
    let code = out.split(' ').nth(1)?.parse().ok()?;
    Some((code, out))
}

fn alive(pid: u32) -> bool {
    // A zombie still has /proc/<pid>; its state letter is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.split(' ').nth(2).is_none_or(|state| state != "Z"))
        .unwrap_or(false)
}

fn is_ready(pod: &Pod) -> Option<bool> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    Some(
        conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
    )
}

#[tokio::test]
async fn kubelet_stand_in_runs_an_injected_pod_and_stops_it_when_deleted() {
    let sidecar = sidecar_binary().unwrap();
    let env = Env::start().await.unwrap();
    let ns = env.namespace("kubelet").await.unwrap();
    ns.apply_yaml(CONFIG).await.unwrap();
    let config = KubeletConfig {
        max_grace: Duration::from_secs(5),
        ..KubeletConfig::new(&sidecar, env!("CARGO_BIN_EXE_sluice-demo-app").as_ref()).namespace(ns.name())
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (kubelet, task) = Kubelet::start(ns.client(), config, async {
        let _ = stopped.await;
    });
    let pods: kube::Api<Pod> = ns.api();
    pods.create(&PostParams::default(), &injected_pod())
        .await
        .unwrap();

    let ready = wait_for("pod web-1 Running and Ready", DEADLINE, || async {
        let pod = pods.get("web-1").await.ok()?;
        let status = pod.status.clone()?;
        (status.phase.as_deref() == Some("Running") && is_ready(&pod) == Some(true)).then_some(status)
    })
    .await;
    let ready = ready.unwrap_or_else(|e| {
        let log = kubelet.log_path(ns.name(), "web-1", "sluice-sidecar");
        let text = log
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .unwrap_or_default();
        panic!("{e}\nsidecar log:\n{text}")
    });
    assert_eq!(ready.pod_ip.as_deref(), Some("127.0.0.1"));

    // Traffic to the pod's named port `http` goes through the sidecar to the demo app.
    let http = kubelet.port(ns.name(), "web-1", "http").unwrap();
    assert_ne!(http, 15080, "the pod's port is mapped to a free local port");
    let (code, response) = get(http, "/anything").await.unwrap();
    assert_eq!(code, 200, "{response}");
    assert!(response.contains("ok web-1"), "{response}");
    assert!(
        response.to_ascii_lowercase().contains("ratelimit"),
        "the sidecar answered with quota headers: {response}"
    );
    // The container whose image is not Sluice's is not run.
    assert!(kubelet.pid(ns.name(), "web-1", "not-ours").is_none());

    let sidecar_pid = kubelet.pid(ns.name(), "web-1", "sluice-sidecar").unwrap();
    let app_pid = kubelet.pid(ns.name(), "web-1", "web").unwrap();
    assert!(alive(sidecar_pid) && alive(app_pid));

    // A crash of the app turns the pod not ready.
    assert!(kubelet.kill(ns.name(), "web-1", "web"));
    wait_for("pod web-1 not ready after the app crashed", DEADLINE, || async {
        let pod = pods.get("web-1").await.ok()?;
        (is_ready(&pod) == Some(false)).then_some(())
    })
    .await
    .unwrap();

    // Deleting the pod stops its processes.
    pods.delete("web-1", &DeleteParams::default()).await.unwrap();
    wait_for("web-1's processes gone", DEADLINE, || async {
        (!kubelet.is_running(ns.name(), "web-1") && !alive(sidecar_pid) && !alive(app_pid)).then_some(())
    })
    .await
    .unwrap();

    stop.send(()).unwrap();
    task.await.unwrap();
}

const DEMO: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: demo}}
  template:
    metadata: {labels: {app: demo}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: app
          image: example/sluice-demo-app:1
          ports: [{name: http, containerPort: 8080}]
          readinessProbe: {httpGet: {path: /healthz, port: http}}
"#;

#[tokio::test]
async fn deployment_pods_run_under_the_kubelet_stand_in_and_report_ready_replicas() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("kubelet-deploy").await.unwrap();
    ns.apply_yaml(DEMO).await.unwrap();
    // No sidecar in these pods: the sidecar command is never run.
    let config = KubeletConfig::new(
        "/nonexistent/sluice-sidecar".as_ref(),
        env!("CARGO_BIN_EXE_sluice-demo-app").as_ref(),
    )
    .namespace(ns.name());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let stopped = futures::FutureExt::shared(async {
        let _ = stopped.await;
    });
    let (kubelet, kubelet_task) = Kubelet::start(ns.client(), config, stopped.clone());
    let deployments = sluice_e2e::deployments::DeploymentController::new(ns.client(), Some(ns.name()));
    let deployments_task = tokio::spawn(deployments.run(Duration::from_millis(20), stopped));
    let api: kube::Api<k8s_openapi::api::apps::v1::Deployment> = ns.api();
    let pods: kube::Api<Pod> = ns.api();

    let names = wait_for("2 ready replicas", DEADLINE, || async {
        let ready = api.get("demo").await.ok()?.status?.ready_replicas?;
        let names: Vec<String> = pods
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        (ready == 2 && names.len() == 2).then_some(names)
    })
    .await
    .unwrap();
    // Each pod has its own local port for `http`, answering as that pod.
    let ports: Vec<u16> = names
        .iter()
        .map(|n| kubelet.port(ns.name(), n, "http").unwrap())
        .collect();
    assert_ne!(ports[0], ports[1]);
    for (name, port) in names.iter().zip(&ports) {
        let (code, body) = get(*port, "/").await.unwrap();
        assert_eq!(code, 200);
        assert!(body.contains(&format!("ok {name}")), "{body}");
    }

    // As a job handler: a POSTed payload's `status` is the answer, after `sleepMs`.
    let (code, body) = request(ports[0], "POST", "/jobs", r#"{"sleepMs": 20, "status": 500}"#)
        .await
        .unwrap();
    assert_eq!(code, 500, "{body}");

    let pids: Vec<u32> = names
        .iter()
        .map(|n| kubelet.pid(ns.name(), n, "app").unwrap())
        .collect();
    api.patch_scale(
        "demo",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    wait_for("no demo processes left", DEADLINE, || async {
        let gone = names.iter().all(|n| !kubelet.is_running(ns.name(), n));
        (gone && pids.iter().all(|p| !alive(*p))).then_some(())
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    kubelet_task.await.unwrap();
    deployments_task.await.unwrap();
}

#[tokio::test]
async fn an_undeclared_localhost_port_named_in_env_gets_its_own_local_port() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("kubelet-ports").await.unwrap();
    let config = KubeletConfig::new(
        "/nonexistent/sluice-sidecar".as_ref(),
        env!("CARGO_BIN_EXE_sluice-demo-app").as_ref(),
    )
    .namespace(ns.name());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (kubelet, task) = Kubelet::start(ns.client(), config, async {
        let _ = stopped.await;
    });
    let pods: kube::Api<Pod> = ns.api();
    for name in ["handler-a", "handler-b"] {
        // Like a worker pod's handler: no declared port, only a URL on localhost that names it.
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{
                "name": "handler", "image": "sluice-demo-app:1",
                "env": [{"name": "HANDLER_URL", "value": "http://127.0.0.1:8080/jobs"}],
            }]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for name in ["handler-a", "handler-b"] {
        let port = wait_for("the handler's mapped port", DEADLINE, || async {
            kubelet.port(ns.name(), name, "8080")
        })
        .await
        .unwrap();
        let (code, body) = wait_for("the handler answering", DEADLINE, || get(port, "/"))
            .await
            .unwrap();
        assert_eq!(code, 200);
        assert!(body.contains(&format!("ok {name}")), "{body}");
    }
    stop.send(()).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn projected_volumes_are_written_and_a_process_is_told_where_its_service_account_files_are() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("kubelet-projected").await.unwrap();
    ns.apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kube-root-ca.crt}\ndata: {ca.crt: the-ca, other: x}\n")
        .await
        .unwrap();
    let config = KubeletConfig::new(
        "/nonexistent/sluice-sidecar".as_ref(),
        env!("CARGO_BIN_EXE_sluice-demo-app").as_ref(),
    )
    .namespace(ns.name());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (kubelet, task) = Kubelet::start(ns.client(), config, async {
        let _ = stopped.await;
    });
    let dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    // What the ServiceAccount admission plugin (or the webhook, for the sidecar) mounts.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app"},
        "spec": {
            "containers": [{
                "name": "app", "image": "sluice-demo-app:1",
                "volumeMounts": [{"name": "kube-api-access", "mountPath": dir, "readOnly": true}],
            }],
            "volumes": [{"name": "kube-api-access", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ]}}],
        },
    }))
    .unwrap();
    let pods: kube::Api<Pod> = ns.api();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pid = wait_for("the app's process", DEADLINE, || async {
        kubelet.pid(ns.name(), "app", "app")
    })
    .await
    .unwrap();
    let file = |name: &str| {
        kubelet
            .volume_file(ns.name(), "app", "kube-api-access", name)
            .unwrap()
    };
    assert_eq!(std::fs::read_to_string(file("ca.crt")).unwrap(), "the-ca");
    assert_eq!(std::fs::read_to_string(file("namespace")).unwrap(), ns.name());
    assert!(!file("other").exists(), "only the items named");
    // The in-memory server has no TokenRequest API: no token is written there.
    assert!(!file("token").exists());
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let expected = format!(
        "SLUICE_SERVICE_ACCOUNT_DIR={}",
        file("").display().to_string().trim_end_matches('/')
    );
    assert!(
        environ
            .split(|b| *b == 0)
            .any(|var| String::from_utf8_lossy(var).trim_end_matches('/') == expected),
        "{expected} not in the process's environment"
    );
    stop.send(()).unwrap();
    task.await.unwrap();
}
