//! What the kubelet stand-in does on a real API server besides running processes, as a node's kubelet
//! (and, for its Pods, the scheduler) would:
//!
//! - registers one Node ([`RealCluster::node`]) and keeps it Ready, renewing its Lease in
//!   `kube-node-lease` like a kubelet's heartbeat;
//! - binds each Pod it will run to that Node (`pods/binding`), so the real EndpointSlice controller
//!   publishes it (it skips Pods whose Node does not exist);
//! - gives the Pod an IP on the [`PodNetwork`] (written as `status.podIP`; the Node's own address is
//!   [`NODE_IP`]);
//! - hands the Pod's processes a kubeconfig carrying a token of the Pod's ServiceAccount from the
//!   TokenRequest API, bound to the Pod, where a kubelet would mount the projected token — so the real
//!   authorizer judges every call of, say, the operator by the chart's RBAC; writes the tokens of
//!   projected `serviceAccountToken` volume sources (audience, lifetime, bound to the Pod) and gives every
//!   process `KUBERNETES_SERVICE_HOST`/`_PORT` naming the API server, so an injected sidecar reviews
//!   the queue API's callers with its Pod's credentials;
//! - completes graceful deletion once the processes stopped (`DELETE` with grace period 0 and the Pod's
//!   uid as precondition), as a kubelet does.
//!
//! The stand-in itself talks to the API server as the harness's administrator, not as
//! `system:node:<name>`: Node authorization and NodeRestriction are on, but judge no kubelet.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::pod_network::PodNetwork;

/// The Node's InternalIP (the pod network's first address, as a node's bridge would hold it).
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// How often the Node's Lease is renewed (a kubelet's default is 10 s).
pub const HEARTBEAT_PERIOD: Duration = Duration::from_secs(10);
/// Lifetime of the service-account tokens handed to Pods (not renewed: tests are shorter).
pub const TOKEN_SECONDS: i64 = 3600;
/// The field manager of the stand-in's writes.
const MANAGER: &str = "sluice-e2e-kubelet";

/// How the stand-in joins a real cluster.
#[derive(Clone)]
pub struct RealCluster {
    /// The Node's name.
    pub node: String,
    /// Pod IPs and Service names.
    pub network: PodNetwork,
    /// The API server URL written into Pods' kubeconfigs.
    pub api_url: String,
    /// The CA (PEM) that signed the API server's certificate.
    pub ca_pem: String,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

impl RealCluster {
    /// Creates (or takes over) the Node and its Lease, and reports it Ready.
    pub async fn register_node(&self, client: &kube::Client) -> Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let labels = json!({
            "kubernetes.io/hostname": self.node,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": std::env::consts::ARCH.replace("x86_64", "amd64").replace("aarch64", "arm64"),
        });
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.node, "labels": labels},
        });
        nodes
            .patch(
                &self.node,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&node),
            )
            .await?;
        let capacity = json!({"cpu": "8", "memory": "32Gi", "pods": "250"});
        let status = json!({"status": {
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "the Sluice e2e kubelet stand-in runs Sluice's containers as processes",
                "lastHeartbeatTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "lastTransitionTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            }],
            "addresses": [
                {"type": "InternalIP", "address": NODE_IP.to_string()},
                {"type": "Hostname", "address": self.node},
            ],
            "capacity": capacity, "allocatable": capacity,
            "nodeInfo": {
                "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                "containerRuntimeVersion": "sluice-e2e://processes", "kubeletVersion": "",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }});
        nodes
            .patch_status(&self.node, &PatchParams::default(), &Patch::Merge(status))
            .await?;
        self.heartbeat(client).await
    }

    /// Renews the Node's Lease.
    pub async fn heartbeat(&self, client: &kube::Client) -> Result<()> {
        let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.node},
            "spec": {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": now()},
        });
        leases
            .patch(
                &self.node,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&lease),
            )
            .await?;
        Ok(())
    }

    /// Binds `pod` to the Node unless it is bound already; `false` when it is bound to another Node.
    pub async fn bind(&self, client: &kube::Client, pod: &Pod) -> Result<bool> {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            return Ok(node == self.node);
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": pod.metadata.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node},
        });
        let request = http::Request::post(format!("/api/v1/namespaces/{ns}/pods/{name}/binding"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&binding).map_err(|e| Error::Decode(e.to_string()))?)
            .map_err(|e| Error::Config(e.to_string()))?;
        client.request::<Value>(request).await?;
        Ok(true)
    }

    /// A TokenRequest token of the Pod's ServiceAccount, bound to the Pod, for `audience` (the API
    /// server's own when `None`), valid `seconds`.
    pub async fn token(
        &self,
        client: &kube::Client,
        pod: &Pod,
        audience: Option<&str>,
        seconds: i64,
    ) -> Result<String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let mut request = json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1", "kind": "Pod",
                    "name": pod.metadata.name, "uid": pod.metadata.uid,
                },
            },
        });
        if let Some(audience) = audience {
            request["spec"]["audiences"] = json!([audience]);
        }
        let request = http::Request::post(format!("/api/v1/namespaces/{ns}/serviceaccounts/{account}/token"))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&request).map_err(|e| Error::Decode(e.to_string()))?)
            .map_err(|e| Error::Config(e.to_string()))?;
        let answer: Value = client.request(request).await?;
        answer["status"]["token"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| Error::Decode(format!("TokenRequest for {ns}/{account} returned no token")))
    }

    /// Writes `dir/serviceaccount/{token,kubeconfig}` for the Pod's ServiceAccount and returns the
    /// kubeconfig's path; `None` when the Pod opts out (`automountServiceAccountToken: false`).
    pub async fn service_account_kubeconfig(
        &self,
        client: &kube::Client,
        pod: &Pod,
        dir: &Path,
    ) -> Result<Option<PathBuf>> {
        let spec = pod.spec.as_ref();
        if spec.and_then(|s| s.automount_service_account_token) == Some(false) {
            return Ok(None);
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let token = self.token(client, pod, None, TOKEN_SECONDS).await?;
        let sa_dir = dir.join("serviceaccount");
        std::fs::create_dir_all(&sa_dir)?;
        let token_file = sa_dir.join("token");
        std::fs::write(&token_file, token)?;
        let kubeconfig = sa_dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            crate::control_plane::kubeconfig_doc(
                &self.api_url,
                &self.ca_pem,
                json!({"tokenFile": token_file.display().to_string()}),
                &ns,
            ),
        )?;
        Ok(Some(kubeconfig))
    }

    /// Removes a Pod whose processes stopped: `DELETE` with grace period 0, for this uid only.
    pub async fn finish_deletion(client: &kube::Client, namespace: &str, name: &str, uid: &str) {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        if let Err(e) = pods.delete(name, &params).await {
            tracing::debug!(pod = %name, error = %e, "kubelet stand-in: final delete failed");
        }
    }
}
