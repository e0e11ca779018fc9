//! Prometheus metrics of the queue worker: jobs started/succeeded/failed/dead/cancelled by queue and kind,
//! handler duration, claim batch sizes, lost leases and depth gauges; and, in a sidecar serving the gRPC
//! worker API, its streams waiting to be let in and refused.

use prometheus_client::{
    encoding::text::encode,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

type QueueKind = [(&'static str, String); 2];
type QueueOnly = [(&'static str, String); 1];
type QueueState = [(&'static str, String); 2];
type Reason = [(&'static str, &'static str); 1];

fn duration_histogram() -> Histogram {
    Histogram::new([
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        300.0,
    ])
}

fn batch_histogram() -> Histogram {
    Histogram::new([1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0])
}

/// The worker's metrics and their registry.
pub struct QueueMetrics {
    registry: Registry,
    started: Family<QueueKind, Counter>,
    succeeded: Family<QueueKind, Counter>,
    failed: Family<QueueKind, Counter>,
    dead: Family<QueueKind, Counter>,
    cancelled: Family<QueueKind, Counter>,
    lost: Family<QueueOnly, Counter>,
    duration: Family<QueueKind, Histogram, fn() -> Histogram>,
    claim_batch: Family<QueueOnly, Histogram, fn() -> Histogram>,
    depth: Family<QueueState, Gauge>,
    claims_paused: Gauge,
    claims_returned: Family<QueueOnly, Counter>,
    grpc_pending: Gauge,
    grpc_refused: Family<Reason, Counter>,
    /// The kinds labelled so far (at most [`KINDS_MAX`]), as their labels read.
    kinds: std::sync::Mutex<std::collections::HashMap<String, String>>,
}

/// Most distinct job kinds the worker labels its metrics with; jobs of further kinds are counted under
/// [`OTHER_KIND`]. A kind is any text whoever enqueues chooses, and every one would otherwise be a
/// series of five counters and a histogram, kept for the life of the process.
pub const KINDS_MAX: usize = 100;

/// The `kind` label of jobs past [`KINDS_MAX`] kinds.
pub const OTHER_KIND: &str = "(other)";

impl Default for QueueMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for QueueMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueMetrics").finish_non_exhaustive()
    }
}

impl QueueMetrics {
    /// Fresh metrics in their own registry, for a worker that serves no gRPC worker API: the
    /// `sluice_grpc_streams_*` metrics are not listed (counting them is harmless and shows nowhere).
    pub fn new() -> Self {
        Self::registered(false)
    }

    /// [`Self::new`], listing the gRPC worker API's stream metrics too (`sluice_grpc_streams_pending`,
    /// `sluice_grpc_streams_refused_total`): for a worker serving that API.
    pub fn with_grpc_streams() -> Self {
        Self::registered(true)
    }

    fn registered(grpc_streams: bool) -> Self {
        let mut registry = Registry::default();
        let started = Family::default();
        let succeeded = Family::default();
        let failed = Family::default();
        let dead = Family::default();
        let cancelled = Family::default();
        let lost = Family::default();
        let duration = Family::new_with_constructor(duration_histogram as fn() -> Histogram);
        let claim_batch = Family::new_with_constructor(batch_histogram as fn() -> Histogram);
        let depth = Family::default();
        let claims_paused = Gauge::default();
        let claims_returned = Family::default();
        let grpc_pending = Gauge::default();
        let grpc_refused = Family::default();
        registry.register("sluice_jobs_started", "Job attempts started", started.clone());
        registry.register("sluice_jobs_succeeded", "Jobs that succeeded", succeeded.clone());
        registry.register(
            "sluice_jobs_failed",
            "Job attempts that failed and will be retried",
            failed.clone(),
        );
        registry.register("sluice_jobs_dead", "Jobs dead-lettered", dead.clone());
        registry.register(
            "sluice_jobs_cancelled",
            "Jobs cancelled while running",
            cancelled.clone(),
        );
        registry.register(
            "sluice_jobs_lease_lost",
            "Attempts whose lease was lost before they finished (their result was discarded)",
            lost.clone(),
        );
        registry.register(
            "sluice_job_handler_duration_seconds",
            "Time the handler took per attempt",
            duration.clone(),
        );
        registry.register(
            "sluice_claim_batch_size",
            "Jobs claimed per claim query",
            claim_batch.clone(),
        );
        registry.register(
            "sluice_queue_depth",
            "Jobs per queue and state (ready, blocked, scheduled, retrying, running, dead)",
            depth.clone(),
        );
        registry.register(
            "sluice_worker_claims_paused",
            "Worker engines whose claims are paused because the database refuses to record finished jobs \
             (one per paused gRPC worker stream)",
            claims_paused.clone(),
        );
        registry.register(
            "sluice_jobs_claims_returned",
            "Jobs a claim given up unanswered leased to this worker, handed back with their attempt not counted",
            claims_returned.clone(),
        );
        if grpc_streams {
            registry.register(
                "sluice_grpc_streams_pending",
                "gRPC worker streams opened and not yet let in or refused",
                grpc_pending.clone(),
            );
            registry.register(
                "sluice_grpc_streams_refused",
                "gRPC worker streams refused before they were let in, or that could not start once let in, by reason",
                grpc_refused.clone(),
            );
        }
        Self {
            registry,
            started,
            succeeded,
            failed,
            dead,
            cancelled,
            lost,
            duration,
            claim_batch,
            depth,
            claims_paused,
            claims_returned,
            grpc_pending,
            grpc_refused,
            kinds: Default::default(),
        }
    }

    /// The labels of `queue` and `kind`: the kind escaped as the text format needs (the client library
    /// writes label values as they are, so a `"` or a line break in a kind would end the value and
    /// write lines of its own), or [`OTHER_KIND`] past [`KINDS_MAX`] kinds. Queue names are checked
    /// on the way in and need neither.
    fn qk(&self, queue: &str, kind: &str) -> QueueKind {
        let kind = {
            let mut kinds = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
            match kinds.get(kind) {
                Some(label) => label.clone(),
                None if kinds.len() < KINDS_MAX => {
                    let label = escaped(kind);
                    kinds.insert(kind.to_owned(), label.clone());
                    label
                }
                None => OTHER_KIND.to_owned(),
            }
        };
        [("queue", queue.to_owned()), ("kind", kind)]
    }

    /// An attempt started.
    pub fn started(&self, queue: &str, kind: &str) {
        self.started.get_or_create(&self.qk(queue, kind)).inc();
    }

    /// An attempt's handler finished after `secs`.
    pub fn handled(&self, queue: &str, kind: &str, secs: f64) {
        self.duration.get_or_create(&self.qk(queue, kind)).observe(secs);
    }

    /// `n` finished attempts of one queue and kind were recorded with `state`.
    pub fn finished_many(&self, queue: &str, kind: &str, state: &str, n: u64) {
        let family = match state {
            "succeeded" => &self.succeeded,
            "retrying" => &self.failed,
            "dead" => &self.dead,
            "cancelled" => &self.cancelled,
            _ => return,
        };
        family.get_or_create(&self.qk(queue, kind)).inc_by(n);
    }

    /// An attempt's lease was lost.
    pub fn lease_lost(&self, queue: &str) {
        self.lost.get_or_create(&[("queue", queue.to_owned())]).inc();
    }

    /// A claim query returned `n` jobs.
    pub fn claimed(&self, queue: &str, n: usize) {
        self.claim_batch
            .get_or_create(&[("queue", queue.to_owned())])
            .observe(n as f64);
    }

    /// Sets the depth gauges of a queue.
    pub fn set_depth(&self, d: &sluice_queue::Depth) {
        for (state, v) in [
            ("ready", d.ready),
            ("blocked", d.blocked),
            ("scheduled", d.scheduled),
            ("retrying", d.retrying),
            ("running", d.running),
            ("dead", d.dead),
        ] {
            self.depth
                .get_or_create(&[("queue", d.queue.clone()), ("state", state.to_owned())])
                .set(v);
        }
    }

    /// An engine's claims were paused (`true`) or resumed, as the database refused or again recorded
    /// finished jobs.
    pub fn claims_paused(&self, paused: bool) {
        if paused {
            self.claims_paused.inc();
        } else {
            self.claims_paused.dec();
        }
    }

    /// A job of `queue` that a claim given up unanswered leased to this worker was handed back.
    pub fn claim_returned(&self, queue: &str) {
        self.claims_returned
            .get_or_create(&[("queue", queue.to_owned())])
            .inc();
    }

    /// A gRPC worker stream opened: pending until [`Self::grpc_stream_settled`].
    pub fn grpc_stream_admitting(&self) {
        self.grpc_pending.inc();
    }

    /// A pending gRPC worker stream was let in, refused, or went away.
    pub fn grpc_stream_settled(&self) {
        self.grpc_pending.dec();
    }

    /// A gRPC worker stream was refused before it was let in, or could not start once let in; `reason`
    /// is one of a fixed set (the gRPC worker API's `Refused::reason`).
    pub fn grpc_refused(&self, reason: &'static str) {
        self.grpc_refused.get_or_create(&[("reason", reason)]).inc();
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// `value` as a label value of the text exposition format: `\`, `"` and a line feed escaped, other
/// control characters (which the format does not escape) replaced by U+FFFD.
fn escaped(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_cannot_write_lines_of_its_own_or_grow_the_series_without_bound() {
        let m = QueueMetrics::new();
        let forged = "x\"} 1\nsluice_queue_depth{queue=\"emails\",state=\"dead\"} 0\n#\\\r";
        m.started("emails", forged);
        let text = m.render();
        assert!(
            !text.lines().any(|l| l.starts_with("sluice_queue_depth")),
            "a forged sample: {text}"
        );
        assert!(
            text.contains(concat!(
                r#"kind="x\"} 1\nsluice_queue_depth{queue=\"emails\",state=\"dead\"} 0\n#\\"#,
                "\u{fffd}",
                r#""} 1"#
            )),
            "{text}"
        );
        for i in 0..KINDS_MAX * 2 {
            m.started("emails", &format!("kind-{i}"));
        }
        m.started("emails", "kind-0");
        let text = m.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("sluice_jobs_started_total{"))
            .count();
        assert_eq!(series, KINDS_MAX + 1, "{KINDS_MAX} kinds and the rest: {text}");
        assert!(text.contains(r#"sluice_jobs_started_total{queue="emails",kind="(other)"} 101"#));
        assert!(text.contains(r#"sluice_jobs_started_total{queue="emails",kind="kind-0"} 2"#));
    }

    #[test]
    fn depth_gauges_include_blocked() {
        let m = QueueMetrics::new();
        m.set_depth(&sluice_queue::Depth {
            queue: "emails".into(),
            ready: 7,
            blocked: 5,
            scheduled: 1,
            retrying: 2,
            running: 3,
            dead: 4,
            oldest_ready_age_ms: 0,
            paused: false,
        });
        let text = m.render();
        for line in [
            r#"sluice_queue_depth{queue="emails",state="ready"} 7"#,
            r#"sluice_queue_depth{queue="emails",state="blocked"} 5"#,
            r#"sluice_queue_depth{queue="emails",state="dead"} 4"#,
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
    }

    #[test]
    fn grpc_stream_metrics_are_listed_only_with_the_grpc_worker_api() {
        let http = QueueMetrics::new();
        http.grpc_stream_admitting();
        http.grpc_refused("gone");
        assert!(
            !http.render().contains("sluice_grpc_streams"),
            "{}",
            http.render()
        );

        let grpc = QueueMetrics::with_grpc_streams();
        let text = grpc.render();
        assert!(text.contains("sluice_grpc_streams_pending 0"), "{text}");
        grpc.grpc_stream_admitting();
        grpc.grpc_refused("gone");
        let text = grpc.render();
        assert!(text.contains("sluice_grpc_streams_pending 1"), "{text}");
        assert!(
            text.contains(r#"sluice_grpc_streams_refused_total{reason="gone"} 1"#),
            "{text}"
        );
    }
}
