//! Prometheus metrics of the operator, served at `/metrics` by every replica.
//!
//! Names follow controller-runtime's where one exists, so dashboards built for Go operators read ours:
//! `*_reconcile_total`, `*_reconcile_errors_total{reason}`, `*_reconcile_time_seconds`.

use std::time::Instant;

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

type Labels = Vec<(&'static str, String)>;

/// The operator's metrics and the registry they are encoded from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    duration: Family<Labels, Histogram>,
    admissions: Family<Labels, Counter>,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("sluice_operator");
        let reconciles = Family::<Labels, Counter>::default();
        let errors = Family::<Labels, Counter>::default();
        let duration = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0])
        });
        let admissions = Family::<Labels, Counter>::default();
        let leader = Gauge::default();
        registry.register(
            "reconcile",
            "Reconciles started, by controller",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by controller and reason",
            errors.clone(),
        );
        registry.register(
            "reconcile_time_seconds",
            "How long reconciles take, by controller",
            duration.clone(),
        );
        registry.register(
            "admissions",
            "Pod admission reviews answered, by result (injected, skipped, rejected, error)",
            admissions.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        Self {
            registry,
            reconciles,
            errors,
            duration,
            admissions,
            leader,
        }
    }
}

impl Metrics {
    /// Count a reconcile of `controller` and time it until the returned guard drops.
    pub fn reconcile(&self, controller: &'static str) -> ReconcileTimer {
        let labels = vec![("controller", controller.to_owned())];
        self.reconciles.get_or_create(&labels).inc();
        ReconcileTimer {
            histogram: self.duration.get_or_create(&labels).clone(),
            start: Instant::now(),
        }
    }

    /// Count a failed reconcile, by the error's [`crate::Error::metric_label`].
    pub fn reconcile_error(&self, controller: &'static str, reason: &'static str) {
        self.errors
            .get_or_create(&vec![
                ("controller", controller.to_owned()),
                ("reason", reason.to_owned()),
            ])
            .inc();
    }

    /// Count an admission review by its result.
    pub fn admission(&self, result: &'static str) {
        self.admissions
            .get_or_create(&vec![("result", result.to_owned())])
            .inc();
    }

    /// Record whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The current value of a reconcile error counter (for tests and health reports).
    pub fn reconcile_errors(&self, controller: &'static str, reason: &'static str) -> u64 {
        self.errors
            .get_or_create(&vec![
                ("controller", controller.to_owned()),
                ("reason", reason.to_owned()),
            ])
            .get()
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        encode(&mut out, &self.registry).expect("metrics encode");
        out
    }
}

/// Observes a reconcile's duration when dropped, so every return path is measured.
#[derive(Debug)]
pub struct ReconcileTimer {
    histogram: Histogram,
    start: Instant,
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        self.histogram.observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciles_errors_and_durations_are_exported() {
        let m = Metrics::default();
        drop(m.reconcile("ratelimitpolicy"));
        m.reconcile_error("ratelimitpolicy", "secret_not_found");
        m.admission("injected");
        let text = m.encode();
        assert!(
            text.contains(r#"sluice_operator_reconcile_total{controller="ratelimitpolicy"} 1"#),
            "{text}"
        );
        assert!(text.contains(
            r#"sluice_operator_reconcile_errors_total{controller="ratelimitpolicy",reason="secret_not_found"} 1"#
        ));
        assert!(
            text.contains(r#"sluice_operator_reconcile_time_seconds_count{controller="ratelimitpolicy"} 1"#)
        );
        assert!(text.contains(r#"sluice_operator_admissions_total{result="injected"} 1"#));
        assert_eq!(m.reconcile_errors("ratelimitpolicy", "secret_not_found"), 1);
    }
}
