//! Rendering a `RateLimitPolicy` into the sidecar's config file ([`SidecarConfig`]).
//!
//! The CRD's field names match the config's, so this is mostly a copy. Two things are added here:
//! the policy's identity and generation (which the sidecar reports back as enforced, and which names
//! its Redis keys), and the admin port the injected readiness probe expects. Connection settings
//! (listen address, upstream, Redis URL) are left out: they come from the pod's environment, so the
//! Redis credentials stay in their Secret.

use std::net::{Ipv4Addr, SocketAddr};

use ipnet::IpNet;
use kube::ResourceExt;
use sluice_crds::{
    rate_limit_policy::{KeyPartSpec, RateLimitPolicy, RateLimitRule},
    sidecar_config::{
        ClientIpConfig, ClientTimeouts, HeadersConfig, KeyPart, Limit, LimitsConfig, PolicyRef, RedisConfig,
        Rule, RuleMatch, SidecarConfig,
    },
};

use sluice_crds::contract::port::ADMIN as SIDECAR_ADMIN_PORT;

/// Name of the ConfigMap holding a policy's rendered config. Deterministic, so the webhook can mount
/// it before the controller has written it (the pod then waits for it).
pub fn config_map_name(policy: &str) -> String {
    format!("sluice-policy-{policy}")
}

/// Why a policy cannot be rendered although the CRD accepted it. The message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    /// A `pathRegex` the sidecar's regex engine rejects.
    #[error("spec.rules[{index}].match.pathRegex is not a valid regular expression: {reason}")]
    InvalidRegex {
        /// Index of the rule.
        index: usize,
        /// The regex engine's explanation.
        reason: String,
    },
    /// A CIDR that does not parse (the CRD checks these too; this guards older API servers without
    /// the CEL IP library).
    #[error("{field} is not a CIDR: {value:?}")]
    InvalidCidr {
        /// Path of the field.
        field: String,
        /// The value.
        value: String,
    },
    /// The sidecar's own validation refused the rendered config (a field the CRD cannot check).
    #[error("the sidecar would refuse the rendered config: {0}")]
    SidecarRejects(String),
    /// The policy has no namespace (it is namespaced, so only a malformed object lacks one).
    #[error("the policy has no namespace")]
    NoNamespace,
}

/// Render `policy` into the sidecar config at the policy's current generation.
pub fn render(policy: &RateLimitPolicy) -> Result<SidecarConfig, RenderError> {
    let spec = &policy.spec;
    let rules = spec
        .rules
        .iter()
        .enumerate()
        .map(|(index, rule)| render_rule(index, rule))
        .collect::<Result<Vec<_>, _>>()?;
    let limits = LimitsConfig {
        admin_listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, SIDECAR_ADMIN_PORT)),
        redis: RedisConfig {
            url: None,
            timeout: spec.redis.timeout,
            prefetch: spec.redis.prefetch,
            ..RedisConfig::default()
        },
        failure_mode: spec.failure_mode,
        expected_replicas: spec.expected_replicas,
        client_ip: ClientIpConfig {
            trusted_proxies: cidrs("spec.clientIp.trustedProxies", &spec.client_ip.trusted_proxies)?,
        },
        allow_list: cidrs("spec.allowList", &spec.allow_list)?,
        headers: HeadersConfig {
            legacy: spec.headers.legacy,
            draft: spec.headers.draft,
        },
        client_timeouts: ClientTimeouts {
            idle: spec.client_timeouts.idle,
            request_head: spec.client_timeouts.request_head,
            body: spec.client_timeouts.body,
            send: spec.client_timeouts.send,
        },
        max_connections: spec.max_connections,
        rules,
        ..LimitsConfig::default()
    };
    let config = SidecarConfig {
        policy: Some(PolicyRef {
            namespace: policy.namespace().ok_or(RenderError::NoNamespace)?,
            name: policy.name_any(),
            generation: policy.metadata.generation.unwrap_or_default(),
        }),
        limits,
        ..SidecarConfig::default()
    };
    // The sidecar validates every config it loads; checking here turns a config that every pod would
    // refuse into a status condition on the policy instead.
    sluice_crds::sidecar_config::validate(&config).map_err(|e| RenderError::SidecarRejects(e.to_string()))?;
    Ok(config)
}

/// Render `policy` into the YAML file the sidecar reads.
pub fn render_yaml(policy: &RateLimitPolicy) -> Result<String, RenderError> {
    let config = render(policy)?;
    // Serialising plain data structs cannot fail.
    let body = serde_yaml::to_string(&config).expect("sidecar config serialises");
    Ok(format!(
        "# Rendered by sluice-operator from RateLimitPolicy {}/{} generation {}. Do not edit: the operator\n\
         # overwrites this file; edit the policy instead.\n{body}",
        config
            .policy
            .as_ref()
            .map(|p| p.namespace.as_str())
            .unwrap_or_default(),
        policy.name_any(),
        policy.metadata.generation.unwrap_or_default(),
    ))
}

fn render_rule(index: usize, rule: &RateLimitRule) -> Result<Rule, RenderError> {
    let m = &rule.matches;
    if let Some(re) = &m.path_regex {
        regex::Regex::new(re).map_err(|e| RenderError::InvalidRegex {
            index,
            reason: e.to_string(),
        })?;
    }
    Ok(Rule {
        name: rule.name.clone(),
        matches: RuleMatch {
            path_prefix: m.path_prefix.clone(),
            path_exact: m.path_exact.clone(),
            path_regex: m.path_regex.clone(),
            exclude_path_prefixes: m.exclude_path_prefixes.clone(),
            methods: m.methods.iter().map(|x| x.as_str().to_owned()).collect(),
            host: m.host.clone(),
            header_present: m.header_present.clone(),
        },
        key: rule.key.iter().map(render_key_part).collect(),
        algorithm: rule.algorithm,
        limit: Limit {
            requests: rule.limit.requests,
            window: rule.limit.window,
            burst: rule.limit.burst,
        },
        shadow: rule.shadow,
        client_ip_ceiling: rule.client_ip_ceiling,
    })
}

fn render_key_part(k: &KeyPartSpec) -> KeyPart {
    KeyPart {
        source: k.source,
        name: k.name.clone(),
        ipv4_prefix: k.ipv4_prefix,
        ipv6_prefix: k.ipv6_prefix,
    }
}

fn cidrs(field: &str, values: &[String]) -> Result<Vec<IpNet>, RenderError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.parse().map_err(|_| RenderError::InvalidCidr {
                field: format!("{field}[{i}]"),
                value: v.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use sluice_crds::sidecar_config::{Algorithm, FailureMode, KeySource};

    use super::*;

    fn policy(spec: serde_json::Value) -> RateLimitPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "RateLimitPolicy",
            "metadata": {"name": "api", "namespace": "shop", "generation": 7},
            "spec": spec,
        }))
        .unwrap()
    }

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "redis": {"secretRef": {"name": "redis"}},
            "rules": [{"name": "all", "limit": {"requests": 100, "window": "1m"}}],
        })
    }

    #[test]
    fn minimal_policy_renders_with_defaults_identity_and_admin_port() {
        let config = render(&policy(minimal())).unwrap();
        assert_eq!(
            config.policy,
            Some(PolicyRef {
                namespace: "shop".into(),
                name: "api".into(),
                generation: 7
            })
        );
        assert_eq!(config.limits.admin_listen.port(), SIDECAR_ADMIN_PORT);
        assert_eq!(config.limits.failure_mode, FailureMode::Local);
        assert_eq!(config.limits.expected_replicas, 1);
        assert_eq!(
            config.limits.max_connections, None,
            "derived from the memory limit by the sidecar"
        );
        assert_eq!(config.limits.client_timeouts, ClientTimeouts::default());
        assert_eq!(config.limits.redis.url, None, "the Redis URL stays in its Secret");
        let rule = &config.limits.rules[0];
        assert_eq!(rule.algorithm, Algorithm::FixedWindow);
        assert_eq!(rule.limit.requests, 100);
        assert_eq!(rule.limit.window.as_millis(), 60_000);
        assert!(rule.key.is_empty());
    }

    #[test]
    fn every_field_is_copied_to_its_namesake() {
        let config = render(&policy(serde_json::json!({
            "redis": {"secretRef": {"name": "redis", "key": "uri"}, "timeout": "20ms", "prefetch": 0},
            "failureMode": "closed",
            "expectedReplicas": 3,
            "clientIp": {"trustedProxies": ["10.0.0.0/8", "fd00::/8"]},
            "allowList": ["192.168.1.0/24"],
            "headers": {"legacy": false, "draft": true},
            "maxConnections": 500,
            "clientTimeouts": {"idle": "2m", "requestHead": "5s", "body": "10s", "send": "20s"},
            "rules": [{
                "name": "login",
                "match": {"pathExact": "/login", "methods": ["POST"], "host": "shop.example.com",
                          "headerPresent": "Authorization", "excludePathPrefixes": ["/login/health"]},
                "key": [{"type": "clientIp", "ipv4Prefix": 24, "ipv6Prefix": 56},
                        {"type": "hashedHeader", "name": "Authorization"}],
                "algorithm": "tokenBucket",
                "limit": {"requests": 10, "window": "1m", "burst": 5},
                "shadow": true
            }]
        })))
        .unwrap();
        let l = &config.limits;
        assert_eq!(l.redis.timeout.as_millis(), 20);
        assert_eq!(l.redis.prefetch, 0);
        assert_eq!(l.failure_mode, FailureMode::Closed);
        assert_eq!(l.expected_replicas, 3);
        assert_eq!(l.client_ip.trusted_proxies.len(), 2);
        assert_eq!(l.allow_list, vec!["192.168.1.0/24".parse::<IpNet>().unwrap()]);
        assert!(!l.headers.legacy && l.headers.draft);
        assert_eq!(l.max_connections, Some(500));
        let t = &l.client_timeouts;
        assert_eq!(
            [t.idle, t.request_head, t.body, t.send].map(|d| d.as_millis()),
            [120_000, 5_000, 10_000, 20_000]
        );
        let r = &l.rules[0];
        assert_eq!(r.matches.path_exact.as_deref(), Some("/login"));
        assert_eq!(r.matches.methods, vec!["POST".to_string()]);
        assert_eq!(r.matches.host.as_deref(), Some("shop.example.com"));
        assert_eq!(r.matches.header_present.as_deref(), Some("Authorization"));
        assert_eq!(r.matches.exclude_path_prefixes, vec!["/login/health".to_string()]);
        assert_eq!(r.key[0].source, KeySource::ClientIp);
        assert_eq!((r.key[0].ipv4_prefix, r.key[0].ipv6_prefix), (24, 56));
        assert_eq!(r.key[1].source, KeySource::HashedHeader);
        assert_eq!(r.key[1].name.as_deref(), Some("Authorization"));
        assert_eq!(r.algorithm, Algorithm::TokenBucket);
        assert_eq!(r.limit.burst, Some(5));
        assert!(r.shadow);
    }

    #[test]
    fn rendered_yaml_reads_back_as_the_same_config() {
        let p = policy(minimal());
        let yaml = render_yaml(&p).unwrap();
        assert!(yaml.starts_with("# Rendered by sluice-operator from RateLimitPolicy shop/api generation 7"));
        let back: SidecarConfig = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(back, render(&p).unwrap());
    }

    #[test]
    fn regex_the_sidecar_cannot_compile_is_reported_with_its_field() {
        let mut spec = minimal();
        spec["rules"][0]["match"] = serde_json::json!({"pathRegex": "^/(a|b"});
        let err = render(&policy(spec)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("spec.rules[0].match.pathRegex is not a valid regular expression"),
            "{err}"
        );
    }

    #[test]
    fn look_around_regex_is_rejected_because_the_sidecar_engine_lacks_it() {
        let mut spec = minimal();
        spec["rules"][0]["match"] = serde_json::json!({"pathRegex": "^/(?!health)"});
        assert!(matches!(
            render(&policy(spec)),
            Err(RenderError::InvalidRegex { index: 0, .. })
        ));
    }

    #[test]
    fn cidr_that_does_not_parse_names_its_field() {
        let mut spec = minimal();
        spec["allowList"] = serde_json::json!(["10.0.0.0/8", "nonsense"]);
        let err = render(&policy(spec)).unwrap_err();
        assert_eq!(err.to_string(), r#"spec.allowList[1] is not a CIDR: "nonsense""#);
    }

    #[test]
    fn config_map_name_is_derived_from_the_policy_name() {
        assert_eq!(config_map_name("api"), "sluice-policy-api");
    }
}
