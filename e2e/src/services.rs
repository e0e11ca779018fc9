//! A stand-in for kube-proxy and the EndpointSlice controller, as far as the API server itself needs
//! Services: webhooks (`clientConfig.service`) and aggregated APIs (`APIService.spec.service`) name a
//! Service, and the in-memory server reaches the address [`crate::TestApiServer::route_service`] gave it.
//! [`ServiceRouter`] keeps those routes pointing at a Ready Pod the [`Kubelet`] stand-in runs.
//!
//! For each Service with a selector and each of its ports, the first Ready Pod (by name) that the
//! selector matches and the kubelet stand-in runs is chosen; the port's `targetPort` (a number or a
//! container port name) is mapped to that Pod's local port. A Service without such a Pod loses its
//! route, so calls fail as they would with no endpoints. Not implemented: load balancing over several
//! Pods, `sessionAffinity`, Services without selectors, traffic from processes to Services (processes
//! reach each other only through `127.0.0.1` ports they were given).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams};

use crate::deployments::is_ready;
use crate::error::Result;
use crate::kubelet::Kubelet;
use sluice_test_apiserver::State;

/// How often [`ServiceRouter::run`] re-reads Services and Pods by default.
pub const SYNC_PERIOD_DEFAULT: Duration = Duration::from_millis(200);

/// `(namespace, service, port)` → where it is served.
type Routes = HashMap<(String, String, u16), SocketAddr>;

/// Keeps the in-memory server's Service routes on Ready Pods of the kubelet stand-in.
pub struct ServiceRouter {
    client: kube::Client,
    state: Arc<State>,
    kubelet: Kubelet,
    routed: Routes,
}

impl ServiceRouter {
    /// A router writing into the server whose shared state is `state` (`TestApiServer::state`).
    pub fn new(client: kube::Client, state: Arc<State>, kubelet: Kubelet) -> Self {
        ServiceRouter {
            client,
            state,
            kubelet,
            routed: HashMap::new(),
        }
    }

    /// Recomputes every route once.
    pub async fn sync_once(&mut self) -> Result<()> {
        let services: Api<Service> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::all(self.client.clone());
        let services = services.list(&ListParams::default()).await?.items;
        let mut pods = pods.list(&ListParams::default()).await?.items;
        pods.retain(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none());
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut routes = Routes::new();
        for svc in &services {
            let ns = svc.metadata.namespace.clone().unwrap_or_default();
            let name = svc.metadata.name.clone().unwrap_or_default();
            let Some(spec) = &svc.spec else { continue };
            let Some(selector) = spec.selector.as_ref().filter(|s| !s.is_empty()) else {
                continue;
            };
            let endpoint = pods.iter().find(|p| {
                let pod_name = p.metadata.name.as_deref().unwrap_or_default();
                p.metadata.namespace.as_deref() == Some(ns.as_str())
                    && self.kubelet.is_running(&ns, pod_name)
                    && selector
                        .iter()
                        .all(|(k, v)| p.metadata.labels.as_ref().and_then(|l| l.get(k)) == Some(v))
            });
            let Some(pod) = endpoint else { continue };
            let pod_name = pod.metadata.name.clone().unwrap_or_default();
            for port in spec.ports.iter().flatten() {
                let target = match &port.target_port {
                    Some(IntOrString::String(s)) => s.clone(),
                    Some(IntOrString::Int(n)) => n.to_string(),
                    None => port.port.to_string(),
                };
                let (Ok(svc_port), Some(local)) = (
                    u16::try_from(port.port),
                    self.kubelet.port(&ns, &pod_name, &target),
                ) else {
                    continue;
                };
                routes.insert(
                    (ns.clone(), name.clone(), svc_port),
                    SocketAddr::from(([127, 0, 0, 1], local)),
                );
            }
        }
        // Only routes this router made are removed: tests may route other Services by hand.
        for (ns, name, port) in self.routed.keys() {
            if !routes.contains_key(&(ns.clone(), name.clone(), *port)) {
                self.state.unroute_service(ns, name, *port);
            }
        }
        for ((ns, name, port), addr) in &routes {
            self.state.route_service(ns, name, *port, *addr);
        }
        self.routed = routes;
        Ok(())
    }

    /// Runs [`ServiceRouter::sync_once`] every `period` until `shutdown` resolves.
    pub async fn run(mut self, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {
                    if let Err(e) = self.sync_once().await {
                        tracing::debug!(error = %e, "service stand-in: sync failed");
                    }
                }
            }
        }
    }
}
