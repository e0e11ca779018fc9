//! The gate in front of every route of the metrics API but `/healthz` and `/readyz`: authenticate
//! ([`super::authn`]), then authorize ([`super::authz`]). A request that fails gets a `Status` naming
//! why — 401 when the caller is unknown, 403 when RBAC says no, 500 when the API server could not be
//! asked — and is counted in `external_metrics_request_duration_seconds{result=…}`.

use std::{sync::Arc, time::Instant};

use axum::{
    extract::{Request, State},
    http::StatusCode,
    middleware::Next,
    response::Response,
};
use kube::Client;
use tokio_util::sync::CancellationToken;

use super::{
    authn::{Authenticator, PeerCertificates},
    authz::{Attributes, Authorizer},
    server::status,
};
use crate::scaling::JobQueueMetrics;

/// Authentication and authorization of the metrics API.
pub struct Access {
    /// Who is calling.
    pub authenticator: Arc<Authenticator>,
    /// What they may read.
    pub authorizer: Authorizer,
}

impl Access {
    /// Both, asking the API server through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            authenticator: Arc::new(Authenticator::new(client.clone())),
            authorizer: Authorizer::new(client),
        }
    }

    /// Follows the front-proxy settings until `shutdown` (see [`Authenticator::watch_config`]).
    pub fn spawn_config_watch(&self, client: Client, shutdown: CancellationToken) {
        tokio::spawn(self.authenticator.clone().watch_config(client, shutdown));
    }
}

/// Middleware state: the gate and where to count refusals.
#[derive(Clone)]
pub struct Gate {
    /// The checks.
    pub access: Arc<Access>,
    /// Request metrics.
    pub metrics: Arc<JobQueueMetrics>,
}

/// axum middleware: lets the request through only when its caller is authenticated and authorized.
pub async fn require_access(State(gate): State<Gate>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let peer = request.extensions().get::<PeerCertificates>().cloned();
    let user = match gate
        .access
        .authenticator
        .authenticate(peer.as_ref(), request.headers())
        .await
    {
        Ok(u) => u,
        Err(e) => {
            gate.metrics
                .request("unauthorized", start.elapsed().as_secs_f64());
            return status(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                format!("Unauthorized: {e}"),
            );
        }
    };
    let attributes = Attributes::of(request.method(), request.uri().path());
    match gate.access.authorizer.authorize(&user, &attributes).await {
        Ok(d) if d.allowed => next.run(request).await,
        Ok(d) => {
            gate.metrics.request("forbidden", start.elapsed().as_secs_f64());
            let because = if d.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", d.reason)
            };
            status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!(
                    "user {:?} cannot {} (SubjectAccessReview denied{because})",
                    user.name,
                    attributes.describe()
                ),
            )
        }
        Err(e) => {
            gate.metrics
                .request("authorization_error", start.elapsed().as_secs_f64());
            status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("authorizing {:?} failed: SubjectAccessReview: {e}", user.name),
            )
        }
    }
}
