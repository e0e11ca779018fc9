//! The CEL rules (`x-kubernetes-validations`) of the `RateLimitPolicy` CRD, evaluated the way the API
//! server does (kube-cel, schema defaults applied first): valid policies pass, and each invalid one
//! fails with the message a user reads.

use kube::{CustomResourceExt, core::cel::Validator};
use serde_json::{Value, json};
use sluice_crds::rate_limit_policy::RateLimitPolicy;

fn schema() -> Value {
    let crd = RateLimitPolicy::crd();
    serde_json::to_value(
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .unwrap(),
    )
    .unwrap()
}

fn object(name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "RateLimitPolicy",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    })
}

fn base() -> Value {
    json!({
        "redis": {"secretRef": {"name": "redis"}},
        "rules": [{"name": "all", "limit": {"requests": 100, "window": "1m"}}],
    })
}

/// `base()` with `edit` applied.
fn spec_with(edit: impl FnOnce(&mut Value)) -> Value {
    let mut s = base();
    edit(&mut s);
    s
}

fn messages(name: &str, spec: Value) -> Vec<String> {
    match Validator::new().validate(&schema(), &object(name, spec), None) {
        Ok(()) => vec![],
        Err(errors) => errors.iter().map(|e| e.message.clone()).collect(),
    }
}

#[test]
fn valid_policies_pass_every_rule() {
    let valid = [
        base(),
        json!({
            "selector": {"matchLabels": {"app": "shop"}},
            "redis": {"secretRef": {"name": "redis", "key": "uri"}, "timeout": "20ms"},
            "failureMode": "open",
            "expectedReplicas": 3,
            "clientIp": {"trustedProxies": ["10.0.0.0/8", "fd00::/8", "192.168.1.7/32"]},
            "allowList": ["172.16.0.0/12"],
            "headers": {"legacy": false},
            "rules": [
                {"name": "login", "match": {"pathExact": "/login", "methods": ["POST"]},
                 "key": [{"type": "clientIp", "ipv4Prefix": 24, "ipv6Prefix": 56}],
                 "algorithm": "tokenBucket", "limit": {"requests": 10, "window": "1m", "burst": 5}},
                {"name": "api", "match": {"pathRegex": "^/api/v[0-9]+/"},
                 "key": [{"type": "hashedHeader", "name": "Authorization"}, {"type": "method"}],
                 "algorithm": "slidingCounter", "limit": {"requests": 100000, "window": "1h30m"}},
                {"name": "search", "match": {"pathPrefix": "/search", "host": "shop.example.com",
                                              "headerPresent": "X-Api-Key"},
                 "key": [{"type": "credential"}],
                 "algorithm": "slidingLog", "limit": {"requests": 10000, "window": "1s"}, "shadow": true}
            ]
        }),
        spec_with(|s| s["rules"][0]["limit"]["window"] = json!("24h")),
        // The largest limits the limiter counts exactly: requests × window in ms just below 2^53.
        spec_with(|s| s["rules"][0]["limit"] = json!({"requests": 104_249_991, "window": "24h"})),
        spec_with(|s| {
            s["rules"][0]["algorithm"] = json!("tokenBucket");
            s["rules"][0]["limit"] = json!({"requests": 1, "window": "24h", "burst": 104_249_990});
        }),
        // A large credential limit passes with its ceiling off, or keyed by client IP (no ceiling).
        spec_with(|s| {
            s["rules"][0]["key"] = json!([{"type": "credential"}]);
            s["rules"][0]["limit"] = json!({"requests": 100_000_000, "window": "24h"});
            s["rules"][0]["clientIpCeiling"] = json!(0);
        }),
        spec_with(|s| {
            s["rules"][0]["key"] = json!([{"type": "clientIp"}]);
            s["rules"][0]["limit"] = json!({"requests": 100_000_000, "window": "24h"});
        }),
        spec_with(|s| {
            s["maxConnections"] = json!(1);
            s["clientTimeouts"] = json!({"idle": "24h", "requestHead": "1ms", "body": "90s", "send": "1h"});
        }),
        spec_with(|s| s["redis"]["timeout"] = json!("5s")),
        spec_with(|s| s["redis"]["timeout"] = json!("1ms")),
        spec_with(|s| s["rules"][0]["key"] = json!([{"type": "credential", "name": "X-Token"}])),
        spec_with(|s| {
            s["rules"][0]["key"] = json!([{"type": "credential"}]);
            s["rules"][0]["clientIpCeiling"] = json!(3);
        }),
        spec_with(|s| s["rules"][0]["clientIpCeiling"] = json!(0)),
    ];
    for spec in valid {
        assert_eq!(messages("api", spec.clone()), Vec::<String>::new(), "{spec}");
    }
}

#[test]
fn a_63_character_name_is_allowed() {
    assert!(messages(&"a".repeat(63), base()).is_empty());
}

#[test]
fn invalid_policies_fail_with_a_message_naming_the_fix() {
    let name_msg = "RateLimitPolicy names are at most 63 characters: governed pods carry the name in the sluice.dev/policy label";
    let unique = "rule names must be unique within a policy: each name keeps its own counters in Redis";
    let burst = "limit.burst is only allowed with algorithm tokenBucket; the window algorithms have no burst";
    let log = "slidingLog keeps one Redis entry per request, so it allows at most 10000 requests per window; use slidingCounter for larger limits";
    let needs_name =
        "key parts of type header and hashedHeader need name: the header whose value identifies the client";
    let name_unused = "name is only used by key parts of type header, hashedHeader and credential";
    let one_path = "match may name at most one of pathPrefix, pathExact and pathRegex";
    let min_window = "limit.window must be at least 1s";
    let max_window = "limit.window must be at most 24h";
    let timeout = "redis.timeout must be between 1ms and 5s: every limited request may wait this long";
    let allow = "allowList entries must be CIDRs such as 10.0.0.0/8 or fd00::/8 (a single address is written 10.1.2.3/32)";
    let proxies = "clientIp.trustedProxies entries must be CIDRs such as 10.0.0.0/8 or fd00::/8 (a single address is written 10.1.2.3/32)";
    let exact = "limit.requests (or limit.burst + 1) × limit.window in milliseconds must stay below 2^53, the largest count the limiter holds exactly; lower limit.requests or limit.window";
    let ceiling = "the ceiling per client IP, clientIpCeiling (default 10) × limit.requests (or × limit.burst, + 1), × limit.window in milliseconds must stay below 2^53, the largest count the limiter holds exactly; lower clientIpCeiling (0 turns it off), limit.requests or limit.window";
    let rule = |name: &str| json!({"name": name, "limit": {"requests": 1, "window": "1s"}});

    let cases: Vec<(&str, String, Value, &str)> = vec![
        (
            "a billion requests per 24h: more than the limiter counts exactly",
            "api".into(),
            spec_with(|s| s["rules"][0]["limit"] = json!({"requests": 1_000_000_000, "window": "24h"})),
            exact,
        ),
        (
            "one request past the largest exact limit for 24h",
            "api".into(),
            spec_with(|s| s["rules"][0]["limit"] = json!({"requests": 104_249_992, "window": "24h"})),
            exact,
        ),
        (
            "a token bucket whose burst overflows",
            "api".into(),
            spec_with(|s| {
                s["rules"][0]["algorithm"] = json!("tokenBucket");
                s["rules"][0]["limit"] = json!({"requests": 1, "window": "24h", "burst": 104_249_991});
            }),
            exact,
        ),
        (
            "a credential rule whose default ceiling per client IP overflows",
            "api".into(),
            spec_with(|s| {
                s["rules"][0]["key"] = json!([{"type": "credential"}]);
                s["rules"][0]["limit"] = json!({"requests": 100_000_000, "window": "24h"});
            }),
            ceiling,
        ),
        (
            "a header rule whose explicit ceiling overflows",
            "api".into(),
            spec_with(|s| {
                s["rules"][0]["key"] = json!([{"type": "header", "name": "X-Tenant"}]);
                s["rules"][0]["limit"] = json!({"requests": 10_000_000, "window": "1h"});
                s["rules"][0]["clientIpCeiling"] = json!(1000);
            }),
            ceiling,
        ),
        ("name longer than 63 characters", "a".repeat(64), base(), name_msg),
        (
            "two rules with one name",
            "api".into(),
            spec_with(|s| s["rules"] = json!([rule("a"), rule("a")])),
            unique,
        ),
        (
            "a repeated name among three rules",
            "api".into(),
            spec_with(|s| s["rules"] = json!([rule("a"), rule("b"), rule("b")])),
            unique,
        ),
        (
            "burst with the default fixedWindow",
            "api".into(),
            spec_with(|s| s["rules"][0]["limit"]["burst"] = json!(5)),
            burst,
        ),
        (
            "burst with slidingCounter",
            "api".into(),
            spec_with(|s| {
                s["rules"][0]["algorithm"] = json!("slidingCounter");
                s["rules"][0]["limit"]["burst"] = json!(5);
            }),
            burst,
        ),
        (
            "burst with slidingLog",
            "api".into(),
            spec_with(|s| {
                s["rules"][0]["algorithm"] = json!("slidingLog");
                s["rules"][0]["limit"]["burst"] = json!(0);
            }),
            burst,
        ),
        (
            "slidingLog above 10000 requests",
            "api".into(),
            spec_with(|s| {
                s["rules"][0]["algorithm"] = json!("slidingLog");
                s["rules"][0]["limit"]["requests"] = json!(10001);
            }),
            log,
        ),
        (
            "a ceiling per client IP on a rule keyed by the client IP",
            "api".into(),
            spec_with(|s| s["rules"][0]["clientIpCeiling"] = json!(5)),
            "clientIpCeiling is for rules keyed by credential, header or hashedHeader (values the client picks); a rule keyed by clientIp is limited per client IP already",
        ),
        (
            "header key without a name",
            "api".into(),
            spec_with(|s| s["rules"][0]["key"] = json!([{"type": "header"}])),
            needs_name,
        ),
        (
            "hashedHeader key without a name",
            "api".into(),
            spec_with(|s| s["rules"][0]["key"] = json!([{"type": "clientIp"}, {"type": "hashedHeader"}])),
            needs_name,
        ),
        (
            "clientIp key with a name",
            "api".into(),
            spec_with(|s| s["rules"][0]["key"] = json!([{"type": "clientIp", "name": "X-Real-Ip"}])),
            name_unused,
        ),
        (
            "method key with a name",
            "api".into(),
            spec_with(|s| s["rules"][0]["key"] = json!([{"type": "method", "name": "X-Method"}])),
            name_unused,
        ),
        (
            "path key with a name",
            "api".into(),
            spec_with(|s| s["rules"][0]["key"] = json!([{"type": "path", "name": "X-Path"}])),
            name_unused,
        ),
        (
            "pathPrefix and pathExact together",
            "api".into(),
            spec_with(|s| s["rules"][0]["match"] = json!({"pathPrefix": "/a", "pathExact": "/a"})),
            one_path,
        ),
        (
            "pathPrefix and pathRegex together",
            "api".into(),
            spec_with(|s| s["rules"][0]["match"] = json!({"pathPrefix": "/a", "pathRegex": "^/a"})),
            one_path,
        ),
        (
            "pathExact and pathRegex together",
            "api".into(),
            spec_with(|s| s["rules"][0]["match"] = json!({"pathExact": "/a", "pathRegex": "^/a$"})),
            one_path,
        ),
        (
            "window of 500ms",
            "api".into(),
            spec_with(|s| s["rules"][0]["limit"]["window"] = json!("500ms")),
            min_window,
        ),
        (
            "window of 0s",
            "api".into(),
            spec_with(|s| s["rules"][0]["limit"]["window"] = json!("0s")),
            min_window,
        ),
        (
            "window of 25h",
            "api".into(),
            spec_with(|s| s["rules"][0]["limit"]["window"] = json!("25h")),
            max_window,
        ),
        (
            "window of 24h1s",
            "api".into(),
            spec_with(|s| s["rules"][0]["limit"]["window"] = json!("24h1s")),
            max_window,
        ),
        (
            "client idle timeout of 0s",
            "api".into(),
            spec_with(|s| s["clientTimeouts"] = json!({"idle": "0s"})),
            "clientTimeouts.idle must be between 1ms and 24h",
        ),
        (
            "client head timeout of 25h",
            "api".into(),
            spec_with(|s| s["clientTimeouts"] = json!({"requestHead": "25h"})),
            "clientTimeouts.requestHead must be between 1ms and 24h",
        ),
        (
            "client body timeout of 0ms",
            "api".into(),
            spec_with(|s| s["clientTimeouts"] = json!({"body": "0ms"})),
            "clientTimeouts.body must be between 1ms and 24h",
        ),
        (
            "client send timeout of 48h",
            "api".into(),
            spec_with(|s| s["clientTimeouts"] = json!({"send": "48h"})),
            "clientTimeouts.send must be between 1ms and 24h",
        ),
        (
            "Redis timeout of 0ms",
            "api".into(),
            spec_with(|s| s["redis"]["timeout"] = json!("0ms")),
            timeout,
        ),
        (
            "Redis timeout of 10s",
            "api".into(),
            spec_with(|s| s["redis"]["timeout"] = json!("10s")),
            timeout,
        ),
        (
            "allowList entry that is a word",
            "api".into(),
            spec_with(|s| s["allowList"] = json!(["10.0.0.0/8", "office"])),
            allow,
        ),
        (
            "allowList entry with a prefix beyond 32 bits",
            "api".into(),
            spec_with(|s| s["allowList"] = json!(["10.0.0.0/33"])),
            allow,
        ),
        (
            "trustedProxies entry without a prefix length",
            "api".into(),
            spec_with(|s| s["clientIp"] = json!({"trustedProxies": ["10.0.0.1"]})),
            proxies,
        ),
        (
            "trustedProxies entry that is a host name",
            "api".into(),
            spec_with(|s| s["clientIp"] = json!({"trustedProxies": ["lb.example.com/32"]})),
            proxies,
        ),
        (
            "trustedProxies IPv6 entry with a prefix beyond 128 bits",
            "api".into(),
            spec_with(|s| s["clientIp"] = json!({"trustedProxies": ["fd00::/129"]})),
            proxies,
        ),
    ];
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for (what, name, spec, expected) in cases {
        let got = messages(&name, spec);
        if got != [expected.to_string()] {
            failures.push(format!("{what}: expected [{expected:?}], got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_example_policies_are_valid() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.starts_with("ratelimitpolicy") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v: Value = serde::Deserialize::deserialize(doc).unwrap();
            if v["kind"] != "RateLimitPolicy" {
                continue;
            }
            let policy: RateLimitPolicy = serde_json::from_value(v.clone()).unwrap();
            assert!(
                Validator::new().validate(&schema(), &v, None).is_ok(),
                "{name}: {:?}",
                Validator::new().validate(&schema(), &v, None)
            );
            sluice_operator::render::sidecar_config::render(&RateLimitPolicy {
                metadata: kube::api::ObjectMeta {
                    namespace: Some("shop".into()),
                    ..policy.metadata.clone()
                },
                ..policy
            })
            .unwrap();
            checked += 1;
        }
    }
    assert!(checked >= 1);
}
