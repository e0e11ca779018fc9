//! The JobQueue controller against the in-memory test API server and a real PostgreSQL: create, update,
//! pause, delete (and the database's LISTEN connection closed after the last queue on it), a bad Secret
//! (counted by reason like every controller's errors), an external metrics API owned by someone else, 0→1
//! on enqueue (timed, and deciding as a reconcile does) and 1→0 only after the cooldown and only when
//! nothing runs.

use std::{
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{apps::v1::Deployment, autoscaling::v2::HorizontalPodAutoscaler, core::v1::ConfigMap},
    kube_aggregator::pkg::apis::apiregistration::v1::APIService,
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use sluice_crds::{contract::annotation::CONFIG_HASH as CONFIG_HASH_ANNOTATION, job_queue::JobQueue};
use sluice_e2e::{Env, TestNamespace, wait_for};
use sluice_operator::{
    clock::Clock,
    controller::{Context, job_queue},
    metrics::Metrics,
    render::sidecar_container::SidecarSettings,
    scaling::{Databases, JobQueueMetrics},
};
use sluice_queue::{NewJob, QueueStore};
use sluice_testsupport::PgServer;
use tokio_util::sync::CancellationToken;

const OPERATOR_NS: &str = "sluice-system";
const DEADLINE: Duration = Duration::from_secs(15);
const SCALING: &str = "pollingInterval: 1s, cooldownPeriod: 1m";

/// A clock the test moves forward by hand.
#[derive(Clone, Default)]
struct TestClock(Arc<AtomicI64>);

impl TestClock {
    fn clock(&self) -> Clock {
        let offset = self.0.clone();
        let real = sluice_operator::clock::system_clock();
        Arc::new(move || real() + offset.load(Ordering::SeqCst))
    }
    fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_millis() as i64, Ordering::SeqCst);
    }
}

struct Fixture {
    env: Env,
    ns: TestNamespace,
    pg: PgServer,
    clock: TestClock,
    metrics: Arc<JobQueueMetrics>,
    reconciles: Arc<Metrics>,
    ctx: Arc<Context<job_queue::State>>,
    stop: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An API server with the JobQueue CRD, an APIService owned by `apiservice_namespace`, a namespace
/// with the database Secret, a PostgreSQL, and the controller running.
async fn fixture(apiservice_namespace: &str) -> Fixture {
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let apiservice: APIService = serde_json::from_value(json!({
        "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
        "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
        "spec": {"group": "external.metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100,
                 "versionPriority": 100,
                 "service": {"namespace": apiservice_namespace, "name": "metrics-apiserver", "port": 443}},
    }))
    .unwrap();
    Api::<APIService>::all(env.client())
        .create(&PostParams::default(), &apiservice)
        .await
        .unwrap();
    let ns = env.namespace("jobqueue").await.unwrap();
    let pg = PgServer::start();
    ns.create_secret("pg", "url", &pg.url()).await.unwrap();

    let clock = TestClock::default();
    let metrics = Arc::new(JobQueueMetrics::default());
    let stop = CancellationToken::new();
    let settings = job_queue::Settings {
        databases: Arc::new(Databases::with_ttl(Duration::ZERO)),
        metrics: metrics.clone(),
        sidecar: SidecarSettings {
            image: "sluice-sidecar:test".into(),
            ..SidecarSettings::default()
        },
        namespace: OPERATOR_NS.into(),
        external_metrics: true,
        namespaces: Default::default(),
    };
    let (state, wakes) = job_queue::State::new(settings, stop.clone());
    let reconciles = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(
        env.client(),
        reconciles.clone(),
        Some("test".into()),
        clock.clock(),
        state,
    ));
    tokio::spawn(job_queue::run(ctx.clone(), wakes, stop.clone().cancelled_owned()));
    Fixture {
        env,
        ns,
        pg,
        clock,
        metrics,
        reconciles,
        ctx,
        stop,
    }
}

fn job_queue_yaml(scaling: &str) -> String {
    format!(
        r#"
apiVersion: sluice.dev/v1alpha1
kind: JobQueue
metadata: {{name: emails}}
spec:
  database: {{secretRef: {{name: pg}}}}
  worker:
    template:
      spec:
        containers: [{{name: handler, image: "mail:1"}}]
    concurrency: 4
  scaling: {{{scaling}}}
"#
    )
}

impl Fixture {
    async fn apply(&self, yaml: &str) {
        self.ns.apply_yaml(yaml).await.unwrap();
    }

    async fn job_queue(&self) -> JobQueue {
        self.ns.api::<JobQueue>().get("emails").await.unwrap()
    }

    /// Waits until the JobQueue's condition `type_` has `status` (and `reason`, if given).
    async fn wait_condition(&self, type_: &str, status: &str, reason: Option<&str>) -> JobQueue {
        let api = self.ns.api::<JobQueue>();
        wait_for(&format!("{type_}={status} {reason:?}"), DEADLINE, || {
            let api = api.clone();
            async move {
                let jq = api.get("emails").await.ok()?;
                let c = jq.condition(type_)?;
                (c.status == status && reason.is_none_or(|r| c.reason == r)).then_some(jq.clone())
            }
        })
        .await
        .unwrap()
    }

    async fn replicas(&self) -> Option<i32> {
        self.ns
            .api::<Deployment>()
            .get_opt("emails-worker")
            .await
            .unwrap()
            .and_then(|d| d.spec?.replicas)
    }

    async fn wait_replicas(&self, want: i32, deadline: Duration) -> Duration {
        let start = Instant::now();
        let api = self.ns.api::<Deployment>();
        wait_for(&format!("worker replicas = {want}"), deadline, || {
            let api = api.clone();
            async move {
                let d = api.get_opt("emails-worker").await.ok()??;
                (d.spec?.replicas == Some(want)).then_some(())
            }
        })
        .await
        .unwrap();
        start.elapsed()
    }

    /// Unix ms (test clock) when the controller last saw the queue busy.
    fn last_active_ms(&self) -> Option<i64> {
        self.ctx
            .state
            .queues
            .lock()
            .unwrap()
            .iter()
            .find(|(r, _)| r.name == "emails")
            .map(|(_, m)| m.last_active_ms)
    }

    /// Whether the controller remembers JobQueue `name`.
    fn remembers(&self, name: &str) -> bool {
        self.ctx
            .state
            .queues
            .lock()
            .unwrap()
            .keys()
            .any(|r| r.name == name)
    }

    /// Connections LISTENing on the database (the operator's; no worker runs in these tests).
    async fn listeners(&self) -> Option<i64> {
        sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%sluice_jobs%'")
            .fetch_one(self.store().await.pool())
            .await
            .ok()
    }

    /// Waits until the operator LISTENs on the database (an enqueue before that is found by polling only).
    async fn wait_listening(&self) {
        wait_for("the operator to LISTEN", DEADLINE, || async {
            (self.listeners().await? > 0).then_some(())
        })
        .await
        .unwrap();
    }

    /// The queue's name in the database: `<namespace>/emails`.
    fn queue(&self) -> String {
        format!("{}/emails", self.ns.name())
    }

    async fn store(&self) -> QueueStore {
        QueueStore::new(sluice_queue::pool::connect_lazy(&self.pg.url(), 2).unwrap())
    }
}

#[tokio::test]
async fn a_new_job_queue_gets_its_schema_workers_and_hpa_and_reports_ready() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    let jq = f.wait_condition("Ready", "True", Some("AsExpected")).await;
    let status = jq.status.unwrap();
    assert_eq!(status.observed_generation, jq.metadata.generation);
    assert_eq!(status.scaler.as_deref(), Some("builtin"));
    assert_eq!(status.depth.unwrap().ready, 0);
    assert_eq!(
        status.current_replicas,
        Some(0),
        "an idle queue with minReplicaCount 0 has no workers"
    );

    let d = f.ns.api::<Deployment>().get("emails-worker").await.unwrap();
    assert_eq!(d.metadata.owner_references.unwrap()[0].name, "emails");
    let containers: Vec<String> = d
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(containers, ["handler", "sluice-sidecar"]);
    let hpa =
        f.ns.api::<HorizontalPodAutoscaler>()
            .get("emails-worker")
            .await
            .unwrap();
    let metric = hpa.spec.unwrap().metrics.unwrap()[0].external.clone().unwrap();
    assert_eq!(metric.metric.name, "sluice_jobqueue_depth");
    assert!(
        f.ns.api::<ConfigMap>()
            .get_opt("emails-worker-config")
            .await
            .unwrap()
            .is_some()
    );

    // The schema and the queue's settings are in the database.
    let settings = f
        .store()
        .await
        .queue(&f.queue())
        .await
        .unwrap()
        .expect("queue registered");
    assert_eq!(settings.max_attempts, 25);
    assert!(!settings.paused);
}

#[tokio::test]
async fn an_update_rolls_the_worker_config_and_settings() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    let hash = |d: Deployment| {
        d.spec.unwrap().template.metadata.unwrap().annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone()
    };
    let before = hash(f.ns.api::<Deployment>().get("emails-worker").await.unwrap());

    let updated =
        job_queue_yaml(SCALING).replace("concurrency: 4", "concurrency: 9") + "  retry: {maxAttempts: 3}\n";
    f.apply(&updated).await;
    let api = f.ns.api::<Deployment>();
    wait_for("the config hash to change", DEADLINE, || {
        let api = api.clone();
        let before = before.clone();
        async move {
            let d = api.get("emails-worker").await.ok()?;
            (hash(d) != before).then_some(())
        }
    })
    .await
    .unwrap();
    let cm = f.ns.api::<ConfigMap>().get("emails-worker-config").await.unwrap();
    assert!(cm.data.unwrap()["worker.yaml"].contains("concurrency: 9"));
    let (store, queue) = (f.store().await, f.queue());
    wait_for("maxAttempts 3 in the database", DEADLINE, || {
        let (store, queue) = (store.clone(), queue.clone());
        async move { (store.queue(&queue).await.ok()??.max_attempts == 3).then_some(()) }
    })
    .await
    .unwrap();
    let jq = f.job_queue().await;
    let jq = if jq.status.as_ref().and_then(|s| s.observed_generation) == jq.metadata.generation {
        jq
    } else {
        f.wait_condition("Ready", "True", None).await
    };
    assert_eq!(jq.status.unwrap().observed_generation, Some(2));
}

#[tokio::test]
async fn pausing_stops_claims_and_scaling_and_says_so() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    f.ns.api::<JobQueue>()
        .patch(
            "emails",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sluice.dev/paused": "true"}}})),
        )
        .await
        .unwrap();
    f.wait_condition("Paused", "True", Some("PausedByAnnotation"))
        .await;
    let hpas = f.ns.api::<HorizontalPodAutoscaler>();
    wait_for("the HPA to be removed while paused", DEADLINE, || {
        let hpas = hpas.clone();
        async move { hpas.get_opt("emails-worker").await.ok()?.is_none().then_some(()) }
    })
    .await
    .unwrap();
    assert!(f.store().await.queue(&f.queue()).await.unwrap().unwrap().paused);
    // Work arriving while paused wakes nobody.
    f.store()
        .await
        .enqueue(&f.queue(), &NewJob::new("send", json!({})))
        .await
        .unwrap();
    let jq = f.wait_condition("Active", "False", Some("Waking")).await;
    assert_eq!(jq.status.unwrap().current_replicas, Some(0));
    assert_eq!(f.replicas().await, Some(0));
}

#[tokio::test]
async fn deleting_the_job_queue_collects_its_objects() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    f.ns.api::<JobQueue>()
        .delete("emails", &DeleteParams::default())
        .await
        .unwrap();
    let (deployments, hpas, cms) = (
        f.ns.api::<Deployment>(),
        f.ns.api::<HorizontalPodAutoscaler>(),
        f.ns.api::<ConfigMap>(),
    );
    wait_for("owned objects to be collected", DEADLINE, || {
        let (deployments, hpas, cms) = (deployments.clone(), hpas.clone(), cms.clone());
        async move {
            let gone = deployments.get_opt("emails-worker").await.ok()?.is_none()
                && hpas.get_opt("emails-worker").await.ok()?.is_none()
                && cms.get_opt("emails-worker-config").await.ok()?.is_none();
            gone.then_some(())
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn deleting_the_last_job_queue_of_a_database_closes_its_listen_connection() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.apply(&job_queue_yaml(SCALING).replace("name: emails", "name: reports"))
        .await;
    f.wait_condition("Ready", "True", None).await;
    wait_for("both queues remembered", DEADLINE, || async {
        (f.remembers("emails") && f.remembers("reports")).then_some(())
    })
    .await
    .unwrap();
    f.wait_listening().await;
    let api = f.ns.api::<JobQueue>();

    api.delete("emails", &DeleteParams::default()).await.unwrap();
    wait_for("the deleted queue to be forgotten", DEADLINE, || async {
        (!f.remembers("emails")).then_some(())
    })
    .await
    .unwrap();
    assert!(
        f.listeners().await.unwrap() > 0,
        "the database still has a JobQueue: its LISTEN connection stays"
    );

    api.delete("reports", &DeleteParams::default()).await.unwrap();
    wait_for(
        "the last queue's database to lose its LISTEN connection",
        DEADLINE,
        || async { (!f.remembers("reports") && f.listeners().await? == 0).then_some(()) },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn a_missing_secret_sets_ready_false_with_an_event_and_recovers() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING).replace("name: pg}", "name: nope}"))
        .await;
    let jq = f.wait_condition("Ready", "False", Some("SecretNotFound")).await;
    let ready = jq.condition("Ready").unwrap();
    assert!(ready.message.contains("nope"), "{}", ready.message);
    assert!(
        f.replicas().await.is_none(),
        "nothing is deployed without a database"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = f.ns.api();
    wait_for("a SecretNotFound event", DEADLINE, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("SecretNotFound"))
                .then_some(())
        }
    })
    .await
    .unwrap();
    // The failure is counted by reason, like every controller's: by the error policy, just after the
    // event is published.
    wait_for("the missing Secret counted", DEADLINE, || async {
        (f.reconciles.reconcile_errors("jobqueue", "secret_not_found") >= 1).then_some(())
    })
    .await
    .unwrap();
    // Fixing the reference recovers (the retry backs off from 1 s).
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    let text = f.reconciles.encode();
    assert!(
        text.contains(r#"sluice_operator_reconcile_total{controller="jobqueue"}"#),
        "{text}"
    );
}

/// Without the admission webhook a schedule the operator cannot read is stored: status, a condition and
/// a Warning Event name it and say why.
#[tokio::test]
async fn a_schedule_that_cannot_be_read_is_reported_by_name_in_a_condition_and_an_event() {
    let f = fixture(OPERATOR_NS).await;
    let good = "    - {name: hourly, cron: \"0 * * * *\", kind: report}\n";
    let bad = "    - {name: nightly, cron: \"0 2 * * *\", timeZone: Mars/Olympus, kind: report}\n";
    f.apply(&(job_queue_yaml(SCALING) + "  schedules:\n" + good + bad))
        .await;
    let jq = f
        .wait_condition("Degraded", "True", Some("InvalidSchedule"))
        .await;
    let degraded = jq.condition("Degraded").unwrap();
    assert!(
        degraded.message.contains("\"nightly\"") && degraded.message.contains("Mars/Olympus"),
        "{}",
        degraded.message
    );
    assert!(!degraded.message.contains("hourly"), "{}", degraded.message);
    let schedules = jq.status.unwrap().schedules;
    assert!(
        schedules[1]
            .message
            .as_deref()
            .unwrap_or("")
            .contains("Mars/Olympus")
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = f.ns.api();
    wait_for("an InvalidSchedule Warning event", DEADLINE, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("InvalidSchedule")
                        && e.type_.as_deref() == Some("Warning")
                        && e.note.as_deref().is_some_and(|n| n.contains("nightly"))
                })
                .then_some(())
        }
    })
    .await
    .unwrap();
    // Fixed: no longer degraded.
    f.apply(
        &(job_queue_yaml(SCALING) + "  schedules:\n" + good + &bad.replace("Mars/Olympus", "Europe/Paris")),
    )
    .await;
    f.wait_condition("Degraded", "False", None).await;
}

#[tokio::test]
async fn an_external_metrics_api_owned_by_keda_is_left_alone_and_reported() {
    let f = fixture("keda").await;
    f.apply(&job_queue_yaml(SCALING)).await;
    let jq = f
        .wait_condition("Degraded", "True", Some("ExternalMetricsOwnedElsewhere"))
        .await;
    let message = &jq.condition("Degraded").unwrap().message;
    assert!(message.contains("keda/metrics-apiserver"), "{message}");
    assert_eq!(
        jq.condition("Ready").unwrap().status,
        "True",
        "the queue still works"
    );
    assert_eq!(jq.status.unwrap().scaler.as_deref(), Some("operator"));
    assert!(
        f.ns.api::<HorizontalPodAutoscaler>()
            .get_opt("emails-worker")
            .await
            .unwrap()
            .is_none()
    );
    let api = Api::<APIService>::all(f.env.client())
        .get("v1beta1.external.metrics.k8s.io")
        .await
        .unwrap();
    let svc = api.spec.unwrap().service.unwrap();
    assert_eq!(
        svc.namespace.as_deref(),
        Some("keda"),
        "the APIService is untouched"
    );
    // The operator scales the workers itself: depth 9 at target 4 → 3 workers.
    let jobs: Vec<NewJob> = (0..9).map(|_| NewJob::new("send", json!({}))).collect();
    f.store().await.enqueue_many(&f.queue(), &jobs).await.unwrap();
    f.wait_replicas(3, DEADLINE).await;
}

#[tokio::test]
async fn an_enqueue_wakes_an_idle_queue_from_zero_to_one_within_a_second() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml("pollingInterval: 1h, cooldownPeriod: 1m"))
        .await;
    let jq = f.wait_condition("Ready", "True", None).await;
    assert_eq!(jq.status.unwrap().current_replicas, Some(0));
    let store = f.store().await;
    f.wait_listening().await;
    let mut samples = vec![];
    for round in 0..3 {
        let start = Instant::now();
        store
            .enqueue(&f.queue(), &NewJob::new("send", json!({"round": round})))
            .await
            .unwrap();
        f.wait_replicas(1, Duration::from_secs(5)).await;
        samples.push(start.elapsed());
        // Back to zero for the next round: drain the job and scale down by hand.
        let claimed = store
            .claim_batch(&f.queue(), "t-00000001", 10, Duration::from_secs(60))
            .await
            .unwrap();
        let done: Vec<_> = claimed
            .iter()
            .map(|c| sluice_queue::store::Finished {
                id: c.id,
                attempt: c.attempt,
                finish: sluice_queue::store::Finish::Succeeded,
            })
            .collect();
        store.finish_batch("t-00000001", &done).await.unwrap();
        f.clock.advance(Duration::from_secs(120));
        f.ns.api::<JobQueue>()
            .patch(
                "emails",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"test/round": round.to_string()}}})),
            )
            .await
            .unwrap();
        f.wait_replicas(0, DEADLINE).await;
    }
    eprintln!("enqueue → Deployment at 1 replica (observed through the API): {samples:?}");
    let worst = samples.iter().max().unwrap();
    assert!(
        *worst < Duration::from_secs(1),
        "0→1 took {worst:?}; target under 1 s"
    );
    assert!(f.metrics.scale_decisions("Activated") >= 1);
}

#[tokio::test]
async fn a_database_that_floods_notifications_and_stalls_its_depth_read_holds_up_no_other_wake_up() {
    // Anyone who may log in to a database may NOTIFY on it, and a JobQueue may name a database its own
    // namespace runs: here a second database whose sleeping queue `slow` is notified over and over
    // while a lock stalls the depth read each wake-up makes (up to the operator's 15 s answer
    // deadline). Wake-ups of the first database's queue still come at once. Polling is off (1h).
    let f = fixture("keda").await;
    f.pg.psql("CREATE DATABASE slow");
    let slow_url = f.pg.url_for("slow");
    f.ns.create_secret("pg-slow", "url", &slow_url).await.unwrap();
    f.apply(&job_queue_yaml("pollingInterval: 1h, cooldownPeriod: 1m"))
        .await;
    f.apply(
        &job_queue_yaml("pollingInterval: 1h, cooldownPeriod: 1m")
            .replace("name: emails", "name: slow")
            .replace("name: pg}", "name: pg-slow}"),
    )
    .await;
    for name in ["emails", "slow"] {
        wait_for(&format!("{name} ready at 0"), DEADLINE, || async {
            let jq = f.ns.api::<JobQueue>().get(name).await.ok()?;
            let ready = jq.condition("Ready")?.status == "True";
            (ready && jq.status?.current_replicas == Some(0)).then_some(())
        })
        .await
        .unwrap();
    }
    let slow = sluice_queue::pool::connect_lazy(&slow_url, 4).unwrap();
    wait_for("the operator to LISTEN on both databases", DEADLINE, || async {
        let on_slow: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE query ILIKE 'LISTEN%sluice_jobs%' AND datname = 'slow'",
        )
        .fetch_one(&slow)
        .await
        .ok()?;
        (on_slow > 0 && f.listeners().await? > 1).then_some(())
    })
    .await
    .unwrap();

    let mut lock = slow.begin().await.unwrap();
    sqlx::query("LOCK TABLE sluice.jobs IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();
    let slow_queue = format!("{}/slow", f.ns.name());
    for _ in 0..20 {
        sqlx::query("SELECT pg_notify('sluice_jobs', $1)")
            .bind(&slow_queue)
            .execute(&slow)
            .await
            .unwrap();
    }
    wait_for("a wake-up's depth read waiting on the lock", DEADLINE, || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = 'slow'",
        )
        .fetch_one(&slow)
        .await
        .ok()?;
        (waiting > 0).then_some(())
    })
    .await
    .unwrap();

    f.store()
        .await
        .enqueue(&f.queue(), &NewJob::new("send", json!({})))
        .await
        .unwrap();
    let took = f.wait_replicas(1, Duration::from_secs(5)).await;
    eprintln!("enqueue → Deployment at 1 replica with the other database stalled: {took:?}");
    lock.rollback().await.unwrap();
}

#[tokio::test]
async fn an_enqueue_wakes_a_queue_without_an_hpa_straight_to_the_workers_its_depth_needs() {
    // KEDA owns the metrics API, so the operator scales 1..N itself; polling is off (1h), so only the
    // NOTIFY path can wake the queue, and it decides as a reconcile does: depth 12 at 4 per worker is 3.
    let f = fixture("keda").await;
    f.apply(&job_queue_yaml("pollingInterval: 1h, cooldownPeriod: 1m"))
        .await;
    let jq = f.wait_condition("Ready", "True", None).await;
    assert_eq!(jq.status.unwrap().current_replicas, Some(0));
    f.wait_listening().await;
    let jobs: Vec<NewJob> = (0..12).map(|_| NewJob::new("send", json!({}))).collect();
    f.store().await.enqueue_many(&f.queue(), &jobs).await.unwrap();
    f.wait_replicas(3, DEADLINE).await;
    // A reconcile still running from the queue's creation may make the same decision at the same time:
    // both count it, and both go to 3.
    assert!(f.metrics.scale_decisions("Activated") >= 1);
    assert_eq!(
        f.metrics.scale_decisions("DepthChanged"),
        0,
        "the wake-up went straight to 3, not to 1 and then on by a reconcile"
    );
}

#[tokio::test]
async fn workers_go_to_zero_only_after_the_cooldown_and_only_when_nothing_runs() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    let store = f.store().await;
    store
        .enqueue(&f.queue(), &NewJob::new("send", json!({})))
        .await
        .unwrap();
    f.wait_replicas(1, DEADLINE).await;
    let claimed = store
        .claim_batch(
            &f.queue(),
            "emails-worker-x-0000000b",
            1,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);

    // A running job holds its worker however long the queue has no ready job: the clock jumps an hour
    // and the controller, seeing the running job, counts the queue as busy now.
    f.clock.advance(Duration::from_secs(3600));
    let moved = (f.clock.clock())();
    wait_for(
        "a reconcile after the clock moved that saw the running job",
        DEADLINE,
        || {
            let seen = f.last_active_ms();
            async move { (seen? >= moved - 1000).then_some(()) }
        },
    )
    .await
    .unwrap();
    assert_eq!(f.replicas().await, Some(1), "a running job keeps its worker");

    // Finished: idle from now; within the cooldown the worker stays.
    store
        .finish_batch(
            "emails-worker-x-0000000b",
            &[sluice_queue::store::Finished {
                id: claimed[0].id,
                attempt: claimed[0].attempt,
                finish: sluice_queue::store::Finish::Succeeded,
            }],
        )
        .await
        .unwrap();
    let jq = f.wait_condition("Active", "False", Some("Idle")).await;
    assert_eq!(
        jq.status.unwrap().current_replicas,
        Some(1),
        "cooling down: the worker stays"
    );
    assert_eq!(f.replicas().await, Some(1));

    // Past the cooldown (1m), the next poll scales to zero.
    f.clock.advance(Duration::from_secs(61));
    f.wait_replicas(0, DEADLINE).await;
    // The status is written after the scale call: await it rather than read it once.
    wait_for(
        "the status to give CooledDown as the reason",
        DEADLINE,
        || async {
            let reason = f.job_queue().await.status?.last_scale_reason?;
            (reason == "CooledDown").then_some(())
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn between_one_and_n_the_replicas_are_the_hpas_and_never_reapplied_by_the_operator() {
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    let store = f.store().await;
    for n in 0..10 {
        store
            .enqueue(&f.queue(), &NewJob::new("send", json!({"n": n})))
            .await
            .unwrap();
    }
    f.wait_replicas(1, DEADLINE).await;

    // The HPA scales to 3 through /scale, as kube-controller-manager does.
    let deployments = f.ns.api::<Deployment>();
    deployments
        .patch_scale(
            "emails-worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    // A reconcile (a poll a second) sees the 3 and reports them.
    wait_for("the status to report 3 workers", DEADLINE, || async {
        (f.job_queue().await.status?.current_replicas == Some(3)).then_some(())
    })
    .await
    .unwrap();

    // The Deployment's own apply no longer carries spec.replicas: a reconcile racing the HPA cannot put
    // back a count it read before the HPA's write. The operator's own count has a manager of its own.
    let d = deployments.get("emails-worker").await.unwrap();
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(3));
    assert!(
        !job_queue::owns_replicas(&d, sluice_operator::FIELD_MANAGER),
        "{:?}",
        d.metadata.managed_fields
    );

    // Its own decisions still land: past the cooldown with nothing left, back to zero.
    let claimed = store
        .claim_batch(
            &f.queue(),
            "emails-worker-x-0000000c",
            10,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let done: Vec<_> = claimed
        .iter()
        .map(|c| sluice_queue::store::Finished {
            id: c.id,
            attempt: c.attempt,
            finish: sluice_queue::store::Finish::Succeeded,
        })
        .collect();
    store
        .finish_batch("emails-worker-x-0000000c", &done)
        .await
        .unwrap();
    f.clock.advance(Duration::from_secs(120));
    f.wait_replicas(0, DEADLINE).await;
}

#[tokio::test]
async fn a_count_decided_before_the_hpas_scale_is_not_applied_over_it() {
    // The race a reconcile can lose: it reads the Deployment at 0 workers and decides on 1; meanwhile a
    // NOTIFY wake-up scales to 1 and the HPA to 3. Its count is applied on the version it read, so the
    // API server refuses it and the HPA's 3 stands (before, a late apply put back 1).
    let f = fixture(OPERATOR_NS).await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    let deployments = f.ns.api::<Deployment>();
    let read = deployments.get("emails-worker").await.unwrap();
    let read_at = read.metadata.resource_version.clone();
    deployments
        .patch_scale(
            "emails-worker",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let applied = job_queue::apply_replicas(&deployments, "emails-worker", 1, read_at.as_deref())
        .await
        .unwrap();
    assert!(!applied, "a count decided on an older version is refused");
    let now = deployments.get("emails-worker").await.unwrap();
    assert_eq!(now.spec.unwrap().replicas, Some(3), "the HPA's count stands");

    // On the version it holds now, the operator's count lands.
    let applied = job_queue::apply_replicas(
        &deployments,
        "emails-worker",
        0,
        now.metadata.resource_version.as_deref(),
    )
    .await
    .unwrap();
    assert!(applied);
    f.wait_replicas(0, DEADLINE).await;
}

#[tokio::test]
async fn before_scaling_in_idle_workers_are_marked_cheaper_to_delete() {
    // KEDA owns the metrics API, so the operator applies the HPA formula itself and scale-in is its own.
    let f = fixture("keda").await;
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    let store = f.store().await;
    let jobs: Vec<NewJob> = (0..12).map(|_| NewJob::new("send", json!({}))).collect();
    store.enqueue_many(&f.queue(), &jobs).await.unwrap();
    f.wait_replicas(3, DEADLINE).await;
    // Three worker pods (no kubelet here: the test plays the ReplicaSet controller).
    for pod in ["emails-worker-a", "emails-worker-b", "emails-worker-c"] {
        let p: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": pod, "labels": {"sluice.dev/jobqueue": "emails"}},
            "spec": {"containers": [{"name": "handler", "image": "mail:1"}]},
        }))
        .unwrap();
        f.ns.api().create(&PostParams::default(), &p).await.unwrap();
    }
    // Pod b holds two leases; everything else is done.
    let held = store
        .claim_batch(
            &f.queue(),
            "emails-worker-b-0000beef",
            2,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    assert_eq!(held.len(), 2);
    let rest = store
        .claim_batch(
            &f.queue(),
            "emails-worker-c-0000cafe",
            100,
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    let done: Vec<_> = rest
        .iter()
        .map(|c| sluice_queue::store::Finished {
            id: c.id,
            attempt: c.attempt,
            finish: sluice_queue::store::Finish::Succeeded,
        })
        .collect();
    store
        .finish_batch("emails-worker-c-0000cafe", &done)
        .await
        .unwrap();

    // Depth 2 at target 4 asks for one worker: the busy pod is marked expensive first.
    f.wait_replicas(1, DEADLINE).await;
    let pods = f.ns.api::<k8s_openapi::api::core::v1::Pod>();
    let cost = |name: &'static str| {
        let pods = pods.clone();
        async move {
            pods.get(name)
                .await
                .unwrap()
                .metadata
                .annotations
                .and_then(|a| a.get("controller.kubernetes.io/pod-deletion-cost").cloned())
        }
    };
    assert_eq!(cost("emails-worker-b").await.as_deref(), Some("2"));
    assert_eq!(cost("emails-worker-a").await.as_deref(), Some("0"));
    assert_eq!(cost("emails-worker-c").await.as_deref(), Some("0"));
}

const SCALED_OBJECT_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: scaledobjects.keda.sh}
spec:
  group: keda.sh
  names: {kind: ScaledObject, plural: scaledobjects, singular: scaledobject, listKind: ScaledObjectList}
  scope: Namespaced
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

#[tokio::test]
async fn provider_keda_renders_a_scaled_object_instead_of_an_hpa() {
    let f = fixture("keda").await;
    f.env.apply_yaml(SCALED_OBJECT_CRD, None).await.unwrap();
    f.apply(&job_queue_yaml(
        "provider: keda, targetJobsPerReplica: 5, pollingInterval: 1s, cooldownPeriod: 2m",
    ))
    .await;
    let jq = f.wait_condition("Ready", "True", None).await;
    assert_eq!(jq.condition("Degraded").unwrap().status, "False");
    assert_eq!(jq.status.unwrap().scaler.as_deref(), Some("keda"));
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        f.env.client(),
        f.ns.name(),
        &sluice_operator::render::scaled_object::api_resource(),
    );
    let so = api.get("emails-worker").await.unwrap();
    let trigger = &so.data["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "postgresql");
    assert_eq!(trigger["metadata"]["targetQueryValue"], "5");
    assert_eq!(so.data["spec"]["cooldownPeriod"], 120);
    assert!(
        f.ns.api::<HorizontalPodAutoscaler>()
            .get_opt("emails-worker")
            .await
            .unwrap()
            .is_none()
    );
    // KEDA does 0↔1 in this mode: an enqueue leaves the replicas to it.
    f.store()
        .await
        .enqueue(&f.queue(), &NewJob::new("send", json!({})))
        .await
        .unwrap();
    f.wait_condition("Active", "False", Some("Waking")).await;
    assert_eq!(f.replicas().await, Some(0));
}

#[tokio::test]
async fn a_same_named_deployment_or_hpa_the_queue_does_not_own_is_reported_and_left_unchanged() {
    let f = fixture(OPERATOR_NS).await;
    let theirs: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "emails-worker", "labels": {"team": "payments"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "theirs"}},
            "template": {
                "metadata": {"labels": {"app": "theirs"}},
                "spec": {"containers": [{"name": "theirs", "image": "theirs:1"}]}
            }
        }
    }))
    .unwrap();
    let deployments = f.ns.api::<Deployment>();
    deployments.create(&PostParams::default(), &theirs).await.unwrap();
    f.apply(&job_queue_yaml(SCALING)).await;

    let jq = f.wait_condition("Ready", "False", Some("ObjectNotOwned")).await;
    let message = jq.condition("Ready").unwrap().message.clone();
    assert!(
        message.starts_with(&format!(
            "Deployment {}/emails-worker exists and is not controlled by this JobQueue",
            f.ns.name()
        )),
        "{message}"
    );
    wait_for("the refusal counted", DEADLINE, || async {
        (f.reconciles.reconcile_errors("jobqueue", "not_owned") >= 1).then_some(())
    })
    .await
    .unwrap();
    let d = deployments.get("emails-worker").await.unwrap();
    assert!(d.metadata.owner_references.is_none(), "not adopted");
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(3));
    let containers: Vec<String> = d
        .spec
        .unwrap()
        .template
        .spec
        .unwrap()
        .containers
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(containers, ["theirs"], "not rewritten");
    assert!(
        f.ns.api::<ConfigMap>()
            .get_opt("emails-worker-config")
            .await
            .unwrap()
            .is_none(),
        "nothing is written while an object is not the queue's"
    );

    // Theirs gone, the queue's own are written; then an HPA of someone else's with the worker's name
    // (here: the queue's own HPA, its ownerReference removed) is neither rewritten nor deleted.
    deployments
        .delete("emails-worker", &DeleteParams::default())
        .await
        .unwrap();
    f.wait_condition("Ready", "True", Some("AsExpected")).await;
    let hpas = f.ns.api::<HorizontalPodAutoscaler>();
    let queues = f.ns.api::<JobQueue>();
    queues
        .patch(
            "emails",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"sluice.dev/paused": "true"}}})),
        )
        .await
        .unwrap();
    // A reconcile still running from before (Ready=True is seen as soon as it is written) may apply the
    // HPA once more, and server-side apply gives the queue's ownerReference back: the HPA is made someone
    // else's again, and the queue touched so that a reconcile reads it, until one reports it.
    let mut touches = 0;
    let jq = wait_for("Ready=False ObjectNotOwned for the HPA", DEADLINE, || {
        touches += 1;
        let (hpas, queues, touch) = (hpas.clone(), queues.clone(), touches.to_string());
        async move {
            let owned = hpas.get("emails-worker").await.ok()?.metadata.owner_references;
            if owned.is_some_and(|o| !o.is_empty()) {
                let strip = json!({"metadata": {"ownerReferences": null}});
                hpas.patch("emails-worker", &PatchParams::default(), &Patch::Merge(strip))
                    .await
                    .ok()?;
                let nudge = json!({"metadata": {"annotations": {"e2e.sluice.dev/touch": touch}}});
                queues
                    .patch("emails", &PatchParams::default(), &Patch::Merge(nudge))
                    .await
                    .ok()?;
            }
            let jq = queues.get("emails").await.ok()?;
            let ready = jq.condition("Ready")?;
            (ready.status == "False" && ready.reason == "ObjectNotOwned").then_some(jq.clone())
        }
    })
    .await
    .unwrap();
    assert!(
        jq.condition("Ready")
            .unwrap()
            .message
            .starts_with("HorizontalPodAutoscaler "),
        "{:?}",
        jq.condition("Ready")
    );
    assert!(
        hpas.get_opt("emails-worker").await.unwrap().is_some(),
        "pausing does not delete an HPA the queue does not own"
    );
}

/// A queue an earlier version named without the namespace (`emails`, with jobs), in the JobQueue's
/// database before the operator prepares it.
async fn legacy_queue(f: &Fixture) -> Vec<String> {
    let store = f.store().await;
    sluice_queue::schema::migrate(store.pool()).await.unwrap();
    let mut settings = sluice_queue::QueueSettings::defaults("emails");
    settings.max_attempts = 5;
    store.upsert_queue(&settings).await.unwrap();
    let mut ids = Vec::new();
    for n in 0..3 {
        ids.push(
            store
                .enqueue("emails", &NewJob::new("send", json!({ "n": n })))
                .await
                .unwrap()
                .id
                .to_string(),
        );
    }
    ids
}

async fn wait_event(f: &Fixture, reason: &str) -> String {
    let events: Api<k8s_openapi::api::events::v1::Event> = f.ns.api();
    wait_for(&format!("a {reason} event"), DEADLINE, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .and_then(|e| e.note.clone())
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_queue_named_before_namespaces_is_adopted_by_its_only_job_queue() {
    let f = fixture(OPERATOR_NS).await;
    let mut ids = legacy_queue(&f).await;
    ids.sort();
    f.apply(&job_queue_yaml(SCALING)).await;
    f.wait_condition("Ready", "True", None).await;
    let note = wait_event(&f, "LegacyQueueAdopted").await;
    assert!(note.contains("3 jobs moved"), "{note}");
    let store = f.store().await;
    assert!(
        store.queue("emails").await.unwrap().is_none(),
        "the old name is gone"
    );
    let moved: Vec<String> =
        sqlx::query_scalar("SELECT id::text AS id FROM sluice.jobs WHERE queue = $1 ORDER BY 1")
            .bind(f.queue())
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert_eq!(moved, ids);
    let jq = f.wait_condition("Degraded", "False", None).await;
    assert_eq!(jq.status.unwrap().depth.unwrap().ready, 3);
}

#[tokio::test]
async fn a_queue_named_before_namespaces_that_two_job_queues_claim_is_left_alone_and_reported() {
    let f = fixture(OPERATOR_NS).await;
    let ids = legacy_queue(&f).await;
    // Another namespace has a JobQueue of the same name: which one the jobs belong to is not known. The
    // condition counts the other claimants and never names them: they are another namespace's.
    let other = f.env.namespace("other").await.unwrap();
    other
        .apply_yaml(&job_queue_yaml(SCALING).replace("name: pg}", "name: elsewhere}"))
        .await
        .unwrap();
    f.apply(&job_queue_yaml(SCALING)).await;
    let jq = f
        .wait_condition("Degraded", "True", Some("LegacyQueueNotAdopted"))
        .await;
    let message = &jq.condition("Degraded").unwrap().message;
    assert!(
        message.contains("1 other JobQueue claims it")
            && !message.contains(other.name())
            && message.contains("sluice.adopt_queue('emails'"),
        "{message}"
    );
    let store = f.store().await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.jobs WHERE queue = 'emails'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(left, ids.len() as i64, "nothing moved");
    // The documented SQL step moves them; the condition clears.
    assert_eq!(store.adopt_queue("emails", &f.queue()).await.unwrap(), Some(3));
    f.ns.api::<JobQueue>()
        .patch(
            "emails",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test/poke": "1"}}})),
        )
        .await
        .unwrap();
    f.wait_condition("Degraded", "False", None).await;
}
