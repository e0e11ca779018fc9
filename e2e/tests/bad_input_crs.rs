//! Invalid RateLimitPolicy and JobQueue objects (the table in `bad_input/crs.rs`) on the test API
//! server with Sluice's CRDs installed: each create is refused (422 Invalid) with a cause naming the field,
//! and nothing is stored; each, as an update of a stored valid object, is refused and leaves that object
//! as it was.

#[path = "bad_input/crs.rs"]
mod table;

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
};

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};
use sluice_e2e::Env;
use table::{CASES, Kind};

fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds")
}

fn api(env: &Env, ns: &str, kind: Kind) -> Api<DynamicObject> {
    let (name, plural) = match kind {
        Kind::RateLimitPolicy => ("RateLimitPolicy", "ratelimitpolicies"),
        Kind::JobQueue => ("JobQueue", "jobqueues"),
    };
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("sluice.dev", "v1alpha1", name), plural);
    Api::namespaced_with(env.client(), ns, &ar)
}

fn valid_spec(kind: Kind) -> Value {
    match kind {
        Kind::RateLimitPolicy => json!({
            "redis": {"secretRef": {"name": "redis"}},
            "rules": [{"name": "all", "limit": {"requests": 100, "window": "1m"}}],
        }),
        Kind::JobQueue => json!({
            "database": {"secretRef": {"name": "db"}},
            "worker": {"template": {"spec": {"containers": [{"name": "handler", "image": "h:1"}]}}},
        }),
    }
}

/// JSON merge patch (RFC 7386): `patch` over `target`, `null` removing a key.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

fn object(kind: Kind, name: &str, spec: Value) -> DynamicObject {
    let kind = match kind {
        Kind::RateLimitPolicy => "RateLimitPolicy",
        Kind::JobQueue => "JobQueue",
    };
    serde_json::from_value(
        json!({"apiVersion": "sluice.dev/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

/// The causes of a 422 Invalid, as `field: message`; an error naming what else came back.
fn causes(result: Result<DynamicObject, kube::Error>) -> Result<Vec<String>, String> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 422 && s.reason == "Invalid" => Ok(s
            .details
            .map(|d| {
                d.causes
                    .into_iter()
                    .map(|c| format!("{}: {}", c.field, c.message))
                    .collect()
            })
            .unwrap_or_default()),
        Err(e) => Err(format!("not a 422 Invalid: {e}")),
        Ok(_) => Err("accepted".into()),
    }
}

#[test]
fn every_bad_object_in_the_table_is_distinct() {
    let mut seen = HashSet::new();
    for case in CASES {
        assert!(
            seen.insert((case.kind, case.name, case.spec)),
            "listed twice: {:?} {}",
            case.kind,
            case.spec
        );
    }
}

#[tokio::test]
async fn each_bad_object_is_refused_naming_the_field_and_nothing_is_stored_or_changed() {
    let env = Env::start().await.unwrap();
    let ns = env.namespace("bad-input").await.unwrap();
    for file in ["ratelimitpolicies.sluice.dev.yaml", "jobqueues.sluice.dev.yaml"] {
        let yaml = std::fs::read_to_string(crds_dir().join(file)).unwrap();
        env.apply_yaml(&yaml, None).await.unwrap();
    }
    // One valid object of each kind, which every case then tries to update.
    for kind in [Kind::RateLimitPolicy, Kind::JobQueue] {
        api(&env, ns.name(), kind)
            .create(
                &PostParams::default(),
                &object(kind, "existing", valid_spec(kind)),
            )
            .await
            .unwrap();
    }

    let mut wrong = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let api = api(&env, ns.name(), case.kind);
        let mut spec = valid_spec(case.kind);
        let patch: Value = serde_yaml::from_str(case.spec).unwrap();
        merge(&mut spec, &patch);
        let name = case.name.map_or_else(|| format!("bad-{i}"), str::to_owned);
        let names_the_field = |got: &[String]| {
            got.iter()
                .any(|c| c.starts_with(&format!("{}:", case.field)) && c.contains(case.says))
        };

        match causes(
            api.create(&PostParams::default(), &object(case.kind, &name, spec.clone()))
                .await,
        ) {
            Ok(got) if names_the_field(&got) => {}
            Ok(got) => wrong.push(format!(
                "create {:?} {}: expected {}: …{}…, got {got:#?}",
                case.kind, case.spec, case.field, case.says
            )),
            Err(e) => wrong.push(format!("create {:?} {}: {e}", case.kind, case.spec)),
        }
        if api.get_opt(&name).await.unwrap().is_some() {
            wrong.push(format!("{:?} {}: stored although refused", case.kind, case.spec));
        }

        // The same spec as an update of the stored object (the name cases are about the name).
        if case.name.is_none() {
            let before = api.get("existing").await.unwrap();
            let mut update = object(case.kind, "existing", spec);
            update.metadata.resource_version = before.metadata.resource_version.clone();
            match causes(api.replace("existing", &PostParams::default(), &update).await) {
                Ok(got) if names_the_field(&got) => {}
                Ok(got) => wrong.push(format!(
                    "update {:?} {}: expected {}: …{}…, got {got:#?}",
                    case.kind, case.spec, case.field, case.says
                )),
                Err(e) => wrong.push(format!("update {:?} {}: {e}", case.kind, case.spec)),
            }
            let now = api.get("existing").await.unwrap();
            if now.metadata.resource_version != before.metadata.resource_version || now.data != before.data {
                wrong.push(format!(
                    "update {:?} {}: changed the stored object",
                    case.kind, case.spec
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} problems in {} cases:\n{}",
        wrong.len(),
        CASES.len(),
        wrong.join("\n")
    );
}
