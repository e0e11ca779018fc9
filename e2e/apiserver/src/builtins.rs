//! The built-in kinds Sluice touches, as the real API server serves them.

use crate::registry::{PrinterColumn, ResourceType, ScalePaths};

fn col(name: &str, type_: &str, json_path: &str) -> PrinterColumn {
    PrinterColumn {
        name: name.into(),
        type_: type_.into(),
        json_path: json_path.into(),
        description: String::new(),
        priority: 0,
    }
}

/// Every built-in type.
pub fn all() -> Vec<ResourceType> {
    let b = ResourceType::builtin;
    let mut out = vec![];
    let mut ns = b("", "v1", "Namespace", "namespaces", false);
    ns.short_names = vec!["ns".into()];
    ns.status = true;
    ns.printer_columns = vec![col("Status", "string", ".status.phase")];
    out.push(ns);
    let mut pod = b("", "v1", "Pod", "pods", true);
    pod.short_names = vec!["po".into()];
    pod.categories = vec!["all".into()];
    pod.status = true;
    pod.printer_columns = vec![
        col("Status", "string", ".status.phase"),
        col("Node", "string", ".spec.nodeName"),
    ];
    out.push(pod);
    let mut svc = b("", "v1", "Service", "services", true);
    svc.short_names = vec!["svc".into()];
    svc.categories = vec!["all".into()];
    svc.status = true;
    svc.printer_columns = vec![
        col("Type", "string", ".spec.type"),
        col("Cluster-IP", "string", ".spec.clusterIP"),
    ];
    out.push(svc);
    let mut cm = b("", "v1", "ConfigMap", "configmaps", true);
    cm.short_names = vec!["cm".into()];
    out.push(cm);
    let mut secret = b("", "v1", "Secret", "secrets", true);
    secret.printer_columns = vec![col("Type", "string", ".type")];
    out.push(secret);
    let mut sa = b("", "v1", "ServiceAccount", "serviceaccounts", true);
    sa.short_names = vec!["sa".into()];
    out.push(sa);
    let mut ev = b("", "v1", "Event", "events", true);
    ev.short_names = vec!["ev".into()];
    ev.printer_columns = vec![
        col("Type", "string", ".type"),
        col("Reason", "string", ".reason"),
        col("Message", "string", ".message"),
    ];
    out.push(ev);
    let mut ev2 = b("events.k8s.io", "v1", "Event", "events", true);
    ev2.short_names = vec!["ev".into()];
    ev2.printer_columns = vec![
        col("Type", "string", ".type"),
        col("Reason", "string", ".reason"),
        col("Note", "string", ".note"),
    ];
    out.push(ev2);
    let mut deploy = b("apps", "v1", "Deployment", "deployments", true);
    deploy.short_names = vec!["deploy".into()];
    deploy.categories = vec!["all".into()];
    deploy.status = true;
    deploy.generation = true;
    deploy.scale = Some(ScalePaths {
        spec_replicas: ".spec.replicas".into(),
        status_replicas: ".status.replicas".into(),
        label_selector: None,
    });
    deploy.printer_columns = vec![
        col("Replicas", "integer", ".spec.replicas"),
        col("Ready", "integer", ".status.readyReplicas"),
        col("Available", "integer", ".status.availableReplicas"),
    ];
    out.push(deploy);
    let mut hpa = b(
        "autoscaling",
        "v2",
        "HorizontalPodAutoscaler",
        "horizontalpodautoscalers",
        true,
    );
    hpa.short_names = vec!["hpa".into()];
    hpa.categories = vec!["all".into()];
    hpa.status = true;
    hpa.generation = true;
    hpa.printer_columns = vec![
        col("Reference", "string", ".spec.scaleTargetRef.name"),
        col("MinPods", "integer", ".spec.minReplicas"),
        col("MaxPods", "integer", ".spec.maxReplicas"),
        col("Replicas", "integer", ".status.currentReplicas"),
    ];
    out.push(hpa);
    let mut netpol = b(
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        "networkpolicies",
        true,
    );
    netpol.short_names = vec!["netpol".into()];
    netpol.generation = true;
    netpol.printer_columns = vec![col("Pod-Selector", "string", ".spec.podSelector")];
    out.push(netpol);
    let mut lease = b("coordination.k8s.io", "v1", "Lease", "leases", true);
    lease.printer_columns = vec![col("Holder", "string", ".spec.holderIdentity")];
    out.push(lease);
    let mut mwc = b(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
    );
    mwc.generation = true;
    out.push(mwc);
    // Stored (the chart installs one for JobQueues) but not called: admission here is mutating only.
    let mut vwc = b(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        false,
    );
    vwc.generation = true;
    out.push(vwc);
    let mut apisvc = b("apiregistration.k8s.io", "v1", "APIService", "apiservices", false);
    apisvc.status = true;
    apisvc.printer_columns = vec![col("Service", "string", ".spec.service.name")];
    out.push(apisvc);
    let mut crd = b(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
    );
    crd.short_names = vec!["crd".into(), "crds".into()];
    crd.status = true;
    crd.generation = true;
    crd.printer_columns = vec![col("Created At", "date", ".metadata.creationTimestamp")];
    out.push(crd);
    out
}
