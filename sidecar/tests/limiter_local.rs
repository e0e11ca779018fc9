//! The limiter without Redis (the sandbox, and the local fallback's state): full limits in process, bounded
//! memory under 100k client addresses, client grouping, shadow rules, the allow list, the seed tiers and
//! hot reload.

mod limiter_common;

/// Named `limiter` so `cargo nextest run -p sluice-sidecar limiter` selects these tests too.
mod limiter {

    use std::{net::Ipv4Addr, time::Duration};

    use crate::limiter_common::*;
    use http::{HeaderMap, Method};
    use sluice_crds::sidecar_config::{Algorithm, FailureMode, KeyPart, KeySource, RuleMatch};
    use sluice_sidecar::{
        clock::ManualClock,
        limiter::{RequestFacts, metrics::DecisionOutcome},
    };

    #[tokio::test]
    async fn without_redis_the_full_limit_is_enforced_in_process() {
        let mut cfg = config(
            vec![rule("api", Algorithm::SlidingLog, 5, 60_000)],
            FailureMode::Closed,
        );
        cfg.expected_replicas = 3;
        let clock = ManualClock::at(T0);
        let l = limiter(&cfg, None, &clock);
        assert!(!l.uses_redis() && !l.redis_healthy());
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 8).await,
            5,
            "a single process: not divided by replicas"
        );
        let v = check(&l, "198.51.100.7").await;
        let q = v.quota.unwrap();
        assert_eq!((&*q.rule, q.limit, q.remaining), ("api", 5, 0));
        assert_eq!(v.retry_after, Some(Duration::from_secs(60)));
        clock.advance(Duration::from_secs(60));
        assert_eq!(allowed_of(&l, "198.51.100.7", 8).await, 5);
    }

    #[tokio::test]
    async fn a_hundred_thousand_client_addresses_keep_local_buckets_under_the_cap() {
        let mut cfg = config(
            vec![rule("api", Algorithm::TokenBucket, 10, 1_000)],
            FailureMode::Local,
        );
        cfg.local_max_keys = 10_000;
        let clock = ManualClock::at(T0);
        let l = limiter(&cfg, None, &clock);
        for i in 0..100_000u32 {
            let ip = Ipv4Addr::from(0x0A00_0000 + i).to_string();
            check(&l, &ip).await;
            assert!(
                l.local_buckets() <= 10_000,
                "{} buckets after {i} clients",
                l.local_buckets()
            );
            // 2 ms per client: a bucket drains in 100 ms, so older clients go idle and can be evicted.
            clock.advance(Duration::from_millis(2));
        }
        let m = l.metrics();
        assert!(
            m.local_evictions.get() >= 90_000,
            "evicted {}",
            m.local_evictions.get()
        );
        assert_eq!(m.local_buckets.get() as usize, l.local_buckets());
    }

    #[tokio::test]
    async fn ipv6_clients_in_one_slash_64_share_one_limit_and_mapped_ipv4_counts_as_ipv4() {
        let l = limiter(
            &config(
                vec![rule("api", Algorithm::FixedWindow, 3, 60_000)],
                FailureMode::Local,
            ),
            None,
            &ManualClock::at(T0),
        );
        assert_eq!(allowed_of(&l, "2001:db8:a:b::1", 2).await, 2);
        assert_eq!(allowed_of(&l, "2001:db8:a:b:ffff::99", 2).await, 1, "same /64");
        assert_eq!(allowed_of(&l, "2001:db8:a:c::1", 3).await, 3, "next /64");
        assert_eq!(allowed_of(&l, "192.0.2.1", 2).await, 2);
        assert_eq!(
            allowed_of(&l, "::ffff:192.0.2.1", 2).await,
            1,
            "mapped form of the same client"
        );
    }

    #[tokio::test]
    async fn shadow_rules_count_rejections_but_never_reject() {
        let mut shadow = rule("trial", Algorithm::FixedWindow, 2, 60_000);
        shadow.shadow = true;
        let l = limiter(
            &config(
                vec![shadow, rule("api", Algorithm::FixedWindow, 100, 60_000)],
                FailureMode::Local,
            ),
            None,
            &ManualClock::at(T0),
        );
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 5);
        let m = l.metrics();
        assert_eq!(m.decisions("trial", DecisionOutcome::shadow_rejected), 3);
        assert_eq!(m.decisions("trial", DecisionOutcome::rejected), 0);
        assert_eq!(
            &*check(&l, "198.51.100.7").await.quota.unwrap().rule,
            "api",
            "shadow rules stay out of headers"
        );
    }

    #[tokio::test]
    async fn allow_listed_clients_are_never_limited() {
        let mut cfg = config(
            vec![rule("api", Algorithm::FixedWindow, 1, 60_000)],
            FailureMode::Local,
        );
        cfg.allow_list = vec!["10.0.0.0/8".parse().unwrap(), "2001:db8::/32".parse().unwrap()];
        let l = limiter(&cfg, None, &ManualClock::at(T0));
        assert_eq!(allowed_of(&l, "10.1.2.3", 5).await, 5);
        assert_eq!(allowed_of(&l, "::ffff:10.1.2.3", 5).await, 5);
        assert_eq!(allowed_of(&l, "2001:db8::7", 5).await, 5);
        assert_eq!(allowed_of(&l, "198.51.100.7", 5).await, 1);
        assert!(check(&l, "10.1.2.3").await.quota.is_none());
    }

    #[tokio::test]
    async fn every_applying_rule_must_allow_and_the_tightest_is_reported() {
        let mut login = rule("login", Algorithm::FixedWindow, 2, 60_000);
        login.matches = RuleMatch {
            path_prefix: Some("/login".into()),
            ..Default::default()
        };
        let l = limiter(
            &config(
                vec![rule("all", Algorithm::FixedWindow, 10, 60_000), login],
                FailureMode::Local,
            ),
            None,
            &ManualClock::at(T0),
        );
        let req = |path: &'static str| RequestFacts {
            method: &Method::POST,
            path,
            host: None,
            headers: no_headers(),
            client_ip: "198.51.100.7".parse().unwrap(),
        };
        let v = l.check(&req("/login")).await;
        let q = v.quota.unwrap();
        assert_eq!((&*q.rule, q.remaining), ("login", 1));
        l.check(&req("/login")).await;
        let v = l.check(&req("/login")).await;
        assert_eq!(v.rejected_by.as_deref(), Some("login"));
        assert_eq!(&*v.quota.unwrap().rule, "login");
        // Other paths only meet the wide rule, which counted the three login attempts too.
        let q = l.check(&req("/other")).await.quota.unwrap();
        assert_eq!((&*q.rule, q.remaining), ("all", 6));
    }

    /// A request from `ip` to `path` carrying `Authorization: Bearer <token>` (none when empty).
    fn post<'a>(path: &'a str, ip: &str, token: &str) -> RequestFacts<'a> {
        let headers: &'static HeaderMap = if token.is_empty() {
            no_headers()
        } else {
            let mut h = HeaderMap::new();
            h.insert("authorization", format!("Bearer {token}").parse().unwrap());
            Box::leak(Box::new(h))
        };
        RequestFacts {
            method: &Method::POST,
            path,
            host: None,
            headers,
            client_ip: ip.parse().unwrap(),
        }
    }

    #[tokio::test]
    async fn the_seed_auth_tier_counts_per_client_ip_whatever_authorization_it_carries() {
        let l = limiter(&config(vec![], FailureMode::Local), None, &ManualClock::at(T0));
        let mut allowed = 0;
        for i in 0..30 {
            // Credential stuffing: a fresh junk token on every attempt.
            let v = l
                .check(&post("/v1/auth/login", "198.51.100.7", &format!("junk-{i}")))
                .await;
            if v.allowed() {
                allowed += 1;
            } else {
                assert_eq!(v.rejected_by.as_deref(), Some("auth"));
            }
        }
        assert_eq!(allowed, 10, "auth tier: 10 per minute per client IP");
        assert!(
            l.check(&post("/v1/auth/login", "198.51.100.8", ""))
                .await
                .allowed(),
            "another address is another client"
        );
    }

    #[tokio::test]
    async fn rotating_tokens_cannot_take_one_client_ip_past_its_ceiling_on_a_credential_tier() {
        let l = limiter(&config(vec![], FailureMode::Local), None, &ManualClock::at(T0));
        let mut allowed = 0;
        let mut by_ceiling = 0;
        for i in 0..1_000 {
            let v = l
                .check(&post("/v1/items", "198.51.100.7", &format!("random-{i}")))
                .await;
            if v.allowed() {
                allowed += 1;
            } else if v.rejected_by.as_deref() == Some("write/client-ip") {
                by_ceiling += 1;
            }
        }
        assert_eq!(
            allowed, 600,
            "10 × the write tier's 60 per minute, whatever the tokens"
        );
        assert_eq!(by_ceiling, 400);
        // The same credential from ever new addresses is still one client of the tier.
        let mut allowed = 0;
        for i in 0..70 {
            if l.check(&post("/v1/items", &format!("203.0.113.{i}"), "alice"))
                .await
                .allowed()
            {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 60, "write tier: 60 per minute per credential");
        // Anonymous clients are keyed by address, and no ceiling doubles their count.
        let v = l.check(&post("/v1/items", "192.0.2.1", "")).await;
        assert_eq!(v.quota.map(|q| q.remaining), Some(59));
    }

    #[tokio::test]
    async fn a_ceiling_can_be_set_per_rule_or_turned_off() {
        let keyed = |ceiling| {
            let mut r = rule("api", Algorithm::FixedWindow, 2, 60_000);
            r.key = vec![KeyPart {
                source: KeySource::Credential,
                ..KeyPart::client_ip()
            }];
            r.client_ip_ceiling = ceiling;
            r
        };
        for (ceiling, expected) in [(Some(3), 6), (Some(0), 100)] {
            let l = limiter(
                &config(vec![keyed(ceiling)], FailureMode::Local),
                None,
                &ManualClock::at(T0),
            );
            let mut allowed = 0;
            for i in 0..100 {
                if l.check(&post("/", "198.51.100.7", &format!("t{i}")))
                    .await
                    .allowed()
                {
                    allowed += 1;
                }
            }
            assert_eq!(allowed, expected, "clientIpCeiling {ceiling:?}");
        }
    }

    #[tokio::test]
    async fn invalid_reloads_name_the_field_and_keep_the_old_rules() {
        let l = limiter(
            &config(
                vec![rule("api", Algorithm::FixedWindow, 1, 60_000)],
                FailureMode::Local,
            ),
            None,
            &ManualClock::at(T0),
        );
        let mut bad = rule("api", Algorithm::FixedWindow, 1, 60_000);
        bad.matches.path_regex = Some("(".into());
        let err = l
            .reconfigure(
                &config(
                    vec![rule("ok", Algorithm::FixedWindow, 1, 1_000), bad.clone()],
                    FailureMode::Local,
                ),
                None,
            )
            .unwrap_err();
        assert!(
            err.to_string().contains("limits.rules[1].match.pathRegex"),
            "{err}"
        );
        let mut dup = config(
            vec![rule("a", Algorithm::FixedWindow, 1, 1_000)],
            FailureMode::Local,
        );
        dup.rules.push(rule("a", Algorithm::SlidingLog, 1, 1_000));
        let err = l.reconfigure(&dup, None).unwrap_err();
        assert!(err.to_string().contains("limits.rules[1].name"), "{err}");
        let err = l
            .reconfigure(
                &config(vec![rule("z", Algorithm::TokenBucket, 1, 0)], FailureMode::Local),
                None,
            )
            .unwrap_err();
        assert!(err.to_string().contains("limits.rules[0].limit.window"), "{err}");
        let mut header = rule("h", Algorithm::FixedWindow, 1, 1_000);
        header.key = vec![KeyPart {
            source: KeySource::HashedHeader,
            name: Some("bad header".into()),
            ..KeyPart::client_ip()
        }];
        let err = l
            .reconfigure(&config(vec![header], FailureMode::Local), None)
            .unwrap_err();
        assert!(err.to_string().contains("limits.rules[0].key[0].name"), "{err}");
        assert_eq!(
            allowed_of(&l, "198.51.100.7", 3).await,
            1,
            "old rules still apply"
        );
    }
}
