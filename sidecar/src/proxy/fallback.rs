//! Connections hyper serves: whatever the HTTP/1.1 fast path ([`super::h1`]) hands over — h2c, HTTP/1.0,
//! upgrades, `Expect`, framing it leaves alone, every request while the app speaks h2c — from the first
//! byte it has not answered. Each request goes through [`super::forward::handle`]; on shutdown hyper
//! finishes the request in flight and closes.
//!
//! The client timeouts are enforced on the connection itself ([`super::watched`]): idle, request head
//! and send for both HTTP versions. Buffers are bounded: an HTTP/1 head up to the fast path's
//! [`MAX_HEAD`] (longer ones get 431), HTTP/2 flow-control windows and send buffers of a few tens of KiB
//! per stream, at most [`H2_MAX_STREAMS`] streams at once.

use std::{net::SocketAddr, sync::Arc};

use hyper::service::service_fn;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::{
    app_connection::AppConnection,
    capacity::Admitted,
    forward,
    h1::request::MAX_HEAD,
    state::ProxyState,
    watched::{Activity, Tracked, Watched},
};

/// HTTP/2 streams one client connection may have open at once.
pub const H2_MAX_STREAMS: u32 = 100;
/// HTTP/2 flow-control window of each stream: what a client may send ahead of the app reading it (the
/// protocol's default).
const H2_STREAM_WINDOW: u32 = 64 * 1024;
/// HTTP/2 flow-control window of the whole connection.
const H2_CONNECTION_WINDOW: u32 = 256 * 1024;
/// Response bytes buffered per HTTP/2 stream ahead of the client's window.
const H2_SEND_BUFFER: usize = 64 * 1024;

/// Serves the connection `io` from `peer` with hyper until it closes, or until `stop` and the request in
/// flight finished; `admitted` goes with `io` (into a tunnel, if it becomes one).
pub async fn serve<I>(
    io: I,
    peer: SocketAddr,
    state: Arc<ProxyState>,
    stop: CancellationToken,
    admitted: Admitted,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timeouts = state.snapshot().effective.config.limits.client_timeouts.clone();
    let activity = Arc::new(Activity::default());
    let io = Watched::new(
        io,
        &timeouts,
        Arc::clone(&activity),
        state.capacity.head_share(),
        state.metrics.slow_clients.clone(),
    )
    .holding(admitted);
    let app = Arc::new(AppConnection::default());
    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let in_flight = activity.begin(req.version());
        let (state, app, activity) = (state.clone(), app.clone(), Arc::clone(&activity));
        async move {
            let Ok(resp) = forward::handle(state, peer, app, req).await;
            if resp.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                activity.upgraded();
            }
            Ok::<_, std::convert::Infallible>(resp.map(|body| Tracked::new(body, in_flight)))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper's head timer would also run between kept-alive requests: `Watched` keeps both clocks.
        .header_read_timeout(None)
        .max_buf_size(MAX_HEAD);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_send_buf_size(H2_SEND_BUFFER);
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
