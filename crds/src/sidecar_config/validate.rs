//! Checks a parsed config and names every field at fault by its path (`limits.rules[1].limit.burst`).
//!
//! Used by the sidecar's `--check-config`, by every reload (file or Redis) before the config is applied,
//! and by the operator before it publishes a rendered config, so a config that passes here is one the
//! sidecar runs. Pure: no I/O.

use std::{collections::HashSet, fmt};

use super::{
    CLIENT_IP_CEILING_MAX, CONFIG_VERSION, KeyPart, KeySource, LimitsConfig, MAX_CONNECTIONS_MAX,
    PREFETCH_MAX, PolicyRef, QueueConfig, Rule, RuleMatch, SidecarConfig, valid_queue_name, valid_short_name,
};
use crate::{
    Duration,
    names::{is_dns_label, is_dns_subdomain},
};

/// Shortest window a rule may have.
pub const WINDOW_MIN: Duration = Duration::from_secs(1);
/// Longest window a rule may have.
pub const WINDOW_MAX: Duration = Duration::from_secs(24 * 3600);
/// Longest shutdown grace period accepted.
pub const SHUTDOWN_GRACE_MAX: Duration = Duration::from_secs(600);
/// Longest client timeout accepted.
pub const CLIENT_TIMEOUT_MAX: Duration = Duration::from_secs(24 * 3600);
/// Longest Redis deadline accepted: a longer one defeats the point of a per-call deadline.
pub const REDIS_TIMEOUT_MAX: Duration = Duration::from_secs(5);
/// Methods a rule may match.
pub const KNOWN_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE",
];
/// URL schemes of the Redis topologies the limiter speaks; those starting `rediss` speak TLS.
pub const REDIS_SCHEMES: [&str; 6] = [
    "redis",
    "rediss",
    "redis-sentinel",
    "rediss-sentinel",
    "redis-cluster",
    "rediss-cluster",
];

/// One field at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path of the field (`limits.rules[1].limit.burst`); empty when the document itself is bad.
    pub path: String,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every field at fault in one config, in document order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<FieldError>);

impl ConfigErrors {
    /// Records a field at fault.
    pub fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Whether nothing is at fault.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The fields at fault.
    pub fn fields(&self) -> impl Iterator<Item = &FieldError> {
        self.0.iter()
    }

    /// `Ok` when no field is at fault, the errors otherwise.
    pub fn into_result(self) -> Result<(), ConfigErrors> {
        if self.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Checks everything a type cannot say: ranges, names, regexes, combinations. Lists every field at fault.
pub fn validate(config: &SidecarConfig) -> Result<(), ConfigErrors> {
    let mut errs = ConfigErrors::default();
    if config.version != CONFIG_VERSION {
        errs.push(
            "version",
            format!(
                "this sidecar reads version {CONFIG_VERSION}, the file says {}",
                config.version
            ),
        );
    }
    if let Some(policy) = &config.policy {
        check_policy(policy, &mut errs);
    }
    check_limits(&config.limits, &mut errs);
    if let Some(queue) = &config.queue {
        check_queue(queue, &mut errs);
    }
    errs.into_result()
}

/// The `queue:` section as written. Whether a database URL and queues are set at all is checked when
/// the worker role starts, since the environment may supply them (`SLUICE_DATABASE_URL`, `SLUICE_QUEUES`).
pub fn check_queue(q: &QueueConfig, errs: &mut ConfigErrors) {
    for (i, name) in q.queues.iter().enumerate() {
        if !valid_queue_name(name) {
            errs.push(
                format!("queue.queues[{i}]"),
                format!(
                    "{name:?} is not a queue name: letters, digits, '.', '_', '-', at most 100, optionally after \
                     a namespace and '/'"
                ),
            );
        }
    }
    if let Some(ns) = &q.namespace
        && !is_dns_label(ns)
    {
        errs.push(
            "queue.namespace",
            format!("{ns:?} is not a Kubernetes namespace name"),
        );
    }
    for (i, s) in q.queue_settings.iter().enumerate() {
        if !valid_queue_name(&s.name) {
            errs.push(
                format!("queue.queueSettings[{i}].name"),
                format!("{:?} is not a queue name", s.name),
            );
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, s) in q.schedules.iter().enumerate() {
        let queue = s.queue.as_ref().or(q.queues.first());
        if !valid_short_name(&s.name) {
            errs.push(
                format!("queue.schedules[{i}].name"),
                format!(
                    "{:?} is not a schedule name: letters, digits, '.', '_', '-', at most 100",
                    s.name
                ),
            );
        } else if !names.insert((queue.cloned(), s.name.clone())) {
            errs.push(
                format!("queue.schedules[{i}].name"),
                format!("{:?} is used twice", s.name),
            );
        }
        if let Some(name) = &s.queue
            && !q.queues.is_empty()
            && !q.queues.contains(name)
        {
            errs.push(
                format!("queue.schedules[{i}].queue"),
                format!("{name:?} is not one of queue.queues"),
            );
        }
    }
    if q.worker.concurrency == 0 {
        errs.push("queue.worker.concurrency", "must be at least 1");
    }
    if q.worker.claim_batch == 0 {
        errs.push("queue.worker.claimBatch", "must be at least 1");
    }
    if q.worker.answer_deadline.get().is_zero() {
        errs.push("queue.worker.answerDeadline", "must be longer than 0");
    }
    if let Some(heartbeat) = q.worker.heartbeat_interval
        && q.worker.answer_deadline.get() >= heartbeat.get()
    {
        errs.push(
            "queue.worker.answerDeadline",
            format!(
                "must be shorter than queue.worker.heartbeatInterval ({} ms), or a heartbeat stuck on a silent connection lets the leases lapse",
                heartbeat.as_millis()
            ),
        );
    }
    if q.api.max_batch == 0 {
        errs.push("queue.api.maxBatch", "must be at least 1");
    }
    if q.api.answer_deadline.get().is_zero() {
        errs.push("queue.api.answerDeadline", "must be longer than 0");
    }
    if q.pool_size == Some(0) {
        errs.push("queue.poolSize", "must be at least 1");
    }
    if !q.handler.url.starts_with("http://") {
        errs.push(
            "queue.handler.url",
            format!("{:?} is not an http:// URL", q.handler.url),
        );
    }
    for (i, status) in q.handler.permanent_failure_statuses.iter().enumerate() {
        if !(400..=599).contains(status) {
            errs.push(
                format!("queue.handler.permanentFailureStatuses[{i}]"),
                format!("{status} is not an HTTP error status (400-599)"),
            );
        }
    }
}

fn check_policy(p: &PolicyRef, errs: &mut ConfigErrors) {
    if !is_dns_subdomain(&p.namespace) {
        errs.push(
            "policy.namespace",
            format!("{:?} is not a Kubernetes namespace name", p.namespace),
        );
    }
    if !is_dns_subdomain(&p.name) {
        errs.push(
            "policy.name",
            format!("{:?} is not a Kubernetes object name", p.name),
        );
    }
    if p.generation < 0 {
        errs.push("policy.generation", "must not be negative");
    }
}

fn check_limits(l: &LimitsConfig, errs: &mut ConfigErrors) {
    if let Err(msg) = check_upstream_url(&l.upstream) {
        errs.push("limits.upstream", msg);
    }
    if l.listen == l.admin_listen {
        errs.push(
            "limits.adminListen",
            format!("must differ from limits.listen ({})", l.listen),
        );
    }
    if let Some(url) = &l.redis.url
        && let Err(msg) = check_redis_url(url)
    {
        errs.push("limits.redis.url", msg);
    }
    if let Some(ca) = &l.redis.ca_file {
        if !ca.starts_with('/') {
            errs.push("limits.redis.caFile", format!("{ca:?} must be an absolute path"));
        } else if l.redis.url.as_deref().is_some_and(|u| !redis_url_uses_tls(u)) {
            errs.push(
                "limits.redis.caFile",
                "is only read for a TLS Redis: the URL must start with rediss (rediss://, \
                 rediss-sentinel://, rediss-cluster://)",
            );
        }
    }
    if l.redis.timeout.as_millis() == 0 || l.redis.timeout > REDIS_TIMEOUT_MAX {
        errs.push(
            "limits.redis.timeout",
            format!(
                "must be between 1ms and {REDIS_TIMEOUT_MAX}, got {}",
                l.redis.timeout
            ),
        );
    }
    if l.redis.breaker_failures == 0 {
        errs.push("limits.redis.breakerFailures", "must be at least 1");
    }
    if l.redis.breaker_cooldown.as_millis() == 0 {
        errs.push("limits.redis.breakerCooldown", "must be longer than 0s");
    }
    if !(1..=64).contains(&l.redis.pool_size) {
        errs.push(
            "limits.redis.poolSize",
            format!("must be between 1 and 64, got {}", l.redis.pool_size),
        );
    }
    if l.redis.prefetch > PREFETCH_MAX {
        errs.push(
            "limits.redis.prefetch",
            format!("must be at most {PREFETCH_MAX}, got {}", l.redis.prefetch),
        );
    }
    if l.expected_replicas < 1 {
        errs.push("limits.expectedReplicas", "must be at least 1");
    }
    if l.local_max_keys < 1 {
        errs.push("limits.localMaxKeys", "must be at least 1");
    }
    if l.max_request_body < 1 {
        errs.push(
            "limits.maxRequestBody",
            "must be at least 1 byte (requests without a body are always allowed)",
        );
    }
    if let Some(n) = l.max_connections
        && !(1..=MAX_CONNECTIONS_MAX).contains(&n)
    {
        errs.push(
            "limits.maxConnections",
            format!("must be between 1 and {MAX_CONNECTIONS_MAX}, got {n}"),
        );
    }
    if l.shutdown_grace > SHUTDOWN_GRACE_MAX {
        errs.push(
            "limits.shutdownGrace",
            format!("must be at most {SHUTDOWN_GRACE_MAX}, got {}", l.shutdown_grace),
        );
    }
    for (field, d) in [
        ("limits.clientTimeouts.idle", l.client_timeouts.idle),
        (
            "limits.clientTimeouts.requestHead",
            l.client_timeouts.request_head,
        ),
        ("limits.clientTimeouts.body", l.client_timeouts.body),
        ("limits.clientTimeouts.send", l.client_timeouts.send),
    ] {
        if d.get().is_zero() || d > CLIENT_TIMEOUT_MAX {
            errs.push(
                field,
                format!("must be longer than 0s and at most {CLIENT_TIMEOUT_MAX}, got {d}"),
            );
        }
    }
    for (i, protocol) in l.upgrades.iter().enumerate() {
        let at = format!("limits.upgrades[{i}]");
        if protocol.is_empty()
            || !protocol
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b))
        {
            errs.push(at, format!("{protocol:?} is not a protocol name (an HTTP token)"));
        } else if protocol.bytes().any(|b| b.is_ascii_uppercase()) {
            errs.push(at, format!("{protocol:?} must be lower case"));
        } else if protocol.starts_with("h2c") {
            errs.push(
                at,
                "h2c cannot be allowed: after the switch, requests reach the app through a tunnel the \
                 limiter never sees (clients may speak h2c to the proxy directly instead)",
            );
        }
    }
    let mut seen = HashSet::new();
    for (i, rule) in l.rules.iter().enumerate() {
        let at = format!("limits.rules[{i}]");
        if rule.name.is_empty() {
            errs.push(format!("{at}.name"), "must not be empty");
        } else if !is_dns_label(&rule.name) {
            errs.push(
                format!("{at}.name"),
                format!(
                    "{:?} is not a DNS label: lower-case letters, digits and '-', at most 63, starting and \
                     ending with a letter or digit",
                    rule.name
                ),
            );
        } else if !seen.insert(rule.name.as_str()) {
            errs.push(
                format!("{at}.name"),
                format!("{:?} is used by an earlier rule; names must be unique", rule.name),
            );
        }
        check_rule(rule, &at, errs);
    }
}

fn check_rule(rule: &Rule, at: &str, errs: &mut ConfigErrors) {
    check_match(&rule.matches, &format!("{at}.match"), errs);
    for (j, part) in rule.key.iter().enumerate() {
        check_key_part(part, &format!("{at}.key[{j}]"), errs);
    }
    let limit = &rule.limit;
    if limit.requests == 0 {
        errs.push(format!("{at}.limit.requests"), "must be at least 1");
    }
    if limit.window < WINDOW_MIN || limit.window > WINDOW_MAX {
        errs.push(
            format!("{at}.limit.window"),
            format!(
                "must be between {WINDOW_MIN} and {WINDOW_MAX}, got {}",
                limit.window
            ),
        );
    }
    let window_ok = limit.window >= WINDOW_MIN && limit.window <= WINDOW_MAX;
    if limit.requests > 0 && window_ok {
        check_exact(rule, at, errs);
    }
    if let Some(n) = rule.client_ip_ceiling {
        if n > 0 && !rule.keyed_by_client_value() {
            errs.push(
                format!("{at}.clientIpCeiling"),
                "only rules keyed by credential, header or hashedHeader take a ceiling per client IP \
                 (a clientIp key is one already)",
            );
        } else if n > CLIENT_IP_CEILING_MAX {
            errs.push(
                format!("{at}.clientIpCeiling"),
                format!("must be at most {CLIENT_IP_CEILING_MAX} (times the limit), got {n}"),
            );
        } else if u128::from(limit.requests) * u128::from(n) >= 1 << 53 {
            errs.push(
                format!("{at}.clientIpCeiling"),
                "requests × clientIpCeiling must stay below 2^53",
            );
        }
    }
    match (rule.algorithm.takes_burst(), limit.burst) {
        (true, Some(0)) => errs.push(format!("{at}.limit.burst"), "must be at least 1 when given"),
        (true, _) | (_, None) => {}
        (false, Some(_)) => errs.push(format!("{at}.limit.burst"), "only tokenBucket rules take a burst"),
    }
}

/// The most a window's count may reach: the Redis scripts count in Lua numbers (doubles), exact below
/// 2^53, and the limiter refuses a rule whose counts could pass it (in milliseconds, for the token
/// bucket's and the sliding window's arithmetic). Checked here too, so a config that passes validation
/// is one the limiter runs.
pub const EXACT_COUNT: u128 = 1 << 53;

/// `requests` (or `burst + 1`) × window in ms, for the rule and for its ceiling per client IP, stays below
/// [`EXACT_COUNT`], as the limiter requires.
fn check_exact(rule: &Rule, at: &str, errs: &mut ConfigErrors) {
    let limit = &rule.limit;
    let burst = if rule.algorithm.takes_burst() {
        limit.burst.unwrap_or(0)
    } else {
        0
    };
    let window_ms = u128::from(limit.window.as_millis());
    let biggest = |requests: u64, burst: u64| u128::from(requests.max(burst.saturating_add(1))) * window_ms;
    if biggest(limit.requests, burst) >= EXACT_COUNT {
        errs.push(
            format!("{at}.limit"),
            format!(
                "requests (or burst + 1) × window in ms must stay below 2^53, the largest count the Redis \
                 scripts hold exactly: {} × {window_ms} is more; lower requests or the window",
                limit.requests.max(burst.saturating_add(1))
            ),
        );
    } else if let Some(m) = rule.ceiling()
        && biggest(
            limit.requests.saturating_mul(u64::from(m)),
            burst.saturating_mul(u64::from(m)),
        ) >= EXACT_COUNT
    {
        errs.push(
            format!("{at}.clientIpCeiling"),
            format!(
                "the ceiling per client IP, {m} × the limit, × window in ms must stay below 2^53, the largest \
                 count the Redis scripts hold exactly; lower clientIpCeiling (0 turns it off), requests or \
                 the window"
            ),
        );
    }
}

fn check_match(m: &RuleMatch, at: &str, errs: &mut ConfigErrors) {
    for (field, value) in [("pathPrefix", &m.path_prefix), ("pathExact", &m.path_exact)] {
        if let Some(v) = value
            && !v.starts_with('/')
        {
            errs.push(format!("{at}.{field}"), format!("{v:?} must start with '/'"));
        }
    }
    if let Some(re) = &m.path_regex
        && let Err(e) = regex::Regex::new(re)
    {
        // regex errors draw a caret diagram over several lines; the last line says what is wrong.
        let text = e.to_string();
        let reason = text
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default();
        errs.push(
            format!("{at}.pathRegex"),
            format!(
                "{re:?} does not compile: {}",
                reason.trim().trim_start_matches("error: ")
            ),
        );
    }
    for (k, p) in m.exclude_path_prefixes.iter().enumerate() {
        if !p.starts_with('/') {
            errs.push(
                format!("{at}.excludePathPrefixes[{k}]"),
                format!("{p:?} must start with '/'"),
            );
        }
    }
    for (k, method) in m.methods.iter().enumerate() {
        if !KNOWN_METHODS.contains(&method.as_str()) {
            errs.push(
                format!("{at}.methods[{k}]"),
                format!(
                    "{method:?} is not a known method (upper case): one of {}",
                    KNOWN_METHODS.join(", ")
                ),
            );
        }
    }
    if let Some(host) = &m.host
        && (host.is_empty() || host.contains([':', '/', ' ']))
    {
        errs.push(
            format!("{at}.host"),
            format!("{host:?} is not a host name (no port, no scheme)"),
        );
    }
    if let Some(h) = &m.header_present
        && http::HeaderName::from_bytes(h.as_bytes()).is_err()
    {
        errs.push(
            format!("{at}.headerPresent"),
            format!("{h:?} is not a valid header name"),
        );
    }
}

fn check_key_part(p: &KeyPart, at: &str, errs: &mut ConfigErrors) {
    match (p.source, &p.name) {
        (KeySource::Header | KeySource::HashedHeader, None) => errs.push(
            format!("{at}.name"),
            "header and hashedHeader keys need a header name",
        ),
        (KeySource::Header | KeySource::HashedHeader | KeySource::Credential, Some(name))
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() =>
        {
            errs.push(
                format!("{at}.name"),
                format!("{name:?} is not a valid header name"),
            );
        }
        (KeySource::ClientIp | KeySource::Method | KeySource::Path, Some(_)) => errs.push(
            format!("{at}.name"),
            "only header, hashedHeader and credential keys take a name",
        ),
        _ => {}
    }
    if p.ipv4_prefix > 32 {
        errs.push(
            format!("{at}.ipv4Prefix"),
            format!("must be between 0 and 32, got {}", p.ipv4_prefix),
        );
    }
    if p.ipv6_prefix > 128 {
        errs.push(
            format!("{at}.ipv6Prefix"),
            format!("must be between 0 and 128, got {}", p.ipv6_prefix),
        );
    }
}

/// The app's base URL: `http://host:port`, no path beyond `/`, no query.
pub fn check_upstream_url(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "{url:?} must start with http:// (the app is reached over cleartext on localhost)"
        ));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} names no host"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("{url:?} must not carry a path or query"));
    }
    Ok(uri)
}

fn check_redis_url(url: &str) -> Result<(), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err("is not a URL (expected redis://host:port)".into());
    };
    if !REDIS_SCHEMES.contains(&scheme) {
        return Err(format!(
            "scheme {scheme:?} is not one of {}",
            REDIS_SCHEMES.join(", ")
        ));
    }
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() {
        return Err("names no host".into());
    }
    Ok(())
}

/// Whether a Redis URL asks for TLS (its scheme starts with `rediss`).
pub fn redis_url_uses_tls(url: &str) -> bool {
    url.split_once("://")
        .is_some_and(|(scheme, _)| scheme.starts_with("rediss"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sidecar_config::{Algorithm, Limit, TierLimits, default_rules};

    fn config_with(rule: Rule) -> SidecarConfig {
        let mut c = SidecarConfig::default();
        c.limits.rules = vec![rule];
        c
    }

    fn rule(name: &str) -> Rule {
        Rule {
            name: name.into(),
            matches: RuleMatch::default(),
            key: vec![],
            algorithm: Algorithm::FixedWindow,
            limit: Limit {
                requests: 10,
                window: Duration::from_secs(60),
                burst: None,
            },
            shadow: false,
            client_ip_ceiling: None,
        }
    }

    fn paths(r: Result<(), ConfigErrors>) -> Vec<String> {
        r.unwrap_err().0.into_iter().map(|e| e.path).collect()
    }

    #[test]
    fn an_api_answer_deadline_of_zero_is_refused_and_the_default_is_not_written() {
        let mut q = QueueConfig::default();
        assert!(
            !serde_yaml::to_string(&q.api).unwrap().contains("answerDeadline"),
            "the API's default deadline is left out"
        );
        q.api.answer_deadline = Duration::from_millis(0);
        let mut errs = ConfigErrors::default();
        check_queue(&q, &mut errs);
        assert!(errs.0.iter().any(|e| e.path == "queue.api.answerDeadline"));
        q.api.answer_deadline = Duration::from_millis(1500);
        let written = serde_yaml::to_string(&q).unwrap();
        assert!(written.contains("answerDeadline: 1s500ms"), "{written}");
        let read: QueueConfig = serde_yaml::from_str(&written).unwrap();
        assert_eq!(read.api.answer_deadline, q.api.answer_deadline);
    }

    #[test]
    fn an_answer_deadline_not_shorter_than_the_heartbeat_interval_is_refused() {
        let refused = |answer: u64, heartbeat: Option<u64>| {
            let mut q = QueueConfig::default();
            q.worker.answer_deadline = Duration::from_millis(answer);
            q.worker.heartbeat_interval = heartbeat.map(Duration::from_millis);
            let mut errs = ConfigErrors::default();
            check_queue(&q, &mut errs);
            errs.0.iter().any(|e| e.path == "queue.worker.answerDeadline")
        };
        assert!(refused(0, None));
        assert!(refused(5_000, Some(5_000)));
        assert!(refused(6_000, Some(5_000)));
        assert!(!refused(4_999, Some(5_000)));
        assert!(
            !refused(60_000, None),
            "the leases it must stay below are the queues' own"
        );
    }

    #[test]
    fn the_seed_tiers_are_a_valid_config() {
        let mut c = SidecarConfig::default();
        c.limits.rules = default_rules(TierLimits::default());
        validate(&c).unwrap();
    }

    #[test]
    fn a_burst_on_a_fixed_window_rule_is_named_with_its_path() {
        let mut r = rule("a");
        r.limit.burst = Some(5);
        let err = validate(&config_with(r)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "limits.rules[0].limit.burst: only tokenBucket rules take a burst"
        );
    }

    #[test]
    fn every_field_at_fault_is_listed_not_only_the_first() {
        let mut r = rule("Bad_Name");
        r.limit.requests = 0;
        r.limit.window = Duration::from_millis(500);
        r.matches.path_regex = Some("(".into());
        r.matches.methods = vec!["get".into()];
        r.key = vec![KeyPart {
            ipv6_prefix: 129,
            ..KeyPart::client_ip()
        }];
        let got = paths(validate(&config_with(r)));
        assert_eq!(
            got,
            [
                "limits.rules[0].name",
                "limits.rules[0].match.pathRegex",
                "limits.rules[0].match.methods[0]",
                "limits.rules[0].key[0].ipv6Prefix",
                "limits.rules[0].limit.requests",
                "limits.rules[0].limit.window",
            ]
        );
    }

    /// Found by fuzzing (fuzz/fuzz_targets/sidecar_config.rs): `--check-config` passed these, and the
    /// limiter then refused them at start or reload.
    #[test]
    fn limits_whose_counts_redis_cannot_hold_exactly_are_refused_as_the_limiter_refuses_them() {
        let mut huge = rule("a");
        huge.limit.requests = u64::MAX;
        huge.limit.window = Duration::from_secs(24 * 3600);
        assert_eq!(paths(validate(&config_with(huge))), ["limits.rules[0].limit"]);

        // The CRD's largest `requests` with its longest window.
        let mut day = rule("a");
        day.limit.requests = 1_000_000_000;
        day.limit.window = Duration::from_secs(24 * 3600);
        assert_eq!(paths(validate(&config_with(day))), ["limits.rules[0].limit"]);

        let mut bucket = rule("a");
        bucket.algorithm = Algorithm::TokenBucket;
        bucket.limit.burst = Some(u64::MAX - 1);
        assert_eq!(paths(validate(&config_with(bucket))), ["limits.rules[0].limit"]);

        // Within the limit, but not its default ceiling of 10× per client IP.
        let mut keyed = rule("a");
        keyed.key = vec![KeyPart {
            source: KeySource::Credential,
            ..KeyPart::client_ip()
        }];
        keyed.limit.requests = 1_000_000_000;
        keyed.limit.window = Duration::from_secs(3600);
        assert_eq!(
            paths(validate(&config_with(keyed.clone()))),
            ["limits.rules[0].clientIpCeiling"]
        );
        keyed.client_ip_ceiling = Some(0);
        assert!(validate(&config_with(keyed)).is_ok(), "without a ceiling it fits");

        let mut largest = rule("a");
        largest.limit.requests = (EXACT_COUNT / 86_400_000 - 1) as u64;
        largest.limit.window = Duration::from_secs(24 * 3600);
        assert!(validate(&config_with(largest)).is_ok());
    }

    #[test]
    fn duplicate_rule_names_are_refused_at_the_second() {
        let mut c = config_with(rule("same"));
        c.limits.rules.push(rule("same"));
        assert_eq!(paths(validate(&c)), ["limits.rules[1].name"]);
    }

    #[test]
    fn upstream_must_be_a_plain_http_base_url() {
        for bad in [
            "localhost:3000",
            "https://127.0.0.1:3000",
            "http://127.0.0.1:3000/app",
            "http://",
        ] {
            let mut c = SidecarConfig::default();
            c.limits.upstream = bad.into();
            assert_eq!(paths(validate(&c)), ["limits.upstream"], "{bad}");
        }
        for good in ["http://127.0.0.1:3000", "http://localhost:8080/"] {
            assert!(check_upstream_url(good).is_ok(), "{good}");
        }
    }
}
