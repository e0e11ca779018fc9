//! The KEDA `ScaledObject` (`keda.sh/v1alpha1`) rendered in place of the HPA when `scaling.provider` is
//! `keda`, for clusters where KEDA owns `external.metrics.k8s.io`. Pure: no I/O.
//!
//! KEDA's `postgresql` scaler runs the depth query itself, connecting with the worker's own
//! `SLUICE_DATABASE_URL` (`connectionFromEnv` on the `sluice-sidecar` container, which reads the
//! namespace's tenant Secret by reference, or the JobQueue's own with `rowLevelSecurity: Disabled`), so
//! no credential is copied into the ScaledObject; as the tenant, it reads its own namespace's depth. In this mode KEDA
//! also does 0↔1 (on its `pollingInterval`), and the operator leaves replicas alone.

use kube::{Resource, ResourceExt, api::ApiResource};
use serde_json::{Value, json};
use sluice_crds::{
    contract::{SIDECAR_CONTAINER as SIDECAR_CONTAINER_NAME, env},
    job_queue::JobQueue,
};

use super::worker_deployment::{labels, worker_name};

/// KEDA's API group/version.
pub const KEDA_API_VERSION: &str = "keda.sh/v1alpha1";

/// The `ScaledObject` resource, for a dynamic `Api`.
pub fn api_resource() -> ApiResource {
    ApiResource {
        group: "keda.sh".into(),
        version: "v1alpha1".into(),
        api_version: KEDA_API_VERSION.into(),
        kind: "ScaledObject".into(),
        plural: "scaledobjects".into(),
    }
}

/// The ScaledObject of `jq`'s workers, as JSON ready for server-side apply.
pub fn render_scaled_object(jq: &JobQueue) -> Value {
    let s = &jq.spec.scaling;
    let owner = jq.controller_owner_ref(&()).map(|r| vec![r]);
    let behavior = s
        .advanced
        .as_ref()
        .and_then(|a| a.horizontal_pod_autoscaler_config.as_ref())
        .and_then(|h| h.behavior.clone());
    let mut spec = json!({
        "scaleTargetRef": {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": worker_name(jq),
            "envSourceContainerName": SIDECAR_CONTAINER_NAME,
        },
        "minReplicaCount": jq.spec.min_replicas(),
        "maxReplicaCount": s.max_replica_count,
        "pollingInterval": s.polling_interval.get().as_secs().max(1),
        "cooldownPeriod": s.cooldown_period.get().as_secs(),
        "triggers": [{
            "type": "postgresql",
            "metadata": {
                "connectionFromEnv": env::DATABASE_URL,
                "query": sluice_queue::sql::queue_demand_statement(&jq.database_queue_name()),
                "targetQueryValue": s.target(jq.spec.worker.concurrency).to_string(),
                "activationTargetQueryValue": s.activation_threshold.to_string(),
            },
        }],
    });
    if let Some(b) = behavior {
        spec["advanced"] = json!({"horizontalPodAutoscalerConfig": {"behavior": b}});
    }
    json!({
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": {
            "name": worker_name(jq),
            "namespace": jq.namespace(),
            "labels": labels(jq),
            "ownerReferences": owner,
        },
        "spec": spec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::worker_deployment::tests::{BASIC, job_queue};

    #[test]
    fn the_scaled_object_mirrors_the_scaling_spec_in_kedas_names() {
        let jq = job_queue(&format!(
            "{BASIC}scaling: {{provider: keda, minReplicaCount: 0, maxReplicaCount: 7, targetJobsPerReplica: 5, activationThreshold: 2, pollingInterval: 10s, cooldownPeriod: 2m}}\n"
        ));
        let so = render_scaled_object(&jq);
        assert_eq!(so["apiVersion"], "keda.sh/v1alpha1");
        assert_eq!(so["metadata"]["name"], "emails-worker");
        assert_eq!(so["metadata"]["ownerReferences"][0]["kind"], "JobQueue");
        let spec = &so["spec"];
        assert_eq!(spec["scaleTargetRef"]["name"], "emails-worker");
        assert_eq!(spec["scaleTargetRef"]["envSourceContainerName"], "sluice-sidecar");
        assert_eq!(spec["minReplicaCount"], 0);
        assert_eq!(spec["maxReplicaCount"], 7);
        assert_eq!(spec["pollingInterval"], 10);
        assert_eq!(spec["cooldownPeriod"], 120);
        let trigger = &spec["triggers"][0];
        assert_eq!(trigger["type"], "postgresql");
        assert_eq!(trigger["metadata"]["connectionFromEnv"], "SLUICE_DATABASE_URL");
        assert_eq!(trigger["metadata"]["targetQueryValue"], "5");
        assert_eq!(trigger["metadata"]["activationTargetQueryValue"], "2");
        assert!(
            trigger["metadata"]["query"]
                .as_str()
                .unwrap()
                .contains("queue = 'shop/emails'")
        );
        assert!(spec.get("advanced").is_none());
        assert!(
            !so.to_string().contains("postgres://"),
            "no credentials in the ScaledObject"
        );
    }

    #[test]
    fn the_users_behavior_goes_where_keda_reads_it() {
        let jq = job_queue(&format!(
            "{BASIC}scaling:\n  provider: keda\n  advanced:\n    horizontalPodAutoscalerConfig:\n      behavior:\n        scaleDown: {{stabilizationWindowSeconds: 30}}\n"
        ));
        let so = render_scaled_object(&jq);
        assert_eq!(
            so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"],
            30
        );
    }
}
