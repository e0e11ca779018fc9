//! The `sluice.dev/*` pod annotations, as the injection webhook reads them from a pod being created.
//!
//! Properties, beyond "never panics":
//! - a refusal names an annotation the pod carries, with the value it carries (`kubectl` shows it);
//! - what is accepted is well formed (policy and JobQueue names, ports), and written back as
//!   annotations reads back the same;
//! - the webhook's whole decision on a typical pod: refused (and the pod left as it was), left alone,
//!   or injected with exactly one sidecar and the app's containers kept; the JSON patch returned, applied
//!   to the pod, gives exactly the injected pod.
#![no_main]

use std::{collections::BTreeMap, sync::Arc};

use arbitrary::Arbitrary;
use k8s_openapi::api::core::v1::Pod;
use libfuzzer_sys::fuzz_target;
use serde_json::json;
use sluice_crds::{
    contract::SIDECAR_CONTAINER as SIDECAR_CONTAINER_NAME, job_queue::JobQueue,
    rate_limit_policy::RateLimitPolicy,
};
use sluice_operator::{
    render::sidecar_container::SidecarSettings,
    webhook::{
        annotations::{
            APP_PORT, INJECT, InjectAnnotations, JOB_QUEUES, LISTEN_PORT, NATIVE_SIDECAR, POLICY, PortRef,
        },
        inject::{InjectConfig, InjectError, admit, patch},
    },
};

const KEYS: [&str; 8] = [
    INJECT,
    POLICY,
    APP_PORT,
    LISTEN_PORT,
    NATIVE_SIDECAR,
    JOB_QUEUES,
    "sluice.dev/unknown",
    "example.com/other",
];

/// Values the parser has opinions about, so the fuzzer starts near them.
const VALUES: [&str; 12] = [
    "true",
    "false",
    "api",
    "http",
    "8080",
    "9000",
    "emails",
    "emails,reports",
    " , ",
    "0",
    "65536",
    "",
];

#[derive(Arbitrary, Debug)]
struct Input {
    annotations: Vec<(u8, Value)>,
    labelled: bool,
}

#[derive(Arbitrary, Debug)]
enum Value {
    Known(u8),
    Any(String),
    /// A known value with something around it.
    Around(String, u8, String),
}

impl Value {
    fn text(&self) -> String {
        match self {
            Value::Known(i) => VALUES[usize::from(*i) % VALUES.len()].to_owned(),
            Value::Any(s) => s.clone(),
            Value::Around(a, i, b) => format!("{a}{}{b}", VALUES[usize::from(*i) % VALUES.len()]),
        }
    }
}

fuzz_target!(|input: Input| {
    let annotations: BTreeMap<String, String> = input
        .annotations
        .iter()
        .map(|(k, v)| (KEYS[usize::from(*k) % KEYS.len()].to_owned(), v.text()))
        .collect();

    match InjectAnnotations::parse(&annotations) {
        Err(e) => {
            let value = annotations
                .get(e.annotation)
                .expect("the refusal names an annotation the pod has");
            assert_eq!(&e.value, value.trim());
            assert!(
                e.to_string()
                    .starts_with(&format!("annotation {}: ", e.annotation))
            );
        }
        Ok(a) => {
            if let Some(p) = &a.policy {
                assert!(!p.is_empty() && p.len() <= 63);
            }
            assert!(a.listen_port.is_none_or(|p| p > 0));
            assert!(!matches!(a.app_port, Some(PortRef::Number(0))));
            for (i, q) in a.job_queues.iter().enumerate() {
                assert!(
                    !q.is_empty() && !a.job_queues[..i].contains(q),
                    "{:?}",
                    a.job_queues
                );
            }
            assert_eq!(
                InjectAnnotations::parse(&written(&a)).as_ref(),
                Ok(&a),
                "written back"
            );
        }
    }

    // The webhook's decision on a typical pod carrying these annotations.
    let mut pod = web_pod(input.labelled);
    pod.metadata.annotations = Some(annotations.clone());
    match admit(&pod, &[policy()], &queues(), &config()) {
        Err(e) => {
            let annotation = match &e {
                InjectError::Annotation(a) => a.annotation,
                InjectError::Mismatch { annotation, .. } => annotation,
            };
            assert!(annotation.starts_with("sluice.dev/"), "{e}");
            assert!(
                e.to_string().starts_with(&format!("annotation {annotation}")),
                "{e}"
            );
        }
        Ok(None) => {}
        Ok(Some(injected)) => {
            let spec = injected.spec.as_ref().unwrap();
            let all: Vec<_> = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .collect();
            assert_eq!(all.iter().filter(|c| c.name == SIDECAR_CONTAINER_NAME).count(), 1);
            assert!(all.iter().any(|c| c.name == "web"), "the app's container is kept");
            let mut doc = serde_json::to_value(&pod).unwrap();
            json_patch::patch(&mut doc, &patch(&pod, &injected)).expect("the patch applies to the pod");
            assert_eq!(
                doc,
                serde_json::to_value(&injected).unwrap(),
                "the patch gives the injected pod"
            );
        }
    }
});

/// Annotations that say what `a` says.
fn written(a: &InjectAnnotations) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(INJECT.to_owned(), a.inject.to_string());
    if let Some(p) = &a.policy {
        m.insert(POLICY.to_owned(), p.clone());
    }
    match &a.app_port {
        Some(PortRef::Name(n)) => drop(m.insert(APP_PORT.to_owned(), n.clone())),
        Some(PortRef::Number(n)) => drop(m.insert(APP_PORT.to_owned(), n.to_string())),
        None => {}
    }
    if let Some(p) = a.listen_port {
        m.insert(LISTEN_PORT.to_owned(), p.to_string());
    }
    if let Some(n) = a.native_sidecar {
        m.insert(NATIVE_SIDECAR.to_owned(), n.to_string());
    }
    if !a.job_queues.is_empty() {
        m.insert(JOB_QUEUES.to_owned(), a.job_queues.join(","));
    }
    m
}

fn web_pod(labelled: bool) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-7d4f", "namespace": "shop",
                     "labels": if labelled { json!({"app": "web"}) } else { json!({"app": "other"}) }},
        "spec": {"containers": [{
            "name": "web", "image": "shop/web:1.2",
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                      {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
            "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}},
            "livenessProbe": {"tcpSocket": {"port": 8080}}
        }]}
    }))
    .unwrap()
}

fn policy() -> Arc<RateLimitPolicy> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
            "metadata": {"name": "api", "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"app": "web"}},
                     "redis": {"secretRef": {"name": "redis", "key": "url"}},
                     "rules": [{"name": "all", "limit": {"requests": 100, "window": "1m"}}]},
        }))
        .unwrap(),
    )
}

fn queues() -> Vec<Arc<JobQueue>> {
    ["emails", "reports"]
        .into_iter()
        .map(|name| {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
                    "metadata": {"name": name, "namespace": "shop"},
                    "spec": {"database": {"secretRef": {"name": "pg"}},
                             "worker": {"template": {"spec": {"containers": [{"name": "h", "image": "h"}]}}}},
                }))
                .unwrap(),
            )
        })
        .collect()
}

fn config() -> InjectConfig {
    InjectConfig {
        sidecar: SidecarSettings {
            image: "ghcr.io/sluice-dev/sluice-sidecar:0.1.0".into(),
            image_pull_policy: Some("IfNotPresent".into()),
            resources: None,
            queue_api_auth: false,
        },
        native: true,
        config_verify_key: Some("ab".repeat(32)),
        queue_api_auth: true,
    }
}
