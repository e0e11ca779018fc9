//! The `RateLimitPolicy` controller.
//!
//! Each reconcile, in order: [`render_yaml`] the policy into the sidecar config; `apply_config_map`
//! (server-side apply to a ConfigMap the policy owns: deleting the policy collects it; new pods mount it);
//! list the `governed_pods`; `apply_network_policy` (the NetworkPolicy admitting ingress to them only
//! through the sidecar, owned by the policy; deleted when `spec.networkPolicy.enabled` is false); find
//! the Services that target the app's port around the sidecar (`AppPortExposed`); read the Redis URL
//! from the policy's Secret (that Secret only, by its explicit reference); `publish` the config, signed,
//! to Redis, where running sidecars pick it up within a second (republished at once if the key holds
//! anything else), and read back their reports; publish the count of pods enforcing the policy
//! ([`enforcing_pods`], signed, when it changes) for the sidecars' share under `failureMode: local`;
//! make sure the namespace has its counter key Secret ([`counter_key::ensure`]: injected sidecars hash
//! counter names with it; a missing or unusable one fails the reconcile only after the publication);
//! count the running governed pods that report enforcing the current generation ([`enforcement`]);
//! `write_status`. While pods lag it requeues every
//! [`PROPAGATION_POLL`], so status shows the change reaching every pod; afterwards every [`RESYNC`].
//!
//! User errors (invalid spec, missing Secret or key, a same-named ConfigMap or NetworkPolicy the policy
//! does not control) and an unreachable Redis set `Ready=False` with a reason, publish a Warning Event on
//! the transition, and back off per object; nothing here panics on user input. An object the policy does
//! not control is never changed or deleted.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::{
    core::v1::{ConfigMap, Pod, Service},
    networking::v1::NetworkPolicy,
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
    core::PartialObjectMeta,
    runtime::{
        Controller, Predicate, controller::Action, events::EventType, predicates, reflector::ObjectRef,
        watcher,
    },
};
use serde_json::json;
use sha2::Digest;
use sluice_crds::{
    conditions::{APP_PORT_EXPOSED, DEGRADED, READY, reason},
    contract::{
        SIDECAR_CONTAINER,
        label::{MANAGED_BY, MANAGED_BY_VALUE, POLICY as POLICY_LABEL},
        path::POLICY_CONFIG_FILE as CONFIG_KEY,
        redis::{EnforcingPods, Report},
    },
    rate_limit_policy::{GenerationCount, RateLimitPolicy, RateLimitPolicyStatus},
};

use super::{Context, Namespaces, OwnWrites, api_in, conditions::Desired};
use crate::{
    Error, FIELD_MANAGER, Result, counter_key,
    propagation::Publisher,
    render::{
        network_policy::{Exposure, exposures, network_policy, network_policy_name},
        sidecar_config::{config_map_name, render_yaml},
    },
    secret::{self, REDIS_SECRET_FIELD},
    signing::ConfigSigner,
};

/// Controller name in metrics, logs and spans.
pub const CONTROLLER: &str = "ratelimitpolicy";
/// Requeue interval while some selected pods do not enforce the current generation yet.
pub const PROPAGATION_POLL: Duration = Duration::from_millis(500);
/// Requeue interval once every pod enforces it (also how soon a fixed Secret is noticed).
pub const RESYNC: Duration = Duration::from_secs(30);
/// A report older than this is ignored: its sidecar stopped reporting (it reports every 5 s).
pub const REPORT_FRESH_MS: i64 = 15_000;
/// How long pods may take to catch up after publication before the policy counts as `Degraded`.
pub const LAG_GRACE_MS: i64 = 10_000;
/// How often an unchanged generation is republished, in case Redis lost the key.
pub const REPUBLISH_MS: i64 = 60_000;
/// Most lagging pods a `Degraded` message names.
pub const LAGGING_PODS_SHOWN: usize = 5;

/// What only this controller keeps between reconciles.
#[derive(Debug, Default)]
pub struct State {
    /// Redis clients for publishing config and reading reports.
    pub publisher: Publisher,
    /// Signs what is published, so sidecars holding the public key can tell it from a forgery.
    /// `None`: published unsigned (tests of other things).
    pub signer: Option<Arc<ConfigSigner>>,
    /// Where policies are watched and reconciled.
    pub namespaces: Namespaces,
    /// When each policy generation was first published, to tell "still propagating" from "lagging".
    pub published: Mutex<HashMap<(String, String), Published>>,
    /// The count of enforcing pods last published per policy, and when.
    pub pods_published: Mutex<HashMap<(String, String), PodsPublished>>,
}

/// A count of enforcing pods the controller published, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodsPublished {
    /// The count.
    pub pods: u32,
    /// Published at (Unix ms); republished now and then in case Redis lost the key.
    pub last_ms: i64,
}

/// A generation the controller published, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The policy generation.
    pub generation: i64,
    /// SHA-256 of the text published, to notice the key holding something else.
    pub sha256: [u8; 32],
    /// First published at (Unix ms).
    pub first_ms: i64,
    /// Last published at (Unix ms); republished now and then in case Redis lost the key.
    pub last_ms: i64,
}

/// Run the controller until `shutdown` resolves: one per watched namespace (`state.namespaces`), or
/// one for the whole cluster.
pub async fn run(ctx: Arc<Context<State>>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let shutdown = futures::FutureExt::shared(shutdown);
    let runs = ctx.state.namespaces.scopes().into_iter().map(|ns| {
        let (ctx, shutdown) = (ctx.clone(), shutdown.clone());
        async move {
            let client = ctx.client.clone();
            let ns = ns.as_deref();
            let managed = watcher::Config::default().labels(&format!("{MANAGED_BY}={MANAGED_BY_VALUE}"));
            // Changes of the spec, labels or annotations (a user's touch forces a reconcile); status
            // writes, the reconcile's own or anyone's, trigger nothing.
            let (policies, changed) = super::primary_watch(
                api_in::<RateLimitPolicy>(&client, ns),
                predicates::generation
                    .combine(predicates::labels)
                    .combine(predicates::annotations),
            );
            Controller::for_stream(changed, policies)
                .with_config(ctx.controller_config())
                // Owned objects changed by anyone but the reconcile itself.
                .owns_stream(super::owned_changes(
                    api_in::<PartialObjectMeta<ConfigMap>>(&client, ns),
                    managed.clone(),
                    ctx.own_writes.clone(),
                ))
                .owns_stream(super::owned_changes(
                    api_in::<PartialObjectMeta<NetworkPolicy>>(&client, ns),
                    managed,
                    ctx.own_writes.clone(),
                ))
                .watches(
                    api_in::<Pod>(&client, ns),
                    watcher::Config::default().labels(POLICY_LABEL),
                    |pod: Pod| {
                        let name = pod.labels().get(POLICY_LABEL)?.clone();
                        Some(ObjectRef::<RateLimitPolicy>::new(&name).within(&pod.namespace()?))
                    },
                )
                .graceful_shutdown_on(shutdown)
                .run(reconcile, error_policy, ctx)
                .for_each(|result| async move {
                    if let Err(e) = result {
                        tracing::debug!(controller = CONTROLLER, error = %e, "controller event");
                    }
                })
                .await;
        }
    });
    futures::future::join_all(runs).await;
}

/// Reconcile one policy. See the module docs for the steps.
pub async fn reconcile(policy: Arc<RateLimitPolicy>, ctx: Arc<Context<State>>) -> Result<Action> {
    super::instrumented(CONTROLLER, &*policy, &ctx, async {
        match steps(&policy, &ctx).await {
            // What the user must fix, or Redis being down, shows in status; other errors are retried.
            Err(error) if reported_in_status(&error) => {
                fail(&policy, &ctx, &error).await?;
                Err(error)
            }
            result => result,
        }
    })
    .await
}

/// Requeue with this object's next backoff delay, counting the error by reason.
pub fn error_policy(policy: Arc<RateLimitPolicy>, error: &Error, ctx: Arc<Context<State>>) -> Action {
    super::error_policy(CONTROLLER, &*policy, error, &ctx)
}

async fn steps(policy: &RateLimitPolicy, ctx: &Context<State>) -> Result<Action> {
    let yaml = render_yaml(policy)?;
    apply_config_map(policy, ctx, &yaml).await?;
    let governed = governed_pods(policy, ctx).await?;
    let network_policy = apply_network_policy(policy, ctx, &governed).await?;
    let exposed = exposed_app_ports(policy, ctx, &governed).await?;
    let ns = policy.namespace().unwrap_or_default();
    let url = secret::read_url(
        &ctx.client,
        &ns,
        &policy.spec.redis.secret_ref,
        REDIS_SECRET_FIELD,
    )
    .await?;
    let (reports, published_ms) = publish(policy, ctx, &url, &yaml).await?;
    let selected = running(&governed);
    publish_pods(policy, ctx, &url, enforcing_pods(&governed)).await?;
    // After publishing: a missing or unusable counter key must not hold back a new config for the pods
    // that run already.
    counter_key::ensure(&ctx.client, &ns).await?;
    let generation = policy.metadata.generation.unwrap_or_default();
    let e = enforcement(generation, &selected, &reports, ctx.now_ms(), published_ms);
    let exposed = app_port_exposed(&exposed, network_policy.as_deref());
    write_status(policy, ctx, &e, network_policy, &exposed).await?;
    Ok(Action::requeue(if e.enforcing < e.selected {
        PROPAGATION_POLL
    } else {
        RESYNC
    }))
}

fn reported_in_status(error: &Error) -> bool {
    error.is_user_error() || matches!(error, Error::Redis(_))
}

/// Publishes the config to running sidecars when its generation is new (or now and then, in case Redis
/// lost it), and reads their reports. Returns the reports and when this generation was first published.
async fn publish(
    policy: &RateLimitPolicy,
    ctx: &Context<State>,
    url: &str,
    yaml: &str,
) -> Result<(HashMap<String, Report>, i64)> {
    let key = (policy.namespace().unwrap_or_default(), policy.name_any());
    let generation = policy.metadata.generation.unwrap_or_default();
    let now = ctx.now_ms();
    let previous = ctx
        .state
        .published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .copied();
    let publisher = &ctx.state.publisher;
    let mut due = previous.is_none_or(|p| p.generation != generation || now - p.last_ms >= REPUBLISH_MS);
    if let Some(p) = previous.filter(|_| !due) {
        // Someone else wrote the key (a forged or replayed config): put the operator's back at once.
        let current = publisher.current(url, &key.0, &key.1).await?;
        // A missing key (Redis restarted or evicted it) is simply published again.
        due = current.is_none();
        if current.as_deref().is_some_and(|c| sha256(c) != p.sha256) {
            let message = format!(
                "the config in Redis ({}) is not the one the operator published: someone else \
                 wrote the key; republished generation {generation}",
                sluice_crds::contract::redis::config_key(&key.0, &key.1)
            );
            tracing::warn!(policy = %format!("{}/{}", key.0, key.1), "{message}");
            ctx.event(
                policy,
                EventType::Warning,
                reason::REMOTE_CONFIG_REPLACED,
                &message,
            )
            .await;
            due = true;
        }
    }
    let text = match &ctx.state.signer {
        Some(signer) => signer.sign(yaml),
        None => yaml.to_owned(),
    };
    if due {
        publisher.publish(url, &key.0, &key.1, &text, generation).await?;
    }
    let reports = publisher.reports(url, &key.0, &key.1).await?;
    let first_ms = match previous {
        Some(p) if p.generation == generation => p.first_ms,
        _ => now,
    };
    if due {
        ctx.state
            .published
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                key,
                Published {
                    generation,
                    sha256: sha256(&text),
                    first_ms,
                    last_ms: now,
                },
            );
    }
    Ok((reports, first_ms))
}

/// How many pods enforce the policy, for sidecars to divide each limit by under `failureMode: local`:
/// the governed pods that run with the injected sidecar, Ready or not. Readiness is left out on
/// purpose: a sidecar that cannot reach Redis reports itself not ready, and those are exactly the
/// pods limiting in process that need the count to be right. A pod being deleted no longer counts.
pub fn enforcing_pods(governed: &[Pod]) -> u32 {
    let count = governed
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter(|p| {
            // Injected as a native sidecar (an init container that keeps running), or beside the app.
            p.spec.as_ref().is_some_and(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .chain(&s.containers)
                    .any(|c| c.name == SIDECAR_CONTAINER)
            })
        })
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// Publishes the count of enforcing pods (signed like the config) when it changed, and now and then
/// in case Redis lost the key. Nothing while no pod enforces the policy: no sidecar reads it then, and
/// the next pod to start publishes its count.
async fn publish_pods(policy: &RateLimitPolicy, ctx: &Context<State>, url: &str, pods: u32) -> Result<()> {
    if pods == 0 {
        return Ok(());
    }
    let key = (policy.namespace().unwrap_or_default(), policy.name_any());
    let now = ctx.now_ms();
    let previous = ctx
        .state
        .pods_published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .copied();
    if previous.is_some_and(|p| p.pods == pods && now - p.last_ms < REPUBLISH_MS) {
        return Ok(());
    }
    let body = EnforcingPods {
        namespace: key.0.clone(),
        name: key.1.clone(),
        pods,
    }
    .encode();
    let text = match &ctx.state.signer {
        Some(signer) => signer.sign(&body),
        None => body,
    };
    ctx.state
        .publisher
        .publish_pods(url, &key.0, &key.1, &text)
        .await?;
    ctx.state
        .pods_published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, PodsPublished { pods, last_ms: now });
    Ok(())
}

/// The pods the policy governs (those the webhook labelled with its name) that are not being deleted,
/// in any phase.
async fn governed_pods(policy: &RateLimitPolicy, ctx: &Context<State>) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default());
    Ok(pods
        .list(&ListParams::default().labels(&format!("{POLICY_LABEL}={}", policy.name_any())))
        .await?
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

fn sha256(text: &str) -> [u8; 32] {
    sha2::Sha256::digest(text.as_bytes()).into()
}

/// The running ones among `governed`, by name.
fn running(governed: &[Pod]) -> Vec<String> {
    governed
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| p.name_any())
        .collect()
}

/// Server-side applies the policy's NetworkPolicy (or deletes the one it owns when
/// `spec.networkPolicy.enabled` is false). Returns its name when it is in place. A same-named
/// NetworkPolicy the policy does not control is left alone: [`Error::NotOwned`].
async fn apply_network_policy(
    policy: &RateLimitPolicy,
    ctx: &Context<State>,
    governed: &[Pod],
) -> Result<Option<String>> {
    let ns = policy.namespace().unwrap_or_default();
    let name = network_policy_name(&policy.name_any());
    let api = Api::<NetworkPolicy>::namespaced(ctx.client.clone(), &ns);
    let exists = super::owned_by(&api, "NetworkPolicy", &name, policy).await?;
    let settings = &policy.spec.network_policy;
    if !settings.enabled {
        if exists {
            api.delete(&name, &DeleteParams::default()).await?;
        }
        return Ok(None);
    }
    let owner = policy
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Serialization("policy without uid".into()))?;
    let mut np = serde_json::to_value(network_policy(&ns, &policy.name_any(), owner, settings, governed))?;
    np["apiVersion"] = json!("networking.k8s.io/v1");
    np["kind"] = json!("NetworkPolicy");
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    ctx.own_writes
        .write(
            OwnWrites::key::<NetworkPolicy>(&ns, &name),
            api.patch(&name, &pp, &Patch::Apply(&np)),
        )
        .await?;
    Ok(Some(name))
}

/// The Services of the policy's namespace that reach the app's port of a governed pod directly.
async fn exposed_app_ports(
    policy: &RateLimitPolicy,
    ctx: &Context<State>,
    governed: &[Pod],
) -> Result<Vec<Exposure>> {
    if governed.is_empty() {
        return Ok(vec![]);
    }
    let services = Api::<Service>::namespaced(ctx.client.clone(), &policy.namespace().unwrap_or_default())
        .list(&ListParams::default())
        .await?;
    Ok(exposures(governed, &services.items))
}

/// Most Service ports an `AppPortExposed` message names.
pub const EXPOSURES_SHOWN: usize = 5;

/// The `AppPortExposed` condition for `exposed`, given the NetworkPolicy in place (if any).
pub fn app_port_exposed(exposed: &[Exposure], network_policy: Option<&str>) -> Desired {
    if exposed.is_empty() {
        return Desired {
            type_: APP_PORT_EXPOSED,
            status: false,
            reason: reason::AS_EXPECTED,
            message: String::new(),
        };
    }
    let shown: Vec<String> = exposed
        .iter()
        .take(EXPOSURES_SHOWN)
        .map(|e| e.to_string())
        .collect();
    let more = exposed.len().saturating_sub(shown.len());
    let blocked = match network_policy {
        Some(np) => format!(
            "; the NetworkPolicy {np} drops that traffic where the network plugin enforces NetworkPolicies"
        ),
        None => String::new(),
    };
    Desired {
        type_: APP_PORT_EXPOSED,
        status: true,
        reason: reason::SERVICE_TARGETS_APP_PORT,
        message: format!(
            "{}{}: requests through it skip the sidecar and are not rate limited. Target the sidecar's \
             port by name instead (the name the app port had, or \"sluice\"){blocked}",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
        ),
    }
}

/// Writes the status from `e`, with a Normal Event when `Ready`'s reason changes to a settled one and a
/// Warning Event when a Service starts targeting the app's port.
async fn write_status(
    policy: &RateLimitPolicy,
    ctx: &Context<State>,
    e: &Enforcement,
    network_policy: Option<String>,
    exposed: &Desired,
) -> Result<()> {
    let generation = policy.metadata.generation.unwrap_or_default();
    let mut status = base_status(policy, generation);
    status.selected_pods = e.selected;
    status.enforcing_pods = e.enforcing;
    status.enforcing = Some(format!("{}/{}", e.enforcing, e.selected));
    status.generations = e.generations.clone();
    status.network_policy = network_policy;
    let was_exposed = existing_conditions(policy)
        .iter()
        .any(|c| c.type_ == APP_PORT_EXPOSED && c.status == "True" && c.message == exposed.message);
    status.conditions = super::conditions::set(
        &existing_conditions(policy),
        &[e.ready.clone(), e.degraded.clone(), exposed.clone()],
        generation,
        ctx.now_ms(),
    );
    let previous_ready = policy.ready_condition().map(|c| c.reason.clone());
    ctx.patch_status(policy, &status).await?;
    if previous_ready.as_deref() != Some(e.ready.reason) && e.ready.reason != reason::PROPAGATING {
        ctx.event(policy, EventType::Normal, e.ready.reason, &e.ready.message)
            .await;
    }
    if exposed.status && !was_exposed {
        ctx.event(policy, EventType::Warning, exposed.reason, &exposed.message)
            .await;
    }
    Ok(())
}

/// Counts of who enforces what, and the conditions they imply. Pure, so it is unit-tested.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enforcement {
    /// Running selected pods.
    pub selected: u32,
    /// Of those, how many enforce `generation` (a later one was not published by the operator).
    pub enforcing: u32,
    /// Pods per generation among fresh reports, newest first.
    pub generations: Vec<GenerationCount>,
    /// The `Ready` condition.
    pub ready: Desired,
    /// The `Degraded` condition.
    pub degraded: Desired,
}

/// Work out [`Enforcement`] from the selected pods and their reports at `now_ms`, for a generation
/// first published at `published_ms`.
pub fn enforcement(
    generation: i64,
    selected: &[String],
    reports: &HashMap<String, Report>,
    now_ms: i64,
    published_ms: i64,
) -> Enforcement {
    let fresh = |pod: &String| {
        reports
            .get(pod)
            .filter(|r| now_ms - r.at_ms <= REPORT_FRESH_MS)
            .copied()
    };
    let mut by_generation: BTreeMap<i64, u32> = BTreeMap::new();
    let mut lagging = Vec::new();
    let mut enforcing = 0u32;
    for pod in selected {
        match fresh(pod) {
            Some(r) => {
                *by_generation.entry(r.generation).or_default() += 1;
                if r.generation == generation {
                    enforcing += 1;
                } else if r.generation > generation {
                    // The operator never published it: a config someone else wrote into Redis.
                    lagging.push(format!(
                        "{pod} (generation {}, which the operator never published)",
                        r.generation
                    ));
                } else {
                    lagging.push(format!("{pod} (generation {})", r.generation));
                }
            }
            None => lagging.push(format!("{pod} (no report)")),
        }
    }
    let selected_n = u32::try_from(selected.len()).unwrap_or(u32::MAX);
    let ready = if selected.is_empty() {
        Desired {
            type_: READY,
            status: true,
            reason: reason::NO_PODS,
            message: format!(
                "Generation {generation} is published; no running pod is governed by this policy yet"
            ),
        }
    } else if enforcing == selected_n {
        Desired {
            type_: READY,
            status: true,
            reason: reason::ENFORCED,
            message: format!("All {selected_n} selected pods enforce generation {generation}"),
        }
    } else {
        Desired {
            type_: READY,
            status: false,
            reason: reason::PROPAGATING,
            message: format!("{enforcing} of {selected_n} selected pods enforce generation {generation}"),
        }
    };
    let overdue = now_ms - published_ms > LAG_GRACE_MS;
    let degraded = if !lagging.is_empty() && overdue {
        lagging.sort();
        let shown: Vec<_> = lagging.iter().take(LAGGING_PODS_SHOWN).cloned().collect();
        let more = lagging.len().saturating_sub(shown.len());
        Desired {
            type_: DEGRADED,
            status: true,
            reason: reason::PODS_LAGGING,
            message: format!(
                "{} pods do not enforce generation {generation} {}s after it was published: {}{}",
                lagging.len(),
                (now_ms - published_ms) / 1000,
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ),
        }
    } else {
        Desired {
            type_: DEGRADED,
            status: false,
            reason: reason::AS_EXPECTED,
            message: String::new(),
        }
    };
    Enforcement {
        selected: selected_n,
        enforcing,
        generations: by_generation
            .into_iter()
            .rev()
            .map(|(generation, pods)| GenerationCount { generation, pods })
            .collect(),
        ready,
        degraded,
    }
}

fn existing_conditions(
    policy: &RateLimitPolicy,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    policy
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default()
}

fn base_status(policy: &RateLimitPolicy, generation: i64) -> RateLimitPolicyStatus {
    let previous = policy.status.clone().unwrap_or_default();
    RateLimitPolicyStatus {
        observed_generation: Some(generation),
        rules: Some(u32::try_from(policy.spec.rules.len()).unwrap_or(u32::MAX)),
        config_map: Some(config_map_name(&policy.name_any())),
        ..previous
    }
}

/// Records a failure the user should see: `Ready=False` with the error's reason, an Event on the
/// transition. `Degraded` says whether already-running sidecars are affected (Redis down) or merely not
/// updated.
async fn fail(policy: &RateLimitPolicy, ctx: &Context<State>, error: &Error) -> Result<()> {
    let generation = policy.metadata.generation.unwrap_or_default();
    let why = error.condition_reason();
    let message = error.to_string();
    let ready = Desired {
        type_: READY,
        status: false,
        reason: why,
        message: message.clone(),
    };
    let degraded = if why == reason::REDIS_UNREACHABLE {
        Desired {
            type_: DEGRADED,
            status: true,
            reason: why,
            message: format!("{message}; sidecars apply their failureMode while Redis is unreachable"),
        }
    } else {
        Desired {
            type_: DEGRADED,
            status: false,
            reason: reason::AS_EXPECTED,
            message: String::new(),
        }
    };
    let mut status = base_status(policy, generation);
    status.conditions = super::conditions::set(
        &existing_conditions(policy),
        &[ready, degraded],
        generation,
        ctx.now_ms(),
    );
    let changed = policy.ready_condition().map(|c| c.reason.as_str()) != Some(why);
    ctx.patch_status(policy, &status).await?;
    if changed {
        ctx.event(policy, EventType::Warning, why, &message).await;
    }
    Ok(())
}

/// Server-side applies the ConfigMap holding the rendered config, owned by the policy. A same-named
/// ConfigMap the policy does not control is left alone: [`Error::NotOwned`].
async fn apply_config_map(policy: &RateLimitPolicy, ctx: &Context<State>, yaml: &str) -> Result<()> {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns);
    super::owned_by(&api, "ConfigMap", &config_map_name(&name), policy).await?;
    let owner = policy
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Serialization("policy without uid".into()))?;
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(&name),
            "namespace": ns,
            "labels": {MANAGED_BY: MANAGED_BY_VALUE, POLICY_LABEL: name},
            "ownerReferences": [owner],
        },
        "data": {CONFIG_KEY: yaml},
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    ctx.own_writes
        .write(
            OwnWrites::key::<ConfigMap>(&ns, &config_map_name(&name)),
            api.patch(&config_map_name(&name), &pp, &Patch::Apply(&cm)),
        )
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports(entries: &[(&str, i64, i64)]) -> HashMap<String, Report> {
        entries
            .iter()
            .map(|(pod, generation, at_ms)| {
                (
                    pod.to_string(),
                    Report {
                        generation: *generation,
                        at_ms: *at_ms,
                    },
                )
            })
            .collect()
    }

    fn pods(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn all_pods_at_the_current_generation_make_the_policy_ready() {
        let e = enforcement(
            3,
            &pods(&["a", "b"]),
            &reports(&[("a", 3, 990), ("b", 3, 995)]),
            1_000,
            0,
        );
        assert_eq!((e.enforcing, e.selected), (2, 2));
        assert!(e.ready.status);
        assert_eq!(e.ready.reason, reason::ENFORCED);
        assert!(!e.degraded.status);
        assert_eq!(
            e.generations,
            vec![GenerationCount {
                generation: 3,
                pods: 2
            }]
        );
    }

    #[test]
    fn a_pod_at_a_generation_the_operator_never_published_does_not_count_and_is_named() {
        let now = 60_000;
        let e = enforcement(
            3,
            &pods(&["a", "b"]),
            &reports(&[("a", 3, now), ("b", 9_000_000, now)]),
            now,
            now - LAG_GRACE_MS - 1,
        );
        assert_eq!((e.enforcing, e.selected), (1, 2));
        assert!(!e.ready.status);
        assert!(e.degraded.status);
        assert!(
            e.degraded
                .message
                .contains("b (generation 9000000, which the operator never published)"),
            "{}",
            e.degraded.message
        );
        assert_eq!(e.generations[0].generation, 9_000_000);
    }

    #[test]
    fn pods_catching_up_are_propagating_not_degraded() {
        let e = enforcement(
            3,
            &pods(&["a", "b"]),
            &reports(&[("a", 3, 990), ("b", 2, 990)]),
            1_000,
            0,
        );
        assert_eq!(e.enforcing, 1);
        assert_eq!(e.ready.reason, reason::PROPAGATING);
        assert_eq!(e.ready.message, "1 of 2 selected pods enforce generation 3");
        assert!(!e.degraded.status);
    }

    #[test]
    fn pods_still_behind_after_the_grace_period_degrade_the_policy() {
        let now = 60_000;
        let e = enforcement(
            3,
            &pods(&["a", "b", "c"]),
            &reports(&[("a", 3, now), ("b", 2, now), ("c", 3, now - REPORT_FRESH_MS - 1)]),
            now,
            now - LAG_GRACE_MS - 1,
        );
        assert_eq!(e.enforcing, 1, "a stale report does not count");
        assert!(e.degraded.status);
        assert_eq!(e.degraded.reason, reason::PODS_LAGGING);
        assert!(
            e.degraded.message.contains("b (generation 2), c (no report)"),
            "{}",
            e.degraded.message
        );
    }

    #[test]
    fn reports_of_pods_no_longer_selected_are_ignored() {
        let e = enforcement(1, &pods(&["a"]), &reports(&[("a", 1, 0), ("gone", 1, 0)]), 0, 0);
        assert_eq!((e.enforcing, e.selected), (1, 1));
    }

    #[test]
    fn no_pods_is_ready_with_its_own_reason() {
        let e = enforcement(1, &[], &HashMap::new(), 0, 0);
        assert!(e.ready.status);
        assert_eq!(e.ready.reason, reason::NO_PODS);
        assert_eq!(e.generations, vec![]);
    }
}
