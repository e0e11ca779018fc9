//! The app connection of one client connection on the hyper path ([`super::forward`]). HTTP/1.1 requests
//! that arrive on one client connection are sequential, so they share one kept-alive connection to the
//! app: opened on first use, reopened when the app closed it, closed with the client connection. Compared with a pooled client this takes no pool
//! lock and spawns nothing per request (hyper-util's pooled client spawns a task per response to hand
//! the connection back to its pool once the body is read). Upgrades and h2c keep using the pooled
//! clients of [`super::state::UpstreamClients`].

use std::sync::Mutex;

use http::{Request, Response, uri::Authority};
use hyper::{
    body::Incoming,
    client::conn::http1::{self, SendRequest},
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::{RequestBody, state::UPSTREAM_CONNECT_TIMEOUT_DEFAULT};

/// Why a request did not reach the app, or got no response from it.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// No TCP connection within the connect timeout.
    #[error("connecting to the app at {authority} timed out")]
    ConnectTimeout {
        /// The app's address.
        authority: Authority,
    },
    /// The TCP connection or the HTTP/1.1 handshake failed.
    #[error("connecting to the app at {authority}: {source}")]
    Connect {
        /// The app's address.
        authority: Authority,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The exchange failed after the request was (or began to be) sent.
    #[error("request to the app failed: {0}")]
    Send(#[source] hyper::Error),
}

/// The kept-alive HTTP/1.1 connection to the app of one client connection.
#[derive(Default)]
pub struct AppConnection {
    idle: Mutex<Option<(Authority, SendRequest<RequestBody>)>>,
}

impl AppConnection {
    /// Sends `req` (origin-form URI, `Host` set) to the app at `authority` and returns the response head
    /// with its body streaming. A request the app never saw because a kept-alive connection had just
    /// closed is sent again once on a fresh connection, as a pooled client does.
    pub async fn send(
        &self,
        authority: &Authority,
        mut req: Request<RequestBody>,
    ) -> Result<Response<Incoming>, AppError> {
        let kept = self.lock().take().filter(|(a, _)| a == authority);
        let (mut sender, mut reused) = match kept {
            Some((_, sender)) => (sender, true),
            None => (connect(authority).await?, false),
        };
        loop {
            // Ready once the previous response's body has been read; an error means the app closed it.
            if sender.ready().await.is_err() {
                sender = connect(authority).await?;
                reused = false;
            }
            match sender.try_send_request(req).await {
                Ok(resp) => {
                    *self.lock() = Some((authority.clone(), sender));
                    return Ok(resp);
                }
                Err(mut e) => match e.take_message() {
                    Some(unsent) if reused => {
                        req = unsent;
                        sender = connect(authority).await?;
                        reused = false;
                    }
                    _ => return Err(AppError::Send(e.into_error())),
                },
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Authority, SendRequest<RequestBody>)>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Opens a connection to the app and starts driving it.
async fn connect(authority: &Authority) -> Result<SendRequest<RequestBody>, AppError> {
    let stream = connect_tcp(authority).await?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| AppError::Connect {
            authority: authority.clone(),
            source: e.into(),
        })?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::trace!(error = %e, "app connection ended with an error");
        }
    });
    Ok(sender)
}

/// Opens a TCP connection to the app (`TCP_NODELAY` set) within the connect timeout.
pub async fn connect_tcp(authority: &Authority) -> Result<TcpStream, AppError> {
    let stream = tokio::time::timeout(
        UPSTREAM_CONNECT_TIMEOUT_DEFAULT,
        TcpStream::connect(authority.as_str()),
    )
    .await
    .map_err(|_| AppError::ConnectTimeout {
        authority: authority.clone(),
    })?
    .map_err(|e| AppError::Connect {
        authority: authority.clone(),
        source: e.into(),
    })?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}
