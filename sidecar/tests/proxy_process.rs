//! The real `sluice-sidecar` binary: two processes sharing one limit through Redis, and SIGTERM draining
//! in-flight requests.

mod proxy_support;

use std::{
    io::Write,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    sync::atomic::Ordering,
    time::Duration,
};

use http::StatusCode;
use proxy_support::*;
use sluice_testsupport::{RedisServer, free_port, wait_for_async};

/// A sidecar process; killed when dropped.
struct Process {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_sidecar(config: &std::path::Path, upstream: SocketAddr, redis: Option<&str>) -> Process {
    spawn_with(Some(config), upstream, redis, &[])
}

fn spawn_with(
    config: Option<&std::path::Path>,
    upstream: SocketAddr,
    redis: Option<&str>,
    env: &[(&str, &str)],
) -> Process {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"));
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    cmd.envs(env.iter().copied())
        .env_remove("SLUICE_CONFIG")
        .env("SLUICE_LISTEN", addr.to_string())
        .env("SLUICE_ADMIN_LISTEN", admin.to_string())
        .env("SLUICE_UPSTREAM", format!("http://{upstream}"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    if let Some(url) = redis {
        cmd.env("SLUICE_REDIS_URL", url);
    }
    Process {
        child: cmd.spawn().expect("spawn sluice-sidecar"),
        addr,
        admin,
    }
}

async fn wait_ready(p: &Process, redis: bool) {
    let c = client();
    let admin = p.admin;
    wait_for_async("the sidecar to be ready", Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let req = http::Request::get(format!("http://{admin}/readyz"))
                .body(http_body_util::Full::new(bytes::Bytes::new()))
                .unwrap();
            let resp = c.request(req).await.ok()?;
            let ok = resp.status() == StatusCode::OK;
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .ok()?
                .to_bytes();
            let healthy = !redis || String::from_utf8_lossy(&body).contains("\"redisHealthy\":true");
            (ok && healthy).then_some(())
        }
    })
    .await;
}

fn config_file(yaml: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(yaml.as_bytes()).unwrap();
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecar_processes_share_one_limit_exactly() {
    let redis = RedisServer::start();
    let app = start_upstream().await;
    let config = config_file(
        r#"
version: 1
policy: {namespace: shop, name: checkout, generation: 1}
limits:
  failureMode: closed
  rules:
  - name: ten-per-hour
    key: [{type: clientIp}]
    limit: {requests: 10, window: 1h}
"#,
    );
    let a = spawn_sidecar(config.path(), app.addr, Some(&redis.url()));
    let b = spawn_sidecar(config.path(), app.addr, Some(&redis.url()));
    wait_ready(&a, true).await;
    wait_ready(&b, true).await;

    let c = client();
    let mut allowed = 0;
    for i in 0..30 {
        let target = if i % 2 == 0 { a.addr } else { b.addr };
        let r = get(&c, target, "/", &[]).await;
        match r.status {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    assert_eq!(
        allowed, 10,
        "two sidecars together allowed {allowed} of a limit of 10"
    );
    assert_eq!(app.arrived.load(Ordering::SeqCst), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_requests_finish_then_exits_cleanly() {
    let app = start_upstream().await;
    let config = config_file(
        r#"
version: 1
limits:
  shutdownGrace: 10s
  rules:
  - name: generous
    limit: {requests: 100000, window: 1m}
"#,
    );
    let mut p = spawn_sidecar(config.path(), app.addr, None);
    wait_ready(&p, false).await;
    let c = client();
    let addr = p.addr;
    let in_flight = tokio::spawn(async move { get(&c, addr, "/slow?ms=700", &[]).await });
    wait_for_async(
        "the slow request to reach the app",
        Duration::from_secs(5),
        || async { (app.arrived.load(Ordering::SeqCst) == 1).then_some(()) },
    )
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());

    let reply = in_flight.await.unwrap();
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "in-flight request cut off: {}",
        reply.body
    );
    let exit = sluice_testsupport::wait_for("the sidecar to exit", Duration::from_secs(10), || {
        p.child.try_wait().unwrap()
    });
    assert!(exit.success(), "exit status {exit}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_config_file_the_seed_tiers_run_with_the_adr_env_limits() {
    let app = start_upstream().await;
    let p = spawn_with(
        None,
        app.addr,
        None,
        &[("RATE_LIMIT__AUTH_REQUESTS_PER_MINUTE", "2")],
    );
    wait_ready(&p, false).await;
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let req = http::Request::post(format!("http://{}/v1/auth/login", p.addr))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        statuses.push(send(&c, req).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    let read = get(&c, p.addr, "/v1/packages", &[]).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.headers["x-ratelimit-limit"], "300");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_pod_sidecar_serves_the_queue_api_when_asked_to() {
    let pg = tokio::task::spawn_blocking(sluice_testsupport::PgServer::start)
        .await
        .unwrap();
    let pool = sqlx::PgPool::connect(&pg.url()).await.unwrap();
    sluice_queue::schema::migrate(&pool).await.unwrap();
    let app = start_upstream().await;
    let api: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let url = pg.url();
    let p = spawn_with(
        None,
        app.addr,
        None,
        &[
            ("SLUICE_API_LISTEN", &api.to_string()),
            ("SLUICE_DATABASE_URL", &url),
        ],
    );
    wait_ready(&p, false).await;
    let c = client();
    let put = http::Request::put(format!("http://{api}/v1/queues/emails"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .unwrap();
    let created = send(&c, put).await;
    assert!(created.status.is_success(), "{} {}", created.status, created.body);
    let enqueue = http::Request::post(format!("http://{api}/v1/queues/emails/jobs"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            br#"{"kind": "welcome", "payload": {"to": "a@example.com"}}"#,
        )))
        .unwrap();
    let reply = send(&c, enqueue).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let (count,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM sluice.jobs WHERE queue = 'emails' AND kind = 'welcome'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(count, 1);
    // The proxy still proxies beside it.
    assert_eq!(get(&c, p.addr, "/", &[]).await.status, StatusCode::OK);
}

#[test]
fn the_demo_fires_requests_and_prints_allowed_and_limited_counts() {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .args(["demo", "--seconds", "2", "--rate", "40"])
        .env_remove("SLUICE_REDIS_URL")
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("t= 1s  allowed"), "{stdout}");
    let done = stdout
        .lines()
        .find(|l| l.starts_with("done:"))
        .expect("summary line");
    // 40/s for 2 s against 10/s with a burst of 5: most are limited, about 25 pass.
    let allowed: u32 = done.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!((15..=40).contains(&allowed), "{done}");
    assert!(done.contains("0 errors"), "{done}");
}
