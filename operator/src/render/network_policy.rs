//! A policy's NetworkPolicy, and the Services that send traffic around the sidecar.
//!
//! Injection leaves the app listening on its port (the sidecar forwards to it on `127.0.0.1`), so any
//! pod reaching the pod IP, or a Service targeting that port, would skip rate limiting. The rendered
//! NetworkPolicy selects the governed pods (`sluice.dev/policy: <name>`) and admits ingress only on the
//! sidecar's ports, named as injection names them, so each pod's own numbers are resolved by the
//! network plugin: the proxy port (the name the app port had, `http` by default, or `sluice`) and the
//! admin port `sluice-admin` (kubelet probes, Prometheus). Everything else to those pods is dropped,
//! from every source, wherever the network plugin enforces NetworkPolicies.
//!
//! A name is admitted only if no governed pod has it on a container other than the sidecar, so a name
//! cannot open an app port on a pod that fronts a different one.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::{
    api::{
        core::v1::{Container, Pod, Service},
        networking::v1::{NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPort, NetworkPolicySpec},
    },
    apimachinery::pkg::{
        apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use sluice_crds::{
    contract::{
        SIDECAR_CONTAINER, env,
        label::{MANAGED_BY, MANAGED_BY_VALUE, POLICY as POLICY_LABEL},
        port_name,
    },
    rate_limit_policy::NetworkPolicySpec as Settings,
};

/// Name of the NetworkPolicy rendered for policy `policy` (the ConfigMap's name too: different kinds).
pub fn network_policy_name(policy: &str) -> String {
    format!("sluice-policy-{policy}")
}

/// The port name injection gives the sidecar's proxy port when the app port was named `http` (the name
/// it fronts by default).
const APP_PORT_NAME_DEFAULT: &str = "http";

/// The NetworkPolicy for policy `policy` in `namespace`, owned by `owner`, given its `settings` and
/// the pods it governs now (any phase: a pending pod's ports must be open once it starts).
pub fn network_policy(
    namespace: &str,
    policy: &str,
    owner: OwnerReference,
    settings: &Settings,
    governed: &[Pod],
) -> NetworkPolicy {
    let tcp = |port| NetworkPolicyPort {
        port: Some(port),
        protocol: Some("TCP".into()),
        end_port: None,
    };
    let mut ports: Vec<NetworkPolicyPort> = admitted_port_names(governed)
        .into_iter()
        .map(|name| tcp(IntOrString::String(name)))
        .collect();
    let extra: BTreeSet<u16> = settings.additional_ports.iter().copied().collect();
    ports.extend(extra.into_iter().map(|p| tcp(IntOrString::Int(i32::from(p)))));
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(network_policy_name(policy)),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.into(), MANAGED_BY_VALUE.into()),
                (POLICY_LABEL.into(), policy.into()),
            ])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(POLICY_LABEL.into(), policy.into())])),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: None,
                ports: Some(ports),
            }]),
            egress: None,
        }),
    }
}

/// The port names ingress is admitted on: the sidecar's names (`sluice`, `sluice-admin`, `http`, and
/// whatever names the governed pods' sidecars carry), less any name a governed pod uses on a container
/// other than the sidecar. Sorted.
pub fn admitted_port_names(governed: &[Pod]) -> Vec<String> {
    let mut names: BTreeSet<String> = [port_name::LISTEN, port_name::ADMIN, APP_PORT_NAME_DEFAULT]
        .into_iter()
        .map(String::from)
        .collect();
    let mut taken = BTreeSet::new();
    for pod in governed {
        for (container, is_sidecar) in containers(pod) {
            for name in container.ports.iter().flatten().filter_map(|p| p.name.clone()) {
                if is_sidecar {
                    names.insert(name);
                } else {
                    taken.insert(name);
                }
            }
        }
    }
    names.retain(|n| !taken.contains(n));
    names.into_iter().collect()
}

/// A Service port that reaches the app's own port on a governed pod, around the sidecar.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Exposure {
    /// The Service's name.
    pub service: String,
    /// The Service port (`spec.ports[].port`).
    pub port: i32,
    /// Its `targetPort` as written (a number, or a name).
    pub target: String,
    /// The app port it resolves to.
    pub app_port: u16,
}

impl std::fmt::Display for Exposure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Service {} port {} targets {} (the app's port {})",
            self.service, self.port, self.target, self.app_port
        )
    }
}

/// The Service ports (of `services`, in the governed pods' namespace) whose selector picks a governed
/// pod and whose `targetPort` resolves, on that pod, to the app port the sidecar fronts: by number, or
/// by a name that is an app container's. Sorted, each at most once.
pub fn exposures(governed: &[Pod], services: &[Service]) -> Vec<Exposure> {
    let mut out = BTreeSet::new();
    for svc in services {
        let Some(spec) = &svc.spec else { continue };
        let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
            continue;
        };
        for pod in governed {
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            if !selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                continue;
            }
            let Some(app_port) = app_port(pod) else { continue };
            for sp in spec.ports.iter().flatten() {
                if sp.protocol.as_deref().is_some_and(|p| p != "TCP") {
                    continue;
                }
                let target = sp.target_port.clone().unwrap_or(IntOrString::Int(sp.port));
                let reaches_app = match &target {
                    IntOrString::Int(n) => *n == i32::from(app_port),
                    IntOrString::String(name) => resolve(pod, name)
                        .is_some_and(|(number, sidecar)| !sidecar && number == i32::from(app_port)),
                };
                if reaches_app {
                    out.insert(Exposure {
                        service: svc.metadata.name.clone().unwrap_or_default(),
                        port: sp.port,
                        target: match target {
                            IntOrString::Int(n) => format!("port {n}"),
                            IntOrString::String(s) => format!("port name {s:?}"),
                        },
                        app_port,
                    });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// The pod's containers as Services resolve named ports in them (app containers, then restartable init
/// containers, i.e. native sidecars), each with whether it is Sluice's sidecar.
fn containers(pod: &Pod) -> impl Iterator<Item = (&Container, bool)> {
    let spec = pod.spec.as_ref();
    let apps = spec.into_iter().flat_map(|s| s.containers.iter());
    let sidecars = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    apps.chain(sidecars).map(|c| (c, c.name == SIDECAR_CONTAINER))
}

/// The container port named `name` on the pod: its number and whether it is the sidecar's.
fn resolve(pod: &Pod, name: &str) -> Option<(i32, bool)> {
    containers(pod).find_map(|(c, sidecar)| {
        c.ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| (p.container_port, sidecar))
    })
}

/// The app port the pod's sidecar forwards to (its `SLUICE_UPSTREAM`, `http://127.0.0.1:<port>`).
pub fn app_port(pod: &Pod) -> Option<u16> {
    let spec = pod.spec.as_ref()?;
    let sidecar = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == SIDECAR_CONTAINER)?;
    let upstream = sidecar
        .env
        .iter()
        .flatten()
        .find(|e| e.name == env::UPSTREAM)?
        .value
        .as_deref()?;
    upstream.trim_end_matches('/').rsplit(':').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A governed pod as injection leaves it: app port `app_port` (its name moved to the sidecar), the
    /// sidecar as a native sidecar on 15080 named `listen_name` and 15021.
    fn pod(name: &str, app_port: u16, listen_name: &str, other_app_ports: serde_json::Value) -> Pod {
        let mut app_ports = vec![json!({"containerPort": app_port})];
        app_ports.extend(other_app_ports.as_array().cloned().unwrap_or_default());
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": "web", "sluice.dev/policy": "api"}},
            "spec": {
                "containers": [{"name": "web", "image": "web", "ports": app_ports}],
                "initContainers": [{
                    "name": "sluice-sidecar", "image": "sluice", "restartPolicy": "Always",
                    "env": [{"name": "SLUICE_UPSTREAM", "value": format!("http://127.0.0.1:{app_port}")}],
                    "ports": [
                        {"name": listen_name, "containerPort": 15080},
                        {"name": "sluice-admin", "containerPort": 15021}
                    ]
                }]
            }
        }))
        .unwrap()
    }

    fn service(name: &str, ports: serde_json::Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"selector": {"app": "web"}, "ports": ports}
        }))
        .unwrap()
    }

    fn owner() -> OwnerReference {
        OwnerReference {
            api_version: "sluice.dev/v1alpha1".into(),
            kind: "RateLimitPolicy".into(),
            name: "api".into(),
            uid: "u1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }
    }

    #[test]
    fn the_network_policy_admits_only_the_sidecars_named_ports_and_additional_ones() {
        let pods = [pod("a", 8080, "web", json!([]))];
        let settings = Settings {
            enabled: true,
            additional_ports: vec![9100, 9100],
        };
        let np = network_policy("shop", "api", owner(), &settings, &pods);
        let v = serde_json::to_value(&np).unwrap();
        assert_eq!(v["metadata"]["name"], "sluice-policy-api");
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u1");
        assert_eq!(
            v["spec"],
            json!({
                "podSelector": {"matchLabels": {"sluice.dev/policy": "api"}},
                "policyTypes": ["Ingress"],
                "ingress": [{"ports": [
                    {"port": "http", "protocol": "TCP"},
                    {"port": "sluice", "protocol": "TCP"},
                    {"port": "sluice-admin", "protocol": "TCP"},
                    {"port": "web", "protocol": "TCP"},
                    {"port": 9100, "protocol": "TCP"}
                ]}]
            })
        );
        assert!(
            !v.to_string().contains("8080"),
            "the app's port is never admitted"
        );
    }

    #[test]
    fn a_name_an_app_container_uses_on_some_governed_pod_is_not_admitted() {
        let pods = [
            pod("a", 8080, "web", json!([{"name": "http", "containerPort": 8081}])),
            pod("b", 8080, "http", json!([])),
        ];
        assert_eq!(
            admitted_port_names(&pods),
            ["sluice", "sluice-admin", "web"],
            "on pod a, http is an app port"
        );
        assert_eq!(admitted_port_names(&[]), ["http", "sluice", "sluice-admin"]);
    }

    #[test]
    fn services_targeting_the_app_port_by_number_or_by_its_name_are_exposures() {
        let pods = [pod(
            "a",
            8080,
            "http",
            json!([{"name": "metrics", "containerPort": 9100}, {"name": "raw", "containerPort": 8080}]),
        )];
        let services = [
            service("by-name", json!([{"port": 80, "targetPort": "http"}])),
            service("by-number", json!([{"port": 80, "targetPort": 8080}])),
            service("by-port", json!([{"port": 8080}])),
            service("by-app-name", json!([{"port": 80, "targetPort": "raw"}])),
            service("metrics", json!([{"port": 9100, "targetPort": "metrics"}])),
            service("udp", json!([{"port": 8080, "protocol": "UDP"}])),
        ];
        let found: Vec<String> = exposures(&pods, &services)
            .iter()
            .map(|e| e.to_string())
            .collect();
        assert_eq!(
            found,
            [
                "Service by-app-name port 80 targets port name \"raw\" (the app's port 8080)",
                "Service by-number port 80 targets port 8080 (the app's port 8080)",
                "Service by-port port 8080 targets port 8080 (the app's port 8080)",
            ]
        );
    }

    #[test]
    fn services_selecting_other_pods_or_nothing_are_not_exposures() {
        let pods = [pod("a", 8080, "http", json!([]))];
        let mut other = service("other", json!([{"port": 8080}]));
        other.spec.as_mut().unwrap().selector = Some(BTreeMap::from([("app".into(), "db".into())]));
        let mut headless = service("manual", json!([{"port": 8080}]));
        headless.spec.as_mut().unwrap().selector = None;
        assert_eq!(exposures(&pods, &[other, headless]), vec![]);
    }

    #[test]
    fn the_app_port_comes_from_the_sidecars_upstream() {
        assert_eq!(app_port(&pod("a", 3000, "http", json!([]))), Some(3000));
        let bare: Pod = serde_json::from_value(json!({"spec": {"containers": []}})).unwrap();
        assert_eq!(app_port(&bare), None);
    }
}
