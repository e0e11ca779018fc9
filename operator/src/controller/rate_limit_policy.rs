//! The `RateLimitPolicy` controller.
//!
//! Each reconcile: render the policy into the sidecar config; server-side apply it to a ConfigMap the
//! policy owns (deleting the policy collects it; new pods mount it); read the Redis URL from the
//! policy's Secret (that Secret only, by its explicit reference); publish the config to Redis, where
//! running sidecars pick it up within a second; count the selected pods that report enforcing the
//! current generation; write status. While pods lag it requeues every [`PROPAGATION_POLL`], so status
//! shows the change reaching every pod; afterwards every [`RESYNC`].
//!
//! User errors (invalid spec, missing Secret or key, unreachable Redis) set `Ready=False` with a
//! reason, publish a Warning Event on the transition, and back off per object; nothing here panics
//! on user input.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::{
    Api, Resource, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::{
        Controller,
        controller::Action,
        events::{Event, EventType},
        reflector::ObjectRef,
        watcher,
    },
};
use serde_json::json;
use sluice_crds::{
    conditions::{DEGRADED, READY, reason},
    rate_limit_policy::{GenerationCount, RateLimitPolicy, RateLimitPolicyStatus},
};
use tracing::{Instrument, field, info_span, warn};

use super::{
    Context, Published,
    conditions::{self, Desired},
};
use crate::{
    Error, FIELD_MANAGER, Result,
    redis::Report,
    render::sidecar_config::{CONFIG_KEY, config_map_name, render_yaml},
    webhook::annotations::POLICY_LABEL,
};

/// Controller name in metrics and logs.
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
/// Label on the ConfigMaps the operator writes, which its ConfigMap watch selects.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "sluice-operator");

/// Run the controller until `shutdown` resolves.
pub async fn run(ctx: Arc<Context>, shutdown: impl Future<Output = ()> + Send + Sync + 'static) {
    let client = ctx.client.clone();
    Controller::new(
        Api::<RateLimitPolicy>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(
        Api::<ConfigMap>::all(client.clone()),
        watcher::Config::default().labels(&format!("{}={}", MANAGED_BY.0, MANAGED_BY.1)),
    )
    .watches(
        Api::<Pod>::all(client),
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
            tracing::debug!(error = %e, "reconcile failed");
        }
    })
    .await;
}

fn key(policy: &RateLimitPolicy) -> String {
    format!("{}/{}", policy.namespace().unwrap_or_default(), policy.name_any())
}

/// Reconcile one policy. See the module docs for the steps.
pub async fn reconcile(policy: Arc<RateLimitPolicy>, ctx: Arc<Context>) -> Result<Action> {
    let span = info_span!(
        "reconcile",
        controller = CONTROLLER,
        object = %key(&policy),
        generation = policy.metadata.generation.unwrap_or_default(),
        outcome = field::Empty,
    );
    let result = reconcile_inner(&policy, &ctx).instrument(span.clone()).await;
    span.record(
        "outcome",
        match &result {
            Ok(_) => "ok",
            Err(e) => e.metric_label(),
        },
    );
    if result.is_ok() {
        ctx.backoff.reset(&key(&policy));
    }
    result
}

/// Requeue with this object's next backoff delay, counting the error by reason.
pub fn error_policy(policy: Arc<RateLimitPolicy>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.reconcile_error(CONTROLLER, error.metric_label());
    let delay = ctx.backoff.next(&key(&policy));
    if error.is_user_error() {
        tracing::info!(object = %key(&policy), %error, ?delay, "policy not ready");
    } else {
        warn!(object = %key(&policy), %error, ?delay, "reconcile failed");
    }
    Action::requeue(delay)
}

async fn reconcile_inner(policy: &RateLimitPolicy, ctx: &Context) -> Result<Action> {
    let _timer = ctx.metrics.reconcile(CONTROLLER);
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let generation = policy.metadata.generation.unwrap_or_default();
    let policies: Api<RateLimitPolicy> = Api::namespaced(ctx.client.clone(), &ns);

    // 1. Render. A spec the sidecar cannot use waits for the user to change it.
    let yaml = match render_yaml(policy) {
        Ok(yaml) => yaml,
        Err(e) => {
            let error = Error::InvalidSpec(e);
            fail(policy, ctx, &policies, reason::INVALID_SPEC, &error).await?;
            return Err(error);
        }
    };

    // 2. The ConfigMap new pods mount.
    apply_config_map(policy, ctx, &ns, &name, &yaml).await?;

    // 3. The Redis URL, from the one Secret the policy names.
    let url = match redis_url(policy, ctx, &ns).await {
        Ok(url) => url,
        Err(error) => {
            let why = match &error {
                Error::SecretNotFound { .. } => reason::SECRET_NOT_FOUND,
                Error::SecretKeyMissing { .. } => reason::SECRET_KEY_MISSING,
                _ => return Err(error),
            };
            fail(policy, ctx, &policies, why, &error).await?;
            return Err(error);
        }
    };

    // 4. Publish to running sidecars (only when the generation is new, or now and then).
    let now = (ctx.clock)();
    let previous = ctx
        .published
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&(ns.clone(), name.clone()))
        .copied();
    let due = previous.is_none_or(|p| p.generation != generation || now - p.last_ms >= REPUBLISH_MS);
    let reports = async {
        if due {
            ctx.publisher.publish(&url, &ns, &name, &yaml, generation).await?;
        }
        ctx.publisher.reports(&url, &ns, &name).await
    }
    .await;
    let reports = match reports {
        Ok(r) => r,
        Err(error) => {
            fail(policy, ctx, &policies, reason::REDIS_UNREACHABLE, &error).await?;
            return Err(error);
        }
    };
    let first_ms = match previous {
        Some(p) if p.generation == generation => p.first_ms,
        _ => now,
    };
    if due {
        ctx.published.lock().unwrap_or_else(|e| e.into_inner()).insert(
            (ns.clone(), name.clone()),
            Published {
                generation,
                first_ms,
                last_ms: now,
            },
        );
    }

    // 5. Who enforces what.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let selected: Vec<String> = pods
        .list(&ListParams::default().labels(&format!("{POLICY_LABEL}={name}")))
        .await?
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| p.name_any())
        .collect();
    let e = enforcement(generation, &selected, &reports, now, first_ms);

    // 6. Status.
    let mut status = base_status(policy, generation);
    status.selected_pods = e.selected;
    status.enforcing_pods = e.enforcing;
    status.enforcing = Some(format!("{}/{}", e.enforcing, e.selected));
    status.generations = e.generations.clone();
    let previous_ready = policy.ready_condition().map(|c| c.reason.clone());
    status.conditions = conditions::set(
        &existing_conditions(policy),
        &[e.ready.clone(), e.degraded.clone()],
        generation,
        now,
    );
    apply_status(&policies, &name, &status).await?;
    if previous_ready.as_deref() != Some(e.ready.reason) && e.ready.reason != reason::PROPAGATING {
        event(policy, ctx, EventType::Normal, e.ready.reason, &e.ready.message).await;
    }
    Ok(Action::requeue(if e.enforcing < e.selected {
        PROPAGATION_POLL
    } else {
        RESYNC
    }))
}

/// Counts of who enforces what, and the conditions they imply. Pure, so it is unit-tested.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enforcement {
    /// Running selected pods.
    pub selected: u32,
    /// Of those, how many enforce `generation` or later.
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
                if r.generation >= generation {
                    enforcing += 1;
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
        let shown: Vec<_> = lagging.iter().take(5).cloned().collect();
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

/// Record a user-facing failure: `Ready=False` with `why`, an Event on the transition. `Degraded`
/// says whether already-running sidecars are affected (Redis down) or merely not updated.
async fn fail(
    policy: &RateLimitPolicy,
    ctx: &Context,
    api: &Api<RateLimitPolicy>,
    why: &'static str,
    error: &Error,
) -> Result<()> {
    let generation = policy.metadata.generation.unwrap_or_default();
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
    status.conditions = conditions::set(
        &existing_conditions(policy),
        &[ready, degraded],
        generation,
        (ctx.clock)(),
    );
    let changed = policy.ready_condition().map(|c| c.reason.as_str()) != Some(why);
    apply_status(api, &policy.name_any(), &status).await?;
    if changed {
        event(policy, ctx, EventType::Warning, why, &message).await;
    }
    Ok(())
}

async fn event(policy: &RateLimitPolicy, ctx: &Context, type_: EventType, reason: &str, note: &str) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &policy.object_ref(&())).await {
        // An Event is a courtesy; failing to record one must not fail the reconcile.
        warn!(error = %e, "could not publish event");
    }
}

async fn apply_status(api: &Api<RateLimitPolicy>, name: &str, status: &RateLimitPolicyStatus) -> Result<()> {
    let patch = json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "RateLimitPolicy",
        "metadata": {"name": name},
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await?;
    Ok(())
}

async fn apply_config_map(
    policy: &RateLimitPolicy,
    ctx: &Context,
    ns: &str,
    name: &str,
    yaml: &str,
) -> Result<()> {
    let owner = policy
        .controller_owner_ref(&())
        .ok_or_else(|| Error::Serialization("policy without uid".into()))?;
    let cm = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(name),
            "namespace": ns,
            "labels": {MANAGED_BY.0: MANAGED_BY.1, POLICY_LABEL: name},
            "ownerReferences": [owner],
        },
        "data": {CONFIG_KEY: yaml},
    });
    Api::<ConfigMap>::namespaced(ctx.client.clone(), ns)
        .patch(
            &config_map_name(name),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await?;
    Ok(())
}

async fn redis_url(policy: &RateLimitPolicy, ctx: &Context, ns: &str) -> Result<String> {
    let r = &policy.spec.redis.secret_ref;
    let secret = Api::<Secret>::namespaced(ctx.client.clone(), ns)
        .get_opt(&r.name)
        .await?
        .ok_or_else(|| Error::SecretNotFound {
            namespace: ns.into(),
            name: r.name.clone(),
        })?;
    let missing = || Error::SecretKeyMissing {
        namespace: ns.into(),
        name: r.name.clone(),
        key: r.key.clone(),
    };
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(&r.key))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(missing)?;
    let url = String::from_utf8(bytes).map_err(|_| missing())?;
    Ok(url.trim().to_owned())
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
            &reports(&[("a", 3, 990), ("b", 4, 995)]),
            1_000,
            0,
        );
        assert_eq!((e.enforcing, e.selected), (2, 2));
        assert!(e.ready.status);
        assert_eq!(e.ready.reason, reason::ENFORCED);
        assert!(!e.degraded.status);
        assert_eq!(
            e.generations,
            vec![
                GenerationCount {
                    generation: 4,
                    pods: 1
                },
                GenerationCount {
                    generation: 3,
                    pods: 1
                }
            ]
        );
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
