//! Invalid RateLimitPolicy and JobQueue objects, each with the field the API server's refusal names and
//! a word of what it says (`e2e/tests/bad_input_crs.rs` creates each on the test API server with Sluice's
//! CRDs installed). Data only: the count of bad inputs in docs/security.md reads this table too.
//!
//! `spec` is YAML merged over a valid spec of the kind (a key set to `null` is removed); `name`, when
//! given, replaces the object's name.

/// One invalid object.
pub struct Case {
    pub kind: Kind,
    pub name: Option<&'static str>,
    /// YAML merged over the valid spec.
    pub spec: &'static str,
    /// The field the refusal names.
    pub field: &'static str,
    /// Words the refusal's cause for that field contains.
    pub says: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    RateLimitPolicy,
    JobQueue,
}

const fn rlp(spec: &'static str, field: &'static str, says: &'static str) -> Case {
    Case {
        kind: Kind::RateLimitPolicy,
        name: None,
        spec,
        field,
        says,
    }
}

const fn jq(spec: &'static str, field: &'static str, says: &'static str) -> Case {
    Case {
        kind: Kind::JobQueue,
        name: None,
        spec,
        field,
        says,
    }
}

/// A rule list of one rule, `rule` merged into `{name: all, limit: {requests: 100, window: 1m}}` by hand.
pub const CASES: &[Case] = &[
    // RateLimitPolicy: the object.
    Case {
        kind: Kind::RateLimitPolicy,
        name: Some("a-policy-name-that-is-longer-than-sixty-three-characters-for-sure"),
        spec: "{}",
        field: "",
        says: "at most 63 characters",
    },
    rlp("{redis: null}", "spec.redis", "Required value"),
    rlp("{rules: null}", "spec.rules", "Required value"),
    rlp("{rules: []}", "spec.rules", "at least 1 item"),
    rlp("{rules: all}", "spec.rules", "must be of type array"),
    rlp("{failureMode: fail}", "spec.failureMode", "Unsupported value"),
    rlp(
        "{expectedReplicas: 0}",
        "spec.expectedReplicas",
        "greater than or equal to 1",
    ),
    rlp(
        "{expectedReplicas: 10001}",
        "spec.expectedReplicas",
        "less than or equal to 10000",
    ),
    rlp(
        "{expectedReplicas: two}",
        "spec.expectedReplicas",
        "must be of type integer",
    ),
    // Redis.
    rlp(
        "{redis: {secretRef: null}}",
        "spec.redis.secretRef",
        "Required value",
    ),
    rlp(
        "{redis: {secretRef: {name: redis}, timeout: 10s}}",
        "spec.redis.timeout",
        "between 1ms and 5s",
    ),
    rlp(
        "{redis: {secretRef: {name: redis}, timeout: 0s}}",
        "spec.redis.timeout",
        "between 1ms and 5s",
    ),
    rlp(
        "{redis: {secretRef: {name: redis}, timeout: fast}}",
        "spec.redis.timeout",
        "should match",
    ),
    rlp(
        "{maxConnections: 0}",
        "spec.maxConnections",
        "greater than or equal to 1",
    ),
    rlp(
        "{maxConnections: 2000000}",
        "spec.maxConnections",
        "less than or equal to 1000000",
    ),
    rlp(
        "{clientTimeouts: {idle: 0s}}",
        "spec.clientTimeouts.idle",
        "between 1ms and 24h",
    ),
    rlp(
        "{clientTimeouts: {requestHead: 25h}}",
        "spec.clientTimeouts.requestHead",
        "between 1ms and 24h",
    ),
    rlp(
        "{clientTimeouts: {body: 0ms}}",
        "spec.clientTimeouts.body",
        "between 1ms and 24h",
    ),
    rlp(
        "{clientTimeouts: {send: forever}}",
        "spec.clientTimeouts.send",
        "should match",
    ),
    rlp(
        "{redis: {secretRef: {name: redis}, prefetch: 200000}}",
        "spec.redis.prefetch",
        "less than or equal to 100000",
    ),
    rlp(
        "{redis: {secretRef: {name: redis}, prefetch: -1}}",
        "spec.redis.prefetch",
        "greater than or equal to 0",
    ),
    // Addresses.
    rlp("{allowList: [10.0.0.1]}", "spec.allowList", "must be CIDRs"),
    rlp("{allowList: [10.0.0.0/33]}", "spec.allowList", "must be CIDRs"),
    rlp(
        "{clientIp: {trustedProxies: [proxy.internal]}}",
        "spec.clientIp.trustedProxies",
        "must be CIDRs",
    ),
    rlp(
        "{clientIp: {trustedProxies: ['fd00::/129']}}",
        "spec.clientIp.trustedProxies",
        "must be CIDRs",
    ),
    // Rules.
    rlp(
        "{rules: [{name: a, limit: {requests: 1, window: 1m}}, {name: a, limit: {requests: 2, window: 1m}}]}",
        "spec.rules",
        "unique within a policy",
    ),
    rlp(
        "{rules: [{name: Bad_Name, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].name",
        "should match",
    ),
    rlp(
        "{rules: [{name: '', limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].name",
        "at least 1 chars long",
    ),
    rlp(
        "{rules: [{limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].name",
        "Required value",
    ),
    rlp("{rules: [{name: a}]}", "spec.rules[0].limit", "Required value"),
    rlp(
        "{rules: [{name: a, limit: {requests: 0, window: 1m}}]}",
        "spec.rules[0].limit.requests",
        "greater than or equal to 1",
    ),
    rlp(
        "{rules: [{name: a, limit: {requests: 1, window: 500ms}}]}",
        "spec.rules[0].limit.window",
        "at least 1s",
    ),
    rlp(
        "{rules: [{name: a, limit: {requests: 1, window: 25h}}]}",
        "spec.rules[0].limit.window",
        "at most 24h",
    ),
    rlp(
        "{rules: [{name: a, limit: {requests: 1, window: 5 minutes}}]}",
        "spec.rules[0].limit.window",
        "should match",
    ),
    rlp(
        "{rules: [{name: a, limit: {requests: 1}}]}",
        "spec.rules[0].limit.window",
        "Required value",
    ),
    rlp(
        "{rules: [{name: a, limit: {requests: 1, window: 1m, burst: 5}}]}",
        "spec.rules[0].limit.burst",
        "only allowed with algorithm tokenBucket",
    ),
    rlp(
        "{rules: [{name: a, algorithm: slidingLog, limit: {requests: 20000, window: 1m}}]}",
        "spec.rules[0].limit.requests",
        "at most 10000 requests per window",
    ),
    rlp(
        "{rules: [{name: a, limit: {requests: 1000000000, window: 24h}}]}",
        "spec.rules[0].limit",
        "must stay below 2^53",
    ),
    rlp(
        "{rules: [{name: a, algorithm: tokenBucket, limit: {requests: 1, window: 24h, burst: 200000000}}]}",
        "spec.rules[0].limit",
        "must stay below 2^53",
    ),
    rlp(
        "{rules: [{name: a, key: [{type: credential}], limit: {requests: 100000000, window: 24h}}]}",
        "spec.rules[0].clientIpCeiling",
        "must stay below 2^53",
    ),
    rlp(
        "{rules: [{name: a, algorithm: leakyBucket, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].algorithm",
        "Unsupported value",
    ),
    rlp(
        "{rules: [{name: a, match: {pathPrefix: /a, pathExact: /b}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match",
        "at most one of pathPrefix, pathExact and pathRegex",
    ),
    rlp(
        "{rules: [{name: a, match: {pathPrefix: v1/}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match.pathPrefix",
        "should match",
    ),
    rlp(
        "{rules: [{name: a, match: {pathExact: ''}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match.pathExact",
        "at least 1 chars long",
    ),
    rlp(
        "{rules: [{name: a, match: {excludePathPrefixes: [npm]}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match.excludePathPrefixes[0]",
        "should match",
    ),
    rlp(
        "{rules: [{name: a, match: {methods: [FETCH]}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match.methods[0]",
        "Unsupported value",
    ),
    rlp(
        "{rules: [{name: a, match: {methods: [get]}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match.methods[0]",
        "Unsupported value",
    ),
    rlp(
        "{rules: [{name: a, match: {host: 'api.example.com:443'}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match.host",
        "should match",
    ),
    rlp(
        "{rules: [{name: a, match: {headerPresent: 'X Key'}, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].match.headerPresent",
        "should match",
    ),
    rlp(
        "{rules: [{name: a, key: [{type: header}], limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].key[0]",
        "need name",
    ),
    rlp(
        "{rules: [{name: a, key: [{type: clientIp, name: X-Key}], limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].key[0].name",
        "name is only used by",
    ),
    rlp(
        "{rules: [{name: a, key: [{type: cookie}], limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].key[0].type",
        "Unsupported value",
    ),
    rlp(
        "{rules: [{name: a, key: [{type: clientIp, ipv4Prefix: 33}], limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].key[0].ipv4Prefix",
        "less than or equal to 32",
    ),
    rlp(
        "{rules: [{name: a, key: [{type: clientIp, ipv6Prefix: 129}], limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].key[0].ipv6Prefix",
        "less than or equal to 128",
    ),
    rlp(
        "{rules: [{name: a, key: [{type: clientIp}], clientIpCeiling: 5, limit: {requests: 1, window: 1m}}]}",
        "spec.rules[0].clientIpCeiling",
        "clientIpCeiling is for rules keyed by",
    ),
    // JobQueue.
    Case {
        kind: Kind::JobQueue,
        name: Some("a-job-queue-name-longer-than-fifty-two-characters-xyz"),
        spec: "{}",
        field: "",
        says: "at most 52 characters",
    },
    jq("{database: null}", "spec.database", "Required value"),
    jq("{worker: null}", "spec.worker", "Required value"),
    jq("{queueName: 'bad name'}", "spec.queueName", "should match"),
    jq("{queueName: ''}", "spec.queueName", "at least 1 chars long"),
    jq(
        "{worker: {template: {spec: {containers: [{name: h, image: h}]}}, concurrency: 0}}",
        "spec.worker.concurrency",
        "greater than or equal to 1",
    ),
    jq(
        "{worker: {template: {spec: {containers: [{name: h, image: h}]}}, jobTimeout: 48h}}",
        "spec.worker.jobTimeout",
        "between 1s and 24h",
    ),
    jq(
        "{worker: {template: {spec: {containers: [{name: h, image: h}]}}, leaseDuration: 2h}}",
        "spec.worker.leaseDuration",
        "between 1s and 1h",
    ),
    jq(
        "{worker: {template: {spec: {containers: [{name: h, image: h}]}}, handler: {port: 0}}}",
        "spec.worker.handler.port",
        "greater than or equal to 1",
    ),
    jq(
        "{worker: {template: {spec: {containers: [{name: h, image: h}]}}, handler: {path: jobs}}}",
        "spec.worker.handler.path",
        "should match",
    ),
    jq(
        "{worker: {template: {spec: {containers: [{name: h, image: h}]}}, handler: {permanentFailureStatuses: [200]}}}",
        "spec.worker.handler.permanentFailureStatuses[0]",
        "greater than or equal to 400",
    ),
    jq(
        "{retry: {maxAttempts: 0}}",
        "spec.retry.maxAttempts",
        "greater than or equal to 1",
    ),
    jq(
        "{retry: {backoff: {base: 10m, cap: 1s}}}",
        "spec.retry.backoff",
        "at least retry.backoff.base",
    ),
    jq(
        "{retry: {backoff: {multiplier: 0.5}}}",
        "spec.retry.backoff.multiplier",
        "greater than or equal to 1",
    ),
    jq(
        "{scaling: {minReplicaCount: 5, maxReplicaCount: 2}}",
        "spec.scaling",
        "must not exceed scaling.maxReplicaCount",
    ),
    jq(
        "{scaling: {maxReplicaCount: 0}}",
        "spec.scaling.maxReplicaCount",
        "greater than or equal to 1",
    ),
    jq(
        "{scaling: {pollingInterval: 2h}}",
        "spec.scaling.pollingInterval",
        "between 1s and 1h",
    ),
    jq(
        "{scaling: {cooldownPeriod: 48h}}",
        "spec.scaling.cooldownPeriod",
        "at most 24h",
    ),
    jq(
        "{scaling: {provider: hpa}}",
        "spec.scaling.provider",
        "Unsupported value",
    ),
];
