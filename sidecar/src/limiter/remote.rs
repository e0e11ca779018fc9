//! Decisions made in Redis: one script call per key in flight at a time, the requests that arrive
//! meanwhile decided together by the next call ([`super::coalesce`]). Every call counts its latency and
//! batch size and feeds the circuit breaker; a request that gets no answer within its deadline is left to
//! the failure mode by the caller.

use std::{sync::Arc, time::Duration};

use sluice_crds::sidecar_config::Algorithm as AlgorithmKind;

use super::{
    Settings, Shared,
    algorithm::{self, Outcome, Params, Unique},
    coalesce::{Turn, Waiter, batch_deadline},
    metrics::RedisErrorKind,
    redis_store::{CallError, RedisStore},
    rule::CompiledRule,
};

/// A coalesced request's answer: its share of a batch reply, or `None` when Redis did not decide.
pub(super) type Answer = Option<Share>;

/// One request's place in a batch reply.
#[derive(Debug)]
pub(super) struct Share {
    reply: Arc<Vec<i64>>,
    index: u64,
    now: u64,
    params: Params,
}

/// What one call is about: the counter, and the rule it belongs to (for the reply's shape and logs).
#[derive(Clone, Debug)]
struct Counter {
    /// Coalescing key: the Redis key base, `:` and the algorithm's tag.
    key: String,
    /// Length of the Redis key base at the start of `key`.
    base_len: usize,
    kind: AlgorithmKind,
    params: Params,
    rule: String,
}

/// Decides `rule` for the key `base` in Redis; `None` when Redis did not decide in time.
pub(super) async fn decide(
    shared: &Arc<Shared>,
    redis: &RedisStore,
    settings: &Settings,
    rule: &CompiledRule,
    base: String,
    now: u64,
) -> Option<Outcome> {
    let base_len = base.len();
    let mut key = base;
    key.push(':');
    key.push_str(algorithm::key_tag(rule.algorithm));
    match shared.coalescer.join(&key) {
        Turn::Follow(answer) => {
            let share = tokio::time::timeout(settings.timeout, answer)
                .await
                .ok()?
                .ok()??;
            let reply = algorithm::nth(rule.algorithm, &share.params, &share.reply, share.index)?;
            algorithm::outcome(rule.algorithm, &share.params, share.now, &reply)
        }
        turn => {
            let counter = Counter {
                key,
                base_len,
                kind: rule.algorithm,
                params: rule.params,
                rule: rule.name.clone(),
            };
            // Passes on the queue that forms during the call, even if this request is abandoned mid-call.
            let _handoff = matches!(turn, Turn::Lead).then(|| Handoff {
                shared: Arc::clone(shared),
                redis: redis.clone(),
                counter: counter.clone(),
            });
            let reply = call(shared, redis, settings, &counter, now, 1, settings.timeout).await?;
            algorithm::outcome(rule.algorithm, &rule.params, now, &reply)
        }
    }
}

/// One script call for `hits` requests of `counter` within `deadline`: the reply, checked for its shape,
/// or `None` (counted, and fed to the breaker).
async fn call(
    shared: &Shared,
    redis: &RedisStore,
    settings: &Settings,
    counter: &Counter,
    now: u64,
    hits: u64,
    deadline: Duration,
) -> Option<Vec<i64>> {
    let unique = Unique {
        instance: shared.instance,
        seq: shared.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    let base = &counter.key[..counter.base_len];
    let call = algorithm::call(counter.kind, base, &counter.params, now, unique, hits);
    let (result, took) = redis.run(algorithm::script(counter.kind), call, deadline).await;
    let m = &shared.metrics;
    m.redis_latency.observe(took.as_secs_f64());
    m.redis_batch_size.observe(hits as f64);
    let failure = match result {
        Ok(reply) if algorithm::nth(counter.kind, &counter.params, &reply, 0).is_some() => {
            shared.breaker.record_success();
            return Some(reply);
        }
        Ok(reply) => {
            tracing::warn!(rule = %counter.rule, ?reply, "unexpected reply from rate-limit script");
            RedisErrorKind::reply
        }
        Err(CallError::Timeout) => RedisErrorKind::timeout,
        Err(CallError::Redis(e)) => {
            tracing::debug!(rule = %counter.rule, error = %e, "rate-limit call to Redis failed");
            RedisErrorKind::error
        }
    };
    m.redis_error(failure);
    if shared.breaker.record_failure(settings.breaker_failures) {
        tracing::warn!(
            failure_mode = ?settings.failure_mode,
            "Redis failed {} calls in a row; circuit breaker open",
            settings.breaker_failures
        );
    }
    None
}

/// Held by the request that leads a key: when it is done (or dropped), the queue that formed meanwhile
/// goes to a task that decides it.
struct Handoff {
    shared: Arc<Shared>,
    redis: RedisStore,
    counter: Counter,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        let batch = self.shared.coalescer.next_batch(&self.counter.key);
        if batch.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left (shutting down): the waiters see their channels close and fall back.
            return;
        };
        runtime.spawn(drive(
            Arc::clone(&self.shared),
            self.redis.clone(),
            self.counter.clone(),
            batch,
        ));
    }
}

/// Decides batches for `counter` until no more requests queue up behind a call.
async fn drive(shared: Arc<Shared>, redis: RedisStore, counter: Counter, mut batch: Vec<Waiter<Answer>>) {
    loop {
        let settings = shared.settings.load_full();
        let deadline = batch_deadline(&batch, settings.timeout);
        let now = shared.clock.now_millis();
        let reply = if deadline.is_zero() || shared.breaker.is_open() {
            None
        } else {
            let hits = batch.len() as u64;
            call(&shared, &redis, &settings, &counter, now, hits, deadline).await
        };
        let reply = reply.map(Arc::new);
        for (index, waiter) in (0u64..).zip(batch) {
            let share = reply.as_ref().map(|reply| Share {
                reply: Arc::clone(reply),
                index,
                now,
                params: counter.params,
            });
            // A waiter that gave up (deadline, client gone) no longer listens.
            let _ = waiter.answer.send(share);
        }
        batch = shared.coalescer.next_batch(&counter.key);
        if batch.is_empty() {
            return;
        }
    }
}
