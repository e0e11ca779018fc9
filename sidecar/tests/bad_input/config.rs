//! Invalid sidecar configs, each with the field its refusal names and a word of what it says
//! (`sidecar/tests/bad_input_config.rs` runs them through `--check-config` and a hot reload). Data only:
//! the count of bad inputs in docs/security.md reads this table too.

/// One invalid config file.
pub struct Case {
    pub yaml: &'static str,
    /// The field the refusal names (`-` for the file as a whole).
    pub field: &'static str,
    /// Words the refusal's line for that field contains.
    pub says: &'static str,
}

const fn case(yaml: &'static str, field: &'static str, says: &'static str) -> Case {
    Case { yaml, field, says }
}

pub const CASES: &[Case] = &[
    // The document.
    case(
        "version: 1\nlimits: {rules: [}\n",
        "limits.rules",
        "did not find expected node content",
    ),
    case(
        "version: 1\nlimits: \"unterminated\n",
        "limits",
        "unexpected end of stream",
    ),
    case(
        "version: 1\nlimits: &a\n  rules: *b\n",
        "limits.rules",
        "unknown anchor",
    ),
    case("version: 1\n\tlimits: {}\n", "-", "tab"),
    case("- version: 1\n", "-", "invalid type"),
    case("version: 1\nversion: 1\n", "-", "duplicate"),
    case("just text\n", "-", "invalid type"),
    case("version: 2\n", "version", "reads version 1"),
    case("version: 0\n", "version", "reads version 1"),
    case("version: one\n", "version", "invalid type"),
    case("version: -1\n", "version", "invalid type"),
    case("version: 1\nlimit: {}\n", "limit", "unknown field"),
    case(
        "version: 1\nlimits:\n  rulez: []\n",
        "limits.rulez",
        "unknown field",
    ),
    // The policy it was rendered from.
    case(
        "version: 1\npolicy: {namespace: Shop, name: api}\n",
        "policy.namespace",
        "namespace",
    ),
    case(
        "version: 1\npolicy: {namespace: shop, name: Api_1}\n",
        "policy.name",
        "object name",
    ),
    case(
        "version: 1\npolicy: {namespace: shop, name: api, generation: -3}\n",
        "policy.generation",
        "must not be negative",
    ),
    case(
        "version: 1\npolicy: {namespace: shop}\n",
        "policy",
        "missing field `name`",
    ),
    case(
        "version: 1\npolicy: {namespace: shop, name: api, uid: x}\n",
        "policy.uid",
        "unknown field",
    ),
    // Connections.
    case(
        "version: 1\nlimits:\n  upstream: ftp://app:21\n",
        "limits.upstream",
        "http://",
    ),
    case(
        "version: 1\nlimits:\n  upstream: http://app:8080/base\n",
        "limits.upstream",
        "path",
    ),
    case(
        "version: 1\nlimits:\n  upstream: 'http://app:8080/?x=1'\n",
        "limits.upstream",
        "query",
    ),
    case(
        "version: 1\nlimits:\n  upstream: not a url\n",
        "limits.upstream",
        "not a URL",
    ),
    case(
        "version: 1\nlimits:\n  listen: 0.0.0.0\n",
        "limits.listen",
        "invalid socket address",
    ),
    case(
        "version: 1\nlimits:\n  adminListen: localhost:9901\n",
        "limits.adminListen",
        "invalid socket address",
    ),
    case(
        "version: 1\nlimits:\n  listen: 0.0.0.0:8080\n  adminListen: 0.0.0.0:8080\n",
        "limits.adminListen",
        "must differ",
    ),
    case(
        "version: 1\nlimits:\n  redis: {url: 'memcached://x:1'}\n",
        "limits.redis.url",
        "scheme",
    ),
    case(
        "version: 1\nlimits:\n  redis: {url: 'redis://'}\n",
        "limits.redis.url",
        "host",
    ),
    case(
        "version: 1\nlimits:\n  redis: {url: 'rediss://r:6380', caFile: ca.pem}\n",
        "limits.redis.caFile",
        "absolute path",
    ),
    case(
        "version: 1\nlimits:\n  redis: {url: 'redis://r:6379', caFile: /etc/ca.pem}\n",
        "limits.redis.caFile",
        "rediss",
    ),
    case(
        "version: 1\nlimits:\n  redis: {timeout: 0s}\n",
        "limits.redis.timeout",
        "between 1ms and",
    ),
    case(
        "version: 1\nlimits:\n  redis: {timeout: 6s}\n",
        "limits.redis.timeout",
        "between 1ms and",
    ),
    case(
        "version: 1\nlimits:\n  redis: {timeout: fast}\n",
        "limits.redis.timeout",
        "duration",
    ),
    case(
        "version: 1\nlimits:\n  redis: {breakerFailures: 0}\n",
        "limits.redis.breakerFailures",
        "at least 1",
    ),
    case(
        "version: 1\nlimits:\n  redis: {breakerCooldown: 0s}\n",
        "limits.redis.breakerCooldown",
        "longer than 0s",
    ),
    case(
        "version: 1\nlimits:\n  redis: {poolSize: 0}\n",
        "limits.redis.poolSize",
        "between 1 and 64",
    ),
    case(
        "version: 1\nlimits:\n  redis: {poolSize: 65}\n",
        "limits.redis.poolSize",
        "between 1 and 64",
    ),
    case(
        "version: 1\nlimits:\n  redis: {prefetch: 1000000}\n",
        "limits.redis.prefetch",
        "at most 100000",
    ),
    case(
        "version: 1\nlimits:\n  redis: {prefetch: -1}\n",
        "limits.redis.prefetch",
        "invalid type",
    ),
    // Limits as a whole.
    case(
        "version: 1\nlimits:\n  expectedReplicas: 0\n",
        "limits.expectedReplicas",
        "at least 1",
    ),
    case(
        "version: 1\nlimits:\n  expectedReplicas: lots\n",
        "limits.expectedReplicas",
        "invalid type",
    ),
    case(
        "version: 1\nlimits:\n  localMaxKeys: 0\n",
        "limits.localMaxKeys",
        "at least 1",
    ),
    case(
        "version: 1\nlimits:\n  maxRequestBody: 0\n",
        "limits.maxRequestBody",
        "at least 1 byte",
    ),
    case(
        "version: 1\nlimits:\n  maxRequestBody: 10MiB\n",
        "limits.maxRequestBody",
        "invalid type",
    ),
    case(
        "version: 1\nlimits:\n  shutdownGrace: 1d\n",
        "limits.shutdownGrace",
        "at most",
    ),
    case(
        "version: 1\nlimits:\n  failureMode: fail\n",
        "limits.failureMode",
        "unknown variant",
    ),
    case(
        "version: 1\nlimits:\n  clientTimeouts: {idle: 0s}\n",
        "limits.clientTimeouts.idle",
        "longer than 0s",
    ),
    case(
        "version: 1\nlimits:\n  clientTimeouts: {requestHead: 48h}\n",
        "limits.clientTimeouts.requestHead",
        "at most",
    ),
    case(
        "version: 1\nlimits:\n  clientTimeouts: {body: 0s}\n",
        "limits.clientTimeouts.body",
        "longer than 0s",
    ),
    case(
        "version: 1\nlimits:\n  clientTimeouts: {send: 0s}\n",
        "limits.clientTimeouts.send",
        "longer than 0s",
    ),
    case(
        "version: 1\nlimits:\n  clientTimeouts: {idle: 5 minutes}\n",
        "limits.clientTimeouts.idle",
        "duration",
    ),
    case(
        "version: 1\nlimits:\n  upgrades: [h2c]\n",
        "limits.upgrades[0]",
        "h2c cannot be allowed",
    ),
    case(
        "version: 1\nlimits:\n  upgrades: [WebSocket]\n",
        "limits.upgrades[0]",
        "lower case",
    ),
    case(
        "version: 1\nlimits:\n  upgrades: ['web socket']\n",
        "limits.upgrades[0]",
        "not a protocol name",
    ),
    case(
        "version: 1\nlimits:\n  upgrades: ['']\n",
        "limits.upgrades[0]",
        "not a protocol name",
    ),
    case(
        "version: 1\nlimits:\n  paths: {escapedSlashes: decode}\n",
        "limits.paths.escapedSlashes",
        "unknown variant",
    ),
    case(
        "version: 1\nlimits:\n  paths: {normalise: true}\n",
        "limits.paths.normalise",
        "unknown field",
    ),
    case(
        "version: 1\nlimits:\n  clientIp: {trustedProxies: [10.0.0.0/33]}\n",
        "limits.clientIp.trustedProxies[0]",
        "invalid IP address",
    ),
    case(
        "version: 1\nlimits:\n  clientIp: {trustedProxies: [proxy.internal]}\n",
        "limits.clientIp.trustedProxies[0]",
        "invalid IP address",
    ),
    case(
        "version: 1\nlimits:\n  allowList: [300.0.0.0/8]\n",
        "limits.allowList[0]",
        "invalid IP address",
    ),
    case(
        "version: 1\nlimits:\n  headers: {legacy: maybe}\n",
        "limits.headers.legacy",
        "invalid type",
    ),
    // Rules.
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: Bad_Name, limit: {requests: 5, window: 1m}}\n",
        "limits.rules[0].name",
        "DNS label",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: '', limit: {requests: 5, window: 1m}}\n",
        "limits.rules[0].name",
        "must not be empty",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: -a, limit: {requests: 5, window: 1m}}\n",
        "limits.rules[0].name",
        "DNS label",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 5, window: 1m}}\n  - {name: a, limit: {requests: 6, window: 1m}}\n",
        "limits.rules[1].name",
        "unique",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {limit: {requests: 5, window: 1m}}\n",
        "limits.rules[0]",
        "missing field `name`",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a}\n",
        "limits.rules[0]",
        "missing field `limit`",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 0, window: 1m}}\n",
        "limits.rules[0].limit.requests",
        "at least 1",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: -5, window: 1m}}\n",
        "limits.rules[0].limit.requests",
        "invalid type",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 999999999999, window: 1m}}\n",
        "limits.rules[0].limit",
        "below 2^53",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 1000000000, window: 24h}}\n",
        "limits.rules[0].limit",
        "below 2^53",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: credential}], limit: {requests: 1000000000, window: 1h}}\n",
        "limits.rules[0].clientIpCeiling",
        "below 2^53",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 1, window: 500ms}}\n",
        "limits.rules[0].limit.window",
        "between 1s and 1d",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 1, window: 25h}}\n",
        "limits.rules[0].limit.window",
        "between 1s and 1d",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 1, window: 5 minutes}}\n",
        "limits.rules[0].limit.window",
        "not a duration",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 1, window: 60}}\n",
        "limits.rules[0].limit.window",
        "duration",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 1, window: 1m, burst: 5}}\n",
        "limits.rules[0].limit.burst",
        "only tokenBucket rules take a burst",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, algorithm: tokenBucket, limit: {requests: 1, window: 1m, burst: 0}}\n",
        "limits.rules[0].limit.burst",
        "at least 1 when given",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, algorithm: leakyFaucet, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].algorithm",
        "unknown variant",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, limit: {requests: 1, window: 1m, brust: 3}}\n",
        "limits.rules[0].limit.brust",
        "unknown field",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {pathPrefix: v1/}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.pathPrefix",
        "must start with '/'",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {pathExact: login}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.pathExact",
        "must start with '/'",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {pathRegex: '(unclosed'}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.pathRegex",
        "does not compile",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {pathRegex: 'a{1000}{1000}'}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.pathRegex",
        "does not compile",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {excludePathPrefixes: [/ok, npm]}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.excludePathPrefixes[1]",
        "must start with '/'",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {methods: [get]}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.methods[0]",
        "not a known method",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {methods: [GET, FETCH]}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.methods[1]",
        "not a known method",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {host: 'api.example.com:443'}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.host",
        "no port",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {host: 'https://api.example.com'}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.host",
        "no scheme",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {host: ''}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.host",
        "not a host name",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {headerPresent: 'bad header'}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.headerPresent",
        "not a valid header name",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, match: {path: /x}, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].match.path",
        "unknown field",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: clientIp, ipv4Prefix: 33}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].ipv4Prefix",
        "between 0 and 32",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: clientIp, ipv6Prefix: 129}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].ipv6Prefix",
        "between 0 and 128",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: header}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].name",
        "need a header name",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: hashedHeader}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].name",
        "need a header name",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: header, name: 'X Key'}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].name",
        "not a valid header name",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: credential, name: 'Auth:x'}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].name",
        "not a valid header name",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: method, name: X}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].name",
        "take a name",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: cookie}], limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].key[0].type",
        "unknown variant",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: clientIp}], clientIpCeiling: 5, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].clientIpCeiling",
        "only rules keyed by",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, key: [{type: credential}], clientIpCeiling: 100000000, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].clientIpCeiling",
        "at most",
    ),
    case(
        "version: 1\nlimits:\n  rules:\n  - {name: a, shadow: sometimes, limit: {requests: 1, window: 1m}}\n",
        "limits.rules[0].shadow",
        "invalid type",
    ),
    // The queue section.
    case(
        "version: 1\nqueue:\n  queues: [emails, 'bad name!']\n",
        "queue.queues[1]",
        "not a queue name",
    ),
    case(
        "version: 1\nqueue:\n  queueSettings: [{name: 'a b'}]\n",
        "queue.queueSettings[0].name",
        "not a queue name",
    ),
    case(
        "version: 1\nqueue:\n  worker: {concurrency: 0}\n",
        "queue.worker.concurrency",
        "at least 1",
    ),
    case(
        "version: 1\nqueue:\n  worker: {claimBatch: 0}\n",
        "queue.worker.claimBatch",
        "at least 1",
    ),
    case(
        "version: 1\nqueue:\n  api: {maxBatch: 0}\n",
        "queue.api.maxBatch",
        "at least 1",
    ),
    case(
        "version: 1\nqueue:\n  poolSize: 0\n",
        "queue.poolSize",
        "at least 1",
    ),
    case(
        "version: 1\nqueue:\n  handler: {url: 'https://h:3000/jobs'}\n",
        "queue.handler.url",
        "http:// URL",
    ),
    case(
        "version: 1\nqueue:\n  handler: {permanentFailureStatuses: [200]}\n",
        "queue.handler.permanentFailureStatuses[0]",
        "not an HTTP error status",
    ),
    case(
        "version: 1\nqueue:\n  handler: {timeout: forever}\n",
        "queue.handler.timeout",
        "duration",
    ),
];
