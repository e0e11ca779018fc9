//! The queue HTTP API the sidecar serves to the app on localhost, with its OpenAPI document at
//! `/openapi.json`.
//!
//! Bad input gets a JSON error (`{"error": {"code": "...", "message": "..."}}`) and changes nothing:
//! invalid JSON or missing fields 400, a payload over 1 MiB 413, an unknown queue or job 404, an
//! idempotency key reused with another request 409, a batch over the limit 400. A database that fails or
//! does not answer within the store's answer deadline (`queue.api.answerDeadline`) gets 503 with
//! `Retry-After`; an unanswered one says that a write may or may not have been made, and that an
//! enqueue retried with the same idempotency key makes no second job ([`ApiError`]'s `From<Error>`).
//!
//! An API given a list of queues ([`ApiState::queues`], from `SLUICE_QUEUES` / `queue.queues`) serves
//! only those: a queue outside it is 403 naming the queues it serves, a job in another queue reads as
//! unknown (404), as does a parent in another queue named by `dependsOn` (400, as an unknown id), and the
//! queue list shows only its own. Without a list it serves the whole database.
//!
//! With an [`Authenticator`] (`queue.api.auth.mode: kubernetes`), a layer in front of every route but
//! `/openapi.json` authenticates the caller (401) and authorizes it on the queue the request names, or,
//! for `/v1/jobs/{id}...`, the job's queue (403); `GET /v1/queues` lists the queues the caller may `get`.
//! [`super::auth`] says how.
//!
//! Given a namespace ([`ApiState::namespace`], from `SLUICE_QUEUE_NAMESPACE` / `queue.namespace`), a
//! path's queue name without one is in it: `/v1/queues/emails/jobs` is queue `<namespace>/emails`, as a
//! JobQueue names its queue in the database. Bodies show the queue's database name.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    future::Future,
    net::SocketAddr,
    sync::Arc,
};

use axum::{
    Extension, Json, Router,
    body::{Body, to_bytes},
    extract::{DefaultBodyLimit, Path, Query, Request, State},
    http::{HeaderMap, Method, StatusCode},
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use serde_json::{Value, json};
use uuid::Uuid;

use sluice_crds::sidecar_config::queue_in_namespace;
use sluice_queue::{
    CancelOutcome, GraphJob, Job, JobState, MAX_PAYLOAD_BYTES, NewJob, QueueSettings, QueueStore,
    error::Unanswered,
    store::{MAX_GRAPH_JOBS, check_new_job},
};

use super::auth::{Access, Authenticator, Grant, Origin, Refusal, User};
use super::events::{self, EventHub};
use crate::error::Error;

/// Default most jobs in one batch request.
pub const MAX_BATCH_DEFAULT: usize = 1000;
/// Most jobs returned by one list request.
pub const LIST_LIMIT_MAX: i64 = 500;
/// Room in a single-job request for the fields around the payload.
const ENVELOPE_BYTES: usize = 64 * 1024;
/// The `Retry-After` of a 503 (seconds): a failover or a restart takes a few seconds, and a client
/// that waits a little first does not add to the load of a database that is only slow.
const RETRY_AFTER_SECS: &str = "1";

/// What the API handlers share.
#[derive(Clone, Debug)]
pub struct ApiState {
    /// The queue store.
    pub store: QueueStore,
    /// Most jobs in one batch request.
    pub max_batch: usize,
    /// The queues this API serves; `None`: every queue in the database.
    pub queues: Option<Arc<BTreeSet<String>>>,
    /// Checks callers (`queue.api.auth.mode: kubernetes`); `None`: anyone who reaches the listener may
    /// call.
    pub auth: Option<Arc<Authenticator>>,
    /// The job and queue event streams.
    pub events: EventHub,
    /// The namespace a path's queue name without one is in (`emails` is `<namespace>/emails`);
    /// `None`: names are taken as they are.
    pub namespace: Option<Arc<str>>,
}

impl ApiState {
    /// State over `store` with the default batch limit, serving every queue.
    pub fn new(store: QueueStore) -> Self {
        Self {
            events: EventHub::new(store.clone()),
            store,
            max_batch: MAX_BATCH_DEFAULT,
            queues: None,
            auth: None,
            namespace: None,
        }
    }

    /// Checks callers with `auth`.
    pub fn with_auth(mut self, auth: Arc<Authenticator>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Resolves the queue names of paths in `namespace` (see [`queue_in_namespace`]).
    pub fn in_namespace(mut self, namespace: Option<&str>) -> Self {
        self.namespace = namespace.map(Arc::from);
        self
    }

    /// Serves only `queues` (all of them when the list is empty).
    pub fn serving(mut self, queues: &[String]) -> Self {
        self.queues = (!queues.is_empty()).then(|| Arc::new(queues.iter().cloned().collect()));
        self
    }

    /// Whether this API serves `queue` (a full name): one of its queues, and in its namespace when it has
    /// one. A sidecar with a namespace and no list serves that namespace's queues, never another's.
    fn serves(&self, queue: &str) -> bool {
        self.in_own_namespace(queue) && self.queues.as_ref().is_none_or(|q| q.contains(queue))
    }

    fn in_own_namespace(&self, queue: &str) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| queue.strip_prefix(ns).is_some_and(|rest| rest.starts_with('/')))
    }

    /// `queue`'s name within this API's namespace (`shop/emails` → `emails`): the JobQueue name callers
    /// are authorized on.
    fn short_name(&self, queue: &str) -> String {
        self.namespace
            .as_deref()
            .and_then(|ns| queue.strip_prefix(ns)?.strip_prefix('/'))
            .unwrap_or(queue)
            .to_owned()
    }

    /// The queue a path names, in this API's namespace; 403 unless this API serves it.
    pub(super) fn check_queue(&self, queue: &str) -> ApiResult<String> {
        let queue = queue_in_namespace(self.namespace.as_deref(), queue);
        if !self.in_own_namespace(&queue) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "queue {queue:?} is not in this sidecar's namespace {:?}: name a queue of it",
                    self.namespace.as_deref().unwrap_or_default()
                ),
            ));
        }
        match &self.queues {
            Some(served) if !served.contains(&queue) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "queue {queue:?} is not served by this sidecar (it serves {}; see SLUICE_QUEUES)",
                    served.iter().map(String::as_str).collect::<Vec<_>>().join(", ")
                ),
            )),
            _ => Ok(queue),
        }
    }

    /// Refuses parents (`dependsOn` ids) in queues this API does not serve, or, with callers checked,
    /// whose jobs `caller` may not `get`, with the answer an unknown id gets: a caller limited to some
    /// queues learns nothing of jobs in others, and cannot tie a job to (and lock) a job of a queue it
    /// has no right on. One query for all of them, one review per distinct queue.
    async fn check_parents(
        &self,
        caller: Option<&Caller>,
        ids: impl IntoIterator<Item = Uuid>,
    ) -> ApiResult<()> {
        if self.queues.is_none() && self.checked(caller).is_none() {
            return Ok(());
        }
        let ids: Vec<Uuid> = ids.into_iter().collect();
        if ids.is_empty() {
            return Ok(());
        }
        let queues = self.store.queues_of(&ids).await?;
        let readable = self.readable(caller, queues.values()).await?;
        // A job that does not exist and one the caller may not see get one answer, for the first such
        // id in the request's order: naming them by two rules (this check's and the database's, which
        // takes them sorted) would tell the two apart.
        match ids
            .iter()
            .find(|id| queues.get(id).is_none_or(|q| !readable.contains(q)))
        {
            Some(id) => Err(Error::Invalid(format!("depends_on: job {id} does not exist")).into()),
            None => Ok(()),
        }
    }

    /// The gatekeeper and `caller`'s identity, when callers are checked.
    fn checked<'a>(&'a self, caller: Option<&'a Caller>) -> Option<(&'a Authenticator, &'a User)> {
        self.auth.as_deref().zip(caller.map(|c| &c.user))
    }

    /// Those of `queues` whose jobs `caller` may see: served by this API and, with callers checked,
    /// those it may `get` jobs of (one review per distinct queue not yet decided for this caller, a few
    /// at a time, within the gatekeeper's own bound on reviews in flight).
    async fn readable<'a>(
        &self,
        caller: Option<&Caller>,
        queues: impl IntoIterator<Item = &'a String>,
    ) -> ApiResult<HashSet<String>> {
        let served: Vec<String> = queues
            .into_iter()
            .filter(|q| self.serves(q))
            .cloned()
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let Some((auth, user)) = self.checked(caller) else {
            return Ok(served.into_iter().collect());
        };
        let accesses = served
            .iter()
            .map(|q| Access::jobs("get", self.short_name(q)))
            .collect();
        let decisions = auth.decide_all(user, accesses).await?;
        Ok(served
            .into_iter()
            .zip(decisions)
            .filter_map(|(q, d)| d.allowed.then_some(q))
            .collect())
    }

    /// The job `id`, if it exists in a queue this API serves.
    async fn served_job(&self, id: Uuid) -> ApiResult<Job> {
        self.store
            .get(id)
            .await?
            .filter(|job| self.serves(&job.queue))
            .ok_or_else(|| ApiError::from(Error::NotFound(format!("job {id}"))))
    }
}

/// An API error: status, stable code and message, rendered as JSON.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }
    fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", message)
    }
}

/// SQLSTATE of a statement the server cancelled (here: `statement_timeout`).
const QUERY_CANCELED: &str = "57014";
/// SQLSTATE of a lock not taken within `lock_timeout`.
const LOCK_NOT_AVAILABLE: &str = "55P03";

impl From<Error> for ApiError {
    /// The one mapping of the API's errors to answers. Database trouble is 503 with `Retry-After`,
    /// its details in the log only; a statement the database did not answer within the answer deadline
    /// has an outcome nobody knows, which the answer says.
    fn from(e: Error) -> Self {
        match e {
            Error::NotFound(m) => Self::new(StatusCode::NOT_FOUND, "not_found", m),
            Error::Conflict(m) => Self::new(StatusCode::CONFLICT, "conflict", m),
            Error::Invalid(m) | Error::Config(m) => Self::bad_request(m),
            Error::Database(db) if Unanswered::is(&db) => {
                tracing::warn!(error = %db, "queue api request given up: the database did not answer");
                let ms = Unanswered::of(&db).map_or(0, |u| u.0.as_millis());
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database_unanswered",
                    format!(
                        "the queue database did not answer within the deadline ({ms} ms), so the request \
                         was given up: a write may or may not have been made. Retrying is safe for an \
                         enqueue sent with the same Idempotency-Key header (or the same idempotencyKey \
                         per job in a batch or graph): it makes no second job and answers with the job \
                         the first request made, if it made one"
                    ),
                )
            }
            Error::Database(sqlx::Error::Database(db))
                if matches!(db.code().as_deref(), Some(QUERY_CANCELED | LOCK_NOT_AVAILABLE)) =>
            {
                tracing::warn!(error = %db, "queue api request ended by the database's time limit");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "database_timeout",
                    "the queue database ended the statement at its time limit (a lock waited for past \
                     half of queue.api.answerDeadline, or the statement past four fifths of it), so \
                     nothing was written; retry later, and split a batch or graph that takes this long",
                )
            }
            other => {
                // Internals (SQL, hosts) stay in the log, not in the response.
                tracing::warn!(error = %other, "queue api request failed");
                Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    other.metric_label(),
                    "the queue database is unavailable; retry later",
                )
            }
        }
    }
}

impl From<sluice_queue::Error> for ApiError {
    fn from(e: sluice_queue::Error) -> Self {
        Error::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                http::header::WWW_AUTHENTICATE,
                http::HeaderValue::from_static("Bearer"),
            );
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static(RETRY_AFTER_SECS),
            );
        }
        response
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        if let Refusal::Unavailable(m) = &r {
            // The details (the API server's words, file paths) go to the log, not to a caller who may not
            // even be authenticated yet.
            tracing::warn!(error = %m, "queue api: the API server could not check a caller");
            return Self::new(
                r.status(),
                r.code(),
                "the sidecar could not ask the Kubernetes API server to check this request; try again \
                 (the sidecar's log says why)",
            );
        }
        Self::new(r.status(), r.code(), r.message())
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// The API's routes over `state`.
pub fn router(state: ApiState) -> Router {
    let checked = Router::new()
        .route("/v1/queues", get(list_queues))
        .route("/v1/queues/{queue}", get(get_queue).put(put_queue))
        .route("/v1/queues/{queue}/stats", get(get_queue))
        .route("/v1/queues/{queue}/pause", post(pause))
        .route("/v1/queues/{queue}/resume", post(resume))
        .route("/v1/queues/{queue}/jobs", post(enqueue_one).get(list_jobs))
        .route("/v1/queues/{queue}/jobs/batch", post(enqueue_batch))
        .route("/v1/queues/{queue}/jobs/graph", post(enqueue_graph))
        .route("/v1/queues/{queue}/jobs/{id}/events", get(events::job_events))
        .route("/v1/queues/{queue}/events", get(events::queue_events))
        .route("/v1/jobs/{id}", get(get_job))
        .route("/v1/jobs/{id}/cancel", post(cancel_job))
        .route("/v1/jobs/{id}/retry", post(retry_job))
        .route_layer(middleware::from_fn_with_state(state.clone(), gate));
    Router::new()
        .route("/openapi.json", get(openapi))
        .merge(checked)
        // Bodies are read by the handlers themselves so that limits answer with JSON errors.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Serves the API on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let bound = Listener(listener.local_addr()?);
    // Event streams never end by themselves: they are ended when shutdown begins.
    let events = state.events.clone();
    let shutdown = async move {
        shutdown.await;
        events.close();
    };
    axum::serve(
        listener,
        router(state)
            .layer(Extension(bound))
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// The address the API's listener is bound to (`0.0.0.0:7070` is not loopback, even for a connection
/// that reached it on 127.0.0.1).
#[derive(Clone, Copy, Debug)]
struct Listener(SocketAddr);

/// The caller of a request the gate let through, and what it was let in with (absent when auth is
/// off).
#[derive(Clone, Debug)]
pub(super) struct Caller {
    pub(super) user: User,
    pub(super) grant: Grant,
}

/// Authenticates every request and authorizes it on the queue it names (see the module doc). Runs after
/// routing, so it knows the route and its parameters.
async fn gate(
    State(st): State<ApiState>,
    params: Option<Path<HashMap<String, String>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(auth) = st.auth.clone() else {
        return next.run(request).await;
    };
    // Without connection info (a router served by other means) the caller is not on loopback.
    let unknown: SocketAddr = ([0, 0, 0, 0], 0).into();
    let origin = Origin {
        authorization: request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.as_bytes()),
        peer: request
            .extensions()
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map_or(unknown, |c| c.0),
        local: request.extensions().get::<Listener>().map_or(unknown, |l| l.0),
    };
    let user = match auth.authenticate(origin).await {
        Ok(user) => user,
        Err(refusal) => return ApiError::from(refusal).into_response(),
    };
    let mut grant = Grant {
        authorization: origin.authorization.map(<[u8]>::to_vec),
        peer: origin.peer,
        local: origin.local,
        access: None,
    };
    let params = params.map(|Path(p)| p).unwrap_or_default();
    let path = request.uri().path().to_owned();
    match access(&st, request.method(), &path, &params).await {
        Ok(Some(access)) => {
            if let Err(refusal) = auth.authorize(&user, &access).await {
                return ApiError::from(refusal).into_response();
            }
            grant.access = Some(access);
        }
        Ok(None) => {}
        Err(e) => return e.into_response(),
    }
    request.extensions_mut().insert(Caller { user, grant });
    next.run(request).await
}

/// What a request for `path` (a route of [`router`], with its parameters) asks to do, or `None` when no
/// single queue is concerned (the queue list, filtered by its handler; a job id that names no job, which
/// its handler answers 404).
async fn access(
    st: &ApiState,
    method: &Method,
    path: &str,
    params: &HashMap<String, String>,
) -> ApiResult<Option<Access>> {
    if let Some(queue) = params.get("queue") {
        let queue = st.short_name(queue);
        // `/v1/queues/{queue}` and what follows it: literal segments only.
        let rest: Vec<&str> = path.split('/').skip(4).collect();
        let access = match (method, rest.as_slice()) {
            (&Method::PUT, []) | (&Method::POST, ["pause" | "resume"]) => Access::settings(queue),
            (&Method::POST, _) => Access::jobs("create", queue),
            (_, ["jobs"]) => Access::jobs("list", queue),
            _ => Access::jobs("get", queue),
        };
        return Ok(Some(access));
    }
    let Some(id) = params.get("id") else {
        return Ok(None);
    };
    let id = parse_id(id)?;
    let Some(queue) = st.store.queues_of(&[id]).await?.remove(&id) else {
        return Ok(None);
    };
    let queue = st.short_name(&queue);
    Ok(Some(if method == Method::GET {
        Access::jobs("get", queue)
    } else {
        Access::jobs("update", queue)
    }))
}

async fn read_body(body: Body, limit: usize) -> ApiResult<bytes::Bytes> {
    to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::too_large(format!("request body is over {limit} bytes")))
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> ApiResult<T> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

fn check_payload_size(job: &NewJob, at: &str) -> ApiResult<()> {
    let size = serde_json::to_vec(&job.payload)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_PAYLOAD_BYTES {
        return Err(ApiError::too_large(format!(
            "{at}payload is {size} bytes, over the limit of {MAX_PAYLOAD_BYTES}"
        )));
    }
    Ok(())
}

fn idempotency_key(headers: &HeaderMap) -> ApiResult<Option<String>> {
    headers
        .get("idempotency-key")
        .map(|v| {
            v.to_str()
                .map(str::to_owned)
                .map_err(|_| ApiError::bad_request("Idempotency-Key: must be visible ASCII"))
        })
        .transpose()
}

async fn enqueue_one(
    State(st): State<ApiState>,
    Path(queue): Path<String>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    let caller = caller.as_ref().map(|Extension(c)| c);
    let queue = st.check_queue(&queue)?;
    let bytes = read_body(body, MAX_PAYLOAD_BYTES + ENVELOPE_BYTES).await?;
    let mut job: NewJob = parse_json(&bytes)?;
    check_payload_size(&job, "")?;
    if let Some(key) = idempotency_key(&headers)? {
        job.idempotency_key = Some(key);
    }
    check_new_job(&job)?;
    st.check_parents(caller, job.depends_on.iter().copied()).await?;
    let done = st.store.enqueue(&queue, &job).await?;
    let stored = st
        .store
        .get(done.id)
        .await?
        .ok_or_else(|| ApiError::from(Error::NotFound(format!("job {}", done.id))))?;
    let status = if done.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(with_parents(&st, caller, stored).await?)).into_response())
}

/// A job as the API shows it: its row and `parents: [{id, state}]`; with callers checked, less parents
/// in queues whose jobs `caller` may not `get` ([`ApiState::check_parents`] refuses to add them, but a
/// job enqueued by SQL, or by a caller with more rights, may have them). A parent retention deleted
/// is shown (its state null): nothing is left of it to hide.
async fn with_parents(st: &ApiState, caller: Option<&Caller>, job: Job) -> ApiResult<Value> {
    let mut parents = st.store.parents(job.id).await?;
    if !parents.is_empty() && st.checked(caller).is_some() {
        let ids: Vec<Uuid> = parents.iter().map(|p| p.id).collect();
        let queues = st.store.queues_of(&ids).await?;
        let readable = st.readable(caller, queues.values()).await?;
        parents.retain(|p| queues.get(&p.id).is_none_or(|q| readable.contains(q)));
    }
    let mut v = serde_json::to_value(&job).map_err(|e| ApiError::from(Error::Invalid(e.to_string())))?;
    v["parents"] = json!(parents);
    Ok(v)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Graph {
    jobs: Vec<GraphJob>,
}

async fn enqueue_graph(
    State(st): State<ApiState>,
    Path(queue): Path<String>,
    caller: Option<Extension<Caller>>,
    body: Body,
) -> ApiResult<Response> {
    let queue = st.check_queue(&queue)?;
    let limit = (MAX_GRAPH_JOBS * 4096).max(MAX_PAYLOAD_BYTES + ENVELOPE_BYTES);
    let bytes = read_body(body, limit).await?;
    let graph: Graph = parse_json(&bytes)?;
    for (i, j) in graph.jobs.iter().enumerate() {
        check_payload_size(&j.as_new_job(), &format!("jobs[{i}]."))?;
    }
    let refs: BTreeSet<&str> = graph.jobs.iter().map(|j| j.reference.as_str()).collect();
    // Every dependency that is not a ref of the graph must be a job id, read here (not only by
    // PostgreSQL, which also reads forms this parser does not), so that each one passes the queue check.
    let mut parents: Vec<Uuid> = vec![];
    for (i, j) in graph.jobs.iter().enumerate() {
        for d in j.depends_on.iter().filter(|d| !refs.contains(d.as_str())) {
            let id = Uuid::parse_str(d).map_err(|_| {
                ApiError::bad_request(format!(
                    "jobs[{i}].dependsOn: {d:?} is neither a ref of this graph nor a job id"
                ))
            })?;
            parents.push(id);
        }
    }
    st.check_parents(caller.as_ref().map(|Extension(c)| c), parents)
        .await?;
    let ids = st.store.enqueue_graph(&queue, &graph.jobs).await?;
    let jobs: Vec<Value> = ids
        .into_iter()
        .map(|(reference, done)| json!({"ref": reference, "id": done.id, "created": done.created}))
        .collect();
    Ok((StatusCode::CREATED, Json(json!({ "jobs": jobs }))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Batch {
    jobs: Vec<NewJob>,
}

async fn enqueue_batch(
    State(st): State<ApiState>,
    Path(queue): Path<String>,
    body: Body,
) -> ApiResult<Response> {
    let queue = st.check_queue(&queue)?;
    let limit = (st.max_batch * 4096).clamp(MAX_PAYLOAD_BYTES + ENVELOPE_BYTES, 64 * MAX_PAYLOAD_BYTES);
    let bytes = read_body(body, limit).await?;
    let batch: Batch = parse_json(&bytes)?;
    if batch.jobs.is_empty() {
        return Err(ApiError::bad_request("jobs: must hold at least one job"));
    }
    if batch.jobs.len() > st.max_batch {
        return Err(ApiError::bad_request(format!(
            "jobs: {} jobs is over the batch limit of {}",
            batch.jobs.len(),
            st.max_batch
        )));
    }
    for (i, j) in batch.jobs.iter().enumerate() {
        check_payload_size(j, &format!("jobs[{i}]."))?;
    }
    let ids = st.store.enqueue_many(&queue, &batch.jobs).await?;
    Ok((StatusCode::CREATED, Json(json!({ "ids": ids }))).into_response())
}

async fn get_job(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    caller: Option<Extension<Caller>>,
) -> ApiResult<Response> {
    let id = parse_id(&id)?;
    let job = st.served_job(id).await?;
    let caller = caller.as_ref().map(|Extension(c)| c);
    Ok(Json(with_parents(&st, caller, job).await?).into_response())
}

pub(super) fn parse_id(id: &str) -> ApiResult<Uuid> {
    id.parse()
        .map_err(|_| ApiError::bad_request(format!("job id {id:?} is not a UUID")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    after: Option<Uuid>,
    limit: Option<i64>,
}

async fn list_jobs(
    State(st): State<ApiState>,
    Path(queue): Path<String>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let queue = st.check_queue(&queue)?;
    let Query(q) = query.map_err(|e| ApiError::bad_request(format!("query: {e}")))?;
    let state = q
        .state
        .as_deref()
        .map(str::parse::<JobState>)
        .transpose()
        .map_err(|e| ApiError::bad_request(format!("state: {e}")))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=LIST_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::bad_request(format!(
            "limit: must be 1-{LIST_LIMIT_MAX}"
        )));
    }
    if st.store.queue(&queue).await?.is_none() {
        return Err(Error::NotFound(format!("queue {queue:?}")).into());
    }
    let jobs = st.store.list(&queue, state, q.after, limit).await?;
    let next = (jobs.len() as i64 == limit)
        .then(|| jobs.last().map(|j| j.id))
        .flatten();
    Ok(Json(json!({ "jobs": jobs, "next": next })).into_response())
}

async fn cancel_job(State(st): State<ApiState>, Path(id): Path<String>) -> ApiResult<Response> {
    let id = parse_id(&id)?;
    st.served_job(id).await?;
    let (status, outcome) = match st.store.cancel(id).await? {
        CancelOutcome::Cancelled => (StatusCode::OK, "cancelled"),
        CancelOutcome::Requested => (StatusCode::ACCEPTED, "cancel_requested"),
        CancelOutcome::AlreadyFinished(state) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("job {id} already finished: {}", state.as_str()),
            ));
        }
    };
    Ok((status, Json(json!({ "id": id, "outcome": outcome }))).into_response())
}

async fn retry_job(
    State(st): State<ApiState>,
    Path(id): Path<String>,
    caller: Option<Extension<Caller>>,
) -> ApiResult<Response> {
    let id = parse_id(&id)?;
    st.served_job(id).await?;
    st.store.retry_dead(id).await?;
    get_job(State(st), Path(id.to_string()), caller).await
}

async fn get_queue(State(st): State<ApiState>, Path(queue): Path<String>) -> ApiResult<Response> {
    let queue = st.check_queue(&queue)?;
    let depth = st
        .store
        .depth(&queue)
        .await?
        .ok_or_else(|| ApiError::from(Error::NotFound(format!("queue {queue:?}"))))?;
    Ok(Json(depth).into_response())
}

async fn list_queues(State(st): State<ApiState>, caller: Option<Extension<Caller>>) -> ApiResult<Response> {
    let mut queues = st.store.depth_all().await?;
    let caller = caller.as_ref().map(|Extension(c)| c);
    let readable = st.readable(caller, queues.iter().map(|d| &d.queue)).await?;
    queues.retain(|d| readable.contains(&d.queue));
    Ok(Json(json!({ "queues": queues })).into_response())
}

async fn put_queue(State(st): State<ApiState>, Path(queue): Path<String>, body: Body) -> ApiResult<Response> {
    let queue = st.check_queue(&queue)?;
    let bytes = read_body(body, ENVELOPE_BYTES).await?;
    let mut spec: Value = if bytes.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        parse_json(&bytes)?
    };
    let Some(obj) = spec.as_object_mut() else {
        return Err(ApiError::bad_request(
            "body: must be a JSON object of queue settings",
        ));
    };
    if obj.get("name").is_some_and(|n| {
        n.as_str()
            .is_none_or(|n| queue_in_namespace(st.namespace.as_deref(), n) != queue)
    }) {
        return Err(ApiError::bad_request("name: must match the queue in the path"));
    }
    obj.insert("name".into(), Value::String(queue.clone()));
    let spec: sluice_crds::sidecar_config::QueueSettingsSpec =
        serde_json::from_value(spec).map_err(|e| ApiError::bad_request(format!("invalid settings: {e}")))?;
    let settings = QueueSettings::from(&spec);
    let created = st.store.upsert_queue(&settings).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let stored = st.store.queue(&queue).await?;
    Ok((status, Json(stored)).into_response())
}

async fn pause(State(st): State<ApiState>, Path(queue): Path<String>) -> ApiResult<Response> {
    let queue = st.check_queue(&queue)?;
    st.store.set_paused(&queue, true).await?;
    get_queue(State(st), Path(queue)).await
}

async fn resume(State(st): State<ApiState>, Path(queue): Path<String>) -> ApiResult<Response> {
    let queue = st.check_queue(&queue)?;
    st.store.set_paused(&queue, false).await?;
    get_queue(State(st), Path(queue)).await
}

async fn openapi() -> Json<Value> {
    Json(openapi_document())
}

/// The OpenAPI 3.1 document of this API.
pub fn openapi_document() -> Value {
    let mut doc = openapi_paths_and_schemas();
    // Added here rather than in the literal, whose nesting is at `json!`'s recursion limit.
    let unavailable = json!({
        "description": "the database failed, or did not answer within the sidecar's answer deadline (code \
                        database_unanswered: the write may or may not have been made; an enqueue retried with \
                        the same Idempotency-Key, or idempotencyKey per job, makes no second job); \
                        `Retry-After` says when to retry",
        "content": {"application/json": {"schema": doc["components"]["responses"]["Error"]["content"]["application/json"]["schema"].clone()}}
    });
    if let Some(paths) = doc["paths"].as_object_mut() {
        for operation in paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|p| p.values_mut())
        {
            if let Some(responses) = operation.get_mut("responses").and_then(Value::as_object_mut) {
                responses.insert("503".into(), unavailable.clone());
            }
        }
    }
    doc
}

/// The document before the 503 answer every operation may give.
fn openapi_paths_and_schemas() -> Value {
    let err = json!({"$ref": "#/components/responses/Error"});
    let queue = json!({"name": "queue", "in": "path", "required": true, "schema": {"type": "string"}});
    let id =
        json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string", "format": "uuid"}});
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Sluice queue API", "version": "v1",
                 "description": "Served by the sluice sidecar on localhost for the app. Errors are JSON: {\"error\": {\"code\", \"message\"}}. A sidecar given a queue list (SLUICE_QUEUES) answers 403 for any other queue, 404 for jobs of other queues, and 400 (as for an unknown id) for dependsOn naming a job of another queue. With SLUICE_API_AUTH=kubernetes every path but this one needs `Authorization: Bearer <ServiceAccount token, audience sluice>` (or a tokenless call from the pod's own loopback) and the RBAC verb on jobqueues/jobs or jobqueues/settings of the JobQueue: 401 unauthenticated, 403 forbidden. Any path answers 503 with `Retry-After` when the queue database fails or does not answer within the sidecar's answer deadline (queue.api.answerDeadline, 5s by default); code `database_unanswered` for the latter: a write may or may not have been made, and an enqueue retried with the same Idempotency-Key (or idempotencyKey per job) makes no second job."},
        "paths": {
            "/v1/queues": {"get": {"summary": "Depth of every queue", "responses": {"200": {"description": "{queues: [Depth]}"}}}},
            "/v1/queues/{queue}": {
                "parameters": [queue],
                "get": {"summary": "Depth of a queue", "responses": {"200": {"description": "Depth", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Depth"}}}}, "404": err}},
                "put": {"summary": "Create or update a queue's settings",
                        "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/QueueSettings"}}}},
                        "responses": {"201": {"description": "created"}, "200": {"description": "updated"}, "400": err}}
            },
            "/v1/queues/{queue}/stats": {"parameters": [queue], "get": {"summary": "Depth of a queue", "responses": {"200": {"description": "Depth"}, "404": err}}},
            "/v1/queues/{queue}/pause": {"parameters": [queue], "post": {"summary": "Stop claims from the queue", "responses": {"200": {"description": "Depth"}, "404": err}}},
            "/v1/queues/{queue}/resume": {"parameters": [queue], "post": {"summary": "Resume claims", "responses": {"200": {"description": "Depth"}, "404": err}}},
            "/v1/queues/{queue}/jobs": {
                "parameters": [queue],
                "post": {"summary": "Enqueue a job",
                         "parameters": [{"name": "Idempotency-Key", "in": "header", "schema": {"type": "string", "maxLength": 255}}],
                         "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewJob"}}}},
                         "responses": {"201": {"description": "created", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}},
                                       "200": {"description": "no new job: the job an earlier request with the same Idempotency-Key made, or the job holding the uniqueKey (as it is after a replace or debounce)", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}},
                                       "400": err, "404": err, "409": err, "413": err}},
                "get": {"summary": "List jobs, in creation order",
                        "parameters": [{"name": "state", "in": "query", "schema": {"$ref": "#/components/schemas/JobState"}},
                                       {"name": "after", "in": "query", "schema": {"type": "string", "format": "uuid"}, "description": "the `next` of the previous page"},
                                       {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": LIST_LIMIT_MAX, "default": 100}}],
                        "responses": {"200": {"description": "{jobs: [Job], next: uuid|null}"}, "400": err, "404": err}}
            },
            "/v1/queues/{queue}/jobs/batch": {
                "parameters": [queue],
                "post": {"summary": "Enqueue many jobs in one call; each may carry idempotencyKey, uniqueKey and its options (not dependsOn: use a graph); jobs with keys follow the rules of a single enqueue, in key order",
                         "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["jobs"], "properties": {"jobs": {"type": "array", "items": {"$ref": "#/components/schemas/NewJob"}}}}}}},
                         "responses": {"201": {"description": "{ids: [uuid]} in input order; a job whose idempotency or unique key was held gets the id of the job that answered it"}, "400": err, "404": err, "409": err, "413": err}}
            },
            "/v1/queues/{queue}/jobs/graph": {
                "parameters": [queue],
                "post": {"summary": "Enqueue a small graph of jobs (at most 100) in one transaction, parents first; all or nothing",
                         "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "required": ["jobs"], "properties": {"jobs": {"type": "array", "maxItems": MAX_GRAPH_JOBS, "items": {"$ref": "#/components/schemas/GraphJob"}}}}}}},
                         "responses": {"201": {"description": "{jobs: [{ref, id, created}]} in input order; created is false for a job answered by its idempotency or unique key (the graph's children of that ref depend on the job that answered)"}, "400": err, "404": err, "409": err, "413": err},
                         "description": "400 names a cycle, a duplicate or unknown ref, an unknown job id or bad input; nothing is enqueued then"}
            },
            "/v1/queues/{queue}/jobs/{id}/events": {
                "parameters": [queue, id],
                "get": {"summary": "Stream a job's state changes (Server-Sent Events) until it finishes",
                        "description": "The first event is the job's current state; then one `state` event per change, in commit order; the stream ends after a terminal state (succeeded, dead, cancelled). `event: state` with `data: {id, queue, state, attempt}`; `event: gone` when the job was deleted while streamed. A client too slow to keep up, or any client after the sidecar lost its database notifications for a while, gets the state as it is now rather than every change in between. Comments (`: keep-alive`) every 15 s. 404 for a job that is not in this queue.",
                        "responses": {"200": {"description": "text/event-stream", "content": {"text/event-stream": {"schema": {"type": "string"}, "example": "event: state\ndata: {\"id\":\"01939f5e-…\",\"queue\":\"emails\",\"state\":\"running\",\"attempt\":1}\n\n"}}},
                                      "400": err, "403": err, "404": err, "503": err}}
            },
            "/v1/queues/{queue}/events": {
                "parameters": [queue],
                "get": {"summary": "Stream a queue's counts every second (Server-Sent Events)",
                        "description": "`event: counts` with `data:` the queue's Depth, every second, until the client goes away; the stream ends if the queue is deleted. A client that falls behind gets the latest counts, not every one it missed.",
                        "responses": {"200": {"description": "text/event-stream", "content": {"text/event-stream": {"schema": {"type": "string"}}}}, "403": err, "404": err}}
            },
            "/v1/jobs/{id}": {"parameters": [id], "get": {"summary": "A job, with the jobs it depends on", "responses": {"200": {"description": "Job", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Job"}}}}, "404": err}}},
            "/v1/jobs/{id}/cancel": {"parameters": [id], "post": {"summary": "Cancel a job",
                "responses": {"200": {"description": "was waiting: cancelled"}, "202": {"description": "running: cancellation delivered to its handler"}, "409": err, "404": err}}},
            "/v1/jobs/{id}/retry": {"parameters": [id], "post": {"summary": "Retry a dead job", "responses": {"200": {"description": "Job"}, "409": err, "404": err}}}
        },
        "components": {
            "responses": {"Error": {"description": "error", "content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "object", "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}}}}}},
            "schemas": {
                "JobState": {"type": "string", "enum": ["blocked", "pending", "running", "succeeded", "retrying", "dead", "cancelled"], "description": "blocked: waiting for the jobs it depends on to succeed"},
                "NewJob": {"type": "object", "required": ["kind", "payload"], "additionalProperties": false, "properties": {
                    "kind": {"type": "string", "minLength": 1, "maxLength": 200},
                    "payload": {"description": "any JSON, at most 1 MiB"},
                    "priority": {"type": "integer", "minimum": -1000, "maximum": 1000, "default": 0, "description": "higher runs first"},
                    "runAt": {"type": "string", "format": "date-time"},
                    "delayMs": {"type": "integer", "minimum": 0},
                    "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "idempotencyKey": {"type": "string", "minLength": 1, "maxLength": 255, "description": "answers a retried request: the same key with the same kind and payload within the queue's window returns the job the first request got (even once it finished); with another kind or payload 409. Checked before uniqueKey. For one job the Idempotency-Key header takes precedence; in a batch or graph, per job"},
                    "uniqueKey": {"type": "string", "minLength": 1, "maxLength": 255, "description": "at most one job of the queue holds the key: while one waits or runs (or succeeded less than uniqueFor ago), uniqueMode says what this enqueue does. When an existing job answers, this request's dependsOn is ignored (the job keeps its parents) and its idempotency key is recorded on that job if it has none"},
                    "uniqueMode": {"type": "string", "enum": ["preserve", "replace", "debounce"], "description": "preserve (default): return the holder, change nothing; replace: a waiting holder takes this job's kind, payload, priority, run time and maxAttempts, a running one is left alone and a new job takes the key, blocked until the running one ends; debounce: as replace, and the run time becomes now + debounce"},
                    "uniqueFor": {"type": "string", "example": "1h", "description": "keep the key this long after the job succeeded (default: released when it finishes; a dead or cancelled job always releases it)"},
                    "debounce": {"type": "string", "example": "10s", "description": "with uniqueMode debounce (implied when only this is given): run this long after the latest enqueue with the key; not with runAt or delayMs"},
                    "dependsOn": {"type": "array", "maxItems": 1000, "items": {"type": "string", "format": "uuid"}, "description": "jobs that must succeed first; the job is blocked until then. With a uniqueKey: taken by a new job only (one replacing a running holder waits for the holder too, whatever its outcome). Not in a batch (use a graph)"},
                    "onParentFailure": {"type": "string", "enum": ["cancel", "run"], "default": "cancel", "description": "when a parent ends dead or cancelled: cancel this job (naming the parent) or run it anyway"}}},
                "GraphJob": {"type": "object", "required": ["ref", "kind", "payload"], "additionalProperties": false, "properties": {
                    "ref": {"type": "string", "minLength": 1, "maxLength": 255, "description": "the caller's name for the job, unique within the graph"},
                    "kind": {"type": "string", "minLength": 1, "maxLength": 200}, "payload": {},
                    "priority": {"type": "integer", "minimum": -1000, "maximum": 1000, "default": 0},
                    "runAt": {"type": "string", "format": "date-time"}, "delayMs": {"type": "integer", "minimum": 0},
                    "maxAttempts": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "dependsOn": {"type": "array", "items": {"type": "string"}, "description": "refs of other jobs of the graph, or ids of existing jobs"},
                    "onParentFailure": {"type": "string", "enum": ["cancel", "run"], "default": "cancel"},
                    "idempotencyKey": {"type": "string", "minLength": 1, "maxLength": 255, "description": "as NewJob's: a retried graph gets this job's first answer"},
                    "uniqueKey": {"type": "string", "minLength": 1, "maxLength": 255, "description": "as NewJob's; a job whose key is held is the holder, and the graph's children of this ref depend on it"},
                    "uniqueMode": {"type": "string", "enum": ["preserve", "replace", "debounce"]},
                    "uniqueFor": {"type": "string", "example": "1h"},
                    "debounce": {"type": "string", "example": "10s"}}},
                "Job": {"type": "object", "properties": {
                    "id": {"type": "string", "format": "uuid"}, "queue": {"type": "string"}, "kind": {"type": "string"}, "payload": {},
                    "state": {"$ref": "#/components/schemas/JobState"}, "priority": {"type": "integer"}, "attempt": {"type": "integer"},
                    "maxAttempts": {"type": "integer"}, "runAt": {"type": "string", "format": "date-time"}, "leaseOwner": {"type": ["string", "null"]},
                    "leaseExpiresAt": {"type": ["string", "null"]}, "lastError": {"type": ["string", "null"]}, "idempotencyKey": {"type": ["string", "null"]},
                    "uniqueKey": {"type": ["string", "null"], "description": "set while this job holds the key"}, "uniqueForMs": {"type": ["integer", "null"]},
                    "blockedBy": {"type": "integer", "description": "parents not finished yet"}, "onParentFailure": {"type": ["string", "null"]},
                    "parents": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}, "state": {"type": ["string", "null"], "description": "null once retention deleted the parent"}}}},
                    "cancelRequested": {"type": "boolean"}, "createdAt": {"type": "string"}, "startedAt": {"type": ["string", "null"]}, "finishedAt": {"type": ["string", "null"]}}},
                "Depth": {"type": "object", "properties": {
                    "queue": {"type": "string"}, "ready": {"type": "integer"}, "blocked": {"type": "integer", "description": "waiting for the jobs they depend on; not demand"}, "scheduled": {"type": "integer"}, "retrying": {"type": "integer"},
                    "running": {"type": "integer"}, "dead": {"type": "integer"}, "oldestReadyAgeMs": {"type": "integer"}, "paused": {"type": "boolean"}}},
                "QueueSettings": {"type": "object", "properties": {
                    "maxAttempts": {"type": "integer"}, "backoff": {"type": "object", "properties": {"base": {"type": "string", "example": "1s"}, "cap": {"type": "string", "example": "1h"}, "multiplier": {"type": "number"}}},
                    "leaseDuration": {"type": "string", "example": "30s"}, "retentionSucceeded": {"type": "string", "example": "1d"},
                    "retentionDead": {"type": "string", "example": "7d"}, "idempotencyWindow": {"type": "string", "example": "1d"}}}
            }
        }
    })
}
