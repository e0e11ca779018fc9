//! `RateLimitPolicy` (`sluice.dev/v1alpha1`, namespaced): cluster-wide rate limits enforced by the
//! Sluice sidecar in front of selected pods, counted in Redis.
//!
//! Field names follow the sidecar config ([`crate::sidecar_config`]) wherever the meaning is the same,
//! so rendering a policy is mostly a copy. The CRD validates itself: OpenAPI bounds and closed enums,
//! plus CEL rules (`x-kubernetes-validations`) for what spans fields. Each rule carries a message
//! that names the field and says what to write instead. What CEL cannot check (whether a regular
//! expression compiles in the sidecar's engine) the controller reports as `Ready=False` with reason
//! `InvalidSpec`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{duration::Duration, sidecar_config};
pub use crate::{
    secret_ref::SecretKeyRef,
    sidecar_config::{Algorithm, FailureMode, KeySource},
};

/// Longest policy name: pods carry it in the `sluice.dev/policy` label, and label values are at most
/// 63 characters.
pub const NAME_MAX_LEN: usize = 63;
/// Most rules one policy may hold (bounds the cost of the CEL rules, too).
pub const RULES_MAX: usize = 64;
/// Largest `requests` a `slidingLog` rule may allow: the log keeps one entry per request.
pub const SLIDING_LOG_REQUESTS_MAX: u64 = 10_000;

/// Rate limits for the pods a policy selects, enforced by the injected `sluice-sidecar` container
/// before requests reach the application, with counters shared through Redis so the limit holds
/// across all replicas.
///
/// A pod is governed by a policy when it asks for injection (`sluice.dev/inject: "true"`) and either
/// names the policy (`sluice.dev/policy: <name>`) or carries the labels of its `selector`.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "RateLimitPolicy",
    plural = "ratelimitpolicies",
    singular = "ratelimitpolicy",
    shortname = "rlp",
    category = "sluice",
    namespaced,
    status = "RateLimitPolicyStatus",
    derive = "PartialEq",
    doc = "Cluster-wide rate limits for the pods a policy selects, enforced by the injected sluice-sidecar container and counted in Redis.",
    validation = Rule::new("self.metadata.name.size() <= 63").message("RateLimitPolicy names are at most 63 characters: governed pods carry the name in the sluice.dev/policy label"),
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the policy is rendered, published and enforced by every selected pod"}"#,
    printcolumn = r#"{"name":"Rules","type":"integer","jsonPath":".status.rules","description":"Number of rules"}"#,
    printcolumn = r#"{"name":"Enforcing","type":"string","jsonPath":".status.enforcing","description":"Pods enforcing the current generation / pods selected"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitPolicySpec {
    /// Pods this policy applies to, by label, within the policy's namespace. Pods may instead name the
    /// policy in the `sluice.dev/policy` annotation. Leave it out to govern only pods that name the
    /// policy. Either way, only pods annotated `sluice.dev/inject: "true"` get the sidecar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,

    /// Where the counters live. The sidecars of governed pods and the operator connect to this Redis.
    pub redis: RedisSpec,

    /// What the sidecar does with requests while Redis cannot answer within `redis.timeout`:
    /// `open` lets them through unlimited, `closed` rejects them with 429, `local` limits each
    /// replica in memory at `requests / pods` until Redis is back, `pods` being the count of pods
    /// enforcing the policy that the operator publishes (`expectedReplicas` until a sidecar has read it).
    #[serde(default = "default_failure_mode")]
    pub failure_mode: FailureMode,

    /// How many replicas share the limits under `failureMode: local` until a sidecar has read the
    /// operator's own count of enforcing pods (published in Redis; a sidecar that started while Redis
    /// was away has not). Set it to the workload's usual replica count.
    #[serde(default = "default_expected_replicas")]
    #[schemars(range(min = 1, max = 10000))]
    pub expected_replicas: u32,

    /// How the client address is found, which `clientIp` keys use.
    #[serde(default)]
    pub client_ip: ClientIpSpec,

    /// Clients in these CIDRs are never limited (e.g. health checkers, internal batch jobs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(c, isCIDR(c))",
        "message": "allowList entries must be CIDRs such as 10.0.0.0/8 or fd00::/8 (a single address is written 10.1.2.3/32)"
    }]))]
    pub allow_list: Vec<String>,

    /// Which rate-limit headers responses carry.
    #[serde(default)]
    pub headers: HeadersSpec,

    /// The NetworkPolicy the operator renders for the governed pods, so that other pods reach them only
    /// through the sidecar. On by default.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,

    /// Most client connections each sidecar keeps open at once; a connection over it is closed as soon
    /// as it is accepted. Leave it out to derive it from the sidecar container's memory limit (2,304 at
    /// the injected 64Mi; 10,000 without a limit), so that slow clients cannot take the sidecar past its
    /// memory limit. Between 1 and 1000000; never more than the sidecar's file-descriptor limit allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = sidecar_config::MAX_CONNECTIONS_MAX))]
    pub max_connections: Option<u32>,

    /// How long a client connection may keep the sidecar waiting — for its next request, for the rest
    /// of a request, to take its response — before it is closed. Each between 1ms and 24h.
    #[serde(default)]
    pub client_timeouts: ClientTimeoutsSpec,

    /// The rules. Every rule whose `match` fits a request applies, and all of them must allow it.
    #[schemars(length(min = 1, max = RULES_MAX))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(r, self.exists_one(s, s.name == r.name))",
        "message": "rule names must be unique within a policy: each name keeps its own counters in Redis"
    }]))]
    pub rules: Vec<RateLimitRule>,
}

/// The Redis that holds the counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisSpec {
    /// The Secret, in the policy's namespace, holding the Redis URL (`redis://[:password@]host:6379/0`).
    /// The URL never leaves the Secret: sidecars read it through an environment variable.
    pub secret_ref: SecretKeyRef,

    /// Deadline of each Redis call made while handling a request; when it passes, `failureMode`
    /// decides. Between 1ms and 5s.
    #[serde(default = "default_redis_timeout")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) >= duration('1ms') && duration(self) <= duration('5s')",
        "message": "redis.timeout must be between 1ms and 5s: every limited request may wait this long"
    }]))]
    #[schemars(schema_with = "go_duration_schema")]
    pub timeout: Duration,

    /// Most requests of a key's budget one Redis call may take ahead, for a sidecar to spend in process
    /// without waiting: for a busy key (fixed window, sliding-window counter, token bucket), and up to 8
    /// for any key far from its limit, however slow (fixed window, sliding-window counter). Never over
    /// the limit, and at most a quarter of what is left per replica; 0 makes every request wait for its
    /// own Redis decision. See docs/rate-limiting.md.
    #[serde(default = "default_prefetch")]
    #[schemars(range(min = 0, max = sidecar_config::PREFETCH_MAX))]
    pub prefetch: u64,
}

/// The NetworkPolicy `sluice-policy-<name>` rendered for the governed pods (those labelled
/// `sluice.dev/policy: <name>`). It admits ingress only on the sidecar's ports (its proxy port, found by
/// name on each pod, and its admin port, which kubelet probes and Prometheus scrape) and on
/// `additionalPorts`, so the app's own port cannot be reached around the sidecar. NetworkPolicies
/// are enforced by the cluster's network plugin: on a plugin without NetworkPolicy support the
/// object is accepted and does nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// Render the NetworkPolicy. `false` deletes the one the operator rendered before; then the app's
    /// port is reachable from other pods unless another NetworkPolicy closes it.
    #[serde(default = "yes")]
    pub enabled: bool,

    /// Further container ports of the governed pods to admit ingress on, by number (e.g. an app
    /// metrics port scraped directly). Requests through them are not rate limited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(range(min = 1, max = 65535)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub additional_ports: Vec<u16>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        Self {
            enabled: true,
            additional_ports: vec![],
        }
    }
}

/// How long a client connection may keep the sidecar waiting before it is closed (the sidecar's
/// `limits.clientTimeouts`). No timeout applies while the app works on a request or streams a
/// response: those are the app's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientTimeoutsSpec {
    /// A kept-alive connection with no request for this long is closed (default 15m). Keep it above the
    /// keep-alive timeout of the load balancer or ingress in front (60s to 10m), or it may send a
    /// request on a connection being closed.
    #[serde(default = "default_client_idle")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) >= duration('1ms') && duration(self) <= duration('24h')",
        "message": "clientTimeouts.idle must be between 1ms and 24h"
    }]))]
    pub idle: Duration,

    /// A request head must arrive whole within this long of its first byte (default 60s; slow-header
    /// attacks).
    #[serde(default = "default_client_request_head")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) >= duration('1ms') && duration(self) <= duration('24h')",
        "message": "clientTimeouts.requestHead must be between 1ms and 24h"
    }]))]
    pub request_head: Duration,

    /// A client sending a request body may pause at most this long between two pieces (default 60s,
    /// as nginx's `client_body_timeout`); then it is answered 408 and the connection closes.
    #[serde(default = "default_client_body")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) >= duration('1ms') && duration(self) <= duration('24h')",
        "message": "clientTimeouts.body must be between 1ms and 24h"
    }]))]
    pub body: Duration,

    /// A client may leave its response unread at most this long between two writes (default 60s, as
    /// nginx's `send_timeout`); then the connection closes.
    #[serde(default = "default_client_send")]
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "duration(self) >= duration('1ms') && duration(self) <= duration('24h')",
        "message": "clientTimeouts.send must be between 1ms and 24h"
    }]))]
    pub send: Duration,
}

impl Default for ClientTimeoutsSpec {
    fn default() -> Self {
        Self {
            idle: default_client_idle(),
            request_head: default_client_request_head(),
            body: default_client_body(),
            send: default_client_send(),
        }
    }
}

/// How the client address is found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpSpec {
    /// Proxies (load balancers, ingress controllers) whose `X-Forwarded-For` header is believed, as
    /// CIDRs. The client is the rightmost address in the header that is not one of these; requests
    /// from any other peer are keyed by their socket address and the header is ignored, so a client
    /// cannot pick its own key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 64)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.all(c, isCIDR(c))",
        "message": "clientIp.trustedProxies entries must be CIDRs such as 10.0.0.0/8 or fd00::/8 (a single address is written 10.1.2.3/32)"
    }]))]
    pub trusted_proxies: Vec<String>,
}

/// Which rate-limit headers responses of limited routes carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeadersSpec {
    /// Send `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
    #[serde(default = "yes")]
    pub legacy: bool,
    /// Send the IETF draft `RateLimit-Policy` and `RateLimit` fields.
    #[serde(default = "yes")]
    pub draft: bool,
}

impl Default for HeadersSpec {
    fn default() -> Self {
        Self {
            legacy: true,
            draft: true,
        }
    }
}

/// One rule: which requests it counts, per what key, with which algorithm, up to what limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.limit.burst) || self.algorithm == 'tokenBucket'",
        "message": "limit.burst is only allowed with algorithm tokenBucket; the window algorithms have no burst",
        "fieldPath": ".limit.burst"
    },
    {
        "rule": "self.algorithm != 'slidingLog' || self.limit.requests <= 10000",
        "message": "slidingLog keeps one Redis entry per request, so it allows at most 10000 requests per window; use slidingCounter for larger limits",
        "fieldPath": ".limit.requests"
    },
    {
        "rule": "duration(self.limit.window) < duration('1s') || (self.limit.requests <= 9007199254740991 / duration(self.limit.window).getMilliseconds() && (self.algorithm != 'tokenBucket' || !has(self.limit.burst) || self.limit.burst + 1 <= 9007199254740991 / duration(self.limit.window).getMilliseconds()))",
        "message": "limit.requests (or limit.burst + 1) × limit.window in milliseconds must stay below 2^53, the largest count the limiter holds exactly; lower limit.requests or limit.window",
        "fieldPath": ".limit"
    },
    {
        "rule": "duration(self.limit.window) < duration('1s') || !has(self.key) || !self.key.exists(k, k.type in ['credential', 'header', 'hashedHeader']) || (has(self.clientIpCeiling) ? self.clientIpCeiling : 10) == 0 || (self.limit.requests * (has(self.clientIpCeiling) ? self.clientIpCeiling : 10) <= 9007199254740991 / duration(self.limit.window).getMilliseconds() && (self.algorithm != 'tokenBucket' || !has(self.limit.burst) || self.limit.burst * (has(self.clientIpCeiling) ? self.clientIpCeiling : 10) + 1 <= 9007199254740991 / duration(self.limit.window).getMilliseconds()))",
        "message": "the ceiling per client IP, clientIpCeiling (default 10) × limit.requests (or × limit.burst, + 1), × limit.window in milliseconds must stay below 2^53, the largest count the limiter holds exactly; lower clientIpCeiling (0 turns it off), limit.requests or limit.window",
        "fieldPath": ".clientIpCeiling"
    },
    {
        "rule": "!has(self.clientIpCeiling) || self.clientIpCeiling == 0 || (has(self.key) && self.key.exists(k, k.type in ['credential', 'header', 'hashedHeader']))",
        "message": "clientIpCeiling is for rules keyed by credential, header or hashedHeader (values the client picks); a rule keyed by clientIp is limited per client IP already",
        "fieldPath": ".clientIpCeiling"
    }
]))]
pub struct RateLimitRule {
    /// Name of the rule, unique within the policy. It is part of the Redis key, so renaming a rule
    /// starts its counters afresh while changing its limit keeps them.
    #[schemars(length(min = 1, max = 63))]
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,

    /// Which requests the rule counts. Empty: every request.
    #[serde(default, rename = "match")]
    pub matches: RuleMatchSpec,

    /// What identifies a client. Several parts are joined into one key (e.g. client IP and method).
    /// Empty: the client IP, IPv6 grouped by /64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub key: Vec<KeyPartSpec>,

    /// The counting algorithm: `fixedWindow` (cheapest; up to twice the limit across a window edge),
    /// `slidingLog` (exact; memory grows with the limit), `slidingCounter` (close estimate at
    /// fixed-window cost) or `tokenBucket` (steady rate with `limit.burst`, like nginx `burst nodelay`).
    #[serde(default = "default_algorithm")]
    pub algorithm: Algorithm,

    /// How many requests per window.
    pub limit: LimitSpec,

    /// Count and report (metrics, headers, logs) but never reject: a dry run before enforcing.
    #[serde(default)]
    pub shadow: bool,

    /// For a rule keyed by a value the client picks (`credential`, `header`, `hashedHeader`): the most
    /// one client IP may make under the rule across all the values it sends, as a multiple of
    /// `limit.requests` (counted per client IP beside the rule's own key), so a new token per request
    /// cannot escape the rule. Default 10; 0 turns it off. Not allowed on rules keyed by clientIp alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = sidecar_config::CLIENT_IP_CEILING_MAX))]
    pub client_ip_ceiling: Option<u32>,
}

/// Conditions a request must meet for a rule to apply; every condition given must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "[has(self.pathPrefix), has(self.pathExact), has(self.pathRegex)].filter(x, x).size() <= 1",
    "message": "match may name at most one of pathPrefix, pathExact and pathRegex"
}]))]
pub struct RuleMatchSpec {
    /// The path starts with this (e.g. `/api/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path_prefix: Option<String>,

    /// The path is exactly this (e.g. `/login`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024), regex(pattern = r"^/"))]
    pub path_exact: Option<String>,

    /// The path matches this regular expression (Rust `regex` syntax, RE2-like: no look-around or
    /// back-references). Unanchored unless written `^…$`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub path_regex: Option<String>,

    /// The path starts with none of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(min = 1, max = 1024), regex(pattern = r"^/")))]
    pub exclude_path_prefixes: Vec<String>,

    /// The method is one of these. Empty: any method.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub methods: Vec<HttpMethod>,

    /// The `Host` header, without port, equals this (case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[schemars(regex(pattern = r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$"))]
    pub host: Option<String>,

    /// The request carries this header, with any value (e.g. `Authorization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"))]
    pub header_present: Option<String>,
}

/// An HTTP method.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
#[allow(missing_docs)] // the variant names are the HTTP methods themselves
pub enum HttpMethod {
    Get,
    Head,
    Post,
    Put,
    Patch,
    Delete,
    Options,
    Connect,
    Trace,
}

impl HttpMethod {
    /// The method as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Get => "GET",
            Self::Head => "HEAD",
            Self::Post => "POST",
            Self::Put => "PUT",
            Self::Patch => "PATCH",
            Self::Delete => "DELETE",
            Self::Options => "OPTIONS",
            Self::Connect => "CONNECT",
            Self::Trace => "TRACE",
        }
    }
}

/// One part of a rule's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(self.type in ['header', 'hashedHeader']) || has(self.name)",
        "message": "key parts of type header and hashedHeader need name: the header whose value identifies the client"
    },
    {
        "rule": "!has(self.name) || self.type in ['header', 'hashedHeader', 'credential']",
        "message": "name is only used by key parts of type header, hashedHeader and credential",
        "fieldPath": ".name"
    }
]))]
pub struct KeyPartSpec {
    /// Where the value comes from: `clientIp` (the client address, grouped by prefix), `header`
    /// (the header's value), `hashedHeader` (a SHA-256 prefix of the header's value, so raw
    /// credentials never reach Redis or logs), `credential` (hashed `name` header, `Authorization` by
    /// default, when present; the client IP otherwise), `method` or `path`. Requests without the
    /// header of a `header` or `hashedHeader` part are not limited by the rule.
    #[serde(rename = "type")]
    pub source: KeySource,

    /// Header name, for `header`, `hashedHeader` and `credential`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"))]
    pub name: Option<String>,

    /// IPv4 clients are grouped by this prefix length (`clientIp` and `credential`): 32 keys each
    /// address, 24 a whole /24.
    #[serde(default = "default_ipv4_prefix")]
    #[schemars(range(min = 1, max = 32))]
    pub ipv4_prefix: u8,

    /// IPv6 clients are grouped by this prefix length (`clientIp` and `credential`), after
    /// IPv4-mapped addresses are unwrapped. 64 by default, because one host usually holds a whole /64.
    #[serde(default = "default_ipv6_prefix")]
    #[schemars(range(min = 1, max = 128))]
    pub ipv6_prefix: u8,
}

/// How many requests per window a rule allows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitSpec {
    /// Requests allowed per window; for `tokenBucket`, the refill rate is `requests / window`.
    #[schemars(range(min = 1, max = 1_000_000_000))]
    pub requests: u64,

    /// The window: a number and a unit (`ms`, `s`, `m`, `h`), e.g. `30s`, `1m`, `1h30m`. Between 1s
    /// and 24h.
    #[schemars(schema_with = "go_duration_schema")]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "duration(self) >= duration('1s')", "message": "limit.window must be at least 1s"},
        {"rule": "duration(self) <= duration('24h')", "message": "limit.window must be at most 24h"}
    ]))]
    pub window: Duration,

    /// `tokenBucket` only: requests allowed at once above the steady rate, like nginx `burst` with
    /// `nodelay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1_000_000_000))]
    pub burst: Option<u64>,
}

/// What the operator last observed and how far the policy has reached the pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimitPolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready` (rendered, published and enforced by every selected pod), `Degraded` (some pods
    /// lag, or Redis is unreachable) and `AppPortExposed` (a Service sends traffic to the app's own
    /// port, around the sidecar), with a reason and message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// Number of rules in the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<u32>,

    /// The ConfigMap holding the rendered sidecar config, mounted into governed pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<String>,

    /// The NetworkPolicy admitting ingress to the governed pods only through the sidecar, when
    /// `spec.networkPolicy.enabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<String>,

    /// Running pods governed by this policy.
    #[serde(default)]
    pub selected_pods: u32,

    /// Selected pods whose sidecar reports enforcing `observedGeneration` (a pod reporting a later one
    /// runs a config the operator never published, and is listed in `Degraded`).
    #[serde(default)]
    pub enforcing_pods: u32,

    /// `enforcingPods/selectedPods`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforcing: Option<String>,

    /// Which generation how many selected pods enforce, newest first. Pods that reported nothing
    /// recently are left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub generations: Vec<GenerationCount>,
}

/// How many pods enforce one generation of the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GenerationCount {
    /// A `metadata.generation` of the policy.
    pub generation: i64,
    /// Selected pods whose sidecar enforces it.
    pub pods: u32,
}

impl RateLimitPolicy {
    /// The `Ready` condition, if the status has one.
    pub fn ready_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == crate::conditions::READY)
    }
}

/// Schema of a duration that CEL's `duration()` can read as well: Go's units only (no `d`).
fn go_duration_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": "^([0-9]+(ms|s|m|h))+$",
    })
}

fn default_failure_mode() -> FailureMode {
    FailureMode::Local
}
fn default_expected_replicas() -> u32 {
    1
}
fn default_client_idle() -> Duration {
    sidecar_config::ClientTimeouts::default().idle
}
fn default_client_request_head() -> Duration {
    sidecar_config::ClientTimeouts::default().request_head
}
fn default_client_body() -> Duration {
    sidecar_config::ClientTimeouts::default().body
}
fn default_client_send() -> Duration {
    sidecar_config::ClientTimeouts::default().send
}
fn default_redis_timeout() -> Duration {
    sidecar_config::REDIS_TIMEOUT_DEFAULT
}
fn default_prefetch() -> u64 {
    sidecar_config::PREFETCH_DEFAULT
}
fn default_algorithm() -> Algorithm {
    Algorithm::FixedWindow
}
fn default_ipv4_prefix() -> u8 {
    32
}
fn default_ipv6_prefix() -> u8 {
    64
}
fn yes() -> bool {
    true
}
