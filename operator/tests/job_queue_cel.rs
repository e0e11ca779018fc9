//! The CEL rules and bounds of the `JobQueue` CRD, evaluated the way the API server does (kube-cel,
//! schema defaults applied first): valid queues pass, and each invalid one fails with the message a
//! user reads.

use kube::{CustomResourceExt, core::cel::Validator};
use serde_json::{Value, json};
use sluice_crds::job_queue::JobQueue;

fn schema() -> Value {
    let crd = JobQueue::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

fn base() -> Value {
    json!({
        "database": {"secretRef": {"name": "pg"}},
        "worker": {"template": {"spec": {"containers": [{"name": "app", "image": "app:1"}]}}},
    })
}

fn messages(name: &str, edit: impl FnOnce(&mut Value)) -> Vec<String> {
    let mut spec = base();
    edit(&mut spec);
    let obj = json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "JobQueue",
        "metadata": {"name": name, "namespace": "shop"}, "spec": spec,
    });
    match Validator::new().validate(&schema(), &obj, None) {
        Ok(()) => vec![],
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

fn assert_rejected(edit: impl FnOnce(&mut Value), expected: &str) {
    let got = messages("emails", edit);
    assert!(
        got.iter().any(|m| m.contains(expected)),
        "expected a message containing {expected:?}, got {got:?}"
    );
}

#[test]
fn valid_job_queues_pass_every_rule() {
    assert_eq!(messages("emails", |_| {}), Vec::<String>::new());
    let full = messages("emails", |s| {
        s["queueName"] = json!("mail.outbound");
        s["worker"]["handler"] = json!({"container": "app", "port": 8080, "path": "/jobs"});
        s["worker"]["concurrency"] = json!(32);
        s["worker"]["jobTimeout"] = json!("10m");
        s["retry"] = json!({"maxAttempts": 5, "backoff": {"base": "500ms", "cap": "5m", "multiplier": 3}});
        s["retention"] = json!({"succeeded": "1h", "dead": "30d"});
        s["scaling"] = json!({"minReplicaCount": 0, "maxReplicaCount": 50, "targetJobsPerReplica": 20,
            "activationThreshold": 5, "pollingInterval": "5s", "cooldownPeriod": "2m", "provider": "keda",
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}}}});
    });
    assert_eq!(full, Vec::<String>::new());
    let min_equals_max = messages("emails", |s| {
        s["scaling"] = json!({"minReplicaCount": 3, "maxReplicaCount": 3});
    });
    assert_eq!(min_equals_max, Vec::<String>::new());
}

#[test]
fn min_above_max_is_refused() {
    assert_rejected(
        |s| s["scaling"] = json!({"minReplicaCount": 5, "maxReplicaCount": 2}),
        "scaling.minReplicaCount must not exceed scaling.maxReplicaCount",
    );
    // maxReplicaCount defaults to 100: a min above it is refused too.
    assert_rejected(
        |s| s["scaling"] = json!({"minReplicaCount": 101}),
        "scaling.minReplicaCount must not exceed scaling.maxReplicaCount",
    );
}

#[test]
fn a_backoff_cap_below_its_base_is_refused() {
    assert_rejected(
        |s| s["retry"] = json!({"backoff": {"base": "10s", "cap": "1s"}}),
        "retry.backoff.cap must be at least retry.backoff.base",
    );
}

#[test]
fn durations_out_of_range_are_refused_naming_the_field() {
    assert_rejected(
        |s| s["worker"]["jobTimeout"] = json!("48h"),
        "worker.jobTimeout must be between 1s and 24h",
    );
    assert_rejected(
        |s| s["worker"]["jobTimeout"] = json!("500ms"),
        "worker.jobTimeout must be between 1s and 24h",
    );
    assert_rejected(
        |s| s["scaling"] = json!({"pollingInterval": "100ms"}),
        "scaling.pollingInterval must be between 1s and 1h",
    );
    assert_rejected(
        |s| s["scaling"] = json!({"cooldownPeriod": "25h"}),
        "scaling.cooldownPeriod must be at most 24h",
    );
}

#[test]
fn zero_targets_and_long_names_are_refused() {
    assert_rejected(
        |s| s["scaling"] = json!({"targetJobsPerReplica": 0}),
        "scaling.targetJobsPerReplica must be greater than 0",
    );
    assert_rejected(
        |s| s["scaling"] = json!({"minReplicaCount": 0, "maxReplicaCount": 0}),
        "scaling.maxReplicaCount must be at least 1",
    );
    let got = messages(&"q".repeat(53), |_| {});
    assert!(got.iter().any(|m| m.contains("at most 52 characters")), "{got:?}");
    assert_eq!(messages(&"q".repeat(52), |_| {}), Vec::<String>::new());
}

#[test]
fn the_examples_are_valid_job_queues() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for file in ["jobqueue.yaml", "jobqueue-keda.yaml", "queuedatabase.yaml"] {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let mut found = 0;
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            if v["kind"] != "JobQueue" {
                continue;
            }
            found += 1;
            let jq: JobQueue = serde_json::from_value(v.clone()).unwrap();
            assert!(!jq.queue_name().is_empty());
            if let Err(errors) = Validator::new().validate(&schema(), &v, None) {
                let messages: Vec<_> = errors.iter().map(|e| e.message.clone()).collect();
                panic!("{file}: {messages:?}");
            }
        }
        assert_eq!(found, 1, "{file} holds one JobQueue");
    }
}

#[test]
fn schedules_need_five_or_six_cron_fields() {
    let ok = messages("emails", |s| {
        s["schedules"] = json!([
            {"name": "nightly", "cron": "30 2 * * *", "timeZone": "Europe/Berlin", "kind": "digest",
             "payload": {"scope": "all"}, "missedRuns": "runOnce"},
            {"name": "tick", "cron": "*/10 * * * * *", "kind": "ping"},
        ]);
    });
    assert_eq!(ok, Vec::<String>::new());
    assert_rejected(
        |s| s["schedules"] = json!([{"name": "n", "cron": "every day at 2", "kind": "k"}]),
        "schedules[].cron must have five fields",
    );
    assert_rejected(
        |s| s["schedules"] = json!([{"name": "n", "cron": "* * * *", "kind": "k"}]),
        "schedules[].cron must have five fields",
    );
}

#[test]
fn the_database_is_a_secret_or_a_queue_database_never_both_nor_neither() {
    let exactly_one = "spec.database must name exactly one of secretRef";
    let with_qdb = messages("emails", |s| {
        s["database"] = json!({"queueDatabaseRef": {"name": "shared"}})
    });
    assert_eq!(with_qdb, Vec::<String>::new());
    let enabled =
        messages(
            "emails",
            |s| {
                s["database"] = json!({"queueDatabaseRef": {"name": "shared"}, "rowLevelSecurity": "Enabled"})
            },
        );
    assert_eq!(enabled, Vec::<String>::new());
    assert_rejected(
        |s| s["database"]["queueDatabaseRef"] = json!({"name": "shared"}),
        exactly_one,
    );
    assert_rejected(|s| s["database"] = json!({}), exactly_one);
    assert_rejected(
        |s| s["database"] = json!({"rowLevelSecurity": "Disabled"}),
        exactly_one,
    );
}

#[test]
fn a_queue_database_refuses_row_level_security_disabled() {
    assert_rejected(
        |s| s["database"] = json!({"queueDatabaseRef": {"name": "shared"}, "rowLevelSecurity": "Disabled"}),
        "spec.database.rowLevelSecurity must be Enabled with queueDatabaseRef",
    );
    // With a Secret of its own, Disabled stays a choice.
    let own = messages("emails", |s| {
        s["database"]["rowLevelSecurity"] = json!("Disabled")
    });
    assert_eq!(own, Vec::<String>::new());
}

#[test]
fn the_queue_database_example_admits_the_namespaces_it_labels() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let text = std::fs::read_to_string(dir.join("queuedatabase.yaml")).unwrap();
    let qdb = serde_yaml::Deserializer::from_str(&text)
        .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap())
        .find(|v| v["kind"] == "QueueDatabase")
        .unwrap();
    let qdb: sluice_crds::queue_database::QueueDatabase = serde_json::from_value(qdb).unwrap();
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    assert_eq!(
        qdb.spec
            .admits(&labels(&[("sluice.dev/queue-database", "shared")])),
        Ok(true)
    );
    assert_eq!(
        qdb.spec
            .admits(&labels(&[("kubernetes.io/metadata.name", "shop")])),
        Ok(false)
    );
}
