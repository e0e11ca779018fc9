//! A real Kubernetes control plane for the tests: etcd, kube-apiserver and kube-controller-manager, built
//! from the pinned Go modules ([`binaries`]), started as processes on free loopback ports with fresh
//! certificates ([`pki`]), and killed when the [`ControlPlane`] drops.
//!
//! - **kube-apiserver**: RBAC and Node authorization, the default admission chain plus
//!   `NodeRestriction`, bound service-account tokens (TokenRequest), aggregation with the front-proxy
//!   (requestheader) flags, `--enable-aggregator-routing` and an egress selector sending "cluster"
//!   traffic (webhooks, aggregated APIs) to the [`PodNetwork`] stand-in.
//! - **kube-controller-manager**: the Deployment, ReplicaSet, garbage collector, HPA (synced every
//!   [`ControlPlaneOptions::hpa_sync_period`]), namespace, EndpointSlice, ServiceAccount, disruption,
//!   root CA publisher and ClusterRole aggregation controllers, each with its own service account.
//! - **etcd**: one member, plain HTTP on loopback, `--unsafe-no-fsync` (data is thrown away).
//!
//! No scheduler and no kubelet: Pods stay unscheduled; the kubelet stand-in ([`crate::kubelet`]) runs
//! Sluice's containers as processes and writes their status, which the real controllers act on.
//! kube-apiserver takes over 20 s to exit on SIGTERM, so everything is stopped with SIGKILL.

pub mod binaries;
pub mod pki;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine as _;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::Api;
use serde_json::json;

use crate::error::{Error, Result};
use crate::harness::wait_for;
use crate::pod_network::PodNetwork;
pub use binaries::Binaries;
use pki::ControlPlanePki;

/// The Service range (`--service-cluster-ip-range`); ClusterIPs are allocated but never dialled.
pub const SERVICE_CIDR: &str = "10.96.0.0/16";
/// The `kubernetes` Service's ClusterIP (first address of [`SERVICE_CIDR`]).
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";
/// The service-account token issuer.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// kube-controller-manager's controllers (what a cluster's Deployments, HPAs and Services need).
pub const CONTROLLERS: &[&str] = &[
    "deployment-controller",
    "replicaset-controller",
    "garbage-collector-controller",
    "horizontal-pod-autoscaler-controller",
    "namespace-controller",
    "endpointslice-controller",
    "serviceaccount-controller",
    "disruption-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
];
/// How long each component may take to become ready.
pub const START_DEADLINE: Duration = Duration::from_secs(90);
/// Environment variable that keeps a control plane's directory (logs, certificates, etcd data) after
/// the test, its path printed to stderr.
pub const KEEP_ENV: &str = "SLUICE_E2E_KEEP_CONTROL_PLANE";
/// How many times a component is started on new ports when the first ones were taken meanwhile.
const START_ATTEMPTS: usize = 3;

/// How to start.
#[derive(Clone, Debug)]
pub struct ControlPlaneOptions {
    /// `--horizontal-pod-autoscaler-sync-period` (kube-controller-manager's default: 15 s).
    pub hpa_sync_period: Duration,
}

impl Default for ControlPlaneOptions {
    /// The HPA syncing every second, so scaling tests take seconds.
    fn default() -> Self {
        ControlPlaneOptions {
            hpa_sync_period: Duration::from_secs(1),
        }
    }
}

struct Component {
    name: &'static str,
    child: tokio::process::Child,
    log: PathBuf,
}

/// A running control plane. Dropping it kills the processes (SIGKILL) and removes its files.
pub struct ControlPlane {
    binaries: Binaries,
    pki: ControlPlanePki,
    url: String,
    etcd_url: String,
    kubeconfig: PathBuf,
    client: kube::Client,
    network: PodNetwork,
    components: Vec<Component>,
    // Last: dropped after the processes are killed.
    dir: tempfile::TempDir,
}

impl ControlPlane {
    /// Finds (or builds) the binaries and starts etcd, kube-apiserver and kube-controller-manager;
    /// returns once the API server is ready and the controllers run.
    pub async fn start(options: ControlPlaneOptions) -> Result<Self> {
        let binaries = Binaries::find_or_build()?;
        let dir = tempfile::Builder::new()
            .prefix("sluice-control-plane-")
            .tempdir()?;
        let pki = ControlPlanePki::generate(&dir.path().join("pki"), KUBERNETES_SERVICE_IP)?;
        let mut components = vec![];

        let (etcd, etcd_url) = start_etcd(&binaries, dir.path()).await?;
        components.push(etcd);

        let egress_socket = dir.path().join("egress.sock");
        let egress = PodNetwork::bind_egress(&egress_socket)?;
        let egress_config = dir.path().join("egress-selector.yaml");
        std::fs::write(&egress_config, egress_selector_config(&egress_socket))?;

        let (apiserver, url, kubeconfig, client) =
            start_apiserver(&binaries, dir.path(), &pki, &etcd_url, &egress_config).await?;
        components.push(apiserver);
        let network = PodNetwork::new(client.clone());
        tokio::spawn(network.clone().serve_egress(egress));

        let mut plane = ControlPlane {
            binaries,
            pki,
            url,
            etcd_url,
            kubeconfig,
            client,
            network,
            components,
            dir,
        };
        let kcm = plane.start_controller_manager(&options)?;
        plane.components.push(kcm);
        // The ServiceAccount controller made `default` in `default`: the controllers run.
        let accounts: Api<ServiceAccount> = Api::namespaced(plane.client.clone(), "default");
        let ready = wait_for(
            "kube-controller-manager running its controllers",
            START_DEADLINE,
            || {
                let accounts = accounts.clone();
                async move { accounts.get_opt("default").await.ok().flatten() }
            },
        )
        .await;
        if let Err(e) = ready {
            return Err(plane.failed("kube-controller-manager", e));
        }
        Ok(plane)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster CA (PEM), which signs the API server's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// A kubeconfig acting as the harness's administrator (`system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A client acting as the administrator.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The binaries it runs (kubectl and helm of the pinned versions among them).
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The pod network stand-in the API server's egress goes through.
    pub fn network(&self) -> &PodNetwork {
        &self.network
    }

    /// One line naming what runs: `kube-apiserver v1.37.2, kube-controller-manager v1.37.2, etcd 3.6.16`,
    /// as the running API server and etcd and the controller manager binary report themselves.
    pub async fn versions(&self) -> Result<String> {
        let server = self.client.apiserver_version().await?.git_version;
        let kcm = std::process::Command::new(&self.binaries.kube_controller_manager)
            .arg("--version")
            .output()?;
        let kcm = String::from_utf8_lossy(&kcm.stdout);
        let kcm = kcm.trim().trim_start_matches("Kubernetes ");
        let etcd = etcd_version(&self.etcd_url).await?;
        Ok(format!(
            "kube-apiserver {server}, kube-controller-manager {kcm}, etcd {etcd}"
        ))
    }

    /// The last `lines` lines a component (`etcd`, `kube-apiserver`, `kube-controller-manager`) wrote.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        let Some(c) = self.components.iter().find(|c| c.name == component) else {
            return format!("(no component {component})");
        };
        tail(&c.log, lines)
    }

    fn failed(&self, component: &str, e: Error) -> Error {
        Error::Config(format!(
            "{component} did not start: {e}\n---- {component} log ----\n{}",
            self.log_tail(component, 40)
        ))
    }

    fn start_controller_manager(&self, options: &ControlPlaneOptions) -> Result<Component> {
        let dir = self.dir.path();
        let kubeconfig = dir.join("kube-controller-manager.kubeconfig");
        let files = &self.pki.controller_manager;
        std::fs::write(
            &kubeconfig,
            kubeconfig_doc(
                &self.url,
                &self.pki.ca_pem,
                json!({
                    "client-certificate": files.cert.display().to_string(),
                    "client-key": files.key.display().to_string(),
                }),
                "default",
            ),
        )?;
        let sync = format!("{}ms", options.hpa_sync_period.as_millis());
        let args: Vec<String> = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--authentication-kubeconfig={}", kubeconfig.display()),
            format!("--authorization-kubeconfig={}", kubeconfig.display()),
            "--bind-address=127.0.0.1".into(),
            // Its own HTTPS endpoint (healthz, metrics) is not used: readiness is read through the API.
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!("--controllers={}", CONTROLLERS.join(",")),
            format!("--root-ca-file={}", self.pki.ca.cert.display()),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--horizontal-pod-autoscaler-sync-period={sync}"),
            "--v=1".into(),
        ];
        spawn(
            "kube-controller-manager",
            &self.binaries.kube_controller_manager,
            &args,
            dir,
        )
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.network.stop();
        for c in &mut self.components {
            let _ = c.child.start_kill();
        }
        if std::env::var_os(KEEP_ENV).is_some_and(|v| !v.is_empty()) {
            let dir = std::mem::replace(&mut self.dir, tempfile::TempDir::new().expect("a temp dir"));
            eprintln!(
                "{KEEP_ENV}: the control plane's files stay in {}",
                dir.keep().display()
            );
        }
    }
}

fn spawn(name: &'static str, program: &Path, args: &[String], dir: &Path) -> Result<Component> {
    let log = dir.join(format!("{name}.log"));
    let file = std::fs::File::create(&log)?;
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Config(format!("cannot start {}: {e}", program.display())))?;
    Ok(Component { name, child, log })
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Waits until `ready` yields `Some`, failing early (with the log) when the process exits.
async fn await_component<T, F, Fut>(component: &mut Component, what: &str, mut ready: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let child = &mut component.child;
    let outcome = wait_for(what, START_DEADLINE, || {
        let exited = matches!(child.try_wait(), Ok(Some(_)));
        let check = ready();
        async move {
            if exited {
                return Some(None);
            }
            check.await.map(Some)
        }
    })
    .await;
    match outcome {
        Ok(Some(v)) => Ok(v),
        Ok(None) => Err(Error::Config(format!(
            "{} exited while starting\n---- {} log ----\n{}",
            component.name,
            component.name,
            tail(&component.log, 40)
        ))),
        Err(e) => Err(Error::Config(format!(
            "{e}\n---- {} log ----\n{}",
            component.name,
            tail(&component.log, 40)
        ))),
    }
}

async fn start_etcd(binaries: &Binaries, dir: &Path) -> Result<(Component, String)> {
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let (client, peer) = (free_port()?, free_port()?);
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let args: Vec<String> = vec![
            "--name=sluice-e2e".into(),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=sluice-e2e={peer_url}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        let mut etcd = spawn("etcd", &binaries.etcd, &args, dir)?;
        let healthy = await_component(&mut etcd, "etcd healthy", || async move {
            let reply = crate::http::get(client, "/health").await.ok()?;
            (reply.status == 200 && reply.body.contains("\"true\"")).then_some(())
        })
        .await;
        match healthy {
            Ok(()) => return Ok((etcd, client_url)),
            Err(e) => {
                let _ = etcd.child.start_kill();
                let _ = std::fs::remove_dir_all(dir.join("etcd"));
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

async fn etcd_version(url: &str) -> Result<String> {
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| Error::Config(format!("bad etcd URL {url}")))?;
    let reply = crate::http::get(port, "/version").await?;
    let v: serde_json::Value =
        serde_json::from_str(&reply.body).map_err(|e| Error::Decode(format!("etcd /version: {e}")))?;
    Ok(v["etcdserver"].as_str().unwrap_or("unknown").to_string())
}

async fn start_apiserver(
    binaries: &Binaries,
    dir: &Path,
    pki: &ControlPlanePki,
    etcd_url: &str,
    egress_config: &Path,
) -> Result<(Component, String, PathBuf, kube::Client)> {
    let mut last = None;
    for _ in 0..START_ATTEMPTS {
        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let p = |path: &Path| path.display().to_string();
        let args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--etcd-prefix=/sluice-e2e-{port}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            // The `kubernetes` Service gets no endpoints: 127.0.0.1 is not a valid endpoint address, and
            // Sluice's processes reach the API server through their kubeconfig.
            "--endpoint-reconciler-type=none".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            format!("--tls-cert-file={}", p(&pki.serving.cert)),
            format!("--tls-private-key-file={}", p(&pki.serving.key)),
            format!("--client-ca-file={}", p(&pki.ca.cert)),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--service-account-issuer={SERVICE_ACCOUNT_ISSUER}"),
            format!(
                "--service-account-key-file={}",
                p(&pki.service_account_public_key)
            ),
            format!(
                "--service-account-signing-key-file={}",
                p(&pki.service_account_key)
            ),
            // Aggregation: the aggregator's client certificate and the headers it names callers in.
            format!("--requestheader-client-ca-file={}", p(&pki.front_proxy_ca.cert)),
            format!("--requestheader-allowed-names={}", pki::FRONT_PROXY_CLIENT),
            "--requestheader-username-headers=X-Remote-User".into(),
            "--requestheader-group-headers=X-Remote-Group".into(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
            format!("--proxy-client-cert-file={}", p(&pki.front_proxy_client.cert)),
            format!("--proxy-client-key-file={}", p(&pki.front_proxy_client.key)),
            // Webhooks and aggregated APIs are dialled at their endpoints, through the pod network.
            "--enable-aggregator-routing=true".into(),
            format!("--egress-selector-config-file={}", p(egress_config)),
            format!("--cert-dir={}", p(&dir.join("apiserver-certs"))),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        let mut apiserver = spawn("kube-apiserver", &binaries.kube_apiserver, &args, dir)?;
        let kubeconfig = dir.join("admin.kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_doc(
                &url,
                &pki.ca_pem,
                json!({
                    "client-certificate": p(&pki.admin.cert),
                    "client-key": p(&pki.admin.key),
                }),
                "default",
            ),
        )?;
        let client = client_for(&kubeconfig).await?;
        let probe = client.clone();
        let ready = await_component(&mut apiserver, "kube-apiserver ready (/readyz)", || {
            let client = probe.clone();
            async move {
                let request = http::Request::get("/readyz").body(vec![]).ok()?;
                let text = client.request_text(request).await.ok()?;
                (text.trim() == "ok").then_some(())
            }
        })
        .await;
        match ready {
            Ok(()) => return Ok((apiserver, url, kubeconfig, client)),
            Err(e) => {
                let _ = apiserver.child.start_kill();
                last = Some(e);
            }
        }
    }
    Err(last.expect("at least one attempt"))
}

/// A kube client from a kubeconfig file.
pub async fn client_for(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Config(format!("{}: {e}", kubeconfig.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(|e| Error::Config(format!("{}: {e}", kubeconfig.display())))?;
    Ok(kube::Client::try_from(config)?)
}

/// A kubeconfig (YAML) for `url` trusting `ca_pem`, with `user` as its credentials (a kubeconfig `user`
/// object: client certificate files, a token or a token file).
pub fn kubeconfig_doc(url: &str, ca_pem: &str, user: serde_json::Value, namespace: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "sluice-e2e", "cluster": {"server": url, "certificate-authority-data": ca}}],
        "users": [{"name": "sluice-e2e", "user": user}],
        "contexts": [{"name": "sluice-e2e", "context": {"cluster": "sluice-e2e", "user": "sluice-e2e", "namespace": namespace}}],
        "current-context": "sluice-e2e",
    });
    serde_yaml::to_string(&doc).expect("a JSON value always renders as YAML")
}

fn egress_selector_config(socket: &Path) -> String {
    format!(
        "apiVersion: apiserver.k8s.io/v1beta1\nkind: EgressSelectorConfiguration\negressSelections:\n\
         - name: cluster\n  connection:\n    proxyProtocol: HTTPConnect\n    transport:\n      uds:\n        \
         udsName: {}\n",
        socket.display()
    )
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
