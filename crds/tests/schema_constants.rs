//! The CRDs' CEL rules and bounds are literals in attributes (CEL cannot read a Rust constant); these
//! tests pin each literal to the constant code and docs use, so the two cannot drift apart.

use kube::CustomResourceExt;
use serde_json::Value;
use sluice_crds::{
    Duration, job_queue,
    rate_limit_policy::{self, RateLimitPolicy},
    sidecar_config::validate::{WINDOW_MAX, WINDOW_MIN},
};

fn schema<K: CustomResourceExt>() -> Value {
    serde_json::to_value(K::crd()).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Every `x-kubernetes-validations` rule anywhere in `schema`.
fn rules(schema: &Value) -> Vec<String> {
    let mut out = vec![];
    let mut stack = vec![schema];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(m) => {
                if let Some(Value::Array(list)) = m.get("x-kubernetes-validations") {
                    out.extend(list.iter().filter_map(|r| r["rule"].as_str().map(str::to_owned)));
                }
                stack.extend(m.values());
            }
            Value::Array(a) => stack.extend(a),
            _ => {}
        }
    }
    out
}

fn has_rule(schema: &Value, rule: &str) -> bool {
    rules(schema).iter().any(|r| r == rule)
}

#[test]
fn rate_limit_policy_rules_use_the_documented_bounds() {
    let s = schema::<RateLimitPolicy>();
    assert!(has_rule(
        &s,
        &format!("self.metadata.name.size() <= {}", rate_limit_policy::NAME_MAX_LEN)
    ));
    assert!(has_rule(
        &s,
        &format!(
            "self.algorithm != 'slidingLog' || self.limit.requests <= {}",
            rate_limit_policy::SLIDING_LOG_REQUESTS_MAX
        )
    ));
    assert_eq!(
        s["properties"]["spec"]["properties"]["rules"]["maxItems"],
        rate_limit_policy::RULES_MAX
    );
    let window = |rule: &str| -> Duration {
        let literal = rule.split('\'').nth(1).unwrap();
        literal.parse().unwrap()
    };
    let all = rules(&s);
    let min = all
        .iter()
        .find(|r| r.starts_with("duration(self) >= duration('1s')"))
        .unwrap();
    let max = all
        .iter()
        .find(|r| r.starts_with("duration(self) <= duration('24h')"))
        .unwrap();
    assert_eq!((window(min), window(max)), (WINDOW_MIN, WINDOW_MAX));
}

#[test]
fn job_queue_rules_use_the_documented_bounds() {
    let s = schema::<job_queue::JobQueue>();
    assert!(has_rule(
        &s,
        &format!("self.metadata.name.size() <= {}", job_queue::NAME_MAX_LEN)
    ));
}
