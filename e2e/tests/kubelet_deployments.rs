//! The Deployment stand-in keeps `spec.replicas` Pods from the template, reports status, and on
//! scale-in deletes the Pods with the lowest `controller.kubernetes.io/pod-deletion-cost` first.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use sluice_e2e::deployments::{DeploymentController, POD_DELETION_COST};
use sluice_e2e::{Env, wait_for};

const DEADLINE: Duration = Duration::from_secs(10);

const WEB: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: example/web:1}]
"#;

async fn live_pods(pods: &kube::Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

#[tokio::test]
async fn deployment_stand_in_keeps_replicas_and_scales_in_by_deletion_cost() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("deploy").await.unwrap();
    ns.apply_yaml(WEB).await.unwrap();
    let controller = DeploymentController::new(ns.client(), Some(ns.name()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(Duration::from_millis(20), async {
        let _ = stopped.await;
    }));
    let pods: kube::Api<Pod> = ns.api();
    let deployments: kube::Api<Deployment> = ns.api();

    let three = wait_for("3 pods and status.replicas 3", DEADLINE, || async {
        let live = live_pods(&pods).await;
        let d = deployments.get("web").await.ok()?;
        (live.len() == 3 && d.status?.replicas == Some(3)).then_some(live)
    })
    .await
    .unwrap();
    for pod in &three {
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Deployment", "web"));
        assert!(pod.metadata.name.as_ref().unwrap().starts_with("web-"));
    }

    // A deleted pod is replaced.
    let gone = three[0].metadata.name.clone().unwrap();
    pods.delete(&gone, &Default::default()).await.unwrap();
    let replaced = wait_for("a replacement pod", DEADLINE, || async {
        let live = live_pods(&pods).await;
        (live.len() == 3
            && live
                .iter()
                .all(|p| p.metadata.name.as_deref() != Some(gone.as_str())))
        .then_some(live)
    })
    .await
    .unwrap();

    // Costs 300, 100, 200: scaling to 1 keeps the most expensive pod.
    let names: Vec<String> = replaced
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    for (name, cost) in names.iter().zip(["300", "100", "200"]) {
        let patch = json!({"metadata": {"annotations": {POD_DELETION_COST: cost}}});
        pods.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .unwrap();
    }
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await
        .unwrap();
    let one = wait_for("1 pod and status.replicas 1", DEADLINE, || async {
        let live = live_pods(&pods).await;
        let d = deployments.get("web").await.ok()?;
        (live.len() == 1 && d.status?.replicas == Some(1)).then_some(live)
    })
    .await
    .unwrap();
    assert_eq!(one[0].metadata.name.as_ref(), Some(&names[0]));

    // Scaling out again creates pods.
    deployments
        .patch_scale(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    wait_for("2 pods", DEADLINE, || async {
        (live_pods(&pods).await.len() == 2).then_some(())
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    task.await.unwrap();
}
