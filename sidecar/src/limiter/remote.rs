//! Decisions made in Redis: one script call per key in flight at a time, the requests that arrive
//! meanwhile decided together by the next call, and the calls of a hot key (or of a slow key far from its
//! limit) taking hits ahead that later requests spend without waiting ([`super::coalesce`]). Every call
//! counts its latency and batch size and feeds the circuit breaker; a request that gets no answer within
//! its deadline is left to the failure mode by the caller.

use std::{collections::HashSet, sync::Arc, time::Duration};

use futures::StreamExt;
use sluice_crds::sidecar_config::Algorithm as AlgorithmKind;

use super::{
    Settings, Shared,
    algorithm::{self, Hits, Outcome, Params, Unique},
    coalesce::{Coalescer, Reserve, Sizing, Turn, Waiter, batch_deadline, prefetch_size},
    key::{KeyHash, KeySpec},
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

/// The coalescer's name for a counter, a small fixed-size value, so a request builds no key string to find
/// its entry:
/// - the key hash, which covers the namespace, policy, rule and key value (as the Redis key's hash tag
///   does);
/// - the rule's scope id ([`KeySpec::scope_id`](super::key::KeySpec::scope_id)), fixed per rule and not
///   derived from request values, so two rules never share an entry, even for key values chosen to
///   collide in the 16-byte hash (the Redis key keeps them apart with its readable prefix);
/// - the algorithm, which picks the Redis key's type and tag, and the window, which the Redis key ends
///   with: a hot reload that changes either starts another entry, as it starts other counters, and
///   [`forget_unused`] drops the old one.
///
/// A request under other limits of the same counter (a changed limit or burst) has the same id; the
/// coalescer does not queue it behind a call made under the old ones.
///
/// The hash is SHA-256 of values a client picks, so anyone can grind it: the coalescer's table must stay
/// behind a randomly keyed hasher (the default SipHash `RandomState`), never an identity or unkeyed fast
/// hasher over `hash`, or a flood of keys aimed at one bucket would make every lookup, under one lock,
/// linear.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct CounterId {
    hash: KeyHash,
    scope: u64,
    kind: AlgorithmKind,
    window_ms: u64,
}

impl CounterId {
    /// The counter of `rule` for the key hashed to `hash`.
    pub(super) fn new(rule: &CompiledRule, hash: &KeyHash) -> Self {
        Self::of(&rule.key, rule.algorithm, rule.params.window_ms, hash)
    }

    fn of(key: &KeySpec, kind: AlgorithmKind, window_ms: u64, hash: &KeyHash) -> Self {
        Self {
            hash: *hash,
            scope: key.scope_id(),
            kind,
            window_ms,
        }
    }
}

/// After a hot reload to `rules`: drops the coalescer's entries of counters no rule counts any longer (a
/// rule's window or algorithm changed, or the rule is gone), so that they neither outlive the reload
/// until their old window ends nor keep other keys from taking hits ahead (see
/// [`Coalescer::forget`]).
pub(super) fn forget_unused(coalescer: &Coalescer<Answer, CounterId>, rules: &[CompiledRule]) {
    let counted: HashSet<(u64, AlgorithmKind, u64)> = rules
        .iter()
        .map(|r| (r.key.scope_id(), r.algorithm, r.params.window_ms))
        .collect();
    coalescer.forget(|id| counted.contains(&(id.scope, id.kind, id.window_ms)));
}

/// What one call is about: the counter, and the rule it belongs to (for the reply's shape and logs).
#[derive(Clone, Debug)]
struct Counter {
    /// Coalescing key (its algorithm is the call's).
    id: CounterId,
    /// The Redis key base (see [`KeySpec::redis_base`](super::key::KeySpec::redis_base)).
    base: String,
    params: Params,
    rule: Arc<str>,
}

/// Decides `rule` for the key hashed to `hash` in Redis; `None` when Redis did not decide in time.
pub(super) async fn decide(
    shared: &Arc<Shared>,
    redis: &RedisStore,
    settings: &Settings,
    rule: &CompiledRule,
    hash: &KeyHash,
    now: u64,
) -> Option<Outcome> {
    let id = CounterId::new(rule, hash);
    // Built only by a request that makes a call: most requests of a busy key, or of a key far from its
    // limit, never do.
    let counter = || Counter {
        id,
        base: rule.key.redis_base(hash),
        params: rule.params,
        rule: Arc::clone(&rule.name),
    };
    // The calls below are boxed: most requests of a busy key never make one, and this future lives in
    // every request's state.
    let sizing = Sizing {
        params: rule.params,
        prefetch: settings.prefetch,
        replicas: shared.replicas(settings),
    };
    match shared.coalescer.join(&id, &sizing, now) {
        Turn::Follow(answer) => {
            let share = tokio::time::timeout(settings.timeout, answer)
                .await
                .ok()?
                .ok()??;
            let reply = algorithm::nth(rule.algorithm, &share.params, &share.reply, share.index)?;
            algorithm::outcome(rule.algorithm, &share.params, share.now, &reply)
        }
        Turn::Reserved { spent, refill } => {
            shared.metrics.prefetched.inc();
            let reply = algorithm::nth(rule.algorithm, &rule.params, &spent.reply, spent.index);
            if refill > 0 {
                let task = drive(Arc::clone(shared), redis.clone(), counter(), Vec::new(), refill);
                tokio::spawn(task);
            }
            algorithm::outcome(rule.algorithm, &rule.params, now, &reply?)
        }
        Turn::Lead { prefetch } => {
            // Settles the call even if this request is abandoned mid-call: the queue that formed meanwhile
            // is served from the hits taken ahead or handed to a task that decides it.
            let mut handoff = Handoff {
                shared: Arc::clone(shared),
                redis: redis.clone(),
                counter: counter(),
                reply: None,
                now,
            };
            let reply = Box::pin(call(
                shared,
                redis,
                settings,
                &handoff.counter,
                now,
                Hits {
                    waiting: 1,
                    ahead: prefetch,
                },
                settings.timeout,
            ))
            .await?;
            let reply = Arc::new(reply);
            handoff.reply = Some(Arc::clone(&reply));
            let own = algorithm::nth(rule.algorithm, &rule.params, &reply, 0)?;
            algorithm::outcome(rule.algorithm, &rule.params, now, &own)
        }
        Turn::Alone => {
            let counter = counter();
            let reply = Box::pin(call(
                shared,
                redis,
                settings,
                &counter,
                now,
                1.into(),
                settings.timeout,
            ))
            .await?;
            algorithm::outcome(rule.algorithm, &rule.params, now, &reply)
        }
    }
}

/// Carry-over calls in flight at once.
const CARRY_CONCURRENCY: usize = 64;

/// Counts into Redis what the local fallback allowed in the current window (see [`super::carry`]): one
/// script call per key noted, with that many hits at the time of the last of them. A note whose call
/// fails is put back for the next try; notes of past windows, or of rules no longer configured, are
/// dropped. Returns whether every note due was carried.
pub(super) async fn carry_over(shared: &Arc<Shared>, redis: &RedisStore, settings: &Settings) -> bool {
    let now = shared.clock.now_millis();
    let due = shared
        .carry
        .take()
        .into_iter()
        .filter_map(|((name, hash), owed)| {
            let rule = settings.rules.iter().find(|r| r.name == name)?;
            (owed.window == now / rule.params.window_ms.max(1)).then_some((rule, name, hash, owed))
        });
    let failed = &std::sync::atomic::AtomicBool::new(false);
    futures::stream::iter(due)
        .for_each_concurrent(CARRY_CONCURRENCY, |(rule, name, hash, owed)| async move {
            let counter = Counter {
                id: CounterId::new(rule, &hash),
                base: rule.key.redis_base(&hash),
                params: rule.params,
                rule: Arc::clone(&name),
            };
            let hits = owed.hits.into();
            if call(shared, redis, settings, &counter, owed.at, hits, settings.timeout)
                .await
                .is_some()
            {
                shared.metrics.carried_over.inc_by(owed.hits);
            } else {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                shared.carry.put_back(((name, hash), owed));
            }
        })
        .await;
    !failed.load(std::sync::atomic::Ordering::Relaxed)
}

/// One script call for `hits` requests of `counter` within `deadline`: the reply, checked for its shape,
/// or `None` (counted, and fed to the breaker).
async fn call(
    shared: &Shared,
    redis: &RedisStore,
    settings: &Settings,
    counter: &Counter,
    now: u64,
    hits: Hits,
    deadline: Duration,
) -> Option<Vec<i64>> {
    let unique = Unique {
        instance: shared.instance,
        seq: shared.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
    };
    let call = algorithm::call(counter.id.kind, &counter.base, &counter.params, now, unique, hits);
    let (result, took) = redis
        .run(algorithm::script(counter.id.kind), call, deadline)
        .await;
    let m = &shared.metrics;
    m.redis_latency.observe(took.as_secs_f64());
    m.redis_batch_size.observe(hits.total() as f64);
    let failure = match result {
        Ok(reply) if algorithm::nth(counter.id.kind, &counter.params, &reply, 0).is_some() => {
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

/// Held by the request that leads a key: when it is done (or dropped), the call is settled (its hits
/// taken ahead kept, the queue that formed meanwhile served) and what is left goes to a task.
struct Handoff {
    shared: Arc<Shared>,
    redis: RedisStore,
    counter: Counter,
    /// The leader's reply once it came (hit 0 was the leader's own).
    reply: Option<Arc<Vec<i64>>>,
    now: u64,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        let reply = self.reply.take();
        let next = settle(&self.shared, &self.counter, reply.as_ref(), 1, self.now);
        let Some((batch, prefetch)) = next else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime left (shutting down): the waiters see their channels close and fall back.
            return;
        };
        runtime.spawn(drive(
            Arc::clone(&self.shared),
            self.redis.clone(),
            self.counter.clone(),
            batch,
            prefetch,
        ));
    }
}

/// Settles a finished call that decided `decided` requests at `now`: the allowed hits beyond them become
/// the key's reserve, the requests queued meanwhile are answered from it, and the rest is returned as the
/// next batch with its prefetch (`None`: nothing left to decide).
fn settle(
    shared: &Shared,
    counter: &Counter,
    reply: Option<&Arc<Vec<i64>>>,
    decided: u64,
    now: u64,
) -> Option<(Vec<Waiter<Answer>>, u64)> {
    let kind = counter.id.kind;
    let p = &counter.params;
    let allowed = reply.map_or(0, |r| algorithm::allowed_hits(r));
    let until = algorithm::prefetch_until(kind, p, now);
    let reserve = match (reply, until) {
        (Some(reply), Some(until_ms)) if allowed > decided => Some(Reserve {
            reply: Arc::clone(reply),
            params: *p,
            next: decided,
            end: allowed,
            from_ms: prefetch_from(kind, p, now),
            until_ms,
        }),
        _ => None,
    };
    // What is left after the last allowed hit sizes the next prefetch.
    let remaining = reply
        .filter(|_| allowed > 0)
        .and_then(|r| algorithm::nth(kind, p, r, allowed - 1))
        .and_then(|last| algorithm::outcome(kind, p, now, &last))
        .map_or(0, |o| o.remaining);
    let settings = shared.settings.load();
    let (limit, replicas) = (settings.prefetch, shared.replicas(&settings));
    let sizing = Sizing {
        params: *p,
        prefetch: limit,
        replicas,
    };
    // A token bucket's held hits live in short slots: a slow key would mostly let them lapse.
    let slow_ok = matches!(kind, AlgorithmKind::FixedWindow | AlgorithmKind::SlidingCounter);
    let settled = shared
        .coalescer
        .settle(&counter.id, &sizing, reserve, now, |wanted, floor| {
            if until.is_some() {
                let floor = if slow_ok { floor } else { 0 };
                prefetch_size(wanted, floor, remaining, replicas, limit)
            } else {
                0
            }
        });
    for (waiter, spent) in settled.served {
        shared.metrics.prefetched.inc();
        let _ = waiter.answer.send(Some(Share {
            reply: spent.reply,
            index: spent.index,
            now,
            params: *p,
        }));
    }
    (!settled.batch.is_empty()).then_some((settled.batch, settled.prefetch))
}

/// Start of the window hits taken ahead at `now` are counted in: a fixed window's or sliding counter's
/// window, a token bucket's hold slot. A request timed earlier does not spend them.
fn prefetch_from(kind: AlgorithmKind, p: &Params, now: u64) -> u64 {
    let len = match kind {
        AlgorithmKind::TokenBucket => algorithm::token_bucket::HOLD_SLOT_MS,
        _ => p.window_ms,
    };
    now - now % len.max(1)
}

/// Decides batches for `counter` (each call taking `prefetch` hits ahead as well) until no more requests
/// queue up behind a call.
async fn drive(
    shared: Arc<Shared>,
    redis: RedisStore,
    counter: Counter,
    mut batch: Vec<Waiter<Answer>>,
    mut prefetch: u64,
) {
    loop {
        let settings = shared.settings.load_full();
        // A hot reload changed the rule: requests under its new limits do not spend hits taken under the
        // old ones (and no longer queue here), so take none ahead for this batch of earlier requests.
        let current = settings.rules.iter().any(|r| {
            r.key.scope_id() == counter.id.scope
                && r.algorithm == counter.id.kind
                && r.params == counter.params
        });
        if !current {
            prefetch = 0;
        }
        let deadline = batch_deadline(&batch, settings.timeout);
        let now = shared.clock.now_millis();
        let decided = batch.len() as u64;
        let reply = if deadline.is_zero() || shared.breaker.is_open() {
            None
        } else {
            let hits = Hits {
                waiting: decided,
                ahead: prefetch,
            };
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
        let Some((next, next_prefetch)) = settle(&shared, &counter, reply.as_ref(), decided, now) else {
            return;
        };
        batch = next;
        prefetch = next_prefetch;
    }
}

#[cfg(test)]
mod tests {
    use sluice_crds::sidecar_config::{KeyPart, PolicyRef};

    use super::*;

    fn policy() -> PolicyRef {
        PolicyRef {
            namespace: "shop".into(),
            name: "api".into(),
            generation: 1,
        }
    }

    fn key(rule: &str) -> KeySpec {
        let parts = [KeyPart::client_ip()];
        KeySpec::compile(Some(&policy()), rule, &parts, "limits.rules[0]", None).unwrap()
    }

    #[test]
    fn two_rules_never_share_a_counter_even_with_colliding_key_hashes() {
        // A hash that collides across two rules: only a 2^64 search could find one, so it is set here.
        let hash = [7u8; 16];
        let fw = AlgorithmKind::FixedWindow;
        let read = CounterId::of(&key("read"), fw, 60_000, &hash);
        assert_ne!(read, CounterId::of(&key("write"), fw, 60_000, &hash));
        let ceiling = KeySpec::ceiling(Some(&policy()), "read", &[], "limits.rules[0]", None).unwrap();
        assert_ne!(
            CounterId::of(&key("read"), fw, 60_000, &hash).scope,
            CounterId::of(&ceiling, fw, 60_000, &hash).scope
        );
        assert_eq!(
            read,
            CounterId::of(&key("read"), fw, 60_000, &hash),
            "a reload keeps the rule's id"
        );
        assert_ne!(
            read,
            CounterId::of(&key("read"), fw, 30_000, &hash),
            "another window is another counter"
        );
        assert_ne!(
            read,
            CounterId::of(&key("read"), AlgorithmKind::SlidingCounter, 60_000, &hash),
            "another algorithm is another counter"
        );
    }
}
