//! A stand-in for the HorizontalPodAutoscaler controller, so queue-depth scaling can be tested without a
//! cluster: for each `autoscaling/v2` HPA whose metrics are `External` with an `AverageValue` (or
//! `Value`) target, it reads the external metrics API and sets the target's `/scale` with the
//! autoscaling/v2 algorithm.
//!
//! What it implements of kube-controller-manager's `podautoscaler`:
//! - `AverageValue`: desired = ceil(total / target); `Value`: desired = ceil(current × total / target).
//!   Inside the 10 % tolerance (|usage ratio − 1| ≤ 0.1) the current count is kept.
//! - Several metrics: the largest proposal wins.
//! - Stabilization: the recommendation is bounded by the recommendations of the last
//!   `behavior.scaleDown.stabilizationWindowSeconds` (default 300 s) from above and of
//!   `behavior.scaleUp.stabilizationWindowSeconds` (default 0 s) from below, with an injectable clock.
//! - Clamp to `minReplicas` (default 1) ..= `maxReplicas`.
//! - A target at 0 replicas is left alone (as the real HPA does: scaling is disabled at 0; Sluice's
//!   operator does 0↔1 itself).
//!
//! Not implemented: scaling `policies` (rate limits per period), `selectPolicy`, Resource/Pods/Object
//! metrics, and the readiness-based corrections for CPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscaler, MetricSpec};
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The HPA controller's default tolerance (`--horizontal-pod-autoscaler-tolerance`).
pub const TOLERANCE_DEFAULT: f64 = 0.1;
/// Default scale-down stabilization window of `autoscaling/v2`.
pub const SCALE_DOWN_WINDOW_DEFAULT: Duration = Duration::from_secs(300);
/// How often [`HpaController::run`] syncs by default (kube-controller-manager's default is 15 s).
pub const SYNC_PERIOD_DEFAULT: Duration = Duration::from_secs(15);

/// What a metric's target asks for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// `AverageValue`: the total divided by the replica count should be this.
    AverageValue(f64),
    /// `Value`: the total should be this.
    Value(f64),
}

/// Replicas one metric proposes, given the current count and the metric's total over all series.
/// Pure: the autoscaling/v2 formula with the tolerance.
pub fn proposal(current: i32, total: f64, target: Target, tolerance: f64) -> i32 {
    match target {
        Target::AverageValue(per_pod) => {
            if per_pod <= 0.0 {
                return current;
            }
            if current > 0 {
                let ratio = total / (per_pod * f64::from(current));
                if (1.0 - ratio).abs() <= tolerance {
                    return current;
                }
            }
            (total / per_pod).ceil() as i32
        }
        Target::Value(value) => {
            if value <= 0.0 {
                return current;
            }
            let ratio = total / value;
            if (1.0 - ratio).abs() <= tolerance {
                return current;
            }
            (ratio * f64::from(current)).ceil() as i32
        }
    }
}

/// Past recommendations of one HPA, to apply the stabilization windows. Pure: `now` is an argument.
#[derive(Debug, Default, Clone)]
pub struct Stabilizer {
    recommendations: Vec<(Instant, i32)>,
}

impl Stabilizer {
    /// Records `recommendation` at `now` and returns the stabilized count, as kube-controller-manager's
    /// `stabilizeRecommendationWithBehaviors` does: no lower than the smallest recommendation within the
    /// scale-up window, no higher than the largest within the scale-down window, else `current`.
    pub fn stabilize(
        &mut self,
        now: Instant,
        current: i32,
        recommendation: i32,
        up_window: Duration,
        down_window: Duration,
    ) -> i32 {
        let longest = up_window.max(down_window);
        self.recommendations
            .retain(|(at, _)| now.saturating_duration_since(*at) <= longest);
        let mut up = recommendation;
        let mut down = recommendation;
        for (at, rec) in &self.recommendations {
            let age = now.saturating_duration_since(*at);
            if age < up_window {
                up = up.min(*rec);
            }
            if age < down_window {
                down = down.max(*rec);
            }
        }
        self.recommendations.push((now, recommendation));
        current.max(up).min(down)
    }
}

/// Desired replicas of an HPA given its metrics' totals (in the order of `spec.metrics`), before
/// stabilization: the largest proposal, or `current` when no metric could be read.
pub fn recommend(current: i32, totals: &[(Target, f64)], tolerance: f64) -> i32 {
    totals
        .iter()
        .map(|(target, total)| proposal(current, *total, *target, tolerance))
        .max()
        .unwrap_or(current)
}

/// Clamps to `min..=max` (`min` at least 1, like the API server's default).
pub fn clamp(replicas: i32, min: i32, max: i32) -> i32 {
    replicas.max(min.max(1)).min(max.max(min.max(1)))
}

/// A source of `Instant`s, injectable so tests can drive the stabilization window.
pub trait Clock: Send + Sync {
    /// The current instant.
    fn now(&self) -> Instant;
}

/// The real clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<Instant>>);

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock(Arc::new(Mutex::new(Instant::now())))
    }
}

impl ManualClock {
    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Parses a Kubernetes quantity (`12`, `1500m`, `2k`, `1Ki`, `1e3`) into a float.
pub fn parse_quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let suffixes: [(&str, f64); 13] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ];
    for (suffix, factor) in suffixes {
        if let Some(number) = q.strip_suffix(suffix) {
            return number.parse::<f64>().ok().map(|n| n * factor);
        }
    }
    q.parse::<f64>().ok().filter(|n| n.is_finite())
}

/// Plays the HPA controller against one API server and one external metrics API.
pub struct HpaController {
    client: kube::Client,
    metrics: kube::Client,
    namespace: Option<String>,
    clock: Arc<dyn Clock>,
    tolerance: f64,
    stabilizers: HashMap<(String, String), Stabilizer>,
}

impl HpaController {
    /// `client` reads HPAs and writes `/scale`; `metrics` is a client whose base URL serves
    /// `/apis/external.metrics.k8s.io/v1beta1/...` — the API server itself when the operator's APIService
    /// is registered there, or the operator's (or a test's) metrics endpoint directly. `namespace`:
    /// one namespace, or all.
    ///
    /// Through the API server, `metrics` is who the HPA controller is: the aggregator names its user to
    /// the metrics API (`X-Remote-User`), which asks the API server whether that user may read the
    /// metric. A client made with `TestApiServer::client_with_token` for
    /// `system:serviceaccount:kube-system:horizontal-pod-autoscaler` plays the real controller's
    /// identity; a user on the server's deny list gets the metrics API's 403 and no scaling.
    pub fn new(
        client: kube::Client,
        metrics: kube::Client,
        namespace: Option<&str>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        HpaController {
            client,
            metrics,
            namespace: namespace.map(str::to_string),
            clock,
            tolerance: TOLERANCE_DEFAULT,
            stabilizers: HashMap::new(),
        }
    }

    /// Syncs every HPA once; errors of one HPA are logged and do not stop the others. Returns the
    /// desired replicas set per `(namespace, hpa name)`.
    pub async fn sync_once(&mut self) -> Result<HashMap<(String, String), i32>> {
        let api: Api<HorizontalPodAutoscaler> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let mut out = HashMap::new();
        for hpa in api.list(&ListParams::default()).await? {
            let ns = hpa.metadata.namespace.clone().unwrap_or_default();
            let name = hpa.metadata.name.clone().unwrap_or_default();
            match self.sync_hpa(&hpa).await {
                Ok(Some(desired)) => {
                    out.insert((ns, name), desired);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(namespace = %ns, hpa = %name, error = %e, "hpa stand-in: sync failed")
                }
            }
        }
        Ok(out)
    }

    /// Runs [`HpaController::sync_once`] every `period` until `shutdown` resolves.
    pub async fn run(mut self, period: Duration, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = tick.tick() => {
                    if let Err(e) = self.sync_once().await {
                        tracing::warn!(error = %e, "hpa stand-in: listing HPAs failed");
                    }
                }
            }
        }
    }

    async fn sync_hpa(&mut self, hpa: &HorizontalPodAutoscaler) -> Result<Option<i32>> {
        let ns = hpa.metadata.namespace.clone().unwrap_or_default();
        let name = hpa.metadata.name.clone().unwrap_or_default();
        let spec = hpa
            .spec
            .as_ref()
            .ok_or_else(|| Error::Decode("hpa without spec".into()))?;
        let target_ref = &spec.scale_target_ref;
        let (group, version) = match target_ref
            .api_version
            .as_deref()
            .unwrap_or("apps/v1")
            .split_once('/')
        {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), target_ref.api_version.clone().unwrap_or_default()),
        };
        let gvk = GroupVersionKind::gvk(&group, &version, &target_ref.kind);
        let (resource, _) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        let targets: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &ns, &resource);
        let scale = targets.get_scale(&target_ref.name).await?;
        let current = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        if current == 0 {
            return Ok(None);
        }
        let mut totals = vec![];
        for metric in spec.metrics.iter().flatten() {
            if let Some(t) = self.external_total(&ns, metric).await? {
                totals.push(t);
            }
        }
        let raw = recommend(current, &totals, self.tolerance);
        let behavior = spec.behavior.as_ref();
        let window = |rules: Option<&k8s_openapi::api::autoscaling::v2::HPAScalingRules>,
                      default: Duration| {
            rules
                .and_then(|r| r.stabilization_window_seconds)
                .map(|s| Duration::from_secs(s.max(0) as u64))
                .unwrap_or(default)
        };
        let down = window(
            behavior.and_then(|b| b.scale_down.as_ref()),
            SCALE_DOWN_WINDOW_DEFAULT,
        );
        let up = window(behavior.and_then(|b| b.scale_up.as_ref()), Duration::ZERO);
        let now = self.clock.now();
        let stable = self
            .stabilizers
            .entry((ns.clone(), name.clone()))
            .or_default()
            .stabilize(now, current, raw, up, down);
        let desired = clamp(stable, spec.min_replicas.unwrap_or(1), spec.max_replicas);
        if desired != current {
            targets
                .patch_scale(
                    &target_ref.name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": desired}})),
                )
                .await?;
        }
        let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(self.client.clone(), &ns);
        let status = json!({"status": {"currentReplicas": current, "desiredReplicas": desired}});
        if let Err(e) = hpas
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
            .await
        {
            tracing::debug!(error = %e, "hpa stand-in: status not written");
        }
        Ok(Some(desired))
    }

    /// The total of an External metric and its target, or `None` for other metric types.
    async fn external_total(&self, ns: &str, metric: &MetricSpec) -> Result<Option<(Target, f64)>> {
        let Some(external) = metric.external.as_ref().filter(|_| metric.type_ == "External") else {
            return Ok(None);
        };
        let target = &external.target;
        let target = match target.type_.as_str() {
            "AverageValue" => target
                .average_value
                .as_ref()
                .and_then(|q| parse_quantity(&q.0))
                .map(Target::AverageValue),
            "Value" => target
                .value
                .as_ref()
                .and_then(|q| parse_quantity(&q.0))
                .map(Target::Value),
            _ => None,
        };
        let Some(target) = target else {
            return Ok(None);
        };
        let selector = external
            .metric
            .selector
            .as_ref()
            .map(selector_string)
            .unwrap_or_default();
        let mut path = format!(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{}",
            external.metric.name
        );
        if !selector.is_empty() {
            path.push_str("?labelSelector=");
            path.push_str(&url::form_urlencoded::byte_serialize(selector.as_bytes()).collect::<String>());
        }
        let request = http::Request::get(&path)
            .body(vec![])
            .map_err(|e| Error::Config(e.to_string()))?;
        let list: Value = self.metrics.request(request).await?;
        let total = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item["value"].as_str().and_then(parse_quantity))
            .sum();
        Ok(Some((target, total)))
    }
}

/// A label selector written as the `labelSelector` query parameter (`a=b,c in (d,e)`).
pub fn selector_string(selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector) -> String {
    let mut parts: Vec<String> = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for expr in selector.match_expressions.iter().flatten() {
        let values = expr.values.clone().unwrap_or_default().join(",");
        parts.push(match expr.operator.as_str() {
            "In" => format!("{} in ({values})", expr.key),
            "NotIn" => format!("{} notin ({values})", expr.key),
            "Exists" => expr.key.clone(),
            _ => format!("!{}", expr.key),
        });
    }
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn average_value_proposals_follow_the_autoscaling_v2_formula() {
        // (current, total, per-pod target, expected)
        let table = [
            (1, 100.0, 10.0, 10), // ceil(100 / 10)
            (3, 31.0, 10.0, 3),   // ratio 1.03: inside the tolerance
            (3, 34.0, 10.0, 4),   // ratio 1.13: ceil(3.4)
            (4, 10.0, 10.0, 1),   // scale in to ceil(10 / 10)
            (5, 0.0, 10.0, 0),    // nothing to do: 0, clamped later
            (2, 1.0, 0.5, 2),     // ratio 1.0
            (10, 95.0, 10.0, 10), // ratio 0.95: inside the tolerance
            (10, 89.0, 10.0, 9),  // ratio 0.89: outside
        ];
        for (current, total, target, expected) in table {
            assert_eq!(
                proposal(current, total, Target::AverageValue(target), TOLERANCE_DEFAULT),
                expected,
                "current {current}, total {total}, target {target}"
            );
        }
    }

    #[test]
    fn value_proposals_scale_the_current_count_by_the_ratio() {
        assert_eq!(proposal(2, 40.0, Target::Value(10.0), 0.1), 8);
        assert_eq!(proposal(2, 10.5, Target::Value(10.0), 0.1), 2);
        assert_eq!(proposal(4, 5.0, Target::Value(10.0), 0.1), 2);
    }

    #[test]
    fn the_largest_metric_proposal_wins_and_clamping_bounds_it() {
        let totals = [
            (Target::AverageValue(10.0), 20.0),
            (Target::AverageValue(5.0), 50.0),
        ];
        assert_eq!(recommend(1, &totals, 0.1), 10);
        assert_eq!(recommend(3, &[], 0.1), 3);
        assert_eq!(clamp(10, 1, 5), 5);
        assert_eq!(clamp(0, 2, 5), 2);
        assert_eq!(clamp(0, 0, 5), 1);
    }

    #[test]
    fn scale_down_waits_out_the_stabilization_window_but_scale_up_does_not() {
        let mut s = Stabilizer::default();
        let t0 = Instant::now();
        let window = Duration::from_secs(60);
        assert_eq!(s.stabilize(t0, 1, 8, Duration::ZERO, window), 8);
        // Load drops: the last minute's highest recommendation (8) holds.
        assert_eq!(
            s.stabilize(t0 + Duration::from_secs(30), 8, 2, Duration::ZERO, window),
            8
        );
        // Once the 8 is older than the window, the highest left is 2.
        assert_eq!(
            s.stabilize(t0 + Duration::from_secs(61), 8, 2, Duration::ZERO, window),
            2
        );
        // Scale up is immediate.
        assert_eq!(
            s.stabilize(t0 + Duration::from_secs(62), 2, 9, Duration::ZERO, window),
            9
        );
    }

    #[test]
    fn quantities_parse_with_their_suffixes() {
        assert_eq!(parse_quantity("12"), Some(12.0));
        assert_eq!(parse_quantity("1500m"), Some(1.5));
        assert_eq!(parse_quantity("2k"), Some(2000.0));
        assert_eq!(parse_quantity("1Ki"), Some(1024.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("x"), None);
    }
}
