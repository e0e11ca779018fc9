//! Sluice installed the way a user installs it, on one of two control planes ([`ControlPlaneKind`]):
//!
//! - **In memory** (fast tests, the sandbox): the chart's CRDs and its rendered manifests
//!   ([`crate::chart`], the Helm SDK) applied with real `kubectl` to the in-memory API server, with the
//!   stand-ins a cluster would provide — [`Kubelet`] (which runs the chart's operator Deployment as the
//!   real `sluice-operator` binary, plus Sluice's sidecar and the demo app), [`DeploymentController`],
//!   [`HpaController`] and [`ServiceRouter`] (so the API server reaches the operator's webhook and
//!   external metrics API through the chart's Services). The operator reaches the API server through
//!   the harness's kubeconfig; RBAC objects are stored but not enforced.
//! - **Real** ([`crate::control_plane`]): etcd, kube-apiserver and kube-controller-manager; the chart
//!   installed with the real `helm install --wait`, then `helm test`. The real controllers (Deployment,
//!   ReplicaSet, HPA, EndpointSlice, garbage collector) act; only the kubelet is a stand-in, joined to the
//!   cluster as one Node ([`crate::kubelet::RealCluster`]): it hands each Pod's processes a
//!   TokenRequest token of the Pod's ServiceAccount, so the real RBAC authorizer judges the operator by
//!   the chart's roles, and writes projected tokens (the queue API's, audience `sluice`) and API
//!   credentials, so injected sidecars check the queue API's callers (`queueApi.auth: kubernetes`, the
//!   chart's default, kept there), and the API server reaches the operator's webhook and metrics API through the
//!   chart's Services and their EndpointSlices ([`crate::pod_network`]).
//!
//! The e2e scenarios ([`crate::scenarios`]) run on both; the sandbox starts Sluice through [`SluiceSystem`]
//! too. In both, all processes share 127.0.0.1 (see [`crate::kubelet`]).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;

use crate::control_plane::ControlPlaneOptions;
use crate::deployments::DeploymentController;
use crate::error::{Error, Result};
use crate::harness::{Env, wait_for};
use crate::hpa::{HpaController, SystemClock};
use crate::kubelet::{Kubelet, KubeletConfig, RealCluster, operator_binary, sidecar_binary};
use crate::services::ServiceRouter;
use sluice_test_apiserver::Options;
use sluice_test_apiserver::registry::ResourceType;

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
/// The Node the kubelet stand-in registers on a real control plane.
pub const NODE_NAME: &str = "sluice-e2e-node";
/// The APIService the chart registers for the operator's external metrics API.
pub const METRICS_APISERVICE: &str = "v1beta1.external.metrics.k8s.io";

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

/// Which control plane Sluice is installed on.
#[derive(Clone, Debug)]
pub enum ControlPlaneKind {
    /// The in-memory API server with stand-ins for the controllers.
    InMemory,
    /// A real etcd, kube-apiserver and kube-controller-manager.
    Real(ControlPlaneOptions),
}

impl ControlPlaneKind {
    /// A short name for reports: `in-memory` or `real`.
    pub fn name(&self) -> &'static str {
        match self {
            ControlPlaneKind::InMemory => "in-memory",
            ControlPlaneKind::Real(_) => "real",
        }
    }
}

/// How to install.
#[derive(Clone, Debug)]
pub struct SystemOptions {
    /// Which control plane.
    pub control_plane: ControlPlaneKind,
    /// Helm values over the chart's defaults.
    pub values: Value,
    /// The demo app binary the kubelet stand-in runs for `sluice-demo-app` images.
    pub demo_app: PathBuf,
    /// How often the HPA stand-in syncs (kube-controller-manager: 15 s; tests go faster).
    pub hpa_period: Duration,
    /// Cap on the grace period between SIGTERM and SIGKILL of pod processes.
    pub max_grace: Duration,
    /// `(operator image, sidecar image)`: on the in-memory control plane, the chart is installed with
    /// these images and the kubelet stand-in runs them with Podman; `None`: binaries as processes.
    pub images: Option<(String, String)>,
}

/// The operator image the e2e runs with Podman (`make test` sets it to what `make images` built).
pub const OPERATOR_IMAGE_ENV: &str = "SLUICE_E2E_OPERATOR_IMAGE";
/// The sidecar image the e2e runs with Podman.
pub const SIDECAR_IMAGE_ENV: &str = "SLUICE_E2E_SIDECAR_IMAGE";

/// `repository:tag` split at the tag's colon (a registry port's colon stays in the repository).
fn split_image(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (image, "latest"),
    }
}

impl SystemOptions {
    /// One operator replica (the chart's default is 2; one is enough on a shared laptop or CI core)
    /// with text logs, the HPA stand-in syncing every second. On the in-memory control plane the queue
    /// API's caller checks are off (`queueApi.auth: off`): that server has no TokenRequest API (so no
    /// projected token can be minted for an app) and its TokenReview knows only tokens it was given,
    /// with no audiences; [`SystemOptions::real`] keeps the chart's default, `kubernetes`.
    pub fn new(demo_app: &Path) -> Self {
        SystemOptions {
            control_plane: ControlPlaneKind::InMemory,
            values: json!({"replicaCount": 1, "logFormat": "text", "queueApi": {"auth": "off"}}),
            demo_app: demo_app.to_path_buf(),
            hpa_period: Duration::from_secs(1),
            max_grace: Duration::from_secs(10),
            images: None,
        }
    }

    /// Runs Sluice's images with Podman when `SLUICE_E2E_OPERATOR_IMAGE` and `SLUICE_E2E_SIDECAR_IMAGE`
    /// name them (as `make test` does), saying on stderr which way it runs.
    pub fn images_from_env(mut self, test: &str) -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        match (var(OPERATOR_IMAGE_ENV), var(SIDECAR_IMAGE_ENV)) {
            (Some(operator), Some(sidecar)) => {
                eprintln!("{test}: running the images {operator} and {sidecar} with Podman");
                self.images = Some((operator, sidecar));
            }
            _ => eprintln!(
                "{test}: running the binaries as processes ({OPERATOR_IMAGE_ENV} and {SIDECAR_IMAGE_ENV} \
                 name images to run with Podman; `make images` builds them)"
            ),
        }
        self
    }

    /// The same on a real control plane (the HPA controller syncing every `hpa_period`), with the queue
    /// API checking its callers as the chart does by default (`queueApi.auth: kubernetes`): the kubelet
    /// stand-in mounts the projected tokens and API credentials the sidecars review callers with.
    pub fn real(mut self) -> Self {
        if let Some(api) = self.values["queueApi"].as_object_mut() {
            api.remove("auth");
        }
        self.control_plane = ControlPlaneKind::Real(ControlPlaneOptions {
            hpa_sync_period: self.hpa_period,
        });
        self
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
    /// The Helm CLI's own directories (cache, config, data), on a real control plane.
    helm_home: Option<tempfile::TempDir>,
    /// The values installed (changed by [`SluiceSystem::grant_secret_access`]).
    values: std::sync::Mutex<Value>,
    /// Whether Sluice's images run with Podman ([`SystemOptions::images`]).
    images: bool,
}

impl SluiceSystem {
    /// Starts a fresh control plane of the kind `options` names (never a cluster named by
    /// `SLUICE_E2E_KUBECONFIG`), installs the chart and waits until the operator is Ready and the API
    /// server trusts its webhook and metrics API.
    pub async fn install(options: SystemOptions) -> Result<Self> {
        match options.control_plane.clone() {
            ControlPlaneKind::InMemory => Self::install_in_memory(options).await,
            ControlPlaneKind::Real(plane) => Self::install_real(options, plane).await,
        }
    }

    /// The in-memory server and its stand-ins; the chart rendered with the Helm SDK and applied with
    /// kubectl.
    async fn install_in_memory(mut options: SystemOptions) -> Result<Self> {
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

        let mut config = KubeletConfig {
            max_grace: options.max_grace,
            ..KubeletConfig::new(&sidecar, &options.demo_app)
        }
        .image(OPERATOR_IMAGE_PATTERN, &[operator.display().to_string()])
        .env("KUBECONFIG", &env.kubeconfig_path().display().to_string());
        if let Some((operator_image, sidecar_image)) = &options.images {
            let podman = crate::podman::Podman::new();
            podman.remove_orphans().await?;
            for image in [operator_image, sidecar_image] {
                if !podman.image_exists(image).await? {
                    return Err(Error::Config(format!(
                        "image {image} not found: build it with `make images`"
                    )));
                }
            }
            // The chart names the images, as a user's values would; the operator injects the sidecar's.
            let (repo, tag) = split_image(operator_image);
            options.values["image"] = json!({"repository": repo, "tag": tag, "pullPolicy": "Never"});
            let (repo, tag) = split_image(sidecar_image);
            options.values["sidecar"]["image"] =
                json!({"repository": repo, "tag": tag, "pullPolicy": "Never"});
            config = config
                .podman(OPERATOR_IMAGE_PATTERN)
                .podman(crate::kubelet::SIDECAR_IMAGE_PATTERN)
                .podman_mount(env.kubeconfig_path());
        }
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
            helm_home: None,
            values: std::sync::Mutex::new(options.values.clone()),
            images: options.images.is_some(),
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

    /// A real control plane; the kubelet stand-in joined to it as a Node; the chart installed with
    /// `helm install --wait`, then `helm test`.
    async fn install_real(options: SystemOptions, plane: ControlPlaneOptions) -> Result<Self> {
        let sidecar = sidecar_binary()?;
        let operator = operator_binary()?;
        let env = Env::real(plane).await?;
        let control_plane = env.control_plane().expect("a real control plane");
        let (stop, _) = watch::channel(false);
        let mut rx = stop.subscribe();
        let stopped = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let config = KubeletConfig {
            max_grace: options.max_grace,
            ..KubeletConfig::new(&sidecar, &options.demo_app)
        }
        .image(OPERATOR_IMAGE_PATTERN, &[operator.display().to_string()])
        .real_cluster(RealCluster {
            node: NODE_NAME.into(),
            network: control_plane.network().clone(),
            api_url: control_plane.url().to_string(),
            ca_pem: control_plane.ca_pem().to_string(),
        });
        let (kubelet, kubelet_task) = Kubelet::start(env.client(), config, stopped);
        let helm_home = tempfile::Builder::new().prefix("sluice-helm-").tempdir()?;
        let mut system = SluiceSystem {
            env,
            kubelet,
            stop,
            tasks: vec![kubelet_task],
            manifests: String::new(),
            helm_home: Some(helm_home),
            values: std::sync::Mutex::new(options.values.clone()),
            // Podman runs the images on the in-memory control plane only; here the binaries run.
            images: false,
        };
        let values = system.helm_home.as_ref().expect("set").path().join("values.json");
        std::fs::write(&values, options.values.to_string())?;
        let chart = crate::chart::chart_dir().display().to_string();
        let timeout = format!("{}s", INSTALL_DEADLINE.as_secs());
        let installed = system
            .helm_ok(&[
                "install",
                RELEASE,
                &chart,
                "--namespace",
                RELEASE_NAMESPACE,
                "--create-namespace",
                "--values",
                &values.display().to_string(),
                "--wait",
                "--timeout",
                &timeout,
            ])
            .await;
        if let Err(e) = installed {
            eprintln!("{}", system.operator_logs().await);
            return Err(e);
        }
        system.wait_operator_ready(INSTALL_DEADLINE).await?;
        let tested = system
            .helm_ok(&[
                "test",
                RELEASE,
                "--namespace",
                RELEASE_NAMESPACE,
                "--timeout",
                "60s",
            ])
            .await;
        if let Err(e) = tested {
            let test_pod = format!("{OPERATOR_DEPLOYMENT}-test-ready");
            return Err(Error::Config(format!(
                "{e}\n---- {test_pod} output ----\n{}",
                system.container_log(RELEASE_NAMESPACE, &test_pod, "check")
            )));
        }
        system.manifests = system
            .helm_ok(&["get", "manifest", RELEASE, "--namespace", RELEASE_NAMESPACE])
            .await?;
        Ok(system)
    }

    /// Lets the operator read Secrets in `namespace` (where a RateLimitPolicy or JobQueue names its
    /// Redis or database Secret), as a user does: `rbac.secretNamespaces` gains it and the release is
    /// upgraded (`helm upgrade --wait` on a real control plane; rendered and applied on the in-memory one).
    pub async fn grant_secret_access(&self, namespace: &str) -> Result<()> {
        let granted: Vec<String> = {
            let values = self.values.lock().unwrap_or_else(|p| p.into_inner());
            values["rbac"]["secretNamespaces"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(String::from))
                .collect()
        };
        if granted.iter().any(|n| n == namespace) {
            return Ok(());
        }
        // Namespaces of earlier scenarios that are being deleted would make the upgrade fail (nothing may
        // be created there); they leave the list once gone, so the operator keeps its access while it
        // still sees their objects.
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.env.client());
        let mut keep = vec![];
        for ns in granted {
            let Some(found) = namespaces.get_opt(&ns).await? else {
                continue;
            };
            if found.metadata.deletion_timestamp.is_none() {
                keep.push(ns);
                continue;
            }
            let gone = wait_for(&format!("namespace {ns} deleted"), INSTALL_DEADLINE, || {
                let (namespaces, ns) = (namespaces.clone(), ns.clone());
                async move { namespaces.get_opt(&ns).await.ok()?.is_none().then_some(()) }
            })
            .await;
            if let Err(e) = gone {
                // The namespace controller says what holds it up.
                let conditions = namespaces
                    .get_opt(&ns)
                    .await?
                    .and_then(|n| n.status?.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.message)
                    .collect::<Vec<_>>()
                    .join("; ");
                return Err(Error::Config(format!("{e}: {conditions}")));
            }
        }
        keep.push(namespace.to_string());
        self.upgrade(|values| values["rbac"]["secretNamespaces"] = json!(keep))
            .await
    }

    /// Confines the operator to `namespaces` as a user does (`watchNamespaces`: Roles there in place of
    /// the ClusterRole's namespaced rules, webhooks scoped to them) and lets it read Secrets there alone
    /// (`rbac.secretNamespaces`); `helm upgrade --wait` on a real control plane, then waits until the
    /// operator's one pod is the upgraded one and Ready.
    pub async fn confine_to(&self, namespaces: &[&str]) -> Result<()> {
        self.upgrade(|values| {
            values["watchNamespaces"] = json!(namespaces);
            values["rbac"]["secretNamespaces"] = json!(namespaces);
        })
        .await?;
        let pods: Api<Pod> = Api::namespaced(self.env.client(), RELEASE_NAMESPACE);
        let watched = namespaces.join(",");
        wait_for("the upgraded operator pod alone", INSTALL_DEADLINE, || {
            let (pods, watched) = (pods.clone(), watched.clone());
            async move {
                let list = pods.list(&ListParams::default()).await.ok()?.items;
                let operators: Vec<_> = list
                    .iter()
                    .filter_map(|p| p.spec.as_ref()?.containers.iter().find(|c| c.name == "operator"))
                    .collect();
                let upgraded = operators.iter().all(|c| {
                    c.env
                        .iter()
                        .flatten()
                        .any(|e| e.name == "SLUICE_WATCH_NAMESPACES" && e.value.as_deref() == Some(&watched))
                });
                (operators.len() == 1 && upgraded).then_some(())
            }
        })
        .await?;
        self.wait_operator_ready(INSTALL_DEADLINE).await
    }

    /// Changes the installed values with `change` and upgrades the release (`helm upgrade --wait` on a
    /// real control plane; rendered and applied on the in-memory one).
    pub async fn upgrade(&self, change: impl FnOnce(&mut Value)) -> Result<()> {
        let values = {
            let mut values = self.values.lock().unwrap_or_else(|p| p.into_inner());
            change(&mut values);
            values.clone()
        };
        match &self.helm_home {
            Some(home) => {
                let file = home.path().join("values.json");
                std::fs::write(&file, values.to_string())?;
                let chart = crate::chart::chart_dir().display().to_string();
                let timeout = format!("{}s", INSTALL_DEADLINE.as_secs());
                let file = file.display().to_string();
                self.helm_ok(&[
                    "upgrade",
                    RELEASE,
                    &chart,
                    "--namespace",
                    RELEASE_NAMESPACE,
                    "--values",
                    &file,
                    "--wait",
                    "--timeout",
                    &timeout,
                ])
                .await?;
            }
            None => {
                let manifests = crate::chart::render(&values, RELEASE, RELEASE_NAMESPACE).await?;
                self.kubectl_ok(&["apply", "-f", "-"], Some(&manifests)).await?;
            }
        }
        Ok(())
    }

    /// Runs the Helm CLI of the control plane's pins against this system (real control plane only),
    /// failing with its output unless it exits 0; returns stdout.
    pub async fn helm_ok(&self, args: &[&str]) -> Result<String> {
        let (Some(plane), Some(home)) = (self.env.control_plane(), &self.helm_home) else {
            return Err(Error::Config(
                "helm runs against a real control plane only".into(),
            ));
        };
        let out = tokio::process::Command::new(&plane.binaries().helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(self.env.kubeconfig_path())
            .env("HELM_CACHE_HOME", home.path().join("cache"))
            .env("HELM_CONFIG_HOME", home.path().join("config"))
            .env("HELM_DATA_HOME", home.path().join("data"))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await?;
        if !out.status.success() {
            return Err(Error::Config(format!(
                "helm {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Waits until an operator pod is Ready (its `/readyz`: serving certificate trusted, policy cache
    /// synced), the webhook's `caBundle` is set and the API server reaches the operator: on the in-memory
    /// server the webhook Service routes to it; on a real one the aggregator reports the metrics
    /// APIService `Available` (it reached the operator through the Service's endpoints).
    pub async fn wait_operator_ready(&self, deadline: Duration) -> Result<()> {
        let deployments: Api<Deployment> = Api::namespaced(self.env.client(), RELEASE_NAMESPACE);
        let hooks: Api<MutatingWebhookConfiguration> = Api::all(self.env.client());
        let apiservices: Api<DynamicObject> = Api::all_with(
            self.env.client(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("apiregistration.k8s.io", "v1", "APIService"),
                "apiservices",
            ),
        );
        let state = self.env.server().map(|s| s.state().clone());
        let outcome = wait_for("the operator Ready and its webhook trusted", deadline, || {
            let (deployments, hooks, state, apiservices) = (
                deployments.clone(),
                hooks.clone(),
                state.clone(),
                apiservices.clone(),
            );
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
                let routed = match &state {
                    Some(state) => state
                        .routed_services()
                        .iter()
                        .any(|(ns, _, _)| ns == RELEASE_NAMESPACE),
                    None => {
                        let service = apiservices.get(METRICS_APISERVICE).await.ok()?;
                        service.data["status"]["conditions"]
                            .as_array()?
                            .iter()
                            .any(|c| c["type"] == "Available" && c["status"] == "True")
                    }
                };
                (ready >= 1 && trusted && !hook.is_empty() && routed).then_some(())
            }
        })
        .await;
        if outcome.is_err() {
            eprintln!("{}", self.operator_logs().await);
        }
        outcome
    }

    /// Whether the queue API checks its callers (`queueApi.auth: kubernetes`, the chart's default).
    pub fn queue_api_auth(&self) -> bool {
        let values = self.values.lock().unwrap_or_else(|p| p.into_inner());
        values["queueApi"]["auth"]
            .as_str()
            .is_none_or(|mode| mode == "kubernetes")
    }

    /// The environment (client, kubeconfig, the in-memory server).
    pub fn env(&self) -> &Env {
        &self.env
    }

    /// Whether Sluice's images run with Podman (the operator and the sidecars as UID 65532 from
    /// `make images`), rather than the binaries as processes.
    pub fn runs_images(&self) -> bool {
        self.images
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
        let mut cmd = tokio::process::Command::new(self.env.kubectl_binary()?);
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
