//! Sluice installed the way a user installs it, on the in-memory API server: the chart's CRDs and its
//! rendered manifests ([`crate::chart`]) applied with real `kubectl`, and the stand-ins a cluster would
//! provide — [`Kubelet`] (which runs the chart's operator Deployment as the real `sluice-operator`
//! binary, plus Sluice's sidecar and the demo app), [`DeploymentController`], [`HpaController`] and
//! [`ServiceRouter`] (so the API server reaches the operator's webhook and external metrics API through
//! the chart's Services). The e2e scenarios and the sandbox both start Sluice through [`SluiceSystem`].
//!
//! What differs from a cluster: the operator reaches the API server through a kubeconfig
//! (`KUBECONFIG`, in place of the service account token), RBAC objects are stored but not enforced
//! (the server has one all-powerful token), and all processes share 127.0.0.1 (see [`crate::kubelet`]).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::deployments::DeploymentController;
use crate::error::{Error, Result};
use crate::harness::{Env, kubectl_path, wait_for};
use crate::hpa::{HpaController, SystemClock};
use crate::kubelet::{Kubelet, KubeletConfig, operator_binary, sidecar_binary};
use crate::registry::ResourceType;
use crate::server::Options;
use crate::services::ServiceRouter;

/// The release name (`helm install sluice ...`).
pub const RELEASE: &str = "sluice";
/// The release namespace (`-n sluice-system --create-namespace`).
pub const RELEASE_NAMESPACE: &str = "sluice-system";
/// Image pattern of the operator, run by the kubelet stand-in as the `sluice-operator` binary.
pub const OPERATOR_IMAGE_PATTERN: &str = "sluice-operator";
/// The operator Deployment's name (the chart's full name for release `sluice`).
pub const OPERATOR_DEPLOYMENT: &str = "sluice";
/// Who the HPA stand-in is: kube-controller-manager's HPA controller service account.
pub const HPA_USER: &str = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";
const HPA_GROUPS: &[&str] = &[
    "system:serviceaccounts",
    "system:serviceaccounts:kube-system",
    "system:authenticated",
];
const HPA_TOKEN: &str = "sluice-e2e-horizontal-pod-autoscaler";
/// How long installing may take (rendering, applying, the operator turning ready).
pub const INSTALL_DEADLINE: Duration = Duration::from_secs(90);

/// Kinds the chart installs that the in-memory server stores without acting on them (no RBAC
/// enforcement, no disruption budgets): `(group, version, kind, plural, namespaced)`.
const STORED_ONLY_KINDS: &[(&str, &str, &str, &str, bool)] = &[
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
    ),
    ("rbac.authorization.k8s.io", "v1", "Role", "roles", true),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
    ),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
        true,
    ),
];

/// Whether the e2e runs against a real cluster (`SLUICE_E2E_KUBECONFIG`); the whole-system scenarios need
/// the stand-ins and skip there, saying so on stderr.
pub fn skip_on_real_cluster(test: &str) -> bool {
    let real = std::env::var_os(crate::harness::KUBECONFIG_ENV).is_some_and(|v| !v.is_empty());
    if real {
        eprintln!(
            "{test}: skipped on a real cluster ({} is set): the whole-system scenarios run Sluice's \
             binaries through the in-memory server's stand-ins",
            crate::harness::KUBECONFIG_ENV
        );
    }
    real
}

/// A Secret holding one key, as YAML with `data` (base64). The in-memory server stores `stringData` as
/// written instead of folding it into `data` as kube-apiserver does, so manifests for it use `data`.
pub fn secret_yaml(name: &str, key: &str, value: &str) -> String {
    use base64::Engine as _;
    let encoded = base64::engine::general_purpose::STANDARD.encode(value);
    format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}}}\ndata: {{{key}: {encoded}}}\n")
}

/// How to install.
#[derive(Clone, Debug)]
pub struct SystemOptions {
    /// Helm values over the chart's defaults.
    pub values: Value,
    /// The demo app binary the kubelet stand-in runs for `sluice-demo-app` images.
    pub demo_app: PathBuf,
    /// How often the HPA stand-in syncs (kube-controller-manager: 15 s; tests go faster).
    pub hpa_period: Duration,
    /// Cap on the grace period between SIGTERM and SIGKILL of pod processes.
    pub max_grace: Duration,
}

impl SystemOptions {
    /// One operator replica (the chart's default is 2; one is enough on a shared laptop or CI core)
    /// with text logs, the HPA stand-in syncing every second.
    pub fn new(demo_app: &Path) -> Self {
        SystemOptions {
            values: json!({"replicaCount": 1, "logFormat": "text"}),
            demo_app: demo_app.to_path_buf(),
            hpa_period: Duration::from_secs(1),
            max_grace: Duration::from_secs(10),
        }
    }
}

/// Sluice running on a fresh in-memory API server, with the stand-ins. Dropping it kills every process
/// it started (the kubelet stand-in's children are killed on drop); [`SluiceSystem::shutdown`] stops
/// them gracefully first.
pub struct SluiceSystem {
    env: Env,
    kubelet: Kubelet,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    manifests: String,
}

impl SluiceSystem {
    /// Starts a fresh in-memory server (never a real cluster, whatever `SLUICE_E2E_KUBECONFIG` says) and the
    /// stand-ins, applies the chart's CRDs and manifests with kubectl, and waits
    /// until the operator is Ready and the API server trusts its webhook and metrics API.
    pub async fn install(options: SystemOptions) -> Result<Self> {
        let sidecar = sidecar_binary()?;
        let operator = operator_binary()?;
        let env = Env::in_memory(Options::default()).await?;
        let server = env.server().expect("in-memory");
        {
            let mut store = server.state().store();
            for (group, version, kind, plural, namespaced) in STORED_ONLY_KINDS {
                store
                    .registry
                    .upsert(ResourceType::builtin(group, version, kind, plural, *namespaced));
            }
        }
        let (stop, _) = watch::channel(false);
        let stopped = |stop: &watch::Sender<bool>| {
            let mut rx = stop.subscribe();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };

        let config = KubeletConfig {
            max_grace: options.max_grace,
            ..KubeletConfig::new(&sidecar, &options.demo_app)
        }
        .image(OPERATOR_IMAGE_PATTERN, &[operator.display().to_string()])
        .env("KUBECONFIG", &env.kubeconfig_path().display().to_string());
        let (kubelet, kubelet_task) = Kubelet::start(env.client(), config, stopped(&stop));
        let mut tasks = vec![kubelet_task];
        tasks.push(tokio::spawn(
            DeploymentController::new(env.client(), None)
                .run(crate::deployments::SYNC_PERIOD_DEFAULT, stopped(&stop)),
        ));
        tasks.push(tokio::spawn(
            ServiceRouter::new(env.client(), server.state().clone(), kubelet.clone())
                .run(crate::services::SYNC_PERIOD_DEFAULT, stopped(&stop)),
        ));
        // The HPA stand-in reads metrics as kube-controller-manager's HPA controller does: as its service
        // account, through the aggregator, which the operator authenticates (front proxy) and authorizes
        // (SubjectAccessReview) — the identity the chart's external-metrics-reader binding names.
        server.add_token(HPA_TOKEN, HPA_USER, HPA_GROUPS);
        let hpa_client = server.client_with_token("default", HPA_TOKEN).await?;
        tasks.push(tokio::spawn(
            HpaController::new(env.client(), hpa_client, None, Arc::new(SystemClock))
                .run(options.hpa_period, stopped(&stop)),
        ));

        let manifests = crate::chart::render(&options.values, RELEASE, RELEASE_NAMESPACE).await?;
        let system = SluiceSystem {
            env,
            kubelet,
            stop,
            tasks,
            manifests,
        };
        system
            .kubectl_ok(
                &["apply", "-f", "-"],
                Some(&format!(
                    "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {RELEASE_NAMESPACE}}}\n"
                )),
            )
            .await?;
        let crds = crate::chart::crds_dir().display().to_string();
        system
            .kubectl_ok(&["apply", "--server-side", "-f", &crds], None)
            .await?;
        system
            .kubectl_ok(&["apply", "-f", "-"], Some(&system.manifests))
            .await?;
        system.wait_operator_ready(INSTALL_DEADLINE).await?;
        Ok(system)
    }

    /// Waits until an operator pod is Ready (its `/readyz`: serving certificate trusted, policy cache
    /// synced), the webhook's `caBundle` is set and the webhook Service routes to it.
    pub async fn wait_operator_ready(&self, deadline: Duration) -> Result<()> {
        let deployments: Api<Deployment> = Api::namespaced(self.env.client(), RELEASE_NAMESPACE);
        let hooks: Api<MutatingWebhookConfiguration> = Api::all(self.env.client());
        let state = self.env.server().expect("in-memory").state().clone();
        let outcome = wait_for("the operator Ready and its webhook trusted", deadline, || {
            let (deployments, hooks, state) = (deployments.clone(), hooks.clone(), state.clone());
            async move {
                let d = deployments.get(OPERATOR_DEPLOYMENT).await.ok()?;
                let ready = d.status?.ready_replicas.unwrap_or(0);
                let hook = hooks.list(&ListParams::default()).await.ok()?.items;
                let trusted = hook.iter().flat_map(|h| h.webhooks.iter().flatten()).all(|w| {
                    w.client_config
                        .ca_bundle
                        .as_ref()
                        .is_some_and(|b| !b.0.is_empty())
                });
                let routed = state
                    .services
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .keys()
                    .any(|(ns, _, _)| ns == RELEASE_NAMESPACE);
                (ready >= 1 && trusted && !hook.is_empty() && routed).then_some(())
            }
        })
        .await;
        if outcome.is_err() {
            eprintln!("{}", self.operator_logs().await);
        }
        outcome
    }

    /// The environment (client, kubeconfig, the in-memory server).
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// The kubelet stand-in: local ports of pods, logs, crash simulation.
    pub fn kubelet(&self) -> &Kubelet {
        &self.kubelet
    }

    /// The kubeconfig for `kubectl` and clients.
    pub fn kubeconfig_path(&self) -> &Path {
        self.env.kubeconfig_path()
    }

    /// The chart's rendered manifests, as applied.
    pub fn manifests(&self) -> &str {
        &self.manifests
    }

    /// Runs `kubectl --kubeconfig … ARGS`, feeding `stdin` when given.
    pub async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<Output> {
        let mut cmd = tokio::process::Command::new(kubectl_path()?);
        cmd.arg("--kubeconfig")
            .arg(self.env.kubeconfig_path())
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("piped stdin");
            pipe.write_all(input.as_bytes()).await?;
            drop(pipe);
        }
        Ok(child.wait_with_output().await?)
    }

    /// Like [`SluiceSystem::kubectl`], failing with kubectl's stderr unless it exits 0; returns stdout.
    pub async fn kubectl_ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let out = self.kubectl(args, stdin).await?;
        if !out.status.success() {
            return Err(Error::Config(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The operator pods' output (for failure reports).
    pub async fn operator_logs(&self) -> String {
        let pods: Api<Pod> = Api::namespaced(self.env.client(), RELEASE_NAMESPACE);
        let Ok(list) = pods.list(&ListParams::default()).await else {
            return "(operator pods cannot be listed)".into();
        };
        let mut out = String::new();
        for pod in list {
            let name = pod.metadata.name.unwrap_or_default();
            if let Some(path) = self.kubelet.log_path(RELEASE_NAMESPACE, &name, "operator") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                out.push_str(&format!("==== operator pod {name} ====\n{text}\n"));
            }
        }
        out
    }

    /// A container's output, by namespace, pod and container.
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        self.kubelet
            .log_path(namespace, pod, container)
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default()
    }

    /// Stops the stand-ins; the kubelet stand-in stops every process (SIGTERM, then SIGKILL after the
    /// grace period) and removes the pods' temp dirs.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
