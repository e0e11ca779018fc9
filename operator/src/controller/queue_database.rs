//! The `QueueDatabase` controller: revokes the tenants of namespaces a QueueDatabase no longer admits
//! ([`crate::revocation`]), and all of them when it is deleted.
//!
//! Each reconcile logs into the database as its owner, reads the registry of tenants and revokes every
//! namespace the QueueDatabase admitted once and its (valid) selector admits no more; the `Ready`
//! condition and Events say what the calls did. It runs when the QueueDatabase or any namespace's
//! labels change, and every [`RECHECK`] besides (a provisioning that raced a revocation, a Secret that
//! could not be deleted, a database that did not answer). An invalid selector revokes nothing.
//!
//! Deleting a QueueDatabase revokes every namespace it admitted: the finalizer [`FINALIZER`] holds the
//! object until that is done, so that removing the object is never a way to leave tenants logged in.
//! Each pass over a deleted QueueDatabase first retires it in the database, by uid
//! ([`revocation::retire`]): provisioning through it is refused from then on, in the database, so a
//! JobQueue reconcile that read the QueueDatabase before its deletion cannot record an admission after
//! the revocation. A JobQueue is provisioned through a QueueDatabase only once it carries the finalizer
//! ([`sluice_crds::queue_database::QueueDatabase::serves`]).
//! An admin who deletes and re-creates it cuts its namespaces off until their JobQueues are provisioned
//! again (new passwords, workers rolled). While the owner's Secret cannot be read the finalizer stays:
//! remove it by hand to delete the object without revoking.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller,
        controller::Action,
        events::EventType,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use serde_json::json;
use sluice_crds::{
    conditions::{READY, reason},
    queue_database::{QueueDatabase, QueueDatabaseStatus},
};

use super::{Context, conditions::Desired};
use crate::{Error, FIELD_MANAGER, Result, revocation, secret, tenant};

/// The controller's name in metrics and logs.
pub const CONTROLLER: &str = "queuedatabase";
/// Holds a deleted QueueDatabase until its namespaces are revoked.
pub const FINALIZER: &str = sluice_crds::queue_database::REVOKE_FINALIZER;
/// How often each QueueDatabase is reconciled when nothing triggers it.
pub const RECHECK: Duration = Duration::from_secs(60);

/// How soon a sweep that left a revocation incomplete runs again (a fixed delay: the reconcile itself
/// succeeded, which resets the error backoff).
pub const RETRY_INCOMPLETE: Duration = Duration::from_secs(10);

/// What only this controller keeps.
pub struct State {
    /// The operator's namespace, holding the owners' Secrets.
    pub namespace: String,
}

/// Runs the controller until `shutdown` completes.
pub async fn run(ctx: Arc<Context<State>>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let client = ctx.client.clone();
    // The spec, and the deletion mark (which the test API server sets without a new generation).
    let (databases, changed) =
        super::primary_watch(Api::<QueueDatabase>::all(client.clone()), |q: &QueueDatabase| {
            let deleting = q.meta().deletion_timestamp.is_some();
            Some(q.meta().generation.unwrap_or_default() as u64 * 2 + u64::from(deleting))
        });
    let every = databases.clone();
    Controller::for_stream(changed, databases)
        .with_config(ctx.controller_config())
        .watches(
            Api::<Namespace>::all(client),
            watcher::Config::default(),
            move |_: Namespace| all(&every),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(controller = CONTROLLER, error = %e, "controller event");
            }
        })
        .await;
}

fn all(databases: &Store<QueueDatabase>) -> Vec<ObjectRef<QueueDatabase>> {
    databases
        .state()
        .iter()
        .map(|q| ObjectRef::from_obj(&**q))
        .collect()
}

/// Reconciles one QueueDatabase: the finalizer, the sweep, the status.
pub async fn reconcile(qdb: Arc<QueueDatabase>, ctx: Arc<Context<State>>) -> Result<Action> {
    super::instrumented(CONTROLLER, &*qdb, &ctx, async {
        let deleting = qdb.meta().deletion_timestamp.is_some();
        let held = qdb.finalizers().iter().any(|f| f == FINALIZER);
        if deleting && !held {
            return Ok(Action::await_change());
        }
        if !held {
            set_finalizer(&qdb, &ctx, true).await?;
        }
        match sweep(&qdb, &ctx, deleting).await {
            Ok(report) => {
                report_sweep(&qdb, &ctx, &report).await;
                if report.complete() {
                    if deleting {
                        // Released after a pass that found nothing left to revoke. Each pass retires
                        // the QueueDatabase in the database first, which waits for provisionings
                        // through it under way and refuses later ones, so nothing is admitted after
                        // the pass that revoked.
                        if report.revoked.is_empty() && report.released.is_empty() {
                            set_finalizer(&qdb, &ctx, false).await?;
                            return Ok(Action::await_change());
                        }
                        return Ok(Action::requeue(Duration::from_secs(1)));
                    }
                    Ok(Action::requeue(RECHECK))
                } else {
                    Ok(Action::requeue(RETRY_INCOMPLETE))
                }
            }
            Err(e) => {
                report_failure(&qdb, &ctx, &e).await;
                Err(e)
            }
        }
    })
    .await
}

/// Requeues a failed QueueDatabase with per-object exponential backoff.
pub fn error_policy(qdb: Arc<QueueDatabase>, error: &Error, ctx: Arc<Context<State>>) -> Action {
    super::error_policy(CONTROLLER, &*qdb, error, &ctx)
}

/// Revokes what `qdb` no longer admits (everything when `deleting`).
async fn sweep(qdb: &QueueDatabase, ctx: &Context<State>, deleting: bool) -> Result<revocation::Report> {
    let name = qdb.name_any();
    // An invalid selector revokes nothing: a typo must not cut every tenant off.
    if !deleting {
        qdb.spec
            .admits(&BTreeMap::new())
            .map_err(|why| Error::QueueDatabaseSelectorInvalid {
                name: name.clone(),
                why,
            })?;
    }
    let url = owner_url(qdb, ctx).await?;
    let database = tenant::database_id(&url).ok_or_else(|| Error::SecretKeyMissing {
        namespace: ctx.state.namespace.clone(),
        name: qdb.spec.secret_ref.name.clone(),
        key: qdb.spec.secret_ref.key.clone(),
        field: format!("QueueDatabase {name:?} spec.secretRef (not a postgres:// URL)"),
    })?;
    let labels: HashMap<String, BTreeMap<String, String>> = Api::<Namespace>::all(ctx.client.clone())
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|n| (n.name_any(), n.metadata.labels.unwrap_or_default()))
        .collect();
    // Other QueueDatabases on the same database, live, whose owner URL the operator can read.
    let mut others = Vec::new();
    for other in Api::<QueueDatabase>::all(ctx.client.clone())
        .list(&Default::default())
        .await?
        .items
    {
        // Only one the operator has taken over and that is not being deleted: an admission passed to
        // any other might never be swept.
        if other.name_any() == name || !other.serves() {
            continue;
        }
        // One whose Secret is missing serves nobody; any other failure to read it fails the sweep
        // rather than revoke a namespace it may serve.
        let u = match owner_url(&other, ctx).await {
            Ok(u) => u,
            Err(Error::SecretNotFound { .. } | Error::SecretKeyMissing { .. }) => continue,
            Err(e) => return Err(e),
        };
        if tenant::database_id(&u).as_deref() == Some(database.as_str()) {
            others.push(other);
        }
    }
    // A namespace that no longer exists is admitted by none.
    let judged =
        |q: &QueueDatabase, ns: &str| labels.get(ns).is_some_and(|l| q.spec.admits(l).unwrap_or(false));
    let pool = sluice_queue::pool::options(1)
        .connect(&url)
        .await
        .map_err(|e| Error::Database(sluice_queue::store::map_db_error(e)))?;
    let result = async {
        let registry: Option<String> =
            sqlx::query_scalar("SELECT pg_catalog.to_regclass('sluice.tenants')::text")
                .fetch_one(&pool)
                .await
                .map_err(|e| Error::Database(sluice_queue::store::map_db_error(e)))?;
        if registry.is_none() {
            // No schema yet: no tenant to revoke.
            return Ok(revocation::Report::default());
        }
        schema_for_revoking(&pool, &url).await?;
        // Retired first, so that no provisioning through it records an admission after this pass;
        // revoked all the same when that fails (a provisioning through it held it past the lock
        // timeout), the finalizer staying until a pass has done both.
        let unretired = if deleting {
            let uid = qdb.meta().uid.clone().unwrap_or_default();
            revocation::retire(&pool, &uid, &name)
                .await
                .err()
                .map(|e| e.to_string())
        } else {
            None
        };
        let mut report = revocation::sweep(
            &ctx.client,
            &pool,
            &name,
            &database,
            |ns| !deleting && judged(qdb, ns),
            |ns| {
                others
                    .iter()
                    .filter(|o| judged(o, ns))
                    .map(|o| o.name_any())
                    .collect()
            },
        )
        .await?;
        report.unretired = unretired;
        Ok(report)
    }
    .await;
    pool.close().await;
    result
}

/// The migration that made what revoking reads (0028): a pass brings an older schema up to date first,
/// and leaves a newer one to the JobQueue controller.
pub const REVOCATION_SCHEMA_VERSION: i64 = 28;

/// Makes sure the schema at `url` has what revoking reads: migrates it
/// ([`sluice_queue::schema::migrate_url`], its lock waits ended by the server after 10 s) only when it
/// is older than [`REVOCATION_SCHEMA_VERSION`].
async fn schema_for_revoking(pool: &sqlx::PgPool, url: &str) -> Result<()> {
    let version: Option<i64> =
        sqlx::query_scalar("SELECT pg_catalog.max(version) FROM sluice._sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await
            .map_err(|e| Error::Database(sluice_queue::store::map_db_error(e)))?;
    if version.unwrap_or(0) >= REVOCATION_SCHEMA_VERSION {
        return Ok(());
    }
    Ok(sluice_queue::schema::migrate_url(url).await?)
}

async fn owner_url(qdb: &QueueDatabase, ctx: &Context<State>) -> Result<String> {
    let field = format!(
        "QueueDatabase {:?} spec.secretRef (an administrator must fix it)",
        qdb.name_any()
    );
    secret::read_url(&ctx.client, &ctx.state.namespace, &qdb.spec.secret_ref, &field).await
}

/// Adds (`hold`) or removes the finalizer, on the version read.
async fn set_finalizer(qdb: &QueueDatabase, ctx: &Context<State>, hold: bool) -> Result<()> {
    let mut finalizers: Vec<String> = qdb
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    if hold {
        finalizers.push(FINALIZER.into());
    }
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": qdb.resource_version(),
    }});
    Api::<QueueDatabase>::all(ctx.client.clone())
        .patch(&qdb.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// The status and Events of a sweep: what it did, as the database and the API server answered.
async fn report_sweep(qdb: &QueueDatabase, ctx: &Context<State>, report: &revocation::Report) {
    let (revoked, unfinished): (Vec<_>, Vec<_>) = report.revoked.iter().partition(|r| r.complete());
    let (released, unreleased): (Vec<_>, Vec<_>) = report.released.iter().partition(|(_, r)| r.is_ok());
    let release = |(ns, r): &&(String, Result<usize, String>)| match r {
        Ok(n) => format!("{ns} (another QueueDatabase admits it: {n} tenant Secret(s) deleted)"),
        Err(e) => format!("{ns} (another QueueDatabase admits it: its tenant Secret NOT deleted: {e})"),
    };
    // What succeeded, then what did not (and why the sweep stopped, if it did).
    let mut done = Vec::new();
    if !revoked.is_empty() {
        let list: Vec<String> = revoked.iter().map(ToString::to_string).collect();
        done.push(format!("revoked: {}", list.join("; ")));
    }
    if !released.is_empty() {
        let list: Vec<String> = released.iter().map(release).collect();
        done.push(format!("released: {}", list.join("; ")));
    }
    let (ended, unended): (Vec<_>, Vec<_>) = report.lingering.iter().partition(|(_, r)| r.is_ok());
    if !ended.is_empty() {
        let list: Vec<String> = ended
            .iter()
            .map(|(ns, r)| format!("{ns} ({} session(s))", r.as_ref().copied().unwrap_or_default()))
            .collect();
        done.push(format!("sessions of revoked roles ended: {}", list.join("; ")));
    }
    let mut failed: Vec<String> = unfinished.iter().map(ToString::to_string).collect();
    failed.extend(unended.iter().map(|(ns, r)| {
        format!(
            "{ns} (sessions of its revoked role NOT ended: {})",
            r.as_ref().err().cloned().unwrap_or_default()
        )
    }));
    failed.extend(unreleased.iter().map(release));
    if let Some(why) = &report.stopped {
        failed.push(format!("stopped before the end: {why}"));
    }
    if let Some(why) = &report.unretired {
        failed.push(format!(
            "not yet retired in the database (provisioning through it is not refused there yet; the \
             finalizer stays until it is): {why}"
        ));
    }
    let desired = if report.complete() {
        let mut message = format!("{} admitted namespace(s) with a tenant", report.admitted.len());
        for part in &done {
            message.push_str(&format!("; {part}"));
        }
        Desired {
            type_: READY,
            status: true,
            reason: reason::AS_EXPECTED,
            message,
        }
    } else {
        let mut message = format!(
            "revoking namespaces it no longer admits is incomplete (the operator retries): {}",
            failed.join("; ")
        );
        for part in &done {
            message.push_str(&format!("; {part}"));
        }
        Desired {
            type_: READY,
            status: false,
            reason: reason::REVOCATION_FAILED,
            message,
        }
    };
    // A Normal Event for what was done, whatever else failed; a Warning for what was not.
    if !done.is_empty() {
        ctx.event(qdb, EventType::Normal, reason::TENANTS_REVOKED, &done.join("; "))
            .await;
    }
    if !failed.is_empty() {
        ctx.event(
            qdb,
            EventType::Warning,
            reason::REVOCATION_FAILED,
            &failed.join("; "),
        )
        .await;
    }
    write_status(qdb, ctx, desired).await;
}

async fn report_failure(qdb: &QueueDatabase, ctx: &Context<State>, e: &Error) {
    let why = e.condition_reason();
    let changed = qdb
        .condition(READY)
        .is_none_or(|c| c.status != "False" || c.reason != why);
    write_status(
        qdb,
        ctx,
        Desired {
            type_: READY,
            status: false,
            reason: why,
            message: format!("no namespace was revoked: {e}"),
        },
    )
    .await;
    if changed {
        ctx.event(qdb, EventType::Warning, why, &e.to_string()).await;
    }
}

async fn write_status(qdb: &QueueDatabase, ctx: &Context<State>, desired: Desired) {
    let generation = qdb.metadata.generation.unwrap_or(0);
    let previous = qdb.status.clone().unwrap_or_default();
    let status = QueueDatabaseStatus {
        observed_generation: Some(generation),
        conditions: super::conditions::set(&previous.conditions, &[desired], generation, ctx.now_ms()),
    };
    let body = json!({
        "apiVersion": QueueDatabase::api_version(&()),
        "kind": QueueDatabase::kind(&()),
        "metadata": {"name": qdb.name_any()},
        "status": status,
    });
    if let Err(e) = Api::<QueueDatabase>::all(ctx.client.clone())
        .patch_status(
            &qdb.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        tracing::debug!(error = %e, "writing the QueueDatabase's status failed");
    }
}
