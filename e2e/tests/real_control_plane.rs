//! Sluice on a real Kubernetes control plane (etcd, kube-apiserver and kube-controller-manager built
//! from the pinned Go modules, see `sluice_e2e::control_plane`): the chart installed with the real
//! `helm install` and checked with `helm test`, the operator under the chart's RBAC (a TokenRequest token
//! of its ServiceAccount), then the whole-system scenarios with the real admission chain, aggregator,
//! HPA, Deployment, ReplicaSet, EndpointSlice and garbage-collector controllers; then the scenarios that
//! need real RBAC (JobQueue authors judged as RBAC users, and the release upgraded to `watchNamespaces`).
//! `make e2e-real` runs this file alone and shows its report.

use std::time::Instant;

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ListParams};
use sluice_e2e::control_plane::{ControlPlane, ControlPlaneOptions};
use sluice_e2e::system::{RELEASE_NAMESPACE, SluiceSystem, SystemOptions};

/// What the operator logs when the RBAC authorizer refused one of its calls (kube-apiserver's wording:
/// `secrets "x" is forbidden: User "system:serviceaccount:…" cannot get resource …`).
const RBAC_REFUSAL: &str = "is forbidden: User \"";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_starts_with_rbac_enforced_and_its_own_kubectl_talks_to_it() {
    let plane = ControlPlane::start(ControlPlaneOptions::default()).await.unwrap();
    let versions = plane.versions().await.unwrap();
    let kube = sluice_e2e::control_plane::binaries::pinned("KUBERNETES_VERSION").unwrap();
    assert!(
        versions.starts_with(&format!(
            "kube-apiserver {kube}, kube-controller-manager {kube}, etcd 3."
        )),
        "{versions}"
    );

    let kubectl = |args: &[&str]| {
        std::process::Command::new(&plane.binaries().kubectl)
            .arg("--kubeconfig")
            .arg(plane.kubeconfig_path())
            .args(args)
            .output()
            .unwrap()
    };
    let out = kubectl(&["version", "-o", "json"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("\"gitVersion\": \"{kube}\"")), "{text}");
    let out = kubectl(&["get", "namespaces", "-o", "name"]);
    let names = String::from_utf8_lossy(&out.stdout);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&format!("namespace/{ns}")), "{names}");
    }

    // RBAC judges a ServiceAccount: `default` may not list Secrets, and the refusal names it.
    let accounts: Api<ServiceAccount> = Api::namespaced(plane.client(), "default");
    assert!(accounts.get_opt("default").await.unwrap().is_some());
    let out = kubectl(&[
        "auth",
        "can-i",
        "list",
        "secrets",
        "--as=system:serviceaccount:default:default",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "no");
    let out = kubectl(&["get", "secrets", "--as=system:serviceaccount:default:default"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("forbidden") && stderr.contains("system:serviceaccount:default:default"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sluice_installed_with_helm_passes_every_scenario_on_a_real_control_plane() {
    let started = Instant::now();
    let options = SystemOptions::new(env!("CARGO_BIN_EXE_sluice-demo-app").as_ref()).real();
    let system = SluiceSystem::install(options).await.unwrap();
    let plane = system.env().control_plane().expect("a real control plane");
    println!(
        "real control plane: {} (helm {}, kubectl {})",
        plane.versions().await.unwrap(),
        sluice_e2e::control_plane::binaries::pinned("HELM_VERSION").unwrap_or("?"),
        sluice_e2e::control_plane::binaries::pinned("KUBERNETES_VERSION").unwrap_or("?"),
    );
    println!(
        "installed: control plane started, helm install --wait and helm test passed ({:.1} s)",
        started.elapsed().as_secs_f64()
    );

    let mut outcomes = sluice_e2e::scenarios::run_all(&system, sluice_e2e::scenarios::ALL).await;
    for outcome in &outcomes {
        println!("{outcome}");
    }
    // Every call the operator made was allowed by the chart's RBAC: a missing permission shows up as a
    // refusal in its log even when a scenario happens not to depend on the call. Read before the
    // real-only scenarios, whose `watchNamespaces` upgrade replaces the operator pod, and again after.
    let refusals = |logs: String| -> Vec<String> {
        logs.lines()
            .filter(|l| l.contains(RBAC_REFUSAL))
            .map(String::from)
            .collect()
    };
    let mut refused = refusals(system.operator_logs().await);
    let real_only = sluice_e2e::scenarios::run_all(&system, sluice_e2e::scenarios::REAL_ONLY).await;
    for outcome in &real_only {
        println!("{outcome}");
    }
    outcomes.extend(real_only);
    refused.extend(refusals(system.operator_logs().await));
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(system.env().client(), RELEASE_NAMESPACE);
    let operator_pods = pods.list(&ListParams::default()).await.unwrap().items.len();
    system.shutdown().await;

    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| o.result.is_err())
        .map(|o| o.to_string())
        .collect();
    assert!(failed.is_empty(), "scenarios failed:\n{}", failed.join("\n"));
    assert!(operator_pods >= 1);
    assert!(
        refused.is_empty(),
        "the API server refused calls of the operator (a permission missing from the chart?):\n{}",
        refused.join("\n")
    );
}
