//! Rate limiting: which rules apply to a request, the key each rule counts, and the decision, made by one
//! atomic Redis round trip per rule (issued concurrently, each with a deadline) behind a circuit breaker,
//! with a failure mode for when Redis cannot decide.
//!
//! Layout: [`rule`] (matching, compiled rules), [`key`] (key derivation, IP masking, hashing),
//! [`request`] (the request as the limiter sees it), [`mod@client_ip`] (socket peer and trusted
//! `X-Forwarded-For`), [`algorithm`] (fixed window, sliding log,
//! sliding counter, token bucket: Lua script and in-process math each), [`redis_store`] (fred pool,
//! `EVALSHA`), [`coalesce`] and `remote` (one call in flight per key; requests arriving meanwhile decided
//! together by the next call), [`breaker`], [`local`] (bounded in-process buckets), [`carry`] (what the
//! local fallback allowed, counted into Redis once it answers again), [`last_said`] (what Redis last
//! said per key, which the local fallback starts from), [`metrics`].
//!
//! Hot path: rules and settings are read through one `ArcSwap` load; matching and key hashing allocate
//! nothing; per applying rule there is at most one script call (a hot key shares its call with the
//! requests that arrived while the previous one was in flight), and a Redis key string is built only for
//! a call: the coalescer names a counter by a small fixed-size id (key hash, rule scope id, algorithm,
//! window). The in-process store takes one shard lock per rule, and only when Redis is absent or cannot
//! decide. Under `failureMode: local`, each decision Redis makes is also remembered ([`last_said`]: one
//! shard lock and no allocation once the key is known).

pub mod algorithm;
pub mod breaker;
pub mod carry;
pub mod client_ip;
pub mod coalesce;
pub mod key;
pub mod last_said;
pub mod local;
pub mod metrics;
pub mod redis_store;
mod remote;
pub mod request;
pub mod rule;

use std::{
    collections::HashSet,
    fmt,
    sync::{
        Arc,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    time::Duration,
};

use arc_swap::ArcSwap;
use ipnet::IpNet;
use prometheus_client::registry::Registry;
use ring::hmac;
use sluice_crds::sidecar_config::{FailureMode, LimitsConfig, PolicyRef, Rule, TierLimits, default_rules};

pub use client_ip::client_ip;
pub use request::{HeaderLookup, RequestFacts};

use self::{
    algorithm::Outcome,
    breaker::Breaker,
    carry::Ledger,
    coalesce::Coalescer,
    key::KeyHash,
    last_said::LastSaid,
    local::LocalStore,
    metrics::{DecisionOutcome, FallbackMode, Metrics},
    redis_store::RedisStore,
    rule::CompiledRule,
};
use crate::{Error, clock::SharedClock};

/// The decision for one request.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// The rule that rejected the request, when one did (the first in config order; shadow rules never
    /// reject).
    pub rejected_by: Option<String>,
    /// When to retry, for a rejection: the longest wait among the rejecting rules.
    pub retry_after: Option<Duration>,
    /// The quota to report in headers: the rejecting rule's, or else the applying rule with the fewest
    /// requests remaining. Shadow rules and fail-open decisions report none.
    pub quota: Option<Quota>,
}

impl Verdict {
    /// Whether the request may go on to the app.
    pub fn allowed(&self) -> bool {
        self.rejected_by.is_none()
    }
}

/// Quota state of one rule for one client, for response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// Rule name.
    pub rule: Arc<str>,
    /// Requests allowed per window, as enforced by this decision (the per-replica share in local
    /// fallback; for the token bucket the refill rate per window).
    pub limit: u64,
    /// Requests left right now (0 when rejected).
    pub remaining: u64,
    /// Time until the quota is fully available again if no further requests arrive.
    pub reset: Duration,
    /// The rule's window.
    pub window: Duration,
}

/// Everything hot reload replaces at once.
#[derive(Debug)]
struct Settings {
    rules: Vec<CompiledRule>,
    failure_mode: FailureMode,
    expected_replicas: u32,
    allow_list: Vec<IpNet>,
    timeout: Duration,
    /// Most hits one call takes ahead for a hot key (`limits.redis.prefetch`).
    prefetch: u64,
    breaker_failures: u32,
    breaker_cooldown: Duration,
    /// `limits.localMaxKeys`, which also caps the keys the carry-over ledger notes.
    local_max_keys: usize,
}

impl Settings {
    fn compile(
        config: &LimitsConfig,
        policy: Option<&PolicyRef>,
        counter_key: Option<&hmac::Key>,
        metrics: &Metrics,
    ) -> crate::Result<Self> {
        let defaults;
        let rules: &[Rule] = if config.rules.is_empty() {
            defaults = default_rules(TierLimits::default());
            &defaults
        } else {
            &config.rules
        };
        let mut names = HashSet::new();
        let mut compiled = Vec::with_capacity(rules.len());
        for (i, r) in rules.iter().enumerate() {
            if !names.insert(r.name.as_str()) {
                return Err(Error::Config(format!(
                    "limits.rules[{i}].name: {:?} is used by an earlier rule; names key the counters",
                    r.name
                )));
            }
            let rule = CompiledRule::compile(i, r, policy, counter_key, metrics.rule(&r.name))?;
            let ceiling = rule.ceiling(i, r, policy, counter_key, |name| metrics.rule(name))?;
            compiled.push(rule);
            compiled.extend(ceiling);
        }
        if config.expected_replicas == 0 {
            return Err(Error::Config(
                "limits.expectedReplicas: must be at least 1".into(),
            ));
        }
        let timeout = config.redis.timeout.get();
        if timeout.is_zero() {
            return Err(Error::Config(
                "limits.redis.timeout: must be longer than 0".into(),
            ));
        }
        Ok(Self {
            rules: compiled,
            failure_mode: config.failure_mode,
            expected_replicas: config.expected_replicas,
            allow_list: config.allow_list.clone(),
            timeout,
            prefetch: config.redis.prefetch,
            breaker_failures: config.redis.breaker_failures.max(1),
            breaker_cooldown: config.redis.breaker_cooldown.get().max(Duration::from_millis(1)),
            local_max_keys: config.local_max_keys,
        })
    }
}

/// State shared by the limiter and its background probe.
struct Shared {
    settings: ArcSwap<Settings>,
    clock: SharedClock,
    redis: Option<RedisStore>,
    /// The counter key (`SLUICE_COUNTER_KEY`) the limiter started with: every reload keys its rules'
    /// hashes with it, whatever the reloaded config holds, so counters never change names mid-run.
    counter_key: Option<hmac::Key>,
    breaker: Breaker,
    local: LocalStore,
    /// Requests the local fallback allowed, owed to Redis.
    carry: Ledger,
    /// What Redis last said per key, for the local fallback to start from.
    last_said: LastSaid,
    coalescer: Coalescer<remote::Answer, remote::CounterId>,
    metrics: Metrics,
    instance: u64,
    seq: AtomicU64,
    /// Pods enforcing the policy, as the operator last published it (0: not known yet). Divides each
    /// limit under `failureMode: local` instead of `expectedReplicas` once known.
    enforcing_pods: AtomicU32,
}

impl Shared {
    /// How many replicas share each limit under `failureMode: local`: the enforcing pods the operator
    /// counted, or `expectedReplicas` until it has said.
    fn replicas(&self, settings: &Settings) -> u32 {
        match self.enforcing_pods.load(Ordering::Relaxed) {
            0 => settings.expected_replicas,
            n => n,
        }
    }
}

/// How one rule's decision was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Redis,
    /// In process, Redis not configured.
    Local,
    Fallback(FallbackMode),
}

/// Decides requests against the configured rules. Cheap to share behind an `Arc`; dropping it stops its
/// background task.
pub struct Limiter {
    shared: Arc<Shared>,
    probe: Option<tokio::task::JoinHandle<()>>,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limiter")
            .field("redis", &self.shared.redis)
            .field("redis_healthy", &self.redis_healthy())
            .finish()
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        if let Some(probe) = self.probe.take() {
            probe.abort();
        }
    }
}

impl Limiter {
    /// Builds a limiter for `config` and registers its metrics in `registry`.
    ///
    /// Never fails because Redis is down: it starts with Redis unhealthy (the failure mode applies) and
    /// connects and reconnects in the background. With `redis_url: None` it limits purely in process, at
    /// the full limit (a single process). Fails only on invalid config ([`Error::Config`] naming the
    /// field). Must be called inside a Tokio runtime.
    pub async fn connect(
        config: &LimitsConfig,
        policy: Option<&PolicyRef>,
        redis_url: Option<&str>,
        clock: SharedClock,
        registry: &mut Registry,
    ) -> crate::Result<Self> {
        Self::build(config, policy, redis_url, clock, Metrics::register(registry))
    }

    /// A purely in-process limiter at the full limit, on the system clock, with unexported metrics: what
    /// [`connect`](Self::connect) builds without a Redis URL. Needs no Tokio runtime.
    pub fn new(config: &LimitsConfig, policy: Option<&PolicyRef>) -> crate::Result<Self> {
        let clock: SharedClock = Arc::new(crate::clock::SystemClock);
        Self::build(config, policy, None, clock, Metrics::unregistered())
    }

    /// [`connect`](Self::connect) with metrics that are not exported (tests, benchmarks); see
    /// [`metrics`](Self::metrics).
    pub fn with_metrics(
        config: &LimitsConfig,
        policy: Option<&PolicyRef>,
        redis_url: Option<&str>,
        clock: SharedClock,
        metrics: Metrics,
    ) -> crate::Result<Self> {
        Self::build(config, policy, redis_url, clock, metrics)
    }

    fn build(
        config: &LimitsConfig,
        policy: Option<&PolicyRef>,
        redis_url: Option<&str>,
        clock: SharedClock,
        metrics: Metrics,
    ) -> crate::Result<Self> {
        let counter_key = config
            .redis
            .counter_key
            .as_ref()
            .map(|k| hmac::Key::new(hmac::HMAC_SHA256, k.as_bytes()));
        if redis_url.is_some() && counter_key.is_none() {
            tracing::warn!(
                "{} is not set: counter names in Redis are unkeyed hashes of key values, which whoever \
                 reads Redis's key names can test guesses of (a credential, a client IP) against",
                sluice_crds::contract::env::COUNTER_KEY
            );
        }
        let settings = Settings::compile(config, policy, counter_key.as_ref(), &metrics)?;
        let redis = redis_url
            .map(|url| {
                RedisStore::connect(
                    url,
                    config.redis.ca_file.as_deref(),
                    config.redis.pool_size,
                    settings.timeout,
                    &metrics,
                )
            })
            .transpose()?;
        let shared = Arc::new(Shared {
            settings: ArcSwap::from_pointee(settings),
            clock,
            breaker: Breaker::new_open(metrics.breaker_open.clone()),
            local: LocalStore::new(config.local_max_keys, metrics.clone()),
            carry: Ledger::default(),
            last_said: LastSaid::default(),
            coalescer: Coalescer::default(),
            metrics,
            redis,
            counter_key,
            instance: rand::random(),
            seq: AtomicU64::new(0),
            enforcing_pods: AtomicU32::new(0),
        });
        let probe = shared
            .redis
            .is_some()
            .then(|| tokio::spawn(probe(Arc::clone(&shared))));
        Ok(Self { shared, probe })
    }

    /// Hot reload: new rules, limits, failure mode, allow list, deadline and breaker settings. Keeps the
    /// Redis connection, the counters (keys never depend on limits) and the local buckets; forgets what the
    /// coalescer holds for counters no rule uses any longer (a changed window or algorithm, a removed
    /// rule). On error the old settings stay. The Redis URL and pool size cannot change here.
    pub fn reconfigure(&self, config: &LimitsConfig, policy: Option<&PolicyRef>) -> crate::Result<()> {
        let settings = Settings::compile(
            config,
            policy,
            self.shared.counter_key.as_ref(),
            &self.shared.metrics,
        )?;
        if let Some(redis) = &self.shared.redis {
            redis.set_timeout(settings.timeout);
        }
        self.shared.local.set_cap(config.local_max_keys);
        let settings = Arc::new(settings);
        self.shared.settings.store(Arc::clone(&settings));
        remote::forget_unused(&self.shared.coalescer, &settings.rules);
        Ok(())
    }

    /// Sets how many pods enforce the policy (the operator publishes the count): under `failureMode:
    /// local` each limit is divided by it instead of `expectedReplicas`. 0 goes back to
    /// `expectedReplicas`.
    pub fn set_enforcing_pods(&self, pods: u32) {
        self.shared.enforcing_pods.store(pods, Ordering::Relaxed);
    }

    /// Whether Redis is configured and its circuit breaker is closed (calls go to Redis).
    pub fn redis_healthy(&self) -> bool {
        self.shared.redis.is_some() && !self.shared.breaker.is_open()
    }

    /// Why Redis cannot be reached, when a connection or the last probe failed.
    pub fn redis_problem(&self) -> Option<crate::redis::Problem> {
        self.shared.redis.as_ref().and_then(RedisStore::problem)
    }

    /// Whether a Redis URL was given (otherwise the limiter is purely in process).
    pub fn uses_redis(&self) -> bool {
        self.shared.redis.is_some()
    }

    /// The limiter's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// In-process buckets currently held.
    pub fn local_buckets(&self) -> usize {
        self.shared.local.len()
    }

    /// Decides one request: every applying rule must allow it. Never waits longer than the Redis deadline.
    pub async fn check(&self, req: &RequestFacts<'_>) -> Verdict {
        let settings = self.shared.settings.load_full();
        let client = client_ip::unmap(req.client_ip);
        if settings.allow_list.iter().any(|net| net.contains(&client)) {
            return Verdict::default();
        }
        let mut matching = settings
            .rules
            .iter()
            .filter(|r| r.matcher.matches(req))
            .filter_map(|r| r.key.hash(req).map(|h| (r, h)));
        let Some(first) = matching.next() else {
            return Verdict::default();
        };
        let now = self.shared.clock.now_millis();
        // One or two applying rules (the common cases: a rule, or a rule keyed by a header with its
        // ceiling per client IP) are decided in place, without a vector of rules, a vector of decisions
        // or `join_all` (which would allocate and move every rule's future); the rest collected is
        // empty and allocates nothing.
        let Some(second) = matching.next() else {
            let (r, h) = &first;
            let decision = self.decide(&settings, r, h, now).await;
            return verdict(
                std::slice::from_ref(&first),
                std::slice::from_ref(&decision),
                self.shared.replicas(&settings),
            );
        };
        let rest: Vec<(&CompiledRule, KeyHash)> = matching.collect();
        if rest.is_empty() {
            let applying = [first, second];
            let [(r1, h1), (r2, h2)] = &applying;
            let (d1, d2) = futures::future::join(
                self.decide(&settings, r1, h1, now),
                self.decide(&settings, r2, h2, now),
            )
            .await;
            return verdict(&applying, &[d1, d2], self.shared.replicas(&settings));
        }
        let applying: Vec<(&CompiledRule, KeyHash)> = [first, second].into_iter().chain(rest).collect();
        let decisions: Vec<(Outcome, Source)> =
            futures::future::join_all(applying.iter().map(|(r, h)| self.decide(&settings, r, h, now))).await;
        verdict(&applying, &decisions, self.shared.replicas(&settings))
    }

    /// One rule's decision: in process without Redis, from the failure mode while the breaker is open,
    /// else by Redis.
    async fn decide(
        &self,
        settings: &Settings,
        rule: &CompiledRule,
        hash: &KeyHash,
        now: u64,
    ) -> (Outcome, Source) {
        match &self.shared.redis {
            None => {
                let o = self.shared.local.decide(
                    &rule.name,
                    rule.key.scope_id(),
                    hash,
                    rule.algorithm,
                    rule.params,
                    now,
                );
                (o, Source::Local)
            }
            Some(_) if self.shared.breaker.is_open() => self.fallback(settings, rule, hash, now),
            Some(redis) => match remote::decide(&self.shared, redis, settings, rule, hash, now).await {
                Some(o) => {
                    if settings.failure_mode == FailureMode::Local
                        && !self.shared.last_said.record(
                            rule.key.scope_id(),
                            rule.algorithm,
                            hash,
                            rule.params.window_ms,
                            o.remaining,
                            now,
                            settings.local_max_keys,
                        )
                    {
                        self.shared.metrics.last_said_unnoted.inc();
                    }
                    (o, Source::Redis)
                }
                None => self.fallback(settings, rule, hash, now),
            },
        }
    }

    /// The decision of the failure mode while Redis cannot decide.
    fn fallback(
        &self,
        settings: &Settings,
        rule: &CompiledRule,
        hash: &KeyHash,
        now: u64,
    ) -> (Outcome, Source) {
        let (o, mode) = match settings.failure_mode {
            FailureMode::Open => (
                Outcome {
                    allowed: true,
                    remaining: rule.params.requests,
                    reset_ms: 0,
                    retry_after_ms: 0,
                },
                FallbackMode::open,
            ),
            FailureMode::Closed => {
                let wait = duration_ms(settings.breaker_cooldown);
                (
                    Outcome {
                        allowed: false,
                        remaining: 0,
                        reset_ms: wait,
                        retry_after_ms: wait.max(1),
                    },
                    FallbackMode::closed,
                )
            }
            FailureMode::Local => {
                let replicas = self.shared.replicas(settings);
                let p = rule.params.per_replica(replicas);
                // The bucket starts from this pod's share of what Redis had left for the key.
                let scope = rule.key.scope_id();
                let said = self
                    .shared
                    .last_said
                    .get(scope, rule.algorithm, hash, rule.params.window_ms);
                let o = self.shared.local.decide_from(
                    &rule.name,
                    scope,
                    hash,
                    rule.algorithm,
                    p,
                    now,
                    said,
                    replicas,
                );
                if o.allowed
                    && !self
                        .shared
                        .carry
                        .note(&rule.name, hash, p.window_ms, now, settings.local_max_keys)
                {
                    self.shared.metrics.carry_unnoted.inc();
                }
                (o, FallbackMode::local)
            }
        };
        self.shared.metrics.fallback(mode, outcome_label(rule, &o));
        (o, Source::Fallback(mode))
    }
}

/// Combines the rules' decisions and counts them.
fn verdict(applying: &[(&CompiledRule, KeyHash)], decisions: &[(Outcome, Source)], replicas: u32) -> Verdict {
    let mut v = Verdict::default();
    let mut best: Option<(bool, u64, usize)> = None;
    for (i, ((rule, _), (o, source))) in applying.iter().zip(decisions).enumerate() {
        let label = outcome_label(rule, o);
        rule.counters.count(label);
        if label == DecisionOutcome::rejected {
            if v.rejected_by.is_none() {
                v.rejected_by = Some(rule.name.to_string());
            }
            let wait = Duration::from_millis(o.retry_after_ms);
            v.retry_after = Some(v.retry_after.map_or(wait, |w| w.max(wait)));
        }
        if rule.shadow || *source == Source::Fallback(FallbackMode::open) {
            continue;
        }
        // Rejections first (the first rejecting rule), then the fewest remaining.
        let rank = (label != DecisionOutcome::rejected, o.remaining, i);
        if best.is_none_or(|b| rank < b) {
            best = Some(rank);
        }
    }
    v.quota = best.map(|(_, _, i)| {
        let (rule, _) = applying[i];
        let (o, source) = decisions[i];
        let limit = match source {
            Source::Fallback(FallbackMode::local) => rule.params.per_replica(replicas).requests,
            _ => rule.params.requests,
        };
        Quota {
            rule: Arc::clone(&rule.name),
            limit,
            remaining: if o.allowed { o.remaining } else { 0 },
            reset: Duration::from_millis(o.reset_ms),
            window: Duration::from_millis(rule.params.window_ms),
        }
    });
    v
}

fn outcome_label(rule: &CompiledRule, o: &Outcome) -> DecisionOutcome {
    match (o.allowed, rule.shadow) {
        (true, _) => DecisionOutcome::allowed,
        (false, false) => DecisionOutcome::rejected,
        (false, true) => DecisionOutcome::shadow_rejected,
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Rounds of the probe in a row whose carry-over failed before the breaker closes all the same (the
/// notes left are carried by later rounds).
const CARRY_ROUNDS_MAX: u32 = 3;

/// Background task: while the breaker is open, PING Redis every cooldown (within the call deadline) and
/// close the breaker when it answers — once what the local fallback allowed meanwhile has been counted
/// into Redis ([`carry`]; again just after, for requests decided during the carry-over). A carry-over
/// that failed in part keeps the breaker open for another round, [`CARRY_ROUNDS_MAX`] rounds at most.
/// With the breaker closed, it carries over what single calls that timed out left to the fallback.
/// Polls faster until Redis first answers, so a fresh sidecar starts enforcing through Redis quickly.
async fn probe(shared: Arc<Shared>) {
    let mut ever_healthy = false;
    let mut carry_failed = 0;
    loop {
        let settings = shared.settings.load_full();
        if let Some(redis) = &shared.redis {
            if shared.breaker.is_open() {
                if redis.ping(settings.timeout).await {
                    let carried = remote::carry_over(&shared, redis, &settings).await;
                    carry_failed = if carried { 0 } else { carry_failed + 1 };
                    if carried || carry_failed >= CARRY_ROUNDS_MAX {
                        carry_failed = 0;
                        shared.breaker.close();
                        remote::carry_over(&shared, redis, &settings).await;
                        if ever_healthy {
                            tracing::info!("Redis answers again; circuit breaker closed");
                        }
                        ever_healthy = true;
                    } else {
                        tracing::debug!(
                            "Redis answers, but a carry-over call failed; the breaker stays open"
                        );
                    }
                }
            } else if !shared.carry.is_empty() {
                remote::carry_over(&shared, redis, &settings).await;
            }
        }
        let pause = if ever_healthy {
            settings.breaker_cooldown
        } else {
            settings.breaker_cooldown.min(Duration::from_millis(50))
        };
        drop(settings);
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, Method};

    use super::*;

    #[test]
    fn request_facts_debug_leaves_out_header_values() {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", "Bearer top-secret".parse().unwrap());
        let facts = RequestFacts {
            method: &Method::GET,
            path: "/",
            host: None,
            headers: &headers,
            client_ip: "198.51.100.7".parse().unwrap(),
        };
        let shown = format!("{facts:?}");
        assert!(
            shown.contains("authorization") && !shown.contains("top-secret"),
            "{shown}"
        );
    }

    #[test]
    fn check_can_run_on_any_worker_thread() {
        fn assert_send<T: Send>(_: &T) {}
        let limiter = Limiter::new(&LimitsConfig::default(), None).unwrap();
        let headers = HeaderMap::new();
        let facts = RequestFacts {
            method: &Method::GET,
            path: "/",
            host: None,
            headers: &headers,
            client_ip: "198.51.100.7".parse().unwrap(),
        };
        assert_send(&limiter.check(&facts));
        assert!(!limiter.uses_redis());
    }

    #[test]
    fn a_reload_that_changes_a_window_forgets_the_old_counters_of_the_coalescer() {
        use sluice_crds::{
            duration::Duration as ConfigDuration,
            sidecar_config::{Algorithm, Limit},
        };

        use self::coalesce::{Reserve, Sizing, Turn};

        let rule = |name: &str, window_ms| Rule {
            name: name.into(),
            matches: Default::default(),
            key: Vec::new(),
            algorithm: Algorithm::FixedWindow,
            limit: Limit {
                requests: 100_000,
                window: ConfigDuration::from_millis(window_ms),
                burst: None,
            },
            shadow: false,
            client_ip_ceiling: None,
        };
        let config = |rules| LimitsConfig {
            rules,
            ..Default::default()
        };
        let policy = PolicyRef {
            namespace: "shop".into(),
            name: "api".into(),
            generation: 1,
        };
        let hour = 3_600_000;
        let l = Limiter::new(
            &config(vec![rule("tenant", hour), rule("other", hour)]),
            Some(&policy),
        )
        .unwrap();
        let coalescer = &l.shared.coalescer;
        let settings = l.shared.settings.load_full();
        let (tenant, other) = (&settings.rules[0], &settings.rules[1]);
        let now = 10_000;
        let sizing = |rule: &CompiledRule| Sizing {
            params: rule.params,
            prefetch: 256,
            replicas: 1,
        };
        let lead = |rule: &CompiledRule, key: u8| {
            let id = remote::CounterId::new(rule, &[key; 16]);
            assert!(matches!(
                coalescer.join(&id, &sizing(rule), now),
                Turn::Lead { .. }
            ));
            id
        };
        // A slow key's call: its own hit and 8 ahead, spendable until the hour ends.
        let settle = |rule: &CompiledRule, id: &remote::CounterId| {
            let reserve = Reserve {
                reply: Arc::new(vec![9, 9]),
                params: rule.params,
                next: 1,
                end: 9,
                from_ms: 0,
                until_ms: hour,
            };
            let _ = coalescer.settle(id, &sizing(rule), Some(reserve), now, |_, _| 8);
        };
        for key in 1..=3 {
            settle(tenant, &lead(tenant, key));
        }
        settle(other, &lead(other, 1));
        let in_flight = lead(tenant, 4);
        assert_eq!(coalescer.tracked(), 5);

        let mut changed = config(vec![rule("tenant", 60_000), rule("other", hour)]);
        l.reconfigure(&changed, Some(&policy)).unwrap();
        assert_eq!(
            coalescer.tracked(),
            2,
            "the old window's idle keys are dropped; the unchanged rule's key and the call in flight stay"
        );
        settle(tenant, &in_flight);
        assert_eq!(
            coalescer.tracked(),
            1,
            "the old window's key is dropped once its call is settled"
        );

        changed.rules.pop();
        l.reconfigure(&changed, Some(&policy)).unwrap();
        assert_eq!(coalescer.tracked(), 0, "a removed rule's keys are dropped");
    }

    #[tokio::test]
    async fn one_rules_redis_answers_never_start_another_rules_local_bucket_even_for_one_key_hash() {
        use sluice_crds::{
            duration::Duration as ConfigDuration,
            sidecar_config::{Algorithm, Limit},
        };
        use sluice_testsupport::{RedisServer, wait_for_async};

        let rule = |name: &str, requests| Rule {
            name: name.into(),
            matches: Default::default(),
            key: Vec::new(),
            algorithm: Algorithm::FixedWindow,
            limit: Limit {
                requests,
                window: ConfigDuration::from_millis(60_000),
                burst: None,
            },
            shadow: false,
            client_ip_ceiling: None,
        };
        let mut config = LimitsConfig {
            rules: vec![rule("strict", 2), rule("loose", 100)],
            failure_mode: FailureMode::Local,
            ..Default::default()
        };
        // Generous: a loaded machine must not turn a Redis decision into a fallback one.
        config.redis.timeout = ConfigDuration::from_millis(2_000);
        let policy = PolicyRef {
            namespace: "shop".into(),
            name: "api".into(),
            generation: 1,
        };
        let redis = RedisServer::start();
        let now = 1_700_000_040_000;
        let clock: SharedClock = Arc::new(crate::clock::ManualClock::at(now));
        let l = Limiter::with_metrics(
            &config,
            Some(&policy),
            Some(&redis.url()),
            clock,
            Metrics::unregistered(),
        )
        .unwrap();
        wait_for_async("the limiter to reach Redis", Duration::from_secs(10), || async {
            l.redis_healthy().then_some(())
        })
        .await;
        let settings = l.shared.settings.load_full();
        let (strict, loose) = (&settings.rules[0], &settings.rules[1]);
        // A key hash both rules' values hash to: only a 2^64 search could find one, so it is set here.
        let hash = [7u8; 16];
        for expected in [true, true, false] {
            let (o, source) = l.decide(&settings, strict, &hash, now).await;
            assert_eq!((o.allowed, source), (expected, Source::Redis));
        }
        let (o, _) = l.fallback(&settings, strict, &hash, now);
        assert!(
            !o.allowed,
            "the strict rule's bucket starts from what Redis said: none left"
        );
        let (o, _) = l.fallback(&settings, loose, &hash, now);
        assert!(
            o.allowed && o.remaining == 99,
            "the loose rule's bucket is its own, not started from the strict rule's answer: {o:?}"
        );
    }

    /// Fixtures for the local fallback: rules of 10 requests a minute keyed by nothing (tests pick the
    /// key hash), under `failureMode: local`, without Redis (tests say what it answered).
    mod outage {
        use sluice_crds::{
            duration::Duration as ConfigDuration,
            sidecar_config::{Algorithm, Limit},
        };

        use super::*;

        pub fn rule(name: &str, algorithm: Algorithm) -> Rule {
            Rule {
                name: name.into(),
                matches: Default::default(),
                key: Vec::new(),
                algorithm,
                limit: Limit {
                    requests: 10,
                    window: ConfigDuration::from_millis(60_000),
                    burst: None,
                },
                shadow: false,
                client_ip_ceiling: None,
            }
        }

        pub fn config(rules: Vec<Rule>) -> LimitsConfig {
            LimitsConfig {
                rules,
                failure_mode: FailureMode::Local,
                ..Default::default()
            }
        }

        pub fn policy(generation: i64) -> PolicyRef {
            PolicyRef {
                namespace: "shop".into(),
                name: "api".into(),
                generation,
            }
        }

        /// Notes that Redis had `remaining` requests left for `hash` under `rule` at `now`.
        pub fn redis_said(l: &Limiter, rule: &CompiledRule, hash: &KeyHash, remaining: u64, now: u64) {
            assert!(l.shared.last_said.record(
                rule.key.scope_id(),
                rule.algorithm,
                hash,
                rule.params.window_ms,
                remaining,
                now,
                64,
            ));
        }

        /// The fallback's decision for `hash` under the current rule named `name`: allowed, and remaining.
        pub fn fallback(l: &Limiter, name: &str, hash: &KeyHash, now: u64) -> (bool, u64) {
            let settings = l.shared.settings.load_full();
            let rule = settings.rules.iter().find(|r| &*r.name == name).unwrap();
            let (o, _) = l.fallback(&settings, rule, hash, now);
            (o.allowed, o.remaining)
        }
    }

    #[test]
    fn a_reload_that_keeps_a_rule_keeps_its_local_bucket_and_what_redis_last_said() {
        use self::outage::{config, fallback, policy, redis_said, rule};
        use sluice_crds::sidecar_config::Algorithm;

        let fw = Algorithm::FixedWindow;
        let l = Limiter::new(&config(vec![rule("tenant", fw)]), Some(&policy(1))).unwrap();
        let now = 1_700_000_040_000;
        let (started, remembered) = ([1u8; 16], [2u8; 16]);
        let settings = l.shared.settings.load_full();
        redis_said(&l, &settings.rules[0], &started, 3, now);
        redis_said(&l, &settings.rules[0], &remembered, 3, now);
        assert_eq!(fallback(&l, "tenant", &started, now), (true, 2), "from Redis's 3");

        // A new generation with a rule inserted before it: the rule itself is unchanged.
        l.reconfigure(
            &config(vec![rule("first", fw), rule("tenant", fw)]),
            Some(&policy(2)),
        )
        .unwrap();
        assert_eq!(
            fallback(&l, "tenant", &started, now),
            (true, 1),
            "the bucket is kept, not started again"
        );
        assert_eq!(
            fallback(&l, "tenant", &remembered, now),
            (true, 2),
            "the answer from before the reload starts the bucket"
        );

        // A renamed rule is another rule: its own bucket, from zero.
        l.reconfigure(
            &config(vec![rule("first", fw), rule("renamed", fw)]),
            Some(&policy(3)),
        )
        .unwrap();
        assert_eq!(fallback(&l, "renamed", &started, now), (true, 9));
        assert_eq!(fallback(&l, "renamed", &remembered, now), (true, 9));
    }

    #[test]
    fn a_reload_keeps_the_counter_key_the_limiter_started_with() {
        use self::outage::{config, policy, rule};
        use sluice_crds::sidecar_config::{Algorithm, CounterKey};

        let headers = HeaderMap::new();
        let facts = RequestFacts {
            method: &Method::GET,
            path: "/",
            host: None,
            headers: &headers,
            client_ip: "198.51.100.7".parse().unwrap(),
        };
        let hash = |l: &Limiter| l.shared.settings.load().rules[0].key.hash(&facts).unwrap();
        let rules = || config(vec![rule("tenant", Algorithm::FixedWindow)]);
        let unkeyed = hash(&Limiter::new(&rules(), Some(&policy(1))).unwrap());
        let mut keyed_config = rules();
        keyed_config.redis.counter_key = Some(CounterKey::new(&"k".repeat(32)).unwrap());
        let l = Limiter::new(&keyed_config, Some(&policy(1))).unwrap();
        let keyed = hash(&l);
        assert_ne!(keyed, unkeyed);

        // A reloaded config without the key (its field is never in a file): still keyed as at start.
        l.reconfigure(&rules(), Some(&policy(2))).unwrap();
        assert_eq!(hash(&l), keyed);
    }

    #[test]
    fn a_reload_that_changes_only_the_algorithm_in_an_outage_starts_a_bucket_of_its_own() {
        use self::outage::{config, fallback, policy, redis_said, rule};
        use sluice_crds::sidecar_config::Algorithm;

        let (fw, sc) = (Algorithm::FixedWindow, Algorithm::SlidingCounter);
        let l = Limiter::new(&config(vec![rule("tenant", fw)]), Some(&policy(1))).unwrap();
        let now = 1_700_000_040_000;
        // Redis had nothing left for either key under the fixed window; one key's bucket has started.
        let (started, answered) = ([1u8; 16], [2u8; 16]);
        let settings = l.shared.settings.load_full();
        redis_said(&l, &settings.rules[0], &started, 0, now);
        redis_said(&l, &settings.rules[0], &answered, 0, now);
        assert_eq!(fallback(&l, "tenant", &started, now), (false, 0));

        // Redis would count the rule on a new, empty counter now: so does the fallback.
        l.reconfigure(&config(vec![rule("tenant", sc)]), Some(&policy(2)))
            .unwrap();
        assert_eq!(
            fallback(&l, "tenant", &started, now),
            (true, 9),
            "not the fixed window's bucket"
        );
        assert_eq!(
            fallback(&l, "tenant", &answered, now),
            (true, 9),
            "not started from the fixed window's answer"
        );

        // Changed back within the window: Redis's fixed-window counter is still spent, and so is the bucket.
        l.reconfigure(&config(vec![rule("tenant", fw)]), Some(&policy(3)))
            .unwrap();
        assert_eq!(fallback(&l, "tenant", &started, now), (false, 0));
    }

    #[test]
    fn zero_replicas_or_deadline_are_config_errors_naming_the_field() {
        let mut c = LimitsConfig {
            expected_replicas: 0,
            ..Default::default()
        };
        let err = Limiter::new(&c, None).unwrap_err();
        assert!(err.to_string().contains("limits.expectedReplicas"), "{err}");
        c.expected_replicas = 1;
        c.redis.timeout = sluice_crds::duration::Duration::from_millis(0);
        let err = Limiter::new(&c, None).unwrap_err();
        assert!(err.to_string().contains("limits.redis.timeout"), "{err}");
    }
}
