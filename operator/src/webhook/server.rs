//! The HTTPS admission server: `POST /inject` answers `AdmissionReview` v1 requests for pods with the
//! patch from [`super::inject`]; `POST /validate-jobqueue` allows a JobQueue only to users who may create
//! its workers themselves ([`super::job_queue_access`]). Every operator replica serves it; injection reads
//! policies and JobQueues from in-memory caches (reflectors), so it never waits on the API server.

use std::sync::Arc;

use axum::{Json, Router, extract::State, routing::post};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    ResourceExt,
    core::{
        DynamicObject,
        admission::{AdmissionRequest, AdmissionResponse, AdmissionReview},
    },
    runtime::reflector::Store,
};
use sluice_crds::{job_queue::JobQueue, rate_limit_policy::RateLimitPolicy};
use tracing::{debug, info, warn};

use super::{
    inject::{self, InjectConfig},
    job_queue_access::{self, Authorize, VALIDATE_JOB_QUEUE_PATH},
};
use crate::metrics::Metrics;

/// Path the `MutatingWebhookConfiguration` calls.
pub const INJECT_PATH: &str = "/inject";

/// Reflector stores of one kind: one per watched namespace, or one for the whole cluster.
pub struct Caches<K>(pub Vec<Store<K>>)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone;

impl<K> Caches<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    /// Every object of every store.
    pub fn state(&self) -> Vec<Arc<K>> {
        self.0.iter().flat_map(|s| s.state()).collect()
    }
}

impl<K> From<Store<K>> for Caches<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn from(store: Store<K>) -> Self {
        Self(vec![store])
    }
}

/// What the admission handler reads.
pub struct WebhookState {
    /// Every `RateLimitPolicy` in the watched namespaces, kept current by reflectors.
    pub policies: Caches<RateLimitPolicy>,
    /// Every `JobQueue` in the watched namespaces (for `sluice.dev/job-queues`), kept current by
    /// reflectors.
    pub job_queues: Caches<JobQueue>,
    /// Injection settings.
    pub config: InjectConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Decides what the user creating or changing a JobQueue may do (SubjectAccessReviews).
    pub authorizer: Arc<dyn Authorize>,
}

/// The admission routes. Having a function that builds them lets tests call them without TLS.
pub fn router(state: Arc<WebhookState>) -> Router {
    Router::new()
        .route(INJECT_PATH, post(inject_pod))
        .route(VALIDATE_JOB_QUEUE_PATH, post(validate_job_queue))
        .with_state(state)
}

async fn inject_pod(
    State(state): State<Arc<WebhookState>>,
    Json(review): Json<AdmissionReview<Pod>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Pod> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            state.metrics.admission("error");
            return Json(AdmissionResponse::invalid(e.to_string()).into_review());
        }
    };
    Json(review_pod(&state, &request).into_review())
}

async fn validate_job_queue(
    State(state): State<Arc<WebhookState>>,
    Json(review): Json<AdmissionReview<DynamicObject>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => return Json(AdmissionResponse::invalid(e.to_string()).into_review()),
    };
    let response = job_queue_access::review(&state.authorizer, &request).await;
    if !response.allowed {
        info!(
            namespace = request.namespace.as_deref().unwrap_or_default(),
            jobqueue = %request.name,
            user = request.user_info.username.as_deref().unwrap_or_default(),
            reason = %response.result.message,
            "JobQueue refused"
        );
    }
    Json(response.into_review())
}

/// Answer one admission request.
pub fn review_pod(state: &WebhookState, request: &AdmissionRequest<Pod>) -> AdmissionResponse {
    let response = AdmissionResponse::from(request);
    let Some(original) = request.object.as_ref() else {
        return response;
    };
    // Pods created by controllers carry no namespace yet; the request says where they go.
    let namespace = request
        .namespace
        .clone()
        .or_else(|| original.namespace())
        .unwrap_or_else(|| "default".into());
    let mut pod = original.clone();
    pod.metadata.namespace = Some(namespace.clone());
    let policies: Vec<_> = state
        .policies
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace.as_str()))
        .collect();
    let name = pod
        .metadata
        .name
        .clone()
        .or(pod.metadata.generate_name.clone())
        .unwrap_or_default();
    let job_queues: Vec<_> = state
        .job_queues
        .state()
        .into_iter()
        .filter(|q| q.namespace().as_deref() == Some(namespace.as_str()))
        .collect();
    match inject::admit(&pod, &policies, &job_queues, &state.config) {
        Ok(None) => {
            state.metrics.admission("skipped");
            response
        }
        Ok(Some(mut injected)) => {
            injected.metadata.namespace = original.metadata.namespace.clone();
            match response.with_patch(inject::patch(original, &injected)) {
                Ok(r) => {
                    state.metrics.admission("injected");
                    info!(%namespace, pod = %name, "injected sluice-sidecar");
                    r
                }
                Err(e) => {
                    state.metrics.admission("error");
                    warn!(error = %e, "could not serialise the patch");
                    AdmissionResponse::from(request).deny("sluice-operator could not build the patch")
                }
            }
        }
        Err(e) => {
            state.metrics.admission("rejected");
            debug!(%namespace, pod = %name, error = %e, "rejected pod");
            response.deny(e.to_string())
        }
    }
}
