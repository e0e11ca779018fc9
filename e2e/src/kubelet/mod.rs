//! A stand-in for the kubelet, for Sluice's own images only: Pods do not run by themselves on the test
//! API server, so for each Pod whose containers use an image in [`KubeletConfig::images`] (the
//! `sluice-sidecar` binary, the `sluice-demo-app` standing in for a team's container, the Python example
//! gRPC worker for `sluice-grpc-worker`) this starts the
//! containers as local processes, reports the Pod `Running`/`Ready` through the status subresource, and
//! stops the processes when the Pod goes.
//!
//! How a Pod is turned into processes:
//! - **Which containers**: `containers` and native sidecars (`initContainers` with
//!   `restartPolicy: Always`) whose image contains one of the configured patterns. Containers with
//!   other images are **not run** (there is nothing to run them with); a Pod with none of Sluice's
//!   images is left alone entirely (stays `Pending`). Classic init containers are skipped.
//! - **Command**: the configured local command, then the container's `args`. The container's
//!   `command` is ignored: the local command replaces the image's entrypoint.
//! - **Env**: `value`; `valueFrom.secretKeyRef` / `configMapKeyRef` read through the API;
//!   `fieldRef` `metadata.name`, `metadata.namespace`, `metadata.uid`, `status.podIP` (127.0.0.1).
//!   `resourceFieldRef` and `envFrom` are skipped.
//! - **Volumes**: ConfigMap and Secret volumes are written to a per-Pod temp dir, one file per key. Each
//!   container's `mountPath` is then *rewritten*: in its args and env values, any text starting with a
//!   mount path (e.g. `--config /etc/sluice/config.yaml`) gets the mount path replaced by the local
//!   directory. Other volume types are ignored. If a ConfigMap is missing the Pod waits and is retried,
//!   like `ContainerCreating`. Projected volumes are written the same way: `configMap` and `secret`
//!   sources (their `items`), `downwardAPI` items for the Pod's name, namespace and uid, and — on a real
//!   API server only ([`RealCluster`]) — `serviceAccountToken` sources as a TokenRequest token of the
//!   Pod's ServiceAccount for the source's audience and lifetime, bound to the Pod (not refreshed). A
//!   container with a volume at [`contract::SERVICE_ACCOUNT_DIR`] gets
//!   [`contract::env::SERVICE_ACCOUNT_DIR`] naming the local directory, where the sidecar reads its API
//!   credentials.
//! - **Ports**: all Pods share 127.0.0.1 here, so every `containerPort` of the Pod's started containers
//!   (plus the sidecar's admin port, [`contract::port::ADMIN`], for sidecar containers, and every port P written as
//!   `127.0.0.1:P`/`localhost:P`/`0.0.0.0:P` in args, plain env values or ConfigMap files — undeclared
//!   ports such as a worker's handler URL or queue API) gets a free local port. Every
//!   `127.0.0.1:P`, `localhost:P`, `0.0.0.0:P` and `[::]:P` naming a Pod port P is rewritten to
//!   `127.0.0.1:<local>` in args, env values and the materialised volume files, so `SLUICE_LISTEN`,
//!   `SLUICE_UPSTREAM`, a worker's handler URL and `adminListen` keep pointing at the right container.
//!   Sidecar containers also get [`contract::env::ADMIN_LISTEN`]; every process gets `SLUICE_E2E_PORTS`
//!   (`8080=40001,15021=40002`: Pod port = local port) and, when it declares a port,
//!   `SLUICE_DEMO_LISTEN` (its first port, mapped) — the demo app listens there. [`Kubelet::port`] maps a Pod's port (name or number)
//!   to the local port so tests can send traffic to it. A sidecar container is one named
//!   [`contract::SIDECAR_CONTAINER`] or whose image matches [`SIDECAR_IMAGE_PATTERN`].
//! - **Status**: `phase: Running`, `podIP`/`hostIP` 127.0.0.1, and `Ready`/`ContainersReady` `True` once
//!   every started container is alive and its `readinessProbe.httpGet` (port mapped) answers 2xx — for a
//!   sidecar without a probe, `/readyz` on its admin port. Containers not run do not hold readiness
//!   back. `containerStatuses` are not written.
//! - **Stopping**: on deletion, SIGTERM to every process, SIGKILL after
//!   `terminationGracePeriodSeconds` (capped by [`KubeletConfig::max_grace`]). A crash can be simulated
//!   with [`Kubelet::kill`]; a killed container is not restarted and the Pod turns not ready.
//!
//! Process output goes to `<pod dir>/<container>.log` ([`Kubelet::log_path`]).
//!
//! **With Podman** ([`KubeletConfig::podman`]): containers whose image matches a Podman pattern run from
//! their own image (`make images`) with [`crate::podman`] instead of as processes: the container's
//! `command`/`args` as entrypoint/CMD, env as above, its `securityContext` with the Pod's (user, groups,
//! `runAsNonRoot`, read-only root, capabilities, no privilege escalation), and its ConfigMap/Secret
//! volumes bind-mounted at their `mountPath` (read-only as written) instead of rewritten paths, on the
//! host network so ports are mapped as for processes. The Pod's dir is mounted read-only at its own path
//! (a service-account kubeconfig written there), and [`KubeletConfig::podman_mount`] adds host files at
//! the same path (the in-memory server's kubeconfig in `KUBECONFIG`).

mod binaries;
mod cluster;
mod process;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
#[cfg(doc)]
use sluice_crds::contract;

pub use binaries::{operator_binary, sidecar_binary, workspace_binary};
pub use cluster::{NODE_IP, RealCluster};
use process::{http_ok, runnable, start_pod};
pub use process::{localhost_ports, rewrite_mounts, rewrite_ports, service_references};

/// Image pattern of the sidecar.
pub const SIDECAR_IMAGE_PATTERN: &str = "sluice-sidecar";
/// Image pattern of the demo app.
pub const DEMO_APP_IMAGE_PATTERN: &str = "sluice-demo-app";
/// Image pattern of a gRPC worker: the Python example worker (`examples/grpc-worker/worker.py`, run
/// with `python3`; it needs `grpcio`, which `.ci/deps.sh` installs), taking jobs from its pod's sidecar.
pub const GRPC_WORKER_IMAGE_PATTERN: &str = "sluice-grpc-worker";
/// The Python example worker run for [`GRPC_WORKER_IMAGE_PATTERN`].
pub const GRPC_WORKER_SCRIPT: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/grpc-worker/worker.py");
/// How often pods are re-checked (readiness, retries of Pods waiting for a ConfigMap).
pub const RESYNC_PERIOD: Duration = Duration::from_millis(100);

/// What the stand-in runs.
#[derive(Clone)]
pub struct KubeletConfig {
    /// `(image substring, local command)`: a container whose image contains the substring runs the
    /// command (program and leading args) followed by the container's args. First match wins.
    pub images: Vec<(String, Vec<String>)>,
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// Upper bound on the grace period between SIGTERM and SIGKILL (tests keep it short).
    pub max_grace: Duration,
    /// Environment added to every process, after the container's own (e.g. `KUBECONFIG` for the
    /// operator on the in-memory server, standing in for the service account token a real kubelet mounts).
    pub env: Vec<(String, String)>,
    /// On a real API server: the Node, pod network and service-account tokens ([`RealCluster`]).
    pub cluster: Option<RealCluster>,
    /// Image substrings whose containers run from their image with Podman; checked before `images`.
    pub podman: Vec<String>,
    /// Host files mounted read-only at the same path into every Podman container.
    pub podman_mounts: Vec<PathBuf>,
}

impl KubeletConfig {
    /// Runs `sluice-sidecar` images with `sidecar`, `sluice-demo-app` images with `demo_app` and
    /// `sluice-grpc-worker` images with the Python example gRPC worker.
    pub fn new(sidecar: &Path, demo_app: &Path) -> Self {
        KubeletConfig {
            images: vec![
                (SIDECAR_IMAGE_PATTERN.into(), vec![sidecar.display().to_string()]),
                (
                    DEMO_APP_IMAGE_PATTERN.into(),
                    vec![demo_app.display().to_string()],
                ),
                (
                    GRPC_WORKER_IMAGE_PATTERN.into(),
                    vec!["python3".into(), "-u".into(), GRPC_WORKER_SCRIPT.into()],
                ),
            ],
            namespace: None,
            max_grace: Duration::from_secs(30),
            env: vec![],
            cluster: None,
            podman: vec![],
            podman_mounts: vec![],
        }
    }

    /// Runs containers whose image contains `pattern` from that image with Podman.
    pub fn podman(mut self, pattern: &str) -> Self {
        self.podman.push(pattern.into());
        self
    }

    /// Mounts a host file read-only at the same path into every Podman container.
    pub fn podman_mount(mut self, path: &Path) -> Self {
        self.podman_mounts.push(path.to_path_buf());
        self
    }

    /// Joins a real cluster (see [`RealCluster`]).
    pub fn real_cluster(mut self, cluster: RealCluster) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Also runs containers whose image contains `pattern` with `command` (e.g. the operator's image).
    pub fn image(mut self, pattern: &str, command: &[String]) -> Self {
        self.images.push((pattern.into(), command.to_vec()));
        self
    }

    /// Adds `name=value` to every process's environment.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Only Pods of this namespace.
    pub fn namespace(mut self, ns: &str) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// The local command for a container's image; empty for an image run with Podman.
    fn command_for(&self, image: &str) -> Option<&[String]> {
        if self.podman.iter().any(|pattern| image.contains(pattern.as_str())) {
            return Some(&[]);
        }
        self.images
            .iter()
            .find(|(pattern, _)| image.contains(pattern.as_str()))
            .map(|(_, cmd)| cmd.as_slice())
    }
}

type PodKey = (String, String);

/// What one look at a running Pod found.
struct PodCheck {
    key: PodKey,
    /// Its containers' readiness probes `(local port, path)`.
    probes: Vec<Option<(u16, String)>>,
    /// Exit codes of processes that ended (`None` for a signal), `None` while running.
    exits: Vec<Option<Option<i32>>>,
    /// Whether its containers would be restarted (`restartPolicy: Always`, the default).
    restarts: bool,
    reported_ready: Option<bool>,
    finished: bool,
}

struct Process {
    container: String,
    child: Runner,
    /// `(local port, path)` of the readiness probe.
    probe: Option<(u16, String)>,
}

/// A container run as a local process or with Podman.
enum Runner {
    Local(tokio::process::Child),
    Podman(crate::podman::Container),
}

impl Runner {
    fn id(&self) -> Option<u32> {
        match self {
            Runner::Local(child) => child.id(),
            Runner::Podman(c) => Some(c.pid()),
        }
    }

    fn start_kill(&mut self) -> bool {
        match self {
            Runner::Local(child) => child.start_kill().is_ok(),
            Runner::Podman(c) => c.start_kill(),
        }
    }

    /// `None` while running; once ended, the exit code (`None` for a signal).
    fn exit(&mut self) -> Option<Option<i32>> {
        match self {
            Runner::Local(child) => match child.try_wait() {
                Ok(Some(status)) => Some(status.code()),
                Ok(None) => None,
                Err(_) => Some(None),
            },
            Runner::Podman(c) => match c.try_exit_code() {
                Ok(code) => code.map(Some),
                Err(_) => Some(None),
            },
        }
    }

    async fn term(&self) {
        match self {
            Runner::Local(child) => {
                if let Some(pid) = child.id() {
                    // No `unsafe` libc call: the `kill` utility sends the signal.
                    let _ = std::process::Command::new("kill")
                        .args(["-TERM", &pid.to_string()])
                        .stderr(Stdio::null())
                        .status();
                }
            }
            Runner::Podman(c) => {
                let _ = c.signal("TERM").await;
            }
        }
    }

    async fn wait(&mut self) {
        match self {
            Runner::Local(child) => drop(child.wait().await),
            Runner::Podman(c) => drop(c.wait().await),
        }
    }

    async fn kill(&mut self) {
        match self {
            Runner::Local(child) => drop(child.kill().await),
            Runner::Podman(c) => {
                let _ = c.signal("KILL").await;
                let _ = c.wait().await;
            }
        }
    }
}

struct RunningPod {
    uid: String,
    dir: tempfile::TempDir,
    /// Its address on the pod network (a real cluster's), `None` on the in-memory server (127.0.0.1).
    ip: Option<std::net::Ipv4Addr>,
    /// Pod port number → local port.
    ports: HashMap<u16, u16>,
    /// Port name → Pod port number.
    names: HashMap<String, u16>,
    processes: Vec<Process>,
    grace: Duration,
    /// `restartPolicy: Always`: the Pod runs until deleted; otherwise it completes when its processes end.
    restarts: bool,
    reported_ready: Option<bool>,
    /// The terminal phase (Succeeded/Failed) was written.
    finished: bool,
}

#[derive(Default)]
struct Pods {
    running: HashMap<PodKey, RunningPod>,
    /// uids of deleted Pods whose final delete (grace 0) was sent, on a real cluster.
    finalized: std::collections::HashSet<String>,
}

/// A handle on the running stand-in: ports of Pods, crash simulation. Dropping it does not stop it;
/// resolve the `shutdown` future given to [`Kubelet::start`].
#[derive(Clone)]
pub struct Kubelet {
    pods: Arc<Mutex<Pods>>,
}

impl Kubelet {
    /// Starts watching Pods; returns the handle and the task, which stops every process and ends
    /// when `shutdown` resolves.
    pub fn start(
        client: kube::Client,
        config: KubeletConfig,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> (Kubelet, tokio::task::JoinHandle<()>) {
        let kubelet = Kubelet {
            pods: Arc::new(Mutex::new(Pods::default())),
        };
        let task = tokio::spawn(kubelet.clone().run(client, config, shutdown));
        (kubelet, task)
    }

    /// The local port serving a Pod's port, by name (`http`, `sluice-admin`) or number (`8080`).
    pub fn port(&self, namespace: &str, pod: &str, port: &str) -> Option<u16> {
        let pods = self.lock();
        let running = pods.running.get(&(namespace.to_string(), pod.to_string()))?;
        let number = match port.parse::<u16>() {
            Ok(n) => n,
            Err(_) => *running.names.get(port)?,
        };
        running.ports.get(&number).copied()
    }

    /// The Pod's IP on a real cluster's pod network (`None` on the in-memory server: 127.0.0.1).
    pub fn pod_ip(&self, namespace: &str, pod: &str) -> Option<std::net::Ipv4Addr> {
        self.lock()
            .running
            .get(&(namespace.to_string(), pod.to_string()))?
            .ip
    }

    /// Whether processes run for the Pod.
    pub fn is_running(&self, namespace: &str, pod: &str) -> bool {
        self.lock()
            .running
            .contains_key(&(namespace.to_string(), pod.to_string()))
    }

    /// The OS process id of a container of a Pod.
    pub fn pid(&self, namespace: &str, pod: &str, container: &str) -> Option<u32> {
        let pods = self.lock();
        let running = pods.running.get(&(namespace.to_string(), pod.to_string()))?;
        running
            .processes
            .iter()
            .find(|p| p.container == container)
            .and_then(|p| p.child.id())
    }

    /// Where a container's output goes.
    pub fn log_path(&self, namespace: &str, pod: &str, container: &str) -> Option<PathBuf> {
        let pods = self.lock();
        let running = pods.running.get(&(namespace.to_string(), pod.to_string()))?;
        Some(running.dir.path().join(format!("{container}.log")))
    }

    /// A file the stand-in wrote for one of a Pod's volumes (ConfigMap, Secret, projected: a
    /// ServiceAccount token, say), where the Pod's processes read it.
    pub fn volume_file(&self, namespace: &str, pod: &str, volume: &str, file: &str) -> Option<PathBuf> {
        let pods = self.lock();
        let running = pods.running.get(&(namespace.to_string(), pod.to_string()))?;
        Some(running.dir.path().join("volumes").join(volume).join(file))
    }

    /// Kills a container's process with SIGKILL (a crash); it is not restarted.
    pub fn kill(&self, namespace: &str, pod: &str, container: &str) -> bool {
        let mut pods = self.lock();
        let Some(running) = pods.running.get_mut(&(namespace.to_string(), pod.to_string())) else {
            return false;
        };
        running
            .processes
            .iter_mut()
            .find(|p| p.container == container)
            .is_some_and(|p| p.child.start_kill())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pods> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn run(
        self,
        client: kube::Client,
        config: KubeletConfig,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let api: Api<Pod> = match &config.namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let mut events = watcher(api, watcher::Config::default()).boxed();
        let mut known: HashMap<PodKey, Pod> = HashMap::new();
        let mut initial: HashMap<PodKey, Pod> = HashMap::new();
        let mut tick = tokio::time::interval(RESYNC_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut heartbeat = tokio::time::interval(cluster::HEARTBEAT_PERIOD);
        let mut registered = false;
        tokio::pin!(shutdown);
        loop {
            if let Some(cluster) = &config.cluster {
                let due = futures::FutureExt::now_or_never(heartbeat.tick()).is_some();
                if !registered {
                    match cluster.register_node(&client).await {
                        Ok(()) => registered = true,
                        Err(e) => tracing::debug!(error = %e, "kubelet stand-in: node not registered yet"),
                    }
                } else if due && let Err(e) = cluster.heartbeat(&client).await {
                    tracing::debug!(error = %e, "kubelet stand-in: lease not renewed");
                }
            }
            tokio::select! {
                _ = &mut shutdown => break,
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(pod))) => { known.insert(key(&pod), pod); }
                    Some(Ok(watcher::Event::Delete(pod))) => { known.remove(&key(&pod)); }
                    Some(Ok(watcher::Event::Init)) => initial.clear(),
                    Some(Ok(watcher::Event::InitApply(pod))) => { initial.insert(key(&pod), pod); }
                    Some(Ok(watcher::Event::InitDone)) => known = std::mem::take(&mut initial),
                    Some(Err(e)) => tracing::debug!(error = %e, "kubelet stand-in: watch error"),
                    None => break,
                },
                _ = tick.tick() => {}
            }
            self.reconcile(&client, &config, &known).await;
        }
        let all: Vec<RunningPod> = self.lock().running.drain().map(|(_, r)| r).collect();
        if let Some(cluster) = &config.cluster {
            for ip in all.iter().filter_map(|r| r.ip) {
                cluster.network.detach(ip);
            }
        }
        futures::future::join_all(all.into_iter().map(terminate)).await;
    }

    async fn reconcile(&self, client: &kube::Client, config: &KubeletConfig, known: &HashMap<PodKey, Pod>) {
        // Stop what is gone (or replaced by a Pod of the same name), or being deleted.
        let stale: Vec<PodKey> = {
            let pods = self.lock();
            pods.running
                .iter()
                .filter(|(k, r)| {
                    known.get(*k).is_none_or(|p| {
                        p.metadata.uid.as_deref() != Some(r.uid.as_str())
                            || p.metadata.deletion_timestamp.is_some()
                    })
                })
                .map(|(k, _)| k.clone())
                .collect()
        };
        // Terminations run in the background: one Pod's grace period must not hold back the others. On a
        // real cluster a Pod being deleted is removed once its processes stopped, as a kubelet does.
        for k in stale {
            let Some(running) = self.lock().running.remove(&k) else {
                continue;
            };
            let deleting = known
                .get(&k)
                .filter(|p| p.metadata.uid.as_deref() == Some(running.uid.as_str()))
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
            match &config.cluster {
                Some(cluster) => {
                    if let Some(ip) = running.ip {
                        cluster.network.detach(ip);
                    }
                    let client = client.clone();
                    let uid = running.uid.clone();
                    if deleting {
                        self.lock().finalized.insert(uid.clone());
                    }
                    tokio::spawn(async move {
                        terminate(running).await;
                        if deleting {
                            RealCluster::finish_deletion(&client, &k.0, &k.1, &uid).await;
                        }
                    });
                }
                None => {
                    tokio::spawn(terminate(running));
                }
            }
        }
        // Pods of this Node being deleted that never ran (they could not start): removed at once.
        if let Some(cluster) = &config.cluster {
            for (k, pod) in known {
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let ours =
                    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(cluster.node.as_str());
                if !ours || pod.metadata.deletion_timestamp.is_none() {
                    continue;
                }
                let first = {
                    let mut pods = self.lock();
                    !pods.running.contains_key(k) && pods.finalized.insert(uid.clone())
                };
                if first {
                    RealCluster::finish_deletion(client, &k.0, &k.1, &uid).await;
                }
            }
        }
        // Start what is new.
        for (k, pod) in known {
            if pod.metadata.deletion_timestamp.is_some() || self.lock().running.contains_key(k) {
                continue;
            }
            let finished = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|p| p == "Succeeded" || p == "Failed");
            if finished || runnable(config, pod).is_empty() {
                continue;
            }
            if let Some(cluster) = &config.cluster {
                match cluster.bind(client, pod).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        tracing::debug!(pod = %k.1, error = %e, "kubelet stand-in: pod not bound");
                        continue;
                    }
                }
            }
            match start_pod(client, config, pod).await {
                Ok(Some(running)) => {
                    let pods: Api<Pod> = Api::namespaced(client.clone(), &k.0);
                    let pod_ip = running
                        .ip
                        .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string());
                    let host_ip = match &config.cluster {
                        Some(_) => NODE_IP.to_string(),
                        None => "127.0.0.1".to_string(),
                    };
                    let status = json!({"status": {
                        "phase": "Running", "podIP": pod_ip, "hostIP": host_ip,
                        "podIPs": [{"ip": pod_ip}], "hostIPs": [{"ip": host_ip}],
                        "startTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    }});
                    if let Err(e) = pods
                        .patch_status(&k.1, &PatchParams::default(), &Patch::Merge(status))
                        .await
                    {
                        tracing::debug!(error = %e, "kubelet stand-in: status not written");
                    }
                    self.lock().running.insert(k.clone(), running);
                }
                Ok(None) => {}
                Err(e) => tracing::debug!(pod = %k.1, error = %e, "kubelet stand-in: pod not started yet"),
            }
        }
        // Readiness, and completion of Pods that do not restart their containers.
        let checks: Vec<PodCheck> = {
            let mut pods = self.lock();
            pods.running
                .iter_mut()
                .map(|(k, r)| PodCheck {
                    key: k.clone(),
                    probes: r.processes.iter().map(|p| p.probe.clone()).collect(),
                    exits: r.processes.iter_mut().map(|p| p.child.exit()).collect(),
                    restarts: r.restarts,
                    reported_ready: r.reported_ready,
                    finished: r.finished,
                })
                .collect()
        };
        for check in checks {
            let pods: Api<Pod> = Api::namespaced(client.clone(), &check.key.0);
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let all_ended = check.exits.iter().all(Option::is_some);
            if !check.restarts && all_ended {
                if check.finished {
                    continue;
                }
                let succeeded = check.exits.iter().all(|e| *e == Some(Some(0)));
                let phase = if succeeded { "Succeeded" } else { "Failed" };
                let status = json!({"status": {"phase": phase, "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                    {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                ]}});
                if pods
                    .patch_status(&check.key.1, &PatchParams::default(), &Patch::Merge(status))
                    .await
                    .is_ok()
                    && let Some(r) = self.lock().running.get_mut(&check.key)
                {
                    r.finished = true;
                    r.reported_ready = Some(false);
                }
                continue;
            }
            let mut ready = check.exits.iter().all(Option::is_none);
            for (port, path) in check.probes.into_iter().flatten() {
                if !ready {
                    break;
                }
                ready = http_ok(port, &path).await;
            }
            if check.reported_ready == Some(ready) {
                continue;
            }
            let value = if ready { "True" } else { "False" };
            let status = json!({"status": {"conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
                {"type": "Ready", "status": value, "lastTransitionTime": now},
            ]}});
            if pods
                .patch_status(&check.key.1, &PatchParams::default(), &Patch::Merge(status))
                .await
                .is_ok()
                && let Some(r) = self.lock().running.get_mut(&check.key)
            {
                r.reported_ready = Some(ready);
            }
        }
    }
}

/// SIGTERM to every process of the Pod, then SIGKILL to those still running after the grace period.
async fn terminate(mut running: RunningPod) {
    for p in &running.processes {
        p.child.term().await;
    }
    let deadline = Instant::now() + running.grace;
    for p in &mut running.processes {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, p.child.wait()).await.is_err() {
            p.child.kill().await;
        }
    }
}

fn key(pod: &Pod) -> PodKey {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}
