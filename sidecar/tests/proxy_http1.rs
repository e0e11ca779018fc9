//! The HTTP/1.1 fast path byte by byte, between a raw client and a scripted app: pipelining, bodies in
//! both framings and both directions, responses without a body or delimited by close, interim responses,
//! kept-alive app connections that went stale, and what it hands to hyper (HTTP/1.0, ambiguous framing,
//! `Expect`, an upgrade after fast-path requests) or refuses (malformed chunks, bad app framing).

mod proxy_support;

use std::{sync::atomic::Ordering, time::Duration};

use proxy_support::{
    raw::{RawClient, Reply, Seen, decode_chunked, ok, raw_app},
    start_sidecar, start_upstream,
};
use sluice_testsupport::wait_for_async;

const NO_RULES: &str = "version: 1\n";

const LIMITED: &str = r#"
version: 1
limits:
  maxRequestBody: 100000
  rules:
  - name: two-per-hour
    key: [{type: clientIp}]
    limit: {requests: 2, window: 1h}
"#;

/// An app that answers every request with its path and body length.
fn echo(req: &Seen) -> Reply {
    let path = req.head.split(' ').nth(1).unwrap().to_owned();
    Reply::Send(ok(&format!("{path} body={}", req.body.len())))
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_over_one_app_connection() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(
        b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n\
          POST /two HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
          GET /three HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    for want in ["/one body=0", "/two body=5", "/three body=0"] {
        let resp = c.response(false).await.unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(String::from_utf8(resp.body).unwrap(), want);
    }
    assert_eq!(app.connections.load(Ordering::SeqCst), 1);
    let seen = app.requests();
    assert_eq!(seen[1].body, b"hello");
    assert!(
        seen[0].head.contains("x-forwarded-for: 127.0.0.1\r\n"),
        "{}",
        seen[0].head
    );
}

#[tokio::test]
async fn chunked_bodies_pass_through_both_ways_with_their_trailers() {
    let app = raw_app(|req| {
        let body = format!("got {} bytes", req.body.len());
        Reply::Send(
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\nx-sum: 7\r\n\r\n",
                body.len()
            )
            .into_bytes(),
        )
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    // Sent in pieces, so the body streams after the head was forwarded.
    c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n")
        .await;
    c.send(b"6\r\n world\r\n0\r\nx-client-trailer: 1\r\n\r\n").await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.field("transfer-encoding").as_deref(), Some("chunked"));
    let wire = String::from_utf8(resp.body.clone()).unwrap();
    assert!(wire.ends_with("0\r\nx-sum: 7\r\n\r\n"), "{wire:?}");
    assert_eq!(decode_chunked(&resp.body), b"got 11 bytes");
    assert_eq!(app.requests()[0].body, b"hello world");

    // The connection is still in step.
    c.send(b"GET /again HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
}

#[tokio::test]
async fn large_bodies_stream_through_intact() {
    let app = raw_app(|req| {
        let size: usize = req.head.split(' ').nth(1).unwrap()[1..].parse().unwrap();
        let body: String = (0..size).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
        assert_eq!(req.body.len(), 50_000);
        Reply::Send(ok(&body))
    })
    .await;
    let sidecar = start_sidecar(
        "version: 1\nlimits: {maxRequestBody: 100000}\n",
        app.addr,
        None,
        None,
    )
    .await;
    let mut c = RawClient::connect(sidecar.addr).await;
    let mut req = b"PUT /1000000 HTTP/1.1\r\nHost: a\r\nContent-Length: 50000\r\n\r\n".to_vec();
    req.extend(std::iter::repeat_n(b'x', 50_000));
    c.send(&req).await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.body.len(), 1_000_000);
    assert!(
        resp.body
            .iter()
            .enumerate()
            .all(|(i, &b)| b == b'a' + (i % 26) as u8)
    );
    assert_eq!(app.requests()[0].body, vec![b'x'; 50_000]);
}

#[tokio::test]
async fn responses_without_a_body_keep_the_connection_in_step() {
    let app = raw_app(|req| {
        Reply::Send(match req.head.split(' ').nth(1).unwrap() {
            "/none" => b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(),
            "/cached" => b"HTTP/1.1 304 Not Modified\r\nContent-Length: 42\r\n\r\n".to_vec(),
            _ => b"HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n".to_vec(),
        })
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"HEAD /head HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let head = c.response(true).await.unwrap();
    assert_eq!(
        (head.status, head.field("content-length").as_deref()),
        (200, Some("42"))
    );
    c.send(b"GET /none HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 204);
    c.send(b"GET /cached HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 304);
    assert_eq!(app.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_delimited_by_close_reaches_the_client_which_is_then_closed() {
    let app = raw_app(|_| Reply::SendAndClose(b"HTTP/1.1 200 OK\r\n\r\nuntil the end".to_vec())).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.field("connection").as_deref(), Some("close"));
    assert_eq!(resp.body, b"until the end");
}

#[tokio::test]
async fn interim_responses_are_forwarded_before_the_final_one() {
    let app = raw_app(|_| {
        let mut bytes = b"HTTP/1.1 103 Early Hints\r\nLink: </app.css>; rel=preload\r\n\r\n".to_vec();
        bytes.extend(ok("final"));
        Reply::Send(bytes)
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let hints = c.response(false).await.unwrap();
    assert_eq!(hints.status, 103);
    assert!(hints.field("link").is_some());
    let last = c.response(false).await.unwrap();
    assert_eq!((last.status, last.body.as_slice()), (200, &b"final"[..]));
}

#[tokio::test]
async fn a_kept_alive_app_connection_the_app_dropped_is_retried_only_for_idempotent_requests() {
    // The app drops the second request on its first connection unanswered (the race of a keep-alive
    // timeout), and answers everything else.
    let app = raw_app(|req| {
        if req.connection == 0 && req.nth == 1 {
            Reply::Close
        } else {
            echo(req)
        }
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    c.send(b"GET /second HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let retried = c.response(false).await.unwrap();
    assert_eq!(String::from_utf8(retried.body).unwrap(), "/second body=0");

    let app = raw_app(|req| {
        if req.connection == 0 && req.nth == 1 {
            Reply::Close
        } else {
            echo(req)
        }
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    c.send(b"POST /pay HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n42")
        .await;
    assert_eq!(c.response(false).await.unwrap().status, 502);
    assert_eq!(app.requests().len(), 2, "a POST is never sent twice");
    // The client connection stays usable.
    c.send(b"GET /after HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
}

#[tokio::test]
async fn an_app_that_closed_while_idle_is_connected_to_again_before_sending() {
    let app = raw_app(|req| Reply::SendAndClose(ok(&format!("n={}", req.nth)))).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    for i in 1..=3 {
        c.send(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nx")
            .await;
        let resp = c.response(false).await.unwrap();
        assert_eq!((resp.status, resp.body.as_slice()), (200, &b"n=0"[..]));
        // The app has closed the connection before the next request is sent (a POST is not retried,
        // so this succeeds only because the proxy notices the close first).
        wait_for_async("the app to close", Duration::from_secs(5), || async {
            (app.closed.load(Ordering::SeqCst) == i).then_some(())
        })
        .await;
    }
    assert_eq!(app.connections.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_refused_request_with_its_body_read_keeps_the_connection() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(LIMITED, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    let post = b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc";
    for want in [200, 200, 429, 429] {
        c.send(post).await;
        let resp = c.response(false).await.unwrap();
        assert_eq!(resp.status, want);
    }
    let refused = {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
        c.response(false).await.unwrap()
    };
    assert_eq!(refused.status, 429);
    assert!(refused.field("retry-after").is_some());
    assert_eq!(String::from_utf8(refused.body).unwrap(), "Too Many Requests");
    assert_eq!(app.requests().len(), 2);
}

#[tokio::test]
async fn a_malformed_chunked_body_is_a_400_and_the_connection_closes() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        .await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.status, 400);
    assert_eq!(resp.field("connection").as_deref(), Some("close"));
    assert!(c.closed().await);
    assert!(app.requests().is_empty());
}

#[tokio::test]
async fn an_app_response_with_conflicting_lengths_is_a_502() {
    let app = raw_app(|_| {
        Reply::Send(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd".to_vec())
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 502);
}

#[tokio::test]
async fn ambiguous_framing_is_left_to_hyper_and_nothing_is_smuggled() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    // A request smuggling attempt: two framings. The fast path hands it over; hyper reads it as RFC 9112
    // says (chunked wins: an empty body) and closes the connection after answering, so the bytes after
    // the chunked body are never read as a request.
    c.send(
        b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n\
          0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&resp.body), "/p body=0");
    assert_eq!(resp.field("connection").as_deref(), Some("close"));
    assert!(c.closed().await);
    let seen = app.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(
        !seen[0].head.to_ascii_lowercase().contains("content-length"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn http_1_0_and_expect_are_served_by_hyper_after_fast_path_requests() {
    let app = start_upstream().await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /fast HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    // Expect: 100-continue: hyper answers 100 once the body is wanted.
    c.send(b"PUT /up HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        .await;
    let go_on = c.response(false).await.unwrap();
    assert_eq!(go_on.status, 100);
    c.send(b"data").await;
    let put = c.response(false).await.unwrap();
    assert_eq!(put.status, 200);
    assert!(String::from_utf8_lossy(&put.body).contains("body-bytes=4"));

    let mut old = RawClient::connect(sidecar.addr).await;
    old.send(b"GET /old HTTP/1.0\r\nHost: a\r\n\r\n").await;
    let resp = old.response(false).await.unwrap();
    assert_eq!(resp.status, 200);
    assert!(String::from_utf8_lossy(&resp.body).contains("x-forwarded-for: 127.0.0.1"));
}

#[tokio::test]
async fn an_idle_connection_closes_at_shutdown() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    sidecar.stop.cancel();
    assert!(c.closed().await);
}
