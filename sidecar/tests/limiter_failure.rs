//! The limiter while Redis is killed, frozen (SIGSTOP) or not there yet, under concurrent load: requests
//! keep flowing as the failure mode says, none waits longer than the Redis deadline, and enforcement through
//! Redis resumes within a second of Redis coming back — with what the local fallback allowed meanwhile
//! counted in Redis, so the window's limit holds across the transition. In the other direction, the
//! local fallback starts each key from what Redis last said it had left, so a window split by an outage
//! does not allow what Redis counted plus a whole local share.

mod limiter_common;

/// Named `limiter` so `cargo nextest run -p sluice-sidecar limiter` selects these tests too.
mod limiter {

    use std::{
        sync::{
            Arc,
            atomic::{AtomicBool, AtomicU64, Ordering},
        },
        time::{Duration, Instant},
    };

    use crate::limiter_common::*;
    use sluice_crds::sidecar_config::{Algorithm, FailureMode};
    use sluice_sidecar::{
        clock::ManualClock,
        limiter::{
            Limiter,
            metrics::{DecisionOutcome, FallbackMode, RedisErrorKind},
        },
    };
    use sluice_testsupport::{RedisServer, wait_for_async};

    /// The configured Redis deadline.
    const DEADLINE: Duration = Duration::from_millis(50);
    /// What the test tolerates between a timer of the deadline started with a decision firing and the
    /// decision finishing: the in-process work after the deadline (a fallback decision) and a worker
    /// thread losing its core in between on a busy machine. The limiter itself never waits longer than
    /// the deadline.
    const SCHEDULING_SLACK: Duration = Duration::from_millis(100);
    /// Concurrent clients.
    const CLIENTS: usize = 16;

    /// Concurrent clients calling `check` in a loop, each from its own address, until stopped.
    struct Load {
        stop: Arc<AtomicBool>,
        done: Arc<AtomicU64>,
        slowest_us: Arc<AtomicU64>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    }

    impl Load {
        fn start(l: &Arc<Limiter>) -> Self {
            let stop = Arc::new(AtomicBool::new(false));
            let done = Arc::new(AtomicU64::new(0));
            let slowest_us = Arc::new(AtomicU64::new(0));
            let tasks = (0..CLIENTS)
                .map(|i| {
                    let (l, stop, done, slowest) =
                        (l.clone(), stop.clone(), done.clone(), slowest_us.clone());
                    tokio::spawn(async move {
                        let ip = format!("198.51.100.{i}");
                        while !stop.load(Ordering::Relaxed) {
                            let overrun = past_the_deadline(l.check(&get_from(&ip))).await;
                            slowest.fetch_max(overrun.as_micros() as u64, Ordering::Relaxed);
                            done.fetch_add(1, Ordering::Relaxed);
                            tokio::task::yield_now().await;
                        }
                    })
                })
                .collect();
            Self {
                stop,
                done,
                slowest_us,
                tasks,
            }
        }

        /// Waits until `n` more requests have been decided.
        async fn run_for(&self, n: u64) {
            let target = self.done.load(Ordering::Relaxed) + n;
            wait_for_async("load to make progress", Duration::from_secs(10), || async {
                (self.done.load(Ordering::Relaxed) >= target).then_some(())
            })
            .await;
        }

        /// Stops the clients; returns the longest a decision outlasted its deadline (see
        /// [`past_the_deadline`]).
        async fn stop(self) -> Duration {
            self.stop.store(true, Ordering::Relaxed);
            for t in self.tasks {
                t.await.unwrap();
            }
            Duration::from_micros(self.slowest_us.load(Ordering::Relaxed))
        }
    }

    /// Runs `decision` alongside a timer of [`DEADLINE`] started with it, in the same task: how long the
    /// decision went on after the timer was seen firing (zero if it finished first). A loaded machine
    /// delays the task's wake-up for both alike, so this is what the limiter adds beyond its deadline,
    /// not how long the task waited for a core.
    async fn past_the_deadline<T>(decision: impl std::future::Future<Output = T>) -> Duration {
        let mut decision = std::pin::pin!(decision);
        let mut timer = std::pin::pin!(tokio::time::sleep(DEADLINE));
        let mut fired = None;
        loop {
            tokio::select! {
                biased;
                () = &mut timer, if fired.is_none() => fired = Some(Instant::now()),
                _ = &mut decision => return fired.map_or(Duration::ZERO, |at: Instant| at.elapsed()),
            }
        }
    }

    fn assert_within_deadline(overrun: Duration) {
        eprintln!("longest a decision went on past its deadline: {overrun:?}");
        assert!(
            overrun <= SCHEDULING_SLACK,
            "a decision went on {overrun:?} after its {DEADLINE:?} Redis deadline"
        );
    }

    async fn redis_limiter(redis: &RedisServer, mode: FailureMode, requests: u64) -> Arc<Limiter> {
        let mut cfg = with_deadline(
            config(vec![rule("api", Algorithm::FixedWindow, requests, 60_000)], mode),
            DEADLINE.as_millis() as u64,
        );
        cfg.expected_replicas = 2;
        let l = Arc::new(limiter(&cfg, Some(&redis.url()), &ManualClock::at(T0)));
        healthy(&l).await;
        l
    }

    /// Waits for the breaker to close again and returns how long that took.
    async fn time_to_recover(l: &Limiter) -> Duration {
        let back = Instant::now();
        healthy(l).await;
        let took = back.elapsed();
        eprintln!("Redis decides again after {took:?}");
        took
    }

    /// Decisions go to Redis again: no further fallback decisions, and counters appear in Redis.
    async fn assert_enforced_through_redis(l: &Limiter, redis: &RedisServer) {
        let fallbacks = |l: &Limiter| {
            let m = l.metrics();
            [FallbackMode::open, FallbackMode::closed, FallbackMode::local]
                .into_iter()
                .flat_map(|mode| {
                    [DecisionOutcome::allowed, DecisionOutcome::rejected].map(|o| m.fallbacks(mode, o))
                })
                .sum::<u64>()
        };
        let before = fallbacks(l);
        for _ in 0..20 {
            check(l, "203.0.113.50").await;
        }
        assert_eq!(fallbacks(l), before, "decisions still made without Redis");
        assert!(redis.command("DBSIZE").trim() != ":0", "no counters in Redis");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_killed_under_load_falls_back_to_local_limits_within_the_deadline_and_recovers() {
        let mut redis = RedisServer::start();
        let l = redis_limiter(&redis, FailureMode::Local, 20).await;
        let load = Load::start(&l);
        load.run_for(300).await;
        redis.kill();
        wait_for_async("the breaker to open", Duration::from_secs(5), || async {
            (!l.redis_healthy()).then_some(())
        })
        .await;
        load.run_for(2_000).await;
        redis.restart();
        let recovery = time_to_recover(&l).await;
        let slowest = load.stop().await;
        assert!(
            recovery <= Duration::from_secs(1),
            "enforcement resumed after {recovery:?}"
        );
        assert_within_deadline(slowest);
        let m = l.metrics();
        let (ok, no) = (
            m.fallbacks(FallbackMode::local, DecisionOutcome::allowed),
            m.fallbacks(FallbackMode::local, DecisionOutcome::rejected),
        );
        // Each client gets at most its replica's share (20 / 2) in process while Redis is gone: its share
        // of what Redis last said it had left (none, for a client that used its 20 through Redis).
        assert!(ok <= (CLIENTS as u64) * 10, "locally allowed {ok}");
        assert!(no > 0, "local limits rejected nothing");
        assert_enforced_through_redis(&l, &redis).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_frozen_under_load_fails_open_within_the_deadline_and_recovers() {
        let redis = RedisServer::start();
        let l = redis_limiter(&redis, FailureMode::Open, 1_000_000).await;
        let load = Load::start(&l);
        load.run_for(300).await;
        redis.pause();
        wait_for_async("the breaker to open", Duration::from_secs(5), || async {
            (!l.redis_healthy()).then_some(())
        })
        .await;
        load.run_for(2_000).await;
        redis.resume();
        let recovery = time_to_recover(&l).await;
        let slowest = load.stop().await;
        assert!(
            recovery <= Duration::from_secs(1),
            "enforcement resumed after {recovery:?}"
        );
        assert_within_deadline(slowest);
        let m = l.metrics();
        assert!(m.fallbacks(FallbackMode::open, DecisionOutcome::allowed) >= 2_000);
        assert_eq!(m.decisions("api", DecisionOutcome::rejected), 0);
        assert_enforced_through_redis(&l, &redis).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_frozen_under_load_fails_closed_within_the_deadline_and_recovers() {
        let redis = RedisServer::start();
        let l = redis_limiter(&redis, FailureMode::Closed, 1_000_000).await;
        let load = Load::start(&l);
        load.run_for(300).await;
        let rejected_before = l.metrics().decisions("api", DecisionOutcome::rejected);
        assert_eq!(rejected_before, 0);
        redis.pause();
        wait_for_async("the breaker to open", Duration::from_secs(5), || async {
            (!l.redis_healthy()).then_some(())
        })
        .await;
        load.run_for(2_000).await;
        let v = check(&l, "203.0.113.1").await;
        assert_eq!(v.rejected_by.as_deref(), Some("api"));
        assert!(v.retry_after.is_some());
        redis.resume();
        let recovery = time_to_recover(&l).await;
        let slowest = load.stop().await;
        assert!(
            recovery <= Duration::from_secs(1),
            "enforcement resumed after {recovery:?}"
        );
        assert_within_deadline(slowest);
        let m = l.metrics();
        assert!(m.fallbacks(FallbackMode::closed, DecisionOutcome::rejected) >= 2_000);
        assert_eq!(m.fallbacks(FallbackMode::closed, DecisionOutcome::allowed), 0);
        assert!(check(&l, "203.0.113.1").await.allowed());
    }

    #[tokio::test]
    async fn a_limiter_started_before_redis_serves_by_failure_mode_at_once_and_picks_redis_up() {
        let mut redis = RedisServer::start();
        redis.kill();
        let clock = ManualClock::at(T0);
        let l = limiter(
            &with_deadline(
                config(
                    vec![rule("api", Algorithm::FixedWindow, 4, 60_000)],
                    FailureMode::Local,
                ),
                DEADLINE.as_millis() as u64,
            ),
            Some(&redis.url()),
            &clock,
        );
        assert!(!l.redis_healthy());
        let start = Instant::now();
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 6).await,
            4,
            "local fallback at the full share"
        );
        assert!(
            start.elapsed() < DEADLINE,
            "waited {:?} for a Redis that is not there",
            start.elapsed()
        );
        redis.restart();
        healthy(&l).await;
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 6).await,
            0,
            "the requests allowed in process count in Redis"
        );
        assert_eq!(l.metrics().carried_over.get(), 4);
    }

    /// A limiter with one replica's share the whole limit (`requests` a minute), its Redis deadline short.
    async fn local_fallback_limiter(redis: &RedisServer, requests: u64) -> Limiter {
        local_fallback_limiter_on(redis, requests, &ManualClock::at(T0)).await
    }

    async fn local_fallback_limiter_on(redis: &RedisServer, requests: u64, clock: &ManualClock) -> Limiter {
        let l = limiter(
            &with_deadline(
                config(
                    vec![rule("api", Algorithm::FixedWindow, requests, 60_000)],
                    FailureMode::Local,
                ),
                DEADLINE.as_millis() as u64,
            ),
            Some(&redis.url()),
            clock,
        );
        healthy(&l).await;
        l
    }

    /// Sends requests from `ip` until the breaker opens, then more until `n` in all were allowed in
    /// process; returns how many calls went to Redis and failed meanwhile.
    async fn allow_locally(l: &Limiter, ip: &str, n: u64) -> u64 {
        let mut allowed = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while l.redis_healthy() {
            assert!(Instant::now() < deadline, "the breaker did not open");
            if check(l, ip).await.allowed() {
                allowed += 1;
            }
        }
        while allowed < n {
            assert!(check(l, ip).await.allowed(), "the local share is the whole limit");
            allowed += 1;
        }
        let m = l.metrics();
        assert_eq!(
            m.fallbacks(FallbackMode::local, DecisionOutcome::allowed),
            n,
            "every request was decided in process"
        );
        [
            RedisErrorKind::timeout,
            RedisErrorKind::error,
            RedisErrorKind::reply,
        ]
        .into_iter()
        .map(|k| m.redis_errors(k))
        .sum()
    }

    #[tokio::test]
    async fn after_a_restart_redis_counts_what_the_local_fallback_allowed_in_the_window() {
        let mut redis = RedisServer::start();
        let l = local_fallback_limiter(&redis, 30).await;
        redis.kill();
        allow_locally(&l, "198.51.100.7", 20).await;
        redis.restart();
        healthy(&l).await;
        // The restarted Redis knew nothing; now it holds the 20, and the window has 10 left.
        assert_eq!(allowed_of(&l, "198.51.100.7", 30).await, 10);
        assert_eq!(l.metrics().carried_over.get(), 20);
    }

    #[tokio::test]
    async fn after_a_freeze_the_window_allows_no_more_than_its_limit_in_all() {
        let redis = RedisServer::start();
        let l = local_fallback_limiter(&redis, 30).await;
        assert_eq!(allowed_of(&l, "198.51.100.8", 10).await, 10);
        redis.pause();
        let failed_calls = allow_locally(&l, "198.51.100.8", 15).await;
        redis.resume();
        healthy(&l).await;
        // 10 through Redis and 15 in process: 5 left. The calls that timed out while Redis was frozen
        // may still run once it resumes, counting requests twice (never fewer).
        let after = allowed_of(&l, "198.51.100.8", 30).await as u64;
        assert!(
            after <= 5 && after + failed_calls >= 5,
            "{after} allowed after the freeze ({failed_calls} calls failed during it)"
        );
        assert_eq!(l.metrics().carried_over.get(), 15);
    }

    #[tokio::test]
    async fn when_redis_is_killed_mid_window_the_fallback_allows_only_what_redis_had_left() {
        let mut redis = RedisServer::start();
        let l = local_fallback_limiter(&redis, 30).await;
        assert_eq!(allowed_of(&l, "198.51.100.9", 20).await, 20);
        redis.kill();
        // Redis had 10 left for this client: the fallback starts there, not from a fresh 30.
        assert_eq!(allowed_of(&l, "198.51.100.9", 40).await, 10);
        assert!(!l.redis_healthy());
        // A client Redis never saw gets the whole local share.
        assert_eq!(allowed_of(&l, "198.51.100.10", 40).await, 30);
    }

    #[tokio::test]
    async fn each_enforcing_pod_takes_its_share_of_what_redis_had_left() {
        let mut redis = RedisServer::start();
        let l = local_fallback_limiter(&redis, 30).await;
        l.set_enforcing_pods(2);
        assert_eq!(allowed_of(&l, "198.51.100.11", 20).await, 20);
        redis.kill();
        // 10 left in Redis, shared by 2 pods: 5 here (from zero it would have been 30 ÷ 2 = 15).
        assert_eq!(allowed_of(&l, "198.51.100.11", 40).await, 5);
    }

    #[tokio::test]
    async fn a_window_split_by_a_freeze_allows_no_more_than_its_limit_in_all() {
        let redis = RedisServer::start();
        let l = local_fallback_limiter(&redis, 30).await;
        assert_eq!(allowed_of(&l, "198.51.100.12", 20).await, 20);
        redis.pause();
        let during = allowed_of(&l, "198.51.100.12", 40).await;
        assert!(!l.redis_healthy());
        assert_eq!(during, 10, "Redis had 10 left");
        redis.resume();
        healthy(&l).await;
        // 20 through Redis, 10 in process, carried over: nothing left in the window.
        assert_eq!(allowed_of(&l, "198.51.100.12", 30).await, 0);
        assert_eq!(l.metrics().carried_over.get(), 10);
    }

    #[tokio::test]
    async fn a_second_outage_in_the_window_starts_from_what_redis_said_since() {
        let redis = RedisServer::start();
        let l = local_fallback_limiter(&redis, 30).await;
        let ip = "198.51.100.13";
        assert_eq!(allowed_of(&l, ip, 5).await, 5);
        redis.pause();
        let first = allow_locally(&l, ip, 10).await;
        redis.resume();
        healthy(&l).await;
        // Redis counts the 10 (and perhaps calls that timed out during the freeze, counted twice).
        let through_redis = allowed_of(&l, ip, 5).await as u64;
        assert!(
            through_redis <= 5 && through_redis + first >= 5,
            "{through_redis}"
        );
        redis.pause();
        // The bucket of the first outage (25 left when it started, 10 spent) would allow 15; Redis said
        // it had at most 10 left.
        let second = allowed_of(&l, ip, 40).await as u64;
        redis.resume();
        healthy(&l).await;
        let after = allowed_of(&l, ip, 40).await as u64;
        let total = 5 + 10 + through_redis + second + after;
        assert!(
            total <= 30,
            "{total} allowed in a window of 30 (through Redis {through_redis}, second outage {second}, after {after})"
        );
        assert!(second <= 10, "{second} allowed in the second outage");
    }

    #[tokio::test]
    async fn what_redis_said_of_a_past_window_does_not_shrink_the_next_one() {
        let mut redis = RedisServer::start();
        let clock = ManualClock::at(T0);
        let l = local_fallback_limiter_on(&redis, 30, &clock).await;
        assert_eq!(allowed_of(&l, "198.51.100.14", 30).await, 30);
        redis.kill();
        clock.set(next_edge(T0, 60_000));
        assert_eq!(allowed_of(&l, "198.51.100.14", 40).await, 30);
    }

    #[tokio::test]
    async fn the_local_share_follows_the_enforcing_pods_the_operator_counted() {
        let mut redis = RedisServer::start();
        redis.kill();
        let clock = ManualClock::at(T0);
        let l = limiter(
            &with_deadline(
                config(
                    vec![rule("api", Algorithm::FixedWindow, 12, 60_000)],
                    FailureMode::Local,
                ),
                DEADLINE.as_millis() as u64,
            ),
            Some(&redis.url()),
            &clock,
        );
        assert_eq!(
            allowed_of(&l, "198.51.100.1", 20).await,
            12,
            "expectedReplicas (1) until a count is known"
        );
        l.set_enforcing_pods(4);
        assert_eq!(
            allowed_of(&l, "198.51.100.2", 20).await,
            3,
            "12 shared by the 4 pods the operator counted"
        );
        l.set_enforcing_pods(0);
        assert_eq!(allowed_of(&l, "198.51.100.3", 20).await, 12);
    }

    #[tokio::test]
    async fn an_unusable_redis_url_is_a_config_error_naming_the_field() {
        let err = Limiter::with_metrics(
            &config(vec![], FailureMode::Open),
            None,
            Some("not a url"),
            Arc::new(ManualClock::at(T0)),
            sluice_sidecar::limiter::metrics::Metrics::unregistered(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("limits.redis.url"), "{err}");
    }
}
