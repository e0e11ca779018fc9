//! The proxy in process against a real upstream app (and a real Redis where limits are counted):
//! 429s and quota headers, 413, hop-by-hop stripping, X-Forwarded-For from untrusted peers, WebSocket
//! and h2c pass-through, admin endpoints, draining on shutdown.

mod proxy_support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use proxy_support::*;
use sluice_testsupport::{RedisServer, wait_for_async};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const TWO_PER_HOUR: &str = r#"
version: 1
limits:
  rules:
  - name: two-per-hour
    key: [{type: clientIp}]
    limit: {requests: 2, window: 1h}
"#;

const ONE_THOUSAND_PER_HOUR: &str = r#"
version: 1
limits:
  maxRequestBody: 1000
  rules:
  - name: generous
    limit: {requests: 1000000, window: 1h}
"#;

#[tokio::test]
async fn a_rejection_is_429_too_many_requests_with_retry_after_and_quota_headers() {
    let redis = RedisServer::start();
    let app = start_upstream().await;
    let sidecar = start_sidecar(TWO_PER_HOUR, app.addr, Some(&redis.url()), None).await;
    let c = client();
    // The limiter starts with Redis unknown and probes it; wait until it decides through Redis.
    wait_for_async("the limiter to reach Redis", Duration::from_secs(10), || async {
        sidecar.state.limiter.redis_healthy().then_some(())
    })
    .await;

    let first = get(&c, sidecar.addr, "/a", &[]).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.headers["x-ratelimit-limit"], "2");
    assert_eq!(first.headers["x-ratelimit-remaining"], "1");
    assert!(first.headers.contains_key("x-ratelimit-reset"));
    assert_eq!(first.headers["ratelimit-policy"], "\"two-per-hour\";q=2;w=3600");
    assert!(
        first.headers["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"two-per-hour\";r=1;t=")
    );
    assert_eq!(get(&c, sidecar.addr, "/a", &[]).await.status, StatusCode::OK);

    let rejected = get(&c, sidecar.addr, "/a", &[]).await;
    assert_eq!(rejected.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(rejected.body, "Too Many Requests");
    let retry: u64 = rejected.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=3600).contains(&retry), "retry-after {retry}");
    assert_eq!(rejected.headers["x-ratelimit-remaining"], "0");
    assert_eq!(app.arrived.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_body_over_the_limit_is_answered_413_whether_its_length_is_declared_or_streamed() {
    let app = start_upstream().await;
    let sidecar = start_sidecar(ONE_THOUSAND_PER_HOUR, app.addr, None, None).await;
    let c = client();

    let small = Request::post(format!("http://{}/upload", sidecar.addr))
        .body(Full::new(Bytes::from(vec![b'x'; 1000])))
        .unwrap();
    let reply = send(&c, small).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.contains("body-bytes=1000"), "{}", reply.body);

    let declared = Request::post(format!("http://{}/upload", sidecar.addr))
        .body(Full::new(Bytes::from(vec![b'x'; 1001])))
        .unwrap();
    assert_eq!(send(&c, declared).await.status, StatusCode::PAYLOAD_TOO_LARGE);

    // Chunked: no Content-Length, so the limit is enforced while streaming.
    let chunks: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = (0..5)
        .map(|_| Ok(Frame::data(Bytes::from(vec![b'y'; 400]))))
        .collect();
    let streamed = Request::post(format!("http://{}/upload", sidecar.addr))
        .body(StreamBody::new(futures::stream::iter(chunks)))
        .unwrap();
    let chunked_client = hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let resp = chunked_client.request(streamed).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn hop_by_hop_headers_are_stripped_in_both_directions() {
    let app = start_upstream().await;
    let sidecar = start_sidecar(ONE_THOUSAND_PER_HOUR, app.addr, None, None).await;
    let reply = get(
        &client(),
        sidecar.addr,
        "/",
        &[
            ("connection", "keep-alive, x-client-hop"),
            ("x-client-hop", "secret"),
            ("keep-alive", "timeout=5"),
            ("te", "trailers"),
            ("proxy-connection", "keep-alive"),
            ("x-end-to-end", "kept"),
        ],
    )
    .await;
    let seen = reply.body.to_lowercase();
    for hop in [
        "x-client-hop",
        "keep-alive:",
        "te:",
        "proxy-connection",
        "connection:",
    ] {
        assert!(!seen.contains(hop), "app saw {hop}: {seen}");
    }
    assert!(seen.contains("x-end-to-end: kept"), "{seen}");
    assert!(
        !reply.headers.contains_key("x-upstream-hop"),
        "{:?}",
        reply.headers
    );
    assert_eq!(reply.headers["x-upstream-e2e"], "kept");
}

#[tokio::test]
async fn a_spoofed_x_forwarded_for_from_an_untrusted_peer_neither_dodges_the_limit_nor_reaches_the_app() {
    let app = start_upstream().await;
    let sidecar = start_sidecar(TWO_PER_HOUR, app.addr, None, None).await;
    let c = client();
    let mut statuses = Vec::new();
    for fake in ["1.1.1.1", "2.2.2.2", "3.3.3.3"] {
        let r = get(&c, sidecar.addr, "/", &[("x-forwarded-for", fake)]).await;
        if r.status == StatusCode::OK {
            assert!(r.body.contains("x-forwarded-for: 127.0.0.1\n"), "{}", r.body);
            assert!(r.body.contains("x-forwarded-proto: http\n"), "{}", r.body);
        }
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit() {
    let app = start_upstream().await;
    let yaml = format!("{TWO_PER_HOUR}  clientIp: {{trustedProxies: [127.0.0.1/32]}}\n");
    let sidecar = start_sidecar(&yaml, app.addr, None, None).await;
    let c = client();
    for fake in ["1.1.1.1", "1.1.1.1", "2.2.2.2", "2.2.2.2"] {
        let r = get(&c, sidecar.addr, "/", &[("x-forwarded-for", fake)]).await;
        assert_eq!(r.status, StatusCode::OK, "{fake}");
        assert!(
            r.body.contains(&format!("x-forwarded-for: {fake}, 127.0.0.1\n")),
            "{}",
            r.body
        );
    }
    let third = get(&c, sidecar.addr, "/", &[("x-forwarded-for", "1.1.1.1")]).await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_websocket_upgrade_passes_through_and_carries_bytes_both_ways() {
    let app = start_upstream().await;
    let sidecar = start_sidecar(ONE_THOUSAND_PER_HOUR, app.addr, None, None).await;
    let mut s = TcpStream::connect(sidecar.addr).await.unwrap();
    // A plain request first (the fast path), then the upgrade on the same connection (handed to hyper
    // with the bytes already read).
    s.write_all(b"GET /first HTTP/1.1\r\nHost: app\r\n\r\n")
        .await
        .unwrap();
    let mut first = Vec::new();
    let mut byte = [0u8; 1];
    while !String::from_utf8_lossy(&first).contains("body-bytes=0\n") {
        s.read_exact(&mut byte).await.unwrap();
        first.push(byte[0]);
    }
    assert!(first.starts_with(b"HTTP/1.1 200 OK\r\n"));
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap().to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    s.write_all(b"ping through the tunnel").await.unwrap();
    let mut echo = [0u8; 23];
    s.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"ping through the tunnel");
}

#[tokio::test]
async fn h2c_clients_are_served_and_forwarded_as_h2c_when_the_app_speaks_it() {
    let app = start_upstream().await;
    let yaml = format!("{ONE_THOUSAND_PER_HOUR}  upstreamProtocol: matchClient\n");
    let sidecar = start_sidecar(&yaml, app.addr, None, None).await;
    let h2 = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let reply = send(
        &h2,
        Request::get(format!("http://{}/h2", sidecar.addr))
            .version(http::Version::HTTP_2)
            .header("te", "trailers")
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.starts_with("version=HTTP/2.0"), "{}", reply.body);
    // gRPC needs `te: trailers` to survive the hop-by-hop stripping on an HTTP/2 hop.
    assert!(reply.body.contains("te: trailers\n"), "{}", reply.body);

    // HTTP/1.1 clients of the same sidecar still reach the app over HTTP/1.1.
    let h1 = get(&client(), sidecar.addr, "/h1", &[]).await;
    assert!(h1.body.starts_with("version=HTTP/1.1"), "{}", h1.body);
}

#[tokio::test]
async fn http1_clients_reach_an_app_that_speaks_only_h2c() {
    let app = start_upstream().await;
    let yaml = format!("{ONE_THOUSAND_PER_HOUR}  upstreamProtocol: h2c\n");
    let sidecar = start_sidecar(&yaml, app.addr, None, None).await;
    let c = client();
    for path in ["/one", "/two"] {
        let reply = get(&c, sidecar.addr, path, &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.body.starts_with("version=HTTP/2.0"), "{}", reply.body);
        assert_eq!(reply.headers["x-ratelimit-limit"], "1000000");
    }
}

#[tokio::test]
async fn an_h2c_client_reaches_an_http1_app_by_default() {
    let app = start_upstream().await;
    let sidecar = start_sidecar(ONE_THOUSAND_PER_HOUR, app.addr, None, None).await;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        TokioIo::new(TcpStream::connect(sidecar.addr).await.unwrap()),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            Request::get(format!("http://{}/x", sidecar.addr))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(body.starts_with("version=HTTP/1.1"), "{body}");
    assert!(body.contains(&format!("host: {}", sidecar.addr)), "{body}");
}

#[tokio::test]
async fn admin_endpoints_report_health_readiness_and_metrics() {
    let app = start_upstream().await;
    let sidecar = start_sidecar(TWO_PER_HOUR, app.addr, None, None).await;
    let c = client();
    for _ in 0..3 {
        get(&c, sidecar.addr, "/", &[]).await;
    }
    assert_eq!(
        get(&c, sidecar.admin, "/healthz", &[]).await.status,
        StatusCode::OK
    );
    let ready = get(&c, sidecar.admin, "/readyz", &[]).await;
    assert_eq!(ready.status, StatusCode::OK);
    assert!(ready.body.contains("\"ready\":true"), "{}", ready.body);
    let metrics = get(&c, sidecar.admin, "/metrics", &[]).await.body;
    for line in [
        "sluice_proxy_requests_total{outcome=\"Forwarded\"} 2",
        "sluice_proxy_requests_total{outcome=\"Limited\"} 1",
        "sluice_config_generation 0",
        "sluice_proxy_upstream_latency_seconds_count 2",
    ] {
        assert!(metrics.contains(line), "missing {line:?} in\n{metrics}");
    }
    // The gRPC worker API is a worker's, never the proxy's.
    assert!(!metrics.contains("sluice_grpc_streams"), "{metrics}");
}

#[tokio::test]
async fn shutdown_stops_accepting_and_lets_in_flight_requests_finish() {
    let app = start_upstream().await;
    let mut sidecar = start_sidecar(ONE_THOUSAND_PER_HOUR, app.addr, None, None).await;
    let c = client();
    let addr = sidecar.addr;
    let in_flight = tokio::spawn(async move { get(&c, addr, "/slow?ms=400", &[]).await });
    wait_for_async(
        "the slow request to reach the app",
        Duration::from_secs(5),
        || async { (app.arrived.load(std::sync::atomic::Ordering::SeqCst) == 1).then_some(()) },
    )
    .await;
    sidecar.stop.cancel();
    let reply = in_flight.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    assert!(!sidecar.state.ready());
    let task = sidecar.task.take().unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
}
