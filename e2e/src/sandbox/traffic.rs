//! Steady client traffic to the sandbox's `web` pods, through their sidecars, counted by outcome.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::deployments::is_ready;
use crate::kubelet::Kubelet;

/// Outcomes so far.
#[derive(Debug, Default)]
pub struct Counters {
    /// 2xx answers.
    pub allowed: AtomicU64,
    /// 429 answers.
    pub limited: AtomicU64,
    /// Anything else, connection failures included.
    pub errors: AtomicU64,
}

impl Counters {
    /// `(allowed, limited, errors)` so far.
    pub fn snapshot(&self) -> (u64, u64, u64) {
        (
            self.allowed.load(Ordering::Relaxed),
            self.limited.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }
}

/// Sends `per_second` requests a second, round robin over the Ready pods labelled `selector` in
/// `namespace` (their sidecar's `http` port), until `shutdown` resolves.
pub async fn run(
    client: kube::Client,
    kubelet: Kubelet,
    namespace: String,
    selector: String,
    per_second: u32,
    counters: Arc<Counters>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let mut ports: Vec<u16> = vec![];
    let mut refresh = tokio::time::interval(Duration::from_secs(1));
    let mut send = tokio::time::interval(Duration::from_secs(1) / per_second.max(1));
    send.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut next = 0usize;
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = refresh.tick() => {
                if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
                    ports = list
                        .items
                        .iter()
                        .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
                        .filter_map(|p| kubelet.port(&namespace, p.metadata.name.as_deref()?, "http"))
                        .collect();
                }
            }
            _ = send.tick() => {
                if ports.is_empty() {
                    continue;
                }
                let port = ports[next % ports.len()];
                next = next.wrapping_add(1);
                let counters = counters.clone();
                tokio::spawn(async move {
                    let counter = match crate::http::get(port, "/").await {
                        Ok(r) if (200..300).contains(&r.status) => &counters.allowed,
                        Ok(r) if r.status == 429 => &counters.limited,
                        _ => &counters.errors,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                });
            }
        }
    }
}
