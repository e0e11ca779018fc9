//! How many reconciles a controller runs at once, against the test API server (with a real Redis, and a
//! real PostgreSQL for the JobQueues): objects that exist before the controller starts are all
//! triggered together by its first list, and at most `Context::concurrency` of them are reconciled at
//! a time. Unbounded (kube-runtime's default), a thousand JobQueues reconciled together waited for the
//! one connection to their database until its acquire deadline failed them. Reconciles in flight are
//! counted from the operator's own `reconcile` spans, per controller.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use kube::api::PostParams;
use serde_json::json;
use sluice_crds::{job_queue::JobQueue, rate_limit_policy::RateLimitPolicy};
use sluice_e2e::{Env, wait_for};
use sluice_operator::{
    clock::system_clock,
    controller::{Context, job_queue, rate_limit_policy},
    metrics::Metrics,
    render::sidecar_container::SidecarSettings,
    scaling::{Databases, JobQueueMetrics},
};
use sluice_testsupport::{PgServer, RedisServer};
use tokio_util::sync::CancellationToken;
use tracing::{
    Subscriber,
    field::{Field, Visit},
    span,
};
use tracing_subscriber::{
    layer::{Context as LayerContext, Layer},
    prelude::*,
    registry::LookupSpan,
};

const DEADLINE: Duration = Duration::from_secs(60);

/// Reconciles in flight per controller, and the most seen at once.
#[derive(Default)]
struct InFlight {
    now: HashMap<String, usize>,
    most: HashMap<String, usize>,
}

fn in_flight() -> &'static Mutex<InFlight> {
    static IN_FLIGHT: OnceLock<Mutex<InFlight>> = OnceLock::new();
    IN_FLIGHT.get_or_init(Default::default)
}

/// The most reconciles of `controller` seen running at once.
fn most_at_once(controller: &str) -> usize {
    let counts = in_flight().lock().unwrap_or_else(|p| p.into_inner());
    counts.most.get(controller).copied().unwrap_or(0)
}

/// The `controller` field of a `reconcile` span, kept in the span's extensions until it closes.
struct ControllerName(String);

impl Visit for ControllerName {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "controller" {
            self.0 = value.to_owned();
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

/// Counts the operator's `reconcile` spans (one per reconcile, open from its start to its end).
struct CountReconciles;

impl<S> Layer<S> for CountReconciles
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: LayerContext<'_, S>) {
        if attrs.metadata().name() != "reconcile" {
            return;
        }
        let mut name = ControllerName(String::new());
        attrs.record(&mut name);
        let mut counts = in_flight().lock().unwrap_or_else(|p| p.into_inner());
        let now = counts.now.entry(name.0.clone()).or_default();
        *now += 1;
        let now = *now;
        let most = counts.most.entry(name.0.clone()).or_default();
        *most = (*most).max(now);
        drop(counts);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(name);
        }
    }

    fn on_close(&self, id: span::Id, ctx: LayerContext<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let extensions = span.extensions();
        let Some(name) = extensions.get::<ControllerName>() else {
            return;
        };
        let mut counts = in_flight().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(now) = counts.now.get_mut(&name.0) {
            *now = now.saturating_sub(1);
        }
    }
}

/// Installs the counter (once per test binary; the two tests count different controllers).
fn count_reconciles() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        tracing_subscriber::registry()
            .with(CountReconciles)
            .try_init()
            .expect("the only subscriber of this test binary");
    });
}

#[tokio::test]
async fn policies_that_exist_when_the_controller_starts_are_reconciled_at_most_two_at_a_time() {
    count_reconciles();
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let ns = env.namespace("concurrency").await.unwrap();
    let redis = RedisServer::start();
    ns.create_secret("redis", "url", &redis.url()).await.unwrap();
    let policies = ns.api::<RateLimitPolicy>();
    const POLICIES: usize = 12;
    for i in 0..POLICIES {
        let p: RateLimitPolicy = serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
            "metadata": {"name": format!("api-{i}")},
            "spec": {"selector": {"matchLabels": {"app": format!("api-{i}")}},
                     "redis": {"secretRef": {"name": "redis"}},
                     "rules": [{"name": "all", "limit": {"requests": 100, "window": "1m"}}]}
        }))
        .unwrap();
        policies.create(&PostParams::default(), &p).await.unwrap();
    }

    let ctx = Context::new(
        env.client(),
        Arc::new(Metrics::default()),
        Some("test".into()),
        system_clock(),
        rate_limit_policy::State::default(),
    )
    .with_concurrency(2);
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(rate_limit_policy::run(Arc::new(ctx), stop.cancelled_owned()));

    wait_for("every policy reconciled", DEADLINE, || {
        let policies = policies.clone();
        async move {
            let list = policies.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .all(|p| p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation)
                .then_some(())
        }
    })
    .await
    .unwrap();
    let most = most_at_once(rate_limit_policy::CONTROLLER);
    assert!(
        (1..=2).contains(&most),
        "{POLICIES} policies triggered together ran {most} reconciles at once with a bound of 2"
    );
}

#[tokio::test]
async fn job_queues_that_exist_when_the_controller_starts_are_reconciled_at_most_two_at_a_time() {
    count_reconciles();
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let ns = env.namespace("concurrency").await.unwrap();
    let pg = PgServer::start();
    ns.create_secret("pg", "url", &pg.url()).await.unwrap();
    let queues = ns.api::<JobQueue>();
    const QUEUES: usize = 8;
    for i in 0..QUEUES {
        let q: JobQueue = serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
            "metadata": {"name": format!("jobs-{i}")},
            "spec": {"database": {"secretRef": {"name": "pg"}},
                     "worker": {"template": {"spec": {"containers": [{"name": "handler", "image": "h:1"}]}},
                                "concurrency": 4},
                     "scaling": {"pollingInterval": "1h"}}
        }))
        .unwrap();
        queues.create(&PostParams::default(), &q).await.unwrap();
    }

    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let settings = job_queue::Settings {
        databases: Arc::new(Databases::with_ttl(Duration::ZERO)),
        metrics: Arc::new(JobQueueMetrics::default()),
        sidecar: SidecarSettings {
            image: "sluice-sidecar:test".into(),
            ..SidecarSettings::default()
        },
        namespace: "sluice-system".into(),
        external_metrics: true,
        namespaces: Default::default(),
    };
    let (state, wakes) = job_queue::State::new(settings, stop.clone());
    let ctx = Context::new(
        env.client(),
        Arc::new(Metrics::default()),
        Some("test".into()),
        system_clock(),
        state,
    )
    .with_concurrency(2);
    tokio::spawn(job_queue::run(Arc::new(ctx), wakes, stop.cancelled_owned()));

    wait_for("every JobQueue ready", DEADLINE, || {
        let queues = queues.clone();
        async move {
            let list = queues.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .all(|q| {
                    q.status.as_ref().and_then(|s| s.observed_generation) == q.metadata.generation
                        && q.condition("Ready").is_some_and(|c| c.status == "True")
                })
                .then_some(())
        }
    })
    .await
    .unwrap();
    let most = most_at_once(job_queue::CONTROLLER);
    assert!(
        (1..=2).contains(&most),
        "{QUEUES} JobQueues triggered together ran {most} reconciles at once with a bound of 2"
    );
}
