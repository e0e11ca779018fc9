//! The RateLimitPolicy controller against the in-memory test API server and a real Redis: create,
//! update (published to Redis within the 2 s target and reported in status), delete, bad Secret,
//! unreachable Redis, status conditions and Events; and Lease leader handover.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Pod, Secret, Service},
    events::v1::Event,
    networking::v1::NetworkPolicy,
};
use kube::{
    ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use sluice_crds::rate_limit_policy::RateLimitPolicy;
use sluice_e2e::{Env, TestNamespace, wait_for};
use sluice_operator::{
    budget::Budget,
    clock::system_clock,
    controller::{Context, Namespaces, rate_limit_policy},
    leader::{self, LeaseSettings},
    metrics::Metrics,
    propagation::Publisher,
    signing::ConfigSigner,
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
    fixture_with(|_| rate_limit_policy::State::default()).await
}

/// A fixture whose controller state is made knowing the test namespace's name.
async fn fixture_with(state: impl FnOnce(&str) -> rate_limit_policy::State) -> Fixture {
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
    ns.create_secret("redis", "url", &redis.url()).await.unwrap();
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(
        env.client(),
        metrics.clone(),
        Some("test".into()),
        system_clock(),
        state(ns.name()),
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
    // Counted by the error policy, just after the event is published.
    wait_for("the missing Secret counted", DEADLINE, || async {
        (f.metrics.reconcile_errors("ratelimitpolicy", "secret_not_found") >= 1).then_some(())
    })
    .await
    .unwrap();

    f.ns.create_secret("later", "url", &f.redis.url()).await.unwrap();
    ready_reason(&f.ns, "api", "NoPods").await;
}

#[tokio::test]
async fn a_secret_without_the_key_and_an_unreachable_redis_are_reported() {
    let f = fixture().await;
    f.ns.create_secret("wrong-key", "uri", &f.redis.url())
        .await
        .unwrap();
    f.ns.create_secret("nowhere", "url", &format!("redis://127.0.0.1:{}", free_port()))
        .await
        .unwrap();
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

/// The namespace's counter key: its value, whether it is immutable, and its labels.
async fn counter_key(ns: &TestNamespace) -> (Vec<u8>, Option<bool>) {
    let s = ns.api::<Secret>().get("sluice-counter-key").await.unwrap();
    assert_eq!(
        s.labels().get("app.kubernetes.io/managed-by").map(String::as_str),
        Some("sluice-operator")
    );
    (s.data.unwrap()["key"].0.clone(), s.immutable)
}

#[tokio::test]
async fn the_first_policy_of_a_namespace_writes_its_counter_key_once() {
    let f = fixture().await;
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("a", "redis", 10))
        .await
        .unwrap();
    ready_reason(&f.ns, "a", "NoPods").await;
    let (key, immutable) = counter_key(&f.ns).await;
    assert!(key.len() >= 32 && key.iter().all(u8::is_ascii_alphanumeric));
    assert_eq!(immutable, Some(true));

    // Another policy of the namespace, and another reconcile of the first, keep it.
    api.create(&PostParams::default(), &policy("b", "redis", 10))
        .await
        .unwrap();
    ready_reason(&f.ns, "b", "NoPods").await;
    let mut touched = api.get("a").await.unwrap();
    touched.spec.rules[0].limit.requests = 20;
    api.replace("a", &PostParams::default(), &touched).await.unwrap();
    wait_for("a at generation 2", DEADLINE, || {
        let api = api.clone();
        async move { (api.get("a").await.ok()?.status?.observed_generation == Some(2)).then_some(()) }
    })
    .await
    .unwrap();
    assert_eq!(counter_key(&f.ns).await.0, key, "the key changed");
}

#[tokio::test]
async fn two_reconciles_writing_the_counter_key_at_once_agree_on_one() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("ck").await.unwrap();
    let client = env.client();
    let (a, b) = tokio::join!(
        sluice_operator::counter_key::ensure(&client, ns.name()),
        sluice_operator::counter_key::ensure(&client, ns.name())
    );
    a.unwrap();
    b.unwrap();
    let (key, _) = counter_key(&ns).await;
    sluice_operator::counter_key::ensure(&client, ns.name())
        .await
        .unwrap();
    assert_eq!(counter_key(&ns).await.0, key, "a later call changed the key");
}

#[tokio::test]
async fn an_unusable_counter_key_is_reported_without_its_value_and_replaced_once_deleted() {
    let f = fixture().await;
    f.ns.create_secret("sluice-counter-key", "key", "too-short-a-key")
        .await
        .unwrap();
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("api", "redis", 10))
        .await
        .unwrap();
    let p = ready_reason(&f.ns, "api", "CounterKeyUnusable").await;
    let message = p.ready_condition().unwrap().message.clone();
    assert!(message.contains("has 15 characters; at least 32"), "{message}");
    assert!(!message.contains("too-short-a-key"), "the key shows: {message}");
    // Counted by the error policy, just after the status is written.
    wait_for("the unusable key counted", DEADLINE, || async {
        (f.metrics
            .reconcile_errors("ratelimitpolicy", "counter_key_unusable")
            >= 1)
            .then_some(())
    })
    .await
    .unwrap();

    f.ns.api::<Secret>()
        .delete("sluice-counter-key", &DeleteParams::default())
        .await
        .unwrap();
    ready_reason(&f.ns, "api", "NoPods").await;
    assert!(counter_key(&f.ns).await.0.len() >= 32);
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

/// A pod as the webhook leaves it for policy `policy`: the app on 8080 (its name `http` moved to the
/// sidecar, a metrics port beside it), the native sidecar on 15080 (`http`) and 15021.
async fn injected_pod(ns: &TestNamespace, name: &str, policy: &str) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "web", "sluice.dev/policy": policy}},
        "spec": {
            "containers": [{"name": "web", "image": "web", "ports": [
                {"containerPort": 8080}, {"name": "metrics", "containerPort": 9100}
            ]}],
            "initContainers": [{
                "name": "sluice-sidecar", "image": "sluice", "restartPolicy": "Always",
                "env": [{"name": "SLUICE_UPSTREAM", "value": "http://127.0.0.1:8080"}],
                "ports": [
                    {"name": "http", "containerPort": 15080},
                    {"name": "sluice-admin", "containerPort": 15021}
                ]
            }]
        }
    }))
    .unwrap();
    ns.api::<Pod>()
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// Wait until `get` returns something.
async fn until_some<T, F, Fut>(what: &str, get: F) -> T
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for(what, DEADLINE, get).await.unwrap()
}

/// The `spec.ingress[0].ports[].port` of the NetworkPolicy, as JSON values.
fn admitted(np: &NetworkPolicy) -> Vec<Value> {
    let v = serde_json::to_value(np).unwrap();
    v["spec"]["ingress"][0]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].clone())
        .collect()
}

#[tokio::test]
async fn a_policy_gets_an_owned_network_policy_admitting_only_the_sidecar_ports_until_turned_off() {
    let f = fixture().await;
    let api = f.ns.api::<RateLimitPolicy>();
    let nps = f.ns.api::<NetworkPolicy>();
    let mut p = policy("api", "redis", 100);
    p.spec.network_policy.additional_ports = vec![9100];
    api.create(&PostParams::default(), &p).await.unwrap();
    injected_pod(&f.ns, "web-1", "api").await;

    let p = ready_reason(&f.ns, "api", "NoPods").await;
    assert_eq!(
        p.status.unwrap().network_policy.as_deref(),
        Some("sluice-policy-api")
    );
    let np = nps.get("sluice-policy-api").await.unwrap();
    let owner = &np.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("RateLimitPolicy", "api", Some(true))
    );
    let spec = np.spec.as_ref().unwrap();
    assert_eq!(
        spec.pod_selector.as_ref().unwrap().match_labels,
        Some(BTreeMap::from([("sluice.dev/policy".into(), "api".into())]))
    );
    assert_eq!(spec.policy_types, Some(vec!["Ingress".into()]));
    assert_eq!(
        admitted(&np),
        [json!("http"), json!("sluice"), json!("sluice-admin"), json!(9100)],
        "the app's port 8080 is not admitted"
    );

    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"networkPolicy": {"enabled": false}}})),
    )
    .await
    .unwrap();
    until_some("the NetworkPolicy to be deleted", || {
        let nps = nps.clone();
        async move {
            nps.get_opt("sluice-policy-api")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    until_some("status without the NetworkPolicy", || {
        let api = api.clone();
        async move {
            let p = api.get("api").await.ok()?;
            (p.status?.network_policy.is_none()).then_some(())
        }
    })
    .await;

    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"networkPolicy": {"enabled": true}}})),
    )
    .await
    .unwrap();
    until_some("the NetworkPolicy back", || {
        let nps = nps.clone();
        async move { nps.get_opt("sluice-policy-api").await.ok()? }
    })
    .await;
    api.delete("api", &DeleteParams::default()).await.unwrap();
    until_some("the NetworkPolicy to be collected with the policy", || {
        let nps = nps.clone();
        async move {
            nps.get_opt("sluice-policy-api")
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_service_targeting_the_app_port_by_number_is_reported_in_status_with_a_warning() {
    let f = fixture().await;
    let services = f.ns.api::<Service>();
    for (name, target) in [("by-name", json!("http")), ("by-number", json!(8080))] {
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": target}]}
        }))
        .unwrap();
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    injected_pod(&f.ns, "web-1", "api").await;
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();

    let exposed = until_some("AppPortExposed=True", || {
        let api = api.clone();
        async move {
            let p = api.get("api").await.ok()?;
            p.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "AppPortExposed" && c.status == "True")
        }
    })
    .await;
    assert_eq!(exposed.reason, "ServiceTargetsAppPort");
    assert!(
        exposed
            .message
            .starts_with("Service by-number port 80 targets port 8080 (the app's port 8080): "),
        "{}",
        exposed.message
    );
    assert!(!exposed.message.contains("by-name"), "{}", exposed.message);
    let events = f.ns.api::<Event>();
    until_some("a ServiceTargetsAppPort warning", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("ServiceTargetsAppPort") && e.type_.as_deref() == Some("Warning")
            })
        }
    })
    .await;

    services
        .patch(
            "by-number",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"port": 80, "targetPort": "http"}]}})),
        )
        .await
        .unwrap();
    // Services are not watched: a change is seen at the next reconcile, which a policy edit triggers.
    api.patch(
        "api",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
    )
    .await
    .unwrap();
    until_some("AppPortExposed=False", || {
        let api = api.clone();
        async move {
            let p = api.get("api").await.ok()?;
            p.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "AppPortExposed" && c.status == "False")
        }
    })
    .await;
}

#[tokio::test]
async fn same_named_objects_the_policy_does_not_own_are_reported_and_left_unchanged() {
    let f = fixture().await;
    let cms = f.ns.api::<ConfigMap>();
    let nps = f.ns.api::<NetworkPolicy>();
    let theirs: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "sluice-policy-cm"}, "data": {"config.yaml": "theirs"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &theirs).await.unwrap();
    let theirs: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "sluice-policy-np"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]}
    }))
    .unwrap();
    nps.create(&PostParams::default(), &theirs).await.unwrap();
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("cm", "redis", 100))
        .await
        .unwrap();
    api.create(&PostParams::default(), &policy("np", "redis", 100))
        .await
        .unwrap();

    let ns = f.ns.name();
    for (policy, kind) in [("cm", "ConfigMap"), ("np", "NetworkPolicy")] {
        let p = ready_reason(&f.ns, policy, "ObjectNotOwned").await;
        let ready = p.ready_condition().unwrap();
        assert_eq!(ready.status, "False");
        assert!(
            ready.message.starts_with(&format!(
                "{kind} {ns}/sluice-policy-{policy} exists and is not controlled by this RateLimitPolicy"
            )),
            "{}",
            ready.message
        );
    }
    wait_for("both refusals counted", DEADLINE, || async {
        (f.metrics.reconcile_errors("ratelimitpolicy", "not_owned") >= 2).then_some(())
    })
    .await
    .unwrap();
    let cm = cms.get("sluice-policy-cm").await.unwrap();
    assert_eq!(cm.data.unwrap()["config.yaml"], "theirs");
    assert!(cm.metadata.owner_references.is_none());
    let np = nps.get("sluice-policy-np").await.unwrap();
    assert!(np.metadata.owner_references.is_none());
    assert_eq!(np.spec.unwrap().ingress, None);
    assert!(
        cms.get_opt("sluice-policy-np").await.unwrap().is_some(),
        "what comes before the refused object is still written"
    );

    // Deleting theirs lets the policy's own be written.
    nps.delete("sluice-policy-np", &DeleteParams::default())
        .await
        .unwrap();
    ready_reason(&f.ns, "np", "NoPods").await;
}

#[tokio::test]
async fn the_published_config_is_signed_and_a_config_written_by_someone_else_is_replaced() {
    let signer = Arc::new(ConfigSigner::generate());
    let f = fixture_with(|_| rate_limit_policy::State {
        signer: Some(signer.clone()),
        ..rate_limit_policy::State::default()
    })
    .await;
    let (ns, api) = (f.ns.name().to_string(), f.ns.api::<RateLimitPolicy>());
    api.create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();
    ready_reason(&f.ns, "api", "NoPods").await;
    let published = redis_config(&f.redis, &ns, "api");
    assert!(
        published.starts_with("$") && published.contains("# sluice-signature: ed25519 "),
        "{published}"
    );
    let yaml =
        f.ns.api::<ConfigMap>()
            .get("sluice-policy-api")
            .await
            .unwrap()
            .data
            .unwrap()["config.yaml"]
            .clone();
    assert!(
        published.contains(&signer.sign(&yaml)),
        "the signature covers exactly the rendered config"
    );

    // A forged config, pinned with a huge generation, is noticed at the next reconcile and replaced.
    let key = format!("sluice:{{{ns}/api}}:config");
    let forged = yaml.replace("generation: 1", "generation: 9223372036854775807");
    let quoted = serde_json::to_string(&forged).unwrap();
    assert!(f.redis.command(&format!("SET {key} {quoted}")).starts_with('+'));
    running_pod(&f.ns, "web-1", "api").await; // a pod event triggers a reconcile
    wait_for("the operator's config back in Redis", DEADLINE, || async {
        let now = redis_config(&f.redis, &ns, "api");
        now.contains("# sluice-signature: ed25519 ").then_some(())
    })
    .await
    .unwrap();
    let events = f.ns.api::<Event>();
    wait_for("a RemoteConfigReplaced warning", DEADLINE, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("RemoteConfigReplaced"))
        }
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn a_namespace_gets_at_most_its_share_of_redis_servers() {
    let f = fixture_with(|_| rate_limit_policy::State {
        publisher: Publisher::with_budget(Budget::new(1, 10, Duration::from_secs(600))),
        ..rate_limit_policy::State::default()
    })
    .await;
    // Another database of the same server is another endpoint, as another host would be.
    let other_url = format!("{}/1", f.redis.url());
    f.ns.create_secret("second", "url", &other_url).await.unwrap();
    let api = f.ns.api::<RateLimitPolicy>();
    api.create(&PostParams::default(), &policy("first", "redis", 100))
        .await
        .unwrap();
    ready_reason(&f.ns, "first", "NoPods").await;
    api.create(&PostParams::default(), &policy("also-first", "redis", 100))
        .await
        .unwrap();
    ready_reason(&f.ns, "also-first", "NoPods").await;
    api.create(&PostParams::default(), &policy("second", "second", 100))
        .await
        .unwrap();
    let p = ready_reason(&f.ns, "second", "TooManyEndpoints").await;
    let message = &p.ready_condition().unwrap().message;
    assert!(
        message.starts_with(&format!(
            "namespace {} already uses 1 distinct Redis endpoints, the most the operator connects to for one namespace",
            f.ns.name()
        )),
        "{message}"
    );
    // Counted by the error policy, just after the status is written.
    wait_for("the refusal counted", DEADLINE, || async {
        (f.metrics
            .reconcile_errors("ratelimitpolicy", "too_many_endpoints")
            >= 1)
            .then_some(())
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn with_watch_namespaces_only_policies_in_them_are_reconciled() {
    let f = fixture_with(|ns| rate_limit_policy::State {
        namespaces: Namespaces::Only(vec![ns.to_owned()]),
        ..rate_limit_policy::State::default()
    })
    .await;
    let elsewhere = f._env.namespace("unwatched").await.unwrap();
    elsewhere
        .create_secret("redis", "url", &f.redis.url())
        .await
        .unwrap();
    elsewhere
        .api::<RateLimitPolicy>()
        .create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();
    f.ns.api::<RateLimitPolicy>()
        .create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();
    ready_reason(&f.ns, "api", "NoPods").await;
    // The watched namespace's policy is done; the other one was never looked at.
    let other = elsewhere.api::<RateLimitPolicy>().get("api").await.unwrap();
    assert!(other.status.is_none(), "{:?}", other.status);
    assert!(
        elsewhere
            .api::<ConfigMap>()
            .get_opt("sluice-policy-api")
            .await
            .unwrap()
            .is_none()
    );
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

/// `injected_pod`, then marked running.
async fn running_injected_pod(ns: &TestNamespace, name: &str, policy: &str) {
    injected_pod(ns, name, policy).await;
    ns.api::<Pod>()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn the_count_of_enforcing_pods_is_published_signed_and_follows_the_pods() {
    let signer = Arc::new(ConfigSigner::generate());
    let f = fixture_with(|_| rate_limit_policy::State {
        signer: Some(signer.clone()),
        ..rate_limit_policy::State::default()
    })
    .await;
    let ns = f.ns.name().to_string();
    f.ns.api::<RateLimitPolicy>()
        .create(&PostParams::default(), &policy("api", "redis", 100))
        .await
        .unwrap();
    ready_reason(&f.ns, "api", "NoPods").await;
    let key = format!("sluice:{{{ns}/api}}:pods");
    assert_eq!(
        f.redis.command(&format!("EXISTS {key}")).trim_end(),
        ":0",
        "nothing while no pod runs"
    );

    let published = |pods: u32| {
        let expected = format!("{}\r\n", signer.sign(&format!("{ns}/api {pods}")));
        let (redis, key) = (&f.redis, key.clone());
        async move {
            wait_for(&format!("{pods} enforcing pods published"), DEADLINE, || {
                let (expected, key) = (expected.clone(), key.clone());
                async move {
                    let got = redis.command(&format!("GET {key}"));
                    got.contains(&expected).then_some(())
                }
            })
            .await
            .unwrap();
        }
    };
    running_injected_pod(&f.ns, "web-1", "api").await;
    running_injected_pod(&f.ns, "web-2", "api").await;
    published(2).await;
    // Labelled but without the sidecar (not injected), or not running yet: not enforcing.
    running_pod(&f.ns, "no-sidecar", "api").await;
    injected_pod(&f.ns, "pending", "api").await;
    running_injected_pod(&f.ns, "web-3", "api").await;
    published(3).await;
    f.ns.api::<Pod>()
        .delete("web-1", &DeleteParams::default())
        .await
        .unwrap();
    published(2).await;
}
