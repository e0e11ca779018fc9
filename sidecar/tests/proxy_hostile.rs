//! Requests a careful attacker sends, byte by byte, on both paths a request can take (the HTTP/1.1 fast
//! path, and hyper for what it hands over — HTTP/1.0 here): paths written to escape a prefix rule, heads
//! the limiter and the app could read two ways (two `Host` fields, none, a lower-case method), forged
//! forwarding fields, upgrades to protocols the limiter cannot see into, `Expect: 100-continue` with an
//! app that answers at once, a broken chunked body on the hyper path.

mod proxy_support;

use std::time::{Duration, Instant};

use proxy_support::{
    raw::{RawClient, Reply, Seen, after_head, field_values, ok, raw_app},
    start_sidecar,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request per hour on `/v1/auth/`, and one on host `api.example.com`.
const RULES: &str = r#"
version: 1
limits:
  rules:
  - name: auth
    match: {pathPrefix: /v1/auth/}
    key: [{type: clientIp}]
    limit: {requests: 1, window: 1h}
  - name: by-host
    match: {host: api.example.com}
    key: [{type: clientIp}]
    limit: {requests: 1, window: 1h}
"#;

const NO_RULES: &str = "version: 1\n";

/// An app that answers every request with the target it received.
fn echo_target(req: &Seen) -> Reply {
    let target = req.head.split(' ').nth(1).unwrap().to_owned();
    Reply::Send(ok(&target))
}

/// The status of `raw` sent on a connection of its own.
async fn status_of(addr: std::net::SocketAddr, raw: &str) -> u16 {
    let mut c = RawClient::connect(addr).await;
    c.send(raw.as_bytes()).await;
    c.response(false).await.expect("a response").status
}

#[tokio::test]
async fn paths_written_to_escape_a_prefix_rule_count_against_it_on_both_paths() {
    let app = raw_app(echo_target).await;
    let sidecar = start_sidecar(RULES, app.addr, None, None).await;
    assert_eq!(
        status_of(
            sidecar.addr,
            "POST /v1/auth/login HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
        )
        .await,
        200
    );
    let tricks = [
        "/v1//auth/login",
        "//v1/auth/login",
        "/v1/%61uth/login",
        "/v1/x/../auth/login",
        "/v1/./auth/login",
        "/v1/%2e%2e/v1/auth/login",
        "/v1/auth;x=1/login",
        "/v1/AUTH/../auth/login",
        // Servlet containers strip `;parameters`, then merge and resolve: `/v1/auth/login`.
        "/v1/;/auth/login",
        "/v1/;x=1/auth;y/login",
    ];
    for path in tricks {
        for version in ["HTTP/1.1", "HTTP/1.0"] {
            let raw = format!("POST {path} {version}\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
            assert_eq!(status_of(sidecar.addr, &raw).await, 429, "{raw:?}");
        }
    }
    assert_eq!(app.requests().len(), 1, "no trick reached the app");
}

#[tokio::test]
async fn the_app_receives_the_path_the_rules_read_with_the_query_untouched() {
    let app = raw_app(echo_target).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    for version in ["HTTP/1.1", "HTTP/1.0"] {
        let mut c = RawClient::connect(sidecar.addr).await;
        c.send(format!("GET /v2/%61/./b//c/../d?q=%2F..//x {version}\r\nHost: a\r\n\r\n").as_bytes())
            .await;
        let resp = c.response(false).await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&resp.body),
            "/v2/a/b/d?q=%2F..//x",
            "{version}"
        );
    }
}

#[tokio::test]
async fn paths_that_cannot_be_read_one_way_are_a_400_on_both_paths() {
    let app = raw_app(echo_target).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    for path in [
        "/v1%2fauth/login",
        "/v1/auth\\login",
        "/v1/auth%5Clogin",
        "/a%00b",
        "/a%zz",
        // A dot segment behind `;parameters`: a servlet container serves `/v1/auth/login`.
        "/x/..;/v1/auth/login",
        "/x/%2e%2e;/v1/auth/login",
        "/v1/.;x/auth/login",
    ] {
        for version in ["HTTP/1.1", "HTTP/1.0"] {
            let raw = format!("GET {path} {version}\r\nHost: a\r\n\r\n");
            assert_eq!(status_of(sidecar.addr, &raw).await, 400, "{raw:?}");
        }
    }
    // A fragment is never sent by a client (RFC 9112 §3.2), and a byte outside ASCII has no one reading:
    // refused, in the path or after the query, whichever path the request would have taken.
    for raw in [
        "GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /v1/auth/login?x=1#b HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /a?b#c HTTP/1.0\r\nHost: a\r\n\r\n",
        "GET /caf\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n",
        "GET /a?q=\u{e9} HTTP/1.0\r\nHost: a\r\n\r\n",
        "GET http://a/caf\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n",
    ] {
        assert_eq!(status_of(sidecar.addr, raw).await, 400, "{raw:?}");
    }
    assert!(app.requests().is_empty(), "{:?}", app.requests());
    // On a connection already handed to hyper, a byte outside ASCII is refused there too; a fragment
    // hyper's URI parser drops, so the rules and the app both read the path without it.
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /x HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    c.send(b"GET /a#b HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
        .await;
    assert_eq!(
        String::from_utf8_lossy(&c.response(false).await.unwrap().body),
        "/a"
    );
    c.send("GET /caf\u{e9} HTTP/1.0\r\nHost: a\r\n\r\n".as_bytes())
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 400);
    // Likewise two chunked codings on a handed-off connection.
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /x HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    c.send(b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 400);
    // An app that uses encoded slashes (npm's scoped packages) can keep them, encoded.
    let keep = "version: 1\nlimits: {paths: {escapedSlashes: keep}}\n";
    let sidecar = start_sidecar(keep, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /npm/@scope%2fname HTTP/1.1\r\nHost: a\r\n\r\n")
        .await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&resp.body), "/npm/@scope%2Fname");
}

#[tokio::test]
async fn heads_the_limiter_and_the_app_could_read_two_ways_are_a_400() {
    let app = raw_app(echo_target).await;
    let sidecar = start_sidecar(RULES, app.addr, None, None).await;
    for raw in [
        // RFC 9112 §3.2: two Host fields, none in HTTP/1.1, or a malformed one.
        "GET /x HTTP/1.1\r\nHost: a\r\nHost: api.example.com\r\n\r\n",
        "GET /x HTTP/1.1\r\n\r\n",
        "GET /x HTTP/1.1\r\nHost: a rule=x status=200\r\n\r\n",
        "GET /x HTTP/1.0\r\nHost: a\r\nHost: api.example.com\r\n\r\n",
        "GET /x HTTP/1.0\r\nHost: a/b\r\n\r\n",
        // A known method in lower case: ASP.NET would read it as POST, the rules would not.
        "post /v1/auth/login HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
        "post /v1/auth/login HTTP/1.0\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
    ] {
        assert_eq!(status_of(sidecar.addr, raw).await, 400, "{raw:?}");
    }
    assert!(app.requests().is_empty(), "{:?}", app.requests());
    assert_eq!(
        status_of(
            sidecar.addr,
            "GET /x HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n"
        )
        .await,
        417
    );
}

#[tokio::test]
async fn a_host_rule_holds_for_the_host_in_any_case_with_a_trailing_dot_or_a_port() {
    let app = raw_app(echo_target).await;
    let sidecar = start_sidecar(RULES, app.addr, None, None).await;
    assert_eq!(
        status_of(sidecar.addr, "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n").await,
        200
    );
    for host in ["api.example.com.", "API.Example.COM", "api.example.com.:8080"] {
        let raw = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert_eq!(status_of(sidecar.addr, &raw).await, 429, "{raw:?}");
    }
}

/// Fields that claim where a request came from, as an untrusted client forges them.
const FORGED: &str = "Forwarded: for=10.0.0.1;proto=https\r\nX-Real-IP: 10.0.0.1\r\n\
                      X-Forwarded-Host: admin.internal\r\nX-Forwarded-Port: 443\r\n\
                      True-Client-IP: 10.0.0.1\r\nX_Forwarded_For: 10.0.0.1\r\nX-Kept: yes\r\n";

#[tokio::test]
async fn forwarding_claims_of_an_untrusted_client_never_reach_the_app() {
    let app = raw_app(|_| Reply::Send(ok("ok"))).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    for version in ["HTTP/1.1", "HTTP/1.0"] {
        let mut c = RawClient::connect(sidecar.addr).await;
        c.send(format!("GET / {version}\r\nHost: a\r\n{FORGED}\r\n").as_bytes())
            .await;
        assert_eq!(c.response(false).await.unwrap().status, 200);
    }
    for seen in app.requests() {
        for claim in [
            "forwarded",
            "x-real-ip",
            "x-forwarded-host",
            "x-forwarded-port",
            "true-client-ip",
            "x_forwarded_for",
        ] {
            assert!(
                field_values(&seen.head, claim).is_empty(),
                "{claim} reached the app: {}",
                seen.head
            );
        }
        assert_eq!(field_values(&seen.head, "x-kept"), ["yes"]);
        assert_eq!(field_values(&seen.head, "x-forwarded-for"), ["127.0.0.1"]);
    }
    // A trusted proxy's claims are its own business and pass.
    let trusted = "version: 1\nlimits: {clientIp: {trustedProxies: [127.0.0.0/8]}}\n";
    let sidecar = start_sidecar(trusted, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(format!("GET / HTTP/1.1\r\nHost: a\r\n{FORGED}\r\n").as_bytes())
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    let last = app.requests().pop().unwrap();
    assert_eq!(
        field_values(&last.head, "x-real-ip"),
        ["10.0.0.1"],
        "{}",
        last.head
    );
}

#[tokio::test]
async fn an_h2c_upgrade_is_forwarded_as_a_plain_request_without_its_upgrade() {
    let app = raw_app(|_| Reply::Send(ok("plain"))).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
          HTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.status, 200, "not switched: {}", resp.head);
    let seen = app.requests().pop().unwrap();
    for field in ["upgrade", "http2-settings", "connection"] {
        assert!(
            field_values(&seen.head, field).is_empty(),
            "{field}: {}",
            seen.head
        );
    }
}

#[tokio::test]
async fn an_app_that_answers_an_expect_request_at_once_never_receives_the_body() {
    // The app refuses on the head alone, without a 100, and keeps its connection open.
    let (body_seen_tx, body_seen) = tokio::sync::oneshot::channel();
    let app = after_head(|mut s| async move {
        s.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut rest)).await;
        let _ = body_seen_tx.send(rest);
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 38\r\nExpect: 100-continue\r\n\r\n")
        .await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.status, 401, "the app's answer, not a 100 of the proxy's own");
    // A client that sends its body anyway: a request hidden in it must not reach the app.
    c.send(b"GET /hidden HTTP/1.1\r\nHost: a\r\n\r\n\r\n").await;
    let rest = body_seen.await.unwrap();
    assert!(
        rest.is_empty(),
        "the app received {:?}",
        String::from_utf8_lossy(&rest)
    );
    assert!(c.closed().await, "the client connection closes after the answer");
}

#[tokio::test]
async fn the_apps_own_100_lets_the_body_go() {
    let app = after_head(|mut s| async move {
        s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").await.unwrap();
        let mut body = [0u8; 4];
        s.read_exact(&mut body).await.unwrap();
        assert_eq!(&body, b"data");
        s.write_all(&ok("stored")).await.unwrap();
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"PUT /up HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 100);
    c.send(b"data").await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(
        (resp.status, String::from_utf8_lossy(&resp.body).into_owned()),
        (200, "stored".to_owned())
    );
}

#[tokio::test]
async fn an_app_that_never_sends_100_gets_the_body_after_the_proxy_sends_one() {
    let app = after_head(|mut s| async move {
        let mut body = [0u8; 4];
        s.read_exact(&mut body).await.unwrap();
        s.write_all(&ok("stored")).await.unwrap();
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    let sent = Instant::now();
    c.send(b"PUT /up HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 100);
    assert!(
        sent.elapsed() >= Duration::from_millis(900),
        "the app had its chance first"
    );
    c.send(b"data").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_broken_chunk_size_on_the_hyper_path_is_the_clients_fault() {
    let app = raw_app(|_| Reply::Send(ok("ok"))).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    // A target in absolute form goes to hyper.
    c.send(b"POST http://a/p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n")
        .await;
    let resp = c.response(false).await.expect("an answer");
    assert_eq!(resp.status, 400, "{}", resp.head);
}
