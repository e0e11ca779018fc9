//! A stand-in for the Deployment and ReplicaSet controllers: for each Deployment it keeps
//! `spec.replicas` Pods from the template and reports `status.replicas`/`readyReplicas`/
//! `availableReplicas`.
//!
//! Pods are created through the API (so the mutating webhook injects the sidecar, as on a cluster),
//! named `{deployment}-{random}`, labelled from the template and owned by the Deployment (no
//! ReplicaSet in between). Scale-in deletes not-ready Pods first, then those with the lowest
//! `controller.kubernetes.io/pod-deletion-cost`, then the newest — the ReplicaSet controller's order,
//! minus node placement. Not implemented: rollouts (a template change does not replace Pods),
//! `minReadySeconds`, `maxSurge`/`maxUnavailable`, `paused`.

use std::cmp::Reverse;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::error::{Error, Result};

/// The annotation the ReplicaSet controller reads to choose Pods to delete on scale-in.
pub const POD_DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";
/// How often [`DeploymentController::run`] reconciles by default.
pub const SYNC_PERIOD_DEFAULT: Duration = Duration::from_millis(100);

/// Plays the Deployment controller for one namespace, or all.
#[derive(Clone)]
pub struct DeploymentController {
    client: kube::Client,
    namespace: Option<String>,
}

impl DeploymentController {
    /// A controller for `namespace`, or for all namespaces.
    pub fn new(client: kube::Client, namespace: Option<&str>) -> Self {
        DeploymentController {
            client,
            namespace: namespace.map(str::to_string),
        }
    }

    /// Reconciles every Deployment once; the failures of one (a webhook refusing a Pod) are logged and
    /// do not stop the others.
    pub async fn sync_once(&self) -> Result<()> {
        let api: Api<Deployment> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        for deployment in api.list(&ListParams::default()).await? {
            if deployment.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if let Err(e) = self.sync_deployment(&deployment).await {
                tracing::warn!(
                    deployment = deployment.metadata.name.as_deref().unwrap_or_default(),
                    error = %e,
                    "deployment stand-in: reconcile failed"
                );
            }
        }
        Ok(())
    }

    /// Runs [`DeploymentController::sync_once`] every `period` until `shutdown` resolves.
    pub async fn run(self, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {
                    if let Err(e) = self.sync_once().await {
                        tracing::warn!(error = %e, "deployment stand-in: listing failed");
                    }
                }
            }
        }
    }

    async fn sync_deployment(&self, deployment: &Deployment) -> Result<()> {
        let ns = deployment.metadata.namespace.clone().unwrap_or_default();
        let name = deployment.metadata.name.clone().unwrap_or_default();
        let uid = deployment.metadata.uid.clone().unwrap_or_default();
        let spec = deployment
            .spec
            .as_ref()
            .ok_or_else(|| Error::Decode(format!("deployment {ns}/{name} has no spec")))?;
        let want = spec.replicas.unwrap_or(1).max(0) as usize;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let selector = crate::hpa::selector_string(&spec.selector);
        let mut owned: Vec<Pod> = pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
            .into_iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.metadata
                        .owner_references
                        .iter()
                        .flatten()
                        .any(|o| o.uid == uid && o.controller == Some(true))
            })
            .collect();

        if owned.len() < want {
            let owner = deployment
                .controller_owner_ref(&())
                .ok_or_else(|| Error::Decode(format!("deployment {ns}/{name} has no uid")))?;
            let template = &spec.template;
            for _ in owned.len()..want {
                let mut metadata = template.metadata.clone().unwrap_or_default();
                metadata.name = None;
                metadata.generate_name = Some(format!("{name}-"));
                metadata.namespace = Some(ns.clone());
                metadata.owner_references = Some(vec![owner.clone()]);
                let pod = Pod {
                    metadata,
                    spec: template.spec.clone(),
                    status: None,
                };
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(created) => owned.push(created),
                    Err(e) => {
                        tracing::warn!(deployment = %name, error = %e, "deployment stand-in: pod refused");
                        break;
                    }
                }
            }
        } else if owned.len() > want {
            owned.sort_by_key(|p| {
                (
                    is_ready(p),
                    deletion_cost(p),
                    Reverse(p.metadata.creation_timestamp.clone().map(|t| t.0)),
                )
            });
            let excess = owned.len() - want;
            for pod in owned.drain(..excess) {
                let pod_name = pod.metadata.name.clone().unwrap_or_default();
                match pods.delete(&pod_name, &DeleteParams::default()).await {
                    Ok(_) | Err(kube::Error::Api(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }

        let ready = owned.iter().filter(|p| is_ready(p)).count() as i32;
        let status = json!({"status": {
            "observedGeneration": deployment.metadata.generation,
            "replicas": owned.len() as i32,
            "updatedReplicas": owned.len() as i32,
            "readyReplicas": ready,
            "availableReplicas": ready,
        }});
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), &ns);
        deployments
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
            .await?;
        Ok(())
    }
}

/// Whether the Pod's `Ready` condition is `True`.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Pod's deletion cost (0 when absent or not a number, as the ReplicaSet controller reads it).
pub fn deletion_cost(pod: &Pod) -> i32 {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(POD_DELETION_COST))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}
