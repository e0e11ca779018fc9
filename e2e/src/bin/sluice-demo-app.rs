//! `sluice-demo-app`: the small HTTP app the e2e kubelet stand-in runs in place of a team's container.
//!
//! - Any request answers `200` with `ok <pod>` (the rate-limit scenarios count what gets through).
//! - A `POST` is handled as a job (the queue scenarios): a JSON body with `sleepMs` is answered after
//!   that many milliseconds, and with `status` it answers that status (e.g. `500` to make a job fail).
//!
//! Listens on `--listen`, else `$SLUICE_DEMO_LISTEN` (set by the kubelet stand-in to the container's
//! first declared port, mapped), else port 8080 — mapped through `$SLUICE_E2E_PORTS` (`8080=40001,...`,
//! set by the kubelet stand-in) when the Pod uses 8080 without declaring it. Stops on SIGTERM or Ctrl-C.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};

const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
const PORT_DEFAULT: u16 = 8080;

async fn handle(
    req: Request<hyper::body::Incoming>,
    pod: String,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut status = StatusCode::OK;
    if method == Method::POST
        && let Ok(job) = serde_json::from_slice::<serde_json::Value>(&body)
    {
        if let Some(ms) = job.get("sleepMs").and_then(|v| v.as_u64()) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(code) = job.get("status").and_then(|v| v.as_u64()) {
            status = u16::try_from(code)
                .ok()
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::OK);
        }
    }
    let resp = Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(format!("ok {pod}\n"))))
        .expect("static response parts are valid");
    Ok(resp)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut listen = std::env::var("SLUICE_DEMO_LISTEN").unwrap_or_else(|_| {
        let mapped = std::env::var("SLUICE_E2E_PORTS").ok().and_then(|map| {
            map.split(',')
                .find_map(|pair| pair.strip_prefix(&format!("{PORT_DEFAULT}=")).map(str::to_string))
        });
        match mapped {
            Some(local) => format!("127.0.0.1:{local}"),
            None => LISTEN_DEFAULT.into(),
        }
    });
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                listen = args
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--listen needs an address"))?
            }
            other => anyhow::bail!("unknown argument {other:?} (only --listen ADDR)"),
        }
    }
    let pod = std::env::var("HOSTNAME").unwrap_or_default();
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {listen}: {e}"))?;
    eprintln!("sluice-demo-app listening on {}", listener.local_addr()?);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = term.recv() => return Ok(()),
            _ = tokio::signal::ctrl_c() => return Ok(()),
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let pod = pod.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(req, pod.clone()));
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                });
            }
        }
    }
}
