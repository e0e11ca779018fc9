//! The propagation target, end to end with a real `sluice-sidecar` process: a policy change is enforced
//! by the running sidecar, and the policy's status says so, within 2 seconds — no ConfigMap volume
//! involved. The operator and the sidecar meet only through Redis and the contract both spell from
//! `sluice_crds::contract` (the keys, the `enforced` report); this test links neither across.

use std::{
    process::Stdio,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use sluice_crds::{
    contract::{env, path::POLICY_CONFIG_FILE},
    rate_limit_policy::RateLimitPolicy,
};
use sluice_e2e::{Env, TestNamespace, kubelet::sidecar_binary, wait_for};
use sluice_operator::{
    clock::system_clock,
    controller::{Context, rate_limit_policy},
    metrics::Metrics,
};
use sluice_testsupport::{RedisServer, free_port};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

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

/// A `sluice-sidecar` started from `config` as the webhook would start it in pod `pod` (Redis URL and
/// pod name from the environment), on free local ports; it is killed when dropped. Returns it and the
/// port it proxies on, once it is ready.
async fn sidecar(config: &std::path::Path, redis: &str, pod: &str) -> (tokio::process::Child, u16) {
    let (listen, admin) = (free_port(), free_port());
    let child = tokio::process::Command::new(sidecar_binary().unwrap())
        .arg("--config")
        .arg(config)
        .env(env::REDIS_URL, redis)
        .env(env::POD_NAME, pod)
        .env(env::LISTEN, format!("127.0.0.1:{listen}"))
        .env(env::ADMIN_LISTEN, format!("127.0.0.1:{admin}"))
        // Nothing listens there: allowed requests get a 502, refused ones the sidecar's own 429.
        .env(env::UPSTREAM, format!("http://127.0.0.1:{}", free_port()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for("the sidecar to be ready", Duration::from_secs(15), || async {
        let r = sluice_e2e::http::get(admin, "/readyz").await.ok()?;
        (r.status == 200).then_some(())
    })
    .await
    .unwrap();
    (child, listen)
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
         rules: [{{name: all, limit: {{requests: 100, window: 1h}}}}]\n",
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
    let cm = ns.api::<ConfigMap>().get("sluice-policy-api").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join(POLICY_CONFIG_FILE);
    std::fs::write(&config, &cm.data.unwrap()[POLICY_CONFIG_FILE]).unwrap();
    let (_sidecar, port) = sidecar(&config, &redis.url(), "web-1").await;
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
                json!({"spec": {"rules": [{"name": "all", "limit": {"requests": 3, "window": "1h"}}]}}),
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
    assert_eq!(p.status.unwrap().generations[0].generation, 2);

    // The sidecar enforces the new limit (3 an hour), not the old one (100): the fourth request is refused.
    let mut statuses = vec![];
    for _ in 0..4 {
        statuses.push(sluice_e2e::http::get(port, "/").await.unwrap().status);
    }
    assert_eq!(statuses, [502, 502, 502, 429]);
    stop.cancel();
}
