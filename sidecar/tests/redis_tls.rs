//! Redis over TLS against a real `redis-server --tls-port` that speaks nothing else (as managed Redis
//! services with in-transit encryption do), with certificates made here by a CA of the test's own: two
//! limiters share one limit through it, and when a connection cannot be made the reason is named (an
//! untrusted certificate, plaintext spoken to TLS, a wrong password) in the limiter, its metrics and
//! `/readyz`.

mod limiter_common;
mod proxy_support;

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use limiter_common::{T0, check, config, policy, rule};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};
use sluice_crds::sidecar_config::{Algorithm, FailureMode, LimitsConfig};
use sluice_sidecar::{
    clock::{ManualClock, SharedClock},
    limiter::{Limiter, metrics::Metrics},
    redis::Cause,
};
use sluice_testsupport::{free_port, wait_for, wait_for_async};
use tempfile::TempDir;

/// A CA, and a certificate it signed for 127.0.0.1 and localhost, as PEM files in a temp dir.
struct Certs {
    dir: TempDir,
}

impl Certs {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut server = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        server
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = server.signed_by(&key, &issuer).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.pem"), cert.pem()).unwrap();
        std::fs::write(dir.path().join("server.key"), key.serialize_pem()).unwrap();
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn ca(&self) -> String {
        self.path("ca.pem").to_str().unwrap().to_owned()
    }
}

/// A `redis-server` that listens with TLS only.
struct TlsRedis {
    port: u16,
    child: Child,
    _dir: TempDir,
}

impl TlsRedis {
    fn start(certs: &Certs, password: Option<&str>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let mut cmd = Command::new("redis-server");
        cmd.args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
        .args(["--tls-auth-clients", "no", "--loglevel", "warning"])
        .arg("--tls-cert-file")
        .arg(certs.path("server.pem"))
        .arg("--tls-key-file")
        .arg(certs.path("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(certs.path("ca.pem"))
        .arg("--dir")
        .arg(dir.path())
        .arg("--logfile")
        .arg(dir.path().join("redis.log"));
        if let Some(p) = password {
            cmd.args(["--requirepass", p]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (installed by .ci/deps.sh)");
        let server = Self {
            port,
            child,
            _dir: dir,
        };
        wait_for("redis-server to listen for TLS", Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).ok()
        });
        server
    }

    fn url(&self, scheme: &str, password: Option<&str>) -> String {
        let auth = password.map(|p| format!(":{p}@")).unwrap_or_default();
        format!("{scheme}://{auth}127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_config(ca_file: Option<&str>) -> LimitsConfig {
    let mut c = config(
        vec![rule("api", Algorithm::FixedWindow, 10, 60_000)],
        FailureMode::Closed,
    );
    c.redis.prefetch = 0;
    c.redis.ca_file = ca_file.map(str::to_owned);
    c
}

fn limiter(c: &LimitsConfig, url: &str, clock: &ManualClock) -> (Limiter, Metrics) {
    let metrics = Metrics::unregistered();
    let clock: SharedClock = Arc::new(clock.clone());
    let l = Limiter::with_metrics(c, Some(&policy()), Some(url), clock, metrics.clone()).unwrap();
    (l, metrics)
}

/// Waits until the limiter names why Redis cannot be reached, and returns the cause.
async fn problem_of(l: &Limiter) -> sluice_sidecar::redis::Problem {
    wait_for_async(
        "the limiter to name a Redis problem",
        Duration::from_secs(10),
        || async { l.redis_problem() },
    )
    .await
}

#[tokio::test]
async fn two_limiters_share_one_limit_through_a_tls_only_redis() {
    let certs = Certs::new();
    let redis = TlsRedis::start(&certs, None);
    let c = tls_config(Some(&certs.ca()));
    let clock = ManualClock::at(T0);
    let (a, _) = limiter(&c, &redis.url("rediss", None), &clock);
    let (b, _) = limiter(&c, &redis.url("rediss", None), &clock);
    limiter_common::healthy(&a).await;
    limiter_common::healthy(&b).await;
    let mut allowed = 0;
    for i in 0..30 {
        let l = if i % 2 == 0 { &a } else { &b };
        if check(l, "198.51.100.7").await.allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 10, "one limit of 10 across both sidecars");
    assert!(a.redis_problem().is_none() && b.redis_problem().is_none());
}

#[tokio::test]
async fn a_certificate_no_trusted_ca_signed_is_named_as_a_tls_failure() {
    let certs = Certs::new();
    let redis = TlsRedis::start(&certs, None);
    let clock = ManualClock::at(T0);
    let (l, metrics) = limiter(&tls_config(None), &redis.url("rediss", None), &clock);
    let problem = problem_of(&l).await;
    assert_eq!(problem.cause, Cause::tls, "{problem}");
    assert!(
        problem.to_string().contains("caFile"),
        "the fix is named: {problem}"
    );
    assert!(metrics.redis_connection_errors(Cause::tls) >= 1);
    assert!(!l.redis_healthy());
    // failureMode: closed, and Redis never reached: refused, not let through.
    assert!(!check(&l, "198.51.100.7").await.allowed());
}

#[tokio::test]
async fn plaintext_spoken_to_a_tls_only_redis_is_named_with_the_fix() {
    let certs = Certs::new();
    let redis = TlsRedis::start(&certs, None);
    let clock = ManualClock::at(T0);
    let (l, _) = limiter(&tls_config(None), &redis.url("redis", None), &clock);
    let problem = problem_of(&l).await;
    assert!(
        problem.to_string().contains("rediss://"),
        "the message points at the scheme: {problem}"
    );
    assert!(!l.redis_healthy());
}

#[tokio::test]
async fn a_wrong_password_is_named_as_an_auth_failure() {
    let certs = Certs::new();
    let redis = TlsRedis::start(&certs, Some("s3cret"));
    let clock = ManualClock::at(T0);
    let (l, _) = limiter(
        &tls_config(Some(&certs.ca())),
        &redis.url("rediss", Some("wrong")),
        &clock,
    );
    let problem = problem_of(&l).await;
    assert_eq!(problem.cause, Cause::auth, "{problem}");
    assert!(
        !problem.to_string().contains("wrong"),
        "the password never shows: {problem}"
    );
    let (ok, _) = limiter(
        &tls_config(Some(&certs.ca())),
        &redis.url("rediss", Some("s3cret")),
        &clock,
    );
    limiter_common::healthy(&ok).await;
}

#[tokio::test]
async fn readyz_says_why_redis_cannot_be_reached() {
    let certs = Certs::new();
    let redis = TlsRedis::start(&certs, None);
    let upstream = proxy_support::start_upstream().await;
    let url = redis.url("rediss", None);
    let sidecar =
        proxy_support::start_sidecar("limits: {failureMode: local}\n", upstream.addr, Some(&url), None).await;
    let client = proxy_support::client();
    let body = wait_for_async("/readyz to name the problem", Duration::from_secs(10), || async {
        let r = proxy_support::get(&client, sidecar.admin, "/readyz", &[]).await;
        let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        v["redisError"].is_object().then_some(v)
    })
    .await;
    assert_eq!(body["redisError"]["cause"], "tls", "{body}");
    assert_eq!(body["redisHealthy"], false, "{body}");
    assert_eq!(body["ready"], true, "failureMode local stays ready: {body}");
    let metrics = proxy_support::get(&client, sidecar.admin, "/metrics", &[])
        .await
        .body;
    assert!(
        metrics.contains("sluice_limiter_redis_connection_errors_total{cause=\"tls\"}"),
        "{metrics}"
    );
}

#[test]
fn an_unreadable_ca_file_stops_the_sidecar_at_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("config.yaml");
    std::fs::write(
        &file,
        "limits:\n  redis:\n    url: rediss://127.0.0.1:6380\n    caFile: /nonexistent/ca.pem\n",
    )
    .unwrap();
    let env: [(&str, &str); 0] = [];
    let err = sluice_sidecar::proxy::check_config(Path::new(&file), &env).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("limits.redis.caFile: cannot read /nonexistent/ca.pem"),
        "{err}"
    );
}
