//! The `JobQueue` controller: prepares the queue in the team's database, applies the worker
//! ConfigMap and Deployment and the autoscaler (HPA or KEDA `ScaledObject`), scales 0↔1 itself, marks
//! idle workers cheaper to delete before a scale-in, and reports depth, replicas and conditions.
//!
//! Shape: [`reconcile`] / [`error_policy`] like every controller here, plus a wake-up loop
//! ([`run_wakeups`]) that turns a NOTIFY on enqueue into a 0→1 scale call at once and then a reconcile.
//!
//! Failure rules: a bad Secret reference or an unreachable database sets `Ready=False` with a reason and
//! an Event, and the object is retried with per-object exponential backoff; replicas are left as they
//! are (a missing metric never scales to zero); nothing here panics or exits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::{
    api::{
        apps::v1::Deployment,
        autoscaling::v2::HorizontalPodAutoscaler,
        core::v1::{ConfigMap, Pod},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams},
    runtime::{
        Controller,
        controller::Action,
        events::{Event, EventType, Recorder, Reporter},
        reflector::ObjectRef,
        watcher,
    },
};
use serde_json::json;
use sluice_crds::job_queue::{DepthStatus, JobQueue, JobQueueStatus, ScalingProvider};
use sluice_sidecar::queue::{Depth, QueueSettings};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Backoff, Clock, conditions};
use crate::{
    FIELD_MANAGER,
    external_metrics::apiservice::{self, Owner},
    render::{
        hpa::render_hpa,
        scaled_object::{api_resource as scaled_object_resource, render_scaled_object},
        worker_deployment::{
            JOB_QUEUE_LABEL, WorkerRenderOptions, render_config_map, render_worker_deployment, worker_name,
        },
    },
    scaling::{
        Autoscaler, Databases, JobQueueMetrics, Observation, Policy, Reason, Wake, Waker,
        databases::{UrlError, database_key, read_database_url},
        decide,
        deletion_cost::{POD_DELETION_COST_ANNOTATION, deletion_costs},
    },
};

/// The controller's name in metrics and logs.
pub const CONTROLLER: &str = "jobqueue";

/// Condition types and reasons of a `JobQueue`.
pub mod condition {
    /// Schema, settings and workers are in place.
    pub const READY: &str = sluice_crds::conditions::READY;
    /// The queue has work and workers to run it.
    pub const ACTIVE: &str = "Active";
    /// The `sluice.dev/paused` annotation is set.
    pub const PAUSED: &str = "Paused";
    /// Something the queue depends on is unavailable; replicas are kept.
    pub const DEGRADED: &str = sluice_crds::conditions::DEGRADED;

    /// Everything is in place.
    pub const AS_EXPECTED: &str = "AsExpected";
    /// The database Secret does not exist.
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    /// The database Secret lacks the key.
    pub const SECRET_KEY_MISSING: &str = "SecretKeyMissing";
    /// The database could not be reached, or preparing the schema failed.
    pub const DATABASE_UNREACHABLE: &str = "DatabaseUnreachable";
    /// The spec cannot be rendered (the message names the field).
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Another provider serves `external.metrics.k8s.io`; the operator scales 1..N itself.
    pub const EXTERNAL_METRICS_OWNED_ELSEWHERE: &str = "ExternalMetricsOwnedElsewhere";
    /// Nobody serves `external.metrics.k8s.io`; the operator scales 1..N itself.
    pub const EXTERNAL_METRICS_UNAVAILABLE: &str = "ExternalMetricsUnavailable";
    /// KEDA's `ScaledObject` could not be applied (KEDA not installed?).
    pub const KEDA_UNAVAILABLE: &str = "KedaUnavailable";
    /// Ready or running jobs and workers.
    pub const WORKING: &str = "Working";
    /// No ready or running jobs.
    pub const IDLE: &str = "Idle";
    /// Jobs wait and no worker runs yet.
    pub const WAKING: &str = "Waking";
    /// Paused by annotation.
    pub const PAUSED_BY_ANNOTATION: &str = "PausedByAnnotation";
    /// Not paused.
    pub const NOT_PAUSED: &str = "NotPaused";
}

pub use crate::Error;

/// The `Ready` condition's reason for a failed reconcile.
fn condition_reason(e: &Error) -> &'static str {
    match e {
        Error::DatabaseSecret(UrlError::SecretKeyMissing { .. }) => condition::SECRET_KEY_MISSING,
        Error::DatabaseSecret(_) => condition::SECRET_NOT_FOUND,
        Error::Database(_) => condition::DATABASE_UNREACHABLE,
        Error::InvalidJobQueue(_) | Error::InvalidSpec(_) => condition::INVALID_SPEC,
        _ => "KubernetesApiError",
    }
}

/// What the JobQueue controller's reconciles share.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// Publishes Events on JobQueues.
    pub recorder: Recorder,
    /// Per-object error backoff.
    pub backoff: Backoff,
    /// Wall clock (Unix ms); injected so tests can move time.
    pub clock: Clock,
    /// Database connections and the depth cache (shared with the external metrics server).
    pub databases: Arc<Databases>,
    /// LISTEN/NOTIFY per database.
    pub waker: Waker,
    /// Sidecar image and resources.
    pub render: WorkerRenderOptions,
    /// JobQueue metrics.
    pub metrics: Arc<JobQueueMetrics>,
    /// The operator's namespace (an APIService whose service lives here is Sluice's).
    pub namespace: String,
    /// Whether this operator serves `external.metrics.k8s.io` (`SLUICE_EXTERNAL_METRICS`).
    pub external_metrics: bool,
    /// Per-JobQueue memory: when it was last busy, and what the wake-up path needs.
    pub queues: Mutex<HashMap<ObjectRef<JobQueue>, QueueMemory>>,
}

/// What the controller remembers about one JobQueue between reconciles.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueMemory {
    /// [`database_key`] of its database.
    pub database: String,
    /// Its database URL (to read depth on a wake-up).
    pub url: String,
    /// Its queue name.
    pub queue: String,
    /// Unix ms when it was last seen with ready or running jobs.
    pub last_active_ms: i64,
    /// Whether the wake-up path may scale it 0→1 (builtin provider, not paused).
    pub wake_enabled: bool,
    /// `activationThreshold`.
    pub activation: i64,
    /// Replicas at the last reconcile.
    pub replicas: i32,
}

/// The wiring of a running controller: its context and the receiver of its wake-up loop.
pub struct Wiring {
    /// The context.
    pub ctx: Arc<Context>,
    /// NOTIFY wake-ups.
    pub wakes: mpsc::UnboundedReceiver<Wake>,
}

impl Context {
    /// A context and the receivers of its loops. `stop` ends the LISTEN connections.
    #[allow(clippy::too_many_arguments)]
    pub fn wire(
        client: Client,
        instance: Option<String>,
        databases: Arc<Databases>,
        metrics: Arc<JobQueueMetrics>,
        render: WorkerRenderOptions,
        namespace: String,
        external_metrics: bool,
        clock: Clock,
        stop: CancellationToken,
    ) -> Wiring {
        let (wake_tx, wakes) = mpsc::unbounded_channel();
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        let ctx = Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            backoff: Backoff::default(),
            clock,
            databases,
            waker: Waker::new(wake_tx, stop),
            render,
            metrics,
            namespace,
            external_metrics,
            queues: Mutex::default(),
        });
        Wiring { ctx, wakes }
    }

    fn now_ms(&self) -> i64 {
        (self.clock)()
    }

    async fn event(&self, jq: &JobQueue, type_: EventType, reason: &str, note: String) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &jq.object_ref(&())).await {
            tracing::debug!(error = %e, "publishing an event failed");
        }
    }
}

fn key(jq: &JobQueue) -> String {
    format!("{}/{}", jq.namespace().unwrap_or_default(), jq.name_any())
}

/// Reconciles one JobQueue.
pub async fn reconcile(jq: Arc<JobQueue>, ctx: Arc<Context>) -> Result<Action, Error> {
    let oref = ObjectRef::from_obj(&*jq);
    if jq.meta().deletion_timestamp.is_some() {
        // Owned objects are collected by ownerReferences; the database keeps its jobs.
        ctx.queues.lock().unwrap_or_else(|p| p.into_inner()).remove(&oref);
        ctx.metrics
            .forget(&jq.namespace().unwrap_or_default(), &jq.name_any());
        return Ok(Action::await_change());
    }
    match reconcile_inner(&jq, &ctx).await {
        Ok(action) => {
            ctx.backoff.reset(&key(&jq));
            Ok(action)
        }
        Err(e) => {
            report_failure(&jq, &ctx, &e).await;
            Err(e)
        }
    }
}

/// Requeues a failed JobQueue with per-object exponential backoff.
pub fn error_policy(jq: Arc<JobQueue>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.next(&key(&jq));
    tracing::warn!(jobqueue = %key(&jq), error = %error, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn reconcile_inner(jq: &JobQueue, ctx: &Context) -> Result<Action, Error> {
    let ns = jq.namespace().unwrap_or_default();
    let name = jq.name_any();
    let queue = jq.queue_name();
    let paused = jq.is_paused();
    let now = ctx.now_ms();

    // Render first: a spec that cannot run needs no database round trip to be reported.
    let config_map = render_config_map(jq);
    render_worker_deployment(jq, &ctx.render, None)?;

    let url = read_database_url(&ctx.client, jq).await?;
    let settings = QueueSettings::from(&jq.spec.queue_settings(&queue));
    ctx.databases.prepare(&url, &settings, paused).await?;
    let depth = ctx.databases.depth_fresh(&url, &queue).await?;
    if let Some(d) = &depth {
        ctx.metrics.set_depth(&ns, &name, d);
    }

    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let existing = deployments.get_opt(&worker_name(jq)).await?;
    let replicas = existing
        .as_ref()
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(0);

    // Who scales 1..N.
    let (autoscaler, metrics_note) = match jq.spec.scaling.provider {
        ScalingProvider::Keda => (Autoscaler::Keda, None),
        ScalingProvider::Builtin => {
            let owner = apiservice::owner(&ctx.client, &ctx.namespace).await?;
            match owner {
                Owner::Sluice if ctx.external_metrics => (Autoscaler::Hpa, None),
                Owner::Sluice => (
                    Autoscaler::Operator,
                    Some((
                        condition::EXTERNAL_METRICS_UNAVAILABLE,
                        "the external metrics API is switched off in this operator (SLUICE_EXTERNAL_METRICS=false); the operator scales the workers itself".to_owned(),
                    )),
                ),
                Owner::Other(who) => (
                    Autoscaler::Operator,
                    Some((
                        condition::EXTERNAL_METRICS_OWNED_ELSEWHERE,
                        format!(
                            "{} is served by {who}, not Sluice; it is left alone and the operator scales the workers itself (or set scaling.provider: keda)",
                            apiservice::APISERVICE_NAME
                        ),
                    )),
                ),
                Owner::Absent => (
                    Autoscaler::Operator,
                    Some((
                        condition::EXTERNAL_METRICS_UNAVAILABLE,
                        format!("no {} APIService exists; the operator scales the workers itself", apiservice::APISERVICE_NAME),
                    )),
                ),
            }
        }
    };

    // Remember when the queue was last busy; a queue first seen counts as busy now, so an operator
    // restart never cuts a cooldown short.
    let oref = ObjectRef::from_obj(jq);
    let busy = depth.as_ref().is_some_and(|d| d.demand() > 0);
    let last_active_ms = {
        let queues = ctx.queues.lock().unwrap_or_else(|p| p.into_inner());
        match queues.get(&oref) {
            Some(m) if !busy => m.last_active_ms,
            _ => now,
        }
    };
    let scaling = &jq.spec.scaling;
    let policy = Policy {
        min: scaling.min_replica_count,
        max: scaling.max_replica_count,
        target: scaling.target(jq.spec.worker.concurrency),
        activation: i64::from(scaling.activation_threshold),
        cooldown: scaling.cooldown_period.get(),
        paused,
        autoscaler,
    };
    let decision = decide(
        Observation {
            ready: depth.as_ref().map(|d| d.ready),
            running: depth.as_ref().map(|d| d.running),
            replicas,
            last_active_ms,
            now_ms: now,
        },
        policy,
    );
    let target_replicas = decision.scale_to.unwrap_or(replicas);

    // spec.replicas is always applied: the operator's decision, or else the value read just now (the
    // HPA's or KEDA's). Leaving it out would drop this manager's ownership and let the API server reset
    // it to the default of 1 (seen with KEDA at zero). An autoscaler write landing between the read and
    // the apply is undone once and redone on its next sync.
    let apply_replicas = Some(target_replicas);

    // Before replicas go down (by the HPA or by us), make idle workers the cheapest to delete.
    if decision.desired < replicas
        && decision.desired > 0
        && let Err(e) = mark_idle_workers(jq, ctx, &url, &queue).await
    {
        tracing::debug!(jobqueue = %key(jq), error = %e, "setting pod-deletion-cost failed");
    }

    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let config_maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    config_maps
        .patch(&config_map.name_any(), &pp, &Patch::Apply(&config_map))
        .await?;
    let deployment = render_worker_deployment(jq, &ctx.render, apply_replicas)?;
    deployments
        .patch(&worker_name(jq), &pp, &Patch::Apply(&deployment))
        .await?;

    let mut scale_event = None;
    if let Some(to) = decision.scale_to.filter(|_| existing.is_some()) {
        ctx.metrics.scaled(decision.reason.as_str());
        scale_event = Some((decision.reason, replicas, to));
    }

    // The autoscaler.
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
    let mut keda_problem = None;
    match autoscaler {
        Autoscaler::Hpa if !paused => {
            let hpa = render_hpa(jq);
            hpas.patch(&worker_name(jq), &pp, &Patch::Apply(&hpa)).await?;
        }
        Autoscaler::Keda if !paused => {
            delete_if_present(&hpas, &worker_name(jq)).await?;
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &ns, &scaled_object_resource());
            if let Err(e) = api
                .patch(&worker_name(jq), &pp, &Patch::Apply(&render_scaled_object(jq)))
                .await
            {
                keda_problem = Some(format!(
                    "applying the KEDA ScaledObject failed (is KEDA installed?): {e}"
                ));
            }
        }
        _ => delete_if_present(&hpas, &worker_name(jq)).await?,
    }

    // Remember for the wake-up path.
    ctx.waker.watch(&url);
    ctx.queues.lock().unwrap_or_else(|p| p.into_inner()).insert(
        oref,
        QueueMemory {
            database: database_key(&url),
            url: url.clone(),
            queue: queue.clone(),
            last_active_ms,
            wake_enabled: !paused && autoscaler != Autoscaler::Keda,
            activation: i64::from(scaling.activation_threshold),
            replicas: target_replicas,
        },
    );

    // Status.
    let degraded = metrics_note
        .clone()
        .or_else(|| keda_problem.clone().map(|m| (condition::KEDA_UNAVAILABLE, m)));
    let previously_degraded_reason = jq
        .condition(condition::DEGRADED)
        .filter(|c| c.status == "True")
        .map(|c| c.reason.clone());
    let was_ready = jq.condition(condition::READY).map(|c| c.status == "True");
    let active = busy && target_replicas > 0;
    let desired = vec![
        conditions::Desired {
            type_: condition::READY,
            status: true,
            reason: condition::AS_EXPECTED,
            message: format!("queue {queue:?} is registered and its workers are deployed"),
        },
        conditions::Desired {
            type_: condition::ACTIVE,
            status: active,
            reason: if active {
                condition::WORKING
            } else if busy {
                condition::WAKING
            } else {
                condition::IDLE
            },
            message: match &depth {
                Some(d) => format!(
                    "{} ready and {} running jobs, {target_replicas} workers",
                    d.ready, d.running
                ),
                None => "the queue is not registered yet".into(),
            },
        },
        conditions::Desired {
            type_: condition::PAUSED,
            status: paused,
            reason: if paused {
                condition::PAUSED_BY_ANNOTATION
            } else {
                condition::NOT_PAUSED
            },
            message: if paused {
                format!(
                    "{} is set: workers claim nothing and replicas are kept",
                    sluice_crds::job_queue::PAUSED_ANNOTATION
                )
            } else {
                String::new()
            },
        },
        match &degraded {
            Some((reason, message)) => conditions::Desired {
                type_: condition::DEGRADED,
                status: true,
                reason,
                message: message.clone(),
            },
            None => conditions::Desired {
                type_: condition::DEGRADED,
                status: false,
                reason: condition::AS_EXPECTED,
                message: String::new(),
            },
        },
    ];
    let existing_conditions = jq
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let generation = jq.metadata.generation.unwrap_or(0);
    let previous = jq.status.clone().unwrap_or_default();
    let (last_scale_time, last_scale_reason) = match &scale_event {
        Some((reason, _, _)) => (Some(time(now)), Some(reason.as_str().to_owned())),
        None => (
            previous.last_scale_time.clone(),
            previous.last_scale_reason.clone(),
        ),
    };
    let status = JobQueueStatus {
        observed_generation: Some(generation),
        conditions: conditions::set(&existing_conditions, &desired, generation, now),
        depth: depth.as_ref().map(depth_status),
        oldest_ready_job_age_seconds: depth.as_ref().map(|d| d.oldest_ready_age_ms / 1000),
        current_replicas: Some(target_replicas),
        desired_replicas: Some(decision.desired),
        last_scale_time,
        last_scale_reason,
        scaler: Some(
            match autoscaler {
                Autoscaler::Hpa => "builtin",
                Autoscaler::Keda => "keda",
                Autoscaler::Operator => "operator",
            }
            .to_owned(),
        ),
    };
    patch_status(ctx, jq, &status).await?;

    // Events on transitions only.
    if let Some((reason, from, to)) = scale_event {
        ctx.event(
            jq,
            EventType::Normal,
            reason.as_str(),
            format!("scaled workers from {from} to {to}"),
        )
        .await;
    }
    if was_ready != Some(true) {
        ctx.event(
            jq,
            EventType::Normal,
            "Ready",
            format!("queue {queue:?} is registered and its workers are deployed"),
        )
        .await;
    }
    if let Some((reason, message)) = &degraded
        && previously_degraded_reason.as_deref() != Some(*reason)
    {
        ctx.event(jq, EventType::Warning, reason, message.clone()).await;
    }

    let poll = scaling.polling_interval.get();
    Ok(Action::requeue(match decision.recheck_after {
        Some(r) => r.min(poll).max(Duration::from_millis(100)),
        None => poll,
    }))
}

async fn report_failure(jq: &JobQueue, ctx: &Context, e: &Error) {
    let now = ctx.now_ms();
    let generation = jq.metadata.generation.unwrap_or(0);
    let reason = condition_reason(e);
    let mut desired = vec![conditions::Desired {
        type_: condition::READY,
        status: false,
        reason,
        message: e.to_string(),
    }];
    if matches!(e, Error::Database(_)) {
        desired.push(conditions::Desired {
            type_: condition::DEGRADED,
            status: true,
            reason,
            message: "the depth cannot be read: replicas are kept as they are until the database answers"
                .into(),
        });
    }
    let previous = jq.status.clone().unwrap_or_default();
    let status = JobQueueStatus {
        observed_generation: Some(generation),
        conditions: conditions::set(&previous.conditions, &desired, generation, now),
        ..previous.clone()
    };
    let changed = jq
        .condition(condition::READY)
        .is_none_or(|c| c.status != "False" || c.reason != reason);
    if let Err(err) = patch_status(ctx, jq, &status).await {
        tracing::debug!(error = %err, "writing the failure status failed");
    }
    if changed {
        ctx.event(jq, EventType::Warning, reason, e.to_string()).await;
    }
}

async fn patch_status(ctx: &Context, jq: &JobQueue, status: &JobQueueStatus) -> Result<(), Error> {
    let api: Api<JobQueue> = Api::namespaced(ctx.client.clone(), &jq.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "JobQueue",
        "metadata": {"name": jq.name_any()},
        "status": status,
    });
    api.patch_status(
        &jq.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

fn depth_status(d: &Depth) -> DepthStatus {
    DepthStatus {
        ready: d.ready,
        scheduled: d.scheduled,
        running: d.running,
        retrying: d.retrying,
        dead: d.dead,
    }
}

fn time(ms: i64) -> Time {
    Time(Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH))
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sets `controller.kubernetes.io/pod-deletion-cost` on the workers from the leases they hold.
async fn mark_idle_workers(jq: &JobQueue, ctx: &Context, url: &str, queue: &str) -> Result<(), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &jq.namespace().unwrap_or_default());
    let list = pods
        .list(&ListParams::default().labels(&format!("{JOB_QUEUE_LABEL}={}", jq.name_any())))
        .await?;
    let names: Vec<String> = list.items.iter().map(|p| p.name_any()).collect();
    let leases = ctx.databases.leases(url, queue).await?;
    let costs = deletion_costs(&names, &leases);
    for pod in &list.items {
        let Some(cost) = costs.get(&pod.name_any()) else {
            continue;
        };
        let current = pod
            .annotations()
            .get(POD_DELETION_COST_ANNOTATION)
            .and_then(|v| v.parse::<i32>().ok());
        if current == Some(*cost) {
            continue;
        }
        let patch = json!({"metadata": {"annotations": {POD_DELETION_COST_ANNOTATION: cost.to_string()}}});
        pods.patch(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(())
}

/// Handles NOTIFY wake-ups: a queue at zero replicas whose depth exceeds its activation threshold is
/// scaled to one at once (through the Deployment's `/scale`); the Deployment's change then triggers a
/// reconcile through the controller's watch. Runs until `wakes` closes.
pub async fn run_wakeups(ctx: Arc<Context>, mut wakes: mpsc::UnboundedReceiver<Wake>) {
    while let Some(wake) = wakes.recv().await {
        let sleeping: Vec<(ObjectRef<JobQueue>, QueueMemory)> = ctx
            .queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, m)| m.database == wake.database && m.queue == wake.queue)
            .map(|(r, m)| (r.clone(), m.clone()))
            .collect();
        for (oref, memory) in sleeping {
            if memory.wake_enabled
                && memory.replicas == 0
                && let Err(e) = activate(&ctx, &oref, &memory, wake.at).await
            {
                tracing::debug!(jobqueue = %oref, error = %e, "wake-up scale failed; the next poll retries");
            }
        }
    }
}

async fn activate(
    ctx: &Context,
    oref: &ObjectRef<JobQueue>,
    memory: &QueueMemory,
    at: Instant,
) -> Result<(), Error> {
    let Some(depth) = ctx.databases.depth_fresh(&memory.url, &memory.queue).await? else {
        return Ok(());
    };
    if depth.demand() <= memory.activation {
        return Ok(());
    }
    let ns = oref.namespace.clone().unwrap_or_default();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let name = format!("{}-worker", oref.name);
    let scale = deployments.get_scale(&name).await?;
    if scale.spec.and_then(|s| s.replicas).unwrap_or(0) > 0 {
        return Ok(());
    }
    deployments
        .patch_scale(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 1}})),
        )
        .await?;
    ctx.metrics.activation(at.elapsed().as_secs_f64());
    ctx.metrics.scaled(Reason::Activated.as_str());
    if let Some(m) = ctx.queues.lock().unwrap_or_else(|p| p.into_inner()).get_mut(oref) {
        m.replicas = 1;
        m.last_active_ms = ctx.now_ms();
    }
    tracing::info!(jobqueue = %oref, latency = ?at.elapsed(), "woke workers 0 -> 1 on enqueue");
    Ok(())
}

/// Runs the controller (and its wake-up loop) until `shutdown` completes.
pub async fn run(wiring: Wiring, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let Wiring { ctx, wakes } = wiring;
    let client = ctx.client.clone();
    let owned = watcher::Config::default().labels(JOB_QUEUE_LABEL);
    let wakeups = tokio::spawn(run_wakeups(ctx.clone(), wakes));
    Controller::new(Api::<JobQueue>::all(client.clone()), watcher::Config::default())
        .owns(Api::<Deployment>::all(client.clone()), owned.clone())
        .owns(Api::<HorizontalPodAutoscaler>::all(client.clone()), owned.clone())
        .owns(Api::<ConfigMap>::all(client.clone()), owned)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "jobqueue controller event");
            }
        })
        .await;
    wakeups.abort();
}
