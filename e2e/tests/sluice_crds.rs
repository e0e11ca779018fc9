//! Sluice's own CRDs (crds/*.yaml) on the in-memory server: they install, and bad RateLimitPolicy and
//! JobQueue objects are refused with the messages a real API server gives.

use std::path::{Path, PathBuf};

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use sluice_e2e::Env;

fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds")
}

fn api(env: &Env, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("sluice.dev", "v1alpha1", kind), plural);
    Api::namespaced_with(env.client(), ns, &ar)
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(
        json!({"apiVersion": "sluice.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

fn causes(err: kube::Error) -> Vec<String> {
    match err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{}", s.message);
            s.details
                .map(|d| {
                    d.causes
                        .into_iter()
                        .map(|c| format!("{}: {}", c.field, c.message))
                        .collect()
                })
                .unwrap_or_default()
        }
        other => panic!("expected 422 Invalid, got {other}"),
    }
}

async fn install(env: &Env) {
    for file in [
        "ratelimitpolicies.sluice.dev.yaml",
        "jobqueues.sluice.dev.yaml",
        "queuedatabases.sluice.dev.yaml",
    ] {
        let yaml = std::fs::read_to_string(crds_dir().join(file)).unwrap();
        env.apply_yaml(&yaml, None).await.unwrap();
    }
}

#[tokio::test]
async fn a_valid_rate_limit_policy_is_stored_with_its_schema_defaults() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("rlp").await.unwrap();
    install(&env).await;
    let policies = api(&env, ns.name(), "RateLimitPolicy", "ratelimitpolicies");
    let spec = json!({"redis": {"secretRef": {"name": "redis"}}, "rules": [{"name": "per-client", "limit": {"requests": 100, "window": "1m"}}]});
    let stored = policies
        .create(&PostParams::default(), &object("RateLimitPolicy", "api", spec))
        .await
        .unwrap();
    assert_eq!(
        stored.data["spec"]["rules"][0]["limit"],
        json!({"requests": 100, "window": "1m"})
    );
    assert!(
        stored.data["spec"]["redis"]["timeout"].is_string(),
        "defaults are filled in: {}",
        stored.data["spec"]
    );
}

#[tokio::test]
async fn a_bad_rate_limit_policy_is_refused_field_by_field() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("rlp-bad").await.unwrap();
    install(&env).await;
    let policies = api(&env, ns.name(), "RateLimitPolicy", "ratelimitpolicies");
    let spec = json!({
        "redis": {"secretRef": {"name": "redis"}, "timeout": "10s"},
        "allowList": ["10.0.0.1"],
        "rules": [
            {"name": "a", "algorithm": "slidingLog", "limit": {"requests": 100, "window": "1m", "burst": 5}},
            {"name": "a", "limit": {"requests": 0, "window": "500ms"}},
        ],
    });
    let err = policies
        .create(&PostParams::default(), &object("RateLimitPolicy", "bad", spec))
        .await
        .unwrap_err();
    let got = causes(err);
    let expect = [
        "spec.rules[1].limit.requests: Invalid value: 0: spec.rules[1].limit.requests in body should be greater than or equal to 1",
        "spec.allowList: Invalid value: \"array\": allowList entries must be CIDRs",
        "spec.redis.timeout: Invalid value: \"string\": redis.timeout must be between 1ms and 5s",
        "spec.rules: Invalid value: \"array\": rule names must be unique within a policy",
        "spec.rules[0].limit.burst: Invalid value: \"integer\": limit.burst is only allowed with algorithm tokenBucket",
        "spec.rules[1].limit.window: Invalid value: \"string\": limit.window must be at least 1s",
    ];
    for e in expect {
        assert!(got.iter().any(|g| g.starts_with(e)), "missing {e:?} in {got:#?}");
    }
}

#[tokio::test]
async fn a_job_queue_name_too_long_for_its_worker_deployment_is_refused() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("jq").await.unwrap();
    install(&env).await;
    let queues = api(&env, ns.name(), "JobQueue", "jobqueues");
    let spec = json!({"database": {"secretRef": {"name": "db"}}, "worker": {"template": {"spec": {"containers": [{"name": "handler", "image": "h:1"}]}}}});
    queues
        .create(
            &PostParams::default(),
            &object("JobQueue", "emails", spec.clone()),
        )
        .await
        .unwrap();
    let long = "q".repeat(53);
    let got = causes(
        queues
            .create(&PostParams::default(), &object("JobQueue", &long, spec))
            .await
            .unwrap_err(),
    );
    assert!(
        got.iter()
            .any(|g| g.contains("JobQueue names are at most 52 characters")),
        "{got:#?}"
    );
}

#[tokio::test]
async fn a_job_queue_names_one_database_and_a_queue_database_only_with_row_level_security() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("jq").await.unwrap();
    install(&env).await;
    let queues = api(&env, ns.name(), "JobQueue", "jobqueues");
    let worker = json!({"template": {"spec": {"containers": [{"name": "handler", "image": "h:1"}]}}});
    let with = |database: Value| json!({"database": database, "worker": worker});
    queues
        .create(
            &PostParams::default(),
            &object(
                "JobQueue",
                "emails",
                with(json!({"queueDatabaseRef": {"name": "shared"}})),
            ),
        )
        .await
        .unwrap();
    let refused = [
        (
            json!({"queueDatabaseRef": {"name": "shared"}, "secretRef": {"name": "db"}}),
            "spec.database must name exactly one of secretRef",
        ),
        (json!({}), "spec.database must name exactly one of secretRef"),
        (
            json!({"queueDatabaseRef": {"name": "shared"}, "rowLevelSecurity": "Disabled"}),
            "spec.database.rowLevelSecurity must be Enabled with queueDatabaseRef",
        ),
    ];
    for (database, message) in refused {
        let got = causes(
            queues
                .create(
                    &PostParams::default(),
                    &object("JobQueue", "other", with(database)),
                )
                .await
                .unwrap_err(),
        );
        assert!(got.iter().any(|g| g.contains(message)), "{message}: {got:#?}");
    }
}
