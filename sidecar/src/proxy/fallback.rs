//! Connections hyper serves: whatever the HTTP/1.1 fast path ([`super::h1`]) hands over — h2c, HTTP/1.0,
//! upgrades, `Expect`, framing it leaves alone, every request while the app speaks h2c — from the first
//! byte it has not answered. Each request goes through [`super::forward::handle`]; on shutdown hyper
//! finishes the request in flight and closes.

use std::{net::SocketAddr, sync::Arc};

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::{app_connection::AppConnection, forward, state::ProxyState};

/// Serves the connection `io` from `peer` with hyper until it closes, or until `stop` and the request in
/// flight finished.
pub async fn serve<I>(io: I, peer: SocketAddr, state: Arc<ProxyState>, stop: CancellationToken)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timeouts = state.snapshot().effective.config.limits.client_timeouts.clone();
    // hyper starts its head timer whenever it waits for a head, between kept-alive requests too, so
    // here one timeout serves as both; the longer, so that a load balancer's kept-alive connection is
    // never closed under it (a slow head then gets as long as an idle connection).
    let head_timeout = timeouts.idle.get().max(timeouts.request_head.get());
    let app = Arc::new(AppConnection::default());
    let service = service_fn(move |req| forward::handle(state.clone(), peer, app.clone(), req));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        () = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::trace!(error = %e, "connection ended with an error");
    }
}
