//! The app connection of a client connection, against a hand-written HTTP/1.1 app that counts its
//! connections: one client connection's requests share one kept-alive app connection; an app that closes
//! the connection after each response is reconnected to; an app that is down is a 502.

mod proxy_support;

use std::{net::SocketAddr, sync::atomic::Ordering};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use proxy_support::{
    raw::{RawApp, Reply, ok, raw_app},
    start_sidecar,
};
use tokio::net::{TcpListener, TcpStream};

/// An app answering `200 ok` to each request; with `close`, it says `Connection: close` and closes after
/// every response.
async fn ok_app(close: bool) -> RawApp {
    raw_app(move |_| {
        if close {
            Reply::SendAndClose(
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok".to_vec(),
            )
        } else {
            Reply::Send(ok("ok"))
        }
    })
    .await
}

/// Sends `n` GETs one after another over one client connection to `proxy`; returns the statuses.
async fn sequential_gets(proxy: SocketAddr, n: usize) -> Vec<(StatusCode, String)> {
    let stream = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut out = Vec::new();
    for i in 0..n {
        sender.ready().await.expect("the client connection stays open");
        let req = Request::get(format!("/r{i}"))
            .header("host", "shop.example")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.expect("response");
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        out.push((status, String::from_utf8_lossy(&body).into_owned()));
    }
    out
}

const NO_RULES: &str = "version: 1\n";

#[tokio::test]
async fn one_client_connection_keeps_one_app_connection_for_all_its_requests() {
    let app = ok_app(false).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let replies = sequential_gets(sidecar.addr, 20).await;
    assert!(
        replies.iter().all(|(s, b)| *s == StatusCode::OK && b == "ok"),
        "{replies:?}"
    );
    assert_eq!(app.requests().len(), 20);
    assert_eq!(
        app.connections.load(Ordering::SeqCst),
        1,
        "one kept-alive app connection"
    );
}

#[tokio::test]
async fn an_app_that_closes_after_each_response_is_connected_to_again() {
    let app = ok_app(true).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let replies = sequential_gets(sidecar.addr, 5).await;
    assert!(
        replies.iter().all(|(s, b)| *s == StatusCode::OK && b == "ok"),
        "{replies:?}"
    );
    assert_eq!(
        app.connections.load(Ordering::SeqCst),
        5,
        "a fresh app connection per request"
    );
}

#[tokio::test]
async fn an_app_that_is_down_is_a_502_and_the_client_connection_stays_open() {
    // A port nothing listens on: bind, note it, close.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let sidecar = start_sidecar(NO_RULES, port, None, None).await;
    let replies = sequential_gets(sidecar.addr, 2).await;
    assert_eq!(
        replies,
        vec![(StatusCode::BAD_GATEWAY, "Bad Gateway".to_owned()); 2],
        "the client connection survives a failed app connection"
    );
    assert_eq!(sidecar.state.metrics.upstream_errors.get(), 2);
}
