//! Rules compiled for the hot path: which requests a rule applies to, its key and its limit.

use std::sync::Arc;

use http::HeaderName;
use regex::Regex;
use ring::hmac;
use sluice_crds::sidecar_config::{Algorithm as AlgorithmKind, PolicyRef, Rule, RuleMatch};

use super::{
    RequestFacts,
    algorithm::Params,
    key::{CEILING_SUFFIX, KeySpec},
    metrics::RuleCounters,
};
use crate::{Error, Result};

/// Largest `requests × window(ms)` (and `(burst + 1) × window`) the scripts compute exactly: Lua numbers are
/// doubles.
pub const EXACT_LIMIT: u128 = 1 << 53;

/// The conditions of a rule, compiled.
#[derive(Debug, Clone, Default)]
pub struct Matcher {
    path_prefix: Option<String>,
    path_exact: Option<String>,
    path_regex: Option<Regex>,
    exclude_path_prefixes: Vec<String>,
    methods: Vec<http::Method>,
    host: Option<String>,
    header_present: Option<HeaderName>,
}

impl Matcher {
    /// Compiles `m` (at `field`, e.g. `limits.rules[2].match`).
    pub fn compile(m: &RuleMatch, field: &str) -> Result<Self> {
        let path_regex = m
            .path_regex
            .as_deref()
            .map(|r| Regex::new(r).map_err(|e| Error::Config(format!("{field}.pathRegex: {e}"))))
            .transpose()?;
        let methods = m
            .methods
            .iter()
            .enumerate()
            .map(|(i, s)| {
                http::Method::from_bytes(s.to_ascii_uppercase().as_bytes())
                    .map_err(|_| Error::Config(format!("{field}.methods[{i}]: {s:?} is not a method")))
            })
            .collect::<Result<_>>()?;
        let header_present = m
            .header_present
            .as_deref()
            .map(|h| {
                HeaderName::try_from(h)
                    .map_err(|_| Error::Config(format!("{field}.headerPresent: {h:?} is not a header name")))
            })
            .transpose()?;
        Ok(Self {
            path_prefix: m.path_prefix.clone(),
            path_exact: m.path_exact.clone(),
            path_regex,
            exclude_path_prefixes: m.exclude_path_prefixes.clone(),
            methods,
            // As the proxy hands hosts over: lower case, without a trailing dot.
            host: m
                .host
                .as_ref()
                .map(|h| h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase()),
            header_present,
        })
    }

    /// Whether every given condition holds for `req`.
    pub fn matches(&self, req: &RequestFacts<'_>) -> bool {
        self.path_prefix
            .as_ref()
            .is_none_or(|p| req.path.starts_with(p.as_str()))
            && self.path_exact.as_ref().is_none_or(|p| req.path == p)
            && !self
                .exclude_path_prefixes
                .iter()
                .any(|p| req.path.starts_with(p.as_str()))
            && (self.methods.is_empty() || self.methods.contains(req.method))
            && self
                .host
                .as_ref()
                .is_none_or(|h| req.host.is_some_and(|rh| host_only(rh).eq_ignore_ascii_case(h)))
            && self
                .header_present
                .as_ref()
                .is_none_or(|h| req.headers.first(h).is_some())
            && self.path_regex.as_ref().is_none_or(|r| r.is_match(req.path))
    }
}

/// A Host value without its port (`example.com:8080` → `example.com`, `[::1]:80` → `[::1]`).
fn host_only(h: &str) -> &str {
    match h.rfind(':') {
        Some(i) if !h[i..].contains(']') => &h[..i],
        _ => h,
    }
}

/// One rule, ready for the hot path.
#[derive(Debug)]
pub struct CompiledRule {
    /// Rule name (in verdicts, metrics and Redis keys); shared, since every quota header names it.
    pub name: Arc<str>,
    /// When the rule applies.
    pub matcher: Matcher,
    /// How its keys are derived.
    pub key: KeySpec,
    /// The algorithm.
    pub algorithm: AlgorithmKind,
    /// The full, cluster-wide limit.
    pub params: Params,
    /// Count and report but never reject.
    pub shadow: bool,
    /// `:<tag>` suffix data for Redis keys lives in the algorithms; this is the rule's metric handles.
    pub counters: RuleCounters,
}

impl CompiledRule {
    /// Compiles rule `index` of the config; its key hashes are keyed with `counter_key`
    /// ([`KeySpec::compile`]).
    pub fn compile(
        index: usize,
        rule: &Rule,
        policy: Option<&PolicyRef>,
        counter_key: Option<&hmac::Key>,
        counters: RuleCounters,
    ) -> Result<Self> {
        let field = format!("limits.rules[{index}]");
        if rule.name.is_empty() {
            return Err(Error::Config(format!("{field}.name: must not be empty")));
        }
        let window_ms = rule.limit.window.as_millis();
        if window_ms == 0 {
            return Err(Error::Config(format!(
                "{field}.limit.window: must be longer than 0"
            )));
        }
        if rule.limit.requests == 0 {
            return Err(Error::Config(format!(
                "{field}.limit.requests: must be at least 1"
            )));
        }
        let burst = if rule.algorithm.takes_burst() {
            rule.limit.burst.unwrap_or(0)
        } else {
            0
        };
        let biggest = u128::from(rule.limit.requests.max(burst.saturating_add(1))) * u128::from(window_ms);
        if biggest >= EXACT_LIMIT {
            return Err(Error::Config(format!(
                "{field}.limit: requests (or burst + 1) × window in ms must stay below 2^53"
            )));
        }
        Ok(Self {
            name: Arc::from(rule.name.as_str()),
            matcher: Matcher::compile(&rule.matches, &format!("{field}.match"))?,
            key: KeySpec::compile(policy, &rule.name, &rule.key, &field, counter_key)?,
            algorithm: rule.algorithm,
            params: Params {
                requests: rule.limit.requests,
                window_ms,
                burst,
            },
            shadow: rule.shadow,
            counters,
        })
    }

    /// The ceiling per client IP of `self` (compiled from rule `index`, `rule`), if it has one: a rule
    /// of its own, named `<rule>/client-ip`, matching the same requests, keyed by the client IP, at
    /// `multiple` times the limit (and burst).
    pub fn ceiling(
        &self,
        index: usize,
        rule: &Rule,
        policy: Option<&PolicyRef>,
        counter_key: Option<&hmac::Key>,
        counters: impl FnOnce(&str) -> RuleCounters,
    ) -> Result<Option<Self>> {
        let Some(multiple) = rule.ceiling() else {
            return Ok(None);
        };
        let field = format!("limits.rules[{index}]");
        let name = format!("{}{CEILING_SUFFIX}", rule.name);
        let m = u64::from(multiple);
        let params = Params {
            requests: self.params.requests.saturating_mul(m),
            window_ms: self.params.window_ms,
            burst: self.params.burst.saturating_mul(m),
        };
        if u128::from(params.requests.max(params.burst.saturating_add(1))) * u128::from(params.window_ms)
            >= EXACT_LIMIT
        {
            return Err(Error::Config(format!(
                "{field}.clientIpCeiling: the ceiling (requests × clientIpCeiling) × window in ms must stay \
                 below 2^53"
            )));
        }
        Ok(Some(Self {
            counters: counters(&name),
            name: Arc::from(name),
            matcher: self.matcher.clone(),
            key: KeySpec::ceiling(policy, &rule.name, &rule.key, &field, counter_key)?,
            algorithm: self.algorithm,
            params,
            shadow: self.shadow,
        }))
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method};
    use sluice_crds::sidecar_config::{TierLimits, default_rules};

    use super::*;

    fn applies(m: &Matcher, method: Method, path: &str, host: Option<&str>, headers: &HeaderMap) -> bool {
        m.matches(&RequestFacts {
            method: &method,
            path,
            host,
            headers,
            client_ip: "198.51.100.7".parse().unwrap(),
        })
    }

    fn matcher(m: RuleMatch) -> Matcher {
        Matcher::compile(&m, "limits.rules[0].match").unwrap()
    }

    #[test]
    fn path_prefix_exact_and_regex_all_must_hold() {
        let h = HeaderMap::new();
        let m = matcher(RuleMatch {
            path_prefix: Some("/v1/".into()),
            path_regex: Some("^/v1/[a-z]+$".into()),
            ..Default::default()
        });
        assert!(applies(&m, Method::GET, "/v1/users", None, &h));
        assert!(!applies(&m, Method::GET, "/v1/users/7", None, &h));
        assert!(!applies(&m, Method::GET, "/v2/users", None, &h));
        let m = matcher(RuleMatch {
            path_exact: Some("/login".into()),
            ..Default::default()
        });
        assert!(applies(&m, Method::POST, "/login", None, &h));
        assert!(!applies(&m, Method::POST, "/login/x", None, &h));
    }

    #[test]
    fn methods_host_and_header_presence_narrow_a_rule() {
        let m = matcher(RuleMatch {
            methods: vec!["post".into(), "PUT".into()],
            host: Some("API.example.com".into()),
            header_present: Some("X-Api-Key".into()),
            ..Default::default()
        });
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k".parse().unwrap());
        assert!(applies(&m, Method::POST, "/", Some("api.example.com"), &h));
        assert!(applies(&m, Method::PUT, "/", Some("api.example.com:8443"), &h));
        assert!(!applies(&m, Method::GET, "/", Some("api.example.com"), &h));
        assert!(!applies(&m, Method::POST, "/", Some("other.example.com"), &h));
        assert!(!applies(&m, Method::POST, "/", None, &h));
        assert!(!applies(
            &m,
            Method::POST,
            "/",
            Some("api.example.com"),
            &HeaderMap::new()
        ));
    }

    #[test]
    fn seed_tiers_split_reads_between_read_and_protocol() {
        let rules = default_rules(TierLimits::default());
        let ms: Vec<_> = rules.iter().map(|r| matcher(r.matches.clone())).collect();
        let h = HeaderMap::new();
        let hits = |method: Method, path: &str| -> Vec<&str> {
            ms.iter()
                .zip(&rules)
                .filter(|(m, _)| applies(m, method.clone(), path, None, &h))
                .map(|(_, r)| r.name.as_str())
                .collect()
        };
        assert_eq!(hits(Method::POST, "/v1/auth/login"), ["auth", "write"]);
        assert_eq!(hits(Method::GET, "/v1/packages"), ["read"]);
        assert_eq!(hits(Method::GET, "/npm/left-pad"), ["protocol"]);
        assert_eq!(hits(Method::DELETE, "/npm/left-pad"), ["write"]);
    }

    #[test]
    fn invalid_match_fields_are_named() {
        let err = Matcher::compile(
            &RuleMatch {
                path_regex: Some("(".into()),
                ..Default::default()
            },
            "limits.rules[2].match",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("limits.rules[2].match.pathRegex"),
            "{err}"
        );
        let err = Matcher::compile(
            &RuleMatch {
                methods: vec!["GET".into(), "NOT A METHOD".into()],
                ..Default::default()
            },
            "limits.rules[0].match",
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("limits.rules[0].match.methods[1]"),
            "{err}"
        );
    }
}
