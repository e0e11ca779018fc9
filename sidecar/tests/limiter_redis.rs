//! The limiter against a real Redis with a controlled clock: exact counts at window edges for every
//! algorithm, the Lua scripts against the in-process math, counters that survive a limit change, two
//! limiters sharing one limit, and scripts Redis has forgotten.

mod limiter_common;

/// Named `limiter` so `cargo nextest run -p sluice-sidecar limiter` selects these tests too.
mod limiter {

    use std::time::Duration;

    use crate::limiter_common::*;
    use sluice_crds::sidecar_config::{Algorithm, FailureMode};
    use sluice_sidecar::{
        clock::ManualClock,
        limiter::{
            Verdict,
            algorithm::{self, Hits, LocalState, Params, Unique},
            redis_store::RedisStore,
        },
    };
    use sluice_testsupport::{RedisServer, wait_for_async};

    /// Limiter on a fresh Redis with one rule, Redis reachable, clock at `start`.
    async fn redis_limiter(
        redis: &RedisServer,
        rule: sluice_crds::sidecar_config::Rule,
        start: u64,
    ) -> (sluice_sidecar::limiter::Limiter, ManualClock) {
        let clock = ManualClock::at(start);
        let l = limiter(
            &config(vec![rule], FailureMode::Closed),
            Some(&redis.url()),
            &clock,
        );
        healthy(&l).await;
        (l, clock)
    }

    #[tokio::test]
    async fn fixed_window_allows_the_limit_in_the_last_millisecond_and_again_from_the_edge() {
        let redis = RedisServer::start();
        let w = 30_000;
        let edge = next_edge(T0, w);
        let (l, clock) = redis_limiter(&redis, rule("fw", Algorithm::FixedWindow, 5, w), edge - 1).await;
        assert_eq!(allowed_of(&l, "198.51.100.7", 7).await, 5);
        clock.set(edge);
        assert_eq!(allowed_of(&l, "198.51.100.7", 7).await, 5);
        let v = check(&l, "198.51.100.7").await;
        assert_eq!(v.retry_after, Some(Duration::from_millis(w)));
        assert_eq!(v.rejected_by.as_deref(), Some("fw"));
    }

    #[tokio::test]
    async fn sliding_log_frees_each_slot_exactly_one_window_after_it_was_taken() {
        let redis = RedisServer::start();
        let w = 5 * 60_000;
        let (l, clock) = redis_limiter(&redis, rule("sl", Algorithm::SlidingLog, 4, w), T0).await;
        assert_eq!(allowed_of(&l, "198.51.100.7", 2).await, 2);
        clock.set(T0 + 1_000);
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 2);
        clock.set(T0 + w - 1);
        let v = check(&l, "198.51.100.7").await;
        assert!(!v.allowed());
        assert_eq!(v.retry_after, Some(Duration::from_millis(1)));
        clock.set(T0 + w);
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 2, "the two from T0 left");
        clock.set(T0 + w + 1_000);
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 5).await,
            2,
            "the two from T0+1s left"
        );
    }

    #[tokio::test]
    async fn sliding_counter_weighs_the_previous_window_by_its_overlap() {
        let redis = RedisServer::start();
        let w = 15 * 60_000;
        let edge = next_edge(T0, w);
        let (l, clock) = redis_limiter(&redis, rule("sc", Algorithm::SlidingCounter, 10, w), edge - 1).await;
        assert_eq!(allowed_of(&l, "198.51.100.7", 12).await, 10);
        clock.set(edge);
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 3).await,
            0,
            "no 2x burst at the edge"
        );
        clock.set(edge + w / 4);
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 2, "7.5 + 2 <= 10");
        clock.set(edge + w / 2);
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 3, "5 + 2 + 3 <= 10");
    }

    #[tokio::test]
    async fn token_bucket_allows_burst_plus_one_then_one_per_interval_like_nginx_nodelay() {
        let redis = RedisServer::start();
        let mut r = rule("tb", Algorithm::TokenBucket, 10, 1_000);
        r.limit.burst = Some(4);
        let (l, clock) = redis_limiter(&redis, r, T0).await;
        assert_eq!(allowed_of(&l, "198.51.100.7", 8).await, 5);
        clock.set(T0 + 99);
        let v = check(&l, "198.51.100.7").await;
        assert_eq!(v.retry_after, Some(Duration::from_millis(1)));
        clock.set(T0 + 100);
        assert_eq!(allowed_of(&l, "198.51.100.7", 3).await, 1);
        clock.set(T0 + 100 + 1_000);
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 8).await,
            5,
            "a full bucket again after 500 ms idle"
        );
    }

    #[tokio::test]
    async fn lua_scripts_and_in_process_math_agree_step_by_step_for_every_window_length() {
        let redis = RedisServer::start();
        let store = script_store(&redis).await;
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15);
        for kind in ALGORITHMS {
            for window_ms in [1_000, 30_000, 5 * 60_000, 15 * 60_000, 3_600_000] {
                let p = Params {
                    requests: 7,
                    window_ms,
                    burst: 3,
                };
                let mut now = T0;
                let mut local: Vec<LocalState> = (0..3).map(|_| LocalState::new(kind)).collect();
                for step in 0..120u64 {
                    // Mostly bursts, sometimes long gaps: crosses edges and drains buckets.
                    now += match next(4) {
                        0 => 0,
                        1 => next(window_ms / 20),
                        2 => next(window_ms / 3),
                        _ => window_ms - 1 + next(3),
                    };
                    let who = next(3) as usize;
                    let base = format!("sluice:{{eq/{kind:?}/{window_ms}/{who}}}");
                    let unique = Unique {
                        instance: 1,
                        seq: step,
                    };
                    let call = algorithm::call(kind, &base, &p, now, unique, 1.into());
                    let (reply, _) = store
                        .run(algorithm::script(kind), call, Duration::from_secs(2))
                        .await;
                    let reply = reply.unwrap_or_else(|e| panic!("{kind:?}: {e:?}"));
                    let remote = algorithm::outcome(kind, &p, now, &reply).unwrap();
                    let in_process = local[who].decide(kind, &p, now);
                    assert_eq!(
                        remote, in_process,
                        "{kind:?} window {window_ms} step {step} at {now}"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn a_limit_change_keeps_the_counters() {
        let redis = RedisServer::start();
        let clock = ManualClock::at(next_edge(T0, 60_000) + 10);
        let cfg = |requests| {
            config(
                vec![rule("read", Algorithm::FixedWindow, requests, 60_000)],
                FailureMode::Closed,
            )
        };
        let l = limiter(&cfg(5), Some(&redis.url()), &clock);
        healthy(&l).await;
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 5);
        l.reconfigure(&cfg(8), Some(&policy())).unwrap();
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 5).await,
            3,
            "5 already counted against the new 8"
        );
        l.reconfigure(&cfg(2), Some(&policy())).unwrap();
        assert_eq!(allowed_of(&l, "198.51.100.7", 2).await, 0);
        // Reordering rules and adding one changes nothing for the existing counter either.
        let mut two = cfg(10);
        let mut other = rule("other", Algorithm::TokenBucket, 100, 1_000);
        other.limit.burst = Some(100);
        two.rules.insert(0, other);
        l.reconfigure(&two, Some(&policy())).unwrap();
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 2);
        assert_eq!(
            &*l.check(&get_from("198.51.100.7")).await.quota.unwrap().rule,
            "read"
        );
    }

    #[tokio::test]
    async fn a_limit_or_window_change_governs_a_hot_key_whose_call_is_in_flight() {
        let redis = RedisServer::start();
        // Lower or raise the limit (same counter, which holds the call's hit), or shorten the window
        // (fresh counters).
        for (case, old_requests, new_requests, new_window, admitted) in [
            ("lower", 100, 10, 60_000, 9),
            ("raise", 1, 10, 60_000, 9),
            ("window", 100, 10, 30_000, 10),
        ] {
            let name = format!("hot-{case}");
            let clock = ManualClock::at(next_edge(T0, 60_000) + 10);
            let cfg = |requests, window| {
                config(
                    vec![rule(&name, Algorithm::FixedWindow, requests, window)],
                    FailureMode::Closed,
                )
            };
            let l = limiter(&cfg(old_requests, 60_000), Some(&redis.url()), &clock);
            healthy(&l).await;
            // Redis knows the script, so the call below is one command.
            assert!(check(&l, "198.51.100.7").await.allowed());
            let facts = get_from("203.0.113.9");
            // A call under the old rule is in flight: Redis has counted it, its request has not yet
            // been handed the reply, so the key's call is still open.
            let mut lead = Box::pin(l.check(&facts));
            assert!(
                futures::poll!(&mut lead).is_pending(),
                "{case}: the call is in flight"
            );
            let scope = format!("tests/limits/{name}/");
            wait_for_async("Redis to count the call", Duration::from_secs(5), || async {
                redis.command("KEYS sluice:*").contains(&scope).then_some(())
            })
            .await;
            l.reconfigure(&cfg(new_requests, new_window), Some(&policy()))
                .unwrap();
            let hot = futures::future::join_all((0..20).map(|_| l.check(&facts)));
            let (old, verdicts) =
                tokio::time::timeout(Duration::from_secs(5), async { futures::join!(lead, hot) })
                    .await
                    .expect("answered");
            assert!(old.allowed(), "{case}: {old:?}");
            let allowed = verdicts.iter().filter(|v| v.allowed()).count();
            assert_eq!(
                allowed, admitted,
                "{case}: requests after the change are decided under the new rule: {verdicts:?}"
            );
            assert!(
                verdicts
                    .iter()
                    .all(|v| v.quota.as_ref().is_some_and(|q| q.limit == new_requests
                        && q.remaining < new_requests
                        && q.window == Duration::from_millis(new_window))),
                "{case}: {verdicts:?}"
            );
            // And the next decisions too.
            let next = futures::future::join_all((0..5).map(|_| l.check(&facts))).await;
            assert!(next.iter().all(|v| !v.allowed()), "{case}: {next:?}");
        }
    }

    #[tokio::test]
    async fn two_limiters_sharing_one_redis_share_one_limit_exactly() {
        let redis = RedisServer::start();
        for kind in ALGORITHMS {
            let clock = ManualClock::at(T0);
            let mut r = rule(&format!("shared-{kind:?}"), kind, 40, 60_000);
            r.limit.burst = Some(39);
            let cfg = config(vec![r], FailureMode::Closed);
            let a = limiter(&cfg, Some(&redis.url()), &clock);
            let b = limiter(&cfg, Some(&redis.url()), &clock);
            healthy(&a).await;
            healthy(&b).await;
            // Both sidecars see the same millisecond: sliding-log members must still be distinct.
            assert_eq!(allowed_at_once(&a, &b, 100, 2).await, 40, "{kind:?}");
        }
    }

    #[tokio::test]
    async fn one_call_for_several_hits_decides_each_as_separate_calls_would() {
        let redis = RedisServer::start();
        let store = script_store(&redis).await;
        let mut next = xorshift(0x2545_F491_4F6C_DD1D);
        for kind in ALGORITHMS {
            let p = Params {
                requests: 10,
                window_ms: 10_000,
                burst: 4,
            };
            let base = format!("sluice:{{batch/{kind:?}}}");
            let mut local = LocalState::new(kind);
            let mut now = T0;
            for step in 0..60u64 {
                now += next(p.window_ms / 4);
                let hits = 1 + next(12);
                let unique = Unique {
                    instance: 3,
                    seq: step,
                };
                let call = algorithm::call(kind, &base, &p, now, unique, hits.into());
                let (reply, _) = store
                    .run(algorithm::script(kind), call, Duration::from_secs(2))
                    .await;
                let reply = reply.unwrap_or_else(|e| panic!("{kind:?}: {e:?}"));
                for i in 0..hits {
                    let one = algorithm::nth(kind, &p, &reply, i).unwrap();
                    let remote = algorithm::outcome(kind, &p, now, &one).unwrap();
                    assert_eq!(
                        remote,
                        local.decide(kind, &p, now),
                        "{kind:?} step {step}: hit {i} of {hits} at {now} (reply {reply:?})"
                    );
                }
            }
        }
    }

    #[tokio::test]
    async fn concurrent_requests_for_one_key_share_redis_calls_and_stay_exact() {
        let redis = RedisServer::start();
        let (l, _clock) = hot_key_limiter(&redis).await;
        let facts = get_from("203.0.113.9");
        let verdicts = futures::future::join_all((0..250).map(|_| l.check(&facts))).await;
        let mut remaining: Vec<u64> = verdicts
            .iter()
            .filter(|v| v.allowed())
            .map(|v| v.quota.as_ref().unwrap().remaining)
            .collect();
        remaining.sort_unstable();
        assert_eq!(
            remaining,
            (0..100).collect::<Vec<_>>(),
            "each admitted request sees its own place in the count"
        );
        let calls = script_calls(&redis);
        assert!(
            (1..=10).contains(&calls),
            "250 concurrent requests for one key took {calls} script calls"
        );
    }

    #[tokio::test]
    async fn requests_queued_behind_an_abandoned_call_are_still_decided_in_redis() {
        let redis = RedisServer::start();
        let (l, _clock) = hot_key_limiter(&redis).await;
        let facts = get_from("203.0.113.9");
        let mut lead = Box::pin(l.check(&facts));
        assert!(futures::poll!(&mut lead).is_pending(), "the call is in flight");
        let mut queued = Box::pin(futures::future::join_all((0..5).map(|_| l.check(&facts))));
        assert!(
            futures::poll!(&mut queued).is_pending(),
            "they wait for the call in flight"
        );
        drop(lead); // the client went away mid-call
        let verdicts = tokio::time::timeout(Duration::from_secs(5), queued)
            .await
            .expect("answered");
        assert!(
            verdicts.iter().all(|v| v.allowed()),
            "decided by Redis, not by the closed failure mode: {verdicts:?}"
        );
    }

    #[tokio::test]
    async fn a_hot_key_takes_budget_ahead_and_spends_it_without_waiting_for_redis() {
        let redis = RedisServer::start();
        let (l, _clock) = redis_limiter(
            &redis,
            rule("ahead", Algorithm::FixedWindow, 1_000_000, 60_000),
            next_edge(T0, 60_000) + 10,
        )
        .await;
        let facts = get_from("203.0.113.9");
        for _ in 0..20 {
            let wave = futures::future::join_all((0..64).map(|_| l.check(&facts))).await;
            assert!(wave.iter().all(Verdict::allowed));
        }
        let calls = script_calls(&redis);
        let prefetched = l.metrics().prefetched.get();
        assert!(
            prefetched >= 640,
            "at least half of 1,280 requests were spent from budget taken ahead, got {prefetched}"
        );
        assert!(calls <= 200, "1,280 requests took {calls} script calls");
        let last = l.check(&facts).await.quota.unwrap();
        assert!(
            last.remaining <= 1_000_000 - 1_281,
            "budget taken ahead counts in Redis at once: {last:?}"
        );
    }

    #[tokio::test]
    async fn budget_taken_ahead_never_lets_two_limiters_over_one_limit() {
        let redis = RedisServer::start();
        for kind in [
            Algorithm::FixedWindow,
            Algorithm::SlidingCounter,
            Algorithm::TokenBucket,
        ] {
            let clock = ManualClock::at(next_edge(T0, 60_000) + 10);
            let mut r = rule(&format!("ahead-{kind:?}"), kind, 2_000, 60_000);
            if kind == Algorithm::TokenBucket {
                // The clock stands still, so the bucket holds burst + 1.
                r.limit.burst = Some(1_999);
            }
            let cfg = config(vec![r], FailureMode::Closed);
            let a = limiter(&cfg, Some(&redis.url()), &clock);
            let b = limiter(&cfg, Some(&redis.url()), &clock);
            healthy(&a).await;
            healthy(&b).await;
            // Waves of concurrent requests at both until a whole wave is refused by both: by then every hit
            // either limiter took ahead has been spent.
            let mut allowed = 0;
            for wave in 0.. {
                assert!(wave < 200, "{kind:?}: never refused");
                let n = allowed_at_once(&a, &b, 96, 3).await;
                allowed += n;
                if n == 0 {
                    break;
                }
            }
            assert_eq!(allowed, 2_000, "{kind:?}");
            let ahead = a.metrics().prefetched.get() + b.metrics().prefetched.get();
            assert!(ahead > 0, "{kind:?}: budget was taken ahead");
        }
    }

    #[tokio::test]
    async fn many_slow_keys_take_a_few_hits_ahead_and_stay_exact_at_their_limits() {
        let redis = RedisServer::start();
        for kind in [Algorithm::FixedWindow, Algorithm::SlidingCounter] {
            let start = next_edge(T0, 3_600_000) + 10;
            let clock = ManualClock::at(start);
            // 600 per key: far from the limit (512 or more left) for the first 88 requests, then near it.
            let cfg = config(
                vec![rule(&format!("slow-{kind:?}"), kind, 600, 3_600_000)],
                FailureMode::Closed,
            );
            let a = limiter(&cfg, Some(&redis.url()), &clock);
            let b = limiter(&cfg, Some(&redis.url()), &clock);
            healthy(&a).await;
            healthy(&b).await;
            let clients: Vec<String> = (0..24).map(|i| format!("198.51.100.{i}")).collect();
            let mut allowed = vec![0usize; clients.len()];
            let calls_before = script_calls(&redis);
            let mut checks = 0u64;
            // One request per client per round, the clients at once, the rounds 30 ms apart on the limiters'
            // clock: every key is quiet at every request (slow), until a round refuses every client at both.
            for round in 0..2_000u64 {
                assert!(round < 1_999, "{kind:?}: never refused");
                clock.set(start + round * 30);
                let verdicts = futures::future::join_all(clients.iter().enumerate().map(|(i, ip)| {
                    let first = if (round + i as u64).is_multiple_of(2) {
                        &a
                    } else {
                        &b
                    };
                    let second = if std::ptr::eq(first, &a) { &b } else { &a };
                    async move {
                        let facts = get_from(ip);
                        (
                            first.check(&facts).await.allowed(),
                            second.check(&facts).await.allowed(),
                        )
                    }
                }))
                .await;
                checks += 2 * clients.len() as u64;
                for (n, (x, y)) in allowed.iter_mut().zip(&verdicts) {
                    *n += usize::from(*x) + usize::from(*y);
                }
                if round == 20 {
                    let calls = script_calls(&redis) - calls_before;
                    assert!(
                        calls * 3 <= checks,
                        "{kind:?}: far from their limits, slow keys take hits ahead: {calls} calls for {checks} requests"
                    );
                }
                if verdicts.iter().all(|(x, y)| !x && !y) {
                    break;
                }
            }
            assert!(
                allowed.iter().all(|&n| n == 600),
                "{kind:?}: every key exactly at its limit: {allowed:?}"
            );
            assert!(a.metrics().prefetched.get() + b.metrics().prefetched.get() > 0);
        }
    }

    #[tokio::test]
    async fn budget_taken_ahead_is_not_spent_in_the_next_window() {
        let redis = RedisServer::start();
        let edge = next_edge(T0, 60_000);
        let (l, clock) = redis_limiter(
            &redis,
            rule("ahead", Algorithm::FixedWindow, 1_000, 60_000),
            edge + 60_000 - 1,
        )
        .await;
        let facts = get_from("203.0.113.9");
        for _ in 0..5 {
            let _ = futures::future::join_all((0..32).map(|_| l.check(&facts))).await;
        }
        assert!(l.metrics().prefetched.get() > 0, "a reserve formed");
        clock.set(edge + 60_000);
        let first = l.check(&facts).await.quota.unwrap();
        assert_eq!(
            first.remaining, 999,
            "the new window's first request is counted in the new window's counter"
        );
    }

    #[tokio::test]
    async fn sliding_logs_never_take_budget_ahead() {
        let redis = RedisServer::start();
        let (l, _clock) = redis_limiter(
            &redis,
            rule("exact", Algorithm::SlidingLog, 1_000_000, 60_000),
            T0,
        )
        .await;
        let facts = get_from("203.0.113.9");
        for _ in 0..10 {
            let _ = futures::future::join_all((0..64).map(|_| l.check(&facts))).await;
        }
        assert_eq!(l.metrics().prefetched.get(), 0);
    }

    #[tokio::test]
    async fn a_token_bucket_holds_hits_taken_ahead_so_a_refilled_bucket_admits_no_more_than_it_would_have() {
        let redis = RedisServer::start();
        let store = script_store(&redis).await;
        // 10 per second, burst 9: a full bucket holds 10 requests.
        let p = Params {
            requests: 10,
            window_ms: 1_000,
            burst: 9,
        };
        let kind = Algorithm::TokenBucket;
        let base = "sluice:{held}";
        let slot = algorithm::token_bucket::HOLD_SLOT_MS;
        let t0 = (T0 / slot) * slot + 100;
        let run = |now: u64, hits: Hits, seq: u64| {
            let call = algorithm::call(kind, base, &p, now, Unique { instance: 1, seq }, hits);
            let store = &store;
            async move {
                let (reply, _) = store
                    .run(algorithm::script(kind), call, Duration::from_secs(2))
                    .await;
                algorithm::allowed_hits(&reply.expect("reply"))
            }
        };
        let ahead = Hits { waiting: 1, ahead: 5 };
        assert_eq!(run(t0, ahead, 0).await, 6, "one request and five hits ahead");
        // A second later the bucket would be full again, but the five hits are still held: spent now,
        // they leave room for five more, not ten.
        assert!(algorithm::token_bucket::hold_until(t0) > t0 + 1_000);
        assert_eq!(
            run(t0 + 1_000, 10.into(), 1).await,
            5,
            "the held hits keep their room"
        );
        // Two slots on nothing is held any more, and the bucket refills in full.
        assert!(algorithm::token_bucket::hold_until(t0) <= t0 + 2_000);
        assert_eq!(run(t0 + 3_000, 20.into(), 2).await, 10, "full again");
        // Without hits taken ahead the same sequence admits ten at once after a second.
        let fresh = "sluice:{unheld}";
        let call = algorithm::call(kind, fresh, &p, t0, Unique { instance: 1, seq: 3 }, 6.into());
        let (reply, _) = store
            .run(algorithm::script(kind), call, Duration::from_secs(2))
            .await;
        assert_eq!(algorithm::allowed_hits(&reply.unwrap()), 6);
        let call = algorithm::call(
            kind,
            fresh,
            &p,
            t0 + 1_000,
            Unique { instance: 1, seq: 4 },
            10.into(),
        );
        let (reply, _) = store
            .run(algorithm::script(kind), call, Duration::from_secs(2))
            .await;
        assert_eq!(algorithm::allowed_hits(&reply.unwrap()), 10);
    }

    /// Sends `n` concurrent requests from one client, every `a_every`-th to `a` and the rest to `b`;
    /// returns how many were allowed.
    async fn allowed_at_once(
        a: &sluice_sidecar::limiter::Limiter,
        b: &sluice_sidecar::limiter::Limiter,
        n: usize,
        a_every: usize,
    ) -> usize {
        let tasks = (0..n).map(|i| {
            let l = if i % a_every == 0 { a } else { b };
            async move { l.check(&get_from("203.0.113.9")).await.allowed() }
        });
        futures::future::join_all(tasks)
            .await
            .into_iter()
            .filter(|a| *a)
            .count()
    }

    /// A fixed window of 100 per minute, failing closed (so a decision that did not come from Redis is a
    /// rejection), on `redis`, clock just past a window edge.
    async fn hot_key_limiter(redis: &RedisServer) -> (sluice_sidecar::limiter::Limiter, ManualClock) {
        redis_limiter(
            redis,
            rule("hot", Algorithm::FixedWindow, 100, 60_000),
            next_edge(T0, 60_000) + 10,
        )
        .await
    }

    const ALGORITHMS: [Algorithm; 4] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingCounter,
        Algorithm::TokenBucket,
    ];

    /// A store on `redis` for running scripts directly, once Redis answers.
    async fn script_store(redis: &RedisServer) -> RedisStore {
        let store = RedisStore::connect(
            &redis.url(),
            None,
            1,
            Duration::from_secs(2),
            &sluice_sidecar::limiter::metrics::Metrics::unregistered(),
        )
        .unwrap();
        wait_for_async("redis to answer", Duration::from_secs(10), || async {
            store.ping(Duration::from_millis(200)).await.then_some(())
        })
        .await;
        store
    }

    /// A deterministic pseudo-random source: `next(below)` is in `0..below`.
    fn xorshift(mut state: u64) -> impl FnMut(u64) -> u64 {
        move |below| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below.max(1)
        }
    }

    /// `EVALSHA` and `EVAL` calls Redis has served.
    fn script_calls(redis: &RedisServer) -> u64 {
        redis
            .command("INFO commandstats")
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
            .sum()
    }

    #[tokio::test]
    async fn scripts_are_sent_again_when_redis_has_forgotten_them() {
        let redis = RedisServer::start();
        let (l, _clock) = redis_limiter(&redis, rule("fw", Algorithm::FixedWindow, 3, 60_000), T0).await;
        assert_eq!(allowed_of(&l, "198.51.100.7", 1).await, 1);
        assert!(redis.command("SCRIPT FLUSH").starts_with("+OK"));
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 2);
        assert!(l.redis_healthy());
        let keys = redis.command("KEYS sluice:*");
        assert!(keys.contains("sluice:{tests/limits/fw/"), "{keys}");
        assert!(
            !keys.contains("198.51.100.7"),
            "client addresses are hashed: {keys}"
        );
    }
}
