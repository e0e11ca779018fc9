//! The sidecar worker's handler: POST each job to the team's handler over localhost HTTP.
//!
//! Request: `POST {url}`, body = the payload (JSON), headers `Sluice-Job-Id`, `Sluice-Job-Queue`,
//! `Sluice-Job-Kind`, `Sluice-Job-Attempt`, `Sluice-Job-Max-Attempts`, `Sluice-Job-Deadline` (RFC 3339: the
//! handler should give up by then). Response: 2xx succeeds; a status in `permanent_failure_statuses`
//! (default 422) fails the job for good; anything else, a connection error or the deadline retries it.
//! Cancellation aborts the request (the connection is closed).
//!
//! Each job is one HTTP/1.1 exchange on a kept-alive connection, written and read by the job's own task:
//! the request in one write while the answer is listened for (a handler may answer before it has read a
//! large body), the response head parsed with the sidecar's HTTP/1.1 codec ([`crate::http1::response`]),
//! the body read as its framing says. The status decides the outcome; the body only gives a failure its
//! text. Idle connections wait on a stack, the most recently used first. One the handler closed while it
//! was idle is seen before use and dropped: the socket itself is asked (a peek that does not wait), not
//! only the runtime's record of its readiness, which lags until the runtime next polls for events; a
//! connection used within the last 100 ms, which no keep-alive timeout ends, is taken on the runtime's
//! word, so a busy worker makes no system call for it. A request
//! whose write fails is sent once more on a new connection, since the handler cannot have acted on a
//! request it did not get whole. A request written whole is never sent again here: a connection that
//! ends without an answer retries the job with backoff, as any failure does.

use std::{
    io::{self, Write as _},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chrono::{DateTime, SecondsFormat, Utc};
use futures::FutureExt as _;
use http::Uri;
use rustix::{io::Errno, net::RecvFlags};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_util::sync::CancellationToken;

use sluice_queue::ClaimedJob;

use super::worker::{Handler, Outcome};
use crate::{
    clock::SharedClock,
    error::{Error, Result},
    http1::{
        body::Framing,
        chunked::Chunked,
        fields::Field,
        head_scan::HeadScan,
        response::{self, ResponseHead},
    },
};

/// Most bytes of a failed response's body kept as the job's `last_error`.
const ERROR_BODY_LIMIT: usize = 2048;
/// Most bytes of a response body read; a connection whose answer is longer is not reused.
const BODY_LIMIT: u64 = 1 << 20;
/// How long a connection may wait unused and still be used again.
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting to the handler may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Room read into at a time.
const READ_CHUNK: usize = 4096;

/// Hands jobs to an HTTP handler.
#[derive(Clone)]
pub struct HttpHandler {
    inner: Arc<Inner>,
}

struct Inner {
    /// `host:port`, connected to.
    authority: String,
    /// The request line, `Host` and `Content-Type`: the same for every job.
    head: Vec<u8>,
    timeout: Duration,
    permanent: Vec<u16>,
    clock: SharedClock,
    /// Kept-alive connections not in use, the most recently used last.
    idle: Mutex<Vec<Idle>>,
}

/// A kept-alive connection and when it was last used.
struct Idle {
    stream: TcpStream,
    since: Instant,
}

/// Why an exchange got no answer.
#[derive(Debug)]
enum Failure {
    /// Writing the request failed and no answer came: the handler did not get the request whole.
    NotSent(io::Error),
    /// No answer, or not one that can be read; the text says why.
    NoAnswer(String),
}

/// A handler's answer: its status and the start of its body.
struct Answer {
    status: u16,
    body: Vec<u8>,
    /// Whether the connection can carry the next job.
    reusable: bool,
}

impl HttpHandler {
    /// A dispatcher to `url`; `timeout` is the per-job deadline announced in `Sluice-Job-Deadline`.
    pub fn new(url: &str, timeout: Duration, permanent: Vec<u16>, clock: SharedClock) -> Result<Self> {
        let bad = |why: &str| Error::Config(format!("queue.handler.url: {url:?} {why}"));
        let uri: Uri = url.parse().map_err(|e| bad(&format!("is not a URL: {e}")))?;
        let authority = match (uri.scheme_str(), uri.authority()) {
            (Some("http"), Some(a)) if uri.host().is_some_and(|h| !h.is_empty()) => a.clone(),
            _ => return Err(bad("must be http://HOST:PORT/PATH")),
        };
        if authority.as_str().contains('@') {
            return Err(bad("must not carry credentials"));
        }
        // No port: HTTP's own. A port given must be one (1-65535).
        let host = uri.host().unwrap_or_default();
        let connect_to = match authority.as_str().strip_prefix(host) {
            Some("") => format!("{host}:80"),
            Some(port) => match port.strip_prefix(':').map(str::parse::<u16>) {
                Some(Ok(p)) if p != 0 => authority.as_str().to_owned(),
                _ => return Err(bad(&format!("has no valid port ({port:?})"))),
            },
            None => return Err(bad("must be http://HOST:PORT/PATH")),
        };
        let target = uri.path_and_query().map_or("/", |p| p.as_str());
        let head =
            format!("POST {target} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\n")
                .into_bytes();
        Ok(Self {
            inner: Arc::new(Inner {
                authority: connect_to,
                head,
                timeout,
                permanent,
                clock,
                idle: Mutex::new(Vec::new()),
            }),
        })
    }

    async fn call(&self, job: ClaimedJob) -> Outcome {
        let request = match self.request(&job) {
            Ok(r) => r,
            Err(why) => return Outcome::Permanent(why),
        };
        let answer = match self.inner.exchange(&request).await {
            Ok(a) => a,
            Err(e) => return Outcome::Retry(e),
        };
        if (200..300).contains(&answer.status) {
            return Outcome::Succeeded;
        }
        // As `http::StatusCode` shows it: "422 Unprocessable Entity".
        let status = http::StatusCode::from_u16(answer.status)
            .map_or_else(|_| answer.status.to_string(), |s| s.to_string());
        let text = String::from_utf8_lossy(&answer.body);
        let error = format!("handler answered {status}: {text}");
        if self.inner.permanent.contains(&answer.status) {
            Outcome::Permanent(error)
        } else {
            Outcome::Retry(error)
        }
    }

    /// The whole request for `job`, head and body, or why it cannot be sent (ever).
    fn request(&self, job: &ClaimedJob) -> std::result::Result<Vec<u8>, String> {
        for (name, value) in [("queue", &job.queue), ("kind", &job.kind)] {
            if !value.bytes().all(header_byte) {
                return Err(format!(
                    "job cannot be sent as a request: its {name} {value:?} is not a valid header value"
                ));
            }
        }
        let now = DateTime::<Utc>::from_timestamp_millis(self.inner.clock.now_millis() as i64)
            .unwrap_or_else(Utc::now);
        let deadline = now + chrono::Duration::from_std(self.inner.timeout).unwrap_or(chrono::Duration::MAX);
        let body =
            serde_json::to_vec(&job.payload).map_err(|e| format!("payload is not serialisable: {e}"))?;
        let mut out = Vec::with_capacity(self.inner.head.len() + 320 + body.len());
        out.extend_from_slice(&self.inner.head);
        // Writing into a Vec cannot fail.
        let _ = write!(
            out,
            "content-length: {}\r\nsluice-job-id: {}\r\nsluice-job-queue: {}\r\nsluice-job-kind: {}\r\n\
             sluice-job-attempt: {}\r\nsluice-job-max-attempts: {}\r\nsluice-job-deadline: {}\r\n\r\n",
            body.len(),
            job.id,
            job.queue,
            job.kind,
            job.attempt,
            job.max_attempts,
            deadline.to_rfc3339_opts(SecondsFormat::Millis, true),
        );
        out.extend_from_slice(&body);
        Ok(out)
    }
}

/// A byte a header value may hold as sent: any but control characters, tab excepted (what
/// `http::HeaderValue::from_str` accepts).
fn header_byte(b: u8) -> bool {
    (b >= b' ' && b != 0x7f) || b == b'\t'
}

impl Inner {
    /// Sends `request` on a kept-alive connection (or a new one) and reads the answer, or says why
    /// there is none.
    async fn exchange(&self, request: &[u8]) -> std::result::Result<Answer, String> {
        if let Some(mut stream) = self.take_idle() {
            match exchange_on(&mut stream, request).await {
                Ok(answer) => return Ok(self.done(stream, answer)),
                // The handler did not get it whole: a new connection, once.
                Err(Failure::NotSent(_)) => {}
                Err(Failure::NoAnswer(e)) => return Err(e),
            }
        }
        let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.authority))
            .await
            .map_err(|_| format!("handler unreachable: connecting to {} timed out", self.authority))?
            .map_err(|e| format!("handler unreachable: connecting to {}: {e}", self.authority))?;
        let _ = stream.set_nodelay(true);
        match exchange_on(&mut stream, request).await {
            Ok(answer) => Ok(self.done(stream, answer)),
            Err(Failure::NotSent(e)) => Err(format!("sending the job to the handler: {e}")),
            Err(Failure::NoAnswer(e)) => Err(e),
        }
    }

    /// Puts the connection back for the next job when the answer leaves it usable.
    fn done(&self, stream: TcpStream, answer: Answer) -> Answer {
        if answer.reusable {
            let mut idle = self.lock();
            // The oldest first: any that waited too long are closed now rather than at the next take.
            let stale = idle
                .iter()
                .take_while(|c| c.since.elapsed() > IDLE_TIMEOUT)
                .count();
            let stale: Vec<Idle> = idle.drain(..stale).collect();
            idle.push(Idle {
                stream,
                since: Instant::now(),
            });
            drop(idle);
            drop(stale);
        }
        answer
    }

    /// The most recently used idle connection that is still open ([`quiet`]); those found closed are
    /// dropped.
    fn take_idle(&self) -> Option<TcpStream> {
        let mut closed = Vec::new();
        let mut idle = self.lock();
        let found = loop {
            let Some(Idle { stream, since }) = idle.pop() else {
                break None;
            };
            if since.elapsed() > IDLE_TIMEOUT {
                // The oldest are at the bottom: every one below is older still.
                closed.extend(idle.drain(..).map(|c| c.stream));
                closed.push(stream);
                break None;
            }
            if quiet(&stream, since.elapsed()) {
                break Some(stream);
            }
            closed.push(stream);
        };
        drop(idle);
        drop(closed);
        found
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An idle connection used less than this long ago is taken on the runtime's word: keep-alive timeouts
/// are seconds, and a busy worker, which reuses its connections within milliseconds, makes no system
/// call for it. A handler that closes its connections sooner (shutting down) may have the close missed,
/// and that job is retried with backoff, as a close between the check and the write always is.
const PEEK_AFTER: Duration = Duration::from_millis(100);

/// Whether an idle connection, unused for `idle_for`, can carry a request: nothing to read on it. An
/// end of stream (the handler closed it), bytes nobody asked for and an error each rule it out. The
/// runtime's readiness of the socket answers without a system call, but a close the kernel has and
/// the runtime has not polled for yet looks open there, and a request written on it meets the close
/// and retries the job; so, unless the connection was used within [`PEEK_AFTER`] and the runtime
/// shows nothing, the socket is peeked without waiting.
fn quiet(stream: &TcpStream, idle_for: Duration) -> bool {
    if idle_for < PEEK_AFTER && stream.readable().now_or_never().is_none() {
        return true;
    }
    let mut probe = [0u8; 1];
    let peek = RecvFlags::PEEK | RecvFlags::DONTWAIT;
    matches!(rustix::net::recv(stream, &mut probe[..], peek), Err(Errno::AGAIN))
}

/// One exchange on `stream`: writes `request` while listening for the answer, then reads the final
/// response's body.
async fn exchange_on(stream: &mut TcpStream, request: &[u8]) -> std::result::Result<Answer, Failure> {
    let mut buf = Vec::with_capacity(READ_CHUNK);
    let mut fields: Vec<Field> = Vec::new();
    let (head, written) = {
        let (mut reader, mut writer) = stream.split();
        let read = read_head(&mut reader, &mut buf, &mut fields);
        let write = writer.write_all(request);
        tokio::pin!(read, write);
        // Set once the write has finished or failed; after a failure the answer, if any, is still read.
        let mut write_state: Option<std::result::Result<(), io::Error>> = None;
        loop {
            tokio::select! {
                biased;
                head = &mut read => {
                    let written = matches!(write_state, Some(Ok(())));
                    break match head {
                        Ok(head) => (head, written),
                        Err(HeadError::Closed(e)) => {
                            // Whether the handler got the request whole decides whether it may go again:
                            // a write still under way is finished (or fails) first.
                            let written = match write_state {
                                Some(w) => w,
                                None => (&mut write).await,
                            };
                            return Err(match written {
                                Err(we) => Failure::NotSent(we),
                                Ok(()) => Failure::NoAnswer(format!(
                                    "the handler closed the connection without answering: {e}"
                                )),
                            });
                        }
                        Err(HeadError::Invalid(why)) => return Err(Failure::NoAnswer(why)),
                    };
                }
                w = &mut write, if write_state.is_none() => write_state = Some(w),
            }
        }
    };
    let ResponseHead {
        len,
        status,
        framing,
        keep_alive,
        ..
    } = head;
    buf.drain(..len);
    let (body, complete) = read_body(stream, buf, framing).await;
    Ok(Answer {
        status,
        body,
        // An answer that came before the whole request was written leaves the connection out of step.
        reusable: keep_alive && complete && written,
    })
}

/// Why no final response head was read.
enum HeadError {
    /// The connection ended (or failed) before any byte of an answer.
    Closed(io::Error),
    /// An answer began but cannot be read; the text says why.
    Invalid(String),
}

/// Reads the final response head into `buf` (its fields into `fields`), skipping interim (1xx) ones.
async fn read_head(
    reader: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    fields: &mut Vec<Field>,
) -> std::result::Result<ResponseHead, HeadError> {
    let mut answered = false;
    // A head that trickles in is parsed again only once a piece could settle it.
    let mut scan = HeadScan::default();
    loop {
        if scan.due(buf, response::MAX_HEAD) {
            match response::parse(buf, fields, false) {
                response::Parsed::Partial => {}
                response::Parsed::Invalid(why) => {
                    return Err(HeadError::Invalid(format!(
                        "the handler's answer is not valid HTTP: {why}"
                    )));
                }
                response::Parsed::Head(head) if head.interim() => {
                    buf.drain(..head.len);
                    scan = HeadScan::default();
                    continue;
                }
                response::Parsed::Head(head) => return Ok(head),
            }
        }
        scan.seen(buf);
        match read_more(reader, buf).await {
            Ok(()) => answered = true,
            Err(e) if !answered => return Err(HeadError::Closed(e)),
            Err(e) => {
                return Err(HeadError::Invalid(format!(
                    "the handler's answer was cut short: {e}"
                )));
            }
        }
    }
}

/// Reads into `buf`'s spare room (growing it by a chunk when full); an end of stream is an error.
async fn read_more(reader: &mut (impl AsyncRead + Unpin), buf: &mut Vec<u8>) -> io::Result<()> {
    if buf.capacity() - buf.len() < READ_CHUNK / 4 {
        buf.reserve(READ_CHUNK);
    }
    match reader.read_buf(buf).await? {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        _ => Ok(()),
    }
}

/// Reads the body delimited by `framing`, of which `buf` holds the first bytes read: its first
/// [`ERROR_BODY_LIMIT`] bytes (decoded), and whether all of it was read and nothing after it (so the
/// connection can be reused). A body longer than [`BODY_LIMIT`] is left unread; one that breaks off or
/// breaks its framing keeps what was read (the status has decided already).
async fn read_body(stream: &mut TcpStream, mut buf: Vec<u8>, framing: Framing) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let keep = |kept: &mut Vec<u8>, data: &[u8]| {
        let room = ERROR_BODY_LIMIT.saturating_sub(kept.len());
        kept.extend_from_slice(&data[..room.min(data.len())]);
    };
    match framing {
        Framing::Empty => {
            let clean = buf.is_empty();
            (kept, clean)
        }
        Framing::Length(len) => {
            let mut left = len;
            loop {
                let n = (buf.len() as u64).min(left) as usize;
                keep(&mut kept, &buf[..n]);
                left -= n as u64;
                if left == 0 {
                    let clean = buf.len() == n;
                    return (kept, clean);
                }
                if len - left >= BODY_LIMIT {
                    return (kept, false);
                }
                buf.clear();
                if read_more(stream, &mut buf).await.is_err() {
                    return (kept, false);
                }
            }
        }
        Framing::Chunked => {
            let mut chunked = Chunked::decoder();
            let mut data = Vec::new();
            loop {
                data.clear();
                // What was decoded before a break in the framing is kept too.
                let taken = chunked.transcode(&buf, &mut data);
                keep(&mut kept, &data);
                let Ok(taken) = taken else {
                    return (kept, false);
                };
                if chunked.done() {
                    let clean = taken == buf.len();
                    return (kept, clean);
                }
                if chunked.data_len() >= BODY_LIMIT {
                    return (kept, false);
                }
                buf.clear();
                if read_more(stream, &mut buf).await.is_err() {
                    return (kept, false);
                }
            }
        }
        Framing::UntilClose => {
            let mut read = 0u64;
            loop {
                keep(&mut kept, &buf);
                read += buf.len() as u64;
                buf.clear();
                if read >= BODY_LIMIT || read_more(stream, &mut buf).await.is_err() {
                    return (kept, false);
                }
            }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::net::TcpListener;

    use super::*;
    use crate::clock::ManualClock;

    fn job(kind: &str) -> ClaimedJob {
        ClaimedJob {
            id: uuid::Uuid::nil(),
            queue: "shop/emails".into(),
            kind: kind.into(),
            payload: serde_json::json!({"to": "a@b.c"}),
            priority: 0,
            attempt: 2,
            max_attempts: 5,
            lease_expires_at: Utc::now(),
            created_at: Utc::now(),
        }
    }

    /// A scripted handler: each connection it accepts answers its requests with `answers` in turn (one
    /// per request, read up to the end of its body), then closes when `close_after` of them were sent.
    /// Returns the handler's URL, the count of connections it accepted and the requests it read.
    async fn scripted(
        answers: Vec<&'static [u8]>,
        close_after: usize,
    ) -> (String, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jobs?x=1", listener.local_addr().unwrap());
        let accepted = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (acc, reqs) = (accepted.clone(), requests.clone());
        let answers = Arc::new(answers);
        let next = Arc::new(AtomicUsize::new(0));
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                acc.fetch_add(1, Ordering::SeqCst);
                let (answers, reqs, next) = (answers.clone(), reqs.clone(), next.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    for _ in 0..close_after {
                        let Some(request) = read_request(&mut s, &mut buf).await else {
                            return;
                        };
                        reqs.lock().unwrap().push(request);
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if s.write_all(answers[i % answers.len()]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, accepted, requests)
    }

    /// The length of the whole request (head and `content-length` body) at the start of `buf`, once
    /// it is all there.
    fn request_len(buf: &[u8]) -> Option<usize> {
        let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
        let len: usize = String::from_utf8_lossy(&buf[..end])
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .map_or(0, |v| v.parse().unwrap());
        (buf.len() >= end + 4 + len).then_some(end + 4 + len)
    }

    /// Reads one request (head and `content-length` body) from `s`.
    async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
        loop {
            if let Some(len) = request_len(buf) {
                let request = String::from_utf8_lossy(&buf[..len]).into_owned();
                buf.drain(..len);
                return Some(request);
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Hands out its bytes one per read, then never more (a peer that trickles its answer and waits).
    struct OneByte(&'static [u8]);

    impl AsyncRead for OneByte {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            let Some((first, rest)) = self.0.split_first() else {
                return std::task::Poll::Pending;
            };
            buf.put_slice(&[*first]);
            self.0 = rest;
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[test]
    fn a_head_that_arrives_a_byte_at_a_time_is_read_past_its_interim_heads_or_refused_at_its_first_line() {
        let (mut buf, mut fields) = (Vec::new(), Vec::new());
        let answer = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-a: b\r\n\r\nok";
        let read = read_head(&mut OneByte(answer), &mut buf, &mut fields).now_or_never();
        let Some(Ok(head)) = read else {
            panic!("no head from an answer sent a byte at a time");
        };
        assert_eq!((head.status, head.len, buf.len()), (200, 46, 46));

        // A malformed status line is refused as soon as it ends, not once a blank line comes.
        let (mut buf, mut fields) = (Vec::new(), Vec::new());
        let answer = b"HTTP/1.1 2x0 OK\r\nx-a: b\r\n";
        let read = read_head(&mut OneByte(answer), &mut buf, &mut fields).now_or_never();
        assert!(
            matches!(read, Some(Err(HeadError::Invalid(_)))),
            "a bad status line waited for more"
        );
    }

    fn handler(url: &str) -> HttpHandler {
        let clock: SharedClock = Arc::new(ManualClock::at(1_700_000_000_000));
        HttpHandler::new(url, Duration::from_secs(60), vec![422], clock).unwrap()
    }

    async fn run(h: &HttpHandler, kind: &str) -> Outcome {
        h.handle(job(kind), CancellationToken::new()).await
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    #[tokio::test]
    async fn jobs_share_one_kept_alive_connection_and_carry_their_headers() {
        let (url, accepted, requests) = scripted(vec![OK], usize::MAX).await;
        let h = handler(&url);
        for _ in 0..3 {
            assert_eq!(run(&h, "welcome").await, Outcome::Succeeded);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        let requests = requests.lock().unwrap();
        let addr = url.trim_start_matches("http://").split('/').next().unwrap();
        assert_eq!(
            requests[0],
            format!(
                "POST /jobs?x=1 HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
                 content-length: 14\r\nsluice-job-id: 00000000-0000-0000-0000-000000000000\r\n\
                 sluice-job-queue: shop/emails\r\nsluice-job-kind: welcome\r\nsluice-job-attempt: 2\r\n\
                 sluice-job-max-attempts: 5\r\nsluice-job-deadline: 2023-11-14T22:14:20.000Z\r\n\r\n\
                 {{\"to\":\"a@b.c\"}}"
            )
        );
    }

    #[tokio::test]
    async fn a_connection_the_handler_closed_while_idle_is_replaced_and_the_job_sent_once_more() {
        // Each connection answers one request, then the handler closes it.
        let (url, accepted, requests) = scripted(vec![OK], 1).await;
        let h = handler(&url);
        assert_eq!(run(&h, "a").await, Outcome::Succeeded);
        // Wait until the close has reached the idle connection, so the next job meets it.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let closed = {
                let idle = h.inner.lock();
                idle.first()
                    .is_some_and(|c| c.stream.readable().now_or_never().is_some())
            };
            if closed {
                break;
            }
            assert!(Instant::now() < deadline, "the handler's close never arrived");
            tokio::task::yield_now().await;
        }
        assert_eq!(run(&h, "b").await, Outcome::Succeeded);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(
            requests.lock().unwrap().len(),
            2,
            "each job reached the handler once"
        );
    }

    /// Reads one request (head and `content-length` body) from a blocking socket; `None` at its end.
    fn read_request_blocking(s: &mut std::net::TcpStream) -> Option<String> {
        use std::io::Read as _;
        let mut buf = Vec::new();
        loop {
            if let Some(len) = request_len(&buf) {
                return Some(String::from_utf8_lossy(&buf[..len]).into_owned());
            }
            let mut chunk = [0u8; 4096];
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    #[tokio::test]
    async fn a_close_the_runtime_has_not_polled_for_yet_is_found_before_the_connection_is_used() {
        // A handler on a thread of its own, so it closes while this runtime polls for nothing: it
        // answers one job, closes that connection once idle (its keep-alive timeout, on a signal here),
        // then answers one job on a new connection.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/jobs", listener.local_addr().unwrap());
        let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
        let (closed_tx, closed_rx) = std::sync::mpsc::channel::<()>();
        let handler_thread = std::thread::spawn(move || {
            use std::io::Write as _;
            let mut served = Vec::new();
            let (mut s, _) = listener.accept().unwrap();
            served.push(read_request_blocking(&mut s).unwrap());
            s.write_all(OK).unwrap();
            close_rx.recv().unwrap();
            drop(s);
            closed_tx.send(()).unwrap();
            let (mut s, _) = listener.accept().unwrap();
            served.push(read_request_blocking(&mut s).unwrap());
            s.write_all(OK).unwrap();
            served
        });
        let h = handler(&url);
        assert_eq!(run(&h, "a").await, Outcome::Succeeded);

        // From here to the next job nothing awaits, so the runtime does not poll for events.
        close_tx.send(()).unwrap();
        closed_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        {
            let mut idle = h.inner.lock();
            let waiting = idle.first_mut().expect("the first job's connection waits");
            // Idle long enough for a handler's keep-alive timeout to have ended it.
            waiting.since = Instant::now() - PEEK_AFTER;
            let stream = &waiting.stream;
            // The kernel has the close (a peek reads the end of the stream)...
            loop {
                let mut probe = [0u8; 1];
                let peek = RecvFlags::PEEK | RecvFlags::DONTWAIT;
                if matches!(rustix::net::recv(stream, &mut probe[..], peek), Ok((0, _))) {
                    break;
                }
                assert!(Instant::now() < deadline, "the handler's close never arrived");
                std::thread::yield_now();
            }
            // ...and the runtime's readiness of the socket does not show it yet.
            assert!(
                stream.readable().now_or_never().is_none(),
                "the runtime saw the close already: the case under test did not arise"
            );
        }
        assert_eq!(run(&h, "b").await, Outcome::Succeeded, "a needless retry");
        let served = handler_thread.join().unwrap();
        assert!(served[0].contains("sluice-job-kind: a\r\n"), "{}", served[0]);
        assert!(served[1].contains("sluice-job-kind: b\r\n"), "{}", served[1]);
    }

    #[tokio::test]
    async fn a_request_written_whole_is_not_sent_again_when_the_connection_ends_without_an_answer() {
        // The handler reads the request and closes without answering (it crashed on the job, say).
        let (url, accepted, requests) = scripted(vec![b""], 1).await;
        let h = handler(&url);
        // A kept-alive connection to start from: the same holds for it as for a new one.
        let stream = TcpStream::connect(url.trim_start_matches("http://").split('/').next().unwrap())
            .await
            .unwrap();
        h.inner.lock().push(Idle {
            stream,
            since: Instant::now(),
        });
        match run(&h, "a").await {
            Outcome::Retry(e) => assert!(e.contains("closed the connection without answering"), "{e}"),
            other => panic!("expected a retry, got {other:?}"),
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1, "no second connection");
        assert_eq!(
            requests.lock().unwrap().len(),
            1,
            "the job reached the handler once"
        );
    }

    #[tokio::test]
    async fn statuses_map_to_outcomes_and_a_chunked_error_body_is_kept_decoded() {
        let (url, accepted, _) = scripted(
            vec![
                b"HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbo\r\n\r\n2\r\nom\r\n0\r\n\r\n",
                b"HTTP/1.1 422 Unprocessable Entity\r\ncontent-length: 3\r\n\r\nbad",
                b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
            ],
            usize::MAX,
        )
        .await;
        let h = handler(&url);
        assert_eq!(
            run(&h, "a").await,
            Outcome::Retry("handler answered 500 Internal Server Error: bo\r\nom".into())
        );
        assert_eq!(
            run(&h, "a").await,
            Outcome::Permanent("handler answered 422 Unprocessable Entity: bad".into())
        );
        assert_eq!(run(&h, "a").await, Outcome::Succeeded);
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "every answer left the connection usable"
        );
    }

    #[tokio::test]
    async fn a_connection_is_not_reused_after_close_a_long_body_or_bytes_past_the_answer() {
        let long: &'static [u8] = Box::leak(
            [
                b"HTTP/1.1 200 OK\r\ncontent-length: 2000000\r\n\r\n".as_slice(),
                &vec![b'x'; 2_000_000],
            ]
            .concat()
            .into_boxed_slice(),
        );
        // (answer, why, answers per connection: a body delimited by close needs the close).
        for (answer, why, per_connection) in [
            (
                b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok".as_slice(),
                "close",
                usize::MAX,
            ),
            (long, "a body over the limit", usize::MAX),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokjunk".as_slice(),
                "bytes past the answer",
                usize::MAX,
            ),
            (
                b"HTTP/1.0 200 OK\r\n\r\nuntil close".as_slice(),
                "a body delimited by close",
                1,
            ),
        ] {
            let (url, accepted, _) = scripted(vec![answer, OK], per_connection).await;
            let h = handler(&url);
            assert_eq!(run(&h, "a").await, Outcome::Succeeded, "{why}");
            assert_eq!(run(&h, "a").await, Outcome::Succeeded, "{why}");
            assert_eq!(
                accepted.load(Ordering::SeqCst),
                2,
                "{why}: a new connection for the second job"
            );
        }
    }

    #[tokio::test]
    async fn a_job_that_cannot_be_a_request_fails_for_good_and_sends_nothing() {
        let (url, accepted, requests) = scripted(vec![OK], usize::MAX).await;
        let h = handler(&url);
        for kind in ["line\r\nx-injected: 1", "bell\u{7}", "del\u{7f}"] {
            match run(&h, kind).await {
                Outcome::Permanent(e) => assert!(e.contains("not a valid header value"), "{e}"),
                other => panic!("{kind:?}: expected a permanent failure, got {other:?}"),
            }
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 0);
        // Tabs, spaces and bytes outside ASCII are sent as they are.
        for kind in ["tab\tand space", "émail"] {
            assert_eq!(run(&h, kind).await, Outcome::Succeeded, "{kind:?}");
        }
        let requests = requests.lock().unwrap();
        assert!(
            requests[1].contains("sluice-job-kind: émail\r\n"),
            "{}",
            requests[1]
        );
    }

    #[tokio::test]
    async fn the_status_decides_even_when_the_body_breaks_off() {
        for (answer, expected) in [
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nok".as_slice(),
                Outcome::Succeeded,
            ),
            (
                b"HTTP/1.1 422 Unprocessable Entity\r\ntransfer-encoding: chunked\r\n\r\n3\r\nbad\r\nzz"
                    .as_slice(),
                Outcome::Permanent("handler answered 422 Unprocessable Entity: bad".into()),
            ),
        ] {
            // One answer per connection, then the handler closes it.
            let (url, _, _) = scripted(vec![answer], 1).await;
            assert_eq!(run(&handler(&url), "a").await, expected);
        }
    }

    #[tokio::test]
    async fn an_answer_before_a_large_request_is_written_is_taken_and_the_connection_dropped() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            // Reads the head only, answers, and stops reading (but keeps the connection open).
            let mut buf = Vec::new();
            while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let mut chunk = [0u8; 1024];
                let n = s.read(&mut chunk).await.unwrap();
                buf.extend_from_slice(&chunk[..n]);
            }
            s.write_all(b"HTTP/1.1 413 Content Too Large\r\ncontent-length: 7\r\n\r\ntoo big")
                .await
                .unwrap();
            let _ = done_rx.await;
        });
        let h = handler(&url);
        let mut big = job("a");
        // Far more than the socket buffers take before the handler would have to read.
        big.payload = serde_json::Value::String("x".repeat(32 << 20));
        let outcome = h.handle(big, CancellationToken::new()).await;
        assert_eq!(
            outcome,
            Outcome::Retry("handler answered 413 Payload Too Large: too big".into())
        );
        assert!(h.inner.lock().is_empty(), "a connection out of step is not kept");
        let _ = done_tx.send(());
    }

    #[tokio::test]
    async fn cancelling_a_job_closes_its_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let (got_tx, got_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = Vec::new();
            read_request(&mut s, &mut buf).await.unwrap();
            got_tx.send(()).unwrap();
            // Never answers; sees the close.
            let mut chunk = [0u8; 16];
            s.read(&mut chunk).await.unwrap()
        });
        let h = handler(&url);
        let cancel = CancellationToken::new();
        let job_task = {
            let (h, cancel) = (h.clone(), cancel.clone());
            tokio::spawn(async move { h.handle(job("a"), cancel).await })
        };
        got_rx.await.unwrap();
        cancel.cancel();
        assert_eq!(job_task.await.unwrap(), Outcome::Cancelled);
        let read = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(read, 0, "the handler saw the connection close");
    }

    #[tokio::test]
    async fn an_unreachable_handler_or_an_invalid_answer_retries() {
        // A port nothing listens on: bind one, then free it.
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let h = handler(&format!("http://{addr}/"));
        match run(&h, "a").await {
            Outcome::Retry(e) => assert!(e.starts_with("handler unreachable: connecting to"), "{e}"),
            other => panic!("expected a retry, got {other:?}"),
        }
        let (url, _, _) = scripted(
            vec![b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nok"],
            usize::MAX,
        )
        .await;
        match run(&handler(&url), "a").await {
            Outcome::Retry(e) => assert!(e.starts_with("the handler's answer is not valid HTTP"), "{e}"),
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn a_url_must_be_plain_http_with_a_host() {
        let clock: SharedClock = Arc::new(ManualClock::at(0));
        for url in [
            "https://h/",
            "http:///x",
            "h:80/x",
            "http://user:pw@h/",
            "not a url",
        ] {
            assert!(
                HttpHandler::new(url, Duration::from_secs(1), vec![], clock.clone()).is_err(),
                "{url}"
            );
        }
        let h = HttpHandler::new("http://localhost", Duration::from_secs(1), vec![], clock).unwrap();
        assert_eq!(h.inner.authority, "localhost:80");
        assert!(
            h.inner
                .head
                .starts_with(b"POST / HTTP/1.1\r\nhost: localhost\r\n")
        );
    }
}
