//! The propagation target, end to end with the sidecar's real Redis config loop
//! (`sluice_sidecar::config::remote`): a policy change is enforced by the running sidecar, and the
//! policy's status says so, within 2 seconds — no ConfigMap volume involved.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use sluice_crds::{rate_limit_policy::RateLimitPolicy, sidecar_config::PolicyRef};
use sluice_e2e::{Env, TestNamespace, wait_for};
use sluice_operator::{
    clock::system_clock,
    controller::{Context, rate_limit_policy},
    metrics::Metrics,
};
use sluice_sidecar::{
    clock::SystemClock,
    config::{
        ConfigErrors, Effective,
        env::ProcessEnv,
        reload::{ConfigSink, ReloadOutcome, ReloadSource},
        remote::{self, Remote},
    },
};
use sluice_testsupport::RedisServer;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Stands in for the proxy: remembers the config it was given and announces the generation.
struct Sink {
    running: Mutex<Effective>,
    applied: watch::Sender<i64>,
}

impl ConfigSink for Sink {
    fn apply(&self, config: Effective, _: ReloadSource) -> Result<ReloadOutcome, ConfigErrors> {
        let generation = config.generation();
        *self.running.lock().unwrap() = config;
        self.applied.send_replace(generation);
        Ok(ReloadOutcome::Applied)
    }
    fn rejected(&self, _: ReloadSource) {}
    fn running_generation(&self) -> i64 {
        self.running.lock().unwrap().generation()
    }
}

async fn status_of(
    ns: &TestNamespace,
    what: &str,
    check: impl Fn(&RateLimitPolicy) -> bool,
) -> RateLimitPolicy {
    let api = ns.api::<RateLimitPolicy>();
    let check = &check;
    wait_for(what, Duration::from_secs(15), || {
        let api = api.clone();
        async move {
            let p = api.get("api").await.ok()?;
            check(&p).then_some(p)
        }
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_policy_change_is_enforced_by_a_running_sidecar_and_reported_within_two_seconds() {
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let ns = env.namespace("prop").await.unwrap();
    let redis = RedisServer::start();
    ns.apply_yaml(&format!(
        "apiVersion: v1\nkind: Secret\nmetadata: {{name: redis}}\nstringData: {{url: \"{}\"}}\n---\n\
         apiVersion: sluice.dev/v1alpha1\nkind: RateLimitPolicy\nmetadata: {{name: api}}\n\
         spec:\n  redis: {{secretRef: {{name: redis}}}}\n  \
         rules: [{{name: all, limit: {{requests: 100, window: 1m}}}}]\n",
        redis.url()
    ))
    .await
    .unwrap();
    let stop = CancellationToken::new();
    let ctx = Arc::new(Context::new(
        env.client(),
        Arc::new(Metrics::default()),
        None,
        system_clock(),
        rate_limit_policy::State::default(),
    ));
    tokio::spawn(rate_limit_policy::run(ctx, stop.clone().cancelled_owned()));
    status_of(&ns, "generation 1 published", |p| {
        p.ready_condition().is_some_and(|c| c.reason == "NoPods")
    })
    .await;

    // A running pod whose sidecar started from the ConfigMap at generation 1.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web-1", "labels": {"sluice.dev/policy": "api"}},
        "spec": {"containers": [{"name": "web", "image": "web"}]}
    }))
    .unwrap();
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    ns.api::<Pod>()
        .patch_status(
            "web-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    let cm = ns
        .api::<k8s_openapi::api::core::v1::ConfigMap>()
        .get("sluice-policy-api")
        .await
        .unwrap();
    let initial =
        sluice_sidecar::config::load::from_yaml(&cm.data.unwrap()["config.yaml"], &ProcessEnv).unwrap();
    assert_eq!(initial.generation(), 1);
    let (applied_tx, applied_rx) = watch::channel(1);
    let sink = Arc::new(Sink {
        running: Mutex::new(initial),
        applied: applied_tx,
    });
    tokio::spawn(remote::run(
        Remote {
            redis_url: redis.url(),
            policy: PolicyRef {
                namespace: ns.name().into(),
                name: "api".into(),
                generation: 1,
            },
            pod: "web-1".into(),
            env: Arc::new(ProcessEnv),
            clock: Arc::new(SystemClock),
        },
        sink.clone(),
        applied_rx,
        stop.clone(),
    ));
    status_of(&ns, "the sidecar enforcing generation 1", |p| {
        p.ready_condition().is_some_and(|c| c.reason == "Enforced")
    })
    .await;

    let changed = Instant::now();
    ns.api::<RateLimitPolicy>()
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"rules": [{"name": "all", "limit": {"requests": 3, "window": "1m"}}]}}),
            ),
        )
        .await
        .unwrap();
    let p = status_of(&ns, "the sidecar enforcing generation 2", |p| {
        let s = p.status.as_ref();
        s.and_then(|s| s.observed_generation) == Some(2)
            && s.and_then(|s| s.enforcing.as_deref()) == Some("1/1")
            && p.ready_condition().is_some_and(|c| c.reason == "Enforced")
    })
    .await;
    let took = changed.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "policy change to enforced-and-reported took {took:?}"
    );
    assert_eq!(sink.running_generation(), 2);
    assert_eq!(
        sink.running.lock().unwrap().config.limits.rules[0].limit.requests,
        3
    );
    assert_eq!(p.status.unwrap().generations[0].generation, 2);
    stop.cancel();
}
