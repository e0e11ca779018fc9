//! The queue HTTP API with callers checked (`queue.api.auth.mode: kubernetes`), over real HTTP and a
//! real PostgreSQL, with a stand-in for the API server's reviews: who gets 401 and 403, with which JSON
//! body, and that what they asked for did not happen. The reviews themselves against a real
//! kube-apiserver are in `e2e/tests/real_control_plane.rs`.

mod queue_support;

use std::{collections::BTreeSet, sync::Arc};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use queue_support::*;
use serde_json::{Value, json};
use sluice_crds::sidecar_config::LoopbackCallers;
use sluice_sidecar::queue::{
    QueueStore, api,
    auth::{Access, Authenticator, Decision, Reviews, TokenAnswer, Unavailable, User},
};
use tokio_util::sync::CancellationToken;

/// Token `t-<name>` is ServiceAccount `<name>` of `shop`; `(name, verb, subresource, queue)` in `grants`
/// is allowed.
struct Rbac {
    grants: BTreeSet<(String, String, String, String)>,
}

impl Rbac {
    fn new(grants: &[(&str, &str, &str, &str)]) -> Arc<Self> {
        Arc::new(Self {
            grants: grants
                .iter()
                .map(|(a, b, c, d)| ((*a).into(), (*b).into(), (*c).into(), (*d).into()))
                .collect(),
        })
    }
}

impl Reviews for Rbac {
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<TokenAnswer, Unavailable>> {
        Box::pin(async move {
            if token == "unreachable" {
                return Err(Unavailable(
                    "connect to 10.96.0.1:443: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt".into(),
                ));
            }
            Ok(match token.strip_prefix("t-") {
                Some(sa) => TokenAnswer::Valid(User::service_account("shop", sa)),
                None => TokenAnswer::Invalid("invalid bearer token".into()),
            })
        })
    }
    fn review_access<'a>(
        &'a self,
        user: &'a User,
        namespace: &'a str,
        access: &'a Access,
    ) -> BoxFuture<'a, Result<Decision, Unavailable>> {
        Box::pin(async move {
            assert_eq!(namespace, "shop");
            let sa = user.name.rsplit(':').next().unwrap_or_default().to_owned();
            let key = (
                sa,
                access.verb.to_owned(),
                access.subresource.to_owned(),
                access.queue.clone(),
            );
            Ok(Decision {
                allowed: self.grants.contains(&key),
                reason: String::new(),
            })
        })
    }
}

struct Api {
    base: String,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    stop: CancellationToken,
}

impl Api {
    async fn serve(state: api::ApiState) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(api::serve(listener, state, async move { s.cancelled().await }));
        Self {
            base,
            client: Client::builder(TokioExecutor::new()).build_http(),
            stop,
        }
    }

    /// `method path` with `token` (if any); status, `WWW-Authenticate` and JSON body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Value,
    ) -> (StatusCode, Option<String>, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let body = if body.is_null() {
            Bytes::new()
        } else {
            Bytes::from(body.to_string())
        };
        let resp = self
            .client
            .request(req.body(Full::new(body)).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            challenge,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn job_count(store: &QueueStore) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM sluice.jobs")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

fn job() -> Value {
    json!({"kind": "welcome", "payload": {"to": "a"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_without_a_valid_token_or_the_right_get_401_or_403_and_change_nothing() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "emails").await;
    queue(&store, "reports").await;
    let rbac = Rbac::new(&[
        // The pod's own ServiceAccount enqueues and reads emails.
        ("web", "create", "jobs", "emails"),
        ("web", "get", "jobs", "emails"),
        // A reader lists and reads emails, and may do nothing else.
        ("reader", "list", "jobs", "emails"),
        ("reader", "get", "jobs", "emails"),
        // An operator of reports changes its settings.
        ("ops", "update", "settings", "reports"),
        ("ops", "get", "jobs", "reports"),
    ]);
    let gate = Authenticator::new(rbac.clone(), "shop", Some("web"), LoopbackCallers::Pod);
    let api = Api::serve(api::ApiState::new(store.clone()).with_auth(Arc::new(gate))).await;

    // The pod itself, on loopback without a token: allowed what its ServiceAccount is.
    let (status, _, created) = api
        .call(Method::POST, "/v1/queues/emails/jobs", None, job())
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let (status, _, body) = api
        .call(Method::POST, "/v1/queues/reports/jobs", None, job())
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["error"]["code"], "forbidden");
    assert_eq!(
        body["error"]["message"],
        "system:serviceaccount:shop:web may not create jobqueues/jobs of JobQueue \"reports\" in \
         namespace \"shop\" (group sluice.dev): grant it with a Role and RoleBinding in namespace \"shop\""
    );

    // An API server that cannot be asked: 503, and the details stay in the sidecar's log.
    let (status, _, body) = api
        .call(Method::POST, "/v1/queues/emails/jobs", Some("unreachable"), job())
        .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["error"]["code"], "auth_unavailable");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("could not ask the Kubernetes API server") && !message.contains("/var/run"),
        "{message}"
    );

    // A token the API server does not accept: 401 with a Bearer challenge, naming why.
    let (status, challenge, body) = api
        .call(Method::POST, "/v1/queues/emails/jobs", Some("forged"), job())
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(challenge.as_deref(), Some("Bearer"));
    assert_eq!(body["error"]["code"], "unauthenticated");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("invalid bearer token") && message.contains("\"sluice\""),
        "{message}"
    );
    assert!(
        !message.contains("forged"),
        "the token is never echoed: {message}"
    );

    // The reader: reads, but may neither enqueue, nor cancel, nor pause.
    let reader = Some("t-reader");
    let (status, _, _) = api
        .call(Method::GET, "/v1/queues/emails/jobs", reader, Value::Null)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, got) = api
        .call(Method::GET, &format!("/v1/jobs/{id}"), reader, Value::Null)
        .await;
    assert_eq!((status, got["id"].as_str()), (StatusCode::OK, Some(id.as_str())));
    for (method, path, what) in [
        (
            Method::POST,
            "/v1/queues/emails/jobs".to_owned(),
            "create jobqueues/jobs",
        ),
        (
            Method::POST,
            "/v1/queues/emails/jobs/batch".to_owned(),
            "create jobqueues/jobs",
        ),
        (
            Method::POST,
            format!("/v1/jobs/{id}/cancel"),
            "update jobqueues/jobs",
        ),
        (
            Method::POST,
            "/v1/queues/emails/pause".to_owned(),
            "update jobqueues/settings",
        ),
        (
            Method::PUT,
            "/v1/queues/emails".to_owned(),
            "update jobqueues/settings",
        ),
        (
            Method::GET,
            "/v1/queues/reports/jobs".to_owned(),
            "list jobqueues/jobs",
        ),
    ] {
        let body = if method == Method::POST && path.ends_with("batch") {
            json!({"jobs": [job()]})
        } else if method == Method::GET {
            Value::Null
        } else {
            job()
        };
        let (status, _, refused) = api.call(method.clone(), &path, reader, body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {path}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains(what), "{method} {path}: {message}");
    }
    assert_eq!(job_count(&store).await, 1, "nothing was enqueued");
    let (_, _, still) = api
        .call(Method::GET, &format!("/v1/jobs/{id}"), reader, Value::Null)
        .await;
    assert_eq!(still["state"], "pending", "not cancelled");

    // The queue list shows the queues the caller may read.
    let names = |body: &Value| -> Vec<String> {
        body["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["queue"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, _, list) = api.call(Method::GET, "/v1/queues", reader, Value::Null).await;
    assert_eq!(names(&list), ["emails"]);
    let (_, _, list) = api
        .call(Method::GET, "/v1/queues", Some("t-ops"), Value::Null)
        .await;
    assert_eq!(names(&list), ["reports"]);
    let (status, _, paused) = api
        .call(
            Method::POST,
            "/v1/queues/reports/pause",
            Some("t-ops"),
            Value::Null,
        )
        .await;
    assert_eq!((status, &paused["paused"]), (StatusCode::OK, &json!(true)));

    // The OpenAPI document is public.
    let (status, _, doc) = api.call(Method::GET, "/openapi.json", None, Value::Null).await;
    assert_eq!((status, doc["openapi"].as_str()), (StatusCode::OK, Some("3.1.0")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_loopback_token_even_the_pods_own_loopback_needs_a_token() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "emails").await;
    let rbac = Rbac::new(&[("web", "create", "jobs", "emails")]);
    let gate = Authenticator::new(rbac, "shop", Some("web"), LoopbackCallers::Token);
    let api = Api::serve(api::ApiState::new(store.clone()).with_auth(Arc::new(gate))).await;
    let (status, _, body) = api
        .call(Method::POST, "/v1/queues/emails/jobs", None, job())
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("no token"), "{message}");
    assert!(message.contains("SLUICE_QUEUE_API_TOKEN_FILE"), "{message}");
    assert_eq!(job_count(&store).await, 0);
    let (status, _, _) = api
        .call(Method::POST, "/v1/queues/emails/jobs", Some("t-web"), job())
        .await;
    assert_eq!(status, StatusCode::CREATED);
}

#[test]
fn a_sidecar_asked_to_check_callers_without_in_cluster_credentials_does_not_start_and_says_why() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .env_clear()
        .envs([
            ("SLUICE_LISTEN", "127.0.0.1:0"),
            ("SLUICE_ADMIN_LISTEN", "127.0.0.2:0"),
            ("RATE_LIMIT__ENABLED", "false"),
            // Never dialled: the pool connects lazily.
            ("SLUICE_DATABASE_URL", "postgres://sluice@127.0.0.1:1/sluice"),
            ("SLUICE_QUEUES", "emails"),
            ("SLUICE_API_LISTEN", "127.0.0.1:0"),
            ("SLUICE_API_AUTH", "kubernetes"),
            ("SLUICE_POD_NAMESPACE", "shop"),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("queue.api.auth: KUBERNETES_SERVICE_HOST is not set"),
        "{stderr}"
    );
}

#[test]
fn the_service_account_credentials_are_read_where_sluice_service_account_dir_says() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-sidecar"))
        .env_clear()
        .envs([
            ("SLUICE_LISTEN", "127.0.0.1:0"),
            ("SLUICE_ADMIN_LISTEN", "127.0.0.2:0"),
            ("RATE_LIMIT__ENABLED", "false"),
            ("SLUICE_DATABASE_URL", "postgres://sluice@127.0.0.1:1/sluice"),
            ("SLUICE_QUEUES", "emails"),
            ("SLUICE_API_LISTEN", "127.0.0.1:0"),
            ("SLUICE_API_AUTH", "kubernetes"),
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1"),
            ("KUBERNETES_SERVICE_PORT", "6443"),
        ])
        .env("SLUICE_SERVICE_ACCOUNT_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The namespace is read from that directory's `namespace` file, which is missing there.
    assert!(
        stderr.contains(&format!("{}/namespace", dir.path().display())),
        "{stderr}"
    );
}

/// Token `t-web` is ServiceAccount `web` of `shop` while `token_valid`; it may do anything while
/// `allowed`.
struct Revocable {
    token_valid: std::sync::atomic::AtomicBool,
    allowed: std::sync::atomic::AtomicBool,
}

impl Reviews for Revocable {
    fn review_token<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<TokenAnswer, Unavailable>> {
        Box::pin(async move {
            Ok(if token == "t-web" && self.token_valid.load(SeqCst) {
                TokenAnswer::Valid(User::service_account("shop", "web"))
            } else {
                TokenAnswer::Invalid("token has expired".into())
            })
        })
    }
    fn review_access<'a>(
        &'a self,
        _: &'a User,
        _: &'a str,
        _: &'a Access,
    ) -> BoxFuture<'a, Result<Decision, Unavailable>> {
        Box::pin(async move {
            Ok(Decision {
                allowed: self.allowed.load(SeqCst),
                reason: String::new(),
            })
        })
    }
}

use std::sync::atomic::Ordering::SeqCst;

/// Opens `path` as `t-web` on an API whose gatekeeper's clock is moved by hand and which rechecks
/// streams often; revokes with `revoke` and moves the clock past the cached answers; the stream must
/// then end with `event: error` carrying `code`.
async fn a_stream_ends_once(path: &str, revoke: impl FnOnce(&Revocable), code: &str) {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "emails").await;
    let reviews = Arc::new(Revocable {
        token_valid: true.into(),
        allowed: true.into(),
    });
    let now = Arc::new(std::sync::Mutex::new(std::time::Instant::now()));
    let clock = now.clone();
    let gate = Authenticator::new(reviews.clone(), "shop", None, LoopbackCallers::Token)
        .with_clock(Arc::new(move || *clock.lock().unwrap()))
        .with_recheck_every(std::time::Duration::from_millis(20));
    let api = Api::serve(api::ApiState::new(store.clone()).with_auth(Arc::new(gate))).await;
    let path = if path.contains("{id}") {
        let (status, _, created) = api
            .call(Method::POST, "/v1/queues/emails/jobs", Some("t-web"), job())
            .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        path.replace("{id}", created["id"].as_str().unwrap())
    } else {
        path.to_owned()
    };
    let req = Request::get(format!("{}{path}", api.base))
        .header("authorization", "Bearer t-web")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = api.client.request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    // The first event is read while still allowed, so the stream is open and rechecked.
    let mut seen = String::new();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !seen.contains("data:") {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("a first event")
            .unwrap()
            .unwrap();
        if let Ok(data) = frame.into_data() {
            seen.push_str(&String::from_utf8_lossy(&data));
        }
    }
    revoke(&reviews);
    *now.lock().unwrap() += sluice_sidecar::queue::auth::ALLOW_TTL;
    let rest = tokio::time::timeout_at(deadline, body.collect())
        .await
        .expect("the stream ends once the caller is refused")
        .unwrap()
        .to_bytes();
    seen.push_str(&String::from_utf8_lossy(&rest));
    let last = seen.trim_end().rsplit("\n\n").next().unwrap();
    assert!(last.starts_with("event: error\n"), "{seen}");
    assert!(last.contains(&format!("\"code\":\"{code}\"")), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_stream_ends_when_the_callers_right_is_revoked() {
    a_stream_ends_once(
        "/v1/queues/emails/events",
        |r| r.allowed.store(false, SeqCst),
        "forbidden",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_stream_ends_when_the_callers_token_expires() {
    a_stream_ends_once(
        "/v1/queues/emails/jobs/{id}/events",
        |r| r.token_valid.store(false, SeqCst),
        "unauthenticated",
    )
    .await;
}

// A caller may tie its job only to jobs of queues whose jobs it may read, and sees only those parents:
// an id from another queue is answered as an unknown one (nothing is locked or linked), and a parent
// another way put there (SQL, a caller with more rights) is left out of what it is shown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_in_queues_the_caller_may_not_read_are_refused_and_not_shown() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "emails").await;
    queue(&store, "billing").await;
    let rbac = Rbac::new(&[
        ("web", "create", "jobs", "emails"),
        ("web", "get", "jobs", "emails"),
        ("billing", "create", "jobs", "emails"),
        ("billing", "get", "jobs", "emails"),
        ("billing", "get", "jobs", "billing"),
    ]);
    let gate = Authenticator::new(rbac.clone(), "shop", None, LoopbackCallers::Pod);
    let api = Api::serve(api::ApiState::new(store.clone()).with_auth(Arc::new(gate))).await;
    let invoice = store
        .enqueue("billing", &sluice_queue::NewJob::new("invoice", json!({})))
        .await
        .unwrap()
        .id;
    let child = |token| {
        let api = &api;
        async move {
            let body = json!({"kind": "receipt", "payload": {}, "dependsOn": [invoice]});
            api.call(Method::POST, "/v1/queues/emails/jobs", Some(token), body)
                .await
        }
    };

    let (status, _, body) = child("t-web").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["message"].as_str(),
        Some(format!("depends_on: job {invoice} does not exist").as_str()),
        "answered as an unknown id: {body}"
    );
    let linked: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.job_dependencies")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(linked, 0, "nothing was linked to the invoice");
    // Nor can it tell the invoice from a job that does not exist: the first unknown or hidden id of the
    // request is named, whichever it is.
    let nil = uuid::Uuid::nil();
    for second in [invoice, uuid::Uuid::now_v7()] {
        let body = json!({"kind": "receipt", "payload": {}, "dependsOn": [nil, second]});
        let (status, _, answer) = api
            .call(Method::POST, "/v1/queues/emails/jobs", Some("t-web"), body)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(
            answer["error"]["message"].as_str(),
            Some(format!("depends_on: job {nil} does not exist").as_str()),
            "{answer}"
        );
    }

    // The billing ServiceAccount may read billing's jobs: its child is made, and shows its parent.
    let (status, _, made) = child("t-billing").await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(made["parents"][0]["id"], json!(invoice), "{made}");
    // The web ServiceAccount reads that child (an emails job) without learning of the invoice.
    let path = format!("/v1/jobs/{}", made["id"].as_str().unwrap());
    let (status, _, seen) = api.call(Method::GET, &path, Some("t-web"), Value::Null).await;
    assert_eq!(status, StatusCode::OK, "{seen}");
    assert_eq!(seen["parents"], json!([]), "{seen}");
    let (_, _, seen) = api.call(Method::GET, &path, Some("t-billing"), Value::Null).await;
    assert_eq!(seen["parents"][0]["id"], json!(invoice), "{seen}");
}
