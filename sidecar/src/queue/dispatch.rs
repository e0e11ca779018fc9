//! The sidecar worker's handler: POST each job to the team's handler over localhost HTTP.
//!
//! Request: `POST {url}`, body = the payload (JSON), headers `Sluice-Job-Id`, `Sluice-Job-Queue`,
//! `Sluice-Job-Kind`, `Sluice-Job-Attempt`, `Sluice-Job-Max-Attempts`, `Sluice-Job-Deadline` (RFC 3339: the
//! handler should give up by then). Response: 2xx succeeds; a status in `permanent_failure_statuses`
//! (default 422) fails the job for good; anything else, a connection error or the deadline retries it.
//! Cancellation aborts the request (the connection is closed).

use std::time::Duration;

use bytes::Bytes;
use chrono::{DateTime, SecondsFormat, Utc};
use http::{Request, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use tokio_util::sync::CancellationToken;

use sluice_queue::ClaimedJob;

use super::worker::{Handler, Outcome};
use crate::{
    clock::SharedClock,
    error::{Error, Result},
};

/// Most bytes of a failed response's body kept as the job's `last_error`.
const ERROR_BODY_LIMIT: usize = 2048;

/// Hands jobs to an HTTP handler.
#[derive(Clone)]
pub struct HttpHandler {
    client: Client<HttpConnector, Full<Bytes>>,
    url: Uri,
    timeout: Duration,
    permanent: Vec<u16>,
    clock: SharedClock,
}

impl HttpHandler {
    /// A dispatcher to `url`; `timeout` is the per-job deadline announced in `Sluice-Job-Deadline`.
    pub fn new(url: &str, timeout: Duration, permanent: Vec<u16>, clock: SharedClock) -> Result<Self> {
        let url: Uri = url
            .parse()
            .map_err(|e| Error::Config(format!("queue.handler.url: {url:?} is not a URL: {e}")))?;
        if url.scheme_str() != Some("http") || url.host().is_none() {
            return Err(Error::Config(format!(
                "queue.handler.url: {url} must be http://HOST:PORT/PATH"
            )));
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        Ok(Self {
            client,
            url,
            timeout,
            permanent,
            clock,
        })
    }

    async fn call(&self, job: ClaimedJob) -> Outcome {
        let now =
            DateTime::<Utc>::from_timestamp_millis(self.clock.now_millis() as i64).unwrap_or_else(Utc::now);
        let deadline = now + chrono::Duration::from_std(self.timeout).unwrap_or(chrono::Duration::MAX);
        let body = match serde_json::to_vec(&job.payload) {
            Ok(b) => b,
            Err(e) => return Outcome::Permanent(format!("payload is not serialisable: {e}")),
        };
        let req = Request::post(self.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header("sluice-job-id", job.id.to_string())
            .header("sluice-job-queue", &job.queue)
            .header("sluice-job-kind", &job.kind)
            .header("sluice-job-attempt", job.attempt.to_string())
            .header("sluice-job-max-attempts", job.max_attempts.to_string())
            .header(
                "sluice-job-deadline",
                deadline.to_rfc3339_opts(SecondsFormat::Millis, true),
            )
            .body(Full::new(Bytes::from(body)));
        let req = match req {
            Ok(r) => r,
            // A kind or queue that is not a valid header value cannot be delivered, ever.
            Err(e) => return Outcome::Permanent(format!("job cannot be sent as a request: {e}")),
        };
        let resp = match self.client.request(req).await {
            Ok(r) => r,
            Err(e) => return Outcome::Retry(format!("handler unreachable: {e}")),
        };
        let status = resp.status();
        let body = Limited::new(resp.into_body(), 1 << 20)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if status.is_success() {
            return Outcome::Succeeded;
        }
        let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_LIMIT)]).into_owned();
        let error = format!("handler answered {status}: {text}");
        if self.permanent.contains(&status.as_u16()) {
            Outcome::Permanent(error)
        } else {
            Outcome::Retry(error)
        }
    }
}

impl Handler for HttpHandler {
    async fn handle(&self, job: ClaimedJob, cancel: CancellationToken) -> Outcome {
        // Cancellation drops the request future, which closes the connection: the handler sees an
        // aborted request.
        tokio::select! {
            outcome = self.call(job) => outcome,
            _ = cancel.cancelled() => Outcome::Cancelled,
        }
    }
}
