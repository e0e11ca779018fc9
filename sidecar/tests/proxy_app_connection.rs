//! The app connection of a client connection, against a hand-written HTTP/1.1 app that counts its
//! connections: one client connection's requests share one kept-alive app connection; an app that closes
//! the connection after each response is reconnected to; an app that is down is a 502.

mod proxy_support;

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use proxy_support::start_sidecar;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// An app answering `200 ok` to each GET; with `close`, it says `Connection: close` and closes after
/// every response.
struct RawApp {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

async fn raw_app(close: bool) -> RawApp {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (c, r) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n) = stream.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        r.fetch_add(1, Ordering::SeqCst);
                        let head = if close {
                            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok"
                        } else {
                            "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
                        };
                        if stream.write_all(head.as_bytes()).await.is_err() || close {
                            return;
                        }
                    }
                }
            });
        }
    });
    RawApp {
        addr,
        connections,
        requests,
    }
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
    let app = raw_app(false).await;
    let sidecar = start_sidecar(NO_RULES, app.addr, None, None).await;
    let replies = sequential_gets(sidecar.addr, 20).await;
    assert!(
        replies.iter().all(|(s, b)| *s == StatusCode::OK && b == "ok"),
        "{replies:?}"
    );
    assert_eq!(app.requests.load(Ordering::SeqCst), 20);
    assert_eq!(
        app.connections.load(Ordering::SeqCst),
        1,
        "one kept-alive app connection"
    );
}

#[tokio::test]
async fn an_app_that_closes_after_each_response_is_connected_to_again() {
    let app = raw_app(true).await;
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
