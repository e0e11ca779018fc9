//! The `JobQueue` controller: prepares the queue in the team's database, applies the worker ConfigMap and
//! Deployment and the autoscaler (HPA or KEDA `ScaledObject`), scales 0↔1 itself, marks idle workers
//! cheaper to delete before a scale-in, and reports depth, replicas and conditions.
//!
//! Each reconcile, in order (see `steps`): render (a spec that cannot run needs no database round
//! trip); read the database URL from the one Secret the queue names (its own, or its QueueDatabase's);
//! `prepare_database` (schema, settings, paused flag); `observe` depth, replicas and when the queue was
//! last busy; `choose_autoscaler`; `check_ownership` (a same-named ConfigMap, Deployment, HPA or
//! `ScaledObject` the queue does not control stops the reconcile before anything is written or deleted:
//! `Ready=False`, reason `ObjectNotOwned`); [`decide`] (pure); `apply_workers` (deletion costs,
//! ConfigMap, Deployment); `apply_autoscaler`; `remember` what the wake-up path needs; `write_status`.
//!
//! The wake-up path ([`run_wakeups`]) turns a NOTIFY on enqueue into the same [`decide`] on depth read
//! at that moment, and applies a scale-up from zero at once through the Deployment's `/scale`; the
//! Deployment's change then triggers a reconcile. A deleted JobQueue is forgotten (memory, gauges, and
//! the database's LISTEN connection once no other queue uses it) when the controller next finds it gone.
//!
//! The database URL comes from the JobQueue's own Secret, or for `spec.database.queueDatabaseRef` from
//! the QueueDatabase's Secret in the operator's namespace once its `namespaceSelector` admits the
//! JobQueue's namespace ([`secret::database_url`]); QueueDatabases and namespaces are watched, so a
//! QueueDatabase created or changed, or a namespace relabelled, reconciles the JobQueues naming one.
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
        core::v1::{ConfigMap, Namespace, Pod},
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams},
    core::PartialObjectMeta,
    runtime::{
        Controller, Predicate,
        controller::{self as runtime, Action},
        events::EventType,
        predicates,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use sluice_crds::{
    conditions::{ACTIVE, DEGRADED, PAUSED, READY, reason},
    contract::{annotation, label::JOB_QUEUE as JOB_QUEUE_LABEL},
    job_queue::{
        DatabaseSource, DepthStatus, JobQueue, JobQueueSchedule, JobQueueStatus, RowLevelSecurity,
        ScalingProvider, ScheduleStatus, TenantLogin,
    },
    queue_database::QueueDatabase,
};
use sluice_queue::{Depth, QueueSettings, schedule::CronSchedule, store::ScheduleState};
use tokio_util::sync::CancellationToken;

use super::{Context, OwnWrites, api_in, conditions::Desired};
use crate::{
    Error, FIELD_MANAGER, Result,
    external_metrics::apiservice::{self, Owner},
    render::{
        hpa::render_hpa,
        scaled_object::{api_resource as scaled_object_resource, render_scaled_object},
        sidecar_container::SidecarSettings,
        worker_deployment::{render_config_map, render_worker_deployment, schedule_problem, worker_name},
    },
    scaling::{
        Autoscaler, Databases, Decision, JobQueueMetrics, Observation, Policy, Wake, Waker, Wakes,
        databases::database_key,
        decide,
        deletion_cost::{POD_DELETION_COST_ANNOTATION, deletion_costs},
        waker::Handling,
    },
    secret, tenant,
};

/// The controller's name in metrics, logs and spans.
pub const CONTROLLER: &str = "jobqueue";
/// Soonest requeue when a decision asks to be checked again (the end of a cooldown).
pub const RECHECK_FLOOR: Duration = Duration::from_millis(100);
/// Annotation on the worker pod template: [`tenant::password_hash`] of the tenant password the workers
/// log in with, so that a new password rolls them.
pub const TENANT_PASSWORD_HASH_ANNOTATION: &str = "sluice.dev/tenant-password-hash";

/// What a JobQueue controller is built from that outlives a term of leadership.
#[derive(Clone)]
pub struct Settings {
    /// Database pools and the depth cache, shared with the external metrics API.
    pub databases: Arc<Databases>,
    /// JobQueue metrics (depth, scale decisions), shared with `/metrics` and the external metrics API.
    pub metrics: Arc<JobQueueMetrics>,
    /// The sidecar container of worker pods.
    pub sidecar: SidecarSettings,
    /// The operator's namespace (an APIService whose service lives here is Sluice's).
    pub namespace: String,
    /// Whether this operator serves `external.metrics.k8s.io` (`SLUICE_EXTERNAL_METRICS`).
    pub external_metrics: bool,
    /// Where JobQueues are watched and reconciled.
    pub namespaces: super::Namespaces,
}

/// What only this controller keeps. Made fresh at each term of leadership, so a new leader starts with
/// no stale memory of queues.
pub struct State {
    /// What outlives a term.
    pub settings: Settings,
    /// LISTEN/NOTIFY per database.
    pub waker: Waker,
    /// Per-JobQueue memory: when it was last busy, and what the wake-up path needs.
    pub queues: Mutex<HashMap<ObjectRef<JobQueue>, QueueMemory>>,
    /// Tenant Secrets whose role this term has ensured ([`tenant::provision`]).
    pub tenants: tenant::Provisioned,
}

impl State {
    /// The state and its NOTIFY wake-ups (for [`run`]); `stop` ends the LISTEN connections.
    pub fn new(settings: Settings, stop: CancellationToken) -> (Self, Arc<Wakes>) {
        let wakes = Arc::new(Wakes::default());
        let state = Self {
            settings,
            waker: Waker::new(wakes.clone(), stop),
            queues: Mutex::default(),
            tenants: Default::default(),
        };
        (state, wakes)
    }

    fn queues(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<JobQueue>, QueueMemory>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
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
    /// Its worker Deployment.
    pub deployment: String,
    /// Unix ms when it was last seen with ready or running jobs.
    pub last_active_ms: i64,
    /// Its scaling settings, as the decision reads them.
    pub policy: Policy,
    /// Replicas at the last reconcile (or wake-up).
    pub replicas: i32,
}

/// Runs the controller (and its wake-up loop) until `shutdown` completes.
pub async fn run(
    ctx: Arc<Context<State>>,
    wakes: Arc<Wakes>,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let owned = watcher::Config::default().labels(JOB_QUEUE_LABEL);
    let wakeups = tokio::spawn(run_wakeups(ctx.clone(), wakes));
    let shutdown = futures::FutureExt::shared(shutdown);
    // One controller per watched namespace, or one for the whole cluster.
    let runs = ctx.state.settings.namespaces.scopes().into_iter().map(|ns| {
        let (ctx, shutdown, owned) = (ctx.clone(), shutdown.clone(), owned.clone());
        async move {
            let client = ctx.client.clone();
            let ns = ns.as_deref();
            // Changes of the spec, labels or annotations (`sluice.dev/paused`; a user's touch forces a
            // reconcile); status writes, the reconcile's own or anyone's, trigger nothing.
            let (queues, changed) = super::primary_watch(
                api_in::<JobQueue>(&client, ns),
                predicates::generation
                    .combine(predicates::labels)
                    .combine(predicates::annotations),
            );
            let controller =
                Controller::for_stream(changed, queues.clone()).with_config(ctx.controller_config());
            // A QueueDatabase created, changed or deleted, and a namespace relabelled (its selector
            // judges the labels), reconcile the JobQueues naming a QueueDatabase at once.
            let queues_of = queues.clone();
            let by_database = move |qdb: QueueDatabase| {
                let name = qdb.name_any();
                naming_a_queue_database(&queues_of, move |jq| {
                    jq.spec.database.source() == Some(DatabaseSource::QueueDatabase(&name))
                })
            };
            let by_namespace = move |n: Namespace| {
                let name = n.name_any();
                naming_a_queue_database(&queues, move |jq| jq.namespace_or_default() == name)
            };
            let namespaces = match ns {
                Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
                None => watcher::Config::default(),
            };
            // Owned objects changed by anyone but the reconcile itself (an HPA's or a wake-up's scale
            // of the Deployment included).
            let own = ctx.own_writes.clone();
            controller
                .owns_stream(super::owned_changes(
                    api_in::<PartialObjectMeta<Deployment>>(&client, ns),
                    owned.clone(),
                    own.clone(),
                ))
                .owns_stream(super::owned_changes(
                    api_in::<PartialObjectMeta<HorizontalPodAutoscaler>>(&client, ns),
                    owned.clone(),
                    own.clone(),
                ))
                .owns_stream(super::owned_changes(
                    api_in::<PartialObjectMeta<ConfigMap>>(&client, ns),
                    owned,
                    own,
                ))
                .watches(
                    Api::<QueueDatabase>::all(client.clone()),
                    watcher::Config::default(),
                    by_database,
                )
                .watches(Api::<Namespace>::all(client.clone()), namespaces, by_namespace)
                .graceful_shutdown_on(shutdown)
                .run(reconcile, error_policy, ctx.clone())
                .for_each(|r| {
                    let ctx = ctx.clone();
                    async move {
                        match r {
                            // A request for a JobQueue no longer in the cache: it was deleted (its
                            // requeue, or the garbage collection of its Deployment, asked for it).
                            Err(runtime::Error::ObjectNotFound(gone)) => {
                                let mut oref = ObjectRef::<JobQueue>::new(&gone.name);
                                oref.namespace = gone.namespace.clone();
                                forget(&ctx, &oref);
                            }
                            Err(e) => {
                                tracing::debug!(controller = CONTROLLER, error = %e, "controller event")
                            }
                            Ok(_) => {}
                        }
                    }
                })
                .await;
        }
    });
    futures::future::join_all(runs).await;
    // Awaited, so that no wake-up being handled scales a Deployment after this term has ended.
    wakeups.abort();
    let _ = wakeups.await;
}

/// The JobQueues in `queues` that name a QueueDatabase and pass `also`.
fn naming_a_queue_database(
    queues: &Store<JobQueue>,
    also: impl Fn(&JobQueue) -> bool,
) -> Vec<ObjectRef<JobQueue>> {
    queues
        .state()
        .iter()
        .filter(|jq| jq.spec.database.queue_database_ref.is_some() && also(jq))
        .map(|jq| ObjectRef::from_obj(&**jq))
        .collect()
}

/// Reconciles one JobQueue. See the module docs for the steps.
pub async fn reconcile(jq: Arc<JobQueue>, ctx: Arc<Context<State>>) -> Result<Action> {
    super::instrumented(CONTROLLER, &*jq, &ctx, async {
        if jq.meta().deletion_timestamp.is_some() {
            // Owned objects are collected by ownerReferences; the database keeps its jobs.
            forget(&ctx, &ObjectRef::from_obj(&*jq));
            return Ok(Action::await_change());
        }
        match steps(&jq, &ctx).await {
            Ok(action) => Ok(action),
            Err(e) => {
                if matches!(
                    e,
                    Error::NamespaceNotAllowed { .. } | Error::QueueDatabaseNotFound { .. }
                ) && let Err(stop) = stop_workers(&jq, &ctx).await
                {
                    tracing::warn!(jobqueue = %super::key(&*jq), error = %stop, "stopping the workers failed");
                }
                report_failure(&jq, &ctx, &e).await;
                Err(e)
            }
        }
    })
    .await
}

/// Requeues a failed JobQueue with per-object exponential backoff, counting the error by reason.
pub fn error_policy(jq: Arc<JobQueue>, error: &Error, ctx: Arc<Context<State>>) -> Action {
    super::error_policy(CONTROLLER, &*jq, error, &ctx)
}

/// The reconcile's steps, in order.
async fn steps(jq: &JobQueue, ctx: &Context<State>) -> Result<Action> {
    // One "now" for the whole reconcile, read before the depth: a queue seen busy is busy as of this
    // moment, never of a later one (which would stretch its cooldown).
    let now = ctx.now_ms();
    // A QueueDatabase's admission first: a namespace it does not admit is refused (and its workers
    // stopped) whatever its spec holds, so nothing the namespace writes keeps it past that check.
    let admitted = match jq.spec.database.source() {
        Some(DatabaseSource::QueueDatabase(_)) => {
            Some(secret::database_source(&ctx.client, &ctx.state.settings.namespace, jq).await?)
        }
        _ => None,
    };
    // Render next: a spec that cannot run needs no database round trip to be reported.
    render_worker_deployment(jq, &ctx.state.settings.sidecar, None)?;
    let (url, admitting) = match admitted {
        Some(source) => source,
        None => secret::database_source(&ctx.client, &ctx.state.settings.namespace, jq).await?,
    };
    admit_database(jq, ctx, &url)?;
    prepare_database(jq, ctx, &url).await?;
    let (tenant_login, password_hash, tenant_note) =
        provision_tenant(jq, ctx, &url, admitting.as_ref()).await?;
    // Workers and the status follow what provisioning found (the cached object's status may be older).
    let with_login;
    let jq = if let Some((login, role)) = tenant_login
        && jq
            .status
            .as_ref()
            .map(|s| (s.tenant_login, s.tenant_role.as_deref()))
            != Some((Some(login), Some(role.as_str())))
    {
        let mut updated = jq.clone();
        let status = updated.status.get_or_insert_with(Default::default);
        status.tenant_login = Some(login);
        status.tenant_role = Some(role);
        with_login = updated;
        &with_login
    } else {
        jq
    };
    let legacy_note = adopt_legacy_queue(jq, ctx, &url).await?;
    let seen = observe(jq, ctx, &url, now).await?;
    let (autoscaler, metrics_note) = choose_autoscaler(jq, ctx).await?;
    check_ownership(jq, ctx, autoscaler).await?;
    let policy = policy(jq, autoscaler);
    let decision = decide(seen.observation(now), policy);
    let Some(replicas) = apply_workers(jq, ctx, &url, &seen, &decision, password_hash.as_deref()).await?
    else {
        // The Deployment changed after it was read (an HPA's or a wake-up's scale): decide again on
        // what it holds now rather than write a count decided on what it held before.
        return Ok(Action::requeue(RECHECK_FLOOR));
    };
    let keda_problem = apply_autoscaler(jq, ctx, autoscaler).await?;
    remember(jq, ctx, &url, &seen, policy, replicas);
    let degraded = tenant_note
        .map(|m| (reason::TENANT_NOT_PROVISIONED, m))
        .or(metrics_note)
        .or_else(|| keda_problem.map(|m| (reason::KEDA_UNAVAILABLE, m)))
        .or_else(|| schedule_problems(jq).map(|m| (reason::INVALID_SCHEDULE, m)))
        .or_else(|| legacy_note.map(|m| (reason::LEGACY_QUEUE_NOT_ADOPTED, m)));
    let outcome = Outcome {
        seen,
        decision,
        autoscaler,
        replicas,
        degraded,
    };
    write_status(jq, ctx, &outcome, now).await?;
    let poll = jq.spec.scaling.polling_interval.get();
    Ok(Action::requeue(match outcome.decision.recheck_after {
        Some(r) => r.min(poll).max(RECHECK_FLOOR),
        None => poll,
    }))
}

/// Counts the queue's database against the bound on databases per namespace ([`crate::budget`]); stops
/// listening on databases released for being unused.
fn admit_database(jq: &JobQueue, ctx: &Context<State>, url: &str) -> Result<()> {
    let ns = jq.namespace().unwrap_or_default();
    let (admitted, released) = ctx.state.settings.databases.admit(&ns, url);
    for key in released {
        ctx.state.waker.unwatch_key(&key);
    }
    admitted.map_err(|e| Error::too_many(&ns, "PostgreSQL", e))
}

/// The schema (once per database per process), the queue's settings and its paused flag.
async fn prepare_database(jq: &JobQueue, ctx: &Context<State>, url: &str) -> Result<()> {
    let settings = QueueSettings::from(&jq.spec.queue_settings(&jq.database_queue_name()));
    ctx.state
        .settings
        .databases
        .prepare(url, &settings, jq.is_paused())
        .await?;
    Ok(())
}

/// With `rowLevelSecurity: Enabled`, the namespace's tenant login for the workers
/// ([`tenant::provision`]); nothing with `Disabled`. Returns where the workers' login is, and why the
/// queue is degraded if provisioning failed but workers keep the tenant Secret an earlier provisioning
/// wrote (`Degraded`, reason `TenantNotProvisioned`: workers and scaling go on with it). A failure with
/// no such Secret stops the reconcile before any worker is applied (`Ready=False`): workers never get
/// the owner's login instead.
async fn provision_tenant(
    jq: &JobQueue,
    ctx: &Context<State>,
    url: &str,
    admitting: Option<&secret::Admitting>,
) -> Result<(Option<(TenantLogin, String)>, Option<String>, Option<String>)> {
    if jq.spec.database.row_level_security == RowLevelSecurity::Disabled {
        return Ok((None, None, None));
    }
    let pool = ctx.state.settings.databases.pool(url)?;
    match tenant::provision(&ctx.client, &pool, &ctx.state.tenants, jq, url, admitting).await {
        Ok((login, role, hash)) => Ok((Some((login, role)), hash, None)),
        Err(e) => {
            if matches!(e, Error::TenantNotProvisioned { .. } | Error::Database(_))
                && let Some((role, hash)) = tenant::existing_secret(&ctx.client, jq, url).await?
            {
                tracing::warn!(jobqueue = %super::key(jq), error = %e, "tenant provisioning failed; workers keep the tenant Secret");
                Ok((
                    Some((TenantLogin::Provisioned, role)),
                    Some(hash),
                    Some(e.to_string()),
                ))
            } else {
                Err(e)
            }
        }
    }
}

/// Adopts the queue an earlier version named without the namespace (`thumbnails`) into this JobQueue's
/// `<namespace>/<queueName>`, with its jobs, settings and schedules, when this JobQueue is the only one
/// the operator sees claiming that name. Otherwise the old queue is left alone and the message returned
/// (for `Degraded`) says why and how to move it by hand. One lookup by primary key per reconcile while
/// no such queue exists.
///
/// A JobQueue on a `QueueDatabase` never adopts: that database is shared by namespaces that do not
/// trust each other, and being the only claimant the operator sees does not make the old queue this
/// namespace's. An administrator moves it with `sluice.adopt_queue`. The message never names another
/// namespace's JobQueues, only how many there are.
async fn adopt_legacy_queue(jq: &JobQueue, ctx: &Context<State>, url: &str) -> Result<Option<String>> {
    let (short, full) = (jq.queue_name(), jq.database_queue_name());
    if ctx
        .state
        .settings
        .databases
        .store(url)?
        .queue(&short)
        .await?
        .is_none()
    {
        return Ok(None);
    }
    let by_hand = format!(
        "move it with SELECT sluice.adopt_queue('{short}', '<namespace>/{short}') into the queue of the \
         JobQueue it belongs to"
    );
    if jq.spec.database.queue_database_ref.is_some() {
        return Ok(Some(format!(
            "queue {short:?} was named without a namespace by an earlier version; on a shared \
             QueueDatabase it is not adopted into {full:?} automatically: an administrator who knows \
             whose it is can {by_hand}"
        )));
    }
    let mut claimants = 0usize;
    let mut this_one = false;
    for scope in ctx.state.settings.namespaces.scopes() {
        let list = api_in::<JobQueue>(&ctx.client, scope.as_deref())
            .list(&ListParams::default())
            .await?;
        for q in list.items.iter().filter(|q| q.queue_name() == short) {
            claimants += 1;
            this_one |= q.namespace() == jq.namespace() && q.name_any() == jq.name_any();
        }
    }
    if claimants != 1 || !this_one {
        let others = claimants - usize::from(this_one);
        return Ok(Some(format!(
            "queue {short:?} was named without a namespace by an earlier version and {others} other \
             JobQueue{} claim{} it, so it was not adopted into {full:?}: {by_hand}",
            if others == 1 { "" } else { "s" },
            if others == 1 { "s" } else { "" },
        )));
    }
    // No deadline: the adoption moves the whole backlog under a table lock, for as long as that takes.
    let store = sluice_queue::QueueStore::new(ctx.state.settings.databases.pool(url)?);
    match store.adopt_queue(&short, &full).await {
        Ok(moved) => {
            let message = format!(
                "adopted queue {short:?}, named without a namespace by an earlier version, into {full:?} \
                 ({} jobs moved)",
                moved.unwrap_or(0)
            );
            tracing::info!(jobqueue = %ObjectRef::from_obj(jq), "{message}");
            ctx.event(jq, EventType::Normal, reason::LEGACY_QUEUE_ADOPTED, &message)
                .await;
            Ok(None)
        }
        Err(sluice_queue::Error::Conflict(why)) => Ok(Some(format!(
            "queue {short:?} was named without a namespace by an earlier version and could not be \
             adopted into {full:?} ({why}): {by_hand}"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// What a reconcile saw of the queue and its workers.
struct Seen {
    /// Depth read now; `None` when the queue is not registered yet.
    depth: Option<Depth>,
    /// The worker Deployment's `spec.replicas` (0 when it does not exist yet).
    replicas: i32,
    /// Whether the worker Deployment exists.
    deployed: bool,
    /// The worker Deployment's `resourceVersion` when it was read: the operator's replica count is
    /// applied only on top of that version.
    resource_version: Option<String>,
    /// Whether the Deployment's own apply ([`FIELD_MANAGER`]) still owns `spec.replicas` (written so
    /// by earlier versions; see [`apply_workers`]).
    replicas_in_main_apply: bool,
    /// Unix ms when the queue was last busy.
    last_active_ms: i64,
    /// The queue's schedules as the database records them (empty when it has none or they cannot be
    /// read now).
    schedules: Vec<ScheduleState>,
}

impl Seen {
    fn busy(&self) -> bool {
        self.depth.as_ref().is_some_and(|d| d.demand() > 0)
    }

    fn observation(&self, now_ms: i64) -> Observation {
        Observation {
            ready: self.depth.as_ref().map(|d| d.ready),
            running: self.depth.as_ref().map(|d| d.running),
            replicas: self.replicas,
            last_active_ms: self.last_active_ms,
            now_ms,
        }
    }
}

/// Reads depth and the worker Deployment's replicas, and works out when the queue was last busy: busy
/// now (`now_ms`), or when the controller last saw it busy; a queue first seen counts as busy now, so an
/// operator restart never cuts a cooldown short.
async fn observe(jq: &JobQueue, ctx: &Context<State>, url: &str, now_ms: i64) -> Result<Seen> {
    let (ns, name) = (jq.namespace().unwrap_or_default(), jq.name_any());
    let depth = ctx
        .state
        .settings
        .databases
        .depth_fresh(url, &jq.database_queue_name())
        .await?;
    if let Some(d) = &depth {
        ctx.state.settings.metrics.set_depth(&ns, &name, d);
    }
    let schedules = if jq.spec.schedules.is_empty() {
        Vec::new()
    } else {
        match ctx.state.settings.databases.store(url) {
            Ok(store) => store
                .schedules(&jq.database_queue_name())
                .await
                .unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "reading the schedules failed");
                    Vec::new()
                }),
            Err(_) => Vec::new(),
        }
    };
    let existing = Api::<Deployment>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&worker_name(jq))
        .await?;
    let replicas = existing
        .as_ref()
        .and_then(|d| d.spec.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(0);
    let mut seen = Seen {
        depth,
        replicas,
        deployed: existing.is_some(),
        resource_version: existing
            .as_ref()
            .and_then(|d| d.metadata.resource_version.clone()),
        replicas_in_main_apply: existing.as_ref().is_some_and(|d| owns_replicas(d, FIELD_MANAGER)),
        last_active_ms: now_ms,
        schedules,
    };
    if !seen.busy()
        && let Some(m) = ctx.state.queues().get(&ObjectRef::from_obj(jq))
    {
        seen.last_active_ms = m.last_active_ms;
    }
    Ok(seen)
}

/// Who scales between 1 and N, and why not the HPA when it cannot be (a `Degraded` reason and message).
async fn choose_autoscaler(
    jq: &JobQueue,
    ctx: &Context<State>,
) -> Result<(Autoscaler, Option<(&'static str, String)>)> {
    let settings = &ctx.state.settings;
    if jq.spec.scaling.provider == ScalingProvider::Keda {
        return Ok((Autoscaler::Keda, None));
    }
    let api = apiservice::APISERVICE_NAME;
    let note = match apiservice::owner(&ctx.client, &settings.namespace).await? {
        Owner::Sluice if settings.external_metrics => return Ok((Autoscaler::Hpa, None)),
        Owner::Sluice => (
            reason::EXTERNAL_METRICS_UNAVAILABLE,
            "the external metrics API is switched off in this operator (SLUICE_EXTERNAL_METRICS=false); \
             the operator scales the workers itself"
                .to_owned(),
        ),
        Owner::Other(who) => (
            reason::EXTERNAL_METRICS_OWNED_ELSEWHERE,
            format!(
                "{api} is served by {who}, not Sluice; it is left alone and the operator scales the workers \
                 itself (or set scaling.provider: keda)"
            ),
        ),
        Owner::Absent => (
            reason::EXTERNAL_METRICS_UNAVAILABLE,
            format!("no {api} APIService exists; the operator scales the workers itself"),
        ),
    };
    Ok((Autoscaler::Operator, Some(note)))
}

/// The queue's scaling settings as [`decide`] reads them.
fn policy(jq: &JobQueue, autoscaler: Autoscaler) -> Policy {
    let scaling = &jq.spec.scaling;
    Policy {
        min: jq.spec.min_replicas(),
        max: scaling.max_replica_count,
        target: scaling.target(jq.spec.worker.concurrency),
        activation: i64::from(scaling.activation_threshold),
        cooldown: scaling.cooldown_period.get(),
        paused: jq.is_paused(),
        autoscaler,
    }
}

/// The field manager of the worker Deployment's `spec.replicas` (see `apply_workers`).
pub const REPLICAS_FIELD_MANAGER: &str = "sluice-operator-replicas";

/// Applies the operator's count to the worker Deployment `name`'s `spec.replicas` as
/// [`REPLICAS_FIELD_MANAGER`]; with `read_at`, only on top of that `resourceVersion`. `false` (and nothing
/// written) when the Deployment changed since: someone else scaled it, and the count decided on the
/// earlier version must not overwrite theirs.
pub async fn apply_replicas(
    deployments: &Api<Deployment>,
    name: &str,
    replicas: i32,
    read_at: Option<&str>,
) -> Result<bool> {
    Ok(replicas_applied(deployments, name, replicas, read_at)
        .await?
        .is_some())
}

/// [`apply_replicas`], returning the Deployment written (`None`: changed since `read_at`).
async fn replicas_applied(
    deployments: &Api<Deployment>,
    name: &str,
    replicas: i32,
    read_at: Option<&str>,
) -> Result<Option<Deployment>> {
    let mut replicas_only = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas},
    });
    if let Some(rv) = read_at {
        replicas_only["metadata"]["resourceVersion"] = json!(rv);
    }
    let pp = PatchParams::apply(REPLICAS_FIELD_MANAGER).force();
    match deployments.patch(name, &pp, &Patch::Apply(&replicas_only)).await {
        Ok(d) => Ok(Some(d)),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether `manager`'s apply owns the Deployment's `spec.replicas` (per `metadata.managedFields`).
pub fn owns_replicas(deployment: &Deployment, manager: &str) -> bool {
    deployment.metadata.managed_fields.iter().flatten().any(|entry| {
        entry.manager.as_deref() == Some(manager)
            && entry.operation.as_deref() == Some("Apply")
            && entry.subresource.is_none()
            && entry
                .fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:spec"].get("f:replicas").is_some())
    })
}

/// Fails with [`Error::NotOwned`] when an object the reconcile would write or delete (the worker
/// ConfigMap and Deployment, the HPA, and with KEDA the `ScaledObject`) exists and is not controlled by
/// this JobQueue: creating a JobQueue never takes over, rewrites or deletes someone else's object.
async fn check_ownership(jq: &JobQueue, ctx: &Context<State>, autoscaler: Autoscaler) -> Result<()> {
    let ns = jq.namespace().unwrap_or_default();
    let client = &ctx.client;
    let name = worker_name(jq);
    let config_map = render_config_map(jq).name_any();
    super::owned_by(
        &Api::<ConfigMap>::namespaced(client.clone(), &ns),
        "ConfigMap",
        &config_map,
        jq,
    )
    .await?;
    super::owned_by(
        &Api::<Deployment>::namespaced(client.clone(), &ns),
        "Deployment",
        &name,
        jq,
    )
    .await?;
    super::owned_by(
        &Api::<HorizontalPodAutoscaler>::namespaced(client.clone(), &ns),
        "HorizontalPodAutoscaler",
        &name,
        jq,
    )
    .await?;
    if autoscaler == Autoscaler::Keda {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &scaled_object_resource());
        // Any other failure (KEDA not installed) is apply_autoscaler's to report.
        if let Err(e @ Error::NotOwned { .. }) = super::owned_by(&api, "ScaledObject", &name, jq).await {
            return Err(e);
        }
    }
    Ok(())
}

/// Applies the worker ConfigMap and Deployment with the replicas the decision asks for (marking idle
/// workers cheaper to delete first when replicas go down); returns those replicas.
async fn apply_workers(
    jq: &JobQueue,
    ctx: &Context<State>,
    url: &str,
    seen: &Seen,
    decision: &Decision,
    password_hash: Option<&str>,
) -> Result<Option<i32>> {
    let ns = jq.namespace().unwrap_or_default();
    // spec.replicas has a field manager of its own (REPLICAS_FIELD_MANAGER), applied only with the
    // operator's own decisions (and when the Deployment is created), never with a value read earlier: an
    // HPA's or KEDA's write landing between that read and the apply would be undone, and on a real
    // cluster, with NOTIFY wake-ups and short polling intervals, that raced the HPA often enough to
    // scale workers down under it again and again. The Deployment's own apply leaves the field out once
    // the Deployment exists; the replicas manager keeps owning the last count the operator set, so
    // leaving it out never resets it to the default of 1 (seen with KEDA at zero). The count is applied
    // with the resourceVersion the decision was made on: when an HPA (or a NOTIFY wake-up) scaled the
    // Deployment after this reconcile read it, the API server refuses the apply (409) and the reconcile
    // decides again on the new count, rather than put back 1 over the HPA's 3.
    let replicas = decision.scale_to.unwrap_or(seen.replicas);
    // Before replicas go down (by the HPA or by us), make idle workers the cheapest to delete.
    if decision.desired < seen.replicas
        && decision.desired > 0
        && let Err(e) = mark_idle_workers(jq, ctx, url).await
    {
        tracing::debug!(jobqueue = %super::key(jq), error = %e, "setting pod-deletion-cost failed");
    }
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let own = &ctx.own_writes;
    let config_map = render_config_map(jq);
    own.write(
        OwnWrites::key::<ConfigMap>(&ns, &config_map.name_any()),
        Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns).patch(
            &config_map.name_any(),
            &pp,
            &Patch::Apply(&config_map),
        ),
    )
    .await?;
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), &ns);
    let name = worker_name(jq);
    let key = OwnWrites::key::<Deployment>(&ns, &name);
    // The replicas' write as one of the reconcile's own (the wake-up path's is not: it triggers one).
    // `false`: the Deployment changed since `read_at`, and nothing was written.
    let replicas_written = |read_at: Option<String>| {
        let (deployments, name, key) = (&deployments, &name, key.clone());
        async move {
            let written = own
                .write_with(
                    key,
                    replicas_applied(deployments, name, replicas, read_at.as_deref()),
                    |d| d.as_ref()?.metadata.resource_version.clone(),
                )
                .await?;
            Ok::<_, Error>(written.is_some())
        }
    };
    // Before the Deployment's apply drops the field (also when taking it over from an earlier version's
    // apply), so that it is never left without an owner.
    if seen.deployed
        && (decision.scale_to.is_some() || seen.replicas_in_main_apply)
        && !replicas_written(seen.resource_version.clone()).await?
    {
        return Ok(None);
    }
    let render = |replicas: Option<i32>| -> Result<Deployment> {
        let mut deployment = render_worker_deployment(jq, &ctx.state.settings.sidecar, replicas)?;
        // A changed tenant password changes the pod template, so the workers roll onto it.
        if let Some(hash) = password_hash
            && let Some(template) = deployment.spec.as_mut().map(|s| &mut s.template)
        {
            template
                .metadata
                .get_or_insert_with(Default::default)
                .annotations
                .get_or_insert_with(Default::default)
                .insert(TENANT_PASSWORD_HASH_ANNOTATION.into(), hash.into());
        }
        Ok(deployment)
    };
    // A Deployment's write counts as the reconcile's own only when it shows the count the reconcile
    // decided: an apply that changed nothing returns the object as whoever wrote last left it, and a
    // scale since the read (an HPA's, a user's) shows another count and must still reconcile.
    let decided = |d: &Deployment| {
        (d.spec.as_ref().and_then(|s| s.replicas) == Some(replicas))
            .then(|| d.metadata.resource_version.clone())
            .flatten()
    };
    let deployment = render((!seen.deployed).then_some(replicas))?;
    own.write_with(
        key.clone(),
        deployments.patch(&name, &pp, &Patch::Apply(&deployment)),
        decided,
    )
    .await?;
    if !seen.deployed {
        replicas_written(None).await?;
        // The replicas manager owns the count now: the Deployment's apply gives the field up in this
        // reconcile, as every later one applies it, rather than in the next one, whose write would
        // start yet another reconcile through the Deployment's watch.
        let deployment = render(None)?;
        own.write_with(
            key,
            deployments.patch(&name, &pp, &Patch::Apply(&deployment)),
            decided,
        )
        .await?;
    }
    if decision.scale_to.is_some() && seen.deployed {
        ctx.state.settings.metrics.scaled(decision.reason.as_str());
    }
    Ok(Some(replicas))
}

/// Applies the HPA or the KEDA `ScaledObject` (and removes the HPA when it is not wanted). Returns why
/// the ScaledObject could not be applied, if it could not: KEDA may not be installed.
async fn apply_autoscaler(
    jq: &JobQueue,
    ctx: &Context<State>,
    autoscaler: Autoscaler,
) -> Result<Option<String>> {
    let ns = jq.namespace().unwrap_or_default();
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(ctx.client.clone(), &ns);
    let paused = jq.is_paused();
    match autoscaler {
        Autoscaler::Hpa if !paused => {
            ctx.own_writes
                .write(
                    OwnWrites::key::<HorizontalPodAutoscaler>(&ns, &worker_name(jq)),
                    hpas.patch(&worker_name(jq), &pp, &Patch::Apply(&render_hpa(jq))),
                )
                .await?;
        }
        Autoscaler::Keda if !paused => {
            delete_if_present(&hpas, &worker_name(jq)).await?;
            let api: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), &ns, &scaled_object_resource());
            if let Err(e) = api
                .patch(&worker_name(jq), &pp, &Patch::Apply(&render_scaled_object(jq)))
                .await
            {
                return Ok(Some(format!(
                    "applying the KEDA ScaledObject failed (is KEDA installed?): {e}"
                )));
            }
        }
        _ => delete_if_present(&hpas, &worker_name(jq)).await?,
    }
    Ok(None)
}

/// Records what the wake-up path needs, and LISTENs on the queue's database.
fn remember(jq: &JobQueue, ctx: &Context<State>, url: &str, seen: &Seen, policy: Policy, replicas: i32) {
    ctx.state.waker.watch(url);
    let mut queues = ctx.state.queues();
    let oref = ObjectRef::from_obj(jq);
    // A queue that moved to another database: the old one's LISTEN goes when no queue uses it.
    if let Some(old) = queues.get(&oref).filter(|m| m.database != database_key(url)) {
        let old = old.database.clone();
        if !queues.iter().any(|(r, m)| *r != oref && m.database == old) {
            ctx.state.waker.unwatch_key(&old);
        }
    }
    queues.insert(
        ObjectRef::from_obj(jq),
        QueueMemory {
            database: database_key(url),
            url: url.to_owned(),
            queue: jq.database_queue_name(),
            deployment: worker_name(jq),
            last_active_ms: seen.last_active_ms,
            policy,
            replicas,
        },
    );
}

/// Forgets a JobQueue that is gone: its memory, its depth gauges, and its database's LISTEN connection
/// when no other remembered queue uses that database.
fn forget(ctx: &Context<State>, oref: &ObjectRef<JobQueue>) {
    let mut queues = ctx.state.queues();
    let Some(gone) = queues.remove(oref) else {
        return;
    };
    ctx.state
        .settings
        .metrics
        .forget(oref.namespace.as_deref().unwrap_or_default(), &oref.name);
    if !queues.values().any(|m| m.database == gone.database) {
        ctx.state.waker.unwatch(&gone.url);
    }
    tracing::debug!(jobqueue = %oref, "forgot a deleted JobQueue");
}

/// What a reconcile found and did, for its status.
struct Outcome {
    /// What it saw.
    seen: Seen,
    /// What it decided.
    decision: Decision,
    /// Who scales between 1 and N.
    autoscaler: Autoscaler,
    /// The replicas it applied.
    replicas: i32,
    /// Why the queue is degraded (reason, message), if it is.
    degraded: Option<(&'static str, String)>,
}

/// Writes the status (conditions, depth, replicas, scaler) and publishes Events on transitions: a scale
/// the operator made, becoming ready, becoming degraded for a new reason.
async fn write_status(jq: &JobQueue, ctx: &Context<State>, outcome: &Outcome, now: i64) -> Result<()> {
    let Outcome {
        seen,
        decision,
        autoscaler,
        replicas,
        degraded,
    } = outcome;
    let replicas = *replicas;
    let queue = jq.database_queue_name();
    let paused = jq.is_paused();
    let busy = seen.busy();
    let active = busy && replicas > 0;
    let own_login_is_tenant = jq.status.as_ref().and_then(|s| s.tenant_login) == Some(TenantLogin::SecretRef);
    let role = jq
        .status
        .as_ref()
        .and_then(|s| s.tenant_role.clone())
        .unwrap_or_default();
    let ready_message = match jq.spec.database.row_level_security {
        RowLevelSecurity::Enabled if own_login_is_tenant => format!(
            "queue {queue:?} is registered and its workers are deployed; the queue is isolated as \
             tenant {role:?}: spec.database.secretRef's login is this namespace's registered tenant, \
             and workers use that Secret as it is"
        ),
        RowLevelSecurity::Enabled => format!(
            "queue {queue:?} is registered and its workers are deployed, logged in as the namespace's \
             tenant role {role:?}"
        ),
        RowLevelSecurity::Disabled => format!(
            "queue {queue:?} is registered and its workers are deployed; rowLevelSecurity is Disabled: \
             they log in with spec.database.secretRef's login, and namespaces sharing this database are \
             not isolated from each other"
        ),
    };
    let desired = [
        Desired {
            type_: READY,
            status: true,
            reason: reason::AS_EXPECTED,
            message: ready_message.clone(),
        },
        Desired {
            type_: ACTIVE,
            status: active,
            reason: if active {
                reason::WORKING
            } else if busy {
                reason::WAKING
            } else {
                reason::IDLE
            },
            message: match &seen.depth {
                Some(d) => format!(
                    "{} ready and {} running jobs, {replicas} workers",
                    d.ready, d.running
                ),
                None => "the queue is not registered yet".into(),
            },
        },
        Desired {
            type_: PAUSED,
            status: paused,
            reason: if paused {
                reason::PAUSED_BY_ANNOTATION
            } else {
                reason::NOT_PAUSED
            },
            message: if paused {
                format!(
                    "{} is set: workers claim nothing and replicas are kept",
                    annotation::PAUSED
                )
            } else {
                String::new()
            },
        },
        match &degraded {
            Some((why, message)) => Desired {
                type_: DEGRADED,
                status: true,
                reason: why,
                message: message.clone(),
            },
            None => Desired {
                type_: DEGRADED,
                status: false,
                reason: reason::AS_EXPECTED,
                message: String::new(),
            },
        },
    ];
    let scaled = decision
        .scale_to
        .filter(|_| seen.deployed)
        .map(|to| (decision.reason, seen.replicas, to));
    let previous = jq.status.clone().unwrap_or_default();
    let generation = jq.metadata.generation.unwrap_or(0);
    let (last_scale_time, last_scale_reason) = match &scaled {
        Some((why, _, _)) => (Some(time(now)), Some(why.as_str().to_owned())),
        None => (
            previous.last_scale_time.clone(),
            previous.last_scale_reason.clone(),
        ),
    };
    let status = JobQueueStatus {
        observed_generation: Some(generation),
        conditions: super::conditions::set(&previous.conditions, &desired, generation, now),
        depth: seen.depth.as_ref().map(depth_status),
        oldest_ready_job_age_seconds: seen.depth.as_ref().map(|d| d.oldest_ready_age_ms / 1000),
        current_replicas: Some(replicas),
        desired_replicas: Some(decision.desired),
        last_scale_time,
        last_scale_reason,
        scaler: Some(
            match *autoscaler {
                Autoscaler::Hpa => "builtin",
                Autoscaler::Keda => "keda",
                Autoscaler::Operator => "operator",
            }
            .to_owned(),
        ),
        schedules: jq
            .spec
            .schedules
            .iter()
            .map(|s| schedule_status(s, &seen.schedules, now))
            .collect(),
        tenant_login: jq.status.as_ref().and_then(|s| s.tenant_login),
        tenant_role: jq.status.as_ref().and_then(|s| s.tenant_role.clone()),
    };
    ctx.patch_status(jq, &status).await?;

    if let Some((why, from, to)) = scaled {
        ctx.event(
            jq,
            EventType::Normal,
            why.as_str(),
            &format!("scaled workers from {from} to {to}"),
        )
        .await;
    }
    if jq.condition(READY).map(|c| c.status == "True") != Some(true) {
        ctx.event(jq, EventType::Normal, READY, &ready_message).await;
    }
    let previously_degraded = jq
        .condition(DEGRADED)
        .filter(|c| c.status == "True")
        .map(|c| c.reason.clone());
    if let Some((why, message)) = degraded
        && previously_degraded.as_deref() != Some(*why)
    {
        ctx.event(jq, EventType::Warning, why, message).await;
    }
    Ok(())
}

/// A failed reconcile: `Ready=False` with the error's reason (and `Degraded` when the depth cannot be
/// read), and a Warning Event when the reason changes. Replicas are left as they are.
async fn report_failure(jq: &JobQueue, ctx: &Context<State>, e: &Error) {
    let now = ctx.now_ms();
    let generation = jq.metadata.generation.unwrap_or(0);
    let why = e.condition_reason();
    let mut desired = vec![Desired {
        type_: READY,
        status: false,
        reason: why,
        message: e.to_string(),
    }];
    if matches!(e, Error::Database(_)) {
        desired.push(Desired {
            type_: DEGRADED,
            status: true,
            reason: why,
            message: "the depth cannot be read: replicas are kept as they are until the database answers"
                .into(),
        });
    }
    let previous = jq.status.clone().unwrap_or_default();
    let status = JobQueueStatus {
        observed_generation: Some(generation),
        conditions: super::conditions::set(&previous.conditions, &desired, generation, now),
        ..previous
    };
    let changed = jq
        .condition(READY)
        .is_none_or(|c| c.status != "False" || c.reason != why);
    if let Err(err) = ctx.patch_status(jq, &status).await {
        tracing::debug!(error = %err, "writing the failure status failed");
    }
    if changed {
        ctx.event(jq, EventType::Warning, why, &e.to_string()).await;
    }
}

fn depth_status(d: &Depth) -> DepthStatus {
    DepthStatus {
        ready: d.ready,
        blocked: d.blocked,
        scheduled: d.scheduled,
        running: d.running,
        retrying: d.retrying,
        dead: d.dead,
    }
}

/// The schedules that cannot run, each named with why (`Degraded=True` and a Warning Event say so; the
/// admission webhook refuses such a spec where it runs, so this is for clusters without it).
fn schedule_problems(jq: &JobQueue) -> Option<String> {
    let bad: Vec<String> = jq
        .spec
        .schedules
        .iter()
        .filter_map(|s| schedule_problem(s).map(|p| format!("schedule {:?}: {p}", s.name)))
        .collect();
    (!bad.is_empty()).then(|| format!("{}; it does not fire (the other schedules do)", bad.join("; ")))
}

/// A schedule's status: its last and next fire time as the database records them (the next one worked
/// out here before any worker has run it), or why it cannot run.
fn schedule_status(s: &JobQueueSchedule, rows: &[ScheduleState], now_ms: i64) -> ScheduleStatus {
    let row = rows.iter().find(|r| r.name == s.name);
    let problem = schedule_problem(s);
    let next = row.and_then(|r| r.next_fire_at).or_else(|| {
        let now = chrono::DateTime::from_timestamp_millis(now_ms)?;
        CronSchedule::parse(&s.cron, s.time_zone.as_deref())
            .ok()?
            .next_after(now)
    });
    ScheduleStatus {
        name: s.name.clone(),
        last_fire_time: row
            .and_then(|r| r.last_fire_at)
            .map(|t| time(t.timestamp_millis())),
        next_fire_time: if problem.is_some() {
            None
        } else {
            next.map(|t| time(t.timestamp_millis()))
        },
        message: problem,
    }
}

fn time(ms: i64) -> Time {
    Time(Timestamp::from_millisecond(ms).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Scales the JobQueue's worker Deployment to zero and deletes its HorizontalPodAutoscaler or
/// ScaledObject (which would scale it up again), when they are the JobQueue's: its QueueDatabase no longer serves its namespace.
/// A later admission applies both again.
async fn stop_workers(jq: &JobQueue, ctx: &Context<State>) -> Result<()> {
    let ns = jq.namespace().unwrap_or_default();
    let name = worker_name(jq);
    let hpas = Api::<HorizontalPodAutoscaler>::namespaced(ctx.client.clone(), &ns);
    if super::owned_by(&hpas, "HorizontalPodAutoscaler", &name, jq).await? {
        delete_if_present(&hpas, &name).await?;
    }
    // KEDA's ScaledObject likewise (absent, or KEDA not installed: nothing to do).
    let scaled: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), &ns, &scaled_object_resource());
    if let Ok(true) = super::owned_by(&scaled, "ScaledObject", &name, jq).await {
        delete_if_present(&scaled, &name).await?;
    }
    let deployments = Api::<Deployment>::namespaced(ctx.client.clone(), &ns);
    if super::owned_by(&deployments, "Deployment", &name, jq).await? {
        apply_replicas(&deployments, &name, 0, None).await?;
    }
    Ok(())
}

async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<()>
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
async fn mark_idle_workers(jq: &JobQueue, ctx: &Context<State>, url: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &jq.namespace().unwrap_or_default());
    let list = pods
        .list(&ListParams::default().labels(&format!("{JOB_QUEUE_LABEL}={}", jq.name_any())))
        .await?;
    let names: Vec<String> = list.items.iter().map(|p| p.name_any()).collect();
    let leases = ctx
        .state
        .settings
        .databases
        .leases(url, &jq.database_queue_name())
        .await?;
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

/// Handles NOTIFY wake-ups ([`Wakes`]: one at a time per database, databases side by side): each
/// remembered queue at zero replicas on the notified database and queue is decided again at once
/// (`wake_up`). Runs until aborted; the wake-ups being handled end with it.
pub async fn run_wakeups(ctx: Arc<Context<State>>, wakes: Arc<Wakes>) {
    let mut handling = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            (wake, handled) = wakes.next() => {
                handling.spawn(wake_queues(ctx.clone(), wake, handled));
            }
            Some(_) = handling.join_next() => {}
        }
    }
}

/// Wakes the queues `wake` names; `handled` lets its database's next wake-up go when this ends.
async fn wake_queues(ctx: Arc<Context<State>>, wake: Wake, handled: Handling) {
    let asleep: Vec<(ObjectRef<JobQueue>, QueueMemory)> = ctx
        .state
        .queues()
        .iter()
        .filter(|(_, m)| m.database == wake.database && m.queue == wake.queue && m.replicas == 0)
        .map(|(r, m)| (r.clone(), m.clone()))
        .collect();
    for (oref, memory) in asleep {
        if let Err(e) = wake_up(&ctx, &oref, &memory, wake.at).await {
            tracing::debug!(jobqueue = %oref, error = %e, "wake-up scale failed; the next poll retries");
        }
    }
    drop(handled);
}

/// The wake-up path's decision: the reconcile's own [`decide`], on the depth read now and the settings
/// of the last reconcile. A scale-up from zero is applied at once through the Deployment's `/scale`
/// (unless something else woke the workers meanwhile); anything else waits for the next reconcile.
async fn wake_up(
    ctx: &Context<State>,
    oref: &ObjectRef<JobQueue>,
    memory: &QueueMemory,
    at: Instant,
) -> Result<()> {
    let depth = ctx
        .state
        .settings
        .databases
        .depth_fresh(&memory.url, &memory.queue)
        .await?;
    let now = ctx.now_ms();
    let decision = decide(
        Observation {
            ready: depth.as_ref().map(|d| d.ready),
            running: depth.as_ref().map(|d| d.running),
            replicas: memory.replicas,
            last_active_ms: memory.last_active_ms,
            now_ms: now,
        },
        memory.policy,
    );
    let Some(to) = decision.scale_to.filter(|to| *to > memory.replicas) else {
        return Ok(());
    };
    let deployments: Api<Deployment> =
        Api::namespaced(ctx.client.clone(), oref.namespace.as_deref().unwrap_or_default());
    let mut scale = deployments.get_scale(&memory.deployment).await?;
    if scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0) > 0 {
        return Ok(());
    }
    // Replaced on the version just read (its resourceVersion kept): if a reconcile or an HPA scaled the
    // workers in between, the API server refuses (409) and their count stands.
    scale.spec.get_or_insert_with(Default::default).replicas = Some(to);
    match deployments
        .replace_scale(&memory.deployment, &PostParams::default(), &scale)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let metrics = &ctx.state.settings.metrics;
    metrics.activation(at.elapsed().as_secs_f64());
    metrics.scaled(decision.reason.as_str());
    if let Some(m) = ctx.state.queues().get_mut(oref) {
        m.replicas = to;
        m.last_active_ms = now;
    }
    tracing::info!(jobqueue = %oref, to, reason = decision.reason.as_str(), latency = ?at.elapsed(), "woke workers on enqueue");
    Ok(())
}
