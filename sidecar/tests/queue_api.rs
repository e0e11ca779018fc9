//! The queue HTTP API: the happy paths, and every bad input answered with a JSON error that changes
//! nothing.

mod queue_support;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use queue_support::*;
use serde_json::{Value, json};
use sluice_sidecar::queue::{QueueStore, api, role};
use sluice_testsupport::wait_for_async;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

struct Api {
    base: String,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    stop: CancellationToken,
}

impl Api {
    async fn start(store: QueueStore, max_batch: usize) -> Self {
        Self::serve(api::ApiState {
            max_batch,
            ..api::ApiState::new(store)
        })
        .await
    }

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

    async fn call(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let (status, _, json) = self.call_seeing_headers(method, path, headers, body).await;
        (status, json)
    }

    /// [`Api::call`], with the answer's headers.
    async fn call_seeing_headers(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, http::HeaderMap, Value) {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = self
            .client
            .request(req.body(Full::new(Bytes::from(body))).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let answer_headers = resp.headers().clone();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, answer_headers, json)
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, &[], body.to_string().into_bytes())
            .await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, &[], Vec::new()).await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_json_error_and_changes_nothing() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "emails").await;
    let api = Api::start(store.clone(), 10).await;
    let keyed = |body: &Value| {
        (
            [("idempotency-key", "k-1"), ("content-type", "application/json")],
            body.to_string().into_bytes(),
        )
    };
    let (h, b) = keyed(&json!({"kind": "welcome", "payload": {"to": "a"}}));
    let (status, _) = api.call(Method::POST, "/v1/queues/emails/jobs", &h, b).await;
    assert_eq!(status, StatusCode::CREATED);
    let before = job_count(&store).await;

    // (what, expected status, body, headers, path)
    type Case<'a> = (&'a str, StatusCode, Vec<u8>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            "invalid JSON",
            StatusCode::BAD_REQUEST,
            b"{not json".to_vec(),
            vec![],
            "/v1/queues/emails/jobs",
        ),
        (
            "missing payload",
            StatusCode::BAD_REQUEST,
            br#"{"kind":"x"}"#.to_vec(),
            vec![],
            "/v1/queues/emails/jobs",
        ),
        (
            "missing kind",
            StatusCode::BAD_REQUEST,
            br#"{"payload":{}}"#.to_vec(),
            vec![],
            "/v1/queues/emails/jobs",
        ),
        (
            "payload over 1 MiB",
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({"kind": "x", "payload": "a".repeat(1024 * 1024 + 10)})
                .to_string()
                .into_bytes(),
            vec![],
            "/v1/queues/emails/jobs",
        ),
        (
            "unknown queue",
            StatusCode::NOT_FOUND,
            br#"{"kind":"x","payload":{}}"#.to_vec(),
            vec![],
            "/v1/queues/nope/jobs",
        ),
        (
            "conflicting idempotency key",
            StatusCode::CONFLICT,
            br#"{"kind":"welcome","payload":{"to":"b"}}"#.to_vec(),
            vec![("idempotency-key", "k-1")],
            "/v1/queues/emails/jobs",
        ),
        (
            "batch over the limit",
            StatusCode::BAD_REQUEST,
            json!({"jobs": (0..11).map(|_| json!({"kind": "x", "payload": {}})).collect::<Vec<_>>()})
                .to_string()
                .into_bytes(),
            vec![],
            "/v1/queues/emails/jobs/batch",
        ),
        (
            "bad priority",
            StatusCode::BAD_REQUEST,
            br#"{"kind":"x","payload":{},"priority":5000}"#.to_vec(),
            vec![],
            "/v1/queues/emails/jobs",
        ),
    ];
    for (what, want, body, headers, path) in cases {
        let (status, err) = api.call(Method::POST, path, &headers, body).await;
        assert_eq!(status, want, "{what}: {err}");
        assert!(
            err["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {err}"
        );
        assert!(err["error"]["code"].is_string(), "{what}: {err}");
    }
    assert_eq!(job_count(&store).await, before, "no bad request stored anything");
    let (status, _) = api.get("/v1/jobs/not-a-uuid").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = api.get("/v1/queues/emails/jobs?state=bogus").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_enqueues_reads_lists_cancels_and_manages_queues() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    let api = Api::start(store.clone(), 100).await;

    let (status, q) = api
        .call(
            Method::PUT,
            "/v1/queues/reports",
            &[],
            br#"{"maxAttempts":5,"leaseDuration":"10s"}"#.to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{q}");
    assert_eq!(q["leaseMs"], 10_000);
    let (status, _) = api
        .call(Method::PUT, "/v1/queues/reports", &[], b"{}".to_vec())
        .await;
    assert_eq!(status, StatusCode::OK);

    let body = br#"{"kind":"pdf","payload":{"id":1},"priority":5,"delayMs":3600000}"#.to_vec();
    let (status, job) = api
        .call(
            Method::POST,
            "/v1/queues/reports/jobs",
            &[("idempotency-key", "r1")],
            body.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (job["state"].as_str(), job["priority"].as_i64()),
        (Some("pending"), Some(5))
    );
    let (status, again) = api
        .call(
            Method::POST,
            "/v1/queues/reports/jobs",
            &[("idempotency-key", "r1")],
            body,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "a repeated key returns the original job");
    assert_eq!(again["id"], job["id"]);

    let (status, batch) = api
        .post(
            "/v1/queues/reports/jobs/batch",
            json!({"jobs": [{"kind": "a", "payload": 1}, {"kind": "b", "payload": 2}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(batch["ids"].as_array().unwrap().len(), 2);

    let id = job["id"].as_str().unwrap();
    let (status, got) = api.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!((status, got["kind"].as_str()), (StatusCode::OK, Some("pdf")));
    let (_, page1) = api.get("/v1/queues/reports/jobs?limit=2").await;
    assert_eq!(page1["jobs"].as_array().unwrap().len(), 2);
    let next = page1["next"].as_str().unwrap();
    let (_, page2) = api
        .get(&format!("/v1/queues/reports/jobs?limit=2&after={next}"))
        .await;
    assert_eq!(page2["jobs"].as_array().unwrap().len(), 1);
    let (_, pending) = api.get("/v1/queues/reports/jobs?state=pending").await;
    assert_eq!(pending["jobs"].as_array().unwrap().len(), 3);

    let (status, stats) = api.get("/v1/queues/reports/stats").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (stats["ready"].as_i64(), stats["scheduled"].as_i64()),
        (Some(2), Some(1))
    );
    let (status, paused) = api.post("/v1/queues/reports/pause", json!({})).await;
    assert_eq!((status, paused["paused"].as_bool()), (StatusCode::OK, Some(true)));
    assert!(
        store
            .claim_batch("reports", "w", 10, std::time::Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty()
    );
    let (_, resumed) = api.post("/v1/queues/reports/resume", json!({})).await;
    assert_eq!(resumed["paused"].as_bool(), Some(false));
    let (status, _) = api.post("/v1/queues/nope/pause", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, c) = api.post(&format!("/v1/jobs/{id}/cancel"), json!({})).await;
    assert_eq!(
        (status, c["outcome"].as_str()),
        (StatusCode::OK, Some("cancelled"))
    );
    let (status, _) = api.post(&format!("/v1/jobs/{id}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "a finished job cannot be cancelled");
    let (status, _) = api.post(&format!("/v1/jobs/{id}/retry"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "only dead jobs can be retried");

    let (status, doc) = api.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["paths"]["/v1/queues/{queue}/jobs"]["post"].is_object());
    assert!(doc["paths"]["/v1/queues/{queue}/jobs/{id}/events"]["get"].is_object());
    assert!(doc["paths"]["/v1/queues/{queue}/events"]["get"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_given_queues_serves_only_those() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "emails").await;
    queue(&store, "billing").await;
    let elsewhere = store
        .enqueue(
            "billing",
            &serde_json::from_value(json!({"kind": "charge", "payload": {}})).unwrap(),
        )
        .await
        .unwrap()
        .id;
    let api = Api::serve(api::ApiState::new(store.clone()).serving(&["emails".to_owned()])).await;

    let (status, welcome) = api
        .post(
            "/v1/queues/emails/jobs",
            json!({"kind": "welcome", "payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, err) = api
        .post(
            "/v1/queues/billing/jobs",
            json!({"kind": "charge", "payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{err}");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"billing\"") && message.contains("emails"),
        "{message}"
    );
    for path in ["/v1/queues/billing/stats", "/v1/queues/billing/jobs"] {
        assert_eq!(api.get(path).await.0, StatusCode::FORBIDDEN, "{path}");
    }
    assert_eq!(
        api.post("/v1/queues/billing/pause", json!({})).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        api.get(&format!("/v1/jobs/{elsewhere}")).await.0,
        StatusCode::NOT_FOUND,
        "a job in another queue reads as unknown"
    );
    let (status, _) = api.post(&format!("/v1/jobs/{elsewhere}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let unknown = format!("depends_on: job {elsewhere} does not exist");
    let (status, err) = api
        .post(
            "/v1/queues/emails/jobs",
            json!({"kind": "receipt", "payload": {}, "dependsOn": [elsewhere]}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some(unknown.as_str())),
        "a parent in another queue reads as unknown: {err}"
    );
    // Several parents, checked in one query: a served one passes, the one elsewhere is named as unknown.
    let (status, err) = api
        .post(
            "/v1/queues/emails/jobs",
            json!({"kind": "receipt", "payload": {}, "dependsOn": [welcome["id"], elsewhere]}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some(unknown.as_str())),
        "{err}"
    );
    let (status, err) = api
        .post(
            "/v1/queues/emails/jobs/graph",
            json!({"jobs": [
                {"ref": "a", "kind": "render", "payload": {}},
                {"ref": "b", "kind": "send", "payload": {}, "dependsOn": ["a", elsewhere]}
            ]}),
        )
        .await;
    assert_eq!(
        (status, err["error"]["message"].as_str()),
        (StatusCode::BAD_REQUEST, Some(unknown.as_str())),
        "{err}"
    );
    let (_, list) = api.get("/v1/queues").await;
    let names: Vec<&str> = list["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["emails"]);
    assert_eq!(job_count(&store).await, 2, "only the allowed enqueue landed");
    let billing = store.get(elsewhere).await.unwrap().unwrap();
    assert_eq!(billing.state, "pending", "the refused cancel changed nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_keys_answer_201_for_a_new_job_and_200_for_the_holder() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "search").await;
    let api = Api::start(store.clone(), 10).await;

    let (status, first) = api
        .post(
            "/v1/queues/search/jobs",
            json!({"kind": "reindex", "payload": {"v": 1}, "uniqueKey": "doc-42", "uniqueFor": "1h"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(
        (first["uniqueKey"].clone(), first["uniqueForMs"].clone()),
        (json!("doc-42"), json!(3_600_000))
    );

    let (status, same) = api
        .post(
            "/v1/queues/search/jobs",
            json!({"kind": "reindex", "payload": {"v": 2}, "uniqueKey": "doc-42"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "preserve: the holder");
    assert_eq!(
        (same["id"].clone(), same["payload"].clone()),
        (first["id"].clone(), json!({"v": 1}))
    );

    let (status, replaced) = api
        .post(
            "/v1/queues/search/jobs",
            json!({"kind": "reindex", "payload": {"v": 3}, "uniqueKey": "doc-42", "debounce": "10m"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "debounce: the holder, updated");
    assert_eq!(
        (replaced["id"].clone(), replaced["payload"].clone()),
        (first["id"].clone(), json!({"v": 3}))
    );
    assert_eq!(job_count(&store).await, 1);

    for (body, want) in [
        (
            json!({"kind": "k", "payload": {}, "uniqueMode": "replace"}),
            "need a uniqueKey",
        ),
        (
            json!({"kind": "k", "payload": {}, "uniqueKey": "x", "uniqueMode": "sometimes"}),
            "`sometimes`",
        ),
        (
            json!({"kind": "k", "payload": {}, "uniqueKey": "x", "uniqueFor": "soon"}),
            "not a duration",
        ),
    ] {
        let (status, err) = api.post("/v1/queues/search/jobs", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
        let message = err["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(want), "{message:?} should say {want:?}");
    }
    assert_eq!(job_count(&store).await, 1);

    // An Idempotency-Key with a uniqueKey: the idempotency key answers the retry, the unique key decides
    // a new request; a job with parents keeps them.
    let keyed = |key: &'static str, body: Value| {
        let api = &api;
        async move {
            api.call(
                Method::POST,
                "/v1/queues/search/jobs",
                &[("idempotency-key", key)],
                body.to_string().into_bytes(),
            )
            .await
        }
    };
    let body = json!({"kind": "k", "payload": {}, "uniqueKey": "x", "dependsOn": [first["id"]]});
    let (status, made) = keyed("i-1", body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    assert_eq!(
        (made["state"].clone(), made["parents"][0]["id"].clone()),
        (json!("blocked"), first["id"].clone())
    );
    let (status, retry) = keyed("i-1", body).await;
    assert_eq!(
        (status, retry["id"].clone()),
        (StatusCode::OK, made["id"].clone())
    );
    let (status, err) = keyed(
        "i-1",
        json!({"kind": "k", "payload": {"other": 1}, "uniqueKey": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{err}");
    let (status, holder) = keyed("i-2", json!({"kind": "k", "payload": {"v": 2}, "uniqueKey": "x"})).await;
    assert_eq!(
        (status, holder["id"].clone()),
        (StatusCode::OK, made["id"].clone())
    );
    assert_eq!(job_count(&store).await, 2);

    // A batch takes keys: a held key answers with the holder's id.
    let (status, batch) = api
        .post(
            "/v1/queues/search/jobs/batch",
            json!({"jobs": [
                {"kind": "k", "payload": {}, "uniqueKey": "x"},
                {"kind": "k", "payload": {}, "uniqueKey": "y"},
                {"kind": "k", "payload": {}, "idempotencyKey": "i-3"},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{batch}");
    assert_eq!(batch["ids"][0], made["id"]);
    assert_eq!(job_count(&store).await, 4);
    // A graph too: a held key is the holder (created false), a new one is created.
    let (status, graph) = api
        .post(
            "/v1/queues/search/jobs/graph",
            json!({"jobs": [
                {"ref": "a", "kind": "k", "payload": {}, "uniqueKey": "y"},
                {"ref": "b", "kind": "k", "payload": {}, "uniqueKey": "z", "dependsOn": ["a"]},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{graph}");
    assert_eq!(
        (
            graph["jobs"][0]["id"].clone(),
            graph["jobs"][0]["created"].clone()
        ),
        (batch["ids"][1].clone(), json!(false))
    );
    assert_eq!(graph["jobs"][1]["created"], json!(true));
    assert_eq!(job_count(&store).await, 5);

    let (_, doc) = api.get("/openapi.json").await;
    let new_job = &doc["components"]["schemas"]["NewJob"]["properties"];
    assert!(new_job["idempotencyKey"].is_object());
    assert!(doc["components"]["schemas"]["GraphJob"]["properties"]["uniqueKey"].is_object());
    for field in ["uniqueKey", "uniqueMode", "uniqueFor", "debounce"] {
        assert!(new_job[field].is_object(), "the OpenAPI document lists {field}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graph_of_jobs_is_enqueued_by_ref_and_jobs_show_their_parents() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "books").await;
    let api = Api::start(store.clone(), 10).await;

    let (status, page) = api
        .post(
            "/v1/queues/books/jobs",
            json!({"kind": "render", "payload": {"page": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{page}");
    let page_id = page["id"].as_str().unwrap().to_owned();
    let (status, graph) = api
        .post(
            "/v1/queues/books/jobs/graph",
            json!({"jobs": [
                {"ref": "bind", "kind": "bind", "payload": {}, "dependsOn": ["cover", page_id]},
                {"ref": "cover", "kind": "render", "payload": {"page": 0}},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{graph}");
    assert_eq!(graph["jobs"][0]["ref"], "bind");
    let bind = graph["jobs"][0]["id"].as_str().unwrap().to_owned();

    let (status, job) = api.get(&format!("/v1/jobs/{bind}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (job["state"].clone(), job["blockedBy"].clone()),
        (json!("blocked"), json!(2))
    );
    let parents = job["parents"].as_array().unwrap();
    assert_eq!(parents.len(), 2);
    assert!(parents.iter().all(|p| p["state"] == "pending"), "{job}");
    let (_, depth) = api.get("/v1/queues/books").await;
    assert_eq!(
        (depth["ready"].clone(), depth["blocked"].clone()),
        (json!(2), json!(1))
    );

    // A job naming a parent directly.
    let (status, child) = api
        .post(
            "/v1/queues/books/jobs",
            json!({"kind": "ship", "payload": {}, "dependsOn": [bind], "onParentFailure": "run"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{child}");
    assert_eq!(child["parents"][0]["id"], json!(bind));
    assert_eq!(child["onParentFailure"], "run");

    let before = job_count(&store).await;
    let (status, err) = api
        .post(
            "/v1/queues/books/jobs/graph",
            json!({"jobs": [
                {"ref": "a", "kind": "k", "payload": {}, "dependsOn": ["b"]},
                {"ref": "b", "kind": "k", "payload": {}, "dependsOn": ["a"]},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert!(
        err["error"]["message"].as_str().unwrap().contains("cycle"),
        "{err}"
    );
    let (status, err) = api
        .post(
            "/v1/queues/books/jobs",
            json!({"kind": "k", "payload": {}, "dependsOn": ["0190aaaa-0000-7000-8000-000000000000"]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    // An id PostgreSQL would read but this API does not (hyphens partly left out) is refused by name,
    // not passed on unchecked.
    let (status, err) = api
        .post(
            "/v1/queues/books/jobs/graph",
            json!({"jobs": [
                {"ref": "a", "kind": "k", "payload": {}, "dependsOn": ["0190aaaa00007000-8000-000000000000"]},
            ]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("neither a ref of this graph nor a job id"),
        "{err}"
    );
    assert_eq!(job_count(&store).await, before, "nothing enqueued");

    let (_, doc) = api.get("/openapi.json").await;
    assert!(doc["paths"]["/v1/queues/{queue}/jobs/graph"]["post"].is_object());
    assert!(doc["components"]["schemas"]["NewJob"]["properties"]["dependsOn"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_in_a_namespace_names_its_queues_without_it_in_paths() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    queue(&store, "blog/emails").await;
    let api = Api::serve(
        api::ApiState::new(store.clone())
            .serving(&["shop/emails".to_owned()])
            .in_namespace(Some("shop")),
    )
    .await;

    let (status, job) = api
        .post(
            "/v1/queues/emails/jobs",
            json!({"kind": "welcome", "payload": {}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    assert_eq!(job["queue"], "shop/emails", "bodies show the database name");
    let (status, depth) = api.get("/v1/queues/emails").await;
    assert_eq!((status, depth["ready"].as_i64()), (StatusCode::OK, Some(1)));
    let (status, list) = api.get("/v1/queues/emails/jobs").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["jobs"].as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(
        api.post("/v1/queues/emails/pause", json!({})).await.0,
        StatusCode::OK
    );
    assert!(store.queue("shop/emails").await.unwrap().unwrap().paused);
    let (status, _) = api
        .call(
            Method::PUT,
            "/v1/queues/emails",
            &[],
            json!({"name": "emails", "maxAttempts": 4})
                .to_string()
                .into_bytes(),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(store.queue("shop/emails").await.unwrap().unwrap().max_attempts, 4);
    // The other namespace's queue of the same name is out of reach, by short name or full.
    let (status, _) = api.get("/v1/queues/blog%2Femails").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(store.depth("blog/emails").await.unwrap().unwrap().ready, 0);
    assert_eq!(store.depth("shop/emails").await.unwrap().unwrap().ready, 1);
    let (_, all) = api.get("/v1/queues").await;
    let names: Vec<_> = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["queue"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["shop/emails"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_in_a_namespace_without_a_queue_list_reaches_no_other_namespace() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "shop/emails").await;
    queue(&store, "blog/emails").await;
    let theirs = store
        .enqueue(
            "blog/emails",
            &serde_json::from_value(json!({"kind": "welcome", "payload": {}})).unwrap(),
        )
        .await
        .unwrap()
        .id;
    let api = Api::serve(api::ApiState::new(store.clone()).in_namespace(Some("shop"))).await;

    // A full name of another namespace, percent-encoded into one path segment: refused, nothing changed.
    for (method, path, body) in [
        (Method::GET, "/v1/queues/blog%2Femails", json!(null)),
        (
            Method::POST,
            "/v1/queues/blog%2Femails/jobs",
            json!({"kind": "k", "payload": {}}),
        ),
        (Method::POST, "/v1/queues/blog%2Femails/pause", json!({})),
    ] {
        let body = if body.is_null() {
            vec![]
        } else {
            body.to_string().into_bytes()
        };
        let (status, answer) = api.call(method, path, &[], body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {answer}");
        assert!(answer.to_string().contains("namespace"), "{answer}");
    }
    assert_eq!(store.depth("blog/emails").await.unwrap().unwrap().ready, 1);
    assert!(!store.queue("blog/emails").await.unwrap().unwrap().paused);
    // Their jobs read as unknown, and the queue list shows this namespace's queues only.
    assert_eq!(
        api.get(&format!("/v1/jobs/{theirs}")).await.0,
        StatusCode::NOT_FOUND
    );
    let (_, all) = api.get("/v1/queues").await;
    let names: Vec<_> = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["queue"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["shop/emails"]);
}

/// The API's answer deadline in the tests below.
const API_ANSWER: Duration = Duration::from_secs(1);
/// How long a request given up after [`API_ANSWER`] may take in all (room for a loaded machine); one
/// that waits on the silent database fails this.
const API_BOUND: Duration = Duration::from_secs(6);

/// An API over a store made as the sidecar makes it (`role::api_store`, `queue.api.answerDeadline` of
/// [`API_ANSWER`]) on `pool`.
async fn api_with_deadline(pool: sqlx::PgPool) -> Api {
    let mut cfg = sluice_crds::sidecar_config::QueueConfig::default();
    cfg.api.answer_deadline = API_ANSWER.into();
    Api::serve(api::ApiState::new(role::api_store(&cfg, pool))).await
}

/// `request` answered within [`API_BOUND`].
async fn within_bound<T>(what: &str, request: impl Future<Output = T>) -> T {
    tokio::time::timeout(API_BOUND, request)
        .await
        .unwrap_or_else(|_| panic!("{what} waited on the database past {API_BOUND:?}"))
}

// A database that stops answering under the API (its backends frozen: the sockets stay open and nothing
// answers, as a failover or a frozen backend leaves them) holds up no request: an enqueue is given up
// after the answer deadline and answered 503 with Retry-After, saying the job may or may not have been
// made and that a retry with the same Idempotency-Key is safe; a read too. Once the database answers
// again, retries with the key make exactly one job. The API's pool hands connections out unchecked
// (a check would catch a connection already silent while idle, within the acquire deadline, but not one
// that goes silent mid-statement), so the statements meet the frozen backends themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_database_does_not_answer_gets_503_and_a_keyed_retry_makes_one_job() {
    const CONNECTIONS: u32 = 3;
    const APP: &str = "sluice-api-silent-test";
    let (pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "emails").await;
    // No `min_connections`: the pool would open a fresh connection in place of one given up, and a
    // request could take that one instead of a frozen one.
    let api_pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(CONNECTIONS)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(
            pg.url()
                .parse::<sqlx::postgres::PgConnectOptions>()
                .unwrap()
                .application_name(APP),
        )
        .await
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..CONNECTIONS {
        held.push(api_pool.acquire().await.unwrap());
    }
    drop(held);
    let api = api_with_deadline(api_pool.clone()).await;
    let pids: Vec<i32> = wait_for_async("the API's pool to hold its connections", API_BOUND, || {
        let pool = pool.clone();
        async move {
            let pids: Vec<i32> =
                sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
                    .bind(APP)
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            (pids.len() == CONNECTIONS as usize).then_some(pids)
        }
    })
    .await;
    // The pool pings a connection it takes back: freezing before that ping is answered would leave
    // the connection stuck in the pool's hands, not in a request's.
    wait_for_async("the API's connections back in its pool", API_BOUND, || async {
        (api_pool.num_idle() == CONNECTIONS as usize).then_some(())
    })
    .await;
    let frozen = pg.freeze_backends(pids.into_iter().map(|p| p as u32));

    let body = json!({"kind": "welcome", "payload": {"to": "a"}}).to_string();
    let keyed = [
        ("idempotency-key", "signup-42"),
        ("content-type", "application/json"),
    ];
    let enqueue = || {
        api.call_seeing_headers(
            Method::POST,
            "/v1/queues/emails/jobs",
            &keyed,
            body.clone().into_bytes(),
        )
    };
    let (status, headers, answer) = within_bound("an enqueue", enqueue()).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(headers[http::header::RETRY_AFTER], "1");
    assert_eq!(answer["error"]["code"], "database_unanswered", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    for says in ["did not answer within", "may or may not", "Idempotency-Key"] {
        assert!(message.contains(says), "{says:?} not in {message}");
    }
    let (status, headers, answer) = within_bound(
        "a read",
        api.call_seeing_headers(Method::GET, "/v1/queues/emails", &[], vec![]),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(headers[http::header::RETRY_AFTER], "1");
    assert_eq!(answer["error"]["code"], "database_unanswered", "{answer}");

    drop(frozen);
    let (status, _, first) = within_bound("the first retry", enqueue()).await;
    assert!(
        status == StatusCode::CREATED || status == StatusCode::OK,
        "{status}: {first}"
    );
    let (status, _, again) = within_bound("the second retry", enqueue()).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(first["id"], again["id"]);
    assert_eq!(job_count(&store).await, 1, "one job for the key");
}

// An enqueue that the server is slow to carry out (here: waiting for a lock on the jobs table) is ended
// by the server itself within the API's answer deadline, so the request is answered 503 and the write
// cannot commit later, after the app has retried it: once the lock is let go, no job appeared and no
// backend waits to insert one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_the_server_is_slow_to_make_is_ended_by_the_server() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "emails").await;
    let api = api_with_deadline(pool.clone()).await;
    let mut lock = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE sluice.jobs IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .unwrap();

    let (status, headers, answer) = within_bound(
        "an enqueue waiting for a lock",
        api.call_seeing_headers(
            Method::POST,
            "/v1/queues/emails/jobs",
            &[("idempotency-key", "k-1")],
            json!({"kind": "welcome", "payload": {}}).to_string().into_bytes(),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(
        answer["error"]["code"], "database_timeout",
        "the server's own time limit, so nothing was written: {answer}"
    );
    assert_eq!(headers[http::header::RETRY_AFTER], "1");
    let waiting: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
          WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
    )
    .fetch_one(&mut *lock)
    .await
    .unwrap();
    assert_eq!(waiting, 0, "no enqueue still waits for the lock");
    lock.rollback().await.unwrap();
    assert_eq!(job_count(&store).await, 0, "the given-up enqueue made no job");
}
