//! Job and queue status over Server-Sent Events, on a real PostgreSQL: a job stream sends the current
//! state, then every change (read from the table, not believed from a notification), and ends after
//! the terminal one; it resyncs after the LISTEN
//! connection is lost; queue streams share one counts reader; scoping and bad input answer like the
//! rest of the API; the database notifies only while someone streams the queue.

mod queue_support;

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use queue_support::*;
use serde_json::{Value, json};
use sluice_queue::{
    NewJob, QueueStore,
    events::JOB_EVENTS_CHANNEL,
    store::{Finish, Finished},
};
use sluice_sidecar::queue::api;
use sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const DEADLINE: Duration = Duration::from_secs(15);

struct Api {
    base: String,
    state: api::ApiState,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Api {
    async fn start(state: api::ApiState) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let s = stop.clone();
        let served = tokio::spawn(api::serve(
            listener,
            state.clone(),
            async move { s.cancelled().await },
        ));
        Self {
            base,
            state,
            stop,
            served,
        }
    }

    async fn open(&self, path: &str) -> (StatusCode, Sse) {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let req = Request::get(format!("{}{path}", self.base))
            .body(Empty::new())
            .unwrap();
        let resp = client.request(req).await.unwrap();
        (
            resp.status(),
            Sse {
                content_type: resp
                    .headers()
                    .get("content-type")
                    .map(|v| v.to_str().unwrap().to_owned()),
                body: resp.into_body(),
                buf: String::new(),
            },
        )
    }
}

/// A client's side of an event stream.
struct Sse {
    content_type: Option<String>,
    body: Incoming,
    buf: String,
}

impl Sse {
    /// The next event (name, JSON data), skipping comments; None when the stream ended.
    async fn next(&mut self) -> Option<(String, Value)> {
        tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some(end) = self.buf.find("\n\n") {
                    let block: String = self.buf.drain(..end + 2).collect();
                    let mut name = String::from("message");
                    let mut data = String::new();
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("event:") {
                            name = v.trim().to_owned();
                        } else if let Some(v) = line.strip_prefix("data:") {
                            data.push_str(v.trim());
                        }
                    }
                    if data.is_empty() {
                        continue; // a comment
                    }
                    return Some((name, serde_json::from_str(&data).unwrap()));
                }
                match self.body.frame().await {
                    Some(Ok(f)) => {
                        if let Ok(d) = f.into_data() {
                            self.buf.push_str(std::str::from_utf8(&d).unwrap());
                        }
                    }
                    _ => return None,
                }
            }
        })
        .await
        .expect("an event or the end of the stream within the deadline")
    }

    /// The body read to its end, as JSON (an error answer).
    async fn json(self) -> Value {
        let bytes = self.body.collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }
}

fn state_of(e: &(String, Value)) -> (&str, &str, i64) {
    assert_eq!(e.0, "state", "{e:?}");
    (
        e.1["id"].as_str().unwrap(),
        e.1["state"].as_str().unwrap(),
        e.1["attempt"].as_i64().unwrap(),
    )
}

async fn enqueue(store: &QueueStore, queue: &str) -> Uuid {
    let job = NewJob::new("k", json!({"n": 1}));
    store.enqueue(queue, &job).await.unwrap().id
}

async fn claim(store: &QueueStore, queue: &str) -> i32 {
    let jobs = store
        .claim_batch(queue, "w1", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    jobs[0].attempt
}

async fn finish(store: &QueueStore, id: Uuid, attempt: i32, finish: Finish) {
    let done = store
        .finish_batch("w1", &[Finished { id, attempt, finish }])
        .await
        .unwrap();
    assert_eq!(done.len(), 1);
}

#[tokio::test]
async fn a_forged_notification_neither_ends_a_job_stream_nor_shows_a_state_the_job_is_not_in() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "mail").await;
    let id = enqueue(&store, "mail").await;
    let api = Api::start(api::ApiState::new(store.clone())).await;
    let (_, mut s) = api.open(&format!("/v1/queues/mail/jobs/{id}/events")).await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "pending");

    // Any role may notify on the channel: claim the job succeeded, in a transaction of the future.
    let forged =
        json!({"id": id, "queue": "mail", "state": "succeeded", "attempt": 1, "xid": "999999999999"});
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(JOB_EVENTS_CHANNEL)
        .bind(forged.to_string())
        .execute(store.pool())
        .await
        .unwrap();
    // The stream sends what the table says next, and stays open.
    let attempt = claim(&store, "mail").await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "running");
    finish(&store, id, attempt, Finish::Succeeded).await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "succeeded");
    assert!(
        s.next().await.is_none(),
        "the stream ends after the real terminal state"
    );
}

#[tokio::test]
async fn job_stream_sends_the_current_state_then_each_change_and_ends_after_the_terminal_one() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "mail").await;
    let id = enqueue(&store, "mail").await;
    let api = Api::start(api::ApiState::new(store.clone())).await;

    let (status, mut s) = api.open(&format!("/v1/queues/mail/jobs/{id}/events")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(s.content_type.as_deref(), Some("text/event-stream"));
    let first = s.next().await.unwrap();
    assert_eq!(state_of(&first), (id.to_string().as_str(), "pending", 0));
    assert_eq!(first.1["queue"], "mail");

    let attempt = claim(&store, "mail").await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "running");
    let retry = Finish::Retry {
        delay: Duration::ZERO,
        error: "try again".into(),
    };
    finish(&store, id, attempt, retry).await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "retrying");
    let attempt = claim(&store, "mail").await;
    let e = s.next().await.unwrap();
    assert_eq!((state_of(&e).1, state_of(&e).2), ("running", 2));
    finish(&store, id, attempt, Finish::Succeeded).await;
    assert_eq!(
        state_of(&s.next().await.unwrap()),
        (id.to_string().as_str(), "succeeded", 2)
    );
    assert!(
        s.next().await.is_none(),
        "the stream ends after the terminal state"
    );

    // A finished job's stream sends its state and ends at once.
    let (_, mut s) = api.open(&format!("/v1/queues/mail/jobs/{id}/events")).await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "succeeded");
    assert!(s.next().await.is_none());
    sluice_testsupport::wait_for_async("the finished streams to be dropped", DEADLINE, || async {
        (api.state.events.stats().job_streams == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn job_streams_are_scoped_like_the_rest_of_the_api() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "mine").await;
    queue(&store, "theirs").await;
    let mine = enqueue(&store, "mine").await;
    let theirs = enqueue(&store, "theirs").await;
    let api = Api::start(api::ApiState::new(store.clone()).serving(&["mine".into()])).await;

    for (path, want) in [
        (
            format!("/v1/queues/mine/jobs/{theirs}/events"),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("/v1/queues/mine/jobs/{}/events", Uuid::now_v7()),
            StatusCode::NOT_FOUND,
        ),
        (
            format!("/v1/queues/theirs/jobs/{theirs}/events"),
            StatusCode::FORBIDDEN,
        ),
        (
            "/v1/queues/mine/jobs/not-a-uuid/events".to_owned(),
            StatusCode::BAD_REQUEST,
        ),
        ("/v1/queues/theirs/events".to_owned(), StatusCode::FORBIDDEN),
    ] {
        let (status, s) = api.open(&path).await;
        assert_eq!(status, want, "{path}");
        assert!(s.json().await["error"]["code"].is_string(), "{path}");
    }
    let all = Api::start(api::ApiState::new(store.clone())).await;
    let (status, _) = all.open("/v1/queues/nothing/events").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, mut s) = api.open(&format!("/v1/queues/mine/jobs/{mine}/events")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(state_of(&s.next().await.unwrap()).1, "pending");
    sluice_testsupport::wait_for_async("refused streams to leave nothing behind", DEADLINE, || async {
        (api.state.events.stats().job_streams == 1 && api.state.events.stats().jobs_watched == 1)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn job_stream_resyncs_after_the_listen_connection_is_lost() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "mail").await;
    let id = enqueue(&store, "mail").await;
    let api = Api::start(api::ApiState::new(store.clone())).await;
    let (_, mut s) = api.open(&format!("/v1/queues/mail/jobs/{id}/events")).await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "pending");

    // The connection is killed and the job changes state before the hub listens again: the change can
    // only reach the stream by a resync from the table.
    let killed: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE query ILIKE 'LISTEN%sluice_job_events%' AND pg_terminate_backend(pid)",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(killed.len(), 1, "one LISTEN connection for the hub");
    let attempt = claim(&store, "mail").await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "running");
    // And notifications flow again on the new connection.
    finish(&store, id, attempt, Finish::Succeeded).await;
    assert_eq!(state_of(&s.next().await.unwrap()).1, "succeeded");
    assert!(s.next().await.is_none());
}

#[tokio::test]
async fn queue_streams_send_counts_every_second_from_one_reader_per_queue() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "mail").await;
    let api = Api::start(api::ApiState::new(store.clone())).await;
    let (status, mut a) = api.open("/v1/queues/mail/events").await;
    assert_eq!(status, StatusCode::OK);
    let (_, mut b) = api.open("/v1/queues/mail/events").await;
    let (name, first) = a.next().await.unwrap();
    assert_eq!(name, "counts");
    assert_eq!(
        (first["queue"].as_str(), first["ready"].as_i64()),
        (Some("mail"), Some(0))
    );
    assert_eq!(b.next().await.unwrap().1["queue"], "mail");
    assert_eq!(api.state.events.stats().counted_queues, 1);

    for _ in 0..3 {
        enqueue(&store, "mail").await;
    }
    for s in [&mut a, &mut b] {
        loop {
            let (_, c) = s.next().await.unwrap();
            if c["ready"] == 3 {
                break;
            }
        }
    }
    drop((a, b));
    sluice_testsupport::wait_for_async(
        "the queue's reader to stop with its last stream",
        DEADLINE,
        || async { (api.state.events.stats().counted_queues == 0).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let (_pg, pool) = pg().await;
    let store = QueueStore::new(pool);
    queue(&store, "mail").await;
    let id = enqueue(&store, "mail").await;
    let api = Api::start(api::ApiState::new(store.clone())).await;
    let (_, mut job) = api.open(&format!("/v1/queues/mail/jobs/{id}/events")).await;
    let (_, mut counts) = api.open("/v1/queues/mail/events").await;
    job.next().await.unwrap();
    counts.next().await.unwrap();
    api.stop.cancel();
    assert!(job.next().await.is_none());
    while counts.next().await.is_some() {}
    tokio::time::timeout(DEADLINE, api.served)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
}

/// Whether a LISTEN on the job events channel gets a notification for job `id` within `wait`.
async fn notified(listener: &mut PgListener, id: Uuid, wait: Duration) -> bool {
    let until = tokio::time::Instant::now() + wait;
    while let Ok(n) = tokio::time::timeout_at(until, listener.recv()).await {
        if n.unwrap().payload().contains(&id.to_string()) {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn the_database_notifies_job_changes_only_while_the_queue_is_streamed() {
    let (pg_server, pool) = pg().await;
    let store = QueueStore::new(pool.clone());
    queue(&store, "mail").await;
    queue(&store, "other").await;
    let mut listener = PgListener::connect(&pg_server.url()).await.unwrap();
    listener.listen(JOB_EVENTS_CHANNEL).await.unwrap();

    // Nobody streams: a state change sends nothing. A marker change on a subscribed queue afterwards
    // proves the listener would have seen it (notifications arrive in commit order).
    let quiet = enqueue(&store, "mail").await;
    claim(&store, "mail").await;
    store
        .subscribe_events("test", &["other".into()], Duration::from_secs(60))
        .await
        .unwrap();
    let marker = enqueue(&store, "other").await;
    claim(&store, "other").await;
    let first = listener.recv().await.unwrap();
    assert!(
        first.payload().contains(&marker.to_string()),
        "{}",
        first.payload()
    );
    assert!(!first.payload().contains(&quiet.to_string()));
    assert!(first.payload().len() < 8000);

    // Subscribed: notified; unsubscribed again: quiet.
    store
        .subscribe_events("test", &["mail".into()], Duration::from_secs(60))
        .await
        .unwrap();
    let loud = enqueue(&store, "mail").await;
    claim(&store, "mail").await;
    assert!(notified(&mut listener, loud, DEADLINE).await);
    store
        .subscribe_events("test", &[], Duration::from_secs(60))
        .await
        .unwrap();
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM sluice.event_subscriptions")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
}
