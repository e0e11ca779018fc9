//! What e2e tests call: start an environment (the in-memory server, or the real cluster named by
//! `SLUICE_E2E_KUBECONFIG`), make a throwaway namespace per test, apply YAML, wait for conditions with a
//! deadline, run `kubectl`, and dump the namespace's objects when a test fails.
//!
//! ```no_run
//! # async fn example() -> sluice_e2e::Result<()> {
//! use std::time::Duration;
//! let env = sluice_e2e::Env::start().await?;
//! let ns = env.namespace("ratelimit").await?;
//! ns.apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: b}\n").await?;
//! let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = ns.api();
//! sluice_e2e::wait_for("configmap c", Duration::from_secs(5), || {
//!     let cms = cms.clone();
//!     async move { cms.get_opt("c").await.ok().flatten() }
//! })
//! .await?;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::{ByteString, api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::ObjectMeta};
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::discovery::Scope;
use serde_json::{Value, json};

use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::error::{Error, Result};
use sluice_test_apiserver::{Options, State, TestApiServer};

/// Environment variable naming a kubeconfig of a real cluster to run against instead.
pub const KUBECONFIG_ENV: &str = "SLUICE_E2E_KUBECONFIG";
/// Environment variable naming the kubectl binary (default: `kubectl` on PATH).
pub const KUBECTL_ENV: &str = "KUBECTL";
/// Field manager the harness applies with.
pub const FIELD_MANAGER: &str = "sluice-e2e";
/// How long the harness waits for a CRD to be established.
pub const CRD_DEADLINE: Duration = Duration::from_secs(30);

/// Polls `check` until it yields `Some`, or fails after `deadline` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if start.elapsed() >= deadline {
            return Err(Error::Timeout(deadline, what.to_string()));
        }
        tokio::time::sleep(pause.min(deadline.saturating_sub(start.elapsed()))).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Where tests run: the in-memory server, a real control plane started for the test, or a real cluster.
pub struct Env {
    server: Option<TestApiServer>,
    control_plane: Option<ControlPlane>,
    client: kube::Client,
    kubeconfig: PathBuf,
    /// The kubectl to run (the control plane's own version for a started control plane).
    kubectl: Option<PathBuf>,
    _dir: Option<tempfile::TempDir>,
}

impl Env {
    /// A real cluster when `SLUICE_E2E_KUBECONFIG` is set, else a fresh in-memory server.
    pub async fn start() -> Result<Self> {
        match std::env::var_os(KUBECONFIG_ENV).filter(|v| !v.is_empty()) {
            Some(path) => Self::from_kubeconfig(Path::new(&path)).await,
            None => Self::in_memory(Options::default()).await,
        }
    }

    /// A fresh in-memory server with these options.
    pub async fn in_memory(options: Options) -> Result<Self> {
        let server = TestApiServer::start(options).await?;
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig)?;
        let client = server.client("default").await?;
        Ok(Env {
            server: Some(server),
            control_plane: None,
            client,
            kubeconfig,
            kubectl: None,
            _dir: Some(dir),
        })
    }

    /// A real control plane (etcd, kube-apiserver, kube-controller-manager) started for this test; see
    /// [`crate::control_plane`]. kubectl is the control plane's own version.
    pub async fn real(options: ControlPlaneOptions) -> Result<Self> {
        let plane = ControlPlane::start(options).await?;
        Ok(Env {
            client: plane.client(),
            kubeconfig: plane.kubeconfig_path().to_path_buf(),
            kubectl: Some(plane.binaries().kubectl.clone()),
            server: None,
            control_plane: Some(plane),
            _dir: None,
        })
    }

    /// A cluster reached through a kubeconfig file.
    pub async fn from_kubeconfig(path: &Path) -> Result<Self> {
        let kc = kube::config::Kubeconfig::read_from(path)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        Ok(Env {
            server: None,
            control_plane: None,
            client: kube::Client::try_from(config)?,
            kubeconfig: path.to_path_buf(),
            kubectl: None,
            _dir: None,
        })
    }

    /// A kube client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The in-memory server, when not running against a real cluster.
    pub fn server(&self) -> Option<&TestApiServer> {
        self.server.as_ref()
    }

    /// The real control plane, when this environment started one.
    pub fn control_plane(&self) -> Option<&ControlPlane> {
        self.control_plane.as_ref()
    }

    /// The kubeconfig file clients (kubectl, the operator binary) should use.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubectl binary for this environment: the control plane's own version for a started control
    /// plane, else [`kubectl_path`].
    pub fn kubectl_binary(&self) -> Result<PathBuf> {
        match &self.kubectl {
            Some(path) => Ok(path.clone()),
            None => kubectl_path(),
        }
    }

    /// A `kubectl` command aimed at this environment.
    pub fn kubectl(&self) -> Result<Command> {
        let mut cmd = Command::new(self.kubectl_binary()?);
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        Ok(cmd)
    }

    /// Creates a namespace `{prefix}-{random}`; it is deleted when the returned value drops, and its
    /// objects are printed to stderr if that happens during a panic (a failing test).
    pub async fn namespace(&self, prefix: &str) -> Result<TestNamespace> {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &namespace_resource());
        let mut ns: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"generateName": format!("{prefix}-"), "labels": {"sluice.dev/e2e": "true"}},
        }))
        .map_err(|e| Error::Decode(e.to_string()))?;
        ns = api.create(&PostParams::default(), &ns).await?;
        let name = ns.metadata.name.clone().unwrap_or_default();
        if self.server.is_none() {
            // A real cluster's ServiceAccount controller makes `default` a moment later; Pods are refused
            // until it exists.
            let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
                Api::namespaced(self.client.clone(), &name);
            wait_for(&format!("ServiceAccount default in {name}"), CRD_DEADLINE, || {
                let accounts = accounts.clone();
                async move { accounts.get_opt("default").await.ok().flatten() }
            })
            .await?;
        }
        Ok(TestNamespace {
            name,
            client: self.client.clone(),
            state: self.server.as_ref().map(|s| s.state().clone()),
            kubeconfig: self.kubeconfig.clone(),
            kubectl: self.kubectl.clone(),
        })
    }

    /// Applies (server-side, forced) every document of a multi-document YAML; namespaced objects without a
    /// namespace land in `namespace`. Waits for CRDs to be established before later documents.
    pub async fn apply_yaml(&self, yaml: &str, namespace: Option<&str>) -> Result<Vec<DynamicObject>> {
        apply_yaml(&self.client, yaml, namespace).await
    }
}

fn namespace_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Namespace"), "namespaces")
}

/// Finds kubectl: `$KUBECTL`, else `kubectl` on PATH. `make deps` (run by `make test`) installs it when
/// it is missing.
pub fn kubectl_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(KUBECTL_ENV).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("kubectl"))
                .find(|p| p.is_file())
        })
        .ok_or_else(|| {
            Error::Config(format!(
                "kubectl not found on PATH: run `make deps` (installs it with apt-get) or set {KUBECTL_ENV}"
            ))
        })
}

/// See [`Env::apply_yaml`].
pub async fn apply_yaml(
    client: &kube::Client,
    yaml: &str,
    namespace: Option<&str>,
) -> Result<Vec<DynamicObject>> {
    let mut out = vec![];
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value =
            <Value as serde::Deserialize>::deserialize(doc).map_err(|e| Error::Decode(e.to_string()))?;
        if value.is_null() {
            continue;
        }
        let obj: DynamicObject =
            serde_json::from_value(value.clone()).map_err(|e| Error::Decode(e.to_string()))?;
        let types = obj
            .types
            .clone()
            .ok_or_else(|| Error::Decode("a document without apiVersion/kind".into()))?;
        let gvk = GroupVersionKind::try_from(&types).map_err(|e| Error::Decode(e.to_string()))?;
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await?;
        let name = obj
            .metadata
            .name
            .clone()
            .ok_or_else(|| Error::Decode(format!("a {} without a name", gvk.kind)))?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = obj
                    .metadata
                    .namespace
                    .clone()
                    .or(namespace.map(String::from))
                    .unwrap_or_else(|| "default".into());
                Api::namespaced_with(client.clone(), &ns, &ar)
            }
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let applied = api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&value),
            )
            .await?;
        if gvk.group == "apiextensions.k8s.io" && gvk.kind == "CustomResourceDefinition" {
            let api = api.clone();
            wait_for(&format!("CRD {name} established"), CRD_DEADLINE, || {
                let api = api.clone();
                let name = name.clone();
                async move {
                    let crd = api.get(&name).await.ok()?;
                    let conds = crd.data["status"]["conditions"].as_array()?.clone();
                    conds
                        .iter()
                        .any(|c| c["type"] == "Established" && c["status"] == "True")
                        .then_some(())
                }
            })
            .await?;
        }
        out.push(applied);
    }
    Ok(out)
}

/// A namespace that lives as long as one test.
pub struct TestNamespace {
    name: String,
    client: kube::Client,
    state: Option<Arc<State>>,
    kubeconfig: PathBuf,
    kubectl: Option<PathBuf>,
}

impl TestNamespace {
    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A kube client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A typed API in this namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Creates Secret `name` in this namespace holding `value` under `key`.
    pub async fn create_secret(&self, name: &str, key: &str, value: &str) -> Result<Secret> {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(
                key.into(),
                ByteString(value.as_bytes().to_vec()),
            )])),
            ..Secret::default()
        };
        Ok(self
            .api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await?)
    }

    /// Applies YAML (see [`Env::apply_yaml`]) with this namespace as the default.
    pub async fn apply_yaml(&self, yaml: &str) -> Result<Vec<DynamicObject>> {
        apply_yaml(&self.client, yaml, Some(&self.name)).await
    }

    /// Applies a YAML file.
    pub async fn apply_file(&self, path: &Path) -> Result<Vec<DynamicObject>> {
        let yaml = std::fs::read_to_string(path)?;
        self.apply_yaml(&yaml).await
    }

    fn kubectl_binary(&self) -> Result<PathBuf> {
        match &self.kubectl {
            Some(path) => Ok(path.clone()),
            None => kubectl_path(),
        }
    }

    /// Every object in the namespace as YAML: read in-process from the in-memory server, or with
    /// `kubectl get` from a real cluster.
    pub fn dump(&self) -> String {
        if let Some(state) = &self.state {
            let objects: Vec<Value> = state
                .store()
                .in_namespace(&self.name)
                .into_iter()
                .map(|(_, v)| v)
                .collect();
            return objects
                .iter()
                .map(|o| serde_yaml::to_string(o).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("---\n");
        }
        let Ok(kubectl) = self.kubectl_binary() else {
            return "(kubectl missing: cannot dump)".into();
        };
        let kinds = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=30s")
            .args(["api-resources", "--verbs=list", "--namespaced", "-o", "name"])
            .output();
        let kinds = match kinds {
            Ok(o) => String::from_utf8_lossy(&o.stdout)
                .lines()
                .collect::<Vec<_>>()
                .join(","),
            Err(e) => return format!("(kubectl api-resources failed: {e})"),
        };
        match Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--request-timeout=30s")
            .args([
                "get",
                &kinds,
                "-n",
                &self.name,
                "-o",
                "yaml",
                "--ignore-not-found",
            ])
            .output()
        {
            Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
            Err(e) => format!("(kubectl get failed: {e})"),
        }
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== objects in namespace {} at failure ====\n{}==== end of namespace {} ====",
                self.name,
                self.dump(),
                self.name
            );
        }
        match &self.state {
            Some(state) => {
                let key = namespace_key();
                state.store().delete(
                    &key,
                    "",
                    &self.name,
                    sluice_test_apiserver::store::Propagation::Background,
                );
            }
            None => {
                if let Ok(kubectl) = self.kubectl_binary() {
                    // Sluice's objects go first, as a careful user removes an app: deleting the namespace
                    // alone removes the Roles that let the operator read their Secrets in whatever order
                    // the namespace controller picks, and a reconcile of a JobQueue still there would be
                    // refused (a refusal the real control plane's test reads as a permission missing
                    // from the chart).
                    let _ = Command::new(&kubectl)
                        .arg("--kubeconfig")
                        .arg(&self.kubeconfig)
                        .arg("--request-timeout=30s")
                        .args([
                            "delete",
                            "jobqueues.sluice.dev,ratelimitpolicies.sluice.dev",
                            "--all",
                            "--namespace",
                            &self.name,
                            "--wait=true",
                            "--timeout=30s",
                            "--ignore-not-found",
                        ])
                        .output();
                    let _ = Command::new(kubectl)
                        .arg("--kubeconfig")
                        .arg(&self.kubeconfig)
                        .arg("--request-timeout=30s")
                        .args([
                            "delete",
                            "namespace",
                            &self.name,
                            "--wait=false",
                            "--ignore-not-found",
                        ])
                        .output();
                }
            }
        }
    }
}

fn namespace_key() -> sluice_test_apiserver::registry::ResKey {
    sluice_test_apiserver::registry::ResKey {
        group: String::new(),
        plural: "namespaces".into(),
    }
}
