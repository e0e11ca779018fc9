//! The accept loop (HTTP/1.1 with keep-alive and upgrades, and h2c, on one port) and graceful shutdown:
//! on the shutdown signal the listener closes, `/readyz` fails, idle connections close, and in-flight
//! requests get up to `limits.shutdownGrace` to finish.

use std::{sync::Arc, time::Duration};

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo},
    server::{conn::auto, graceful::GracefulShutdown},
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::{app_connection::AppConnection, forward, state::ProxyState};

/// Serves the proxy on `listener` and the admin endpoints on `admin` until `shutdown` is cancelled, then
/// drains. Returns once every connection closed or the grace period ran out.
pub async fn run(
    listener: TcpListener,
    admin: TcpListener,
    state: Arc<ProxyState>,
    shutdown: CancellationToken,
) -> crate::Result<()> {
    let admin_task = {
        let router = super::admin::router(state.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(admin, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await;
        })
    };

    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let app = Arc::new(AppConnection::default());
        let service = service_fn(move |req| forward::handle(state.clone(), peer, app.clone(), req));
        let conn = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
        });
    }

    state.start_draining();
    drop(listener);
    let grace = state.snapshot().effective.config.limits.shutdown_grace.get();
    tracing::info!(
        connections = graceful.count(),
        ?grace,
        "shutting down: draining in-flight requests"
    );
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!("grace period over; closing the remaining connections");
    }
    let _ = admin_task.await;
    Ok(())
}
