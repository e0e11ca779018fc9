//! Who may call the queue HTTP API (`queue.api.auth.mode: kubernetes`), and the gRPC worker API (which
//! uses this gatekeeper too, [`super::grpc`]): callers are Kubernetes ServiceAccounts, authenticated by
//! their projected token and authorized per queue by the cluster's RBAC.
//!
//! 1. **Authentication.** `Authorization: Bearer <token>`, a token minted for audience
//!    [`API_TOKEN_AUDIENCE`] (a projected ServiceAccount token volume), is checked with a `TokenReview`
//!    (`spec.audiences: ["sluice"]`). A request without a token is the pod's own ServiceAccount only
//!    when it comes from a loopback address to a loopback listener and `loopback: pod` (the default;
//!    pods on the host network get `token`, since their loopback is the node's); anything else is 401.
//! 2. **Authorization.** A `SubjectAccessReview` for the caller on the JobQueue named in the path, in the
//!    pod's namespace: group `sluice.dev`, resource `jobqueues`, subresource `jobs` with verb `create`
//!    (enqueue), `get` (a job, a queue's depth), `list` (a queue's jobs) or `update` (cancel, retry), and
//!    subresource `settings` with verb `update` (settings, pause, resume). Refused: 403.
//!
//! Answers are cached: a token's review by the SHA-256 of the token (never the token itself), accepted
//! for [`ALLOW_TTL`], rejected for [`DENY_TTL`]; a decision likewise. Accepted and refused answers are
//! kept apart, each bounded ([`CACHE_CAPACITY`] accepted, [`DENIED_CAPACITY`] refused; when full, the
//! expired go first, then the oldest), so a flood of made-up tokens never pushes out the callers that
//! were let in. Identical reviews in flight are asked once, and at most [`REVIEW_CONCURRENCY`] reviews
//! run at a time: a caller that cannot start one within [`REVIEW_WAIT`] gets 503. An API server that
//! cannot be asked is 503 and nothing is cached. Tokens are never logged.
//!
//! The API server is reached with the pod's credentials ([`ApiServer::in_cluster`]: the
//! `KUBERNETES_SERVICE_*` variables and the files in [`contract::SERVICE_ACCOUNT_DIR`], or in the directory
//! `SLUICE_SERVICE_ACCOUNT_DIR` names), over TLS connections
//! kept open and reused (at most [`REVIEW_CONCURRENCY`] idle); the sidecar's ServiceAccount needs `create` on `tokenreviews` and
//! `subjectaccessreviews` (docs/security.md, "The queue API's callers").

use std::{
    collections::{BTreeMap, HashMap},
    hash::Hash,
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use futures::{
    StreamExt,
    future::{BoxFuture, FutureExt, Shared},
};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use rustls::{ClientConfig, RootCertStore, pki_types::CertificateDer, pki_types::ServerName};
use rustls_pki_types::pem::PemObject;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_crds::contract;
use sluice_crds::sidecar_config::{API_TOKEN_AUDIENCE, ApiAuthConfig, ApiAuthMode, LoopbackCallers};

/// How long an accepted token or an allowed decision is reused.
pub const ALLOW_TTL: Duration = Duration::from_secs(10);
/// How long a rejected token or a denied decision is reused (shorter: a fixed RoleBinding takes effect
/// soon).
pub const DENY_TTL: Duration = Duration::from_secs(5);
/// Most accepted tokens, and most allowed decisions, kept.
pub const CACHE_CAPACITY: usize = 4096;
/// Most rejected tokens, and most denied decisions, kept (apart from the accepted ones).
pub const DENIED_CAPACITY: usize = 1024;
/// Most reviews asked of the API server at once, by one sidecar.
pub const REVIEW_CONCURRENCY: usize = 8;
/// How long a request waits for one of the [`REVIEW_CONCURRENCY`] reviews before it is answered 503.
pub const REVIEW_WAIT: Duration = Duration::from_secs(2);
/// Most reviews one request for the queue list runs at once.
pub const LIST_REVIEW_CONCURRENCY: usize = 4;
/// The directory of the pod's ServiceAccount credentials: `$SLUICE_SERVICE_ACCOUNT_DIR`, else
/// [`contract::SERVICE_ACCOUNT_DIR`].
pub fn service_account_dir() -> PathBuf {
    std::env::var_os(contract::env::SERVICE_ACCOUNT_DIR)
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from(contract::SERVICE_ACCOUNT_DIR), PathBuf::from)
}
/// The API group of the JobQueues whose subresources callers are authorized on.
pub const GROUP: &str = "sluice.dev";
/// The resource.
pub const RESOURCE: &str = "jobqueues";
/// Deadline of one review, connection included.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest review answer read.
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// An authenticated caller, as the TokenReview named it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct User {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub name: String,
    /// The user's uid, when known.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (the pod the token is bound to, ...), passed on to the SubjectAccessReview.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The `extra` key under which a TokenReview names the pod a bound ServiceAccount token belongs to.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

impl User {
    /// Whether this user's token is bound to the pod `pod` (the TokenReview's [`POD_NAME_EXTRA`]): a
    /// projected token of that pod, which the API server accepts only while the pod exists.
    pub fn is_bound_to_pod(&self, pod: &str) -> bool {
        self.extra
            .get(POD_NAME_EXTRA)
            .is_some_and(|names| names.len() == 1 && names[0] == pod)
    }

    /// The ServiceAccount `name` of `namespace`, with the groups the API server gives ServiceAccounts.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        Self {
            name: format!("system:serviceaccount:{namespace}:{name}"),
            uid: String::new(),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            extra: BTreeMap::new(),
        }
    }
}

/// What a request asks to do to a queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    /// `create`, `get`, `list` or `update`.
    pub verb: &'static str,
    /// `jobs` or `settings`.
    pub subresource: &'static str,
    /// The queue, as the path names it (the JobQueue, in a review).
    pub queue: String,
}

impl Access {
    /// `verb` on the jobs of `queue`.
    pub fn jobs(verb: &'static str, queue: impl Into<String>) -> Self {
        Self {
            verb,
            subresource: "jobs",
            queue: queue.into(),
        }
    }

    /// `update` on the settings of `queue` (settings, pause, resume).
    pub fn settings(queue: impl Into<String>) -> Self {
        Self {
            verb: "update",
            subresource: "settings",
            queue: queue.into(),
        }
    }

    /// `verb jobqueues/subresource "queue"`, for messages.
    pub fn describe(&self, namespace: &str) -> String {
        format!(
            "{} {RESOURCE}/{} of JobQueue {:?} in namespace {namespace:?} (group {GROUP})",
            self.verb, self.subresource, self.queue
        )
    }
}

/// A TokenReview's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenAnswer {
    /// The token is valid for the audience: this user.
    Valid(User),
    /// It is not; why (the API server's words).
    Invalid(String),
}

/// A SubjectAccessReview's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// The authorizer's reason, when it gave one.
    pub reason: String,
}

/// The API server could not be asked (unreachable, an error status, an unreadable answer).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unavailable(pub String);

/// Asks the API server. [`ApiServer`] in the sidecar; a stand-in in tests.
pub trait Reviews: Send + Sync {
    /// A TokenReview of `token` for audience [`API_TOKEN_AUDIENCE`].
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<TokenAnswer, Unavailable>>;
    /// A SubjectAccessReview of `user` doing `access` in `namespace`.
    fn review_access<'a>(
        &'a self,
        user: &'a User,
        namespace: &'a str,
        access: &'a Access,
    ) -> BoxFuture<'a, Result<Decision, Unavailable>>;
}

/// Why a request is refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no token, or a token the API server did not accept.
    Unauthenticated(String),
    /// 403: the caller may not do it.
    Forbidden(String),
    /// 503: the API server could not be asked.
    Unavailable(String),
}

impl Refusal {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The stable error code of the JSON body.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "unauthenticated",
            Refusal::Forbidden(_) => "forbidden",
            Refusal::Unavailable(_) => "auth_unavailable",
        }
    }

    /// The message of the JSON body.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Unauthenticated(m) | Refusal::Forbidden(m) | Refusal::Unavailable(m) => m,
        }
    }
}

/// Where a request came from and what it carried.
#[derive(Clone, Copy, Debug)]
pub struct Origin<'a> {
    /// The `Authorization` header, if any.
    pub authorization: Option<&'a [u8]>,
    /// The peer's address.
    pub peer: SocketAddr,
    /// The address the listener is bound to.
    pub local: SocketAddr,
}

/// What time it is, for the caches' expiry: [`Instant::now`], or a hand-moved clock in tests.
pub type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// What a request was let in with, to check again while its answer lasts (a status stream).
#[derive(Clone)]
pub struct Grant {
    /// The `Authorization` header, if any.
    pub authorization: Option<Vec<u8>>,
    /// The peer's address.
    pub peer: SocketAddr,
    /// The address the listener is bound to.
    pub local: SocketAddr,
    /// What the request asked to do, if it named a queue.
    pub access: Option<Access>,
}

impl std::fmt::Debug for Grant {
    /// The token is not shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field(
                "authorization",
                &self.authorization.as_ref().map(|_| "<redacted>"),
            )
            .field("peer", &self.peer)
            .field("local", &self.local)
            .field("access", &self.access)
            .finish()
    }
}

/// The queue API's gatekeeper: authenticates and authorizes with a [`Reviews`], caching the answers.
pub struct Authenticator {
    reviews: Arc<dyn Reviews>,
    namespace: String,
    pod_account: Option<User>,
    loopback: LoopbackCallers,
    job_queues: BTreeMap<String, String>,
    clock: Clock,
    tokens: Answers<[u8; 32], TokenAnswer>,
    decisions: Answers<(User, Access), Decision>,
    token_flights: Flights<[u8; 32], TokenAnswer>,
    decision_flights: Flights<(User, Access), Decision>,
    limit: Arc<tokio::sync::Semaphore>,
    wait: Duration,
    recheck_every: Duration,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("namespace", &self.namespace)
            .field("pod_account", &self.pod_account.as_ref().map(|u| &u.name))
            .field("loopback", &self.loopback)
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Checks callers of JobQueues in `namespace` with `reviews`. `pod_service_account`: who tokenless
    /// loopback callers are under [`LoopbackCallers::Pod`] (`None`: nobody, they need a token too).
    pub fn new(
        reviews: Arc<dyn Reviews>,
        namespace: impl Into<String>,
        pod_service_account: Option<&str>,
        loopback: LoopbackCallers,
    ) -> Self {
        let namespace = namespace.into();
        Self {
            pod_account: pod_service_account.map(|sa| User::service_account(&namespace, sa)),
            reviews,
            namespace,
            loopback,
            job_queues: BTreeMap::new(),
            clock: Arc::new(Instant::now),
            tokens: Answers::new(),
            decisions: Answers::new(),
            token_flights: Flights::default(),
            decision_flights: Flights::default(),
            limit: Arc::new(tokio::sync::Semaphore::new(REVIEW_CONCURRENCY)),
            wait: REVIEW_WAIT,
            recheck_every: ALLOW_TTL,
        }
    }

    /// Checks open status streams' callers again every `every` (default [`ALLOW_TTL`]).
    pub fn with_recheck_every(mut self, every: Duration) -> Self {
        self.recheck_every = every;
        self
    }

    /// How often an open status stream's caller is checked again.
    pub fn recheck_every(&self) -> Duration {
        self.recheck_every
    }

    /// Whether what `grant` let in is still allowed: the token still valid and the access still
    /// granted (cached answers, so mostly free).
    pub async fn recheck(&self, grant: &Grant) -> Result<(), Refusal> {
        let user = self
            .authenticate(Origin {
                authorization: grant.authorization.as_deref(),
                peer: grant.peer,
                local: grant.local,
            })
            .await?;
        match &grant.access {
            Some(access) => self.authorize(&user, access).await,
            None => Ok(()),
        }
    }

    /// Reads the time from `clock` (tests move it by hand).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Runs at most `concurrency` reviews at once; a request waits `wait` for one before it is 503.
    pub fn with_review_limit(mut self, concurrency: usize, wait: Duration) -> Self {
        self.limit = Arc::new(tokio::sync::Semaphore::new(concurrency));
        self.wait = wait;
        self
    }

    /// A permit to ask the API server, or 503-worthy [`Unavailable`] after waiting `wait`.
    async fn permit(
        limit: Arc<tokio::sync::Semaphore>,
        wait: Duration,
    ) -> Result<tokio::sync::OwnedSemaphorePermit, Unavailable> {
        match tokio::time::timeout(wait, limit.acquire_owned()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Unavailable(format!(
                "too many reviews of callers in flight at once (none free within {wait:?}); retry"
            ))),
        }
    }

    /// Authorizes callers of the queues in `job_queues` (queue → JobQueue) on those JobQueues; any other
    /// queue is its own JobQueue's name.
    pub fn with_job_queues(mut self, job_queues: BTreeMap<String, String>) -> Self {
        self.job_queues = job_queues;
        self
    }

    /// The gatekeeper `cfg` asks for: `Ok(None)` when auth is off; with `kubernetes`, one reviewing
    /// through the pod's in-cluster credentials. An error names what is missing.
    pub fn from_config(cfg: &ApiAuthConfig) -> Result<Option<Self>, String> {
        if cfg.mode == ApiAuthMode::Off {
            return Ok(None);
        }
        let dir = service_account_dir();
        let namespace = match &cfg.namespace {
            Some(ns) => ns.clone(),
            None => std::fs::read_to_string(dir.join("namespace"))
                .map(|s| s.trim().to_owned())
                .map_err(|e| {
                    format!(
                        "queue.api.auth.namespace: not set (set SLUICE_POD_NAMESPACE) and {}/namespace \
                         is unreadable: {e}",
                        dir.display()
                    )
                })?,
        };
        let server = ApiServer::in_cluster()?;
        Ok(Some(
            Self::new(
                Arc::new(server),
                namespace,
                cfg.service_account.as_deref(),
                cfg.loopback,
            )
            .with_job_queues(cfg.job_queues.clone()),
        ))
    }

    /// The namespace whose JobQueues are checked.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pod's own ServiceAccount, who tokenless loopback callers are (when they are let in).
    pub fn pod_account(&self) -> Option<&User> {
        self.pod_account.as_ref()
    }

    /// Who is calling: the token's user, or the pod's ServiceAccount for a tokenless loopback call.
    pub async fn authenticate(&self, origin: Origin<'_>) -> Result<User, Refusal> {
        let Some(header) = origin.authorization else {
            let local = origin.peer.ip().is_loopback() && origin.local.ip().is_loopback();
            return match (&self.pod_account, self.loopback) {
                (Some(pod), LoopbackCallers::Pod) if local => Ok(pod.clone()),
                _ => Err(Refusal::Unauthenticated(format!(
                    "no token: send `Authorization: Bearer <token>` with a ServiceAccount token for \
                     audience {API_TOKEN_AUDIENCE:?} (the injected pod has it in the file named by \
                     SLUICE_QUEUE_API_TOKEN_FILE){}",
                    if local {
                        ""
                    } else {
                        "; only calls from the pod's own loopback may come without one"
                    }
                ))),
            };
        };
        let token = std::str::from_utf8(header)
            .ok()
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Refusal::Unauthenticated("the Authorization header is not `Bearer <token>`".into())
            })?;
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let answer = match self.tokens.get(&key, (self.clock)()) {
            Some(answer) => answer,
            None => {
                let reviews = self.reviews.clone();
                let token = token.to_owned();
                let permit = Self::permit(self.limit.clone(), self.wait);
                let ask = async move {
                    let _permit = permit.await?;
                    reviews.review_token(&token).await
                };
                self.token_flights
                    .run(key, ask.boxed(), |answer| {
                        if let Ok(answer) = answer {
                            let allowed = matches!(answer, TokenAnswer::Valid(_));
                            self.tokens.insert(key, answer.clone(), allowed, (self.clock)());
                        }
                    })
                    .await
                    .map_err(|e| Refusal::Unavailable(format!("the token could not be checked: {e}")))?
            }
        };
        match answer {
            TokenAnswer::Valid(user) => Ok(user),
            TokenAnswer::Invalid(why) => Err(Refusal::Unauthenticated(format!(
                "the token is not a valid ServiceAccount token for audience {API_TOKEN_AUDIENCE:?}: {why}"
            ))),
        }
    }

    /// Whether `user` may do `access` (on a queue): `Ok` or the 403 (or 503) naming what is missing.
    pub async fn authorize(&self, user: &User, access: &Access) -> Result<(), Refusal> {
        let access = &self.on_job_queue(access);
        let decision = self.review(user, access).await?;
        if decision.allowed {
            return Ok(());
        }
        Err(Refusal::Forbidden(format!(
            "{} may not {}: grant it with a Role and RoleBinding in namespace {:?}{}",
            user.name,
            access.describe(&self.namespace),
            self.namespace,
            if decision.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", decision.reason)
            }
        )))
    }

    /// Whether `user` may do `access` (on a queue; cached).
    pub async fn decide(&self, user: &User, access: &Access) -> Result<Decision, Refusal> {
        self.review(user, &self.on_job_queue(access)).await
    }

    /// `access` to a queue as access to its JobQueue.
    fn on_job_queue(&self, access: &Access) -> Access {
        match self.job_queues.get(&access.queue) {
            Some(jq) => Access {
                queue: jq.clone(),
                ..access.clone()
            },
            None => access.clone(),
        }
    }

    /// Whether `user` may do each of `accesses` (on queues), in order, with at most
    /// [`LIST_REVIEW_CONCURRENCY`] reviews of this call at once.
    pub async fn decide_all(&self, user: &User, accesses: Vec<Access>) -> Result<Vec<Decision>, Refusal> {
        futures::stream::iter(accesses)
            .map(|access| async move { self.decide(user, &access).await })
            .buffered(LIST_REVIEW_CONCURRENCY)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// Whether `user` may do `access` (on a JobQueue; cached).
    async fn review(&self, user: &User, access: &Access) -> Result<Decision, Refusal> {
        let key = (user.clone(), access.clone());
        if let Some(d) = self.decisions.get(&key, (self.clock)()) {
            return Ok(d);
        }
        let reviews = self.reviews.clone();
        let (who, what, namespace) = (user.clone(), access.clone(), self.namespace.clone());
        let permit = Self::permit(self.limit.clone(), self.wait);
        let ask = async move {
            let _permit = permit.await?;
            reviews.review_access(&who, &namespace, &what).await
        };
        self.decision_flights
            .run(key.clone(), ask.boxed(), |decision| {
                if let Ok(d) = decision {
                    self.decisions
                        .insert(key.clone(), d.clone(), d.allowed, (self.clock)());
                }
            })
            .await
            .map_err(|e| Refusal::Unavailable(format!("the request could not be authorized: {e}")))
    }
}

/// The Kubernetes API server, reached with a bearer token read from a file (re-read for each review, so
/// a rotated token is used at once) over TLS verified against a CA bundle.
pub struct ApiServer {
    host: String,
    port: u16,
    token_file: PathBuf,
    tls: Arc<ClientConfig>,
    /// Connections open and free for the next review (at most [`REVIEW_CONCURRENCY`]).
    idle: Mutex<Vec<Connection>>,
}

/// One HTTP/1.1 connection to the API server, over TLS.
type Connection = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

impl ApiServer {
    /// The API server at `url` (`https://host:port`), trusting the PEM certificates in `ca_pem`, with the
    /// bearer token in `token_file`.
    pub fn new(url: &str, ca_pem: &[u8], token_file: impl Into<PathBuf>) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("API server URL {url:?}: {e}"))?;
        if uri.scheme_str() != Some("https") {
            return Err(format!("API server URL {url:?}: must be https://"));
        }
        let host = uri
            .host()
            .ok_or_else(|| format!("API server URL {url:?}: no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            let cert = cert.map_err(|e| format!("API server CA: {e}"))?;
            roots.add(cert).map_err(|e| format!("API server CA: {e}"))?;
        }
        if roots.is_empty() {
            return Err("API server CA: no certificate".into());
        }
        let tls = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            host,
            port: uri.port_u16().unwrap_or(443),
            token_file: token_file.into(),
            tls: Arc::new(tls),
            idle: Mutex::default(),
        })
    }

    /// The API server a pod reaches: `KUBERNETES_SERVICE_HOST`/`_PORT`, the CA and token in
    /// [`service_account_dir`] ([`contract::SERVICE_ACCOUNT_DIR`] unless `SLUICE_SERVICE_ACCOUNT_DIR` says
    /// otherwise).
    pub fn in_cluster() -> Result<Self, String> {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{name} is not set: queue.api.auth.mode kubernetes runs in a pod"))
        };
        let host = var("KUBERNETES_SERVICE_HOST")?;
        let port = var("KUBERNETES_SERVICE_PORT")?;
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        let dir = service_account_dir();
        let ca = std::fs::read(dir.join("ca.crt")).map_err(|e| format!("{}/ca.crt: {e}", dir.display()))?;
        Self::new(&format!("https://{host}:{port}"), &ca, dir.join("token"))
    }

    /// `host:port`, an IPv6 host in brackets.
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// A kept connection ready for a request, if any.
    async fn idle_connection(&self) -> Option<Connection> {
        loop {
            let mut send = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
            if !send.is_closed() && send.ready().await.is_ok() {
                return Some(send);
            }
        }
    }

    /// A new TLS connection to the API server.
    async fn connect(&self) -> Result<Connection, Unavailable> {
        let fail = |what: &str, e: &dyn std::fmt::Display| Unavailable(format!("{what}: {e}"));
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| fail("connecting to the API server", &e))?;
        let name = ServerName::try_from(self.host.clone()).map_err(|e| fail("API server name", &e))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| fail("TLS to the API server", &e))?;
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .map_err(|e| fail("HTTP to the API server", &e))?;
        tokio::spawn(conn);
        Ok(send)
    }

    /// POSTs `body` to `path` and returns the answer's JSON.
    async fn create(&self, path: &str, body: Value) -> Result<Value, Unavailable> {
        tokio::time::timeout(REVIEW_TIMEOUT, self.create_now(path, body))
            .await
            .map_err(|_| Unavailable(format!("the API server did not answer within {REVIEW_TIMEOUT:?}")))?
    }

    async fn create_now(&self, path: &str, body: Value) -> Result<Value, Unavailable> {
        let fail = |what: &str, e: &dyn std::fmt::Display| Unavailable(format!("{what}: {e}"));
        let token = std::fs::read_to_string(&self.token_file)
            .map_err(|e| fail(&format!("reading {}", self.token_file.display()), &e))?;
        let request = || {
            http::Request::builder()
                .method(Method::POST)
                .uri(path)
                .header(http::header::HOST, self.authority())
                .header(http::header::CONTENT_TYPE, "application/json")
                .header(http::header::ACCEPT, "application/json")
                .header(http::header::AUTHORIZATION, format!("Bearer {}", token.trim()))
                .body(Full::new(Bytes::from(body.to_string())))
                .map_err(|e| fail("building the request", &e))
        };
        // A kept connection the API server closed meanwhile fails before an answer: the review (which
        // changes nothing) is then asked once more on a new connection.
        let (send, answer) = match self.idle_connection().await {
            Some(mut send) => match send.send_request(request()?).await {
                Ok(answer) => (send, answer),
                Err(_) => {
                    let mut send = self.connect().await?;
                    let answer = send
                        .send_request(request()?)
                        .await
                        .map_err(|e| fail("the API server", &e))?;
                    (send, answer)
                }
            },
            None => {
                let mut send = self.connect().await?;
                let answer = send
                    .send_request(request()?)
                    .await
                    .map_err(|e| fail("the API server", &e))?;
                (send, answer)
            }
        };
        let status = answer.status();
        let bytes = Limited::new(answer.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| fail("reading the API server's answer", &*e))?
            .to_bytes();
        // The answer was read to its end: the connection is free for the next review.
        if !send.is_closed() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < REVIEW_CONCURRENCY {
                idle.push(send);
            }
        }
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if !status.is_success() {
            let message = value["message"].as_str().unwrap_or("no message");
            return Err(Unavailable(format!(
                "the API server answered {status} to {path}: {message}"
            )));
        }
        Ok(value)
    }
}

impl Reviews for ApiServer {
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<TokenAnswer, Unavailable>> {
        Box::pin(async move {
            let review = json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token, "audiences": [API_TOKEN_AUDIENCE]},
            });
            let answer = self
                .create("/apis/authentication.k8s.io/v1/tokenreviews", review)
                .await?;
            Ok(token_answer(&answer["status"]))
        })
    }

    fn review_access<'a>(
        &'a self,
        user: &'a User,
        namespace: &'a str,
        access: &'a Access,
    ) -> BoxFuture<'a, Result<Decision, Unavailable>> {
        Box::pin(async move {
            let mut spec = json!({
                "user": user.name, "groups": user.groups, "extra": user.extra,
                "resourceAttributes": {
                    "namespace": namespace, "group": GROUP, "resource": RESOURCE,
                    "subresource": access.subresource, "verb": access.verb, "name": access.queue,
                },
            });
            if !user.uid.is_empty() {
                spec["uid"] = json!(user.uid);
            }
            let review = json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec,
            });
            let answer = self
                .create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
                .await?;
            let status = &answer["status"];
            Ok(Decision {
                allowed: status["allowed"] == json!(true) && status["denied"] != json!(true),
                reason: status["reason"]
                    .as_str()
                    .or(status["evaluationError"].as_str())
                    .unwrap_or_default()
                    .to_owned(),
            })
        })
    }
}

/// A TokenReview's `status` read: valid only when authenticated for [`API_TOKEN_AUDIENCE`].
pub fn token_answer(status: &Value) -> TokenAnswer {
    if status["authenticated"] != json!(true) {
        let why = status["error"].as_str().unwrap_or("not authenticated");
        return TokenAnswer::Invalid(why.to_owned());
    }
    // The review named our audience, so the answer lists those the token is valid for. An answer without
    // them would mean the API server's own audience (TokenReviewStatus.audiences: "an empty list ...
    // implies the audience of the API server"): a token for the API server is not one for Sluice.
    let audiences = status["audiences"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !audiences.iter().any(|a| a == API_TOKEN_AUDIENCE) {
        return TokenAnswer::Invalid(format!(
            "the token's audiences {audiences:?} do not include {API_TOKEN_AUDIENCE:?}"
        ));
    }
    let u = &status["user"];
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    TokenAnswer::Valid(User {
        name: u["username"].as_str().unwrap_or_default().to_owned(),
        uid: u["uid"].as_str().unwrap_or_default().to_owned(),
        groups: strings(&u["groups"]),
        extra: u["extra"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), strings(v))).collect())
            .unwrap_or_default(),
    })
}

/// Identical reviews in flight, asked once: the first caller starts the review, later ones await the
/// same answer. A review runs as a task of its own, so it finishes (and frees its place among the
/// [`REVIEW_CONCURRENCY`]) even when every caller waiting for it has gone away.
struct Flights<K, T> {
    running: Arc<Mutex<Running<K, T>>>,
    next: std::sync::atomic::AtomicU64,
}

type Flight<T> = Shared<BoxFuture<'static, Result<T, Unavailable>>>;
type Running<K, T> = HashMap<K, (u64, Flight<T>)>;

impl<K, T> Default for Flights<K, T> {
    fn default() -> Self {
        Self {
            running: Arc::default(),
            next: Default::default(),
        }
    }
}

impl<K, T> Flights<K, T>
where
    K: Eq + Hash + Clone + Send + 'static,
    T: Clone + Send + Sync + 'static,
{
    /// The answer of the review in flight for `key`, or of `ask` started now; `done` sees it (to cache
    /// it).
    async fn run(
        &self,
        key: K,
        ask: BoxFuture<'static, Result<T, Unavailable>>,
        done: impl FnOnce(&Result<T, Unavailable>),
    ) -> Result<T, Unavailable> {
        let flight = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            match running.get(&key) {
                Some((_, flight)) => flight.clone(),
                None => {
                    let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let (map, k) = (self.running.clone(), key.clone());
                    let task = tokio::spawn(async move {
                        let answer = ask.await;
                        let mut running = map.lock().unwrap_or_else(|p| p.into_inner());
                        if running.get(&k).is_some_and(|(i, _)| *i == id) {
                            running.remove(&k);
                        }
                        answer
                    });
                    let flight = async move {
                        task.await
                            .unwrap_or_else(|e| Err(Unavailable(format!("the review failed: {e}"))))
                    }
                    .boxed()
                    .shared();
                    running.insert(key, (id, flight.clone()));
                    flight
                }
            }
        };
        let answer = flight.await;
        done(&answer);
        answer
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.running.lock().unwrap().len()
    }
}

/// Answers kept apart by whether they let the caller in, so refusals only ever push out refusals.
struct Answers<K, V> {
    allowed: TtlCache<K, V>,
    denied: TtlCache<K, V>,
}

impl<K: Eq + Hash + Clone, V: Clone> Answers<K, V> {
    fn new() -> Self {
        Self {
            allowed: TtlCache::new(CACHE_CAPACITY),
            denied: TtlCache::new(DENIED_CAPACITY),
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.allowed.get(key, now).or_else(|| self.denied.get(key, now))
    }

    fn insert(&self, key: K, value: V, allowed: bool, now: Instant) {
        if allowed {
            self.denied.remove(&key);
            self.allowed.insert(key, value, ALLOW_TTL, now);
        } else {
            self.allowed.remove(&key);
            self.denied.insert(key, value, DENY_TTL, now);
        }
    }
}

/// A small map whose entries expire. Bounded: when full, expired entries are dropped, and if none are,
/// the oldest (all entries of one cache live equally long).
struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (Instant, V)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::default(),
            capacity,
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .get(key)
            .filter(|(expires, _)| now < *expires)
            .map(|(_, v)| v.clone())
    }

    fn remove(&self, key: &K) {
        self.entries.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (expires, _)| now < *expires);
            while entries.len() >= self.capacity {
                // The oldest is the one expiring first. A scan, only when full of live entries.
                let Some(oldest) = entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                entries.remove(&oldest);
            }
        }
        entries.insert(key, (now + ttl, value));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[test]
    fn a_grant_does_not_show_its_token_when_logged() {
        let grant = Grant {
            authorization: Some(b"Bearer secret-token".to_vec()),
            peer: ([127, 0, 0, 1], 4000).into(),
            local: ([127, 0, 0, 1], 9903).into(),
            access: None,
        };
        let shown = format!("{grant:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    /// Tokens `good-<name>` are ServiceAccount `<name>` of `shop`; `down` cannot be asked about;
    /// anything else is invalid. Users in `allowed` may do anything; counts the reviews.
    #[derive(Default)]
    struct Stand {
        allowed: Vec<String>,
        token_reviews: AtomicUsize,
        access_reviews: AtomicUsize,
    }

    impl Reviews for Stand {
        fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<TokenAnswer, Unavailable>> {
            self.token_reviews.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                match token.strip_prefix("good-") {
                    Some(sa) => Ok(TokenAnswer::Valid(User::service_account("shop", sa))),
                    None if token == "down" => Err(Unavailable("connection refused".into())),
                    None => Ok(TokenAnswer::Invalid("token has expired".into())),
                }
            })
        }
        fn review_access<'a>(
            &'a self,
            user: &'a User,
            _: &'a str,
            _: &'a Access,
        ) -> BoxFuture<'a, Result<Decision, Unavailable>> {
            self.access_reviews.fetch_add(1, Ordering::SeqCst);
            Box::pin(async move {
                Ok(Decision {
                    allowed: self.allowed.contains(&user.name),
                    reason: String::new(),
                })
            })
        }
    }

    fn origin<'a>(authorization: Option<&'a str>, peer: &str, local: &str) -> Origin<'a> {
        Origin {
            authorization: authorization.map(str::as_bytes),
            peer: peer.parse().unwrap(),
            local: local.parse().unwrap(),
        }
    }

    fn gate(stand: Arc<Stand>, loopback: LoopbackCallers) -> Authenticator {
        Authenticator::new(stand, "shop", Some("web"), loopback)
    }

    #[tokio::test]
    async fn tokenless_callers_are_the_pod_only_from_loopback_to_a_loopback_listener() {
        let g = gate(Arc::default(), LoopbackCallers::Pod);
        let pod = g
            .authenticate(origin(None, "127.0.0.1:5000", "127.0.0.1:7070"))
            .await
            .unwrap();
        assert_eq!(pod.name, "system:serviceaccount:shop:web");
        assert!(pod.groups.contains(&"system:serviceaccounts:shop".to_owned()));
        for (peer, local) in [
            ("10.0.0.7:5000", "0.0.0.0:7070"),
            ("127.0.0.1:5000", "0.0.0.0:7070"),
            ("10.0.0.7:5000", "127.0.0.1:7070"),
        ] {
            let refused = g.authenticate(origin(None, peer, local)).await.unwrap_err();
            assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{peer} → {local}");
            assert!(refused.message().contains("no token"), "{refused:?}");
        }
        let strict = gate(Arc::default(), LoopbackCallers::Token);
        let refused = strict
            .authenticate(origin(None, "127.0.0.1:5000", "127.0.0.1:7070"))
            .await
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
        let nobody = Authenticator::new(Arc::new(Stand::default()), "shop", None, LoopbackCallers::Pod);
        assert!(
            nobody
                .authenticate(origin(None, "127.0.0.1:5000", "127.0.0.1:7070"))
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn tokens_are_reviewed_once_per_ttl_keyed_by_their_hash_and_outages_are_not_cached() {
        let stand = Arc::new(Stand::default());
        let g = gate(stand.clone(), LoopbackCallers::Pod);
        let any = |a| origin(Some(a), "10.0.0.7:5000", "0.0.0.0:7070");
        for _ in 0..3 {
            let user = g.authenticate(any("Bearer good-mailer")).await.unwrap();
            assert_eq!(user.name, "system:serviceaccount:shop:mailer");
        }
        assert_eq!(stand.token_reviews.load(Ordering::SeqCst), 1);
        for _ in 0..2 {
            let refused = g.authenticate(any("Bearer stale")).await.unwrap_err();
            assert_eq!(refused.code(), "unauthenticated");
            assert!(refused.message().contains("token has expired"), "{refused:?}");
        }
        assert_eq!(stand.token_reviews.load(Ordering::SeqCst), 2);
        for _ in 0..2 {
            let refused = g.authenticate(any("Bearer down")).await.unwrap_err();
            assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        }
        assert_eq!(
            stand.token_reviews.load(Ordering::SeqCst),
            4,
            "an outage is asked again"
        );
        let refused = g.authenticate(any("Basic dTpw")).await.unwrap_err();
        assert!(refused.message().contains("Bearer"), "{refused:?}");
        // The cache holds digests, never a token.
        let keys: Vec<[u8; 32]> = [&g.tokens.allowed, &g.tokens.denied]
            .iter()
            .flat_map(|c| c.entries.lock().unwrap().keys().copied().collect::<Vec<_>>())
            .collect();
        assert_eq!(keys.len(), 2);
        assert!(keys.contains(&Sha256::digest(b"good-mailer").into()));
    }

    #[tokio::test]
    async fn decisions_are_cached_per_user_and_access_and_a_refusal_names_what_to_grant() {
        let stand = Arc::new(Stand {
            allowed: vec!["system:serviceaccount:shop:web".into()],
            ..Stand::default()
        });
        let g = gate(stand.clone(), LoopbackCallers::Pod);
        let web = User::service_account("shop", "web");
        let other = User::service_account("shop", "other");
        for _ in 0..3 {
            g.authorize(&web, &Access::jobs("create", "emails"))
                .await
                .unwrap();
        }
        assert_eq!(stand.access_reviews.load(Ordering::SeqCst), 1);
        g.authorize(&web, &Access::jobs("get", "emails")).await.unwrap();
        assert_eq!(stand.access_reviews.load(Ordering::SeqCst), 2);
        let refused = g
            .authorize(&other, &Access::settings("emails"))
            .await
            .unwrap_err();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            refused.message(),
            "system:serviceaccount:shop:other may not update jobqueues/settings of JobQueue \"emails\" \
             in namespace \"shop\" (group sluice.dev): grant it with a Role and RoleBinding in namespace \"shop\""
        );
    }

    #[tokio::test]
    async fn a_queue_with_another_database_name_is_authorized_on_its_job_queue() {
        let stand = Arc::new(Stand {
            allowed: vec!["system:serviceaccount:shop:web".into()],
            ..Stand::default()
        });
        let g = gate(stand, LoopbackCallers::Pod)
            .with_job_queues([("email-jobs".to_owned(), "emails".to_owned())].into());
        let other = User::service_account("shop", "other");
        let refused = g
            .authorize(&other, &Access::jobs("create", "email-jobs"))
            .await
            .unwrap_err();
        assert!(refused.message().contains("JobQueue \"emails\""), "{refused:?}");
        let decided = g
            .decisions
            .denied
            .entries
            .lock()
            .unwrap()
            .keys()
            .map(|(_, a)| a.queue.clone())
            .collect::<Vec<_>>();
        assert_eq!(decided, ["emails"]);
    }

    /// A TLS stand-in for the API server on loopback that accepts every token and counts the
    /// connections it accepted; the server's CA (its own certificate) in PEM.
    async fn tls_api_server(connections: Arc<AtomicUsize>) -> (String, String) {
        let key = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).unwrap();
        let ca = key.cert.pem();
        let cert = key.cert.der().clone();
        let der = rustls::pki_types::PrivateKeyDer::Pkcs8(key.signing_key.serialize_der().into());
        let tls =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![cert], der)
                .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                connections.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let answer = |_req: http::Request<hyper::body::Incoming>| async {
                        let body = json!({"status": {"authenticated": true, "audiences": ["sluice"],
                            "user": {"username": "system:serviceaccount:shop:web"}}});
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(Bytes::from(
                            body.to_string(),
                        ))))
                    };
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(tls),
                            hyper::service::service_fn(answer),
                        )
                        .await;
                });
            }
        });
        (url, ca)
    }

    #[tokio::test]
    async fn reviews_reuse_a_kept_connection_to_the_api_server() {
        let connections = Arc::new(AtomicUsize::new(0));
        let (url, ca) = tls_api_server(connections.clone()).await;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "sidecar-token").unwrap();
        let server = ApiServer::new(&url, ca.as_bytes(), &token).unwrap();
        for i in 0..5 {
            let answer = server.review_token(&format!("caller-{i}")).await.unwrap();
            assert!(matches!(answer, TokenAnswer::Valid(_)), "{answer:?}");
        }
        assert_eq!(
            connections.load(Ordering::SeqCst),
            1,
            "one connection for five reviews"
        );
    }

    #[test]
    fn the_api_server_url_is_read_with_ipv6_hosts_in_brackets() {
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()])
            .unwrap()
            .cert
            .pem();
        let v6 = ApiServer::new("https://[fd00::1]:6443", ca.as_bytes(), "/token").unwrap();
        assert_eq!(
            (v6.host.as_str(), v6.authority()),
            ("fd00::1", "[fd00::1]:6443".to_owned())
        );
        let v4 = ApiServer::new("https://10.96.0.1", ca.as_bytes(), "/token").unwrap();
        assert_eq!(v4.authority(), "10.96.0.1:443");
        assert!(ApiServer::new("http://10.96.0.1", ca.as_bytes(), "/token").is_err());
        assert!(ApiServer::new("https://10.96.0.1", b"", "/token").is_err());
    }

    #[test]
    fn the_cache_stays_bounded_dropping_the_expired_then_the_oldest() {
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let cache = TtlCache::new(2);
        cache.insert("a", 1, minute, t0);
        cache.insert("gone", 0, Duration::ZERO, t0);
        assert_eq!(cache.get(&"a", t0), Some(1));
        assert_eq!(cache.get(&"gone", t0), None, "expired");
        cache.insert("b", 2, minute, t0 + Duration::from_secs(1));
        assert_eq!(
            (cache.get(&"a", t0), cache.get(&"b", t0)),
            (Some(1), Some(2)),
            "the expired went"
        );
        cache.insert("c", 3, minute, t0 + Duration::from_secs(2));
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.get(&"a", t0), None, "the oldest went");
        assert_eq!((cache.get(&"b", t0), cache.get(&"c", t0)), (Some(2), Some(3)));
        assert_eq!(cache.get(&"c", t0 + minute * 2), None);
    }

    #[tokio::test]
    async fn a_flood_of_made_up_tokens_never_pushes_out_the_accepted_ones() {
        let stand = Arc::new(Stand::default());
        let g = gate(stand.clone(), LoopbackCallers::Pod);
        let any = |a: &str| {
            let a: &'static str = Box::leak(a.to_owned().into_boxed_str());
            origin(Some(a), "10.0.0.7:5000", "0.0.0.0:7070")
        };
        g.authenticate(any("Bearer good-mailer")).await.unwrap();
        let flood = CACHE_CAPACITY + 10;
        for i in 0..flood {
            let bogus = format!("Bearer bogus-{i}");
            assert!(g.authenticate(any(&bogus)).await.is_err());
        }
        assert!(g.tokens.denied.len() <= DENIED_CAPACITY);
        g.authenticate(any("Bearer good-mailer")).await.unwrap();
        assert_eq!(
            stand.token_reviews.load(Ordering::SeqCst),
            1 + flood,
            "the accepted token was still cached"
        );
    }

    #[tokio::test]
    async fn answers_expire_by_the_injected_clock() {
        let stand = Arc::new(Stand::default());
        let now = Arc::new(Mutex::new(Instant::now()));
        let clock = now.clone();
        let g =
            gate(stand.clone(), LoopbackCallers::Pod).with_clock(Arc::new(move || *clock.lock().unwrap()));
        let any = |a| origin(Some(a), "10.0.0.7:5000", "0.0.0.0:7070");
        g.authenticate(any("Bearer good-mailer")).await.unwrap();
        *now.lock().unwrap() += ALLOW_TTL - Duration::from_millis(1);
        g.authenticate(any("Bearer good-mailer")).await.unwrap();
        assert_eq!(stand.token_reviews.load(Ordering::SeqCst), 1);
        *now.lock().unwrap() += Duration::from_millis(1);
        g.authenticate(any("Bearer good-mailer")).await.unwrap();
        assert_eq!(stand.token_reviews.load(Ordering::SeqCst), 2);
    }

    /// Reviews that wait to be released; counts how many started and ran at once. Tokens `good-<name>`
    /// are ServiceAccount `<name>` of `shop`; every access is allowed.
    struct Slow {
        started: AtomicUsize,
        running: AtomicUsize,
        most: AtomicUsize,
        release: tokio::sync::Semaphore,
    }

    impl Default for Slow {
        fn default() -> Self {
            Self {
                started: AtomicUsize::new(0),
                running: AtomicUsize::new(0),
                most: AtomicUsize::new(0),
                release: tokio::sync::Semaphore::new(0),
            }
        }
    }

    impl Slow {
        async fn run(&self) {
            self.started.fetch_add(1, Ordering::SeqCst);
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            self.release.acquire().await.unwrap().forget();
            self.running.fetch_sub(1, Ordering::SeqCst);
        }
    }

    impl Reviews for Slow {
        fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<TokenAnswer, Unavailable>> {
            Box::pin(async move {
                self.run().await;
                let sa = token.strip_prefix("good-").unwrap_or("nobody");
                Ok(TokenAnswer::Valid(User::service_account("shop", sa)))
            })
        }
        fn review_access<'a>(
            &'a self,
            _: &'a User,
            _: &'a str,
            _: &'a Access,
        ) -> BoxFuture<'a, Result<Decision, Unavailable>> {
            Box::pin(async move {
                self.run().await;
                Ok(Decision {
                    allowed: true,
                    reason: String::new(),
                })
            })
        }
    }

    /// Yields until `cond` holds, failing after a deadline.
    async fn until(what: &str, cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn identical_reviews_in_flight_are_asked_once() {
        let slow = Arc::new(Slow::default());
        let g = Authenticator::new(slow.clone(), "shop", None, LoopbackCallers::Token);
        let callers =
            (0..20).map(|_| g.authenticate(origin(Some("Bearer good-web"), "10.0.0.7:1", "0.0.0.0:7070")));
        let web = User::service_account("shop", "web");
        let emails = Access::jobs("get", "emails");
        let deciders = (0..20).map(|_| g.decide(&web, &emails));
        let (users, decisions, ()) = tokio::join!(
            futures::future::join_all(callers),
            futures::future::join_all(deciders),
            async {
                until("both reviews to start", || {
                    slow.started.load(Ordering::SeqCst) == 2
                })
                .await;
                slow.release.add_permits(100);
            }
        );
        assert!(
            users
                .iter()
                .all(|u| u.as_ref().is_ok_and(|u| u.name.ends_with(":web")))
        );
        assert!(decisions.iter().all(|d| d.as_ref().is_ok_and(|d| d.allowed)));
        assert_eq!(
            slow.started.load(Ordering::SeqCst),
            2,
            "one TokenReview, one SubjectAccessReview"
        );
        assert_eq!((g.token_flights.len(), g.decision_flights.len()), (0, 0));
    }

    #[tokio::test]
    async fn a_review_whose_callers_went_away_still_finishes_and_frees_its_place() {
        let slow = Arc::new(Slow::default());
        let g = Authenticator::new(slow.clone(), "shop", None, LoopbackCallers::Token)
            .with_review_limit(1, Duration::ZERO);
        let gone = g.authenticate(origin(Some("Bearer good-gone"), "10.0.0.7:1", "0.0.0.0:7070"));
        assert!(gone.now_or_never().is_none(), "the review waits to be released");
        until("the abandoned review to start", || {
            slow.started.load(Ordering::SeqCst) == 1
        })
        .await;
        slow.release.add_permits(100);
        until("the abandoned review to finish", || g.token_flights.len() == 0).await;
        let user = g
            .authenticate(origin(Some("Bearer good-next"), "10.0.0.7:1", "0.0.0.0:7070"))
            .await
            .unwrap();
        assert!(user.name.ends_with(":next"));
    }

    #[tokio::test]
    async fn reviews_in_flight_are_bounded_and_a_caller_that_cannot_start_one_gets_503() {
        let slow = Arc::new(Slow::default());
        let g = Authenticator::new(slow.clone(), "shop", None, LoopbackCallers::Token)
            .with_review_limit(2, Duration::ZERO);
        let refused = AtomicUsize::new(0);
        let callers = (0..3).map(|i| {
            let g = &g;
            let refused = &refused;
            async move {
                let token = format!("Bearer good-{i}");
                let r = g
                    .authenticate(origin(Some(&token), "10.0.0.7:1", "0.0.0.0:7070"))
                    .await;
                if r.is_err() {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
                r
            }
        });
        let (answers, ()) = tokio::join!(futures::future::join_all(callers), async {
            until("two reviews and one refusal", || {
                slow.started.load(Ordering::SeqCst) == 2 && refused.load(Ordering::SeqCst) == 1
            })
            .await;
            slow.release.add_permits(100);
        });
        let unavailable: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
        assert_eq!(unavailable.len(), 1);
        assert_eq!(unavailable[0].status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(
            unavailable[0].message().contains("too many reviews"),
            "{unavailable:?}"
        );
        assert_eq!(slow.most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn the_queue_list_runs_a_few_reviews_at_once_not_one_per_queue_unbounded() {
        let slow = Arc::new(Slow::default());
        let g = Authenticator::new(slow.clone(), "shop", None, LoopbackCallers::Token);
        let web = User::service_account("shop", "web");
        let accesses = (0..20).map(|i| Access::jobs("get", format!("q{i}"))).collect();
        let (decisions, ()) = tokio::join!(g.decide_all(&web, accesses), async {
            until("a full batch of reviews", || {
                slow.running.load(Ordering::SeqCst) == LIST_REVIEW_CONCURRENCY
            })
            .await;
            slow.release.add_permits(100);
        });
        assert_eq!(decisions.unwrap().len(), 20);
        assert_eq!(slow.started.load(Ordering::SeqCst), 20);
        assert_eq!(slow.most.load(Ordering::SeqCst), LIST_REVIEW_CONCURRENCY);
    }

    #[test]
    fn a_token_review_is_valid_only_when_authenticated_for_the_sluice_audience() {
        let ok = json!({"authenticated": true, "audiences": ["sluice"],
            "user": {"username": "system:serviceaccount:shop:web", "uid": "u1",
                     "groups": ["system:serviceaccounts"], "extra": {"authentication.kubernetes.io/pod-name": ["web-1"]}}});
        let TokenAnswer::Valid(user) = token_answer(&ok) else {
            panic!("valid")
        };
        assert_eq!(user.uid, "u1");
        assert_eq!(user.extra["authentication.kubernetes.io/pod-name"], vec!["web-1"]);
        let wrong =
            json!({"authenticated": true, "audiences": ["https://kubernetes.default.svc"], "user": {}});
        assert!(matches!(token_answer(&wrong), TokenAnswer::Invalid(m) if m.contains("audiences")));
        let unnamed = json!({"authenticated": true, "user": {"username": "system:serviceaccount:a:b"}});
        assert!(matches!(token_answer(&unnamed), TokenAnswer::Invalid(m) if m.contains("audiences")));
        let bad = json!({"authenticated": false, "error": "[invalid bearer token, token audiences [\"api\"] is invalid for the target audiences [\"sluice\"]]"});
        assert!(matches!(token_answer(&bad), TokenAnswer::Invalid(m) if m.contains("invalid bearer token")));
    }
}
