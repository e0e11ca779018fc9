//! The controllers, `RateLimitPolicy`, `JobQueue` and `QueueDatabase`, and what they share. All have
//! one shape:
//!
//! - one [`Context`]: the client, the Event recorder, the metrics, per-object backoff, the clock, the
//!   bound on reconciles at once ([`Context::controller_config`]), and the controller's own `state`;
//! - `reconcile(object, ctx)`: a short list of named steps run inside [`instrumented`], which opens the
//!   `reconcile` span (`controller`, `object`, `generation`, `outcome`), counts and times it
//!   (`sluice_operator_reconcile_total`, `_time_seconds`) and resets the object's backoff on success;
//! - `error_policy(object, error, ctx)`: [`error_policy`], which counts the failure by
//!   [`Error::metric_label`] (`sluice_operator_reconcile_errors_total`) and requeues after the object's
//!   next backoff delay;
//! - a failed reconcile sets `Ready=False` with [`Error::condition_reason`] and publishes a Warning Event
//!   when the reason changes;
//! - `run(ctx, shutdown)`: the watches. The watch of the controller's own kind ([`primary_watch`])
//!   triggers a reconcile when the object's generation, labels or annotations change, never for a
//!   status write: a reconcile's own status write must not start the next reconcile, which would read
//!   the status a write behind the server and, with conditions' `lastTransitionTime`, can write an
//!   older one back, and so on at every event;
//! - the status is written at every reconcile ([`Context::patch_status`] says why).
//!
//! The leader also keeps the queue API reviewers' ClusterRoleBinding to the namespaces holding JobQueues
//! ([`reviewer_binding`]), a plain watch with no reconcile of its own.
//!
//! Also here: per-object exponential [`Backoff`] (kube-rs has none built in, kube-rs/kube#1916), status
//! and Event helpers, and setting [`conditions`].

pub mod conditions;
pub mod job_queue;
pub mod queue_database;
pub mod rate_limit_policy;
pub mod reviewer_binding;

use std::{
    collections::HashMap,
    fmt::Debug,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::{Stream, StreamExt};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{
        Predicate, WatchStreamExt,
        controller::{self, Action},
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, Store},
        watcher,
    },
};
use serde::{Serialize, de::DeserializeOwned};
use tracing::{Instrument, field, info_span};

use crate::{
    Error, FIELD_MANAGER, Result, clock::Clock, config::CONCURRENT_RECONCILES_DEFAULT, metrics::Metrics,
};

/// The writes a controller's reconciles made to the objects it owns, by the `resourceVersion` each
/// write returned, so that the watch of those objects ([`owned_changes`]) does not trigger a reconcile
/// of the owner for its own write: creating a ConfigMap, a Deployment and an HPA used to reconcile every
/// new object a second time, which at a thousand objects doubled the work of the first pass. Any other
/// change (someone else's edit, a deletion, a status written by another controller) comes with another
/// `resourceVersion` and triggers as before.
///
/// A write is announced before it is sent ([`OwnWrites::write`]): its watch event may arrive before its
/// response, and is then held until the response says whether it is the write's own (at most
/// [`OWN_WRITE_WAIT`], after which it is passed on).
///
/// Limit: an apply that changes nothing returns the object as it stands, with the `resourceVersion` of
/// whoever wrote it last. When someone else's write lands between the reconcile's read of the object
/// and such an apply, and its event has not been delivered yet, that event is taken for the
/// reconcile's own and the change is seen at the next requeue instead (the JobQueue's replica count is
/// not exposed to this: it is applied on top of the version read, and a change since is refused).
#[derive(Debug, Default)]
pub struct OwnWrites {
    written: Mutex<HashMap<String, Written>>,
    done: tokio::sync::Notify,
}

/// What [`OwnWrites`] knows of one owned object.
#[derive(Debug, Default)]
struct Written {
    /// Writes sent and not answered yet.
    in_flight: usize,
    /// The `resourceVersion`s the answered writes returned whose events the watch has not delivered
    /// yet, oldest first (a reconcile writes a Deployment up to three times before the first event
    /// arrives); at most [`OWN_WRITES_KEPT`].
    resource_versions: std::collections::VecDeque<String>,
}

/// Longest an owned object's event waits for the answer to a write of it in flight ([`owned_changes`]).
const OWN_WRITE_WAIT: Duration = Duration::from_secs(5);

/// Most `resourceVersion`s [`OwnWrites`] keeps per object.
const OWN_WRITES_KEPT: usize = 8;

impl OwnWrites {
    /// The key of object `name` of kind `K` in `namespace`.
    pub fn key<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> String {
        format!("{}/{namespace}/{name}", K::kind(&()))
    }

    fn written(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        self.written.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `write` of the owned object `key` ([`OwnWrites::key`]), remembering the `resourceVersion` of
    /// the object it returns.
    pub async fn write<K, E>(&self, key: String, write: impl Future<Output = Result<K, E>>) -> Result<K, E>
    where
        K: Resource,
    {
        self.write_with(key, write, |obj| obj.meta().resource_version.clone())
            .await
    }

    /// [`OwnWrites::write`] of a write whose result `resource_version` reads (`None`: nothing written).
    pub async fn write_with<T, E>(
        &self,
        key: String,
        write: impl Future<Output = Result<T, E>>,
        resource_version: impl FnOnce(&T) -> Option<String>,
    ) -> Result<T, E> {
        self.written().entry(key.clone()).or_default().in_flight += 1;
        // Answered or not (an error, a cancelled reconcile), the write is no longer in flight.
        let mut in_flight = InFlight {
            own: self,
            key,
            resource_version: None,
        };
        let result = write.await;
        if let Ok(written) = &result {
            in_flight.resource_version = resource_version(written);
        }
        result
    }

    /// Whether `obj`, as a watch delivers it, is what one of the controller's own writes returned;
    /// waits for the answers of writes of it still in flight.
    async fn is_own<K: Resource<DynamicType = ()>>(&self, obj: &K) -> bool {
        let key = Self::key::<K>(&obj.namespace().unwrap_or_default(), &obj.name_any());
        loop {
            let notified = self.done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut written = self.written();
                let Some(w) = written.get_mut(&key) else {
                    return false;
                };
                let rv = obj.meta().resource_version.as_deref().unwrap_or_default();
                if let Some(at) = w.resource_versions.iter().position(|v| v == rv) {
                    // Events come in order: the writes before this one have had theirs. This one's is
                    // kept, so that a watch listing again finds the object as it was written.
                    w.resource_versions.drain(..at);
                    return true;
                }
                if w.in_flight == 0 {
                    return false;
                }
            }
            notified.await;
        }
    }

    fn forget<K: Resource<DynamicType = ()>>(&self, obj: &K) {
        let key = Self::key::<K>(&obj.namespace().unwrap_or_default(), &obj.name_any());
        let mut written = self.written();
        if written.get(&key).is_some_and(|w| w.in_flight == 0) {
            written.remove(&key);
        }
    }
}

/// A write of [`OwnWrites::write`] in flight; its end, answered or not, when dropped.
struct InFlight<'a> {
    own: &'a OwnWrites,
    key: String,
    resource_version: Option<String>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut written = self.own.written();
        let w = written.entry(self.key.clone()).or_default();
        w.in_flight = w.in_flight.saturating_sub(1);
        if let Some(rv) = self.resource_version.take() {
            w.resource_versions.push_back(rv);
            if w.resource_versions.len() > OWN_WRITES_KEPT {
                w.resource_versions.pop_front();
            }
        }
        // A write that failed (a 409, a namespace being deleted) leaves nothing to remember.
        if w.in_flight == 0 && w.resource_versions.is_empty() {
            written.remove(&self.key);
        }
        drop(written);
        self.own.done.notify_waiters();
    }
}

/// The watch of objects a controller owns, for `Controller::owns_stream`: like `Controller::owns` (their
/// metadata only), less the events of the controller's own writes ([`OwnWrites`]).
pub fn owned_changes<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
    own: Arc<OwnWrites>,
) -> impl Stream<Item = Result<PartialObjectMeta<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher(api, config).filter_map(move |event| {
        let own = own.clone();
        async move {
            match event {
                Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                    // A write that takes long to be answered holds up this watch (every object of
                    // the kind) only so long: its event is then passed on, one reconcile too many.
                    let own = tokio::time::timeout(OWN_WRITE_WAIT, own.is_own(&obj)).await;
                    (own != Ok(true)).then_some(Ok(obj))
                }
                Ok(watcher::Event::Delete(obj)) => {
                    own.forget(&obj);
                    Some(Ok(obj))
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                Err(e) => Some(Err(e)),
            }
        }
    })
}

/// Longest Event note: the API server refuses notes over 1 kB.
pub const EVENT_NOTE_MAX_CHARS: usize = 1000;

/// What every reconcile of a controller needs: the same for both controllers, plus the controller's own
/// `state`.
pub struct Context<S> {
    /// The Kubernetes client.
    pub client: Client,
    /// Publishes Events on the objects reconciled.
    pub recorder: Recorder,
    /// Reconcile counts, durations and errors.
    pub metrics: Arc<Metrics>,
    /// Per-object error backoff.
    pub backoff: Backoff,
    /// Wall clock (Unix ms), for condition times and everything timed against the objects.
    pub clock: Clock,
    /// Most reconciles the controller runs at once ([`Context::controller_config`]).
    pub concurrency: u16,
    /// The reconciles' writes to owned objects, which their watch does not pass on.
    pub own_writes: Arc<OwnWrites>,
    /// What only this controller keeps.
    pub state: S,
}

impl<S> Context<S> {
    /// A context on `client`; Events name `instance` (this replica) as their reporter.
    pub fn new(
        client: Client,
        metrics: Arc<Metrics>,
        instance: Option<String>,
        clock: Clock,
        state: S,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            backoff: Backoff::default(),
            clock,
            concurrency: CONCURRENT_RECONCILES_DEFAULT,
            own_writes: Arc::default(),
            state,
        }
    }

    /// The same context with at most `concurrency` reconciles at once (at least one).
    pub fn with_concurrency(mut self, concurrency: u16) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The kube-runtime settings of the controller: at most [`Context::concurrency`] reconciles at
    /// once. kube-runtime's own default is no bound: every object triggered together (all of them when
    /// the operator starts or takes over) is reconciled at once, every reconcile holding a connection
    /// to the API server and waiting its turn for the pooled connections to its database.
    pub fn controller_config(&self) -> controller::Config {
        controller::Config::default().concurrency(self.concurrency)
    }

    /// Now, in Unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        (self.clock)()
    }

    /// Publishes an Event on `obj` (its note cut to [`EVENT_NOTE_MAX_CHARS`]). An Event is a courtesy:
    /// failing to record one is logged, never an error.
    pub async fn event<K>(&self, obj: &K, type_: EventType, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(EVENT_NOTE_MAX_CHARS).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, "could not publish an event");
        }
    }

    /// Server-side applies `status` as `obj`'s status, owning every field of it. Written even when the
    /// cached object shows the same status: the cache may be behind the server (a write of an earlier
    /// reconcile not seen yet), and a skipped write would then leave the older status until the next
    /// requeue. Status writes trigger no reconcile (see [`primary_watch`]).
    pub async fn patch_status<K, T>(&self, obj: &K, status: &T) -> Result<()>
    where
        T: Serialize,
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + DeserializeOwned
            + Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), &obj.namespace().unwrap_or_default());
        let body = serde_json::json!({
            "apiVersion": K::api_version(&()),
            "kind": K::kind(&()),
            "metadata": {"name": obj.name_any()},
            "status": status,
        });
        api.patch_status(
            &obj.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?;
        Ok(())
    }
}

/// The watch of a controller's own kind for `Controller::for_stream`: objects of `api` reflected into
/// the returned store (what reconciles and mappers read), passed on as reconcile triggers only when
/// `predicate`'s hash of the object changes, and the first time this process sees each object (so
/// every object once when the operator starts or takes over leadership; a watch that lists again
/// within one process does not trigger unchanged objects: the controllers' requeues cover drift). With
/// `predicates::generation`, writing an object's status, which leaves its generation as it is, triggers
/// nothing; so does another writer's change of the status, which the next requeue corrects. A deletion
/// mark triggers on a real API server, which bumps the generation when it sets `deletionTimestamp`.
/// The controllers combine it with `predicates::labels` and `predicates::annotations`, so that a
/// user's touch of an object (a label or annotation) still forces a reconcile.
pub fn primary_watch<K, P>(
    api: Api<K>,
    predicate: P,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    P: Predicate<K> + Send + 'static,
{
    let (store, writer) = reflector::store();
    let triggers = watcher(api, watcher::Config::default())
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicate, Default::default());
    (store, triggers)
}

/// Whether the object `name` (of `kind`) that `owner` would write exists: `Ok(false)` when it does not,
/// `Ok(true)` when it does and `owner` controls it (a controller ownerReference with `owner`'s uid), and
/// [`Error::NotOwned`] when someone else's object has the name. Called before every apply or delete of
/// a rendered object, so the operator never adopts, overwrites or deletes what it did not create.
pub async fn owned_by<K, O>(api: &Api<K>, kind: &str, name: &str, owner: &O) -> Result<bool>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    O: Resource<DynamicType = ()>,
{
    let Some(existing) = api.get_opt(name).await? else {
        return Ok(false);
    };
    let uid = owner.meta().uid.as_deref().unwrap_or_default();
    let controlled = existing
        .meta()
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && r.uid == uid);
    if controlled {
        Ok(true)
    } else {
        Err(Error::NotOwned {
            kind: kind.to_owned(),
            namespace: existing.meta().namespace.clone().unwrap_or_default(),
            name: name.to_owned(),
            owner: O::kind(&()).into_owned(),
        })
    }
}

/// Where the controllers and the webhook's caches watch: every namespace, or only those listed
/// (`--watch-namespaces`), each with a watch of its own so RBAC may grant Roles there alone.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Namespaces {
    /// Every namespace, by cluster-wide watches.
    #[default]
    All,
    /// Only these.
    Only(Vec<String>),
}

impl Namespaces {
    /// From `--watch-namespaces`: empty (or only blanks) means every namespace.
    pub fn from_list(list: &[String]) -> Self {
        let mut names: Vec<String> = list
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            Namespaces::All
        } else {
            Namespaces::Only(names)
        }
    }

    /// One `Api` per watch: the cluster-wide one, or one per listed namespace.
    pub fn apis<K>(&self, client: &Client) -> Vec<Api<K>>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match self {
            Namespaces::All => vec![Api::all(client.clone())],
            Namespaces::Only(names) => names
                .iter()
                .map(|ns| Api::namespaced(client.clone(), ns))
                .collect(),
        }
    }

    /// The namespace of each watch (`None`: all of them).
    pub fn scopes(&self) -> Vec<Option<String>> {
        match self {
            Namespaces::All => vec![None],
            Namespaces::Only(names) => names.iter().cloned().map(Some).collect(),
        }
    }
}

/// `Api` on `ns`, or on every namespace for `None`.
pub fn api_in<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// `namespace/name` of `obj`: its key in logs and in the backoff.
pub fn key<K: Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Runs the reconcile `steps` of `obj` for `controller` inside the `reconcile` span, counted and timed;
/// records the outcome (`ok` or the error's metric label) on the span and resets the object's backoff
/// on success.
pub async fn instrumented<K, S>(
    controller: &'static str,
    obj: &K,
    ctx: &Context<S>,
    steps: impl Future<Output = Result<Action>>,
) -> Result<Action>
where
    K: Resource,
{
    let span = info_span!(
        "reconcile",
        controller,
        object = %key(obj),
        generation = obj.meta().generation.unwrap_or_default(),
        outcome = field::Empty,
    );
    // At debug, with kube-runtime's `reconciling object` span (its `object.reason`: what triggered it).
    span.in_scope(|| tracing::debug!("reconcile started"));
    let result = {
        let _timer = ctx.metrics.reconcile(controller);
        steps.instrument(span.clone()).await
    };
    span.record(
        "outcome",
        match &result {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        },
    );
    if result.is_ok() {
        ctx.backoff.reset(&key(obj));
    }
    result
}

/// The `error_policy` of both controllers: counts the failure by its metric label and requeues after
/// the object's next backoff delay. User errors (a bad spec or Secret) log at info, the rest at warn.
pub fn error_policy<K, S>(controller: &'static str, obj: &K, error: &Error, ctx: &Context<S>) -> Action
where
    K: Resource,
{
    ctx.metrics.reconcile_error(controller, error.metric_label());
    let delay = ctx.backoff.next(&key(obj));
    if error.is_user_error() {
        tracing::info!(controller, object = %key(obj), %error, ?delay, "not ready");
    } else {
        tracing::warn!(controller, object = %key(obj), %error, ?delay, "reconcile failed");
    }
    Action::requeue(delay)
}

/// Per-object exponential backoff: 1 s, 2 s, 4 s … up to [`Backoff::MAX`], reset by a success.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// First retry delay.
    pub const BASE: Duration = Duration::from_secs(1);
    /// Longest retry delay.
    pub const MAX: Duration = Duration::from_secs(300);

    /// Record a failure of `key` and return how long to wait before retrying.
    pub fn next(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = failures.entry(key.to_owned()).or_insert(0);
        let delay = Self::BASE
            .checked_mul(1u32.checked_shl(*n).unwrap_or(u32::MAX))
            .unwrap_or(Self::MAX)
            .min(Self::MAX);
        *n = n.saturating_add(1);
        delay
    }

    /// Forget the failures of `key` after a success.
    pub fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    #[test]
    fn backoff_doubles_per_object_caps_and_resets_on_success() {
        let b = Backoff::default();
        let delays: Vec<u64> = (0..12).map(|_| b.next("shop/api").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300]);
        assert_eq!(
            b.next("shop/other").as_secs(),
            1,
            "objects back off independently"
        );
        b.reset("shop/api");
        assert_eq!(b.next("shop/api").as_secs(), 1);
    }

    /// A ConfigMap `shop/api-config` as a write returns it or a watch delivers it, at `rv`.
    fn config_map(rv: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some("shop".into());
        cm.metadata.name = Some("api-config".into());
        cm.metadata.resource_version = Some(rv.into());
        cm
    }

    fn key() -> String {
        OwnWrites::key::<ConfigMap>("shop", "api-config")
    }

    /// A write of `shop/api-config` held until `answer` sends what it returns.
    async fn held_write(own: &OwnWrites, answer: tokio::sync::oneshot::Receiver<Result<ConfigMap, ()>>) {
        let _ = own.write(key(), async { answer.await.unwrap_or(Err(())) }).await;
    }

    /// Polls `write`, then `event`, once each: the write is sent and not answered, and the event
    /// waits on it.
    async fn sent_and_waiting(
        write: std::pin::Pin<&mut impl Future>,
        event: std::pin::Pin<&mut impl Future<Output = bool>>,
    ) {
        tokio::select! {
            biased;
            _ = write => panic!("the write was answered"),
            _ = event => panic!("decided before the write was answered"),
            () = tokio::task::yield_now() => {}
        }
    }

    #[tokio::test]
    async fn an_event_that_arrives_before_its_write_is_answered_waits_and_is_the_write_s_own() {
        let own = OwnWrites::default();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let write = held_write(&own, answered);
        let delivered = config_map("7");
        let event = own.is_own(&delivered);
        tokio::pin!(write, event);
        sent_and_waiting(write.as_mut(), event.as_mut()).await;
        answer.send(Ok(config_map("7"))).unwrap();
        let (_, own_event) = tokio::join!(write, event);
        assert!(own_event);
        // A watch listing again finds the object as written: still its own.
        assert!(own.is_own(&config_map("7")).await);
        // Someone else's write after it is not.
        assert!(!own.is_own(&config_map("9")).await);
    }

    #[tokio::test]
    async fn a_write_that_fails_or_is_dropped_makes_no_event_its_own_and_leaves_nothing_behind() {
        let own = OwnWrites::default();
        let (answer, answered) = tokio::sync::oneshot::channel();
        let write = held_write(&own, answered);
        let delivered = config_map("7");
        let event = own.is_own(&delivered);
        tokio::pin!(write, event);
        sent_and_waiting(write.as_mut(), event.as_mut()).await;
        answer.send(Err(())).unwrap();
        let (_, own_event) = tokio::join!(write, event);
        assert!(!own_event, "a failed write returned nothing");
        assert!(own.written().get(&key()).is_none());

        // A write cancelled (its reconcile dropped) while an event waits on it.
        let (_answer, answered) = tokio::sync::oneshot::channel();
        let mut write = Box::pin(held_write(&own, answered));
        let delivered = config_map("8");
        let event = own.is_own(&delivered);
        tokio::pin!(event);
        sent_and_waiting(write.as_mut(), event.as_mut()).await;
        drop(write);
        assert!(!event.await);
        assert!(own.written().get(&key()).is_none());
    }

    #[tokio::test]
    async fn events_of_earlier_own_writes_are_not_taken_for_a_later_one() {
        let own = OwnWrites::default();
        for rv in ["3", "4"] {
            let written = own.write(key(), async { Ok::<_, ()>(config_map(rv)) }).await;
            assert!(written.is_ok());
        }
        // The first write's event, then the second's: both the writes' own, in order.
        assert!(own.is_own(&config_map("3")).await);
        assert!(own.is_own(&config_map("4")).await);
        // Once the second's event came, the first's version is forgotten (events come in order).
        assert!(!own.is_own(&config_map("3")).await);
        // A deletion forgets the object.
        own.forget(&config_map("4"));
        assert!(!own.is_own(&config_map("4")).await);
    }
}
