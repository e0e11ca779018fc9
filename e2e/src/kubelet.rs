//! A stand-in for the kubelet, for Sluice's own images only: Pods do not run by themselves on the test
//! API server, so for each Pod whose containers use an image in [`KubeletConfig::images`] (the
//! `sluice-sidecar` binary, the `sluice-demo-app` standing in for a team's container) this starts the
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
//!   like `ContainerCreating`.
//! - **Ports**: all Pods share 127.0.0.1 here, so every `containerPort` of the Pod's started containers
//!   (plus `15021`, the sidecar's admin port, for sidecar containers, and every port P written as
//!   `127.0.0.1:P`/`localhost:P`/`0.0.0.0:P` in args, plain env values or ConfigMap files — undeclared
//!   ports such as a worker's handler URL or queue API) gets a free local port. Every
//!   `127.0.0.1:P`, `localhost:P`, `0.0.0.0:P` and `[::]:P` naming a Pod port P is rewritten to
//!   `127.0.0.1:<local>` in args, env values and the materialised volume files, so `SLUICE_LISTEN`,
//!   `SLUICE_UPSTREAM`, a worker's handler URL and `adminListen` keep pointing at the right container.
//!   Sidecar containers also get `SLUICE_ADMIN_LISTEN`; every process gets `SLUICE_E2E_PORTS`
//!   (`8080=40001,15021=40002`: Pod port = local port) and, when it declares a port,
//!   `SLUICE_DEMO_LISTEN` (its first port, mapped) — the demo app listens there. [`Kubelet::port`] maps a Pod's port (name or number)
//!   to the local port so tests can send traffic to it.
//! - **Status**: `phase: Running`, `podIP`/`hostIP` 127.0.0.1, and `Ready`/`ContainersReady` `True` once
//!   every started container is alive and its `readinessProbe.httpGet` (port mapped) answers 2xx — for a
//!   sidecar without a probe, `/readyz` on its admin port. Containers not run do not hold readiness
//!   back. `containerStatuses` are not written.
//! - **Stopping**: on deletion, SIGTERM to every process, SIGKILL after
//!   `terminationGracePeriodSeconds` (capped by [`KubeletConfig::max_grace`]). A crash can be simulated
//!   with [`Kubelet::kill`]; a killed container is not restarted and the Pod turns not ready.
//!
//! Process output goes to `<pod dir>/<container>.log` ([`Kubelet::log_path`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::{Error, Result};

/// The sidecar's admin port (`/healthz`, `/readyz`, `/metrics`), mapped even when undeclared.
pub const SIDECAR_ADMIN_PORT: u16 = 15021;
/// Image pattern of the sidecar.
pub const SIDECAR_IMAGE_PATTERN: &str = "sluice-sidecar";
/// Image pattern of the demo app.
pub const DEMO_APP_IMAGE_PATTERN: &str = "sluice-demo-app";
/// How often pods are re-checked (readiness, retries of Pods waiting for a ConfigMap).
pub const RESYNC_PERIOD: Duration = Duration::from_millis(100);

/// What the stand-in runs.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// `(image substring, local command)`: a container whose image contains the substring runs the
    /// command (program and leading args) followed by the container's args. First match wins.
    pub images: Vec<(String, Vec<String>)>,
    /// One namespace, or all.
    pub namespace: Option<String>,
    /// Upper bound on the grace period between SIGTERM and SIGKILL (tests keep it short).
    pub max_grace: Duration,
    /// Environment added to every process, after the container's own (e.g. `KUBECONFIG` for the
    /// operator, standing in for the service account token a real kubelet mounts).
    pub env: Vec<(String, String)>,
}

impl KubeletConfig {
    /// Runs `sluice-sidecar` images with `sidecar` and `sluice-demo-app` images with `demo_app`.
    pub fn new(sidecar: &Path, demo_app: &Path) -> Self {
        KubeletConfig {
            images: vec![
                (SIDECAR_IMAGE_PATTERN.into(), vec![sidecar.display().to_string()]),
                (
                    DEMO_APP_IMAGE_PATTERN.into(),
                    vec![demo_app.display().to_string()],
                ),
            ],
            namespace: None,
            max_grace: Duration::from_secs(30),
            env: vec![],
        }
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

    fn command_for(&self, image: &str) -> Option<&[String]> {
        self.images
            .iter()
            .find(|(pattern, _)| image.contains(pattern.as_str()))
            .map(|(_, cmd)| cmd.as_slice())
    }
}

/// What the sidecar binary is built from (workspace folders), for the staleness check: only sources a
/// change of which makes Cargo relink the binary (not `Cargo.lock`, manifests or `migrations/`, which
/// can change without a relink and would look stale for ever).
const SIDECAR_SOURCES: &[&str] = &["crds/src", "queue/src", "sidecar/src"];
/// What the operator binary is built from.
const OPERATOR_SOURCES: &[&str] = &["crds/src", "queue/src", "operator/src"];

/// Finds the `sluice-sidecar` binary; see [`workspace_binary`] (`$SLUICE_SIDECAR_BIN` wins).
pub fn sidecar_binary() -> Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary("sluice-sidecar", "SLUICE_SIDECAR_BIN", SIDECAR_SOURCES))
        .clone()
        .map_err(Error::Config)
}

/// Finds the `sluice-operator` binary; see [`workspace_binary`] (`$SLUICE_OPERATOR_BIN` wins).
pub fn operator_binary() -> Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| workspace_binary("sluice-operator", "SLUICE_OPERATOR_BIN", OPERATOR_SOURCES))
        .clone()
        .map_err(Error::Config)
}

/// Finds a workspace binary (package and binary named `name`) in the shared target dir. A missing binary
/// is built with `cargo build -p NAME --bin NAME`; one older than any file under `sources` (workspace files
/// and folders it is built from) is an error naming the command to run, rather than a stale binary tested
/// silently or a build of minutes hidden inside a test's deadline. `$override_env` names a binary to use
/// as is.
///
/// Why not a Cargo artifact dependency: those are unstable, and `CARGO_BIN_EXE_*` only names binaries of
/// the crate under test. `cargo nextest run --workspace` (the test command) builds every binary first, so
/// in CI they are found fresh.
pub fn workspace_binary(name: &str, override_env: &str, sources: &[&str]) -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os(override_env).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let target = target_dir();
    let bin = target.join("debug").join(name);
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
    let newest_source = sources
        .iter()
        .filter_map(|dir| newest_mtime(&workspace.join(dir)))
        .max();
    let fresh = match (built, newest_source) {
        (Some(built), Some(source)) => built >= source,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if fresh {
        return Ok(bin);
    }
    if built.is_some() {
        return Err(format!(
            "{} is older than its sources: run `cargo build -p {name}` (the test command builds every \
             binary first), or set {override_env} to use it anyway",
            bin.display()
        ));
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Cargo's own lock on the target dir serialises concurrent builds from parallel tests.
    let status = std::process::Command::new(cargo)
        .args(["build", "-p", name, "--bin", name])
        .env("CARGO_TARGET_DIR", &target)
        .current_dir(&workspace)
        .status()
        .map_err(|e| format!("cargo build -p {name}: {e}"))?;
    if !status.success() || !bin.is_file() {
        return Err(format!("cargo build -p {name} failed ({status})"));
    }
    Ok(bin)
}

/// The newest modification time of `path`, or of the files under it (`target` and hidden folders
/// skipped).
fn newest_mtime(dir: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(dir).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    let mut newest = None;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                if !hidden && entry.file_name() != "target" {
                    stack.push(path);
                }
            } else if let Ok(m) = meta.modified() {
                newest = newest.max(Some(m));
            }
        }
    }
    newest
}

/// The target dir: `$CARGO_TARGET_DIR`, else the one the running test executable lives in
/// (`target/debug/deps/<test>`), else `target` of the workspace.
fn target_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(debug) = exe
            .ancestors()
            .find(|a| a.file_name().is_some_and(|n| n == "debug"))
        && let Some(target) = debug.parent()
    {
        return target.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

type PodKey = (String, String);
/// A Pod, its containers' probes `(local port, path)`, whether all processes live, the Ready last written.
type ReadinessCheck = (PodKey, Vec<Option<(u16, String)>>, bool, Option<bool>);

struct Process {
    container: String,
    child: tokio::process::Child,
    /// `(local port, path)` of the readiness probe.
    probe: Option<(u16, String)>,
}

struct RunningPod {
    uid: String,
    dir: tempfile::TempDir,
    /// Pod port number → local port.
    ports: HashMap<u16, u16>,
    /// Port name → Pod port number.
    names: HashMap<String, u16>,
    processes: Vec<Process>,
    grace: Duration,
    reported_ready: Option<bool>,
}

#[derive(Default)]
struct Pods {
    running: HashMap<PodKey, RunningPod>,
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
            .is_some_and(|p| p.child.start_kill().is_ok())
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
        tokio::pin!(shutdown);
        loop {
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
        // Terminations run in the background: one Pod's grace period must not hold back the others.
        for k in stale {
            if let Some(running) = self.lock().running.remove(&k) {
                tokio::spawn(terminate(running));
            }
        }
        // Start what is new.
        for (k, pod) in known {
            if pod.metadata.deletion_timestamp.is_some() || self.lock().running.contains_key(k) {
                continue;
            }
            match start_pod(client, config, pod).await {
                Ok(Some(running)) => {
                    let pods: Api<Pod> = Api::namespaced(client.clone(), &k.0);
                    let status = json!({"status": {
                        "phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1",
                        "podIPs": [{"ip": "127.0.0.1"}],
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
        // Readiness.
        let checks: Vec<ReadinessCheck> = {
            let mut pods = self.lock();
            pods.running
                .iter_mut()
                .map(|(k, r)| {
                    let alive = r
                        .processes
                        .iter_mut()
                        .all(|p| matches!(p.child.try_wait(), Ok(None)));
                    let probes = r.processes.iter().map(|p| p.probe.clone()).collect();
                    (k.clone(), probes, alive, r.reported_ready)
                })
                .collect()
        };
        for (k, probes, alive, reported) in checks {
            let mut ready = alive;
            for (port, path) in probes.into_iter().flatten() {
                if !ready {
                    break;
                }
                ready = http_ok(port, &path).await;
            }
            if reported == Some(ready) {
                continue;
            }
            let value = if ready { "True" } else { "False" };
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let status = json!({"status": {"conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": value, "lastTransitionTime": now},
                {"type": "Ready", "status": value, "lastTransitionTime": now},
            ]}});
            let pods: Api<Pod> = Api::namespaced(client.clone(), &k.0);
            if pods
                .patch_status(&k.1, &PatchParams::default(), &Patch::Merge(status))
                .await
                .is_ok()
                && let Some(r) = self.lock().running.get_mut(&k)
            {
                r.reported_ready = Some(ready);
            }
        }
    }
}

/// SIGTERM to every process of the Pod, then SIGKILL to those still running after the grace period.
async fn terminate(mut running: RunningPod) {
    for p in &running.processes {
        if let Some(pid) = p.child.id() {
            // No `unsafe` libc call: the `kill` utility sends the signal.
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
    let deadline = Instant::now() + running.grace;
    for p in &mut running.processes {
        let left = deadline.saturating_duration_since(Instant::now());
        if tokio::time::timeout(left, p.child.wait()).await.is_err() {
            let _ = p.child.kill().await;
        }
    }
}

fn key(pod: &Pod) -> PodKey {
    (
        pod.metadata.namespace.clone().unwrap_or_default(),
        pod.metadata.name.clone().unwrap_or_default(),
    )
}

/// The containers the stand-in runs: native sidecars first, then containers, those with a local command.
fn runnable<'a>(config: &'a KubeletConfig, pod: &'a Pod) -> Vec<(&'a Container, &'a [String])> {
    let Some(spec) = pod.spec.as_ref() else {
        return vec![];
    };
    let native = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    native
        .chain(spec.containers.iter())
        .filter_map(|c| Some((c, config.command_for(c.image.as_deref()?)?)))
        .collect()
}

async fn start_pod(client: &kube::Client, config: &KubeletConfig, pod: &Pod) -> Result<Option<RunningPod>> {
    let containers = runnable(config, pod);
    if containers.is_empty() {
        return Ok(None);
    }
    let (ns, name) = key(pod);
    let spec = pod.spec.as_ref().expect("runnable pods have a spec");
    let dir = tempfile::Builder::new()
        .prefix(&format!("pod-{name}-"))
        .tempdir()?;

    // Ports.
    let mut ports = HashMap::new();
    let mut names = HashMap::new();
    for (c, _) in &containers {
        let mut declared: Vec<u16> = c
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let n = u16::try_from(p.container_port).ok()?;
                if let Some(port_name) = &p.name {
                    names.insert(port_name.clone(), n);
                }
                Some(n)
            })
            .collect();
        if is_sidecar(c) {
            declared.push(SIDECAR_ADMIN_PORT);
        }
        for n in declared {
            if let std::collections::hash_map::Entry::Vacant(e) = ports.entry(n) {
                e.insert(free_port()?);
            }
        }
    }

    // Volumes, as stored: (volume name, files, whether it is a ConfigMap).
    let mut raw_volumes: Vec<(String, BTreeMap<String, Vec<u8>>, bool)> = vec![];
    for volume in spec.volumes.iter().flatten() {
        let files: BTreeMap<String, Vec<u8>> = if let Some(cm) = &volume.config_map {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            let found = match api.get_opt(&cm.name).await? {
                Some(found) => found,
                None if cm.optional == Some(true) => ConfigMap::default(),
                None => return Err(Error::Config(format!("configmap {} not found", cm.name))),
            };
            let mut files: BTreeMap<String, Vec<u8>> = found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            files.extend(
                found
                    .binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            files
        } else if let Some(secret) = &volume.secret {
            let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            let secret_name = secret.secret_name.clone().unwrap_or_default();
            let Some(found) = api.get_opt(&secret_name).await? else {
                return Err(Error::Config(format!("secret {secret_name} not found")));
            };
            found
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect()
        } else {
            continue;
        };
        raw_volumes.push((volume.name.clone(), files, volume.config_map.is_some()));
    }

    // Env, as written (secret values are never scanned for ports, only rewritten).
    let mut raw_env: Vec<BTreeMap<String, (String, bool)>> = vec![];
    for (c, _) in &containers {
        let mut env = BTreeMap::new();
        for var in c.env.iter().flatten() {
            if let Some(v) = resolve_env(client, pod, var).await? {
                env.insert(var.name.clone(), (v, var.value.is_some()));
            }
        }
        raw_env.push(env);
    }

    // Undeclared localhost ports named in args, plain env values and ConfigMap files (a worker's
    // handler URL, the queue API's listen address) are Pod ports too: two Pods must not share them.
    let mut scanned = vec![];
    for ((c, _), env) in containers.iter().zip(&raw_env) {
        for text in c
            .args
            .iter()
            .flatten()
            .chain(env.values().filter(|(_, plain)| *plain).map(|(v, _)| v))
        {
            scanned.extend(localhost_ports(text));
        }
    }
    for (_, files, scan) in &raw_volumes {
        for bytes in files.values().filter(|_| *scan) {
            scanned.extend(localhost_ports(&String::from_utf8_lossy(bytes)));
        }
    }
    for n in scanned {
        if let std::collections::hash_map::Entry::Vacant(e) = ports.entry(n) {
            e.insert(free_port()?);
        }
    }

    let mut volume_dirs: HashMap<String, PathBuf> = HashMap::new();
    for (volume, files, _) in raw_volumes {
        let vdir = dir.path().join("volumes").join(&volume);
        std::fs::create_dir_all(&vdir)?;
        for (file, bytes) in files {
            let text = String::from_utf8(bytes.clone())
                .map(|t| rewrite_ports(&t, &ports).into_bytes())
                .unwrap_or(bytes);
            std::fs::write(vdir.join(file), text)?;
        }
        volume_dirs.insert(volume, vdir);
    }

    let grace = Duration::from_secs(spec.termination_grace_period_seconds.unwrap_or(30).max(0) as u64)
        .min(config.max_grace);
    let mut running = RunningPod {
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        dir,
        ports,
        names,
        processes: vec![],
        grace,
        reported_ready: None,
    };
    for ((c, command), raw) in containers.into_iter().zip(raw_env) {
        let mounts: Vec<(String, PathBuf)> = c
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| Some((m.mount_path.clone(), volume_dirs.get(&m.name)?.clone())))
            .collect();
        let rewrite = |s: &str| rewrite_mounts(&rewrite_ports(s, &running.ports), &mounts);
        let mut env: BTreeMap<String, String> = raw.into_iter().map(|(k, (v, _))| (k, rewrite(&v))).collect();
        if is_sidecar(c) {
            let admin = running.ports[&SIDECAR_ADMIN_PORT];
            env.entry("SLUICE_ADMIN_LISTEN".into())
                .or_insert_with(|| format!("127.0.0.1:{admin}"));
        }
        if let Some(first) = c.ports.iter().flatten().next()
            && let Some(local) = u16::try_from(first.container_port)
                .ok()
                .and_then(|n| running.ports.get(&n))
        {
            env.insert("SLUICE_DEMO_LISTEN".into(), format!("127.0.0.1:{local}"));
        }
        let port_map: Vec<String> = running.ports.iter().map(|(p, l)| format!("{p}={l}")).collect();
        env.insert("SLUICE_E2E_PORTS".into(), port_map.join(","));
        env.extend(config.env.iter().cloned());
        let log = std::fs::File::create(running.dir.path().join(format!("{}.log", c.name)))?;
        let mut cmd = tokio::process::Command::new(&command[0]);
        cmd.args(&command[1..])
            .args(c.args.iter().flatten().map(|a| rewrite(a)))
            .envs(&env)
            .env("HOSTNAME", &name)
            .current_dir(running.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| Error::Config(format!("{}: cannot start {}: {e}", c.name, command[0])))?;
        let probe = c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .and_then(|get| {
                let number = match &get.port {
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => {
                        u16::try_from(*n).ok()?
                    }
                    k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                        *running.names.get(s)?
                    }
                };
                let local = *running.ports.get(&number)?;
                Some((local, get.path.clone().unwrap_or_else(|| "/".into())))
            })
            .or_else(|| {
                // A sidecar without a probe is still ready only once its config is loaded.
                is_sidecar(c).then(|| (running.ports[&SIDECAR_ADMIN_PORT], "/readyz".to_string()))
            });
        running.processes.push(Process {
            container: c.name.clone(),
            child,
            probe,
        });
    }
    Ok(Some(running))
}

fn is_sidecar(c: &Container) -> bool {
    c.name == "sluice-sidecar"
        || c.image
            .as_deref()
            .is_some_and(|i| i.contains(SIDECAR_IMAGE_PATTERN))
}

async fn resolve_env(
    client: &kube::Client,
    pod: &Pod,
    var: &k8s_openapi::api::core::v1::EnvVar,
) -> Result<Option<String>> {
    if let Some(v) = &var.value {
        return Ok(Some(v.clone()));
    }
    let Some(from) = &var.value_from else {
        return Ok(Some(String::new()));
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    if let Some(field) = &from.field_ref {
        return Ok(match field.field_path.as_str() {
            "metadata.name" => pod.metadata.name.clone(),
            "metadata.namespace" => Some(ns),
            "metadata.uid" => pod.metadata.uid.clone(),
            "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
            "spec.nodeName" => Some("sluice-e2e".into()),
            "spec.serviceAccountName" => pod.spec.as_ref().and_then(|s| s.service_account_name.clone()),
            _ => None,
        });
    }
    if let Some(sel) = &from.secret_key_ref {
        let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
        let value = api
            .get_opt(&sel.name)
            .await?
            .and_then(|s| s.data)
            .and_then(|d| d.get(&sel.key).cloned())
            .map(|b| String::from_utf8_lossy(&b.0).into_owned());
        return match value {
            Some(v) => Ok(Some(v)),
            None if sel.optional == Some(true) => Ok(None),
            None => Err(Error::Config(format!(
                "secret {} key {} not found",
                sel.name, sel.key
            ))),
        };
    }
    if let Some(sel) = &from.config_map_key_ref {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
        let value = api
            .get_opt(&sel.name)
            .await?
            .and_then(|c| c.data)
            .and_then(|d| d.get(&sel.key).cloned());
        return match value {
            Some(v) => Ok(Some(v)),
            None if sel.optional == Some(true) => Ok(None),
            None => Err(Error::Config(format!(
                "configmap {} key {} not found",
                sel.name, sel.key
            ))),
        };
    }
    Ok(None)
}

/// Rewrites `127.0.0.1:P`, `localhost:P`, `0.0.0.0:P`, `[::]:P` for every Pod port P in `ports` to
/// `127.0.0.1:<local>`.
pub fn rewrite_ports(text: &str, ports: &HashMap<u16, u16>) -> String {
    localhost_re()
        .replace_all(text, |caps: &regex::Captures<'_>| {
            match caps[2].parse::<u16>().ok().and_then(|p| ports.get(&p)) {
                Some(local) => format!("127.0.0.1:{local}"),
                None => caps[0].to_string(),
            }
        })
        .into_owned()
}

/// Ports of `127.0.0.1:P`, `localhost:P`, `0.0.0.0:P`, `[::]:P` in `text`.
pub fn localhost_ports(text: &str) -> Vec<u16> {
    localhost_re()
        .captures_iter(text)
        .filter_map(|caps| caps[2].parse::<u16>().ok())
        .filter(|p| *p != 0)
        .collect()
}

fn localhost_re() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    RE.get_or_init(|| {
        regex::Regex::new(r"(127\.0\.0\.1|localhost|0\.0\.0\.0|\[::\]|\[::1\]):(\d{1,5})\b")
            .expect("valid regex")
    })
}

/// Replaces a leading mount path (longest first) by the local directory holding the volume's files.
pub fn rewrite_mounts(text: &str, mounts: &[(String, PathBuf)]) -> String {
    let mut sorted: Vec<&(String, PathBuf)> = mounts.iter().collect();
    sorted.sort_by_key(|(m, _)| std::cmp::Reverse(m.len()));
    for (mount, local) in sorted {
        let mount = mount.trim_end_matches('/');
        if text == mount {
            return local.display().to_string();
        }
        if let Some(rest) = text.strip_prefix(mount)
            && rest.starts_with('/')
        {
            return format!("{}{rest}", local.display());
        }
    }
    text.to_string()
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether `GET path` on the local port answers 2xx within a second.
async fn http_ok(port: u16, path: &str) -> bool {
    let attempt = async {
        let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = [0u8; 16];
        let mut read = 0;
        while read < 12 {
            let n = tcp.read(&mut buf[read..]).await.ok()?;
            if n == 0 {
                break;
            }
            read += n;
        }
        let line = std::str::from_utf8(&buf[..read]).ok()?;
        Some(line.split(' ').nth(1).is_some_and(|code| code.starts_with('2')))
    };
    tokio::time::timeout(Duration::from_secs(1), attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn localhost_ports_of_the_pod_are_rewritten_and_others_kept() {
        let ports = HashMap::from([(8080, 40001), (15080, 40002)]);
        assert_eq!(
            rewrite_ports("http://127.0.0.1:8080", &ports),
            "http://127.0.0.1:40001"
        );
        assert_eq!(rewrite_ports("0.0.0.0:15080", &ports), "127.0.0.1:40002");
        assert_eq!(
            rewrite_ports("url: http://localhost:8080/jobs\nother: 10.0.0.1:8080", &ports),
            "url: http://127.0.0.1:40001/jobs\nother: 10.0.0.1:8080"
        );
        assert_eq!(rewrite_ports("127.0.0.1:9999", &ports), "127.0.0.1:9999");
    }

    #[test]
    fn undeclared_localhost_ports_are_found_in_text() {
        let text =
            "handler:\n  url: http://127.0.0.1:3000/jobs\nlisten: 0.0.0.0:9090\nredis: redis://10.0.0.1:6379";
        assert_eq!(localhost_ports(text), vec![3000, 9090]);
    }

    #[test]
    fn the_newest_source_time_covers_files_in_subfolders_but_not_target() {
        let dir = tempfile::tempdir().unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let new = old + Duration::from_secs(60);
        std::fs::create_dir_all(dir.path().join("src/queue")).unwrap();
        std::fs::create_dir_all(dir.path().join("target")).unwrap();
        let set = |path: &Path, at: std::time::SystemTime| {
            std::fs::write(path, "x").unwrap();
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(at)
                .unwrap();
        };
        set(&dir.path().join("src/lib.rs"), old);
        set(&dir.path().join("src/queue/claim.rs"), new);
        set(&dir.path().join("target/built"), new + Duration::from_secs(60));
        assert_eq!(newest_mtime(dir.path()), Some(new));
        assert_eq!(newest_mtime(&dir.path().join("src/lib.rs")), Some(old));
        assert_eq!(newest_mtime(&dir.path().join("missing")), None);
    }

    #[test]
    fn mount_paths_are_replaced_by_the_local_volume_dir() {
        let mounts = vec![("/etc/sluice".to_string(), PathBuf::from("/tmp/p/volumes/cfg"))];
        assert_eq!(
            rewrite_mounts("/etc/sluice/config.yaml", &mounts),
            "/tmp/p/volumes/cfg/config.yaml"
        );
        assert_eq!(rewrite_mounts("/etc/sluicex", &mounts), "/etc/sluicex");
        assert_eq!(rewrite_mounts("--config", &mounts), "--config");
    }
}
