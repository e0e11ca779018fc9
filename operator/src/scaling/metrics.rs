//! Prometheus metrics of JobQueues: depth per queue and state, scale decisions by reason, and the
//! latency of external-metric requests. Their own registry (prefix `sluice_operator`); the operator's
//! `/metrics` appends [`JobQueueMetrics::encode`].

use std::sync::Mutex;

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use sluice_queue::Depth;

type Labels = Vec<(&'static str, String)>;

/// JobQueue metrics.
#[derive(Debug)]
pub struct JobQueueMetrics {
    registry: Mutex<Registry>,
    depth: Family<Labels, Gauge>,
    decisions: Family<Labels, Counter>,
    requests: Family<Labels, Histogram>,
    activation: Histogram,
}

impl Default for JobQueueMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sluice_operator");
        let depth = Family::<Labels, Gauge>::default();
        let decisions = Family::<Labels, Counter>::default();
        let requests = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 3.0])
        });
        let activation = Histogram::new([0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 30.0]);
        registry.register(
            "jobqueue_depth",
            "Jobs per JobQueue and state (ready, blocked, scheduled, running, retrying, dead), at the last read",
            depth.clone(),
        );
        registry.register(
            "jobqueue_scale_decisions",
            "Replica changes the operator made itself, by reason (Activated, CooledDown, BelowMin, ...)",
            decisions.clone(),
        );
        registry.register(
            "external_metrics_request_duration_seconds",
            "Latency of external.metrics.k8s.io requests, by result (ok, not_found, bad_request, unavailable, unauthorized, forbidden, authorization_error)",
            requests.clone(),
        );
        registry.register(
            "jobqueue_activation_seconds",
            "From a NOTIFY on enqueue to the 0->1 scale call",
            activation.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            depth,
            decisions,
            requests,
            activation,
        }
    }
}

impl JobQueueMetrics {
    /// Records a depth read of `namespace/name`.
    pub fn set_depth(&self, namespace: &str, name: &str, d: &Depth) {
        for (state, v) in [
            ("ready", d.ready),
            ("blocked", d.blocked),
            ("scheduled", d.scheduled),
            ("running", d.running),
            ("retrying", d.retrying),
            ("dead", d.dead),
        ] {
            self.depth
                .get_or_create(&vec![
                    ("namespace", namespace.to_owned()),
                    ("jobqueue", name.to_owned()),
                    ("state", state.to_owned()),
                ])
                .set(v);
        }
    }

    /// Forgets the depth of a deleted JobQueue.
    pub fn forget(&self, namespace: &str, name: &str) {
        for state in ["ready", "blocked", "scheduled", "running", "retrying", "dead"] {
            self.depth.remove(&vec![
                ("namespace", namespace.to_owned()),
                ("jobqueue", name.to_owned()),
                ("state", state.to_owned()),
            ]);
        }
    }

    /// Counts a scale decision.
    pub fn scaled(&self, reason: &'static str) {
        self.decisions
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }

    /// How many scale decisions of `reason` were made (for tests).
    pub fn scale_decisions(&self, reason: &'static str) -> u64 {
        self.decisions
            .get_or_create(&vec![("reason", reason.to_owned())])
            .get()
    }

    /// Observes an external-metric request.
    pub fn request(&self, result: &'static str, seconds: f64) {
        self.requests
            .get_or_create(&vec![("result", result.to_owned())])
            .observe(seconds);
    }

    /// Observes a NOTIFY-to-scale latency.
    pub fn activation(&self, seconds: f64) {
        self.activation.observe(seconds);
    }

    /// The text exposition format (without the `# EOF` line, so it can be appended to another).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        // Writing into a String cannot fail.
        encode(&mut out, &registry).expect("metrics encode");
        out.trim_end_matches("# EOF\n").to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_and_decisions_are_exported() {
        let m = JobQueueMetrics::default();
        let d = Depth {
            queue: "emails".into(),
            ready: 7,
            blocked: 5,
            scheduled: 1,
            retrying: 2,
            running: 3,
            dead: 4,
            oldest_ready_age_ms: 0,
            paused: false,
        };
        m.set_depth("shop", "emails", &d);
        m.scaled("Activated");
        m.request("ok", 0.002);
        let text = m.encode();
        assert!(
            text.contains(
                r#"sluice_operator_jobqueue_depth{namespace="shop",jobqueue="emails",state="ready"} 7"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"sluice_operator_jobqueue_depth{namespace="shop",jobqueue="emails",state="blocked"} 5"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"sluice_operator_jobqueue_scale_decisions_total{reason="Activated"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("sluice_operator_external_metrics_request_duration_seconds"),
            "{text}"
        );
    }
}
