//! The accept loop (HTTP/1.1 with keep-alive and upgrades, and h2c, on one port; each connection starts on
//! the fast path, [`super::h1`]) and graceful shutdown: on the shutdown signal the listener closes,
//! `/readyz` fails, idle connections close, and in-flight requests get up to `limits.shutdownGrace` to
//! finish. Connections over `limits.maxConnections` are closed as soon as they are accepted
//! ([`super::capacity`]).

use std::{sync::Arc, time::Duration};

use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use super::{h1, state::ProxyState};

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

    let connections = TaskTracker::new();
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
        // Over the cap the connection closes before anything is read or written (see `capacity`).
        let Some(admitted) = state.capacity.admit(&state.metrics.connections_open) else {
            state.metrics.connections_refused.inc();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        // Each connection watches a token of its own: waiting on the shared one would take its lock
        // whenever any connection's read is pending.
        connections.spawn(h1::serve(
            stream,
            peer,
            state.clone(),
            shutdown.child_token(),
            admitted,
        ));
    }

    state.start_draining();
    drop(listener);
    let grace = state.snapshot().effective.config.limits.shutdown_grace.get();
    connections.close();
    tracing::info!(
        connections = connections.len(),
        ?grace,
        "shutting down: draining in-flight requests"
    );
    if tokio::time::timeout(grace, connections.wait()).await.is_err() {
        tracing::warn!("grace period over; closing the remaining connections");
    }
    let _ = admin_task.await;
    Ok(())
}
