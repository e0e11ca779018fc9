//! The HTTP/1.1 fast path byte by byte, between a raw client and a scripted app: pipelining, bodies in
//! both framings and both directions (chunked ones re-encoded), responses without a body or delimited by
//! close, interim responses, kept-alive app connections that went stale, clients that hang up, apps that
//! answer early, shutdown; what it hands to hyper (HTTP/1.0, ambiguous framing, `Expect`) or refuses
//! (malformed chunks, bad app framing); and the smuggling attempts it must not let through.

mod proxy_support;

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use proxy_support::{
    Sidecar,
    raw::{
        RawApp, RawClient, Reply, Seen, after_head, close_seen_at, decode_chunked, ok, raw_app, start_upload,
    },
    start_sidecar, start_upstream,
};
use sluice_testsupport::wait_for_async;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    sync::Notify,
};

const NO_RULES: &str = "version: 1\n";

/// Room for the large uploads some tests make.
const LARGE_BODIES: &str = "version: 1\nlimits: {maxRequestBody: 1000000000}\n";

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
        assert!(
            resp.field("date").is_some(),
            "the proxy dates what the app did not"
        );
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
async fn chunked_bodies_reach_each_side_in_canonical_framing() {
    let app = raw_app(|req| {
        let body = format!("got {} bytes", req.body.len());
        Reply::Send(
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n00{:x} ;x=1\r\n{body}\r\n0\r\nx-sum: 7\r\n\r\n",
                body.len()
            )
            .into_bytes(),
        )
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    // Sent in pieces, so the body streams after the head was forwarded. Extensions, whitespace and
    // trailer lines (one looks like a forged field, one like a request) never reach the app.
    c.send(
        b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n005 \t;ext=\"1\"\r\nhello\r\n",
    )
    .await;
    c.send(b"6\r\n world\r\n0\r\nX-Forwarded-For: 6.6.6.6\r\nGET /x HTTP/1.1\r\n\r\n")
        .await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.status, 200);
    assert_eq!(resp.field("transfer-encoding").as_deref(), Some("chunked"));
    assert_eq!(
        String::from_utf8(resp.body).unwrap(),
        "c\r\ngot 11 bytes\r\n0\r\n\r\n"
    );
    let seen = &app.requests()[0];
    assert_eq!(seen.wire, b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
    assert_eq!(seen.body, b"hello world");

    // The connection is still in step.
    c.send(b"GET /again HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    assert_eq!(app.requests().len(), 2);
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
            "/full" => ok("complete"),
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
    // No stray bytes followed any of them: the next response starts where it should.
    c.send(b"GET /full HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let full = c.response(false).await.unwrap();
    assert_eq!((full.status, full.body.as_slice()), (200, &b"complete"[..]));
    assert_eq!(app.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_response_delimited_by_close_goes_out_chunked_and_the_client_connection_stays_open() {
    let app = raw_app(|_| Reply::SendAndClose(b"HTTP/1.1 200 OK\r\n\r\nuntil the end".to_vec())).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    for _ in 0..2 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
        let resp = c.response(false).await.unwrap();
        assert_eq!(resp.field("connection"), None);
        assert_eq!(resp.field("transfer-encoding").as_deref(), Some("chunked"));
        assert_eq!(decode_chunked(&resp.body), b"until the end");
    }
    assert_eq!(app.connections.load(Ordering::SeqCst), 2);
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

/// An app that drops the second request on its first connection unanswered (the race of a keep-alive
/// timeout) and answers everything else, behind a sidecar, with one request already answered over a
/// client connection that is returned.
async fn second_request_dropped() -> (RawApp, Sidecar, RawClient) {
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
    (app, sidecar, c)
}

#[tokio::test]
async fn a_safe_request_the_app_dropped_on_a_kept_alive_connection_is_sent_again() {
    let (app, _sidecar, mut c) = second_request_dropped().await;
    c.send(b"GET /second HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let retried = c.response(false).await.unwrap();
    assert_eq!(String::from_utf8(retried.body).unwrap(), "/second body=0");
    let second: Vec<(usize, usize)> = app
        .requests()
        .iter()
        .filter(|r| r.head.starts_with("GET /second"))
        .map(|r| (r.connection, r.nth))
        .collect();
    assert_eq!(
        second,
        [(0, 1), (1, 0)],
        "dropped on the kept-alive connection, sent again on a new one"
    );
}

#[tokio::test]
async fn an_unsafe_request_the_app_dropped_is_a_502_and_never_sent_twice() {
    let (app, _sidecar, mut c) = second_request_dropped().await;
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
        // The app's close has reached the proxy's socket before the next request is sent (a POST is not
        // retried, so this succeeds only because the proxy notices the close before sending).
        let proxy_side = app.peers.lock().unwrap()[i - 1];
        wait_for_async(
            "the app's close to reach the proxy",
            Duration::from_secs(5),
            || async { close_seen_at(proxy_side, app.addr).then_some(()) },
        )
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

#[tokio::test]
async fn a_connection_field_naming_the_framing_cannot_smuggle_a_request() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(LIMITED, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    let inner = "GET /smuggled HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n";
    c.send(
        format!(
            "POST /outer HTTP/1.1\r\nHost: a\r\nConnection: content-length, host\r\nContent-Length: {}\r\n\r\n{inner}",
            inner.len()
        )
        .as_bytes(),
    )
    .await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(
        String::from_utf8(resp.body).unwrap(),
        format!("/outer body={}", inner.len())
    );
    let seen = app.requests();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].head.contains("Host: a\r\n"), "{}", seen[0].head);
    assert_eq!(seen[0].body, inner.as_bytes());
    // The limiter counted one request: the second of two allowed still passes.
    c.send(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
}

#[tokio::test]
async fn a_refused_head_request_gets_no_body_and_the_connection_stays_in_step() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(LIMITED, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    for _ in 0..2 {
        c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
        assert_eq!(c.response(false).await.unwrap().status, 200);
    }
    c.send(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let refused = c.response(true).await.unwrap();
    assert_eq!(refused.status, 429);
    assert_eq!(refused.field("content-length").as_deref(), Some("17"));
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let next = c.response(false).await.unwrap();
    assert_eq!(
        (next.status, next.body.as_slice()),
        (429, &b"Too Many Requests"[..])
    );
}

#[tokio::test]
async fn a_response_with_both_framings_reaches_the_client_chunked_alone() {
    let app = raw_app(|_| {
        Reply::Send(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".to_vec())
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    // The client fixture fails the test if both framings arrive.
    let resp = c.response(false).await.unwrap();
    assert_eq!(decode_chunked(&resp.body), b"hello");
    assert_eq!(resp.field("content-length"), None);
}

#[tokio::test]
async fn endless_whitespace_after_a_chunk_size_is_a_400() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    let mut req = b"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1".to_vec();
    req.extend(std::iter::repeat_n(b' ', 100_000));
    c.send(&req).await;
    let resp = c.response(false).await.unwrap();
    assert_eq!(resp.status, 400);
    assert!(c.closed().await);
    assert!(app.requests().is_empty());
}

#[tokio::test]
async fn a_client_that_hangs_up_while_the_app_works_closes_the_app_connection() {
    let app = raw_app(|_| Reply::Never).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /long-poll HTTP/1.1\r\nHost: a\r\n\r\n").await;
    app.wait_requests(1).await;
    drop(c);
    app.wait_closed(1).await;
}

#[tokio::test]
async fn an_app_that_answers_an_upload_early_and_stops_reading_gets_its_answer_through() {
    // The app answers 401 as soon as it has the head and then neither reads nor closes.
    let app_addr = after_head(|mut s| async move {
        s.write_all(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 6\r\n\r\nno way")
            .await
            .unwrap();
        std::future::pending::<()>().await;
    })
    .await;
    let sidecar = start_sidecar(LARGE_BODIES, app_addr, None, None).await;
    // 256 MiB: far more than the socket buffers between the three of them hold.
    let (mut read, upload) = start_upload(sidecar.addr, 256).await;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let answer = tokio::time::timeout(Duration::from_secs(10), async {
        while !String::from_utf8_lossy(&got).contains("no way") {
            let n = read.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed without the answer: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(answer.is_ok(), "no answer within 10 s");
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 401 Unauthorized\r\n"), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    upload.abort();
}

#[tokio::test]
async fn an_exchange_in_flight_at_shutdown_finishes_with_connection_close() {
    let release = Arc::new(Notify::new());
    let app = raw_app({
        let release = release.clone();
        move |_| Reply::WhenReleased(release.clone(), ok("finished"))
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n").await;
    app.wait_requests(1).await;
    sidecar.stop.cancel();
    release.notify_one();
    let resp = c.response(false).await.unwrap();
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"finished"[..]));
    assert_eq!(resp.field("connection").as_deref(), Some("close"));
    assert!(c.closed().await);
}

#[tokio::test]
async fn a_credential_the_app_never_sees_does_not_pick_the_rate_limit_key() {
    let per_credential = "version: 1\nlimits:\n  rules:\n  - name: per-credential\n    key: [{type: credential}]\n    limit: {requests: 2, window: 1h}\n";
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(per_credential, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    // A fresh junk credential each time, named by Connection so the proxy drops it: without the fix each
    // request got a bucket of its own; now they all count against the client address.
    let mut statuses = Vec::new();
    for i in 0..4 {
        c.send(
            format!("GET / HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer junk-{i}\r\nConnection: authorization\r\n\r\n")
                .as_bytes(),
        )
        .await;
        statuses.push(c.response(false).await.unwrap().status);
    }
    assert_eq!(statuses, [200, 200, 429, 429]);
    assert!(
        app.requests()
            .iter()
            .all(|r| !r.head.to_ascii_lowercase().contains("authorization")),
        "the app never saw the credential"
    );
}

#[tokio::test]
async fn an_app_that_answers_an_upload_early_and_resets_still_gets_its_answer_through() {
    // The app refuses the upload at once and closes with the body unread (a reset), as most servers do.
    let app_addr = after_head(|mut s| async move {
        let mut some = [0u8; 1024];
        let _ = s.read(&mut some).await;
        s.write_all(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big!",
        )
        .await
        .unwrap();
    })
    .await;
    let sidecar = start_sidecar(LARGE_BODIES, app_addr, None, None).await;
    let (mut read, upload) = start_upload(sidecar.addr, 64).await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), read.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413 Payload Too Large\r\n"), "{text}");
    assert!(text.ends_with("too big!"), "{text}");
    upload.abort();
}

#[tokio::test]
async fn an_interim_answer_during_an_upload_is_forwarded_and_the_upload_goes_on() {
    // 103 right after the head, the final answer only once the whole body is in.
    let size: usize = 8 << 20;
    let app_addr = after_head(move |mut s| async move {
        s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n")
            .await
            .unwrap();
        let mut body = vec![0u8; size];
        s.read_exact(&mut body).await.unwrap();
        let reply = format!("got {}", body.len());
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", reply.len());
        s.write_all(format!("{head}{reply}").as_bytes()).await.unwrap();
        std::future::pending::<()>().await;
    })
    .await;
    let sidecar = start_sidecar(LARGE_BODIES, app_addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    let mut req = format!("PUT /up HTTP/1.1\r\nHost: a\r\nContent-Length: {size}\r\n\r\n").into_bytes();
    req.extend(std::iter::repeat_n(b'y', size));
    let sender = tokio::spawn(async move {
        c.send(&req).await;
        c
    });
    let mut c = sender.await.unwrap();
    assert_eq!(c.response(false).await.unwrap().status, 103);
    let last = c.response(false).await.unwrap();
    assert_eq!(
        (last.status, String::from_utf8(last.body).unwrap()),
        (200, format!("got {size}"))
    );
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_stream_closes_the_app_connection() {
    // A stream of events: a chunked head and one event, then silence.
    let app = raw_app(|_| {
        Reply::Send(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n7\r\nevent 1\r\n".to_vec())
    })
    .await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = tokio::net::TcpStream::connect(sidecar.addr).await.unwrap();
    c.write_all(b"GET /events HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&got).contains("event 1") {
        let n = c.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    drop(c);
    app.wait_closed(1).await;
}

#[tokio::test]
async fn quiet_client_connections_are_closed_after_their_timeouts() {
    let short = "version: 1\nlimits:\n  clientTimeouts: {idle: 300ms, requestHead: 300ms}\n";
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(short, app.addr, None, None).await;
    // Idle after a request.
    let mut idle = RawClient::connect(sidecar.addr).await;
    idle.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(idle.response(false).await.unwrap().status, 200);
    // A head that never ends.
    let mut slow = RawClient::connect(sidecar.addr).await;
    slow.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ").await;
    // Nothing at all.
    let mut silent = RawClient::connect(sidecar.addr).await;
    assert!(idle.closed().await, "an idle connection stays open");
    assert!(slow.closed().await, "a slow head keeps its connection");
    assert!(silent.closed().await, "a connection that never sends stays open");
    assert_eq!(app.requests().len(), 1);
}

#[tokio::test]
async fn a_slow_head_is_held_to_its_own_timeout_however_long_the_connection_was_idle() {
    let config = "version: 1\nlimits:\n  clientTimeouts: {idle: 60s, requestHead: 300ms}\n";
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(config, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 200);
    // A connection opened after `c` that never sends: once it is closed, `c`'s timer has run out once
    // too, while `c` sat idle (allowed 60 s).
    let mut marker = RawClient::connect(sidecar.addr).await;
    assert!(marker.closed().await);
    c.send(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ").await;
    assert!(c.closed().await, "the head got the idle allowance");

    // A partial head pipelined behind a whole request starts its own clock as well.
    let mut p = RawClient::connect(sidecar.addr).await;
    p.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nX-Slow: ")
        .await;
    assert_eq!(p.response(false).await.unwrap().status, 200);
    assert!(p.closed().await, "the pipelined head got the idle allowance");
}

#[tokio::test]
async fn a_garbage_request_line_is_answered_400_at_once() {
    let app = raw_app(echo).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let mut c = RawClient::connect(sidecar.addr).await;
    // No blank line follows: the request line alone is enough to know (the head timeout is 60 s).
    c.send(b"NOT\x01A REQUEST\r\n").await;
    assert_eq!(c.response(false).await.unwrap().status, 400);
    assert!(app.requests().is_empty());
}
