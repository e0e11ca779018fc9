//! `sluice-sidecar demo`: a small app, the sidecar in front of it with a demo rule, and a burst of
//! requests fired at it, with a live line per second of allowed and limited counts. The limiter keeps its
//! counters in memory without `SLUICE_REDIS_URL`, in Redis with it.

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response, service::service_fn};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
    server::conn::auto,
};
use sluice_crds::sidecar_config::SidecarConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{
    clock::{SharedClock, SystemClock},
    config::{env::Env, load},
};

/// The demo's config: one token-bucket rule per client IP, 10 requests a second with a burst of 5.
pub const DEMO_CONFIG: &str = r#"
version: 1
limits:
  rules:
  - name: demo
    algorithm: tokenBucket
    limit: {requests: 10, window: 1s, burst: 5}
"#;

/// Arguments of `sluice-sidecar demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// How long to fire requests, in seconds.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Requests fired per second (the demo rule allows 10 a second with a burst of 5).
    #[arg(long, default_value_t = 40)]
    pub rate: u32,
}

/// Serves a tiny app on `listener` that answers every request with 200 and a short text.
pub async fn serve_demo_app(listener: TcpListener, shutdown: CancellationToken) {
    loop {
        let (stream, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
            () = shutdown.cancelled() => return,
        };
        tokio::spawn(async move {
            let svc = service_fn(|_req: Request<hyper::body::Incoming>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"hello from the demo app\n",
                ))))
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Runs the demo and prints its lines to stdout; stops early when `shutdown` fires.
pub async fn run(args: DemoArgs, env: &dyn Env, shutdown: CancellationToken) -> crate::Result<()> {
    let app = TcpListener::bind("127.0.0.1:0").await?;
    let app_addr = app.local_addr()?;
    tokio::spawn(serve_demo_app(app, shutdown.clone()));

    let mut config: SidecarConfig = serde_yaml::from_str(DEMO_CONFIG).expect("the demo config parses");
    config.limits.upstream = format!("http://{app_addr}");
    config.limits.listen = ([127, 0, 0, 1], 0).into();
    config.limits.admin_listen = ([127, 0, 0, 1], 1).into();
    config.limits.rejection_log.per_second = 1;
    config.limits.shutdown_grace = std::time::Duration::from_secs(2).into();
    let mut effective = load::resolve(config, env)?;
    // The demo picks its own free ports whatever SLUICE_LISTEN says.
    let proxy = TcpListener::bind("127.0.0.1:0").await?;
    let admin = TcpListener::bind("127.0.0.1:0").await?;
    effective.config.limits.listen = proxy.local_addr()?;
    effective.config.limits.admin_listen = admin.local_addr()?;
    let proxy_addr = proxy.local_addr()?;
    let admin_addr = admin.local_addr()?;
    let redis = effective.config.limits.redis.url.clone();
    let clock: SharedClock = Arc::new(SystemClock);
    let state = super::build_state(effective, clock).await?;
    if redis.is_some() {
        // The limiter starts with Redis unknown and decides locally until its first probe answers; wait
        // for it briefly so the demo's first second shows Redis-backed decisions.
        let deadline = Instant::now() + Duration::from_secs(3);
        while !state.limiter.redis_healthy() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !state.limiter.redis_healthy() {
            println!("warning      Redis does not answer; the limiter decides locally until it does");
        }
    }
    let server = tokio::spawn(super::server::run(proxy, admin, state, shutdown.clone()));

    println!("demo app     http://{app_addr}");
    println!("sidecar      http://{proxy_addr}  (admin: http://{admin_addr}/metrics)");
    println!(
        "limiter      {}",
        match &redis {
            Some(url) => format!("Redis at {url}"),
            None => "in memory (set SLUICE_REDIS_URL to share limits through Redis)".into(),
        }
    );
    println!(
        "rule         demo: tokenBucket, 10 requests/s per client IP, burst 5; firing {} requests/s for {}s",
        args.rate, args.seconds
    );

    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let allowed = Arc::new(AtomicU64::new(0));
    let limited = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let uri: hyper::Uri = format!("http://{proxy_addr}/")
        .parse()
        .expect("a socket address makes a URI");
    let start = Instant::now();
    let gap = Duration::from_secs_f64(1.0 / f64::from(args.rate.max(1)));
    let mut next_line = 1u64;
    let (mut last_allowed, mut last_limited) = (0, 0);
    let mut sent = 0u64;
    while start.elapsed() < Duration::from_secs(args.seconds) && !shutdown.is_cancelled() {
        let (client, uri) = (client.clone(), uri.clone());
        let (a, l, o) = (allowed.clone(), limited.clone(), other.clone());
        tokio::spawn(async move {
            let counter = match client.get(uri).await {
                Ok(resp) => {
                    let status = resp.status();
                    let _ = resp.into_body().collect().await;
                    match status.as_u16() {
                        200 => a,
                        429 => l,
                        _ => o,
                    }
                }
                Err(_) => o,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        });
        sent += 1;
        tokio::time::sleep_until((start + gap * sent as u32).into()).await;
        if start.elapsed() >= Duration::from_secs(next_line) {
            let (al, li) = (allowed.load(Ordering::Relaxed), limited.load(Ordering::Relaxed));
            println!(
                "t={next_line:>2}s  allowed {:>4}  limited {:>4}   (total allowed {al}, limited {li}, errors {})",
                al - last_allowed,
                li - last_limited,
                other.load(Ordering::Relaxed)
            );
            (last_allowed, last_limited) = (al, li);
            next_line += 1;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!(
        "done: {} allowed, {} limited (429), {} errors",
        allowed.load(Ordering::Relaxed),
        limited.load(Ordering::Relaxed),
        other.load(Ordering::Relaxed)
    );
    drop(client);
    shutdown.cancel();
    let _ = server.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_config_is_valid() {
        let config: SidecarConfig = serde_yaml::from_str(DEMO_CONFIG).unwrap();
        sluice_crds::sidecar_config::validate(&config).unwrap();
    }
}
