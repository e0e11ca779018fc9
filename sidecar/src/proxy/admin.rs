//! The admin endpoints: `/healthz` (the process runs), `/readyz` (config loaded, not draining, and in
//! `failureMode: closed` Redis answering; Redis health, and why Redis cannot be reached, are reported
//! either way), `/metrics` (Prometheus
//! text format: the limiter's and the proxy's metrics).

use std::sync::Arc;

use axum::{
    Json, Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use serde_json::json;

use super::state::ProxyState;

/// The admin router.
pub fn router(state: Arc<ProxyState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<ProxyState>>) -> impl IntoResponse {
    let snap = state.snapshot();
    let ready = state.ready();
    let redis_problem = state.limiter.redis_problem();
    let body = json!({
        "ready": ready,
        "draining": state.draining(),
        "configGeneration": snap.effective.generation(),
        "redisConfigured": snap.effective.config.limits.redis.url.is_some(),
        "redisHealthy": state.limiter.redis_healthy(),
        // Why Redis cannot be reached (`tls`, `auth`, `refused`, ...), and the error, while it cannot.
        "redisError": redis_problem.as_ref().map(|p| json!({
            "cause": p.cause,
            "message": p.to_string(),
            "sinceUnixMs": p.since.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64),
        })),
        "failureMode": snap.effective.config.limits.failure_mode,
        "limitingEnabled": snap.effective.limiting_enabled,
        "rules": snap.effective.config.limits.rules.len(),
    });
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body))
}

async fn metrics(State(state): State<Arc<ProxyState>>) -> impl IntoResponse {
    let mut out = String::new();
    match prometheus_client::encoding::text::encode(&mut out, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            out,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "metrics encoding failed".to_owned(),
        ),
    }
}
