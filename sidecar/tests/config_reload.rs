//! Hot reload: from a file (including a ConfigMap volume's `..data` symlink swap) and from the Redis
//! config channel; no request lost under load, counters kept, a bad file keeps the running config.

mod proxy_support;

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use fred::prelude::*;
use http::StatusCode;
use proxy_support::*;
use sluice_testsupport::{RedisServer, wait_for_async};

/// A directory laid out like a ConfigMap volume: `sidecar.yaml -> ..data/sidecar.yaml`,
/// `..data -> ..<version>`; updates replace `..data` atomically.
struct ConfigMapDir {
    dir: tempfile::TempDir,
    version: usize,
}

impl ConfigMapDir {
    fn new(yaml: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut me = Self { dir, version: 0 };
        me.swap(yaml);
        std::os::unix::fs::symlink("..data/sidecar.yaml", me.dir.path().join("sidecar.yaml")).unwrap();
        me
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("sidecar.yaml")
    }

    /// What the kubelet does: write a new timestamped dir, point a temp link at it, rename it over `..data`.
    fn swap(&mut self, yaml: &str) {
        self.version += 1;
        let root = self.dir.path();
        let versioned = format!("..2026_11_21_{}", self.version);
        std::fs::create_dir(root.join(&versioned)).unwrap();
        std::fs::write(root.join(&versioned).join("sidecar.yaml"), yaml).unwrap();
        let tmp = root.join("..data_tmp");
        std::os::unix::fs::symlink(&versioned, &tmp).unwrap();
        std::fs::rename(&tmp, root.join("..data")).unwrap();
        if self.version > 1 {
            let old = root.join(format!("..2026_11_21_{}", self.version - 1));
            std::fs::remove_dir_all(old).unwrap();
        }
    }
}

fn policy_config(generation: i64, requests: u64) -> String {
    format!(
        r#"
version: 1
policy: {{namespace: shop, name: checkout, generation: {generation}}}
limits:
  rules:
  - name: per-client
    key: [{{type: clientIp}}]
    limit: {{requests: {requests}, window: 1h}}
"#
    )
}

async fn wait_generation(sidecar: &Sidecar, generation: i64) {
    wait_for_async(
        &format!("generation {generation} to be applied"),
        Duration::from_secs(10),
        || async { (sidecar.state.snapshot().effective.generation() == generation).then_some(()) },
    )
    .await;
}

async fn wait_redis(sidecar: &Sidecar) {
    wait_for_async("the limiter to reach Redis", Duration::from_secs(10), || async {
        sidecar.state.limiter.redis_healthy().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_under_load_loses_no_request() {
    let app = start_upstream().await;
    let mut volume = ConfigMapDir::new(&policy_config(1, 1_000_000));
    let sidecar = start_sidecar("", app.addr, None, Some(&volume.path())).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, ok, failed, addr) = (stop.clone(), ok.clone(), failed.clone(), sidecar.addr);
        load.push(tokio::spawn(async move {
            let c = client();
            while !stop.load(Ordering::Relaxed) {
                let r = get(&c, addr, "/", &[]).await;
                let counter = if r.status == StatusCode::OK { &ok } else { &failed };
                counter.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for generation in 2..=11 {
        volume.swap(&policy_config(generation, 1_000_000 + generation as u64));
        wait_generation(&sidecar, generation).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during reloads"
    );
    assert!(ok.load(Ordering::Relaxed) > 0);
    assert_eq!(sidecar.state.metrics.config_applies.get(), 11);
}

#[tokio::test]
async fn a_configmap_symlink_swap_changes_the_limit_and_keeps_the_counters() {
    let redis = RedisServer::start();
    let app = start_upstream().await;
    let mut volume = ConfigMapDir::new(&policy_config(1, 3));
    let sidecar = start_sidecar("", app.addr, Some(&redis.url()), Some(&volume.path())).await;
    wait_redis(&sidecar).await;
    let c = client();
    for _ in 0..2 {
        assert_eq!(get(&c, sidecar.addr, "/", &[]).await.status, StatusCode::OK);
    }
    volume.swap(&policy_config(2, 4));
    wait_generation(&sidecar, 2).await;
    // Two used of a new limit of four: two more, not four.
    let statuses: Vec<u16> = futures::future::join_all((0..3).map(|_| get(&c, sidecar.addr, "/", &[])))
        .await
        .iter()
        .map(|r| r.status.as_u16())
        .collect();
    let allowed = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(allowed, 2, "{statuses:?}");
}

#[tokio::test]
async fn a_bad_file_keeps_the_running_config_and_counts_the_rejection() {
    let app = start_upstream().await;
    let mut volume = ConfigMapDir::new(&policy_config(1, 5));
    let sidecar = start_sidecar("", app.addr, None, Some(&volume.path())).await;
    volume.swap(&policy_config(2, 5).replace("requests: 5", "requests: 0"));
    let metrics = sidecar.admin;
    let c = client();
    wait_for_async(
        "the rejected reload to be counted",
        Duration::from_secs(10),
        || {
            let c = c.clone();
            async move {
                let body = get(&c, metrics, "/metrics", &[]).await.body;
                body.contains("sluice_config_reloads_total{source=\"File\",outcome=\"Rejected\"} 1")
                    .then_some(())
            }
        },
    )
    .await;
    assert_eq!(sidecar.state.snapshot().effective.generation(), 1);
    assert_eq!(get(&c, sidecar.addr, "/", &[]).await.status, StatusCode::OK);
    // A good file after the bad one is applied.
    volume.swap(&policy_config(3, 5));
    wait_generation(&sidecar, 3).await;
}

#[tokio::test]
async fn a_newer_config_published_in_redis_is_applied_and_reported_as_enforced() {
    let redis = RedisServer::start();
    let app = start_upstream().await;
    let sidecar = start_sidecar(&policy_config(1, 5), app.addr, Some(&redis.url()), None).await;
    let r = Client::new(Config::from_url(&redis.url()).unwrap(), None, None, None);
    r.init().await.unwrap();
    let key = "sluice:{shop/checkout}:config";
    let enforced = "sluice:{shop/checkout}:enforced";

    // The first report says generation 1.
    wait_for_async("generation 1 reported", Duration::from_secs(10), || {
        let r = r.clone();
        async move {
            let v: Option<String> = r.hget(enforced, "test-pod").await.ok()?;
            v.filter(|v| v.starts_with("1 ")).map(|_| ())
        }
    })
    .await;

    // An older generation in Redis is ignored; a newer one is applied and reported.
    let _: () = r.set(key, policy_config(0, 1), None, None, false).await.unwrap();
    let _: () = r.publish(key, "0").await.unwrap();
    let _: () = r.set(key, policy_config(2, 7), None, None, false).await.unwrap();
    let _: i64 = r.publish(key, "2").await.unwrap();
    wait_generation(&sidecar, 2).await;
    let rules = &sidecar.state.snapshot().effective.config.limits.rules;
    assert_eq!(rules[0].limit.requests, 7);
    wait_for_async("generation 2 reported", Duration::from_secs(10), || {
        let r = r.clone();
        async move {
            let v: Option<String> = r.hget(enforced, "test-pod").await.ok()?;
            v.filter(|v| v.starts_with("2 ")).map(|_| ())
        }
    })
    .await;

    // A bad config in Redis is refused like a bad file.
    let _: () = r.set(key, policy_config(3, 0), None, None, false).await.unwrap();
    let _: i64 = r.publish(key, "3").await.unwrap();
    wait_for_async(
        "the bad Redis config to be rejected",
        Duration::from_secs(10),
        || async {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &sidecar.state.registry).ok()?;
            out.contains("sluice_config_reloads_total{source=\"Redis\",outcome=\"Rejected\"} 1")
                .then_some(())
        },
    )
    .await;
    assert_eq!(sidecar.state.snapshot().effective.generation(), 2);
}

#[tokio::test]
async fn with_the_operators_key_only_configs_it_signed_are_applied_from_redis() {
    use ring::{
        rand::SystemRandom,
        signature::{Ed25519KeyPair, KeyPair},
    };
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let key = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let sign = |body: &str| {
        format!(
            "# sluice-signature: ed25519 {}\n{body}",
            hex(key.sign(body.as_bytes()).as_ref())
        )
    };
    let public = hex(key.public_key().as_ref());

    let redis = RedisServer::start();
    let app = start_upstream().await;
    let sidecar = start_sidecar_with_env(
        &policy_config(1, 5),
        app.addr,
        Some(&redis.url()),
        None,
        &[("SLUICE_CONFIG_VERIFY_KEY", &public)],
    )
    .await;
    let r = Client::new(Config::from_url(&redis.url()).unwrap(), None, None, None);
    r.init().await.unwrap();
    let key_name = "sluice:{shop/checkout}:config";
    let rejected = |n: u32| {
        let state = sidecar.state.clone();
        move || {
            let state = state.clone();
            async move {
                let mut out = String::new();
                prometheus_client::encoding::text::encode(&mut out, &state.registry).ok()?;
                out.contains(&format!(
                    "sluice_config_reloads_total{{source=\"Redis\",outcome=\"Rejected\"}} {n}"
                ))
                .then_some(())
            }
        }
    };

    // Unsigned, pinned with a huge generation: refused, counted, the running config kept.
    let _: () = r
        .set(key_name, policy_config(i64::MAX, 1_000_000), None, None, false)
        .await
        .unwrap();
    let _: i64 = r.publish(key_name, "x").await.unwrap();
    wait_for_async(
        "the unsigned config to be refused",
        Duration::from_secs(10),
        rejected(1),
    )
    .await;
    // Signed by someone else's key: refused too.
    let other = Ed25519KeyPair::from_pkcs8(
        Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .unwrap()
            .as_ref(),
    )
    .unwrap();
    let body = policy_config(9, 1_000_000);
    let forged = format!(
        "# sluice-signature: ed25519 {}\n{body}",
        hex(other.sign(body.as_bytes()).as_ref())
    );
    let _: () = r.set(key_name, forged, None, None, false).await.unwrap();
    let _: i64 = r.publish(key_name, "x").await.unwrap();
    wait_for_async(
        "the forged config to be refused",
        Duration::from_secs(10),
        rejected(2),
    )
    .await;
    assert_eq!(sidecar.state.snapshot().effective.generation(), 1);

    // The operator's signature: applied.
    let _: () = r
        .set(key_name, sign(&policy_config(2, 7)), None, None, false)
        .await
        .unwrap();
    let _: i64 = r.publish(key_name, "2").await.unwrap();
    wait_generation(&sidecar, 2).await;
    assert_eq!(
        sidecar.state.snapshot().effective.config.limits.rules[0]
            .limit
            .requests,
        7
    );
}
