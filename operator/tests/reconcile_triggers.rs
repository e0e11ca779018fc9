//! What triggers a reconcile, against the in-memory test API server (with a real Redis, and a real
//! PostgreSQL for the JobQueue): a controller's own status write, its own writes of the objects it owns
//! (creating them included), and re-applying owned objects that did not change, trigger none; an owned
//! object changed by someone else does. Every reconcile kube-runtime starts is recorded with the reason it gives
//! (its `reconciling object` span); absence is proven by a marker: a second object changed afterwards
//! and reconciled, which the watch delivers after whatever the first object's writes caused.

use std::{
    fmt::Debug,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use sluice_crds::{job_queue::JobQueue, rate_limit_policy::RateLimitPolicy};
use sluice_e2e::{Env, TestNamespace, wait_for};
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
};

const DEADLINE: Duration = Duration::from_secs(15);

/// One reconcile kube-runtime started: the object (`Kind.version.group/name.namespace`) and why.
#[derive(Clone, Debug)]
struct Started {
    object: String,
    reason: String,
}

fn started() -> &'static Mutex<Vec<Started>> {
    static STARTED: OnceLock<Mutex<Vec<Started>>> = OnceLock::new();
    STARTED.get_or_init(Default::default)
}

/// Records kube-runtime's `reconciling object` spans: one per reconcile, opened before it runs.
struct RecordReconciles;

impl<S: Subscriber> Layer<S> for RecordReconciles {
    fn on_new_span(&self, attrs: &span::Attributes<'_>, _: &span::Id, _: LayerContext<'_, S>) {
        if attrs.metadata().name() != "reconciling object" {
            return;
        }
        let mut fields = Started {
            object: String::new(),
            reason: String::new(),
        };
        attrs.record(&mut fields);
        started().lock().unwrap_or_else(|p| p.into_inner()).push(fields);
    }
}

impl Visit for Started {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        match field.name() {
            "object.ref" => self.object = format!("{value:?}"),
            "object.reason" => self.reason = format!("{value:?}"),
            _ => {}
        }
    }
}

/// Installs the recorder (once per test binary; each test's objects live in a namespace of their own).
fn record_reconciles() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        tracing_subscriber::registry()
            .with(RecordReconciles)
            .try_init()
            .expect("the only subscriber of this test binary");
    });
}

/// The reconciles started so far of object `name` in `ns`, by reason.
fn reconciles_of(ns: &TestNamespace, name: &str) -> Vec<String> {
    let suffix = format!("/{name}.{}", ns.name());
    started()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|s| s.object.ends_with(&suffix))
        .map(|s| s.reason.clone())
        .collect()
}

/// How many of `reasons` are the object's own watch event (creation, spec change or status write).
fn own_updates(reasons: &[String]) -> usize {
    reasons.iter().filter(|r| *r == "object updated").count()
}

fn policy(name: &str, requests: u64) -> RateLimitPolicy {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "redis": {"secretRef": {"name": "redis"}},
            "rules": [{"name": "all", "limit": {"requests": requests, "window": "1m"}}]
        }
    }))
    .unwrap()
}

/// Waits until policy `name`'s status is written for its generation with `enforcing` at `want`.
async fn policy_status(ns: &TestNamespace, name: &str, want: &str) -> RateLimitPolicy {
    let api = ns.api::<RateLimitPolicy>();
    wait_for(&format!("{name} enforcing {want}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            let status = p.status.as_ref()?;
            (status.observed_generation == p.metadata.generation && status.enforcing.as_deref() == Some(want))
                .then_some(p)
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_policys_own_status_writes_and_unchanged_owned_objects_do_not_reconcile_it_again() {
    record_reconciles();
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let ns = env.namespace("triggers").await.unwrap();
    let redis = RedisServer::start();
    ns.create_secret("redis", "url", &redis.url()).await.unwrap();
    let ctx = Arc::new(Context::new(
        env.client(),
        Arc::new(Metrics::default()),
        Some("test".into()),
        system_clock(),
        rate_limit_policy::State::default(),
    ));
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(rate_limit_policy::run(ctx, stop.cancelled_owned()));
    let policies = ns.api::<RateLimitPolicy>();

    // Created: reconciled, and its status written (conditions, counts) by that reconcile.
    policies
        .create(&PostParams::default(), &policy("first", 100))
        .await
        .unwrap();
    policy_status(&ns, "first", "0/0").await;
    // Marker: a second policy created and reconciled after that status write.
    policies
        .create(&PostParams::default(), &policy("marker", 100))
        .await
        .unwrap();
    policy_status(&ns, "marker", "0/0").await;
    let first = reconciles_of(&ns, "first");
    assert_eq!(
        own_updates(&first),
        1,
        "only the creation of the policy reconciles it through its own watch, never the status \
         write that followed: {first:?}"
    );
    assert_eq!(
        first.len(),
        1,
        "creating the ConfigMap and the NetworkPolicy did not reconcile the policy again: {first:?}"
    );

    // A governed pod starts and reports the policy's generation: the reconcile this triggers writes a
    // new status (1/1, Enforced) and re-applies the ConfigMap and NetworkPolicy as they were.
    let now = (system_clock())();
    let reply = redis.command(&format!(
        "HSET sluice:{{{}/first}}:enforced web-1 \"1 {now}\"",
        ns.name()
    ));
    assert!(reply.starts_with(':'), "{reply}");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "labels": {"app": "first", "sluice.dev/policy": "first"}},
        "spec": {"containers": [{"name": "web", "image": "web"}]}
    }))
    .unwrap();
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "web-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
    let p = policy_status(&ns, "first", "1/1").await;
    assert_eq!(p.ready_condition().unwrap().reason, "Enforced");
    let before = reconciles_of(&ns, "first");
    // Marker: the other policy's spec changes and it is reconciled for it.
    policies
        .patch(
            "marker",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"rules": [{"name": "all", "limit": {"requests": 7, "window": "1m"}}]}}),
            ),
        )
        .await
        .unwrap();
    let m = policy_status(&ns, "marker", "0/0").await;
    assert_eq!(m.metadata.generation, Some(2));
    let after = reconciles_of(&ns, "first");
    // The pod's own events (its creation and its status patch) may reach the pod watch after the
    // reconcile that wrote 1/1 had already read both, and start one more: a trigger of its own, not
    // one of the writes this test is about.
    let since: Vec<&String> = after[before.len()..]
        .iter()
        .filter(|r| !r.contains("Pod"))
        .collect();
    assert!(
        since.is_empty(),
        "writing the new status and re-applying unchanged owned objects reconciled the policy again: \
         {after:?}"
    );
    assert_eq!(own_updates(&after), 1, "{after:?}");

    // Someone else edits the policy's ConfigMap: that reconciles the policy, which puts its config
    // back (long before the periodic resync).
    let config_maps = ns.api::<ConfigMap>();
    let name = sluice_operator::render::sidecar_config::config_map_name("first");
    let written = config_maps.get(&name).await.unwrap().data.unwrap();
    config_maps
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"config.yaml": "edited: by hand"}})),
        )
        .await
        .unwrap();
    wait_for("the ConfigMap put back", DEADLINE, || {
        let (config_maps, name, written) = (config_maps.clone(), name.clone(), written.clone());
        async move { (config_maps.get(&name).await.ok()?.data? == written).then_some(()) }
    })
    .await
    .unwrap();
    let edited = reconciles_of(&ns, "first");
    assert!(
        edited[after.len()..].iter().any(|r| r.contains("ConfigMap")),
        "{edited:?}"
    );
}

#[tokio::test]
async fn a_job_queues_own_status_writes_and_unchanged_owned_objects_do_not_reconcile_it_again() {
    record_reconciles();
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let ns = env.namespace("triggers").await.unwrap();
    let pg = PgServer::start();
    ns.create_secret("pg", "url", &pg.url()).await.unwrap();
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
    let ctx = Arc::new(Context::new(
        env.client(),
        Arc::new(Metrics::default()),
        Some("test".into()),
        system_clock(),
        state,
    ));
    tokio::spawn(job_queue::run(ctx, wakes, stop.cancelled_owned()));
    let queues: Api<JobQueue> = ns.api();
    // An hour between polls: no periodic reconcile within the test.
    let queue = |name: &str| -> JobQueue {
        serde_json::from_value(json!({
            "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
            "metadata": {"name": name},
            "spec": {"database": {"secretRef": {"name": "pg"}},
                     "worker": {"template": {"spec": {"containers": [{"name": "handler", "image": "h:1"}]}},
                                "concurrency": 4},
                     "scaling": {"pollingInterval": "1h"}}
        }))
        .unwrap()
    };
    let ready = |name: &'static str| {
        let queues = queues.clone();
        async move {
            wait_for(&format!("{name} ready"), DEADLINE, || {
                let queues = queues.clone();
                async move {
                    let q = queues.get(name).await.ok()?;
                    (q.status.as_ref()?.observed_generation == q.metadata.generation
                        && q.condition("Ready")?.status == "True")
                        .then_some(q)
                }
            })
            .await
            .unwrap()
        }
    };

    queues
        .create(&PostParams::default(), &queue("emails"))
        .await
        .unwrap();
    ready("emails").await;
    // Marker: a second JobQueue created and reconciled after the first one's status write.
    queues
        .create(&PostParams::default(), &queue("marker"))
        .await
        .unwrap();
    ready("marker").await;
    let before = reconciles_of(&ns, "emails");
    assert_eq!(
        own_updates(&before),
        1,
        "only the creation of the JobQueue reconciles it through its own watch, never the status \
         write that followed: {before:?}"
    );
    assert_eq!(
        before.len(),
        1,
        "creating the worker ConfigMap and Deployment (written three times) did not reconcile the \
         JobQueue again: {before:?}"
    );

    // Paused: the annotation triggers a reconcile, which writes the new status (`Paused=True`) and
    // re-applies the worker ConfigMap and Deployment as they were (no HPA: no external metrics API).
    let pause = |name: &'static str| {
        let queues = queues.clone();
        async move {
            queues
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {"sluice.dev/paused": "true"}}})),
                )
                .await
                .unwrap();
            wait_for(&format!("{name} paused"), DEADLINE, || {
                let queues = queues.clone();
                async move {
                    let q = queues.get(name).await.ok()?;
                    (q.condition("Paused")?.status == "True").then_some(())
                }
            })
            .await
            .unwrap();
        }
    };
    pause("emails").await;
    // Marker: the other JobQueue paused and reconciled for it.
    pause("marker").await;
    let after = reconciles_of(&ns, "emails");
    assert_eq!(
        after.len(),
        before.len() + 1,
        "pausing reconciled the JobQueue once, and its status write did not reconcile it again: \
         {after:?}"
    );
    assert_eq!(own_updates(&after), 2, "{after:?}");
}
