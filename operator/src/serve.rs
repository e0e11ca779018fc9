//! The one serving loop behind the operator's three servers: the admission webhook (HTTPS), the external
//! metrics API (HTTPS, client certificates from the front proxy) and `/metrics`, `/healthz`, `/readyz`
//! (HTTP). Every replica runs all three, and the API server calls the first two with
//! `failurePolicy: Fail` or for every HPA sync, so a stranger who can open TCP connections to the pod
//! must not be able to stop them. What holds, whatever the peer does:
//!
//! - a TLS handshake gets [`Limits::handshake_timeout`], a request head [`Limits::header_read_timeout`]
//!   (also while an HTTP/1.1 connection waits for its next request), HTTP/2 connections are pinged and
//!   dropped when the pings go unanswered;
//! - at most [`Limits::max_connections`] connections are open at once, and at most
//!   [`Limits::max_connections_per_peer`] from one address; a connection over either cap is accepted and
//!   closed at once, so the listen backlog never fills with connections nobody serves;
//! - an `accept()` error (out of file descriptors, a connection reset before it was accepted) is logged
//!   and retried after a short pause that doubles up to [`ACCEPT_RETRY_MAX`]: the loop never ends
//!   because of one;
//! - [`Serving`] is true exactly while the loop runs, and `/readyz` and `/healthz` read it, so a server
//!   that stopped (a panic, a task that ended) takes the replica out of its Services and gets it
//!   restarted instead of leaving a Ready pod with a closed port.

use std::{
    collections::HashMap,
    future::Future,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use axum::Router;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use rustls::pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// How long a request head may take to arrive, and an idle HTTP/1.1 connection may wait for the next.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Connections open at once, per server.
pub const MAX_CONNECTIONS_DEFAULT: usize = 1024;
/// Connections open at once from one address, per server (the API server reuses a few connections).
pub const MAX_CONNECTIONS_PER_PEER_DEFAULT: usize = 128;
/// Longest pause between retries of a failing `accept()`.
pub const ACCEPT_RETRY_MAX: Duration = Duration::from_secs(1);
/// First pause after a failed `accept()`.
const ACCEPT_RETRY_FIRST: Duration = Duration::from_millis(5);
/// How often an HTTP/2 connection is pinged, and how long the answer may take.
const H2_KEEP_ALIVE: Duration = Duration::from_secs(20);
/// Streams one HTTP/2 connection may have open at once.
const H2_MAX_STREAMS: u32 = 64;

/// What one server allows a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Deadline of the TLS handshake.
    pub handshake_timeout: Duration,
    /// Deadline of each request head (and of an idle HTTP/1.1 keep-alive connection).
    pub header_read_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one IP address.
    pub max_connections_per_peer: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: HANDSHAKE_TIMEOUT_DEFAULT,
            header_read_timeout: HEADER_READ_TIMEOUT_DEFAULT,
            max_connections: MAX_CONNECTIONS_DEFAULT,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER_DEFAULT,
        }
    }
}

/// The certificate chain the client presented in the TLS handshake (end entity first); set by
/// [`serve`] as a request extension when the client sent one (the external metrics API asks for it).
#[derive(Clone, Debug)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Whether a server's accept loop runs: set by [`serve`] when it starts and cleared when it ends, for
/// whatever reason (shutdown, a panic, the task dropped).
#[derive(Clone, Debug, Default)]
pub struct Serving(Arc<AtomicBool>);

impl Serving {
    /// Whether the loop runs.
    pub fn is_serving(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Clears [`Serving`] when dropped, so a loop that ends by panic or cancellation says so too.
struct ServingGuard(Serving);

impl Drop for ServingGuard {
    fn drop(&mut self) {
        (self.0).0.store(false, Ordering::SeqCst);
    }
}

/// Counts open connections, in total and per address.
#[derive(Debug, Default)]
struct Connections {
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// One counted connection; uncounted when dropped.
struct Slot {
    connections: Arc<Connections>,
    peer: IpAddr,
}

impl Connections {
    /// A slot for a connection from `peer`, or `None` when a cap is reached.
    fn admit(self: &Arc<Self>, peer: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per_peer) = &mut *open;
        let mine = per_peer.get(&peer).copied().unwrap_or(0);
        if *total >= limits.max_connections || mine >= limits.max_connections_per_peer {
            return None;
        }
        *total += 1;
        per_peer.insert(peer, mine + 1);
        Some(Slot {
            connections: self.clone(),
            peer,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per_peer) = &mut *open;
        *total = total.saturating_sub(1);
        if let Some(n) = per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                per_peer.remove(&self.peer);
            }
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes: over TLS with `tls` (the certificate is
/// read from it at each handshake, so rotation needs no restart), in cleartext without. `name` names the
/// server in logs. See the module docs for what holds whatever peers do.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: Limits,
    serving: Serving,
    shutdown: impl Future<Output = ()>,
) {
    serving.0.store(true, Ordering::SeqCst);
    let _serving = ServingGuard(serving);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let connections = Arc::new(Connections::default());
    let mut retry = ACCEPT_RETRY_FIRST;
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => return,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => {
                retry = ACCEPT_RETRY_FIRST;
                a
            }
            Err(e) => {
                tracing::warn!(server = name, error = %e, pause = ?retry, "accept failed; accepting again after a pause");
                tokio::select! {
                    () = tokio::time::sleep(retry) => {}
                    () = &mut shutdown => return,
                }
                retry = (retry * 2).min(ACCEPT_RETRY_MAX);
                continue;
            }
        };
        let Some(slot) = connections.admit(peer.ip(), &limits) else {
            tracing::debug!(server = name, %peer, "connection refused: too many connections");
            drop(tcp);
            continue;
        };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(
            name,
            tcp,
            acceptor.clone(),
            router.clone(),
            limits,
            slot,
        ));
    }
}

async fn connection(
    name: &'static str,
    tcp: TcpStream,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    limits: Limits,
    _slot: Slot,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEP_ALIVE)
        .keep_alive_timeout(H2_KEEP_ALIVE)
        .max_concurrent_streams(H2_MAX_STREAMS);
    let served = match acceptor {
        Some(acceptor) => {
            let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(server = name, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(server = name, "TLS handshake timed out");
                    return;
                }
            };
            let peer = tls.get_ref().1.peer_certificates().map(|chain| {
                PeerCertificates(Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect()))
            });
            let router = match peer {
                Some(p) => router.layer(axum::Extension(p)),
                None => router,
            };
            builder
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                .await
        }
        None => {
            builder
                .serve_connection(TokioIo::new(tcp), TowerToHyperService::new(router))
                .await
        }
    };
    if let Err(e) = served {
        tracing::debug!(server = name, error = %e, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_capped_in_total_and_per_address_and_freed_on_drop() {
        let limits = Limits {
            max_connections: 3,
            max_connections_per_peer: 2,
            ..Limits::default()
        };
        let c = Arc::new(Connections::default());
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let a1 = c.admit(a, &limits).unwrap();
        let _a2 = c.admit(a, &limits).unwrap();
        assert!(c.admit(a, &limits).is_none(), "a third from one address");
        let _b1 = c.admit(b, &limits).unwrap();
        assert!(c.admit(b, &limits).is_none(), "a fourth in total");
        drop(a1);
        assert!(c.admit(b, &limits).is_some(), "a freed slot is reused");
        assert_eq!(c.open.lock().unwrap().1.get(&a), Some(&1));
    }
}
