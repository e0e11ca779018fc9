//! Rate-limit settings of the sidecar: where it listens, Redis, failure mode, client identity and rules.

use std::net::SocketAddr;

use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;

/// Default address the proxy listens on (`SLUICE_LISTEN`).
pub const LISTEN_DEFAULT: &str = "0.0.0.0:8080";
/// Default app address the proxy forwards to (`SLUICE_UPSTREAM`).
pub const UPSTREAM_DEFAULT: &str = "http://127.0.0.1:3000";
/// Default address of `/healthz`, `/readyz` and `/metrics`.
pub const ADMIN_LISTEN_DEFAULT: &str = "0.0.0.0:9901";
/// Default deadline of every Redis call: no request waits longer than this for Redis.
pub const REDIS_TIMEOUT_DEFAULT: Duration = Duration::from_millis(50);
/// Default largest request body forwarded (larger ones get 413).
pub const MAX_REQUEST_BODY_DEFAULT: u64 = 10 * 1024 * 1024;
/// Default of `limits.redis.prefetch`: most requests of a key's budget taken ahead in one call.
pub const PREFETCH_DEFAULT: u64 = 256;
/// Largest `limits.redis.prefetch`.
pub const PREFETCH_MAX: u64 = 100_000;
/// Default cap on in-process buckets (local fallback state).
pub const LOCAL_MAX_KEYS_DEFAULT: usize = 100_000;
/// `limits.maxConnections` when it is absent and the container has no memory limit.
pub const MAX_CONNECTIONS_UNLIMITED_MEMORY: u32 = 10_000;
/// Largest `limits.maxConnections`.
pub const MAX_CONNECTIONS_MAX: u32 = 1_000_000;

/// Rate limiting settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitsConfig {
    /// Address the proxy listens on; `SLUICE_LISTEN` overrides it.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Base URL of the app (on localhost in a pod); `SLUICE_UPSTREAM` overrides it.
    #[serde(default = "default_upstream")]
    pub upstream: String,
    /// HTTP version spoken to the app: `http1` (default), `h2c` (HTTP/2 without TLS, e.g. gRPC apps), or
    /// `matchClient` (h2c when the client spoke HTTP/2, HTTP/1.1 otherwise).
    #[serde(default, skip_serializing_if = "is_default")]
    pub upstream_protocol: UpstreamProtocol,
    /// Address of the health, readiness and metrics endpoints.
    #[serde(default = "default_admin_listen")]
    pub admin_listen: SocketAddr,
    /// Where counters live.
    #[serde(default)]
    pub redis: RedisConfig,
    /// What happens to traffic while Redis cannot answer within its deadline.
    #[serde(default)]
    pub failure_mode: FailureMode,
    /// Replicas expected to share the limits; local fallback allows `limit / expectedReplicas` each.
    #[serde(default = "one")]
    pub expected_replicas: u32,
    /// Hard cap on in-process buckets; idle buckets are evicted first, and evictions are counted.
    #[serde(default = "default_local_max_keys")]
    pub local_max_keys: usize,
    /// How the client address is found.
    #[serde(default)]
    pub client_ip: ClientIpConfig,
    /// Clients in these CIDRs are never limited.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_list: Vec<IpNet>,
    /// Which rate-limit headers responses carry.
    #[serde(default)]
    pub headers: HeadersConfig,
    /// Largest request body forwarded, in bytes; larger ones are answered 413.
    #[serde(default = "default_max_request_body")]
    pub max_request_body: u64,
    /// Logging of rejections (`RATE_LIMIT client_ip=… host=… path=… rule=… status=429`).
    #[serde(default)]
    pub rejection_log: RejectionLogConfig,
    /// How long in-flight requests may take to finish after SIGTERM.
    #[serde(default = "default_shutdown_grace")]
    pub shutdown_grace: Duration,
    /// How long client connections may keep the proxy waiting.
    #[serde(default)]
    pub client_timeouts: ClientTimeouts,
    /// Most client connections open at once; a connection over it is closed as soon as it is accepted.
    /// Absent: derived from the container's memory limit (its cgroup), so that connections cannot take
    /// the sidecar past it; [`MAX_CONNECTIONS_UNLIMITED_MEMORY`] without one. Either way at most what the
    /// process's file-descriptor limit allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    /// How request paths are read, by the rules and the app alike.
    #[serde(default)]
    pub paths: PathsConfig,
    /// Protocols a client may switch to (`Upgrade`), lower case. Other upgrade requests are forwarded as
    /// plain requests, without their `Upgrade` field. `h2c` is never allowed: after the switch, requests
    /// would go to the app through a tunnel the limiter never sees.
    #[serde(default = "default_upgrades")]
    pub upgrades: Vec<String>,
    /// The rules. Empty: the seed tiers (see [`default_rules`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            upstream: default_upstream(),
            upstream_protocol: UpstreamProtocol::default(),
            admin_listen: default_admin_listen(),
            redis: RedisConfig::default(),
            failure_mode: FailureMode::default(),
            expected_replicas: 1,
            local_max_keys: LOCAL_MAX_KEYS_DEFAULT,
            client_ip: ClientIpConfig::default(),
            allow_list: Vec::new(),
            headers: HeadersConfig::default(),
            max_request_body: MAX_REQUEST_BODY_DEFAULT,
            rejection_log: RejectionLogConfig::default(),
            shutdown_grace: default_shutdown_grace(),
            client_timeouts: ClientTimeouts::default(),
            max_connections: None,
            paths: PathsConfig::default(),
            upgrades: default_upgrades(),
            rules: Vec::new(),
        }
    }
}

/// HTTP version the proxy speaks to the app.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum UpstreamProtocol {
    /// HTTP/1.1 over keep-alive connections (one per client connection), whatever the client spoke.
    #[default]
    Http1,
    /// HTTP/2 with prior knowledge (cleartext), whatever the client spoke.
    H2c,
    /// The client's version: HTTP/2 clients are forwarded over h2c, HTTP/1.x clients over HTTP/1.1.
    MatchClient,
}

/// Redis connection. The URL normally comes from `SLUICE_REDIS_URL` (a Secret), not from the file.
///
/// URL schemes pick the topology: `redis://` (single node), `redis-sentinel://` (Sentinel),
/// `redis-cluster://` (Cluster); the same with `rediss` (`rediss://`, `rediss-sentinel://`,
/// `rediss-cluster://`) speak TLS, verifying the server against the system's CA certificates and
/// `caFile`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedisConfig {
    /// Redis URL; `SLUICE_REDIS_URL` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A PEM file of CA certificates trusted for a TLS Redis (`rediss` URLs), besides the system's
    /// (for a Redis whose certificate a private CA signed); `SLUICE_REDIS_CA_FILE` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<String>,
    /// Deadline of each Redis call.
    #[serde(default = "default_redis_timeout")]
    pub timeout: Duration,
    /// Consecutive failures that open the circuit breaker.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker stays open before one probe call is let through.
    #[serde(default = "default_breaker_cooldown")]
    pub breaker_cooldown: Duration,
    /// Connections in the pool (each pipelines many calls).
    #[serde(default = "default_pool_size")]
    pub pool_size: usize,
    /// Most requests of a key's budget one call may take ahead for this sidecar to spend in process: for
    /// a busy key (fixed window, sliding-window counter, token bucket), and up to 8 for any key far from
    /// its limit, however slow (fixed window, sliding-window counter). Never over the limit, and at most
    /// a quarter of what is left per replica; 0 makes every request wait for its own decision (at once
    /// on reload). See docs/rate-limiting.md, "Hot keys take their budget ahead".
    #[serde(default = "default_prefetch")]
    pub prefetch: u64,
    /// The key counter names are hashed with (`SLUICE_COUNTER_KEY`, from a Secret): never read from
    /// or written to a config file, so never in a ConfigMap or a config published through Redis.
    #[serde(skip)]
    pub counter_key: Option<CounterKey>,
}

/// The secret counter names in Redis are keyed with ([`crate::contract::env::COUNTER_KEY`]). Its
/// `Debug` shows only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct CounterKey(String);

impl CounterKey {
    /// `text` as a counter key, if it has at least
    /// [`COUNTER_KEY_MIN_LEN`](crate::contract::redis::COUNTER_KEY_MIN_LEN) characters and no
    /// whitespace at either end (a stray newline from `echo` into a Secret would give sidecars
    /// differing keys); else what is wrong, without the value.
    pub fn new(text: &str) -> Result<Self, String> {
        use crate::contract::redis::COUNTER_KEY_MIN_LEN;
        if text.trim() != text {
            return Err("has whitespace at its start or end".into());
        }
        let len = text.chars().count();
        if len < COUNTER_KEY_MIN_LEN {
            return Err(format!(
                "has {len} characters; at least {COUNTER_KEY_MIN_LEN} are needed"
            ));
        }
        Ok(Self(text.to_owned()))
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl std::fmt::Debug for CounterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CounterKey(<{} characters>)", self.0.chars().count())
    }
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            url: None,
            ca_file: None,
            timeout: REDIS_TIMEOUT_DEFAULT,
            breaker_failures: default_breaker_failures(),
            breaker_cooldown: default_breaker_cooldown(),
            pool_size: default_pool_size(),
            prefetch: PREFETCH_DEFAULT,
            counter_key: None,
        }
    }
}

/// What the sidecar does while Redis cannot decide (the CRD's `failureMode` and the config's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FailureMode {
    /// Let requests through unlimited (and say so in metrics).
    Open,
    /// Reject requests with 429 until Redis answers again.
    Closed,
    /// Limit in memory at `requests / expectedReplicas` per replica.
    #[default]
    Local,
}

/// How the client address is found.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientIpConfig {
    /// Peers whose `X-Forwarded-For` is believed. The client is the rightmost address not in these CIDRs;
    /// from any other peer the socket address is the client and the header is ignored.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusted_proxies: Vec<IpNet>,
}

/// How long a client connection may keep the proxy waiting — for its next request, for the rest of a
/// request, to take the response — before it is closed. No timeout applies while the app works on a
/// request (long polls and streams are the app's business).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientTimeouts {
    /// A kept-alive connection with no request for this long is closed. Keep it longer than the
    /// keep-alive timeout of whatever sends traffic here (load balancers and ingress proxies use 60 s to
    /// 10 min), or it may send a request on a connection just being closed.
    #[serde(default = "default_client_idle")]
    pub idle: Duration,
    /// A request head must arrive whole within this long of its first byte (slow-header attacks).
    #[serde(default = "default_request_head")]
    pub request_head: Duration,
    /// A client sending a request body may pause at most this long between two reads (nginx's
    /// `client_body_timeout`): a body trickled in holds an app connection, and often an app worker.
    #[serde(default = "default_client_io")]
    pub body: Duration,
    /// A client taking a response may leave it unread at most this long between two writes (nginx's
    /// `send_timeout`).
    #[serde(default = "default_client_io")]
    pub send: Duration,
}

impl Default for ClientTimeouts {
    fn default() -> Self {
        Self {
            idle: default_client_idle(),
            request_head: default_request_head(),
            body: default_client_io(),
            send: default_client_io(),
        }
    }
}

/// How request paths are read before rules match them. The app receives the path as the rules read it,
/// so the limiter and the app never read one request two ways (Envoy's `normalize_path`,
/// `merge_slashes` and `path_with_escaped_slashes_action` are the model). Paths that cannot be read one
/// way — a malformed or NUL escape, a backslash, a fragment, and by default an encoded slash — are
/// answered 400.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathsConfig {
    /// Decode percent-encoded unreserved characters (`%61` → `a`) and resolve `.` and `..` segments
    /// (RFC 3986 §6.2.2 and §5.2.4).
    #[serde(default = "yes")]
    pub normalize: bool,
    /// Merge repeated slashes (`/a//b` → `/a/b`).
    #[serde(default = "yes")]
    pub merge_slashes: bool,
    /// What an encoded slash or backslash (`%2F`, `%5C`) gets: `reject` (400) or `keep` (left encoded,
    /// read as data within a segment, never as a separator; for apps that route on the raw path and
    /// use them, such as npm's scoped packages).
    #[serde(default)]
    pub escaped_slashes: EscapedSlashes,
}

impl Default for PathsConfig {
    fn default() -> Self {
        Self {
            normalize: true,
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::default(),
        }
    }
}

/// What a request path's encoded slash or backslash gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum EscapedSlashes {
    /// 400 Bad Request: some apps decode them into separators, others do not.
    #[default]
    Reject,
    /// Left encoded and forwarded so.
    Keep,
}

/// Which rate-limit headers responses of limited routes carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeadersConfig {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    #[serde(default = "yes")]
    pub legacy: bool,
    /// IETF draft `RateLimit-Policy` and `RateLimit` fields.
    #[serde(default = "yes")]
    pub draft: bool,
}

impl Default for HeadersConfig {
    fn default() -> Self {
        Self {
            legacy: true,
            draft: true,
        }
    }
}

/// Logging of rejected requests, itself rate limited so an attack cannot flood the logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RejectionLogConfig {
    /// `text` (`RATE_LIMIT client_ip=…`) or `json`.
    #[serde(default)]
    pub format: LogFormat,
    /// Most rejection lines logged per second; the rest are counted in metrics only.
    #[serde(default = "default_rejection_log_per_second")]
    pub per_second: u32,
}

impl Default for RejectionLogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            per_second: default_rejection_log_per_second(),
        }
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LogFormat {
    /// `RATE_LIMIT client_ip=… host=… path=… rule=… status=429`
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// One rate-limit rule. Every rule whose `match` fits a request applies; all must allow it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rule {
    /// Unique within the config; part of the Redis key, so renaming a rule starts fresh counters.
    pub name: String,
    /// Which requests the rule applies to. Empty: all.
    #[serde(default, rename = "match")]
    pub matches: RuleMatch,
    /// What identifies a client: the parts are joined. Empty: the client IP.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key: Vec<KeyPart>,
    /// The counting algorithm.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// How many requests per window.
    pub limit: Limit,
    /// Count and report, but never reject (dry run).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shadow: bool,
    /// For a rule whose key holds a value the client picks (`credential`, `header`, `hashedHeader`): the
    /// most one client IP may make under the rule across all the values it sends, as a multiple of the
    /// limit (a second counter per client IP, same window and algorithm), so rotating tokens cannot
    /// escape the rule. Absent: [`CLIENT_IP_CEILING_DEFAULT`]; `0` turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_ip_ceiling: Option<u32>,
}

impl Rule {
    /// Whether the rule's key holds a value the client picks (a header's).
    pub fn keyed_by_client_value(&self) -> bool {
        self.key.iter().any(|p| {
            matches!(
                p.source,
                KeySource::Credential | KeySource::Header | KeySource::HashedHeader
            )
        })
    }

    /// The ceiling per client IP in force: the multiple of the limit, or `None` when there is none (the
    /// key holds no client-picked value, or the rule turned it off).
    pub fn ceiling(&self) -> Option<u32> {
        if !self.keyed_by_client_value() {
            return None;
        }
        match self.client_ip_ceiling.unwrap_or(CLIENT_IP_CEILING_DEFAULT) {
            0 => None,
            n => Some(n),
        }
    }
}

/// Default of a rule's `clientIpCeiling`: one client IP gets at most this many times the limit across
/// the credentials (or header values) it sends — room for several users behind one NAT, no room for
/// a bucket per random token.
pub const CLIENT_IP_CEILING_DEFAULT: u32 = 10;
/// Largest `clientIpCeiling`.
pub const CLIENT_IP_CEILING_MAX: u32 = 1000;

/// Conditions a request must meet for a rule to apply; all given conditions must hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuleMatch {
    /// The path starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The path is exactly this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_exact: Option<String>,
    /// The path matches this regular expression (Rust `regex` syntax, unanchored unless written `^…$`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_regex: Option<String>,
    /// The path starts with none of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_path_prefixes: Vec<String>,
    /// The method is one of these (upper case). Empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    /// The Host (without port) equals this, case-insensitively.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The request carries this header (any value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_present: Option<String>,
}

/// One part of a rule's key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyPart {
    /// Where the value comes from.
    #[serde(rename = "type")]
    pub source: KeySource,
    /// Header name, for `header`, `hashedHeader` and `credential` (default `Authorization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Prefix length IPv4 clients are grouped by, for `clientIp` and `credential`.
    #[serde(default = "default_ipv4_prefix")]
    pub ipv4_prefix: u8,
    /// Prefix length IPv6 clients are grouped by (after unwrapping IPv4-mapped addresses).
    #[serde(default = "default_ipv6_prefix")]
    pub ipv6_prefix: u8,
}

/// Where a key part's value comes from (the CRD's `key[].type` and the config's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum KeySource {
    /// The client address, masked to `ipv4Prefix`/`ipv6Prefix`.
    ClientIp,
    /// The value of header `name`. A request without it is not limited by this rule.
    Header,
    /// A SHA-256 prefix of header `name`: raw credentials never reach Redis or logs. A request without
    /// the header is not limited by this rule.
    HashedHeader,
    /// A SHA-256 prefix of header `name` (default `Authorization`) when present, the client IP otherwise
    /// (the seed tiers' key).
    Credential,
    /// The request method.
    Method,
    /// The request path.
    Path,
}

/// The counting algorithm of a rule (the CRD's `algorithm` and the config's). Each has a Lua script and
/// an in-process twin in the sidecar's `limiter::algorithm`; adding one is a variant here, its script,
/// its `Algorithm` impl and one line in that module's list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Algorithm {
    /// A counter per aligned window. Cheapest; allows up to twice the limit across a window edge.
    #[default]
    FixedWindow,
    /// Exact: a log of request times over the last window. Memory grows with the limit.
    SlidingLog,
    /// A weighted estimate from the current and previous window's counters (Cloudflare's).
    SlidingCounter,
    /// Token bucket (GCRA) with `limit.burst`, like nginx `limit_req burst=N nodelay`.
    TokenBucket,
}

impl Algorithm {
    /// Whether rules of this algorithm take `limit.burst`.
    pub fn takes_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket)
    }
}

/// How many requests per window a rule allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limit {
    /// Requests allowed per window (for `tokenBucket`: the refill rate is `requests / window`).
    pub requests: u64,
    /// The window length; any length (`30s`, `5m`, `1h30m`).
    pub window: Duration,
    /// `tokenBucket` only: requests allowed above the rate at once, like nginx `burst` with `nodelay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
}

/// Paths of the native package-protocol adapters the seed `protocol` tier covers.
pub const PROTOCOL_PATH_PREFIXES: [&str; 8] = [
    "/npm/",
    "/pypi/",
    "/cargo/",
    "/nuget/",
    "/oci/",
    "/rubygems/",
    "/maven/",
    "/composer/",
];

/// Per-minute limits of the seed tiers, overridable by `RATE_LIMIT__*` env vars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierLimits {
    /// `RATE_LIMIT__AUTH_REQUESTS_PER_MINUTE` (10): `/v1/auth/*`.
    pub auth: u64,
    /// `RATE_LIMIT__WRITE_REQUESTS_PER_MINUTE` (60): POST, PUT, PATCH, DELETE.
    pub write: u64,
    /// `RATE_LIMIT__READ_REQUESTS_PER_MINUTE` (300): GET, HEAD.
    pub read: u64,
    /// `RATE_LIMIT__PROTOCOL_REQUESTS_PER_MINUTE` (1000): GET, HEAD under the protocol prefixes.
    pub protocol: u64,
}

impl Default for TierLimits {
    fn default() -> Self {
        Self {
            auth: 10,
            write: 60,
            read: 300,
            protocol: 1000,
        }
    }
}

/// The four seed tiers, the rules a sidecar runs when its config names none. `write`, `read` and
/// `protocol` are keyed by a SHA-256 prefix of `Authorization` for authenticated requests, the client IP
/// otherwise, with the default ceiling per client IP. `auth` is keyed by the client IP whatever the
/// request carries: its routes (login, token exchange) are where a client is not yet authenticated, so an
/// `Authorization` value there proves nothing and a fresh one per attempt would be a fresh bucket per
/// attempt (credential stuffing). This departs from the seed, which keyed every tier by `Authorization`.
///
/// The read tier is for control-plane reads and the protocol tier for adapter reads, so a read
/// under a protocol prefix counts against the protocol tier only.
pub fn default_rules(t: TierLimits) -> Vec<Rule> {
    let per_minute = |requests| Limit {
        requests,
        window: Duration::from_secs(60),
        burst: None,
    };
    let rule = |name: &str, matches, requests| Rule {
        name: name.into(),
        matches,
        key: vec![KeyPart {
            source: KeySource::Credential,
            ..KeyPart::client_ip()
        }],
        algorithm: Algorithm::FixedWindow,
        limit: per_minute(requests),
        shadow: false,
        client_ip_ceiling: None,
    };
    let methods = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let protocol_regex = format!(
        "^({})",
        PROTOCOL_PATH_PREFIXES
            .iter()
            .map(|p| regex::escape(p))
            .collect::<Vec<_>>()
            .join("|")
    );
    let auth = Rule {
        key: vec![KeyPart::client_ip()],
        ..rule(
            "auth",
            RuleMatch {
                path_prefix: Some("/v1/auth/".into()),
                ..Default::default()
            },
            t.auth,
        )
    };
    vec![
        auth,
        rule(
            "write",
            RuleMatch {
                methods: methods(&["POST", "PUT", "PATCH", "DELETE"]),
                ..Default::default()
            },
            t.write,
        ),
        rule(
            "read",
            RuleMatch {
                methods: methods(&["GET", "HEAD"]),
                exclude_path_prefixes: PROTOCOL_PATH_PREFIXES.iter().map(|p| p.to_string()).collect(),
                ..Default::default()
            },
            t.read,
        ),
        rule(
            "protocol",
            RuleMatch {
                methods: methods(&["GET", "HEAD"]),
                path_regex: Some(protocol_regex),
                ..Default::default()
            },
            t.protocol,
        ),
    ]
}

impl KeyPart {
    /// The client IP grouped by the default prefixes (/32 for IPv4, /64 for IPv6).
    pub fn client_ip() -> Self {
        Self {
            source: KeySource::ClientIp,
            name: None,
            ipv4_prefix: default_ipv4_prefix(),
            ipv6_prefix: default_ipv6_prefix(),
        }
    }
}

fn default_listen() -> SocketAddr {
    LISTEN_DEFAULT.parse().expect("valid default")
}
fn default_upstream() -> String {
    UPSTREAM_DEFAULT.into()
}
fn default_admin_listen() -> SocketAddr {
    ADMIN_LISTEN_DEFAULT.parse().expect("valid default")
}
fn default_redis_timeout() -> Duration {
    REDIS_TIMEOUT_DEFAULT
}
fn default_breaker_failures() -> u32 {
    3
}
fn default_breaker_cooldown() -> Duration {
    Duration::from_millis(500)
}
fn default_prefetch() -> u64 {
    PREFETCH_DEFAULT
}

fn default_pool_size() -> usize {
    4
}
fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}
fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}
fn default_local_max_keys() -> usize {
    LOCAL_MAX_KEYS_DEFAULT
}
fn default_max_request_body() -> u64 {
    MAX_REQUEST_BODY_DEFAULT
}
fn default_shutdown_grace() -> Duration {
    Duration::from_secs(25)
}
fn default_client_idle() -> Duration {
    Duration::from_secs(15 * 60)
}
fn default_request_head() -> Duration {
    Duration::from_secs(60)
}
fn default_client_io() -> Duration {
    Duration::from_secs(60)
}
fn default_upgrades() -> Vec<String> {
    vec!["websocket".into()]
}
fn default_rejection_log_per_second() -> u32 {
    10
}
fn default_ipv4_prefix() -> u8 {
    32
}
fn default_ipv6_prefix() -> u8 {
    64
}
