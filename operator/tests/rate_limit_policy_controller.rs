//! The RateLimitPolicy controller against the in-memory test API server and a real Redis: create,
//! update (published to Redis within the 2 s target and reported in status), delete, bad Secret,
//! unreachable Redis, status conditions and Events; and Lease leader handover.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::{
    ByteString,
    api::{
        core::v1::{ConfigMap, Pod, Secret},
        events::v1::Event,
    },
};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sluice_crds::rate_limit_policy::RateLimitPolicy;
use sluice_e2e::{Env, TestNamespace, wait_for};
use sluice_operator::{
    clock::system_clock,
    controller::{Context, rate_limit_policy},
    leader::{self, LeaseSettings},
    metrics::Metrics,
};
use sluice_testsupport::{RedisServer, free_port};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(15);

struct Fixture {
    _env: Env,
    ns: TestNamespace,
    redis: RedisServer,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn fixture() -> Fixture {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = Env::start().await.unwrap();
    for (_, yaml) in sluice_operator::crdgen::crds() {
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    let ns = env.namespace("rlp").await.unwrap();
    let redis = RedisServer::start();
    secret(&ns, "redis", "url", &redis.url()).await;
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(
        env.client(),
        metrics.clone(),
        Some("test".into()),
        system_clock(),
        rate_limit_policy::State::default(),
    ));
    let stop = CancellationToken::new();
    tokio::spawn(rate_limit_policy::run(ctx, stop.clone().cancelled_owned()));
    Fixture {
        _env: env,
        ns,
        redis,
        metrics,
        stop,
    }
}

async fn secret(ns: &TestNamespace, name: &str, key: &str, value: &str) {
    let s = Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            key.into(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    ns.api::<Secret>()
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

fn policy(name: &str, secret: &str, requests: u64) -> RateLimitPolicy {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RateLimitPolicy",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "redis": {"secretRef": {"name": secret}},
            "rules": [{"name": "all", "limit": {"requests": requests, "window": "1m"}}]
        }
    }))
    .unwrap()
}

/// Wait until the policy's `Ready` condition has `reason`; returns the policy.
async fn ready_reason(ns: &TestNamespace, name: &str, reason: &str) -> RateLimitPolicy {
    let api = ns.api::<RateLimitPolicy>();
    wait_for(&format!("{name} Ready reason {reason}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            (p.ready_condition()?.reason == reason).then_some(p)
        }
    })
    .await
    .unwrap()
}

/// Wait until `status.enforcing` reads `want`; returns the policy.
async fn enforcing(ns: &TestNamespace, name: &str, want: &str) -> RateLimitPolicy {
    let api = ns.api::<RateLimitPolicy>();
    wait_for(&format!("{name} enforcing {want}"), DEADLINE, || {
        let api = api.clone();
        async move {
            let p = api.get(name).await.ok()?;
            (p.status.as_ref()?.enforcing.as_deref() == Some(want)).then_some(p)
        }
    })
    .await
    .unwrap()
}

/// A running pod governed by `policy`, as the webhook labels them.
async fn running_pod(ns: &TestNamespace, name: &str, policy: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web", "sluice.dev/policy": policy}},
        "spec": {"containers": [{"name": "web", "image": "web"}]}
    }))
    .unwrap();
    let pods = ns.api::<Pod>();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();
}

/// What a sidecar reports after applying `generation`.
fn report(redis: &RedisServer, ns: &str, policy: &str, pod: &str, generation: i64) {
    let now = (system_clock())();
    let reply = redis.command(&format!(
        "HSET sluice:{{{ns}/{policy}}}:enforced {pod} \"{generation} {now}\""
    ));
    assert!(reply.starts_with(':'), "{reply}");
}

fn redis_config(redis: &RedisServer, ns: &str, policy: &str) -> String {
    redis.command(&format!("GET sluice:{{{ns}/{policy}}}:config"))
}

#[tokio::test]
async fn a_new_policy_gets_an_owned_config_map_a_redis_copy_and_ready_status() {
    let f = fixture().await;
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();

    let p = ready_reason(&f.ns, "api", "NoPods").await;
    let status = p.status.clone().unwrap();
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.rules, Some(1));
    assert_eq!(status.enforcing.as_deref(), Some("0/0"));
    assert_eq!(status.config_map.as_deref(), Some("sluice-policy-api"));
    assert_eq!(p.ready_condition().unwrap().status, "True");

    let cm = f.ns.api::<ConfigMap>().get("sluice-policy-api").await.unwrap();
    let owner = &cm.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("RateLimitPolicy", "api", Some(true))
    );
    let yaml = &cm.data.as_ref().unwrap()["config.yaml"];
    assert!(
        yaml.contains("generation: 1") && yaml.contains("requests: 100"),
        "{yaml}"
    );
    assert!(
        !yaml.contains("redis://"),
        "the Redis URL never goes into the ConfigMap"
    );
    let managers: Vec<_> = cm
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(managers.contains(&"sluice-operator".to_string()), "{managers:?}");

    let published = redis_config(&f.redis, f.ns.name(), "api");
    assert!(published.contains("requests: 100"), "{published}");
}

#[tokio::test]
async fn an_update_reaches_redis_within_two_seconds_and_status_counts_pods_enforcing_it() {
    let f = fixture().await;
    let (ns, api) = (f.ns.name().to_string(), f.ns.api::<RateLimitPolicy>());
    api.create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();
    ready_reason(&f.ns, "api", "NoPods").await;
    running_pod(&f.ns, "web-1", "api").await;
    running_pod(&f.ns, "web-2", "api").await;
    let p = enforcing(&f.ns, "api", "0/2").await;
    assert_eq!(p.ready_condition().unwrap().reason, "Propagating");
    report(&f.redis, &ns, "api", "web-1", 1);
    report(&f.redis, &ns, "api", "web-2", 1);
    let p = ready_reason(&f.ns, "api", "Enforced").await;
    assert_eq!(p.status.unwrap().enforcing.as_deref(), Some("2/2"));

    let started = Instant::now();
    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"rules": [{"name": "all", "limit": {"requests": 7, "window": "1m"}}]}}),
        ),
    )
    .await
    .unwrap();
    let redis = &f.redis;
    wait_for("generation 2 in Redis", Duration::from_secs(2), || {
        let ns = ns.clone();
        async move {
            redis_config(redis, &ns, "api")
                .contains("generation: 2")
                .then_some(())
        }
    })
    .await
    .unwrap();
    let publish_latency = started.elapsed();
    let p = ready_reason(&f.ns, "api", "Propagating").await;
    let status = p.status.unwrap();
    assert_eq!(status.observed_generation, Some(2));
    assert_eq!(
        status.enforcing.as_deref(),
        Some("0/2"),
        "both pods still enforce generation 1"
    );
    report(&f.redis, &ns, "api", "web-1", 2);
    report(&f.redis, &ns, "api", "web-2", 2);
    let p = ready_reason(&f.ns, "api", "Enforced").await;
    let status = p.status.unwrap();
    assert_eq!(status.enforcing.as_deref(), Some("2/2"));
    assert_eq!(status.generations.len(), 1);
    assert_eq!(
        (status.generations[0].generation, status.generations[0].pods),
        (2, 2)
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "change to Enforced took {:?} (publish {publish_latency:?})",
        started.elapsed()
    );
    let cm = f.ns.api::<ConfigMap>().get("sluice-policy-api").await.unwrap();
    assert!(cm.data.unwrap()["config.yaml"].contains("requests: 7"));
}

#[tokio::test]
async fn a_missing_secret_sets_ready_false_with_an_event_and_recovers_when_created() {
    let f = fixture().await;
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("api", "later", 10))
        .await
        .unwrap();
    let p = ready_reason(&f.ns, "api", "SecretNotFound").await;
    let ready = p.ready_condition().unwrap();
    assert_eq!(ready.status, "False");
    assert_eq!(
        ready.message,
        format!(
            "Secret {}/later named by spec.redis.secretRef does not exist",
            f.ns.name()
        )
    );
    let events = f.ns.api::<Event>();
    wait_for("a SecretNotFound event", DEADLINE, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("SecretNotFound") && e.type_.as_deref() == Some("Warning")
            })
        }
    })
    .await
    .unwrap();
    assert!(f.metrics.reconcile_errors("ratelimitpolicy", "secret_not_found") >= 1);

    secret(&f.ns, "later", "url", &f.redis.url()).await;
    ready_reason(&f.ns, "api", "NoPods").await;
}

#[tokio::test]
async fn a_secret_without_the_key_and_an_unreachable_redis_are_reported() {
    let f = fixture().await;
    secret(&f.ns, "wrong-key", "uri", &f.redis.url()).await;
    secret(
        &f.ns,
        "nowhere",
        "url",
        &format!("redis://127.0.0.1:{}", free_port()),
    )
    .await;
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("a", "wrong-key", 10))
        .await
        .unwrap();
    api.create(&PostParams::default(), &policy("b", "nowhere", 10))
        .await
        .unwrap();
    let a = ready_reason(&f.ns, "a", "SecretKeyMissing").await;
    assert!(
        a.ready_condition()
            .unwrap()
            .message
            .ends_with("has no key \"url\" (spec.redis.secretRef.key)")
    );
    let b = ready_reason(&f.ns, "b", "RedisUnreachable").await;
    let degraded = b
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Degraded")
        .unwrap();
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "RedisUnreachable")
    );
    // The ConfigMap is written all the same: new pods start with the right rules.
    f.ns.api::<ConfigMap>().get("sluice-policy-b").await.unwrap();
}

#[tokio::test]
async fn deleting_the_policy_collects_its_config_map() {
    let f = fixture().await;
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();
    ready_reason(&f.ns, "api", "NoPods").await;
    api.delete("api", &DeleteParams::default()).await.unwrap();
    let cms = f.ns.api::<ConfigMap>();
    wait_for("the ConfigMap to be collected", DEADLINE, || {
        let cms = cms.clone();
        async move {
            cms.get_opt("sluice-policy-api")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await
    .unwrap();
}

fn fast(identity: &str) -> LeaseSettings {
    LeaseSettings {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(100),
        ..LeaseSettings::new("sluice-system", "sluice-operator", identity)
    }
}

async fn until(rx: &mut watch::Receiver<bool>, want: bool, what: &str) {
    tokio::time::timeout(DEADLINE, rx.wait_for(|v| *v == want))
        .await
        .unwrap_or_else(|_| panic!("{what}"))
        .unwrap();
}

#[tokio::test]
async fn one_replica_leads_and_another_takes_over_when_it_stops_or_dies() {
    let env = Env::start().await.unwrap();
    let ns: Value = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "sluice-system"}});
    env.apply_yaml(&serde_yaml::to_string(&ns).unwrap(), None)
        .await
        .unwrap();

    let (a_tx, mut a) = watch::channel(false);
    let a_stop = CancellationToken::new();
    let a_task = tokio::spawn(leader::run(
        env.client(),
        fast("a"),
        a_tx,
        a_stop.clone().cancelled_owned(),
    ));
    until(&mut a, true, "a leads").await;

    let (b_tx, mut b) = watch::channel(false);
    let b_stop = CancellationToken::new();
    let b_task = tokio::spawn(leader::run(
        env.client(),
        fast("b"),
        b_tx,
        b_stop.clone().cancelled_owned(),
    ));
    let (c_tx, mut c) = watch::channel(false);
    let c_task = tokio::spawn(leader::run(
        env.client(),
        fast("c"),
        c_tx,
        CancellationToken::new().cancelled_owned(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await; // several retry periods: b and c must stay followers
    assert!(*a.borrow() && !*b.borrow() && !*c.borrow(), "exactly one leader");

    // A graceful stop releases the Lease: a follower takes over well before it would expire.
    let handover = Instant::now();
    a_stop.cancel();
    a_task.await.unwrap();
    assert!(!*a.borrow());
    tokio::time::timeout(DEADLINE, async {
        loop {
            if *b.borrow() || *c.borrow() {
                break;
            }
            tokio::select! { _ = b.changed() => {}, _ = c.changed() => {} }
        }
    })
    .await
    .unwrap();
    assert!(
        handover.elapsed() < Duration::from_secs(2),
        "took {:?}",
        handover.elapsed()
    );
    assert!(!(*b.borrow() && *c.borrow()), "never two leaders");

    // A leader that dies without releasing (aborted: no step-down, no release) is replaced once the
    // Lease expires.
    let crash = Instant::now();
    let mut survivor = if *b.borrow() {
        b_task.abort();
        c
    } else {
        c_task.abort();
        b
    };
    until(&mut survivor, true, "the survivor leads").await;
    assert!(
        crash.elapsed() >= Duration::from_millis(1500),
        "not before the Lease expired: {:?}",
        crash.elapsed()
    );
    drop(b_stop);
}
