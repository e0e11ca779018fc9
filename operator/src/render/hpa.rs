//! The `autoscaling/v2` HPA that scales a JobQueue's workers between 1 and `maxReplicaCount` on the
//! queue's depth, served by the operator's `external.metrics.k8s.io` API. Pure: no I/O.
//!
//! With target type `AverageValue` the HPA runs `ceil(depth / targetJobsPerReplica)` replicas (within
//! its tolerance), where depth is ready + running jobs. Between 0 and 1 the operator scales itself: an
//! HPA cannot act on a Deployment at zero replicas unless the `HPAScaleToZero` gate is on.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::autoscaling::v2::{
        CrossVersionObjectReference, ExternalMetricSource, HorizontalPodAutoscaler,
        HorizontalPodAutoscalerSpec, MetricIdentifier, MetricSpec, MetricTarget,
    },
    apimachinery::pkg::{api::resource::Quantity, apis::meta::v1::LabelSelector},
};
use kube::ResourceExt;
use sluice_crds::job_queue::JobQueue;

use sluice_crds::contract::label::JOB_QUEUE as JOB_QUEUE_LABEL;

use super::worker_deployment::{owned_meta, worker_name};

/// Name of the external metric the HPA asks for; the JobQueue is chosen by the label selector
/// `sluice.dev/jobqueue=<name>` in the HPA's namespace.
pub const EXTERNAL_METRIC_NAME: &str = "sluice_jobqueue_depth";

/// The HPA of `jq`'s workers, named like the Deployment and owned by the JobQueue.
pub fn render_hpa(jq: &JobQueue) -> HorizontalPodAutoscaler {
    let s = &jq.spec.scaling;
    let target = s.target(jq.spec.worker.concurrency);
    HorizontalPodAutoscaler {
        metadata: owned_meta(jq, worker_name(jq)),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".into()),
                kind: "Deployment".into(),
                name: worker_name(jq),
            },
            // The HPA owns 1..N; 0 is the operator's (see the module docs).
            min_replicas: Some(s.min_replica_count.max(1)),
            max_replicas: s.max_replica_count.max(1),
            metrics: Some(vec![MetricSpec {
                type_: "External".into(),
                external: Some(ExternalMetricSource {
                    metric: MetricIdentifier {
                        name: EXTERNAL_METRIC_NAME.into(),
                        selector: Some(selector(jq)),
                    },
                    target: MetricTarget {
                        type_: "AverageValue".into(),
                        average_value: Some(Quantity(target.to_string())),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            behavior: s
                .advanced
                .as_ref()
                .and_then(|a| a.horizontal_pod_autoscaler_config.as_ref())
                .and_then(|h| h.behavior.clone()),
        }),
        ..HorizontalPodAutoscaler::default()
    }
}

/// The label selector naming `jq` in metric requests.
pub fn selector(jq: &JobQueue) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(JOB_QUEUE_LABEL.to_owned(), jq.name_any())])),
        ..LabelSelector::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::worker_deployment::tests::{BASIC, job_queue};

    #[test]
    fn the_hpa_targets_the_queue_depth_per_replica() {
        let jq = job_queue(&format!(
            "{BASIC}scaling: {{minReplicaCount: 0, maxReplicaCount: 20, targetJobsPerReplica: 10}}\n"
        ));
        let hpa = render_hpa(&jq);
        assert_eq!(hpa.metadata.name.as_deref(), Some("emails-worker"));
        assert_eq!(
            hpa.metadata.owner_references.as_ref().unwrap()[0].kind,
            "JobQueue"
        );
        let spec = hpa.spec.unwrap();
        assert_eq!(spec.scale_target_ref.name, "emails-worker");
        assert_eq!(spec.scale_target_ref.kind, "Deployment");
        assert_eq!(spec.min_replicas, Some(1), "0 belongs to the operator");
        assert_eq!(spec.max_replicas, 20);
        let ext = spec.metrics.unwrap()[0].external.clone().unwrap();
        assert_eq!(ext.metric.name, EXTERNAL_METRIC_NAME);
        assert_eq!(
            ext.metric.selector.unwrap().match_labels.unwrap()[JOB_QUEUE_LABEL],
            "emails"
        );
        assert_eq!(ext.target.type_, "AverageValue");
        assert_eq!(ext.target.average_value, Some(Quantity("10".into())));
        assert!(spec.behavior.is_none());
    }

    #[test]
    fn the_target_defaults_to_the_worker_concurrency_and_min_above_zero_is_kept() {
        let jq = job_queue(&format!("{BASIC}scaling: {{minReplicaCount: 3}}\n"));
        let spec = render_hpa(&jq).spec.unwrap();
        assert_eq!(spec.min_replicas, Some(3));
        let ext = spec.metrics.unwrap()[0].external.clone().unwrap();
        assert_eq!(
            ext.target.average_value,
            Some(Quantity("4".into())),
            "worker.concurrency is 4"
        );
    }

    #[test]
    fn the_users_behavior_is_passed_through() {
        let jq = job_queue(&format!(
            "{BASIC}scaling:\n  advanced:\n    horizontalPodAutoscalerConfig:\n      behavior:\n        scaleDown:\n          stabilizationWindowSeconds: 60\n          policies: [{{type: Pods, value: 1, periodSeconds: 30}}]\n"
        ));
        let behavior = render_hpa(&jq).spec.unwrap().behavior.unwrap();
        let down = behavior.scale_down.unwrap();
        assert_eq!(down.stabilization_window_seconds, Some(60));
        assert_eq!(down.policies.unwrap()[0].value, 1);
    }
}
