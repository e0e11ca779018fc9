//! The HTTP surface of `external.metrics.k8s.io/v1beta1`: discovery and
//! `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/sluice_jobqueue_depth?labelSelector=sluice.dev/jobqueue=<name>`,
//! answering an `ExternalMetricValueList` whose value is the queue's ready + running jobs.
//!
//! A depth that cannot be read is a 503, never a 0: the HPA then keeps the replicas it has (the same
//! safety rule as the operator's own decisions).
//!
//! Every route but `/healthz` and `/readyz` is behind [`super::access`]: the caller must be the
//! kube-apiserver's front proxy (or hold a bearer token) and RBAC must let the user it names read the
//! metric. [`crate::serve::serve`] hands the TLS peer's certificates to that check.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Json, Router,
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_crds::job_queue::JobQueue;
use tokio::net::TcpListener;

use super::access::{Access, Gate, require_access};
use sluice_crds::contract::label::JOB_QUEUE as JOB_QUEUE_LABEL;

use crate::{
    clock::Clock,
    render::hpa::EXTERNAL_METRIC_NAME,
    scaling::{Databases, JobQueueMetrics},
    secret,
};

/// The API group/version served.
pub const GROUP_VERSION: &str = "external.metrics.k8s.io/v1beta1";
/// How long a resolved JobQueue → database is reused.
pub const TARGET_CACHE_TTL: Duration = Duration::from_secs(10);

/// Where a JobQueue's jobs live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The database URL (from the JobQueue's Secret, or its QueueDatabase's).
    pub url: String,
    /// The queue's name in the database.
    pub queue: String,
}

/// How JobQueues are found: from the Kubernetes API (JobQueue, then its Secret or QueueDatabase), or a
/// fixed table (tests).
pub enum Targets {
    /// Read the JobQueue and its Secret, cached for [`TARGET_CACHE_TTL`].
    Kube {
        /// The client.
        client: Client,
        /// The operator's namespace, where QueueDatabases' Secrets are.
        namespace: String,
        /// (namespace, name) → (read at, target).
        cache: Mutex<HashMap<(String, String), (Instant, Target)>>,
    },
    /// A fixed table of (namespace, name) → target.
    Static(HashMap<(String, String), Target>),
}

impl Targets {
    /// Targets read through `client`; QueueDatabases' Secrets are read in `namespace` (the operator's).
    pub fn kube(client: Client, namespace: String) -> Self {
        Targets::Kube {
            client,
            namespace,
            cache: Mutex::default(),
        }
    }

    async fn resolve(&self, namespace: &str, name: &str) -> Result<Option<Target>, String> {
        match self {
            Targets::Static(map) => Ok(map.get(&(namespace.to_owned(), name.to_owned())).cloned()),
            Targets::Kube {
                client,
                namespace: operator_namespace,
                cache,
            } => {
                let key = (namespace.to_owned(), name.to_owned());
                if let Some((at, t)) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
                    && at.elapsed() < TARGET_CACHE_TTL
                {
                    return Ok(Some(t.clone()));
                }
                let api: Api<JobQueue> = Api::namespaced(client.clone(), namespace);
                let Some(jq) = api.get_opt(name).await.map_err(|e| e.to_string())? else {
                    return Ok(None);
                };
                let url = secret::database_url(client, operator_namespace, &jq)
                    .await
                    .map_err(|e| e.to_string())?;
                let t = Target {
                    url,
                    queue: jq.database_queue_name(),
                };
                cache
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, (Instant::now(), t.clone()));
                Ok(Some(t))
            }
        }
    }
}

/// What the handlers share.
pub struct MetricsState {
    /// Connections and the depth cache (shared with the controller).
    pub databases: Arc<Databases>,
    /// How JobQueues are found.
    pub targets: Targets,
    /// Request latency and depth gauges.
    pub metrics: Arc<JobQueueMetrics>,
    /// Wall clock (Unix ms) for the values' timestamps.
    pub clock: Clock,
    /// Who may call.
    pub access: Arc<Access>,
}

/// The router: discovery and the metric (authenticated and authorized), `/healthz` and `/readyz`
/// (open, for kubelet probes).
pub fn router(state: Arc<MetricsState>) -> Router {
    let gate = Gate {
        access: state.access.clone(),
        metrics: state.metrics.clone(),
    };
    Router::new()
        .route("/apis/external.metrics.k8s.io/v1beta1", get(discovery))
        .route(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
            get(metric),
        )
        .fallback(|| async {
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                "the server could not find the requested resource".into(),
            )
        })
        .layer(axum::middleware::from_fn_with_state(gate, require_access))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(|| async { "ok" }))
        .with_state(state)
}

async fn discovery() -> Json<Value> {
    Json(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [{
            "name": EXTERNAL_METRIC_NAME,
            "singularName": "",
            "namespaced": true,
            "kind": "ExternalMetricValueList",
            "verbs": ["get"],
        }],
    }))
}

#[derive(Deserialize)]
struct MetricQuery {
    #[serde(rename = "labelSelector", default)]
    label_selector: Option<String>,
}

/// The JobQueue a selector names: `sluice.dev/jobqueue=<name>` (or `==`), among other terms.
pub fn jobqueue_from_selector(selector: &str) -> Option<String> {
    selector.split(',').find_map(|term| {
        let (k, v) = term.split_once("==").or_else(|| term.split_once('='))?;
        (k.trim() == JOB_QUEUE_LABEL).then(|| v.trim().to_owned())
    })
}

/// A `Status` object, as every Kubernetes API answers errors.
pub(crate) fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "reason": reason, "message": message, "code": code.as_u16(),
    });
    (code, Json(body)).into_response()
}

async fn metric(
    State(state): State<Arc<MetricsState>>,
    Path((namespace, metric)): Path<(String, String)>,
    Query(q): Query<MetricQuery>,
) -> Response {
    let start = Instant::now();
    let (result, response) = answer(&state, &namespace, &metric, q.label_selector.as_deref()).await;
    state.metrics.request(result, start.elapsed().as_secs_f64());
    response
}

async fn answer(
    state: &MetricsState,
    namespace: &str,
    metric: &str,
    selector: Option<&str>,
) -> (&'static str, Response) {
    if metric != EXTERNAL_METRIC_NAME {
        return (
            "not_found",
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("no external metric {metric:?}; Sluice serves {EXTERNAL_METRIC_NAME}"),
            ),
        );
    }
    let Some(name) = selector.and_then(jobqueue_from_selector) else {
        return (
            "bad_request",
            status(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("labelSelector must name the JobQueue: {JOB_QUEUE_LABEL}=<name>"),
            ),
        );
    };
    let target = match state.targets.resolve(namespace, &name).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            return (
                "not_found",
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("JobQueue {namespace}/{name} not found"),
                ),
            );
        }
        Err(e) => {
            return (
                "unavailable",
                status(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "ServiceUnavailable",
                    format!("JobQueue {namespace}/{name}: {e}"),
                ),
            );
        }
    };
    match state.databases.depth(&target.url, &target.queue).await {
        Ok(Some(d)) => {
            state.metrics.set_depth(namespace, &name, &d);
            let ts = Timestamp::from_millisecond((state.clock)()).unwrap_or(Timestamp::UNIX_EPOCH);
            let body = json!({
                "kind": "ExternalMetricValueList",
                "apiVersion": GROUP_VERSION,
                "metadata": {},
                "items": [{
                    "metricName": EXTERNAL_METRIC_NAME,
                    "metricLabels": {JOB_QUEUE_LABEL: name},
                    "timestamp": ts.to_string(),
                    "value": d.demand().to_string(),
                }],
            });
            ("ok", Json(body).into_response())
        }
        Ok(None) => (
            "not_found",
            status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("queue {:?} is not registered in the database yet", target.queue),
            ),
        ),
        Err(e) => (
            "unavailable",
            status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                format!("reading the depth of JobQueue {namespace}/{name}: {e}"),
            ),
        ),
    }
}

/// Runs the external metrics API on `listener` until `shutdown`: keeps its serving certificate current
/// and trusted ([`crate::certs::keep`] with `keeper`, which patches the APIService's `caBundle`), follows
/// the front-proxy settings ([`Access`]), and serves [`router`] over TLS. Every replica runs it.
pub async fn run(
    client: Client,
    listener: TcpListener,
    keeper: crate::certs::Keeper,
    databases: Arc<Databases>,
    metrics: Arc<JobQueueMetrics>,
    serving: crate::serve::Serving,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    let store = Arc::new(crate::certs::CertStore::default());
    let namespace = keeper.settings.namespace.clone();
    tokio::spawn(crate::certs::keep(
        client.clone(),
        keeper,
        store.clone(),
        |_| {},
        shutdown.clone(),
    ));
    let tls = store
        .server_config_with(Some(Arc::new(super::authn::RequestClientCertificate::default())))
        .map_err(std::io::Error::other)?;
    let access = Arc::new(Access::new(client.clone()));
    access.spawn_config_watch(client.clone(), shutdown.clone());
    let state = Arc::new(MetricsState {
        databases,
        targets: Targets::kube(client, namespace),
        metrics,
        clock: crate::clock::system_clock(),
        access,
    });
    tracing::info!(addr = ?listener.local_addr().ok(), "external metrics API listening");
    crate::serve::serve(
        "external-metrics",
        listener,
        Some(tls),
        router(state),
        crate::serve::Limits::default(),
        serving,
        shutdown.cancelled_owned(),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_jobqueue_is_read_from_the_selector() {
        assert_eq!(
            jobqueue_from_selector("sluice.dev/jobqueue=emails").as_deref(),
            Some("emails")
        );
        assert_eq!(
            jobqueue_from_selector("a=b,sluice.dev/jobqueue==emails").as_deref(),
            Some("emails")
        );
        assert_eq!(jobqueue_from_selector("app=emails"), None);
    }
}
