//! Test fixtures for the proxy: a small real upstream app, an in-process sidecar, an HTTP client.
#![allow(dead_code, missing_docs)] // each test binary includes this module and uses part of it; the test items are not an API

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use sluice_sidecar::{
    clock::{SharedClock, SystemClock},
    config::load,
    proxy::{self, state::ProxyState},
};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, net::TcpListener};

pub mod raw;
use tokio_util::sync::CancellationToken;

/// The upstream app: echoes what it received; `/slow?ms=N` answers after N ms; `Upgrade` requests get a
/// 101 and an echo of raw bytes; responses carry a hop-by-hop field the proxy must strip.
pub struct Upstream {
    pub addr: SocketAddr,
    /// Requests that reached the app (counted when they arrive).
    pub arrived: Arc<AtomicUsize>,
    stop: CancellationToken,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn start_upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let arrived = Arc::new(AtomicUsize::new(0));
    let (s, a) = (stop.clone(), arrived.clone());
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                r = listener.accept() => r.unwrap(),
                () = s.cancelled() => return,
            };
            let a = a.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| app(req, a.clone()));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    Upstream { addr, arrived, stop }
}

async fn app(
    mut req: Request<Incoming>,
    arrived: Arc<AtomicUsize>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    arrived.fetch_add(1, Ordering::SeqCst);
    if req.headers().contains_key(http::header::UPGRADE) {
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 1024];
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut resp = Response::new(Full::new(Bytes::new()));
        *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        resp.headers_mut().insert("upgrade", "websocket".parse().unwrap());
        resp.headers_mut()
            .insert("connection", "upgrade".parse().unwrap());
        return Ok(resp);
    }
    if let Some(ms) = req
        .uri()
        .query()
        .and_then(|q| q.strip_prefix("ms="))
        .and_then(|v| v.parse::<u64>().ok())
    {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let mut text = format!("version={:?}\n", req.version());
    for (k, v) in req.headers() {
        text.push_str(&format!("{}: {}\n", k, v.to_str().unwrap_or("?")));
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes().len());
    text.push_str(&format!("body-bytes={}\n", body.map(|n| n as i64).unwrap_or(-1)));
    let mut resp = Response::new(Full::new(Bytes::from(text)));
    resp.headers_mut()
        .insert("connection", "x-upstream-hop".parse().unwrap());
    resp.headers_mut()
        .insert("x-upstream-hop", "secret".parse().unwrap());
    resp.headers_mut()
        .insert("x-upstream-e2e", "kept".parse().unwrap());
    Ok(resp)
}

/// A sidecar running in this process.
pub struct Sidecar {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub state: Arc<ProxyState>,
    pub stop: CancellationToken,
    pub task: Option<tokio::task::JoinHandle<sluice_sidecar::Result<()>>>,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts a sidecar for `yaml` in front of `upstream`; `redis` sets the limiter's Redis URL. With
/// `file`, the config is read from (and hot-reloaded from) that path instead, polled every 20 ms.
pub async fn start_sidecar(
    yaml: &str,
    upstream: SocketAddr,
    redis: Option<&str>,
    file: Option<&Path>,
) -> Sidecar {
    start_sidecar_with_env(yaml, upstream, redis, file, &[]).await
}

/// [`start_sidecar`] with further environment variables.
#[allow(dead_code)] // not every test binary including this module uses it
pub async fn start_sidecar_with_env(
    yaml: &str,
    upstream: SocketAddr,
    redis: Option<&str>,
    file: Option<&Path>,
    extra_env: &[(&str, &str)],
) -> Sidecar {
    let mut env = vec![
        ("SLUICE_UPSTREAM".to_owned(), format!("http://{upstream}")),
        ("SLUICE_POD_NAME".to_owned(), "test-pod".to_owned()),
    ];
    env.extend(extra_env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    if let Some(url) = redis {
        env.push(("SLUICE_REDIS_URL".to_owned(), url.to_owned()));
    }
    let env: Arc<dyn sluice_sidecar::config::env::Env> =
        Arc::new(env.into_iter().collect::<std::collections::HashMap<_, _>>());
    let (effective, file_watch) = match file {
        Some(path) => {
            let (text, hash) = load::read(path).unwrap();
            (
                load::from_yaml(&text, &*env).unwrap(),
                Some((path.to_path_buf(), hash)),
            )
        }
        None => (load::from_yaml(yaml, &*env).unwrap(), None),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (addr, admin_addr) = (listener.local_addr().unwrap(), admin.local_addr().unwrap());
    let clock: SharedClock = Arc::new(SystemClock);
    let state = proxy::build_state(effective, clock).await.unwrap();
    let stop = CancellationToken::new();
    proxy::spawn_config_sources(&state, file_watch, Duration::from_millis(20), env, &stop);
    let task = tokio::spawn(proxy::server::run(listener, admin, state.clone(), stop.clone()));
    Sidecar {
        addr,
        admin: admin_addr,
        state,
        stop,
        task: Some(task),
    }
}

pub type TestClient = Client<HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

/// Sends a request and reads the whole reply.
pub async fn send(client: &TestClient, req: Request<Full<Bytes>>) -> Reply {
    let resp = client.request(req).await.expect("request");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// GET `path` from `addr` with extra headers.
pub async fn get(client: &TestClient, addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    let mut b = Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(client, b.body(Full::new(Bytes::new())).unwrap()).await
}
